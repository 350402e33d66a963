"""The fp4 key and query formats through the Python package on the CPU backends (and the
DeepGEMM compat layer's fp4 form with CPU PyTorch tensors), against the NumPy references."""

import numpy as np
import pytest

import dsa_indexer as dsa
import reference as ref
from dsa_indexer.compat import deep_gemm

D = 128
W = ref.FP4_TOKEN_BYTES


@pytest.fixture
def rng():
    return np.random.default_rng(2468)


def rule_reaching_keys(rng, tokens):
    """Random keys whose first two carry a zero block, ties between codes, values rounding
    to zero from below, a tiny amax and huge magnitudes."""
    keys = (rng.standard_normal((tokens, D)) * np.exp(rng.uniform(-6, 5, (tokens, 1)))).astype(np.float32)
    keys[0, :32] = 0.0
    keys[0, 32:64] = 0.0
    keys[0, 32:46] = [6, 0.25, -0.25, 0.75, -0.75, 1.25, 1.75, 2.5, -3.5, 5, -5, -0.1, 0.1, -6]
    keys[0, 64:96] = 1e-6 * np.arange(32) * np.where(np.arange(32) % 2, -1, 1)
    keys[1, :32] = 3e38
    keys[1, 96:] = -3e-5
    return keys


def fp4_problem(rng, batch=3, next_n=2, heads=4, page=64, fp4_queries=False):
    prefix = rng.integers(0, 300, size=batch).astype(np.int32)
    lens = (prefix[:, None] + np.arange(next_n)[None, :] + 1).astype(np.int32)
    pages = int((-(-lens.max(axis=1) // page)).sum()) + 2
    keys = rule_reaching_keys(rng, pages * page)
    keys[1, :32] = 300.0  # logits of keys near the float range would leave it
    cache = ref.fp4_cache(keys, page)
    table = ref.random_block_table(rng, lens, pages, page=page)
    q = rng.standard_normal((batch, next_n, heads, D)).astype(np.float32)
    weights = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    codes, scales, q_values = ref.encode_queries(q, fp4_queries)
    q_args = dict(q=codes, q_block_scales=scales)
    return dict(lens=lens, cache=cache, table=table, weights=weights, page=page, q_args=q_args,
                q_values=q_values, max_len=int(lens.max()) + 3)


def expected_logits(p):
    return ref.logits_of_values(p["q_values"], ref.fp4_cache_keys(p["cache"], p["page"]),
                                p["weights"], p["lens"], p["table"], p["max_len"], p["page"])


@pytest.mark.parametrize("page", [64, 32])
@pytest.mark.parametrize("view", ["2d", "4d"])
@pytest.mark.parametrize("key_dtype", ["float32", "bfloat16"])
def test_store_index_keys_fp4_matches_reference(rng, page, view, key_dtype):
    pages, tokens = 5, 150
    keys = rule_reaching_keys(rng, tokens)
    if key_dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        keys_in = torch.from_numpy(keys).to(torch.bfloat16)
        keys = keys_in.float().numpy()
    else:
        keys_in = keys
    slots = np.where(np.arange(tokens) % 13 == 4, -1, (np.arange(tokens) * 37) % (pages * page))
    expected = np.full((pages, page * W), 0x5A, dtype=np.uint8)
    stored = np.full((pages * page, D), np.nan, dtype=np.float32)
    stored[slots[slots >= 0]] = keys[slots >= 0]
    full = ref.fp4_cache(np.nan_to_num(stored), page)
    written = np.zeros(pages * page, dtype=bool)
    written[slots[slots >= 0]] = True
    for s in np.flatnonzero(written):
        p_, r = divmod(int(s), page)
        expected[p_, r * 64:(r + 1) * 64] = full[p_, r * 64:(r + 1) * 64]
        expected[p_, page * 64 + 4 * r: page * 64 + 4 * r + 4] = full[p_, page * 64 + 4 * r: page * 64 + 4 * r + 4]
    cache = np.full((pages, page * W), 0x5A, dtype=np.uint8)
    if view == "4d":
        target = cache.reshape(pages, page, 1, W)
        dsa.store_index_keys(keys_in, slots, target, backend="cpu")
    else:
        dsa.store_index_keys(keys_in, slots, cache, page_size=page, key_format="fp4", backend="cpu")
    np.testing.assert_array_equal(cache, expected)


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_quantize_queries_fp4_matches_reference(rng, backend):
    q = rule_reaching_keys(rng, 2 * 3 * 4).reshape(2, 3, 4, D)
    gate = rng.standard_normal((6, 4)).astype(np.float32)
    codes, scales, weights = dsa.quantize_queries_fp4(q, gate, weight_scale=0.125, backend=backend)
    want_codes, want_scales = ref.fp4_quantize(q)
    np.testing.assert_array_equal(codes, want_codes)
    np.testing.assert_array_equal(scales, want_scales)
    np.testing.assert_array_equal(weights, gate * np.float32(0.125))
    assert codes.shape == (2, 3, 4, 64) and scales.dtype == np.int32


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("fp4_queries", [False, True])
@pytest.mark.parametrize("page", [64, 32])
def test_paged_mqa_logits_fp4_keys(rng, backend, fp4_queries, page):
    p = fp4_problem(rng, page=page, fp4_queries=fp4_queries)
    args = (p["weights"], p["lens"], p["table"], p["max_len"])
    logits = dsa.paged_mqa_logits(p["q_args"]["q"], p["cache"], *args, clean_logits=True,
                                  page_size=page, key_format="fp4",
                                  q_block_scales=p["q_args"]["q_block_scales"], backend=backend)
    ref.assert_logits_close(logits, expected_logits(p))
    # The 4-D view tells the format itself.
    view = dsa.paged_mqa_logits(p["q_args"]["q"], p["cache"].reshape(-1, page, 1, W), *args,
                                clean_logits=True, q_block_scales=p["q_args"]["q_block_scales"],
                                backend=backend)
    np.testing.assert_array_equal(view, logits)


@pytest.mark.parametrize("strategy", ["fused", "logits_then_topk"])
def test_index_topk_fp4_equals_topk_of_logits(rng, strategy):
    k = 30
    p = fp4_problem(rng, next_n=3, fp4_queries=True)
    common = dict(q_block_scales=p["q_args"]["q_block_scales"])
    args = (p["q_args"]["q"], p["cache"].reshape(-1, 64, 1, W), p["weights"], p["lens"], p["table"],
            p["max_len"])
    logits = dsa.paged_mqa_logits(*args, **common)
    flat = p["lens"].reshape(-1)
    np.testing.assert_array_equal(dsa.index_topk(*args, k, sorted=True, strategy=strategy, **common),
                                  dsa.topk(logits, flat, k, sorted=True))
    np.testing.assert_array_equal(
        dsa.index_topk(*args, k, sorted=True, physical_slots=True, strategy=strategy, **common),
        dsa.topk(logits, flat, k, sorted=True, block_table=p["table"], rows_per_request=3))


def fp4_varlen_problem(rng, rows_per_request, page, fp4_queries, heads=4):
    """A varlen_problem (lengths in any order, offsets, block table, weights) over an fp4
    cache of rule-reaching keys, with fp8 or fp4 queries [T, 1, H, ...]."""
    p = ref.varlen_problem(rng, rows_per_request, heads=heads, head_dim=8, page=page, causal=False,
                           max_prefix=500)
    pages = p["cache"].shape[0]
    keys = rule_reaching_keys(rng, pages * page)
    keys[1, :32] = 300.0  # logits of keys near the float range would leave it
    p["cache"] = ref.fp4_cache(keys, page)
    q = rng.standard_normal((len(p["lens"]), 1, heads, D)).astype(np.float32)
    codes, scales, q_values = ref.encode_queries(q, fp4_queries)
    p.update(q=codes, q_block_scales=scales, q_values=q_values)
    return p


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
@pytest.mark.parametrize("fp4_queries", [False, True])
@pytest.mark.parametrize("page", [64, 32])
def test_fp4_request_offsets(rng, backend, fp4_queries, page):
    """Requests of uneven row counts over an fp4 cache: every row reads its request's
    block-table row; index_topk is topk of those logits, positions and cache slots."""
    p = fp4_varlen_problem(rng, [3, 0, 11, 1, 6], page, fp4_queries)
    args = (p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"])
    common = dict(request_offsets=p["offsets"], page_size=page, key_format="fp4",
                  q_block_scales=p["q_block_scales"], backend=backend)
    logits = dsa.paged_mqa_logits(*args, clean_logits=True, **common)
    expected = ref.logits_of_values(p["q_values"], ref.fp4_cache_keys(p["cache"], page), p["weights"],
                                    p["lens"][:, None], p["table"][p["indices"]], p["max_len"], page)
    ref.assert_logits_close(logits, expected)
    np.testing.assert_array_equal(np.isneginf(logits), np.isneginf(expected))
    k = 30
    for physical_slots in (False, True):
        want = dsa.topk(logits, p["lens"], k, sorted=True, backend=backend,
                        **(dict(block_table=p["table"], request_offsets=p["offsets"], page_size=page)
                           if physical_slots else {}))
        for strategy in ("fused", "logits_then_topk"):
            np.testing.assert_array_equal(
                dsa.index_topk(*args, k, sorted=True, physical_slots=physical_slots,
                               strategy=strategy, **common), want)


def test_fp4_argument_errors(rng):
    p = fp4_problem(rng, fp4_queries=True)
    q, scales = p["q_args"]["q"], p["q_args"]["q_block_scales"]
    view = p["cache"].reshape(-1, 64, 1, W)
    args = (p["weights"], p["lens"], p["table"], p["max_len"])
    with pytest.raises(ValueError, match="options.key_format is fp8_e4m3"):
        dsa.paged_mqa_logits(q, view, *args, key_format="fp8", q_block_scales=scales)
    with pytest.raises(ValueError, match=r"key_format: unknown value 'fp6'"):
        dsa.paged_mqa_logits(q, view, *args, key_format="fp6", q_block_scales=scales)
    with pytest.raises(ValueError, match="paged_mqa_logits: q_block_scales: .*int32"):
        dsa.paged_mqa_logits(q, view, *args, q_block_scales=scales.astype(np.float32))
    with pytest.raises(ValueError, match="paged_mqa_logits: q: fp4 queries .* dimension 3 must be 64"):
        dsa.paged_mqa_logits(np.ascontiguousarray(q[..., :32]), view, *args, q_block_scales=scales)
    keys = np.ones((4, 64), dtype=np.float32)
    with pytest.raises(ValueError, match="fp4_e2m1 key format serves head dim 128 only"):
        dsa.store_index_keys(keys, np.arange(4), np.zeros((2, 64 * 36), dtype=np.uint8),
                             key_format="fp4")
    with pytest.raises(ValueError, match="quantize_queries_fp4: q: fp4 queries serve head dim 128"):
        dsa.quantize_queries_fp4(np.ones((1, 1, 2, 64), dtype=np.float32),
                                 np.ones((1, 2), dtype=np.float32))


def test_deep_gemm_fp4_queries_and_cache():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(97)
    for page in (64, 32):
        p = fp4_problem(rng, next_n=2, page=page, fp4_queries=True)
        schedule = deep_gemm.get_paged_mqa_logits_metadata(torch.from_numpy(p["lens"]), page, 4)
        kv_cache = torch.from_numpy(p["cache"]).view(-1, page, 1, W)
        q_fp4 = torch.from_numpy(p["q_args"]["q"]).view(torch.int8)
        q_sf = torch.from_numpy(p["q_args"]["q_block_scales"])
        logits = deep_gemm.fp8_fp4_paged_mqa_logits(
            (q_fp4, q_sf), kv_cache, torch.from_numpy(p["weights"]), torch.from_numpy(p["lens"]),
            torch.from_numpy(p["table"]), schedule, p["max_len"], clean_logits=True)
        ref.assert_logits_close(logits.numpy(), expected_logits(p))
    # fp8 queries against the same fp4 cache.
    p = fp4_problem(rng, next_n=1, fp4_queries=False)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(
        (torch.from_numpy(p["q_args"]["q"]).view(torch.float8_e4m3fn), None),
        torch.from_numpy(p["cache"]).view(-1, 64, 1, W), torch.from_numpy(p["weights"]),
        torch.from_numpy(p["lens"]), torch.from_numpy(p["table"]),
        deep_gemm.get_paged_mqa_logits_metadata(torch.from_numpy(p["lens"]), 64, 4), p["max_len"],
        clean_logits=True)
    ref.assert_logits_close(logits.numpy(), expected_logits(p))
    with pytest.raises(TypeError, match="fp8_fp4_paged_mqa_logits: q: must hold packed e2m1 codes"):
        deep_gemm.fp8_fp4_paged_mqa_logits(
            (torch.zeros(1, 1, 4, 64), torch.zeros(1, 1, 4, dtype=torch.int32)), kv_cache,
            torch.from_numpy(p["weights"]), torch.from_numpy(p["lens"]),
            torch.from_numpy(p["table"]), schedule, p["max_len"])


def test_torch_operators_take_the_fp4_arguments():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q = torch.from_numpy(rng.standard_normal((2, 1, 4, D)).astype(np.float32))
    gate = torch.ones(2, 4)
    codes, scales, weights = torch.ops.dsa_indexer.quantize_queries_fp4(q, gate, weight_scale=1.0)
    want_codes, want_scales = ref.fp4_quantize(q.numpy())
    np.testing.assert_array_equal(codes.numpy(), want_codes)
    np.testing.assert_array_equal(scales.numpy(), want_scales)
    p = fp4_problem(rng, batch=2, next_n=1, fp4_queries=True)
    logits = torch.ops.dsa_indexer.paged_mqa_logits(
        torch.from_numpy(p["q_args"]["q"]), torch.from_numpy(p["cache"]),
        torch.from_numpy(p["weights"]), torch.from_numpy(p["lens"]), torch.from_numpy(p["table"]),
        p["max_len"], clean_logits=True, key_format="fp4",
        q_block_scales=torch.from_numpy(p["q_args"]["q_block_scales"]))
    ref.assert_logits_close(logits.numpy(), expected_logits(p))


@pytest.mark.parametrize("backend", ["cpu", "cpu_reference"])
def test_mqa_logits_fp4(rng, backend):
    rows, heads, num_keys = 6, 4, 70
    q = rng.standard_normal((rows, heads, D)).astype(np.float32)
    keys = rule_reaching_keys(rng, num_keys)
    keys[1, :32] = 300.0
    weights = rng.standard_normal((rows, heads)).astype(np.float32)
    ks = np.arange(rows, dtype=np.int32) * 5
    ke = np.minimum(ks + 30, num_keys).astype(np.int32)
    q_codes, q_sf = ref.fp4_quantize(q)
    key_codes, key_sf = ref.fp4_quantize(keys)
    logits = dsa.mqa_logits(q_codes, key_codes, key_sf, weights, ks, ke, clean_logits=True,
                            q_block_scales=q_sf, backend=backend)
    q_values, key_values = ref.fp4_decode(q_codes, q_sf), ref.fp4_decode(key_codes, key_sf)
    expected = np.full((rows, num_keys), -np.inf)
    for i in range(rows):
        k = key_values[ks[i]:ke[i]]
        expected[i, ks[i]:ke[i]] = weights[i].astype(np.float64) @ np.maximum(0.0, q_values[i] @ k.T)
    ref.assert_logits_close(logits, expected)


def test_deep_gemm_fp8_fp4_mqa_logits_fp4():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    rows, heads, num_keys = 5, 8, 60
    q = rng.standard_normal((rows, heads, D)).astype(np.float32)
    keys = rng.standard_normal((num_keys, D)).astype(np.float32)
    weights = rng.standard_normal((rows, heads)).astype(np.float32)
    ks = np.zeros(rows, dtype=np.int32)
    ke = np.full(rows, num_keys, dtype=np.int32)
    q_codes, q_sf = ref.fp4_quantize(q)
    key_codes, key_sf = ref.fp4_quantize(keys)
    logits = deep_gemm.fp8_fp4_mqa_logits(
        (torch.from_numpy(q_codes).view(torch.int8), torch.from_numpy(q_sf)),
        (torch.from_numpy(key_codes).view(torch.int8), torch.from_numpy(key_sf)),
        torch.from_numpy(weights), torch.from_numpy(ks), torch.from_numpy(ke))
    expected = weights.astype(np.float64)[:, None, :] @ np.maximum(
        0.0, np.einsum("shd,kd->skh", ref.fp4_decode(q_codes, q_sf), ref.fp4_decode(key_codes, key_sf))
    ).transpose(0, 2, 1)
    ref.assert_logits_close(logits.numpy(), expected[:, 0, :])
    with pytest.raises(NotImplementedError, match="fp8_mqa_logits: kv: FP4 keys"):
        deep_gemm.fp8_mqa_logits(torch.from_numpy(ref.e4m3_encode(q)).view(torch.float8_e4m3fn),
                                 (torch.from_numpy(key_codes), torch.from_numpy(key_sf)),
                                 torch.from_numpy(weights), torch.from_numpy(ks), torch.from_numpy(ke))
