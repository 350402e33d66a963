"""dsa_indexer with PyTorch CUDA tensors, against PyTorch references written here.

Skipped unless PyTorch with a CUDA device is importable."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import dsa_indexer as dsa  # noqa: E402
import reference as ref  # noqa: E402
from dsa_indexer import integration  # noqa: E402
from dsa_indexer.compat import deep_gemm, sgl_kernel, vllm  # noqa: E402

if not dsa.built_with_cuda():
    pytest.skip("dsa_indexer was built without CUDA", allow_module_level=True)

DEVICE = "cuda"
D = 128
PAGE = 64
FP8 = torch.float8_e4m3fn


@pytest.fixture
def rng():
    return np.random.default_rng(2024)


def cuda(array):
    return torch.from_numpy(np.ascontiguousarray(array)).to(DEVICE)


# ---------------------------------------------------------------------------
# PyTorch references


def torch_quantize(x, power_of_two):
    """(fp8 codes as uint8, float32 scales) per row of the last dimension."""
    x = x.float()
    amax = x.abs().amax(dim=-1).clamp_min(1e-4)
    # A tensor divisor: dividing by a Python float multiplies by its rounded
    # reciprocal on CUDA, which is not the correctly rounded quotient.
    scale = amax / torch.full_like(amax, 448.0)
    if power_of_two:
        mantissa, exponent = torch.frexp(scale)
        scale = torch.where(mantissa == 0.5, scale, torch.ldexp(torch.ones_like(scale), exponent))
    codes = (x / scale[..., None]).clamp(-448.0, 448.0).to(FP8).view(torch.uint8)
    return codes, scale


def torch_decode_cache(cache, head_dim, page=PAGE):
    pages = cache.shape[0]
    flat = cache.reshape(pages, -1)
    keys = flat[:, : page * head_dim].contiguous().view(FP8).double().view(pages, page, head_dim)
    scales = flat[:, page * head_dim: page * head_dim + 4 * page].contiguous()
    return keys, scales.view(torch.float32).double().view(pages, page)


def torch_logits(q, cache, weights, lens, table, max_len, magnitude=False, page=PAGE):
    """float64 logits; with magnitude=True, sum_h |w| * |scale| * sum_d |q k| instead
    (the scale of the rounding error a correct kernel may make). Pages of `page` tokens."""
    keys, scales = torch_decode_cache(cache, q.shape[-1], page)
    qd = q.view(FP8).double() if q.dtype == torch.uint8 else q.double()
    if magnitude:
        keys, scales, qd, weights = keys.abs(), scales.abs(), qd.abs(), weights.abs()
    batch, next_n = lens.shape
    out = torch.full((batch * next_n, max_len), -torch.inf, dtype=torch.float64, device=q.device)
    host_lens = lens.cpu()
    for b in range(batch):
        for j in range(next_n):
            length = int(host_lens[b, j])
            pos = torch.arange(length, device=q.device)
            pages = table[b, pos // page].long()
            k = keys[pages, pos % page]
            s = scales[pages, pos % page]
            r = b * next_n + j
            out[r, :length] = weights[r].double() @ torch.relu((qd[b, j] @ k.T) * s)
    return out


def torch_topk(values, lengths, k):
    """Sorted selection: largest first, NaN as -inf, ties by position; -1 padding."""
    out = torch.full((values.shape[0], k), -1, dtype=torch.int32, device=values.device)
    for r, length in enumerate(lengths.tolist()):
        if length <= k:
            out[r, :length] = torch.arange(length, dtype=torch.int32, device=values.device)
            continue
        row = torch.nan_to_num(values[r, :length].double(), nan=-torch.inf) + 0.0
        out[r] = torch.sort(row, descending=True, stable=True).indices[:k].int()
    return out


def assert_logits_close(actual, expected, magnitude, rtol=2e-3):
    """The fp8 tensor cores accumulate with about 13 mantissa bits: errors up to
    ~1e-3 of the magnitude are expected from the Hopper kernels."""
    valid = torch.isfinite(expected)
    error = (actual[valid].double() - expected[valid]).abs()
    bound = rtol * magnitude[valid] + 1e-6
    worst = float((error / (magnitude[valid] + 1e-30)).max()) if valid.any() else 0.0
    assert bool((error <= bound).all()), f"largest error {worst:.2e} of the magnitude"


def same_selection(actual, expected):
    torch.testing.assert_close(actual.sort(dim=1).values, expected.sort(dim=1).values)


def scoring_problem(rng, batch=4, next_n=2, heads=64, max_prefix=3000, page_stride=None,
                    page=PAGE):
    p = ref.scoring_problem(rng, batch, next_n, heads, D, max_prefix, page_stride=page_stride,
                            page=page, spare_pages=3, spare_columns=7)
    on_device = {name: cuda(value) for name, value in p.items() if isinstance(value, np.ndarray)}
    on_device["q"] = on_device["q"].view(FP8)
    return dict(p, **on_device)


def reference_of(p, lens=None):
    """(float64 logits, their error magnitude) of problem p, with its causal lengths or `lens`."""
    lens = p["lens"] if lens is None else lens
    return [torch_logits(p["q"], p["cache"], p["weights"], lens, p["table"], p["max_len"],
                         magnitude=m, page=p["page"]) for m in (False, True)]


def args_of(p):
    return (p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"])


# ---------------------------------------------------------------------------
# Keys and queries


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("power_of_two", [False, True])
@pytest.mark.parametrize("page", [64, 32])
def test_store_index_keys(rng, dtype, power_of_two, page):
    pages, tokens = 4, 100
    cache = torch.zeros((pages, ref.page_bytes(D, page)), dtype=torch.uint8, device=DEVICE)
    keys = (torch.randn(tokens, D, device=DEVICE) * 7).to(dtype)
    slots = torch.randperm(pages * page, device=DEVICE)[:tokens].int()
    slots[7] = -1
    # A cache of 32-token pages through DeepGEMM's view, which states the page size.
    target = cache if page == PAGE else cache.view(pages, page, 1, D + 4)
    dsa.store_index_keys(keys, slots, target, power_of_two_scales=power_of_two)
    codes, scales = torch_quantize(keys, power_of_two)
    written = slots >= 0
    stored = cache[:, : page * D].reshape(-1, D)
    stored_scales = (cache[:, page * D: page * (D + 4)].contiguous().view(torch.float32)
                     .reshape(-1))
    s = slots[written].long()
    torch.testing.assert_close(stored[s], codes[written], rtol=0, atol=0)
    torch.testing.assert_close(stored_scales[s], scales[written], rtol=0, atol=0)


def test_quantize_queries(rng):
    batch, next_n, heads = 3, 4, 64
    q = torch.randn(batch, next_n, heads, D, device=DEVICE, dtype=torch.bfloat16)
    gate = torch.randn(batch * next_n, heads, device=DEVICE)
    q_fp8, weights = dsa.quantize_queries(q, gate)
    assert q_fp8.dtype == FP8 and weights.dtype == torch.float32
    codes, scales = torch_quantize(q, False)
    torch.testing.assert_close(q_fp8.view(torch.uint8), codes, rtol=0, atol=0)
    expected = gate * scales.reshape(-1, heads) * heads ** -0.5 * D ** -0.5
    torch.testing.assert_close(weights, expected, rtol=1e-6, atol=0)


# ---------------------------------------------------------------------------
# Lengths, schedule, scoring


@pytest.mark.parametrize("convention", ["causal", "expanded", "legacy"])
def test_length_builders_on_strided_input(rng, convention):
    base = cuda(rng.integers(0, 5000, size=20).astype(np.int32))
    lens = dsa.context_lens(base[::4], 3, convention)
    assert lens.device.type == "cuda" and lens.dtype == torch.int32
    integration.verify_context_lens(lens, base[::4], 3, convention)


@pytest.mark.parametrize("path", ["native", "per_token"])
def test_plan_schedule_on_device(rng, path):
    lens = dsa.causal_context_lens(cuda(rng.integers(0, 9000, size=7).astype(np.int32)), 3)
    schedule = dsa.plan_schedule(lens, 132, path)
    np.testing.assert_array_equal(schedule.cpu().numpy(),
                                  ref.schedule(lens.cpu().numpy(), 132, path))


@pytest.mark.parametrize("convention", ["causal", "expanded", "legacy"])
@pytest.mark.parametrize("pdl", [False, True])
def test_context_lens_and_schedule_on_device(rng, convention, pdl):
    prefix = cuda(rng.integers(0, 9000, size=40).astype(np.int32))[::2]
    lens, schedule = dsa.context_lens_and_schedule(prefix, 3, convention, 132, "native", pdl=pdl,
                                                   check_device_errors=True)
    assert lens.device == prefix.device and schedule.device == prefix.device
    integration.verify_context_lens(lens, prefix, 3, convention)
    np.testing.assert_array_equal(schedule.cpu().numpy(),
                                  ref.schedule(lens.cpu().numpy(), 132, "native"))
    with pytest.raises(ValueError, match="context_lens_and_schedule"):
        dsa.context_lens_and_schedule(cuda(np.array([4, -2], dtype=np.int32)), 2, convention,
                                      check_device_errors=True)


@pytest.mark.parametrize("next_n", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("heads", [64, 32])
def test_paged_mqa_logits(rng, next_n, heads):
    p = scoring_problem(rng, next_n=next_n, heads=heads)
    expected = torch_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                            p["max_len"])
    magnitude = torch_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                             p["max_len"], magnitude=True)
    for path in ("auto", "native", "per_token"):
        for backend in ("auto", "cuda_generic"):
            out = dsa.paged_mqa_logits(*args_of(p), clean_logits=True, path=path,
                                       backend=backend, check_device_errors=True)
            assert_logits_close(out, expected, magnitude)
            assert torch.equal(torch.isneginf(out), torch.isneginf(expected))


def test_paged_mqa_logits_strided_inputs(rng):
    next_n, heads = 3, 64
    p = scoring_problem(rng, next_n=next_n, heads=heads, page_stride=ref.page_bytes(D) + 256)
    expected = torch_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                            p["max_len"])
    magnitude = torch_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                             p["max_len"], magnitude=True)
    wide_q = torch.zeros((p["q"].shape[0], next_n, 2 * heads, D), dtype=FP8, device=DEVICE)
    wide_q[:, :, heads:] = p["q"]
    q = wide_q[:, :, heads:]  # head stride kept, batch/draft strides doubled
    weights = torch.zeros((p["weights"].shape[0], heads + 32), device=DEVICE)
    weights[:, :heads] = p["weights"]
    repeated = p["table"].repeat_interleave(next_n, dim=0)
    table = integration.per_request_block_table(repeated, next_n)
    assert table.data_ptr() == repeated.data_ptr()
    prefix_store = torch.zeros(2 * p["lens"].shape[0], dtype=torch.int32, device=DEVICE)
    prefix_store[::2] = p["prefix"]
    lens = dsa.causal_context_lens(prefix_store[::2], next_n)
    logits_store = torch.full((expected.shape[0], p["max_len"] + 33), 5.0, device=DEVICE)
    out = logits_store[:, : p["max_len"]]
    dsa.paged_mqa_logits(q, p["cache"], weights[:, :heads], lens, table, p["max_len"],
                         clean_logits=True, out=out, check_device_errors=True)
    assert_logits_close(out, expected, magnitude)
    assert bool((logits_store[:, p["max_len"]:] == 5.0).all())

    # fp8 given as its uint8 bytes reads the same.
    again = dsa.paged_mqa_logits(q.view(torch.uint8), p["cache"], weights[:, :heads], lens,
                                 table, p["max_len"], clean_logits=True)
    assert torch.equal(again, out)


def test_topk_and_index_topk(rng):
    next_n, k = 2, 2048
    p = scoring_problem(rng, next_n=next_n, max_prefix=9000)
    logits = dsa.paged_mqa_logits(*args_of(p), clean_logits=True)
    lens = p["lens"].reshape(-1)
    expected = torch_topk(logits, lens, k)
    sorted_idx = dsa.topk(logits, lens, k, sorted=True)
    torch.testing.assert_close(sorted_idx, expected, rtol=0, atol=0)
    same_selection(dsa.topk(logits, lens, k), expected)
    hopper = torch.cuda.get_device_capability(DEVICE) == (9, 0)
    for strategy in ("auto", "logits_then_topk") + (("fused",) if hopper else ()):
        fused = dsa.index_topk(*args_of(p), k, sorted=True, strategy=strategy)
        torch.testing.assert_close(fused, sorted_idx, rtol=0, atol=0)
    # The generic CUDA kernels have no fused pass and say so.
    with pytest.raises(NotImplementedError, match="index_topk: strategy"):
        dsa.index_topk(*args_of(p), k, sorted=True, strategy="fused", backend="cuda_generic")
    slots = dsa.index_topk(*args_of(p), k, sorted=True, physical_slots=True)
    request = torch.arange(lens.shape[0], device=DEVICE)[:, None] // next_n
    valid = sorted_idx >= 0
    pages = p["table"][request.expand_as(sorted_idx), (sorted_idx.clamp_min(0) // PAGE).long()]
    expected_slots = torch.where(valid, pages * PAGE + sorted_idx % PAGE, -1)
    torch.testing.assert_close(slots, expected_slots.int(), rtol=0, atol=0)


def test_topk_ties_and_nan():
    values = torch.zeros((3, 5000), device=DEVICE)
    values[1, ::7] = torch.nan
    values[2] = torch.arange(5000, device=DEVICE).float() % 3
    lens = torch.tensor([5000, 4000, 4999], dtype=torch.int32, device=DEVICE)
    torch.testing.assert_close(dsa.topk(values, lens, 100, sorted=True),
                               torch_topk(values, lens, 100), rtol=0, atol=0)


# ---------------------------------------------------------------------------
# DeepGEMM compatibility


@pytest.mark.parametrize("next_n", [1, 2, 3, 4])
def test_deep_gemm_compat(rng, next_n):
    p = scoring_problem(rng, next_n=next_n)
    kv_cache = p["cache"].view(-1, PAGE, 1, D + 4)
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, num_sms)
    logits = deep_gemm.fp8_paged_mqa_logits(p["q"], kv_cache, p["weights"], p["lens"],
                                            p["table"], schedule, p["max_len"],
                                            clean_logits=True)
    native = dsa.paged_mqa_logits(*args_of(p), clean_logits=True)
    assert torch.equal(logits, native)
    legacy = p["prefix"] + next_n
    schedule = deep_gemm.get_paged_mqa_logits_metadata(legacy, 64, num_sms)
    logits = deep_gemm.fp8_paged_mqa_logits(p["q"], kv_cache, p["weights"], legacy, p["table"],
                                            schedule, p["max_len"], True)
    assert torch.equal(logits, native)


@pytest.mark.parametrize("page", [64, 32])
@pytest.mark.parametrize("heads", [64, 32])
@pytest.mark.parametrize("next_n", range(1, 9))
def test_deep_gemm_current_names(rng, page, heads, next_n):
    p = scoring_problem(rng, batch=3, next_n=next_n, heads=heads, page=page)
    kv_cache = p["cache"].view(-1, page, 1, D + 4)
    num_sms = deep_gemm.get_num_sms()
    assert num_sms == torch.cuda.get_device_properties(DEVICE).multi_processor_count
    expected, magnitude = reference_of(p)
    results = []
    for lens in (p["lens"], p["prefix"] + next_n):  # 2-D lengths, then the legacy 1-D ones
        for workers in (num_sms, num_sms // 2, 1):  # engines plan for part of the device
            schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, page, workers)
            assert schedule.shape == (workers + 1, 2) and schedule.device.type == "cuda"
            args = (kv_cache, p["weights"], lens, p["table"], schedule, p["max_len"])
            logits = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True)
            assert logits.dtype == torch.float32
            assert torch.equal(deep_gemm.fp8_paged_mqa_logits(p["q"], *args, True), logits)
            bf16 = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True,
                                                      logits_dtype=torch.bfloat16)
            assert bf16.dtype == torch.bfloat16
            assert torch.equal(torch.isneginf(bf16), torch.isneginf(expected))
            assert_logits_close(bf16.float(), expected, magnitude, rtol=2**-7)
            results.append(logits)
    assert_logits_close(results[0], expected, magnitude)
    assert torch.equal(torch.isneginf(results[0]), torch.isneginf(expected))
    for logits in results[1:]:
        assert torch.equal(logits, results[0])


@pytest.mark.parametrize("page", [64, 32])
@pytest.mark.parametrize("fp4_queries", [False, True])
@pytest.mark.parametrize("next_n", [1, 2, 5])
def test_deep_gemm_fp4_cache(rng, page, fp4_queries, next_n):
    """FP4 caches through DeepGEMM's current name on CUDA tensors (the sm_90a kernels on
    Hopper), fp8 or fp4 queries, against the float64 reference of the dequantized values."""
    batch, heads = 4, 64
    prefix = rng.integers(0, 2500, size=batch).astype(np.int32)
    lens = (prefix[:, None] + np.arange(next_n)[None, :] + 1).astype(np.int32)
    pages = int((-(-lens.max(axis=1) // page)).sum()) + 2
    keys = (rng.standard_normal((pages * page, D)) * np.exp(rng.uniform(-2, 2, (pages * page, 1))))
    cache = ref.fp4_cache(keys.astype(np.float32), page)
    table = ref.random_block_table(rng, lens, pages, page=page)
    q = rng.standard_normal((batch, next_n, heads, D)).astype(np.float32)
    weights = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    codes, scales, q_values = ref.encode_queries(q, fp4_queries)
    q_pair = (cuda(codes).view(torch.int8), cuda(scales)) if fp4_queries else (cuda(codes).view(FP8), None)
    max_len = int(lens.max()) + 3
    key_values = ref.fp4_cache_keys(cache, page)
    expected = ref.logits_of_values(q_values, key_values, weights, lens, table, max_len, page)
    magnitude = ref.logits_of_values(np.abs(q_values), np.abs(key_values), np.abs(weights), lens,
                                     table, max_len, page)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(cuda(lens), page, deep_gemm.get_num_sms())
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(
        q_pair, cuda(cache).view(-1, page, 1, ref.FP4_TOKEN_BYTES), cuda(weights), cuda(lens),
        cuda(table), schedule, max_len, clean_logits=True)
    expected_t, magnitude_t = torch.from_numpy(expected).to(DEVICE), torch.from_numpy(magnitude).to(DEVICE)
    assert_logits_close(logits, expected_t, magnitude_t)
    assert torch.equal(torch.isneginf(logits), torch.isneginf(expected_t))


def test_deep_gemm_refusals(rng):
    p = scoring_problem(rng, next_n=2, page=32)
    args = (p["cache"].view(-1, 32, 1, D + 4), p["weights"], p["lens"], p["table"],
            deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 32, 8), p["max_len"])
    q_sf = torch.ones(p["q"].shape[:-1], device=DEVICE)
    # A scale tensor makes q the FP4 form, whose codes are bytes, not float8 values.
    with pytest.raises(TypeError, match="fp8_fp4_paged_mqa_logits: q: must hold packed e2m1 codes"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], q_sf), *args)
    rows = torch.arange(p["lens"].shape[0], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="fp8_fp4_paged_mqa_logits: q: with indices"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, indices=rows)
    with pytest.raises(ValueError, match="get_paged_mqa_logits_metadata: block_kv"):
        deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 16, 8)
    with pytest.raises(ValueError, match="fp8_fp4_paged_mqa_logits: logits_dtype"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, logits_dtype=torch.float16)
    with pytest.raises(ValueError, match="paged_mqa_logits: weights"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), args[0], p["weights"][1:], *args[2:])


def selection_rows(rng, rows=9, width=9000, k=2048):
    """CUDA (score [rows, width], lengths, row_starts) with ties, NaN, empty and short rows,
    and their NumPy copies."""
    score = rng.standard_normal((rows, width)).astype(np.float32)
    score[1, :3000] = 0.25  # many ties
    score[2, 17] = np.nan
    starts = rng.integers(0, width // 4, size=rows).astype(np.int32)
    lengths = rng.integers(k + 1, width - width // 4, size=rows).astype(np.int32)
    lengths[3], lengths[4], lengths[5] = 0, k, k // 3
    host = dict(score=score, lengths=lengths, starts=starts)
    return {name: cuda(value) for name, value in host.items()}, host


def same_rows(actual, expected):
    """Same set per row (sgl-kernel's order within a row is unspecified)."""
    np.testing.assert_array_equal(np.sort(actual.cpu().numpy(), axis=1),
                                  np.sort(expected, axis=1))


@pytest.mark.parametrize("k", [2048, 512])
@pytest.mark.parametrize("starts", [False, True])
def test_sgl_kernel(rng, k, starts):
    dev, host = selection_rows(rng, k=k)
    dev_starts = dev["starts"] if starts else None
    positions = ref.topk(host["score"], host["lengths"], k, host["starts"] if starts else None)
    rows = len(host["lengths"])
    result = sgl_kernel.fast_topk_v2(dev["score"], dev["lengths"], k, dev_starts)
    assert result.device.type == "cuda" and result.dtype == torch.int32
    same_rows(result, positions)

    # Decode (R == B), target verify / extend (requests of uneven row counts).
    for offsets in (np.arange(rows + 1), np.array([0, 4, 4, 5, rows])):
        offsets = offsets.astype(np.int32)
        table = rng.integers(0, 10**6, size=(len(offsets) - 1, 9000)).astype(np.int32)
        result = sgl_kernel.fast_topk_transform_fused(dev["score"], dev["lengths"], cuda(table),
                                                      cuda(offsets), k, dev_starts)
        requests = ref.request_of_rows(rows, request_offsets=offsets)
        same_rows(result, ref.slots(positions, table, requests, 1))

    offsets = np.cumsum(rng.integers(0, 9000, size=rows)).astype(np.int32)
    result = sgl_kernel.fast_topk_transform_ragged_fused(dev["score"], dev["lengths"],
                                                         cuda(offsets), k, dev_starts)
    same_rows(result, np.where(positions >= 0, positions + offsets[:, None], -1))


@pytest.mark.parametrize("k", [2048, 512])
def test_vllm_top_k_per_row(rng, k):
    dev, host = selection_rows(rng, k=k)
    rows = len(host["lengths"])
    # Written in place into a slice of a wider buffer, as vLLM's topk_indices_buffer.
    buffer = torch.full((rows + 3, k + 5), -7, dtype=torch.int32, device=DEVICE)
    view = buffer[:rows, :k]
    score = dev["score"]
    ends = dev["starts"] + dev["lengths"]
    assert vllm.top_k_per_row_prefill(score, dev["starts"], ends, view, rows, score.stride(0),
                                      score.stride(1), k) is view
    same_rows(view, ref.topk(host["score"], host["lengths"], k, host["starts"]))
    assert (buffer[:, k:] == -7).all() and (buffer[rows:] == -7).all()

    next_n = 2
    seq_lens = rng.integers(0, host["score"].shape[1], size=rows // next_n).astype(np.int32)
    lengths = np.maximum(0, seq_lens[:, None] - next_n + np.arange(next_n) + 1).reshape(-1)
    decoded = torch.full((rows, k), -7, dtype=torch.int32, device=DEVICE)
    used = len(lengths)
    vllm.top_k_per_row_decode(score, next_n, cuda(seq_lens), decoded, used, score.stride(0), 1, k)
    same_rows(decoded[:used], ref.topk(host["score"][:used], lengths, k))


def test_vllm_indexer_k_quant_and_cache(rng):
    keys = cuda(rng.standard_normal((300, D)).astype(np.float32)).to(torch.bfloat16)
    slots = cuda(rng.permutation(8 * PAGE)[:300].astype(np.int64))
    cache = torch.zeros((8, PAGE, D + 4), dtype=torch.uint8, device=DEVICE)
    vllm.indexer_k_quant_and_cache(keys, cache, slots, D, "ue8m0")
    native = torch.zeros((8, PAGE * (D + 4)), dtype=torch.uint8, device=DEVICE)
    dsa.store_index_keys(keys, slots, native, power_of_two_scales=True)
    assert torch.equal(cache.reshape(8, -1), native)


@pytest.mark.parametrize("page", [1, 32, 64])
def test_topk_block_tables_and_request_offsets(rng, page):
    dev, host = selection_rows(rng, k=256)
    rows = len(host["lengths"])
    positions = ref.topk(host["score"], host["lengths"], 256, host["starts"])
    table = rng.integers(0, 10**5, size=(rows, -(-9000 // page))).astype(np.int32)
    for rows_per_request, offsets in ((1, None), (3, None), (1, np.array([0, 2, 2, 7, rows]))):
        options = dict(rows_per_request=rows_per_request)
        if offsets is not None:
            options = dict(request_offsets=cuda(offsets.astype(np.int32)))
        slots = dsa.topk(dev["score"], dev["lengths"], 256, sorted=True, row_starts=dev["starts"],
                         block_table=cuda(table), page_size=page, check_device_errors=True,
                         **options)
        requests = ref.request_of_rows(rows, rows_per_request, offsets)
        np.testing.assert_array_equal(slots.cpu().numpy(),
                                      ref.slots(positions, table, requests, page))


def test_index_topk_pages_of_32_tokens(rng):
    next_n, k = 3, 512
    p = scoring_problem(rng, next_n=next_n, page=32)
    cache = p["cache"].view(-1, 32, 1, D + 4)
    args = (p["q"], cache) + args_of(p)[2:]
    logits = dsa.paged_mqa_logits(*args, clean_logits=True, check_device_errors=True)
    assert_logits_close(logits, *reference_of(p))
    positions = dsa.topk(logits, p["lens"].reshape(-1), k, sorted=True)
    assert torch.equal(dsa.index_topk(*args, k, sorted=True), positions)
    requests = ref.request_of_rows(positions.shape[0], next_n)
    np.testing.assert_array_equal(
        dsa.index_topk(*args, k, sorted=True, physical_slots=True).cpu().numpy(),
        ref.slots(positions.cpu().numpy(), p["table"].cpu().numpy(), requests, 32))


# ---------------------------------------------------------------------------
# torch.compile and CUDA graphs


def indexer_step(prefix, q, cache, weights, table, max_len, next_n, k):
    lens = dsa.causal_context_lens(prefix, next_n)
    schedule = dsa.plan_schedule(lens)
    logits = dsa.paged_mqa_logits(q, cache, weights, lens, table, max_len, schedule,
                                  clean_logits=True)
    return logits, dsa.topk(logits, lens.reshape(-1), k, sorted=True)


def test_pdl_gives_bitwise_the_same_step(rng):
    """pdl=True (programmatic dependent launch) on every call of a step, eagerly and captured in
    a CUDA graph, against the same calls without it."""
    next_n, k = 3, 256
    p = scoring_problem(rng, next_n=next_n, max_prefix=6000)

    def step(pdl):
        lens = dsa.causal_context_lens(p["prefix"], next_n, pdl=pdl)
        schedule = dsa.plan_schedule(lens, pdl=pdl)
        logits = dsa.paged_mqa_logits(*args_of(dict(p, lens=lens)), schedule, clean_logits=True,
                                      pdl=pdl)
        flat = lens.reshape(-1)
        return (lens, schedule, logits, dsa.topk(logits, flat, k, sorted=True, pdl=pdl),
                dsa.index_topk(*args_of(dict(p, lens=lens)), k, sorted=True, schedule=schedule,
                               pdl=pdl))

    plain = step(False)
    torch.cuda.synchronize()
    assert_logits_close(plain[2], *reference_of(p))
    for outputs in (step(True), step(True)):
        torch.cuda.synchronize()
        for got, want in zip(outputs, plain):
            assert torch.equal(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step(True)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, plain):
        assert torch.equal(got, want)


def test_custom_ops_under_torch_compile(rng):
    next_n = 3
    p = scoring_problem(rng, next_n=next_n)
    inputs = (p["prefix"], p["q"], p["cache"], p["weights"], p["table"], p["max_len"], next_n,
              256)
    eager_logits, eager_idx = indexer_step(*inputs)
    torch._dynamo.reset()
    compiled = torch.compile(indexer_step, fullgraph=True)
    logits, idx = compiled(*inputs)
    assert torch.equal(logits, eager_logits)
    assert torch.equal(idx, eager_idx)

    fused = torch.compile(
        lambda *a: dsa.index_topk(*a, 256, sorted=True), fullgraph=True)(*args_of(p))
    assert torch.equal(fused, eager_idx)


def test_keywords_under_torch_compile(rng):
    # The CUDA side of test_torch_compile.py: a stream given as its handle, the caller's
    # workspace (where the device error record goes), bf16 logits and a row-strided `out`.
    p = scoring_problem(rng, next_n=2)
    workspace = torch.empty(dsa.workspace_bytes("paged_mqa_logits", p["q"]) + 256,
                            dtype=torch.uint8, device=DEVICE)
    side = torch.cuda.Stream()

    def score(args, out, stream, workspace):
        bf16 = dsa.paged_mqa_logits(*args, clean_logits=True, out_dtype="bfloat16",
                                    stream=stream, workspace=workspace)
        dsa.paged_mqa_logits(*args, clean_logits=True, out=out, stream=stream,
                             workspace=workspace, check_device_errors=True)
        return bf16

    expected_bf16 = dsa.paged_mqa_logits(*args_of(p), clean_logits=True, out_dtype="bfloat16")
    expected = dsa.paged_mqa_logits(*args_of(p), clean_logits=True)
    buffer = torch.full((expected.shape[0], p["max_len"] + 9), 5.0, device=DEVICE)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):  # the tensors below are allocated on the side stream
        bf16 = torch.compile(score, fullgraph=True)(args_of(p), buffer[:, : p["max_len"]],
                                                    side.cuda_stream, workspace)
    side.synchronize()
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, expected_bf16)
    assert torch.equal(buffer[:, : p["max_len"]], expected)
    assert bool((buffer[:, p["max_len"]:] == 5.0).all())
    dsa.read_device_error(workspace)  # nothing recorded


def test_custom_ops_pass_opcheck(rng):
    p = scoring_problem(rng, batch=2, next_n=2, max_prefix=500)
    lens = p["lens"]
    schedule = dsa.plan_schedule(lens)
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    # q as its uint8 bytes: the schema check compares inputs before and after with
    # torch.allclose, which float8 tensors do not implement.
    scoring = (p["q"].view(torch.uint8), p["cache"], p["weights"], lens, p["table"], p["max_len"])
    torch.library.opcheck(torch.ops.dsa_indexer.paged_mqa_logits.default, scoring,
                          dict(schedule=schedule, clean_logits=True), test_utils=utils)
    torch.library.opcheck(torch.ops.dsa_indexer.paged_mqa_logits.out, scoring,
                          dict(output=torch.empty(4, p["max_len"], device=DEVICE),
                               schedule=schedule, clean_logits=True, check_device_errors=True),
                          test_utils=utils)
    logits = dsa.paged_mqa_logits(*args_of(p), clean_logits=True)
    torch.library.opcheck(torch.ops.dsa_indexer.topk.default, (logits, lens.reshape(-1), 16),
                          dict(sorted=True), test_utils=utils)
    torch.library.opcheck(torch.ops.dsa_indexer.context_lens.default, (p["prefix"], 2),
                          test_utils=utils)


def varlen_problem(rng, rows, page=PAGE):
    """ref.varlen_problem on the device (64 heads of D = 128), with its reference logits."""
    p = ref.varlen_problem(rng, rows, heads=64, head_dim=D, page=page, causal=False,
                           max_prefix=3000)
    expected = ref.varlen_logits(p)
    t = {key: cuda(value) if isinstance(value, np.ndarray) else value for key, value in p.items()}
    t["q"] = t["q"].view(FP8)
    return t, expected


def varlen_compat_step(t, schedule):
    return deep_gemm.fp8_fp4_paged_mqa_logits(
        (t["q"], None), t["cache"].view(-1, t["page"], 1, D + 4), t["weights"], t["lens"],
        t["table"][t["indices"].long()], schedule, t["max_len"], clean_logits=True,
        indices=t["indices"])


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("rows", [[1, 4, 2, 8, 3], [0, 130, 2, 0, 5]])
def test_deep_gemm_indices(rng, page, rows):
    t, expected = varlen_problem(rng, rows, page)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(t["lens"], page, 16, indices=t["indices"])
    assert torch.equal(schedule, dsa.plan_schedule(t["lens"], 16, request_offsets=t["offsets"]))
    logits = varlen_compat_step(t, schedule)
    finite = np.isfinite(expected)
    # The Hopper kernels' fp8 products accumulate with ~13 mantissa bits.
    np.testing.assert_allclose(logits.cpu().numpy()[finite], expected[finite], rtol=2e-3,
                               atol=2e-3 * max(1.0, float(np.abs(expected[finite]).max(initial=0))))
    assert torch.equal(torch.isneginf(logits).cpu(), torch.from_numpy(np.isneginf(expected)))
    # index_topk with request_offsets (logits then top-k on CUDA) is topk of these logits.
    indices = dsa.index_topk(t["q"], t["cache"], t["weights"], t["lens"], t["table"],
                             t["max_len"], 64, schedule, sorted=True, page_size=page,
                             request_offsets=t["offsets"])
    assert torch.equal(indices, dsa.topk(logits, t["lens"], 64, sorted=True))
    with pytest.raises(NotImplementedError, match="index_topk: strategy"):
        dsa.index_topk(t["q"], t["cache"], t["weights"], t["lens"], t["table"], t["max_len"], 64,
                       schedule, strategy="fused", page_size=page, request_offsets=t["offsets"])
    # On sm_90 the automatic choice is the Hopper kernel's row tiles.
    if torch.cuda.get_device_capability() == (9, 0):
        hopper = dsa.paged_mqa_logits(t["q"], t["cache"], t["weights"], t["lens"], t["table"],
                                      t["max_len"], schedule, page_size=page, clean_logits=True,
                                      request_offsets=t["offsets"], backend="cuda_hopper")
        assert torch.equal(hopper, logits)


def test_deep_gemm_indices_under_cuda_graphs(rng):
    t, _ = varlen_problem(rng, [3, 17, 1, 6])
    schedule = torch.empty((17, 2), dtype=torch.int32, device=DEVICE)

    def step():
        schedule.copy_(deep_gemm.get_paged_mqa_logits_metadata(t["lens"], PAGE, 16,
                                                               indices=t["indices"]))
        return varlen_compat_step(t, schedule)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = step()
    for trial in range(3):
        t["lens"].copy_((t["lens"].float() * torch.rand(t["lens"].shape, device=DEVICE)).int())
        graph.replay()
        expected = step()
        torch.cuda.synchronize()
        assert torch.equal(logits, expected), trial


def test_varlen_device_errors(rng):
    t, _ = varlen_problem(rng, [2, 5, 1])
    schedule = dsa.plan_schedule(t["lens"], 8, request_offsets=t["offsets"])
    bad = torch.tensor([0, 5, 2, 8], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="paged_mqa_logits: request_offsets"):
        dsa.paged_mqa_logits(t["q"], t["cache"], t["weights"], t["lens"], t["table"],
                             t["max_len"], schedule, request_offsets=bad,
                             check_device_errors=True)


def test_cuda_graph_replay_with_changed_lengths(rng):
    next_n, k, batch = 2, 512, 4
    p = scoring_problem(rng, batch=batch, next_n=next_n, max_prefix=4000)
    # Room for longer lengths: every request owns enough pages for max_len.
    max_len = 4200
    blocks = -(-max_len // PAGE)
    cache = cuda(ref.random_cache(rng, batch * blocks, D))
    table = torch.randperm(batch * blocks, device=DEVICE).int().view(batch, blocks)
    prefix = p["prefix"].clone()
    static = (prefix, p["q"], cache, p["weights"], table, max_len, next_n, k)

    indexer_step(*static)  # warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits, idx = indexer_step(*static)

    for trial in range(3):
        new_prefix = rng.integers(0, max_len - next_n, size=batch).astype(np.int32)
        prefix.copy_(cuda(new_prefix))
        graph.replay()
        expected_logits, expected_idx = indexer_step(*static)
        torch.cuda.synchronize()
        assert torch.equal(logits, expected_logits), trial
        assert torch.equal(idx, expected_idx), trial
        lens = dsa.causal_context_lens(prefix, next_n)
        reference = [torch_logits(p["q"], cache, p["weights"], lens, table, max_len, magnitude=m)
                     for m in (False, True)]
        assert_logits_close(logits, *reference)


# ---------------------------------------------------------------------------
# Errors


def test_device_errors_are_reported(rng):
    p = scoring_problem(rng, next_n=2)
    bad_table = p["table"].clone()
    bad_table[1, 0] = p["cache"].shape[0] + 5
    with pytest.raises(ValueError, match="block_table|page"):
        dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], bad_table,
                             p["max_len"], check_device_errors=True)
    workspace = torch.empty(dsa.workspace_bytes("paged_mqa_logits", p["q"]) + 256,
                            dtype=torch.uint8, device=DEVICE)
    dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], bad_table, p["max_len"],
                         workspace=workspace)
    with pytest.raises(ValueError, match="block_table|page"):
        dsa.read_device_error(workspace)


