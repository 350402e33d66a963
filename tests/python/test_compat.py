"""dsa_indexer.compat.deep_gemm, .sgl_kernel and .vllm on the CPU backend with
NumPy arrays (and CPU PyTorch tensors where NumPy lacks a type: bfloat16 logits), against
the NumPy references."""

import numpy as np
import pytest

import dsa_indexer as dsa
import reference as ref
from dsa_indexer.compat import deep_gemm, sgl_kernel, vllm

D = 32


@pytest.fixture
def rng():
    return np.random.default_rng(4321)


def assert_logits_close(actual, expected):
    """Close to the reference where it is finite, -inf where it is (clean_logits)."""
    ref.assert_logits_close(actual, expected)
    np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(expected))


def kv_cache(p):
    """DeepGEMM's view [num_blocks, block_kv, 1, D + 4] of the problem's cache."""
    return p["cache"].reshape(-1, p["page"], 1, D + 4)


def deep_gemm_args(p, lens, schedule):
    return (kv_cache(p), p["weights"], lens, p["table"], schedule, p["max_len"])


# ---------------------------------------------------------------------------
# DeepGEMM


def test_get_num_sms():
    num_sms = deep_gemm.get_num_sms()
    assert isinstance(num_sms, int) and num_sms >= 1
    if not dsa.cuda_device_count():
        assert num_sms == dsa.default_num_workers(np.zeros(1))


@pytest.fixture
def deep_gemm_settings():
    """Restores DeepGEMM's process-wide settings after a test that changes them."""
    num_sms, pdl = deep_gemm.get_num_sms(), deep_gemm.get_pdl()
    yield
    deep_gemm.set_num_sms(num_sms)
    deep_gemm.set_pdl(pdl)


