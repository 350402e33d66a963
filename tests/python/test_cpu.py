"""dsa_indexer on the CPU backend with NumPy arrays, against the NumPy references."""

import numpy as np
import pytest

import dsa_indexer as dsa
import reference as ref
from dsa_indexer import integration
from reference import assert_logits_close
from reference import problem_logits as reference_logits

D = 32


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def scoring_problem(rng, **kwargs):
    return ref.scoring_problem(rng, head_dim=D, **kwargs)


# ---------------------------------------------------------------------------
# Keys and queries


@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("slot_dtype", [np.int32, np.int64])
def test_store_index_keys_matches_reference(rng, power_of_two, slot_dtype):
    pages, tokens = 3, 40
    cache = rng.integers(0, 256, size=(pages, ref.page_bytes(D)), dtype=np.uint8)
    before = cache.copy()
    keys = (rng.standard_normal((tokens, D)) * rng.uniform(0.01, 50, (tokens, 1))).astype(
        np.float32)
    keys[3] = 0.0  # amax clamps at 1e-4
    slots = rng.permutation(pages * ref.PAGE)[:tokens].astype(slot_dtype)
    slots[5] = -1  # padding: skipped
    result = dsa.store_index_keys(keys, slots, cache, power_of_two_scales=power_of_two)
    assert result is cache

    codes, scales = ref.quantize_rows(keys, power_of_two)
    stored_keys = cache[:, : ref.PAGE * D].reshape(pages * ref.PAGE, D)
    stored_scales = cache[:, ref.PAGE * D: ref.PAGE * D + 256].copy().view(np.float32).reshape(-1)
    written = slots >= 0
    np.testing.assert_array_equal(stored_keys[slots[written]], codes[written])
    np.testing.assert_array_equal(stored_scales[slots[written]], scales[written])
    untouched = np.setdiff1d(np.arange(pages * ref.PAGE), slots[written])
    before_keys = before[:, : ref.PAGE * D].reshape(pages * ref.PAGE, D)
    np.testing.assert_array_equal(stored_keys[untouched], before_keys[untouched])
    if power_of_two:
        assert np.all(np.frexp(scales)[0] == 0.5)


def test_store_index_keys_into_deep_gemm_view(rng):
    cache = np.zeros((2, ref.PAGE, 1, D + 4), dtype=np.uint8)
    keys = rng.standard_normal((3, D)).astype(np.float32)
    slots = np.array([0, 65, 127], dtype=np.int32)
    dsa.store_index_keys(keys, slots, cache)
    flat = cache.reshape(2, -1)
    codes, _ = ref.quantize_rows(keys, False)
    np.testing.assert_array_equal(flat[1, D: 2 * D], codes[1])  # slot 65: page 1, row 1


def test_store_index_keys_rejects_slot_beyond_cache(rng):
    cache = np.zeros((1, ref.page_bytes(D)), dtype=np.uint8)
    keys = np.ones((1, D), dtype=np.float32)
    with pytest.raises(ValueError, match="store_index_keys.*slot"):
        dsa.store_index_keys(keys, np.array([64], dtype=np.int32), cache)


def stored_rows(cache, page):
    """(fp8 codes [slots, D], scales [slots]) of a cache of P-token pages, by slot."""
    flat = cache.reshape(cache.shape[0], -1)
    codes = flat[:, : page * D].reshape(-1, D)
    scales = np.ascontiguousarray(flat[:, page * D: page * (D + 4)]).view(np.float32)
    return codes, scales.reshape(-1)


@pytest.mark.parametrize("view", ["2-D", "4-D"])
def test_store_index_keys_pages_of_32_tokens(rng, view):
    page, pages, tokens = 32, 3, 50
    cache = rng.integers(0, 256, size=(pages, ref.page_bytes(D, page)), dtype=np.uint8)
    keys = rng.standard_normal((tokens, D)).astype(np.float32)
    slots = rng.permutation(pages * page)[:tokens].astype(np.int32)
    if view == "2-D":
        dsa.store_index_keys(keys, slots, cache, page_size=32)
    else:  # the view states the page size
        dsa.store_index_keys(keys, slots, cache.reshape(pages, page, 1, D + 4))
    codes, scales = ref.quantize_rows(keys, False)
    stored_codes, stored_scales = stored_rows(cache, page)
    np.testing.assert_array_equal(stored_codes[slots], codes)
    np.testing.assert_array_equal(stored_scales[slots], scales)


def test_store_index_keys_page_size_errors(rng):
    keys = np.ones((1, D), dtype=np.float32)
    cache_4d = np.zeros((2, 32, 1, D + 4), dtype=np.uint8)
    with pytest.raises(ValueError, match="store_index_keys: cache: .*page_size is 64"):
        dsa.store_index_keys(keys, np.zeros(1, dtype=np.int32), cache_4d, page_size=64)
    with pytest.raises(ValueError, match="store_index_keys: options.page_size: .* got 16"):
        dsa.store_index_keys(keys, np.zeros(1, dtype=np.int32), cache_4d, page_size=16)
    with pytest.raises(ValueError, match="store_index_keys: .*slot"):  # 2 pages of 32 tokens
        dsa.store_index_keys(keys, np.array([64], dtype=np.int32), cache_4d)