def test_mixed_devices_are_rejected(rng):
    p = scoring_problem(rng, next_n=1)
    with pytest.raises(ValueError, match="paged_mqa_logits"):
        dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"].cpu(), p["lens"], p["table"],
                             p["max_len"])


def test_cupy_arrays(rng):
    cupy = pytest.importorskip("cupy")
    prefix = cupy.asarray(rng.integers(0, 3000, size=5).astype(np.int32))
    lens = dsa.causal_context_lens(prefix, 3)
    assert isinstance(lens, cupy.ndarray)
    integration.verify_context_lens(lens, prefix, 3, "causal")
    values = cupy.asarray(rng.standard_normal((4, 3000)).astype(np.float32))
    lengths = cupy.asarray(np.array([3000, 10, 2999, 2048], dtype=np.int32))
    np.testing.assert_array_equal(dsa.topk(values, lengths, 64, sorted=True).get(),
                                  ref.topk(values.get(), lengths.get(), 64))


# ---------------------------------------------------------------------------
# Prefill: mqa_logits over a contiguous key run


def prefill_problem(rng, rows=300, keys=2500, heads=64):
    """fp8 q [rows, H, D], keys [keys, D] on the device; ranges some empty, not monotone."""
    ks = rng.integers(0, keys + 1, size=rows)
    ke = np.minimum(keys, ks + rng.integers(0, 1500, size=rows))
    ks[0], ke[0] = 0, keys
    ks[1] = ke[1] = 17
    return dict(
        q=cuda(ref.e4m3_encode(rng.standard_normal((rows, heads, D)).astype(np.float32)))
        .view(FP8),
        keys=cuda(ref.e4m3_encode(rng.standard_normal((keys, D)).astype(np.float32) * 3))
        .view(FP8),
        scales=cuda(rng.uniform(0.01, 2.0, size=keys).astype(np.float32)),
        weights=cuda(rng.standard_normal((rows, heads)).astype(np.float32)),
        ks=cuda(ks.astype(np.int32)), ke=cuda(ke.astype(np.int32)),
        width=int((ke - ks).max()))