def test_set_num_sms_and_pdl(rng, deep_gemm_settings):
    device_sms = deep_gemm.get_num_sms()
    assert deep_gemm.get_pdl() is False
    deep_gemm.set_num_sms(1)
    assert deep_gemm.get_num_sms() == 1
    for bad in (0, device_sms + 1, 2.0, True):
        with pytest.raises(ValueError, match=r"set_num_sms: num_sms: must be an integer in \[1, "):
            deep_gemm.set_num_sms(bad)
    with pytest.raises(TypeError, match="set_pdl: enable: must be a bool"):
        deep_gemm.set_pdl(1)
    # Programmatic dependent launch changes no result.
    p = ref.scoring_problem(rng, head_dim=D, batch=3, next_n=2, heads=32)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, 2)
    args = deep_gemm_args(p, p["lens"], schedule)
    plain = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True)
    deep_gemm.set_pdl(True)
    assert deep_gemm.get_pdl() is True
    np.testing.assert_array_equal(deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, 2), schedule)
    np.testing.assert_array_equal(
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True), plain)


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("next_n", range(1, 9))
def test_fp8_fp4_paged_mqa_logits_matches_reference(rng, page, heads, next_n):
    p = ref.scoring_problem(rng, head_dim=D, batch=2, next_n=next_n, heads=heads, page=page)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], page, deep_gemm.get_num_sms())
    assert schedule.dtype == np.int32 and schedule.shape == (deep_gemm.get_num_sms() + 1, 2)
    args = deep_gemm_args(p, p["lens"], schedule)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True)
    assert logits.dtype == np.float32 and logits.shape == (2 * next_n, p["max_len"])
    assert_logits_close(logits, ref.problem_logits(p))
    # The legacy name, the dtype given by name, the native API: bitwise the same.
    np.testing.assert_array_equal(deep_gemm.fp8_paged_mqa_logits(p["q"], *args, True), logits)
    np.testing.assert_array_equal(
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, True, logits_dtype="float32"),
        logits)
    np.testing.assert_array_equal(
        dsa.paged_mqa_logits(p["q"], p["cache"], p["weights"], p["lens"], p["table"],
                             p["max_len"], clean_logits=True, page_size=page), logits)


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("next_n", [1, 3, 8])
def test_deep_gemm_legacy_lengths(rng, page, next_n):
    p = ref.scoring_problem(rng, head_dim=D, next_n=next_n, page=page)
    legacy = (p["prefix"] + next_n).astype(np.int32)  # total length including the drafts
    schedule = deep_gemm.get_paged_mqa_logits_metadata(legacy, page, 4)
    args = deep_gemm_args(p, legacy, schedule)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, clean_logits=True)
    assert_logits_close(logits, ref.problem_logits(p))  # legacy lengths are the causal ones
    np.testing.assert_array_equal(deep_gemm.fp8_paged_mqa_logits(p["q"], *args, True), logits)


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("legacy", [False, True])
def test_deep_gemm_schedules_for_fewer_workers(rng, page, legacy):
    """Engines plan for part of the device (num_sms // 2): any worker count gives the same
    logits."""
    p = ref.scoring_problem(rng, head_dim=D, batch=5, next_n=2, page=page, max_prefix=1500)
    lens = (p["prefix"] + 2).astype(np.int32) if legacy else p["lens"]
    results = []
    for workers in (1, 2, 3, max(deep_gemm.get_num_sms() // 2, 1), 40):
        schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, page, workers)
        assert schedule.shape == (workers + 1, 2)
        results.append(deep_gemm.fp8_fp4_paged_mqa_logits(
            (p["q"], None), *deep_gemm_args(p, lens, schedule), clean_logits=True))
    assert_logits_close(results[0], ref.problem_logits(p))
    for result in results[1:]:
        np.testing.assert_array_equal(result, results[0])


def varlen_args(p, schedule, indices=None):
    """DeepGEMM's arguments with indices: block_table has a row a query row (the rows of a
    request repeat its blocks)."""
    row_table = p["table"][p["indices"] if indices is None else indices]
    return (kv_cache(p), p["weights"], p["lens"], row_table, schedule, p["max_len"])


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("heads", [4, 32])
@pytest.mark.parametrize("logits_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rows", [[1, 3, 2, 4], [8, 0, 5, 0, 1], [0, 120, 1]])
def test_deep_gemm_indices(rng, page, heads, logits_dtype, rows):
    """indices [T] (the request of each row, sorted) with q [T, 1, H, D], per-row lengths
    [T] and a block-table row a query row: the reference logits (bfloat16 ones within a
    bfloat16 step, as CPU PyTorch tensors: NumPy has no bfloat16), and the metadata is the
    schedule planned with the request offsets."""
    p = ref.varlen_problem(rng, rows, heads=heads, head_dim=D, page=page, causal=False,
                           max_prefix=700)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], page, 5, indices=p["indices"])
    np.testing.assert_array_equal(
        schedule, dsa.plan_schedule(p["lens"], 5, request_offsets=p["offsets"]))
    q, args, indices = p["q"], varlen_args(p, schedule), p["indices"]
    expected = ref.varlen_logits(p)
    if logits_dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        q = torch.from_numpy(q).view(torch.float8_e4m3fn)
        args = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args)
        indices = torch.from_numpy(indices)
    logits = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), *args, clean_logits=True,
                                                indices=indices, logits_dtype=logits_dtype)
    assert logits.shape == (sum(rows), p["max_len"])
    if logits_dtype == "bfloat16":
        assert logits.dtype == torch.bfloat16
        # One rounding of the float32 result, or of the exact one: within a bf16 step.
        want = torch.from_numpy(expected).to(torch.bfloat16).float()
        torch.testing.assert_close(logits.float(), want, rtol=2**-7, atol=1e-3)
        np.testing.assert_array_equal(torch.isneginf(logits).numpy(), np.isneginf(expected))
    else:
        assert logits.dtype == np.float32
        assert_logits_close(logits, expected)


def test_deep_gemm_indices_runs_of_any_values(rng):
    """Only where runs of equal indices start and end matters: ids out of order, beyond the
    requests or negative give the same logits and schedule as 0, 1, 2, ..."""
    p = ref.varlen_problem(rng, [2, 3, 1, 4], head_dim=D, causal=False)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, 4, indices=p["indices"])
    want = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *varlen_args(p, schedule),
                                              clean_logits=True, indices=p["indices"])
    other = np.repeat(np.array([7, -1, 3, 9], dtype=np.int32), [2, 3, 1, 4])
    np.testing.assert_array_equal(
        deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, 4, indices=other), schedule)
    got = deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *varlen_args(p, schedule),
                                             clean_logits=True, indices=other)
    np.testing.assert_array_equal(got, want)
    assert_logits_close(want, ref.varlen_logits(p))