@pytest.mark.parametrize("power_of_two", [False, True])
def test_quantize_queries_matches_reference(rng, power_of_two):
    batch, next_n, heads = 2, 3, 4
    q = (rng.standard_normal((batch, next_n, heads, D)) * 3).astype(np.float32)
    gate = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    q_fp8, weights = dsa.quantize_queries(q, gate, power_of_two_scales=power_of_two)
    assert q_fp8.dtype == np.uint8 and q_fp8.shape == q.shape
    assert weights.dtype == np.float32 and weights.shape == (batch * next_n, heads)
    codes, scales = ref.quantize_rows(q, power_of_two)
    np.testing.assert_array_equal(q_fp8, codes)
    expected = gate * scales.reshape(batch * next_n, heads) * (heads ** -0.5) * (D ** -0.5)
    np.testing.assert_allclose(weights, expected, rtol=1e-6)

    _, weights_scaled = dsa.quantize_queries(q, gate, power_of_two_scales=power_of_two,
                                             weight_scale=2.0)
    np.testing.assert_allclose(weights_scaled, gate * scales.reshape(-1, heads) * 2.0,
                               rtol=1e-6)


def test_quantize_queries_writes_given_outputs(rng):
    q = rng.standard_normal((1, 1, 2, D)).astype(np.float32)
    gate = np.ones((1, 2), dtype=np.float32)
    out = (np.zeros(q.shape, dtype=np.uint8), np.zeros((1, 2), dtype=np.float32))
    result = dsa.quantize_queries(q, gate, out=out)
    assert result[0] is out[0] and result[1] is out[1]
    np.testing.assert_array_equal(out[0], ref.quantize_rows(q, False)[0])


# ---------------------------------------------------------------------------
# Lengths and schedule


@pytest.mark.parametrize("convention", ["causal", "expanded", "legacy"])
@pytest.mark.parametrize("next_n", [1, 2, 4])
def test_context_lens_builders(rng, convention, next_n):
    base = rng.integers(0, 1000, size=12).astype(np.int32)
    strided = base[::3]  # a strided input view
    builder = {"causal": dsa.causal_context_lens, "expanded": dsa.expanded_context_lens,
               "legacy": dsa.legacy_context_lens}[convention]
    lens = builder(strided, next_n)
    assert lens.dtype == np.int32 and lens.shape == (4, next_n)
    np.testing.assert_array_equal(lens,
                                  integration.expected_context_lens(strided, next_n, convention))
    out = np.zeros((4, next_n), dtype=np.int32)
    assert dsa.context_lens(strided, next_n, convention, out=out) is out
    np.testing.assert_array_equal(out, lens)