def prefill_args(p):
    return p["q"], p["keys"], p["scales"], p["weights"], p["ks"], p["ke"]


def torch_mqa_logits(p, compressed=False):
    """(float64 logits, magnitude): -inf where a row does not score."""
    q, k = p["q"].double(), p["keys"].double()
    dots = torch.einsum("shd,kd->shk", q, k) * p["scales"].double()
    w = p["weights"].double()
    logits = torch.einsum("sh,shk->sk", w, dots.clamp_min(0))
    magnitude = torch.einsum("sh,shk->sk", w.abs(), dots.abs())
    columns = torch.arange(k.shape[0], device=DEVICE)
    inside = (columns >= p["ks"][:, None].long()) & (columns < p["ke"][:, None].long())
    logits = logits.masked_fill(~inside, -float("inf"))
    if compressed:
        keys = p["ks"][:, None].long() + torch.arange(p["width"], device=DEVICE)
        valid = keys < p["ke"][:, None].long()  # before the clamp that keeps the gather in bounds
        index = keys.clamp_max(k.shape[0] - 1)
        logits = torch.gather(logits, 1, index).masked_fill(~valid, -float("inf"))
        magnitude = torch.gather(magnitude, 1, index)
    return logits, magnitude


@pytest.mark.parametrize("heads", [1, 32, 64])
@pytest.mark.parametrize("compressed", [False, True])
def test_mqa_logits(rng, heads, compressed):
    p = prefill_problem(rng, heads=heads)
    expected, magnitude = torch_mqa_logits(p, compressed)
    width = p["width"] if compressed else 0
    for backend in ("auto", "cuda_generic"):
        out = dsa.mqa_logits(*prefill_args(p), clean_logits=True, compressed=compressed,
                             max_seqlen_k=width, backend=backend, check_device_errors=True)
        assert out.shape == expected.shape and out.dtype == torch.float32
        assert_logits_close(out, expected, magnitude)
        assert torch.equal(torch.isneginf(out), torch.isneginf(expected))
        bf16 = dsa.mqa_logits(*prefill_args(p), clean_logits=True, compressed=compressed,
                              max_seqlen_k=width, out_dtype="bfloat16", backend=backend)
        assert bf16.dtype == torch.bfloat16
        assert_logits_close(bf16.float(), expected, magnitude, rtol=2**-7)
        again = dsa.mqa_logits(*prefill_args(p), clean_logits=True, compressed=compressed,
                               max_seqlen_k=width, backend=backend)
        assert torch.equal(again, out)  # bitwise identical run to run


