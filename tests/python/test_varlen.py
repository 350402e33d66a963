"""Requests of uneven row counts (request_offsets) through dsa_indexer on the CPU backend
with NumPy arrays, against the NumPy references."""

import numpy as np
import pytest

import dsa_indexer as dsa
import reference as ref

D = 32


@pytest.fixture
def rng():
    return np.random.default_rng(2468)


def score(p, schedule=None, **kwargs):
    return dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                                p["max_len"], schedule, request_offsets=p["offsets"],
                                page_size=p["page"], clean_logits=True, **kwargs)


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("path", ["auto", "native", "per_token"])
@pytest.mark.parametrize("rows, causal", [([1, 4, 2, 3], True), ([8, 0, 5, 1, 7], False),
                                          ([0, 110, 2], True)])
def test_paged_mqa_logits_matches_reference(rng, page, path, rows, causal):
    p = ref.varlen_problem(rng, rows, head_dim=D, page=page, causal=causal)
    logits = score(p, path=path)
    assert logits.shape == (sum(rows), p["max_len"]) and logits.dtype == np.float32
    ref.assert_logits_close(logits, ref.varlen_logits(p))
    np.testing.assert_array_equal(np.isneginf(logits), np.isneginf(ref.varlen_logits(p)))
    # q as [T, H, D] and lengths as [T, 1]: the same bytes.
    np.testing.assert_array_equal(
        dsa.paged_mqa_logits(p["q"][:, 0], p["cache"], p["weights"], p["lens"][:, None], p["table"],
                             p["max_len"], request_offsets=p["offsets"], page_size=page,
                             clean_logits=True, path=path), logits)


@pytest.mark.parametrize("path", ["native", "per_token"])
@pytest.mark.parametrize("workers", [1, 3, 16])
def test_plan_schedule_matches_reference(rng, path, workers):
    p = ref.varlen_problem(rng, [3, 19, 0, 9, 1], head_dim=D, causal=False, max_prefix=1500)
    schedule = dsa.plan_schedule(p["lens"], workers, path, request_offsets=p["offsets"])
    np.testing.assert_array_equal(schedule, ref.varlen_schedule(p["lens"], p["offsets"], workers,
                                                                path))
    # A schedule planned for one request of all rows still covers every row.
    stale = dsa.plan_schedule(p["lens"], 5, path,
                              request_offsets=np.array([0, len(p["lens"])], dtype=np.int32))
    ref.assert_logits_close(score(p, stale, path=path), ref.varlen_logits(p))


@pytest.mark.parametrize("path", ["auto", "native", "per_token"])
def test_context_lens_and_schedule(rng, path):
    prefix = np.array([10, 5, 0, 300, 2000], dtype=np.int32)
    offsets = np.array([0, 2, 2, 13, 14, 30], dtype=np.int32)
    want = np.concatenate([prefix[b] + np.arange(offsets[b + 1] - offsets[b]) + 1
                           for b in range(5)]).astype(np.int32)
    lens, schedule = dsa.context_lens_and_schedule(prefix, 1, num_workers=6, path=path,
                                                   request_offsets=offsets, total_rows=30)
    np.testing.assert_array_equal(lens, want)
    resolved = "native" if path == "auto" else path
    np.testing.assert_array_equal(schedule, ref.varlen_schedule(want, offsets, 6, resolved))
    with pytest.raises(ValueError, match="total_rows"):
        dsa.context_lens_and_schedule(prefix, 1, num_workers=6, request_offsets=offsets)
    with pytest.raises(ValueError, match="request_offsets"):
        dsa.context_lens_and_schedule(prefix, 1, "legacy", 6, request_offsets=offsets,
                                      total_rows=30)


def test_causal_context_lens(rng):
    prefix = np.array([10, 5, 0, 300], dtype=np.int32)
    offsets = np.array([0, 2, 2, 7, 8], dtype=np.int32)
    lens = dsa.causal_context_lens(prefix, 1, request_offsets=offsets, total_rows=8)
    np.testing.assert_array_equal(lens, [11, 12, 1, 2, 3, 4, 5, 301])
    out = np.full(8, -7, dtype=np.int32)
    assert dsa.context_lens(prefix, 1, request_offsets=offsets, out=out) is out
    np.testing.assert_array_equal(out, lens)
    with pytest.raises(ValueError, match="total_rows"):
        dsa.causal_context_lens(prefix, 1, request_offsets=offsets)
    with pytest.raises(ValueError, match="expanded_context_lens: request_offsets"):
        dsa.expanded_context_lens(prefix, 1, request_offsets=offsets, total_rows=8)
    with pytest.raises(ValueError, match="causal_context_lens: request_offsets"):
        dsa.causal_context_lens(prefix, 1, request_offsets=offsets[::-1].copy(), total_rows=8)


@pytest.mark.parametrize("strategy", ["auto", "fused", "logits_then_topk"])
@pytest.mark.parametrize("physical_slots", [False, True])
def test_index_topk(rng, strategy, physical_slots):
    p = ref.varlen_problem(rng, [2, 0, 11, 1, 6], head_dim=D, causal=False, max_prefix=400)
    k = 30
    indices = dsa.index_topk(p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"],
                             k, sorted=True, physical_slots=physical_slots, strategy=strategy,
                             request_offsets=p["offsets"])
    want = ref.topk(score(p), p["lens"], k)
    if physical_slots:
        want = ref.slots(want, p["table"], ref.request_of_rows(len(p["lens"]),
                                                               request_offsets=p["offsets"]),
                         p["page"])
    # Ties between library and reference values are measure-zero with random inputs.
    np.testing.assert_array_equal(indices, want)


def test_errors_name_request_offsets(rng):
    p = ref.varlen_problem(rng, [2, 3], head_dim=D)
    schedule = dsa.plan_schedule(p["lens"], 2, request_offsets=p["offsets"])
    for bad in ([1, 2, 5], [0, 3, 2], [0, 2, 4]):
        with pytest.raises(ValueError, match="paged_mqa_logits: request_offsets"):
            dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                                 p["max_len"], schedule,
                                 request_offsets=np.array(bad, dtype=np.int32))
    with pytest.raises(ValueError, match="paged_mqa_logits: block_table"):
        dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"][:1],
                             p["max_len"], schedule, request_offsets=p["offsets"])
    with pytest.raises(ValueError, match="paged_mqa_logits: schedule"):
        dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                             p["max_len"], dsa.plan_schedule(p["lens"][None, :], 2),
                             request_offsets=p["offsets"])