def test_deep_gemm_indices_errors(rng):
    p = ref.varlen_problem(rng, [2, 3, 1], head_dim=D, causal=False)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 64, 4, indices=p["indices"])
    kv, weights, lens, _, _, max_len = varlen_args(p, schedule)
    # A block-table row a request (not a query row) is not DeepGEMM's layout.
    with pytest.raises(ValueError, match=r"fp8_fp4_paged_mqa_logits: block_table: with indices, "
                                         r"expected int32 \[T, max_blocks\] with T = 6"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), kv, weights, lens, p["table"],
                                           schedule, max_len, indices=p["indices"])


def test_deep_gemm_indices_with_torch(rng):
    torch = pytest.importorskip("torch")
    p = ref.varlen_problem(rng, [3, 0, 9, 2], head_dim=D, causal=False)
    t = {key: torch.from_numpy(value) for key, value in p.items() if isinstance(value, np.ndarray)}
    indices = t["indices"]
    schedule = deep_gemm.get_paged_mqa_logits_metadata(t["lens"], 64, 3, indices=indices)
    np.testing.assert_array_equal(
        schedule.numpy(), dsa.plan_schedule(p["lens"], 3, request_offsets=p["offsets"]))
    logits = deep_gemm.fp8_fp4_paged_mqa_logits(
        (t["q"].view(torch.float8_e4m3fn), None), t["cache"].reshape(-1, 64, 1, D + 4),
        t["weights"], t["lens"], t["table"][indices.long()], schedule, p["max_len"],
        clean_logits=True, indices=indices)
    assert_logits_close(logits.numpy(), ref.varlen_logits(p))


def test_deep_gemm_refusals_name_the_argument(rng):
    p = ref.scoring_problem(rng, head_dim=D, next_n=2, page=32)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 32, 4)
    args = deep_gemm_args(p, p["lens"], schedule)
    q_sf = np.ones(p["q"].shape[:-1], dtype=np.int32)
    # FP4 codes (q_fp4, q_sf) are [B, next_n, H, 64]: D = 32 fp8 codes are not that.
    with pytest.raises(ValueError, match=r"paged_mqa_logits: q: fp4 queries .* dimension 3"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], q_sf), *args)
    with pytest.raises(TypeError, match=r"fp8_fp4_paged_mqa_logits: q: expected the pair"):
        deep_gemm.fp8_fp4_paged_mqa_logits(p["q"], *args)
    rows = np.arange(len(p["lens"]), dtype=np.int32)
    with pytest.raises(ValueError, match=r"fp8_fp4_paged_mqa_logits: q: with indices, expected "
                                         r"\[T, 1, H, D\]"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, indices=rows)
    with pytest.raises(ValueError, match="get_paged_mqa_logits_metadata: indices: expected"):
        deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 32, 4, indices=rows[:, None])
    for block_kv in (16, 128, 0):
        with pytest.raises(ValueError,
                           match=r"get_paged_mqa_logits_metadata: block_kv: must be one of "
                                 rf"\(32, 64\) .* got {block_kv}"):
            deep_gemm.get_paged_mqa_logits_metadata(p["lens"], block_kv, 4)
    for dtype in ("float16", np.float32, "bf16"):
        with pytest.raises(ValueError, match="fp8_fp4_paged_mqa_logits: logits_dtype: must be"):
            deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, logits_dtype=dtype)
    with pytest.raises(ValueError, match="fp8_paged_mqa_logits: logits_dtype"):
        deep_gemm.fp8_paged_mqa_logits(p["q"], *args, logits_dtype="float64")
    with pytest.raises(TypeError, match="numpy has no bfloat16"):
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *args, logits_dtype="bfloat16")

    def call(position, value):
        changed = list(args)
        changed[position] = value
        deep_gemm.fp8_fp4_paged_mqa_logits((p["q"], None), *changed)

    # Mismatched shapes: the library names dsa_indexer.paged_mqa_logits's arguments.
    with pytest.raises(ValueError, match="paged_mqa_logits: key_cache"):
        call(0, p["cache"].reshape(-1, 32, 1, D + 4)[:, :, :, :-1])
    with pytest.raises(ValueError, match="paged_mqa_logits: key_cache"):
        call(0, p["cache"].reshape(-1, 16, 1, D + 4))  # 16-token blocks
    with pytest.raises(ValueError, match="paged_mqa_logits: weights"):
        call(1, p["weights"][1:])
    with pytest.raises(ValueError, match="paged_mqa_logits: context_lens"):
        call(2, p["lens"][1:])
    with pytest.raises(ValueError, match="paged_mqa_logits: block_table"):
        call(3, p["table"][1:])
    with pytest.raises(ValueError, match="paged_mqa_logits: schedule"):
        call(4, deep_gemm.get_paged_mqa_logits_metadata(p["lens"][1:], 32, 4))
    with pytest.raises(ValueError, match="paged_mqa_logits: block_table"):
        call(3, p["table"][:, :1])  # fewer blocks than the lengths need