def test_mqa_logits_feed_the_ragged_topk(rng):
    p = prefill_problem(rng, heads=64)
    expected, _ = torch_mqa_logits(p)
    logits = dsa.mqa_logits(*prefill_args(p))
    lengths = p["ke"] - p["ks"]
    selected = dsa.topk(logits, lengths, 256, row_starts=p["ks"], position_offsets=p["ks"])
    via_sgl = sgl_kernel.fast_topk_transform_ragged_fused(logits, lengths, p["ks"], 256,
                                                          p["ks"])
    assert torch.equal(selected.sort(dim=1).values, via_sgl.sort(dim=1).values)
    for r in range(lengths.shape[0]):
        got = selected[r][selected[r] >= 0].long()
        count = min(int(lengths[r]), 256)
        assert got.numel() == count
        best = expected[r].topk(count).values if count else expected[r][:0]
        scale = float(best.abs().max()) if count else 0.0
        torch.testing.assert_close(expected[r][got].sort().values, best.sort().values,
                                   rtol=2e-3, atol=1e-3 * scale + 1e-6)


def test_deep_gemm_mqa_logits(rng):
    p = prefill_problem(rng, heads=64)
    kv = (p["keys"], p["scales"])
    args = (p["weights"], p["ks"], p["ke"])
    full = deep_gemm.fp8_mqa_logits(p["q"], kv, *args)
    assert torch.equal(full, dsa.mqa_logits(*prefill_args(p), clean_logits=True))
    compressed = deep_gemm.fp8_fp4_mqa_logits((p["q"], None), kv, *args,
                                              max_seqlen_k=p["width"])
    assert torch.equal(compressed, dsa.mqa_logits(*prefill_args(p), clean_logits=True,
                                                  compressed=True, max_seqlen_k=p["width"]))
    with pytest.raises(TypeError, match="fp8_fp4_mqa_logits: q: must hold packed e2m1 codes"):
        deep_gemm.fp8_fp4_mqa_logits((p["q"], torch.ones(3, device=DEVICE)), kv, *args)