def test_context_lens_errors():
    with pytest.raises(ValueError, match="causal_context_lens: prefix_lens"):
        dsa.causal_context_lens(np.array([3, -1], dtype=np.int32), 2)
    with pytest.raises(ValueError, match="causal_context_lens: prefix_lens"):
        dsa.causal_context_lens(np.array([3], dtype=np.int64), 2)
    with pytest.raises(ValueError, match="next_n"):
        dsa.expanded_context_lens(np.array([3], dtype=np.int32), 0,
                                  out=np.zeros((1, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="convention"):
        dsa.context_lens(np.array([3], dtype=np.int32), 2, "diagonal")


@pytest.mark.parametrize("path", ["native", "per_token"])
@pytest.mark.parametrize("workers", [1, 3, 7, 40])
def test_plan_schedule_matches_reference(rng, path, workers):
    lens = dsa.causal_context_lens(rng.integers(0, 2000, size=5).astype(np.int32), 3)
    lens[2] = 0  # a request with nothing to score
    schedule = dsa.plan_schedule(lens, workers, path)
    np.testing.assert_array_equal(schedule, ref.schedule(lens, workers, path))


def test_plan_schedule_defaults_and_errors(rng):
    lens = dsa.causal_context_lens(np.array([10, 20], dtype=np.int32), 2)
    schedule = dsa.plan_schedule(lens)
    assert schedule.shape == (dsa.default_num_workers(lens) + 1, 2)
    with pytest.raises(ValueError, match="num_workers"):
        dsa.plan_schedule(lens, 0, out=np.zeros((1, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="path"):
        dsa.plan_schedule(lens, 2, "diagonal")


@pytest.mark.parametrize("convention", ["causal", "expanded", "legacy"])
@pytest.mark.parametrize("path", ["auto", "native", "per_token"])
def test_context_lens_and_schedule_in_one_call(rng, convention, path):
    prefix = rng.integers(0, 3000, size=15).astype(np.int32)[::3]  # a strided input view
    prefix[1] = 0
    want_lens = integration.expected_context_lens(prefix, 3, convention)
    resolved = dsa.resolve_logits_path(path, 3, 64, prefix)
    for workers in (1, 4, 40):
        lens, schedule = dsa.context_lens_and_schedule(prefix, 3, convention, workers, path)
        np.testing.assert_array_equal(lens, want_lens)
        np.testing.assert_array_equal(schedule, ref.schedule(want_lens, workers, resolved))
    # Into the caller's arrays; the workers are then the schedule's rows - 1.
    out = (np.full((5, 3), -7, dtype=np.int32), np.full((7, 2), -7, dtype=np.int32))
    got = dsa.context_lens_and_schedule(prefix, 3, convention, path=path, out=out)
    assert got[0] is out[0] and got[1] is out[1]
    np.testing.assert_array_equal(out[0], want_lens)
    np.testing.assert_array_equal(out[1], ref.schedule(want_lens, 6, resolved))
    lens, schedule = dsa.context_lens_and_schedule(prefix, 3, convention)
    assert schedule.shape == (dsa.default_num_workers(prefix) + 1, 2)


def test_context_lens_and_schedule_errors():
    prefix = np.array([3, 9], dtype=np.int32)
    with pytest.raises(ValueError, match="context_lens_and_schedule: prefix_lens"):
        dsa.context_lens_and_schedule(np.array([3, -1], dtype=np.int32), 2, num_workers=2)
    with pytest.raises(ValueError, match="context_lens_and_schedule: next_n"):
        dsa.context_lens_and_schedule(prefix, 0, num_workers=2)
    with pytest.raises(ValueError, match="convention"):
        dsa.context_lens_and_schedule(prefix, 2, "diagonal")
    with pytest.raises(ValueError, match="path"):
        dsa.context_lens_and_schedule(prefix, 2, path="diagonal")
    with pytest.raises(ValueError, match="num_workers"):
        dsa.context_lens_and_schedule(prefix, 2, num_workers=0)
    with pytest.raises(TypeError, match="out: expected a pair"):
        dsa.context_lens_and_schedule(prefix, 2, out=np.zeros((2, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="context_lens_and_schedule: schedule"):
        dsa.context_lens_and_schedule(prefix, 2, num_workers=3,
                                      out=(np.zeros((2, 2), dtype=np.int32),
                                           np.zeros((3, 2), dtype=np.int32)))
    with pytest.raises(ValueError, match="context_lens_and_schedule: context_lens"):
        dsa.context_lens_and_schedule(prefix, 2, out=(np.zeros((2, 3), dtype=np.int32),
                                                      np.zeros((3, 2), dtype=np.int32)))
    # The schedule written over the lengths it plans from.
    memory = np.zeros(12, dtype=np.int32)
    with pytest.raises(ValueError, match="schedule: shares memory with context_lens"):
        dsa.context_lens_and_schedule(prefix, 2, out=(memory[:4].reshape(2, 2),
                                                      memory[2:8].reshape(3, 2)))


# ---------------------------------------------------------------------------
# Scoring


@pytest.mark.parametrize("next_n", [1, 2, 3])
@pytest.mark.parametrize("path", ["auto", "native", "per_token"])
def test_paged_mqa_logits_matches_reference(rng, next_n, path):
    p = scoring_problem(rng, next_n=next_n)
    out = dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                               p["max_len"], clean_logits=True, path=path)
    expected = reference_logits(p)
    assert out.shape == expected.shape and out.dtype == np.float32
    assert_logits_close(out, expected)
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(expected))


def test_paged_mqa_logits_layouts_and_strided_output(rng):
    stride = ref.page_bytes(D) + 64
    p = scoring_problem(rng, next_n=2, page_stride=stride)
    expected = reference_logits(p)
    schedule = dsa.plan_schedule(p["lens"], 5, "native")
    wide = np.full((expected.shape[0], p["max_len"] + 17), 7.0, dtype=np.float32)
    out = wide[:, : p["max_len"]]  # row stride larger than max_context_len
    dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"],
                         schedule, path="native", out=out)
    assert_logits_close(out, expected)
    np.testing.assert_array_equal(wide[:, p["max_len"]:], 7.0)  # columns past max never written

    # The DeepGEMM 4-D view of a cache whose pages are exactly 64 * (D + 4) bytes.
    p = scoring_problem(rng, next_n=2)
    cache_4d = p["cache"].reshape(-1, ref.PAGE, 1, D + 4)
    out = dsa.paged_mqa_logits(p["q"], cache_4d, p["weights"], p["lens"], p["table"],
                               p["max_len"])
    assert_logits_close(out, reference_logits(p))


@pytest.mark.parametrize("next_n", [1, 2, 4])
@pytest.mark.parametrize("view", ["2-D", "4-D"])
def test_paged_mqa_logits_pages_of_32_tokens(rng, next_n, view):
    p = scoring_problem(rng, next_n=next_n, page=32)
    if view == "2-D":
        cache, page_size = p["cache"], 32
    else:  # the view states the page size
        cache, page_size = p["cache"].reshape(-1, 32, 1, D + 4), 0
    out = dsa.paged_mqa_logits(p["q"], cache, p["weights"], p["lens"], p["table"], p["max_len"],
                               clean_logits=True, page_size=page_size)
    expected = reference_logits(p)
    assert_logits_close(out, expected)
    np.testing.assert_array_equal(np.isneginf(out), np.isneginf(expected))


def test_paged_mqa_logits_page_size_errors(rng):
    p = scoring_problem(rng, page=32)
    args = (p["q"], p["cache"].reshape(-1, 32, 1, D + 4), p["weights"], p["lens"], p["table"],
            p["max_len"])
    with pytest.raises(ValueError, match="paged_mqa_logits: key_cache: .*page_size is 64"):
        dsa.paged_mqa_logits(*args, page_size=64)
    with pytest.raises(ValueError, match="paged_mqa_logits: options.page_size: .* got 48"):
        dsa.paged_mqa_logits(*args, page_size=48)
    with pytest.raises(ValueError, match="index_topk: options.page_size: .* got 1"):
        dsa.index_topk(*args, 8, page_size=1)
    with pytest.raises(TypeError, match="paged_mqa_logits: page_size: expected an integer"):
        dsa.paged_mqa_logits(*args, page_size=32.0)


def test_strides_of_extent_one_dimensions_are_free(rng):
    # PyTorch's DLPack export (1.13 to 2.8) gives every dimension of extent 1 stride 1.
    p = scoring_problem(rng, batch=1, next_n=1, max_prefix=50, pages=1)
    unit = np.lib.stride_tricks.as_strided
    q = unit(p["q"], p["q"].shape, (1, 1) + p["q"].strides[2:])
    cache = unit(p["cache"], p["cache"].shape, (1, 1))
    out = dsa.paged_mqa_logits(q, cache, p["weights"], p["lens"], p["table"], p["max_len"])
    assert_logits_close(out, reference_logits(p))


def test_paged_mqa_logits_backends_agree(rng):
    p = scoring_problem(rng, next_n=3)
    args = (p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"])
    precise = dsa.paged_mqa_logits(*args, backend="cpu_reference", reference_float64=True,
                                   clean_logits=True)
    assert_logits_close(precise, reference_logits(p), rtol=1e-6)
    threaded = dsa.paged_mqa_logits(*args, backend="cpu", num_threads=2, clean_logits=True)
    assert_logits_close(threaded, precise)
    again = dsa.paged_mqa_logits(*args, backend="cpu", num_threads=2, clean_logits=True)
    np.testing.assert_array_equal(again, threaded)  # bitwise deterministic


def test_pdl_keyword_reaches_the_context_and_changes_no_result(rng):
    """pdl sets ExecContext::programmatic_dependent_launch, which only CUDA launches read."""
    assert dsa._eager.make_context(np.zeros(1), pdl=True).programmatic_dependent_launch
    assert not dsa._eager.make_context(np.zeros(1)).programmatic_dependent_launch
    p = scoring_problem(rng, next_n=2)
    args = (p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"])
    plain = dsa.paged_mqa_logits(*args, clean_logits=True)
    np.testing.assert_array_equal(dsa.paged_mqa_logits(*args, clean_logits=True, pdl=True), plain)
    lens = p["lens"].reshape(-1)
    np.testing.assert_array_equal(dsa.topk(plain, lens, 50, sorted=True, pdl=True),
                                  dsa.topk(plain, lens, 50, sorted=True))


def test_paged_mqa_logits_repeated_block_table_view(rng):
    next_n = 3
    p = scoring_problem(rng, next_n=next_n)
    repeated = np.repeat(p["table"], next_n, axis=0)  # one row per draft token
    integration.check_repeated_rows(repeated, next_n, p["lens"])
    view = integration.per_request_block_table(repeated, next_n)
    assert np.shares_memory(view, repeated)
    out = dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], view, p["max_len"],
                               clean_logits=True)
    assert_logits_close(out, reference_logits(p))


def test_read_only_inputs_are_accepted(rng):
    p = scoring_problem(rng)
    for name in ("q", "cache", "weights", "lens", "table"):
        p[name].setflags(write=False)
    out = dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                               p["max_len"])
    assert_logits_close(out, reference_logits(p))


def test_arguments_that_are_not_arrays_or_not_writable_are_named(rng):
    p = scoring_problem(rng)
    args = [p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"]]
    for index, name in enumerate(("q", "key_cache", "weights", "context_lens", "block_table")):
        bad = list(args)
        bad[index] = bad[index].tolist()
        for op in (dsa.paged_mqa_logits, dsa.index_topk):
            with pytest.raises(TypeError, match=f"{op.__name__}: {name}: expected a NumPy array"):
                op(*bad)
    values = rng.standard_normal((2, 10)).astype(np.float32)
    lengths = np.array([10, 5], dtype=np.int32)
    with pytest.raises(TypeError, match="topk: lengths: expected .* got list"):
        dsa.topk(values, [10, 5], 3)
    read_only = np.zeros((2, 3), dtype=np.int32)
    read_only.setflags(write=False)
    with pytest.raises(ValueError, match="topk: out: the array is read-only"):
        dsa.topk(values, lengths, 3, out=read_only)
    logits_out = np.zeros((6, p["max_len"]), dtype=np.float32)
    logits_out.setflags(write=False)
    with pytest.raises(ValueError, match="paged_mqa_logits: out: the array is read-only"):
        dsa.paged_mqa_logits(*args, out=logits_out)
    cache = np.zeros((1, ref.page_bytes(D)), dtype=np.uint8)
    cache.setflags(write=False)
    with pytest.raises(ValueError, match="store_index_keys: cache: the array is read-only"):
        dsa.store_index_keys(np.ones((1, D), dtype=np.float32), np.zeros(1, dtype=np.int32), cache)
    with pytest.raises(TypeError, match="store_index_keys: slot_mapping: expected"):
        dsa.store_index_keys(np.ones((1, D), dtype=np.float32), [0], np.zeros_like(cache))
    q = np.ones((1, 1, 2, D), dtype=np.float32)
    gate = np.ones((1, 2), dtype=np.float32)
    with pytest.raises(TypeError, match="quantize_queries: out: expected a pair"):
        dsa.quantize_queries(q, gate, out=np.zeros(q.shape, dtype=np.uint8))
    with pytest.raises(TypeError, match="quantize_queries: head_gate: expected"):
        dsa.quantize_queries(q, [[1.0, 1.0]])
    with pytest.raises(TypeError, match="causal_context_lens: lens: expected"):
        dsa.causal_context_lens([3, 4], 2)
    with pytest.raises(TypeError, match="plan_schedule: context_lens: expected"):
        dsa.plan_schedule([[3, 4]], 2)


def test_paged_mqa_logits_errors_name_the_argument(rng):
    p = scoring_problem(rng, next_n=2)
    args = dict(q=p["q"], key_cache=p["cache"], weights=p["weights"], context_lens=p["lens"],
                block_table=p["table"], max_context_len=p["max_len"])

    def call(**changes):
        dsa.paged_mqa_logits(**{**args, **changes})

    with pytest.raises(ValueError, match="paged_mqa_logits: q"):
        call(q=p["q"][0])
    with pytest.raises(ValueError, match="paged_mqa_logits: weights"):
        call(weights=p["weights"].astype(np.int32))
    with pytest.raises(ValueError, match="paged_mqa_logits: block_table"):
        call(block_table=p["table"][:, :1])
    with pytest.raises(ValueError, match="max_context_len|context_lens"):
        call(max_context_len=int(p["lens"].max()) - 1)
    bad_table = p["table"].copy()
    bad_table[0, 0] = p["cache"].shape[0]
    with pytest.raises(ValueError, match="block_table"):
        call(block_table=bad_table)
    with pytest.raises(ValueError, match="schedule"):
        call(schedule=dsa.plan_schedule(p["lens"][:1], 4, "native"))
    # Rejected by the bindings before the library sees them.
    with pytest.raises(ValueError, match="paged_mqa_logits: weights: unsupported element type"):
        call(weights=p["weights"].astype(np.float64))
    with pytest.raises(ValueError, match="paged_mqa_logits: q: rank 5"):
        call(q=p["q"][None])
    with pytest.raises(ValueError, match="backend"):
        call(backend="tpu")


# ---------------------------------------------------------------------------
# Selection


def assert_same_selection(actual, expected):
    """Same set of indices per row (order unspecified unless sorted)."""
    np.testing.assert_array_equal(np.sort(actual, axis=1), np.sort(expected, axis=1))


@pytest.mark.parametrize("k", [1, 7, 64])
def test_topk_matches_reference(rng, k):
    rows, width = 6, 300
    values = rng.standard_normal((rows, width)).astype(np.float32)
    values[1, :50] = 1.0  # many ties
    values[2, 10] = np.nan  # NaN counts as -inf
    values[3, :] = -0.0
    values[3, ::2] = 0.0
    lengths = np.array([300, 120, 299, 200, k, 0], dtype=np.int32)
    expected = ref.topk(values, lengths, k)
    assert_same_selection(dsa.topk(values, lengths, k), expected)
    np.testing.assert_array_equal(dsa.topk(values, lengths, k, sorted=True), expected)


def test_topk_strided_rows_and_physical_slots(rng):
    next_n, k = 2, 5
    table = np.array([[4, 9, -1], [7, 2, 11]], dtype=np.int32)
    base = rng.standard_normal((4, 200)).astype(np.float32)
    logits = base[:, :150]  # row stride 200
    lengths = np.array([128, 100, 3, 130], dtype=np.int32)
    positions = ref.topk(logits, lengths, k)
    slots = dsa.topk(logits, lengths, k, sorted=True, block_table=table,
                     rows_per_request=next_n)
    request = np.arange(4)[:, None] // next_n
    expected = np.where(positions >= 0,
                        table[request, positions // ref.PAGE] * ref.PAGE + positions % ref.PAGE,
                        -1)
    np.testing.assert_array_equal(slots, expected)


def test_topk_errors(rng):
    values = rng.standard_normal((2, 10)).astype(np.float32)
    lengths = np.array([10, 5], dtype=np.int32)
    with pytest.raises(ValueError, match="topk: k"):
        dsa.topk(values, lengths, 0, out=np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="topk: k"):
        dsa.topk(values, lengths, dsa.MAX_TOPK + 1, out=np.zeros((2, 1), dtype=np.int32))
    with pytest.raises(ValueError, match="topk: lengths"):
        dsa.topk(values, np.array([11, 5], dtype=np.int32), 3)
    with pytest.raises(ValueError, match="topk: indices"):
        dsa.topk(values, lengths, 3, out=np.zeros((2, 2), dtype=np.int32))
    for threads in (-1, dsa.MAX_CPU_THREADS + 1):
        with pytest.raises(ValueError, match="topk: ctx.num_threads"):
            dsa.topk(values, lengths, 3, num_threads=threads)
    with pytest.raises(ValueError, match="num_threads"):
        dsa.topk(values, lengths, 3, num_threads=2**40)
    with pytest.raises(TypeError, match="topk: k: expected an integer"):
        dsa.topk(values, lengths, 2.5)
    np.testing.assert_array_equal(dsa.topk(values, lengths, np.int64(3), sorted=True),
                                  dsa.topk(values, lengths, 3, sorted=True))
    overlapping = np.lib.stride_tricks.as_strided(np.zeros(3, dtype=np.int32), (2, 3), (4, 4))
    with pytest.raises(ValueError, match="bad_stride: topk: indices: row stride 1"):
        dsa.topk(values, lengths, 3, out=overlapping)
    # A k the library refuses is reported by it, not sized into a huge output first.
    with pytest.raises(ValueError, match="k_out_of_range: topk: k"):
        dsa.topk(np.zeros((64, 10), dtype=np.float32), np.zeros(64, dtype=np.int32), 2**31 - 1)


def ragged_rows(rng, rows=9, width=400, k=16):
    """(values [rows, width], lengths, row_starts) with ties, NaN, empty and short rows."""
    values = rng.standard_normal((rows, width)).astype(np.float32)
    values[1, 40:140] = 1.0  # many ties
    values[2, 150] = np.nan
    starts = rng.integers(0, 150, size=rows).astype(np.int32)
    lengths = rng.integers(k + 1, width - 150, size=rows).astype(np.int32)
    lengths[3] = 0
    lengths[4] = k
    lengths[5] = max(k - 3, 0)
    starts[6] = width - lengths[6]  # a row that ends at the last column
    return values, lengths, starts


@pytest.mark.parametrize("k", [1, 16, 100])
def test_topk_row_starts_and_position_offsets(rng, k):
    values, lengths, starts = ragged_rows(rng, k=k)
    expected = ref.topk(values, lengths, k, starts)
    np.testing.assert_array_equal(dsa.topk(values, lengths, k, sorted=True, row_starts=starts),
                                  expected)
    assert_same_selection(dsa.topk(values, lengths, k, row_starts=starts), expected)
    offsets = rng.integers(-1000, 100000, size=len(lengths)).astype(np.int32)
    np.testing.assert_array_equal(
        dsa.topk(values, lengths, k, sorted=True, row_starts=starts, position_offsets=offsets),
        np.where(expected >= 0, expected + offsets[:, None], -1))


def random_table(rng, requests, width, page):
    """int32 [requests, ceil(width / page)] of random entries a transform may use."""
    return rng.integers(0, 5000, size=(requests, -(-width // page))).astype(np.int32)


@pytest.mark.parametrize("page", [1, 32, 64])
@pytest.mark.parametrize("starts", [False, True])
def test_topk_block_tables_of_each_page_size(rng, page, starts):
    k, rows_per_request = 16, 3
    values, lengths, row_starts = ragged_rows(rng, k=k)
    row_starts = row_starts if starts else None
    positions = ref.topk(values, lengths, k, row_starts)
    requests = ref.request_of_rows(len(lengths), rows_per_request)
    table = random_table(rng, int(requests.max()) + 1, values.shape[1], page)
    slots = dsa.topk(values, lengths, k, sorted=True, row_starts=row_starts, block_table=table,
                     page_size=page, rows_per_request=rows_per_request)
    np.testing.assert_array_equal(slots, ref.slots(positions, table, requests, page))


@pytest.mark.parametrize("page", [1, 32, 64])
def test_topk_request_offsets_of_uneven_requests(rng, page):
    k = 16
    values, lengths, row_starts = ragged_rows(rng, k=k)
    offsets = np.array([0, 4, 4, 5, 9], dtype=np.int32)  # 4 rows, none, 1, 4
    positions = ref.topk(values, lengths, k, row_starts)
    requests = ref.request_of_rows(len(lengths), request_offsets=offsets)
    np.testing.assert_array_equal(requests, [0, 0, 0, 0, 2, 3, 3, 3, 3])
    table = random_table(rng, len(offsets) - 1, values.shape[1], page)
    slots = dsa.topk(values, lengths, k, sorted=True, row_starts=row_starts, block_table=table,
                     page_size=page, request_offsets=offsets)
    np.testing.assert_array_equal(slots, ref.slots(positions, table, requests, page))


def test_topk_option_errors(rng):
    values, lengths, starts = ragged_rows(rng)
    rows = len(lengths)
    table = random_table(rng, rows, values.shape[1], 64)
    offsets = np.arange(rows + 1, dtype=np.int32)

    def call(**options):
        return dsa.topk(values, lengths, 16, **options)

    with pytest.raises(ValueError, match="topk: page_size: must be 1, 32 or 64"):
        call(block_table=table, page_size=16)
    with pytest.raises(ValueError, match="topk: position_offsets"):
        call(block_table=table, position_offsets=starts)
    with pytest.raises(ValueError, match="topk: request_offsets"):
        call(request_offsets=offsets)  # without a block table
    with pytest.raises(ValueError, match="topk: request_offsets"):
        call(block_table=table, request_offsets=offsets, rows_per_request=2)
    with pytest.raises(ValueError, match="topk: request_offsets"):
        call(block_table=table, request_offsets=offsets[:-1])  # one entry short
    decreasing = offsets.copy()
    decreasing[2], decreasing[3] = 3, 2
    with pytest.raises(ValueError, match="topk: request_offsets"):
        call(block_table=table, request_offsets=decreasing)
    with pytest.raises(ValueError, match="topk: row_starts"):
        call(row_starts=starts[:-1])
    beyond = starts.copy()
    beyond[0] = values.shape[1] - lengths[0] + 1
    with pytest.raises(ValueError, match="topk: row_starts"):
        call(row_starts=beyond)
    with pytest.raises(ValueError, match="topk: position_offsets"):
        call(position_offsets=starts.astype(np.int64))
    with pytest.raises(ValueError, match="topk: block_table"):
        call(block_table=table[:, :2], page_size=64)  # too few entries for the rows
    with pytest.raises(TypeError, match="topk: request_offsets: expected"):
        call(block_table=table, request_offsets=list(offsets))


def test_integer_arguments_beyond_int32_name_the_argument(rng):
    values = rng.standard_normal((2, 10)).astype(np.float32)
    lengths = np.array([10, 5], dtype=np.int32)
    with pytest.raises(ValueError, match="topk: k: 2147483648 is beyond the int32 range"):
        dsa.topk(values, lengths, 2**31)
    with pytest.raises(ValueError, match="topk: rows_per_request: .* int32"):
        dsa.topk(values, lengths, 3, block_table=np.zeros((2, 1), dtype=np.int32),
                 rows_per_request=2**40)
    with pytest.raises(ValueError, match="causal_context_lens: next_n: .* int32"):
        dsa.causal_context_lens(np.array([3], dtype=np.int32), 2**40)
    lens = dsa.causal_context_lens(np.array([10, 20], dtype=np.int32), 2)
    with pytest.raises(ValueError, match="plan_schedule: num_workers: .* int32"):
        dsa.plan_schedule(lens, 2**31)
    p = scoring_problem(rng)
    with pytest.raises(ValueError, match="index_topk: k: .* int32"):
        dsa.index_topk(p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"],
                       2**40)


def test_lengths_and_counts_must_be_integers(rng):
    p = scoring_problem(rng)
    args = (p["q"], p["cache"], p["weights"], p["lens"], p["table"])
    # A float would be truncated into a shorter row; a huge one used to reach the binding.
    for op in (dsa.paged_mqa_logits, dsa.index_topk):
        with pytest.raises(TypeError, match=f"{op.__name__}: max_context_len: expected an integer"):
            op(*args, p["max_len"] + 0.5)
        with pytest.raises(ValueError, match=f"{op.__name__}: max_context_len: .* int64"):
            op(*args, 2**63)
    np.testing.assert_array_equal(
        dsa.paged_mqa_logits(*args, np.int64(p["max_len"]), clean_logits=True),
        dsa.paged_mqa_logits(*args, p["max_len"], clean_logits=True))
    with pytest.raises(TypeError, match="workspace_bytes: max_length: expected an integer"):
        dsa.workspace_bytes("topk", p["q"], rows=4, max_length=10.5)
    with pytest.raises(TypeError, match="resolve_logits_path: num_heads: expected an integer"):
        dsa.resolve_logits_path("auto", 2, 64.0, p["q"])


@pytest.mark.parametrize("strategy", ["auto", "fused", "logits_then_topk"])
@pytest.mark.parametrize("next_n", [1, 3])
def test_index_topk_equals_topk_of_logits(rng, strategy, next_n):
    k = 40
    p = scoring_problem(rng, next_n=next_n)
    args = (p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"])
    logits = dsa.paged_mqa_logits(*args)
    flat_lens = p["lens"].reshape(-1)
    expected = dsa.topk(logits, flat_lens, k, sorted=True)
    np.testing.assert_array_equal(
        dsa.index_topk(*args, k, sorted=True, strategy=strategy), expected)
    assert_same_selection(dsa.index_topk(*args, k, strategy=strategy), expected)
    # Against the NumPy reference where the order is stable under rounding.
    assert_same_selection(dsa.index_topk(*args, k, strategy=strategy),
                          dsa.topk(logits, flat_lens, k))

    topk_lens = np.maximum(flat_lens - 1, 0).astype(np.int32)
    np.testing.assert_array_equal(
        dsa.index_topk(*args, k, topk_lens=topk_lens, sorted=True, strategy=strategy),
        dsa.topk(logits, topk_lens, k, sorted=True))

    slots = dsa.index_topk(*args, k, sorted=True, physical_slots=True, strategy=strategy)
    np.testing.assert_array_equal(
        slots, dsa.topk(logits, flat_lens, k, sorted=True, block_table=p["table"],
                        rows_per_request=next_n))


@pytest.mark.parametrize("strategy", ["fused", "logits_then_topk"])
@pytest.mark.parametrize("next_n", [1, 3])
def test_index_topk_pages_of_32_tokens(rng, strategy, next_n):
    k = 40
    p = scoring_problem(rng, next_n=next_n, page=32)
    args = (p["q"], p["cache"].reshape(-1, 32, 1, D + 4), p["weights"], p["lens"], p["table"],
            p["max_len"])
    flat_lens = p["lens"].reshape(-1)
    positions = ref.topk(dsa.paged_mqa_logits(*args), flat_lens, k)
    np.testing.assert_array_equal(dsa.index_topk(*args, k, sorted=True, strategy=strategy),
                                  positions)
    expected = ref.slots(positions, p["table"], ref.request_of_rows(len(flat_lens), next_n), 32)
    np.testing.assert_array_equal(
        dsa.index_topk(*args, k, sorted=True, physical_slots=True, strategy=strategy), expected)
    # The 2-D view with the page size stated.
    np.testing.assert_array_equal(
        dsa.index_topk(p["q"], p["cache"], *args[2:], k, sorted=True, physical_slots=True,
                       strategy=strategy, page_size=32), expected)


def test_index_topk_topk_lens_beyond_context_is_rejected(rng):
    p = scoring_problem(rng, next_n=2)
    too_long = (p["lens"].reshape(-1) + 1).astype(np.int32)
    with pytest.raises(ValueError, match="index_topk: topk_lens"):
        dsa.index_topk(p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"],
                       8, topk_lens=too_long)


def test_selection_of_reference_logits(rng):
    p = scoring_problem(rng, next_n=2)
    logits = dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                                  p["max_len"], backend="cpu_reference",
                                  reference_float64=True)
    expected = ref.topk(reference_logits(p), p["lens"].reshape(-1), 16)
    chosen = dsa.topk(logits, p["lens"].reshape(-1), 16)
    # Rounding may swap near-equal neighbours at the boundary; the bulk must agree.
    agree = [len(np.intersect1d(a, e)) for a, e in zip(chosen, expected)]
    assert min(agree) >= 14


# ---------------------------------------------------------------------------
# Integration helpers


def test_length_helpers_verify_and_decode(rng):
    committed = rng.integers(0, 500, size=5).astype(np.int32)
    for convention in ("causal", "expanded"):
        lens = integration.context_lens_from_committed(committed, 3, convention)
        integration.verify_context_lens(lens, committed, 3, convention)
        decoded, next_n, found = integration.decode_context_lens(lens)
        np.testing.assert_array_equal(decoded, committed)
        assert (next_n, found) == (3, convention)
    lens = dsa.causal_context_lens(committed, 3)
    lens[2, 1] += 1
    with pytest.raises(ValueError, match=r"context_lens: \[2, 1\]"):
        integration.verify_context_lens(lens, committed, 3, "causal")
    with pytest.raises(ValueError, match="neither causal"):
        integration.decode_context_lens(lens)
    topk_lens = integration.causal_topk_lens(committed, 3)
    np.testing.assert_array_equal(topk_lens, (committed[:, None] + np.arange(3) + 1).ravel())


def test_block_table_helpers(rng):
    table = rng.integers(0, 100, size=(3, 4)).astype(np.int32)
    repeated = np.repeat(table, 2, axis=0)
    np.testing.assert_array_equal(integration.per_request_block_table(repeated, 2), table)
    with pytest.raises(ValueError, match="multiple of next_n"):
        integration.per_request_block_table(repeated, 4)
    lens = np.array([[64, 65], [10, 11], [1, 2]], dtype=np.int32)
    repeated[3, 3] = -1  # past what request 1 needs: allowed to differ
    integration.check_repeated_rows(repeated, 2, lens)
    repeated[1, 1] = 999  # request 0 needs two pages
    with pytest.raises(ValueError, match="row 1 entry 1"):
        integration.check_repeated_rows(repeated, 2, lens)
    repeated[1, 1] = repeated[0, 1]
    repeated[3, 1] = -1
    lens[1] = [40, 41]  # request 1 needs one page of 64 tokens, but two of 32
    integration.check_repeated_rows(repeated, 2, lens)
    with pytest.raises(ValueError, match="row 3 entry 1"):
        integration.check_repeated_rows(repeated, 2, lens, page_size=32)


def test_device_queries():
    assert isinstance(dsa.built_with_cuda(), bool)
    assert dsa.cuda_device_count() >= 0
    assert dsa.default_num_workers(np.zeros(1, dtype=np.int32)) >= 1
    assert dsa.resolve_logits_path("native", 3, 64, np.zeros(1)) == "native"