# ---------------------------------------------------------------------------
# sgl-kernel


def selection_rows(rng, rows=7, width=3000, k=2048):
    """(score [rows, width], lengths, row_starts) with ties, NaN, empty rows and rows no
    longer than k."""
    score = rng.standard_normal((rows, width)).astype(np.float32)
    score[1, :1000] = 0.5  # many ties
    score[2, 7] = np.nan
    starts = rng.integers(0, width // 4, size=rows).astype(np.int32)
    lengths = rng.integers(min(k + 1, width // 2), width - width // 4, size=rows).astype(np.int32)
    lengths[3] = 0
    lengths[4] = k
    lengths[5] = k // 2
    return score, lengths, starts


def assert_same_selection(actual, expected):
    """Same set per row; sgl-kernel's order within a row is unspecified."""
    np.testing.assert_array_equal(np.sort(actual, axis=1), np.sort(expected, axis=1))


@pytest.mark.parametrize("k", [2048, 100, 1])
@pytest.mark.parametrize("starts", [False, True])
def test_fast_topk_v2(rng, k, starts):
    score, lengths, row_starts = selection_rows(rng, k=k)
    row_starts = row_starts if starts else None
    result = sgl_kernel.fast_topk_v2(score, lengths, k, row_starts)
    assert result.dtype == np.int32 and result.shape == (len(lengths), k)
    expected = ref.topk(score, lengths, k, row_starts)
    assert_same_selection(result, expected)
    short = lengths <= k  # 0 .. len - 1 in order, then -1
    np.testing.assert_array_equal(result[short], expected[short])
    np.testing.assert_array_equal(sgl_kernel.fast_topk_v2(score, lengths, k, row_starts), result)


@pytest.mark.parametrize("k", [2048, 64])
@pytest.mark.parametrize("starts", [False, True])
def test_fast_topk_transform_fused_decode(rng, k, starts):
    """R == B: row r is request r (with row_starts, through cu_seqlens_q)."""
    score, lengths, row_starts = selection_rows(rng, k=k)
    rows = len(lengths)
    row_starts = row_starts if starts else None
    page_table = rng.integers(0, 10**6, size=(rows, score.shape[1])).astype(np.int32)
    cu_seqlens_q = np.arange(rows + 1, dtype=np.int32)
    result = sgl_kernel.fast_topk_transform_fused(score, lengths, page_table, cu_seqlens_q, k,
                                                  row_starts)
    positions = ref.topk(score, lengths, k, row_starts)
    expected = ref.slots(positions, page_table, np.arange(rows), 1)
    assert_same_selection(result, expected)
    short = lengths <= k
    np.testing.assert_array_equal(result[short], expected[short])
    if not starts:  # the decode kernel does not read cu_seqlens_q
        np.testing.assert_array_equal(
            sgl_kernel.fast_topk_transform_fused(score, lengths, page_table,
                                                 np.zeros(rows + 1, dtype=np.int32), k), result)


@pytest.mark.parametrize("cu_seqlens_q", [[0, 3, 3, 4, 7], [0, 2, 4, 6, 7], [0, 7]])
@pytest.mark.parametrize("starts", [False, True])
def test_fast_topk_transform_fused_requests(rng, cu_seqlens_q, starts):
    """Extend / target verify: the rows of request q are cu_seqlens_q[q] .. [q + 1] - 1."""
    k = 256
    score, lengths, row_starts = selection_rows(rng, k=k)
    row_starts = row_starts if starts else None
    offsets = np.array(cu_seqlens_q, dtype=np.int32)
    page_table = rng.integers(0, 10**6, size=(len(offsets) - 1, score.shape[1])).astype(np.int32)
    result = sgl_kernel.fast_topk_transform_fused(score, lengths, page_table, offsets, k,
                                                  row_starts)
    positions = ref.topk(score, lengths, k, row_starts)
    requests = ref.request_of_rows(len(lengths), request_offsets=offsets)
    assert_same_selection(result, ref.slots(positions, page_table, requests, 1))


@pytest.mark.parametrize("starts", [False, True])
def test_fast_topk_transform_ragged_fused(rng, starts):
    k = 2048
    score, lengths, row_starts = selection_rows(rng, k=k)
    row_starts = row_starts if starts else None
    offsets = np.cumsum(rng.integers(0, 5000, size=len(lengths))).astype(np.int32)
    result = sgl_kernel.fast_topk_transform_ragged_fused(score, lengths, offsets, k, row_starts)
    positions = ref.topk(score, lengths, k, row_starts)
    expected = np.where(positions >= 0, positions + offsets[:, None], -1)
    assert_same_selection(result, expected)
    short = lengths <= k
    np.testing.assert_array_equal(result[short], expected[short])


def test_sgl_kernel_refusals_name_the_argument(rng):
    score, lengths, starts = selection_rows(rng, rows=6, width=300, k=16)
    table = np.zeros((6, 300), dtype=np.int32)
    cu = np.arange(7, dtype=np.int32)
    with pytest.raises(ValueError, match=r"fast_topk_v2: score: expected \[B, N\]"):
        sgl_kernel.fast_topk_v2(score[0], lengths, 16)
    with pytest.raises(ValueError, match="fast_topk_v2: lengths: has 5 entries but score has 6"):
        sgl_kernel.fast_topk_v2(score, lengths[1:], 16)
    with pytest.raises(ValueError, match=r"fast_topk_v2: row_starts: expected \[B\]"):
        sgl_kernel.fast_topk_v2(score, lengths, 16, starts[:, None])
    with pytest.raises(TypeError, match="fast_topk_v2: lengths: expected an array"):
        sgl_kernel.fast_topk_v2(score, list(lengths), 16)
    for topk in (0, 2049):
        with pytest.raises(ValueError, match=f"fast_topk_v2: topk: must be in 1 .. 2048, got "
                                             f"{topk}"):
            sgl_kernel.fast_topk_v2(score, lengths, topk)
    with pytest.raises(ValueError, match="fast_topk_transform_fused: cu_seqlens_q: has 6 entries "
                                         "but page_table_size_1 has 6 rows"):
        sgl_kernel.fast_topk_transform_fused(score, lengths, table, cu[:-1], 16)
    with pytest.raises(ValueError, match=r"fast_topk_transform_fused: page_table_size_1: "
                                         r"expected \[R, max_len\]"):
        sgl_kernel.fast_topk_transform_fused(score, lengths, table[0], cu, 16)
    with pytest.raises(ValueError, match="fast_topk_transform_fused: row_starts: has 2 entries"):
        sgl_kernel.fast_topk_transform_fused(score, lengths, table, cu, 16, starts[:2])
    with pytest.raises(ValueError, match="fast_topk_transform_ragged_fused: topk_indices_offset: "
                                         "has 3 entries but score has 6 rows"):
        sgl_kernel.fast_topk_transform_ragged_fused(score, lengths, cu[:3], 16)
    # Rules on the data, found by the library, name dsa_indexer.topk's arguments.
    with pytest.raises(ValueError, match="topk: lengths"):
        sgl_kernel.fast_topk_v2(score, lengths + 300, 16)
    with pytest.raises(ValueError, match="topk: row_starts"):
        sgl_kernel.fast_topk_v2(score, lengths, 16, starts + 300)
    with pytest.raises(ValueError, match="topk: request_offsets"):  # cu_seqlens_q
        sgl_kernel.fast_topk_transform_fused(score, lengths, table[:2], np.array(
            [0, 1, 3], dtype=np.int32), 16)  # covers 3 of the 6 rows
    with pytest.raises(ValueError, match="topk: block_table"):  # page_table_size_1
        sgl_kernel.fast_topk_transform_fused(score, lengths, table[:, :10], cu, 16)
    with pytest.raises(ValueError, match="topk: position_offsets"):  # topk_indices_offset
        sgl_kernel.fast_topk_transform_ragged_fused(score, lengths, cu[:6].astype(np.int64), 16)


# ---------------------------------------------------------------------------
# PyTorch tensors on the CPU: bfloat16 logits, DeepGEMM's torch dtypes


@pytest.mark.parametrize("page", [32, 64])
@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("next_n", [1, 4])
def test_deep_gemm_logits_dtypes_with_torch(rng, page, heads, next_n):
    torch = pytest.importorskip("torch")
    p = ref.scoring_problem(rng, head_dim=D, next_n=next_n, heads=heads, page=page)
    q = torch.from_numpy(p["q"]).view(torch.float8_e4m3fn)
    lens = torch.from_numpy(p["lens"])
    half = max(deep_gemm.get_num_sms() // 2, 1)  # as engines plan
    schedule = deep_gemm.get_paged_mqa_logits_metadata(lens, page, half)
    args = tuple(torch.from_numpy(a) if isinstance(a, np.ndarray) else a
                 for a in deep_gemm_args(p, p["lens"], schedule.numpy()))
    fp32 = deep_gemm.fp8_fp4_paged_mqa_logits((q, None), *args, clean_logits=True)
    assert fp32.dtype == torch.float32
    assert_logits_close(fp32.numpy(), ref.problem_logits(p))
    expected = torch.from_numpy(ref.problem_logits(p)).to(torch.bfloat16)
    for dtype in (torch.bfloat16, "bfloat16"):
        for function, query in ((deep_gemm.fp8_fp4_paged_mqa_logits, (q, None)),
                                (deep_gemm.fp8_paged_mqa_logits, q)):
            bf16 = function(query, *args, clean_logits=True, logits_dtype=dtype)
            assert bf16.dtype == torch.bfloat16 and bf16.shape == fp32.shape
            # One rounding of the float32 result, or of the exact one: within a bf16 step.
            torch.testing.assert_close(bf16.float(), expected.float(), rtol=2**-7, atol=1e-3)
            assert torch.equal(torch.isneginf(bf16), torch.isneginf(fp32))


def test_sgl_kernel_with_torch(rng):
    torch = pytest.importorskip("torch")
    score, lengths, starts = selection_rows(rng, k=2048)
    table = rng.integers(0, 10**6, size=(3, score.shape[1])).astype(np.int32)
    cu = np.array([0, 2, 2, 7], dtype=np.int32)
    t = torch.from_numpy
    for numpy_call, torch_call in (
            (lambda: sgl_kernel.fast_topk_v2(score, lengths, 2048, starts),
             lambda: sgl_kernel.fast_topk_v2(t(score), t(lengths), 2048, t(starts))),
            (lambda: sgl_kernel.fast_topk_transform_fused(score, lengths, table, cu, 2048, starts),
             lambda: sgl_kernel.fast_topk_transform_fused(t(score), t(lengths), t(table), t(cu),
                                                          2048, t(starts))),
            (lambda: sgl_kernel.fast_topk_transform_ragged_fused(score, lengths, starts, 2048),
             lambda: sgl_kernel.fast_topk_transform_ragged_fused(t(score), t(lengths), t(starts),
                                                                 2048))):
        result = torch_call()
        assert isinstance(result, torch.Tensor) and result.dtype == torch.int32
        np.testing.assert_array_equal(result.numpy(), numpy_call())


# ---------------------------------------------------------------------------
# vLLM


def assert_in_place_selection(indices, k, expected, lengths, rows):
    """indices[:rows, :k] selects as `expected` (sets; rows of at most k candidates exactly);
    the other columns and rows hold their poison."""
    assert_same_selection(indices[:rows, :k], expected)
    short = lengths <= k
    np.testing.assert_array_equal(indices[:rows, :k][short], expected[short])
    assert (indices[:rows, k:] == -7).all() and (indices[rows:] == -7).all()


@pytest.mark.parametrize("k", [2048, 100])
@pytest.mark.parametrize("given_k", [True, False])
def test_top_k_per_row_prefill(rng, k, given_k):
    score, lengths, starts = selection_rows(rng, k=k)
    rows = len(lengths) - 1  # the last row is not asked for
    ends = starts + lengths
    indices = np.full((len(lengths), k + (3 if given_k else 0)), -7, dtype=np.int32)
    result = vllm.top_k_per_row_prefill(score, starts, ends, indices, rows, score.shape[1], 1,
                                        k if given_k else None)
    assert result is indices
    expected = ref.topk(score[:rows], lengths[:rows], k, starts[:rows])
    assert_in_place_selection(indices, k, expected, lengths[:rows], rows)
    again = np.full_like(indices, -7)
    vllm.top_k_per_row_prefill(score, starts, ends, again, rows, score.shape[1], 1, k if given_k else None)
    np.testing.assert_array_equal(again, indices)


@pytest.mark.parametrize("next_n", [1, 3])
@pytest.mark.parametrize("two_d", [False, True])
def test_top_k_per_row_decode(rng, next_n, two_d):
    requests, width, k = 4, 3000, 512
    seq_lens = rng.integers(0, width, size=requests).astype(np.int32)
    seq_lens[1] = 1  # fewer keys than rows: the first rows see none
    rows = requests * next_n
    row_lengths = np.maximum(0, seq_lens[:, None] - next_n + np.arange(next_n) + 1)
    score = rng.standard_normal((rows, width)).astype(np.float32)
    score[0, :600] = 1.0  # ties
    indices = np.full((rows + 2, k), -7, dtype=np.int32)
    lens = row_lengths.astype(np.int32) if two_d else seq_lens
    vllm.top_k_per_row_decode(score, next_n, lens, indices, rows, width, 1, k)
    lengths = row_lengths.reshape(-1)
    assert_in_place_selection(indices, k, ref.topk(score, lengths, k), lengths, rows)


def test_persistent_topk(rng):
    score, lengths, _ = selection_rows(rng, rows=6, k=256)
    output = np.full((6, 256), -7, dtype=np.int32)
    result = vllm.persistent_topk(score, lengths.reshape(3, 2), output, None, 256, score.shape[1])
    assert result is output
    assert_in_place_selection(output, 256, ref.topk(score, lengths, 256), lengths, 6)


@pytest.mark.parametrize("scale_fmt", ["ue8m0", None])
@pytest.mark.parametrize("block_size", [64, 32])
def test_indexer_k_quant_and_cache(rng, scale_fmt, block_size):
    blocks, tokens, width = 6, 150, D + 4
    # Blocks 16 bytes further apart than their tokens need, as a layer's slice of a larger
    # allocation can be.
    storage = rng.integers(0, 256, size=(blocks, block_size * width + 16), dtype=np.uint8)
    kv_cache = storage[:, : block_size * width].reshape(blocks, block_size, width)
    keys = rng.standard_normal((tokens, D)).astype(np.float32)
    slots = rng.permutation(blocks * block_size)[:tokens].astype(np.int64)
    slots[5] = -1  # padding: skipped
    before = storage.copy()
    assert vllm.indexer_k_quant_and_cache(keys, kv_cache, slots, D, scale_fmt) is kv_cache
    codes, scales = ref.quantize_rows(keys, scale_fmt == "ue8m0")
    expected = before.copy()
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        page, row = divmod(int(slot), block_size)
        expected[page, row * D: (row + 1) * D] = codes[t]
        at = block_size * D + 4 * row
        expected[page, at: at + 4] = scales[t: t + 1].view(np.uint8)
    np.testing.assert_array_equal(storage, expected)


def test_vllm_refusals_name_the_argument(rng):
    score, lengths, starts = selection_rows(rng, k=64)
    ends = starts + lengths
    indices = np.zeros((len(lengths), 64), dtype=np.int32)
    prefill = vllm.top_k_per_row_prefill
    with pytest.raises(ValueError, match="stride0, stride1"):
        prefill(score, starts, ends, indices, 3, score.shape[1] + 1, 1)
    with pytest.raises(ValueError, match="stride1: the logits' columns must be contiguous"):
        strided = score[:, ::2]
        prefill(strided, starts, ends, indices, 3, *(s // 4 for s in strided.strides))
    with pytest.raises(ValueError, match="num_rows"):
        prefill(score, starts, ends, indices, len(lengths) + 1, score.shape[1], 1)
    with pytest.raises(ValueError, match="top_k"):
        prefill(score, starts, ends, indices, 3, score.shape[1], 1, 65)
    with pytest.raises(ValueError, match="row_ends: has 2 entries"):
        prefill(score, starts, ends[:2], indices, 3, score.shape[1], 1)
    with pytest.raises(ValueError, match="indices: expected"):
        prefill(score, starts, ends, indices[0], 3, score.shape[1], 1)
    with pytest.raises(ValueError, match="next_n"):
        vllm.top_k_per_row_decode(score, 0, lengths, indices, 3, score.shape[1], 1)
    with pytest.raises(ValueError, match="seq_lens"):
        vllm.top_k_per_row_decode(score, 2, lengths.reshape(-1, 1), indices, 3, score.shape[1], 1)
    with pytest.raises(ValueError, match="lengths: expected"):
        vllm.persistent_topk(score, lengths[:2], indices, None, 64, 0)
    with pytest.raises(ValueError, match="topk: lengths"):  # a range past the logits' columns
        prefill(score, starts, ends + score.shape[1], indices, 3, score.shape[1], 1)
    keys = np.zeros((4, D), dtype=np.float32)
    cache = np.zeros((2, 64, D + 4), dtype=np.uint8)
    slots = np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="quant_block_size"):
        vllm.indexer_k_quant_and_cache(keys, cache, slots, 64, "ue8m0")
    with pytest.raises(ValueError, match="scale_fmt"):
        vllm.indexer_k_quant_and_cache(keys, cache, slots, D, "e4m3")
    with pytest.raises(ValueError, match="kv_cache: the last dimension"):
        vllm.indexer_k_quant_and_cache(keys, cache[..., :-1], slots, D, None)
    with pytest.raises(ValueError, match="slot_mapping: has 3 entries"):
        vllm.indexer_k_quant_and_cache(keys, cache, slots[:3], D, None)


def test_vllm_with_torch(rng):
    torch = pytest.importorskip("torch")
    score, lengths, starts = selection_rows(rng, k=2048)
    ends = starts + lengths
    t = torch.from_numpy
    rows = len(lengths)
    # vLLM hands in a slice of a wider, persistent buffer.
    buffer = torch.full((rows + 4, 2048 + 8), -7, dtype=torch.int32)
    view = buffer[:rows, :2048]
    logits = t(score)
    result = vllm.top_k_per_row_prefill(logits, t(starts), t(ends), view, rows, logits.stride(0),
                                        logits.stride(1), 2048)
    assert result is view
    expected = ref.topk(score, lengths, 2048, starts)
    assert_same_selection(view.numpy(), expected)
    assert (buffer[:, 2048:] == -7).all() and (buffer[rows:] == -7).all()
    keys = torch.from_numpy(rng.standard_normal((10, D)).astype(np.float32)).to(torch.bfloat16)
    cache = torch.zeros((2, 64, D + 4), dtype=torch.uint8)
    slots = torch.arange(10, dtype=torch.int64) * 7
    vllm.indexer_k_quant_and_cache(keys, cache, slots, D, "ue8m0")
    native = torch.zeros((2, 64 * (D + 4)), dtype=torch.uint8)
    dsa.store_index_keys(keys, slots, native, power_of_two_scales=True)
    assert torch.equal(cache.reshape(2, -1), native)