def test_mqa_logits_under_torch_compile(rng):
    p = prefill_problem(rng, rows=64, keys=600, heads=64)
    run = torch.compile(lambda p: dsa.mqa_logits(*prefill_args(p), clean_logits=True,
                                                 compressed=True, max_seqlen_k=p["width"]),
                        fullgraph=True)
    assert torch.equal(run(p), dsa.mqa_logits(*prefill_args(p), clean_logits=True,
                                               compressed=True, max_seqlen_k=p["width"]))


# ---------------------------------------------------------------------------
# The fp4 format (NumPy references of reference.py)


@pytest.mark.parametrize("page", [64, 32])
def test_fp4_store_quantize_and_logits(rng, page):
    batch, next_n, heads = 3, 2, 16
    prefix = rng.integers(0, 400, size=batch).astype(np.int32)
    lens = (prefix[:, None] + np.arange(next_n)[None, :] + 1).astype(np.int32)
    pages = int((-(-lens.max(axis=1) // page)).sum()) + 2
    keys = rng.standard_normal((pages * page, D)).astype(np.float32)
    cache = torch.zeros((pages, page, 1, ref.FP4_TOKEN_BYTES), dtype=torch.uint8, device=DEVICE)
    dsa.store_index_keys(cuda(keys), cuda(np.arange(pages * page, dtype=np.int64)), cache)
    expected_cache = ref.fp4_cache(keys, page)
    np.testing.assert_array_equal(cache.cpu().numpy().reshape(pages, -1), expected_cache)

    q = rng.standard_normal((batch, next_n, heads, D)).astype(np.float32)
    gate = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    codes, scales, weights = dsa.quantize_queries_fp4(cuda(q), cuda(gate), weight_scale=0.5)
    want_codes, want_scales = ref.fp4_quantize(q)
    np.testing.assert_array_equal(codes.cpu().numpy(), want_codes)
    np.testing.assert_array_equal(scales.cpu().numpy(), want_scales)

    table = ref.random_block_table(rng, lens, pages, page=page)
    max_len = int(lens.max()) + 3
    logits = dsa.paged_mqa_logits(codes, cache, weights, cuda(lens), cuda(table), max_len,
                                  clean_logits=True, q_block_scales=scales)
    expected = ref.logits_of_values(ref.fp4_decode(want_codes, want_scales),
                                    ref.fp4_cache_keys(expected_cache, page),
                                    weights.cpu().numpy(), lens, table, max_len, page)
    ref.assert_logits_close(logits.cpu().numpy(), expected)
    indices = dsa.index_topk(codes, cache, weights, cuda(lens), cuda(table), max_len, 50,
                             sorted=True, q_block_scales=scales)
    torch.testing.assert_close(indices, dsa.topk(logits, cuda(lens.reshape(-1)), 50, sorted=True))
