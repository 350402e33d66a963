"""dsa_indexer under torch.compile, on CPU tensors: each function that runs an operation
dispatches to its torch.ops.dsa_indexer operator, every argument and keyword reaches the
library there, and the result is the eager one (bitwise: same backend, same inputs).

Skipped where PyTorch is not installed; no GPU needed."""

import inspect
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dsa_indexer as dsa  # noqa: E402
import reference as ref  # noqa: E402
from dsa_indexer import _eager, ops  # noqa: E402
from dsa_indexer.compat import deep_gemm, sgl_kernel, vllm  # noqa: E402

D = 32
FP8 = torch.float8_e4m3fn
# The functions that run an operation, by the name of their operator.
OPERATIONS = ("store_index_keys", "quantize_queries", "context_lens", "plan_schedule",
              "context_lens_and_schedule", "paged_mqa_logits", "mqa_logits", "topk", "index_topk")
EXECUTION = tuple(inspect.signature(dsa.make_context).parameters)[1:]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()


@pytest.fixture(params=["eager", "aot_eager"])
def backend(request):
    """Dynamo's graph run as traced, and through AOTAutograd (functionalized: written
    arguments become copies written back)."""
    return request.param


def compile_whole(fn, backend="eager"):
    # fullgraph: a call that fell back to eager instead of its operator would fail here.
    return torch.compile(fn, backend=backend, fullgraph=True)


def problem(batch=3, next_n=2, heads=4, max_prefix=300, page=ref.PAGE):
    rng = np.random.default_rng(7)
    prefix = rng.integers(0, max_prefix, size=batch).astype(np.int32)
    lens = (prefix[:, None] + np.arange(next_n) + 1).astype(np.int32)
    cache = ref.random_cache(rng, int((-(-lens.max(axis=1) // page)).sum()) + 2, D, page=page)
    q = ref.e4m3_encode(rng.standard_normal((batch, next_n, heads, D)).astype(np.float32))
    return dict(
        prefix=torch.from_numpy(prefix), lens=torch.from_numpy(lens),
        cache=torch.from_numpy(cache),
        table=torch.from_numpy(ref.random_block_table(rng, lens, cache.shape[0], page=page)),
        q=torch.from_numpy(q).view(FP8),
        weights=torch.from_numpy(rng.standard_normal((batch * next_n, heads)).astype(np.float32)),
        keys=torch.from_numpy(rng.standard_normal((10, D)).astype(np.float32) * 5),
        slots=torch.from_numpy(rng.permutation(2 * ref.PAGE)[:10].astype(np.int32)),
        q_high=torch.from_numpy(rng.standard_normal((batch, next_n, heads, D)).astype(np.float32)),
        max_len=int(lens.max()) + 9, page=page, **prefill(rng, heads))


def prefill(rng, heads, rows=6, keys=40):
    """mqa_logits inputs: fp8 q [rows, H, D], keys [keys, D], ranges some empty, not monotone."""
    ks = rng.integers(0, keys + 1, size=rows).astype(np.int32)
    ke = np.minimum(keys, ks + rng.integers(0, 12, size=rows)).astype(np.int32)
    ks[1] = ke[1] = 3
    q = ref.e4m3_encode(rng.standard_normal((rows, heads, D)).astype(np.float32))
    k = ref.e4m3_encode(rng.standard_normal((keys, D)).astype(np.float32))
    return dict(
        pq=torch.from_numpy(q).view(FP8), pkeys=torch.from_numpy(k).view(FP8),
        pscales=torch.from_numpy(rng.uniform(0.1, 2, size=keys).astype(np.float32)),
        pweights=torch.from_numpy(rng.standard_normal((rows, heads)).astype(np.float32)),
        ks=torch.from_numpy(ks), ke=torch.from_numpy(ke), pwidth=int((ke - ks).max()) + 2)


def scoring(p):
    return p["q"], p["cache"], p["weights"], p["lens"], p["table"], p["max_len"]


def varlen_scoring(p):
    """The scoring inputs as rows of requests of uneven row counts: the request_offsets of
    the problem's requests, q [T, 1, H, D] and the rows' lengths [T]."""
    batch, next_n = p["lens"].shape
    q = p["q"].reshape(batch * next_n, 1, *p["q"].shape[2:])
    return q, p["cache"], p["weights"], p["lens"].reshape(-1), p["table"], p["max_len"]


def varlen_offsets(p):
    batch, next_n = p["lens"].shape
    return torch.arange(batch + 1, dtype=torch.int32) * next_n


def varlen_indices(p):
    batch, next_n = p["lens"].shape
    return torch.arange(batch, dtype=torch.int32).repeat_interleave(next_n)


def prefill_args(p):
    return p["pq"], p["pkeys"], p["pscales"], p["pweights"], p["ks"], p["ke"]


def ragged(p):
    """Top-k inputs of ragged rows: score (logits [6, N]), lengths, row_starts, and
    request_offsets of requests of 2, 0, 1 and 3 rows."""
    logits = dsa.paged_mqa_logits(*scoring(p), page_size=p["page"])
    lengths = (p["lens"].reshape(-1) // 2).int()
    return dict(score=logits, lengths=lengths, starts=(p["lens"].reshape(-1) - lengths).int(),
                offsets=torch.tensor([0, 2, 2, 3, 6], dtype=torch.int32))


def token_table(p, requests):
    """A token-level table int32 [requests, max_len] (page size 1)."""
    return torch.arange(requests * p["max_len"], dtype=torch.int32).view(requests, -1) * 3 + 1


def ragged_topk(p, **options):
    r = ragged(p)
    return dsa.topk(r["score"], r["lengths"], 5, row_starts=r["starts"], **options)


def sgl_transform_fused(p):
    r = ragged(p)
    return sgl_kernel.fast_topk_transform_fused(r["score"], r["lengths"], token_table(p, 4),
                                                r["offsets"], 5, r["starts"])


def sgl_transform_fused_decode(p):
    r = ragged(p)
    return sgl_kernel.fast_topk_transform_fused(r["score"], r["lengths"], token_table(p, 6),
                                                torch.arange(7, dtype=torch.int32), 5)


def sgl_transform_ragged_fused(p):
    r = ragged(p)
    return sgl_kernel.fast_topk_transform_ragged_fused(r["score"], r["lengths"], r["starts"] * 3,
                                                       5, r["starts"])


def vllm_prefill(p):
    r = ragged(p)
    score = r["score"]
    indices = torch.full((6, 5), -1, dtype=torch.int32)
    return vllm.top_k_per_row_prefill(score, r["starts"], r["starts"] + r["lengths"], indices, 6,
                                      score.stride(0), score.stride(1), 5)


def vllm_decode(p, seq_lens):
    score = ragged(p)["score"]
    indices = torch.full((6, 5), -1, dtype=torch.int32)
    return vllm.top_k_per_row_decode(score, 2, seq_lens, indices, 6, score.stride(0), 1, 5)


def vllm_cache(p):
    cache = p["cache"].view(p["cache"].shape[0], ref.PAGE, D + 4)
    return vllm.indexer_k_quant_and_cache(p["keys"], cache, p["slots"].long(), D, "ue8m0")


def fresh(p):
    """A copy whose tensors no earlier call wrote."""
    return {name: value.clone() if isinstance(value, torch.Tensor) else value
            for name, value in p.items()}


def as_comparable(result):
    tensors = result if isinstance(result, (tuple, list)) else (result,)
    return [t.view(torch.uint8) if t.dtype == FP8 else t for t in tensors]


def assert_same(actual, expected):
    actual, expected = as_comparable(actual), as_comparable(expected)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert torch.equal(a, e)


def strided_buffer(columns, fill, dtype=torch.float32, rows=6):
    """A [rows, columns + 5] buffer holding `fill`; its first `columns` columns make an
    output whose row stride exceeds its width."""
    return torch.full((rows, columns + 5), fill, dtype=dtype)


def written(buffer, columns, call):
    """Runs call(out) on the first `columns` columns of `buffer`; returns the whole buffer,
    so that a comparison also sees the columns that must stay untouched."""
    call(buffer[:, :columns])
    return buffer


# Each case calls a dsa_indexer function with arguments and keywords beyond its defaults.
CASES = {
    "store_index_keys": lambda p: dsa.store_index_keys(
        p["keys"], p["slots"], torch.zeros(2, ref.page_bytes(D), dtype=torch.uint8),
        power_of_two_scales=True),
    "quantize_queries": lambda p: dsa.quantize_queries(
        p["q_high"], p["weights"], power_of_two_scales=True, weight_scale=0.5),
    "quantize_queries_out": lambda p: dsa.quantize_queries(
        p["q_high"], p["weights"],
        out=(torch.empty(p["q_high"].shape, dtype=FP8), torch.empty(p["weights"].shape))),
    "causal_context_lens": lambda p: dsa.causal_context_lens(p["prefix"], 3),
    "expanded_context_lens": lambda p: dsa.expanded_context_lens(p["prefix"], 3),
    "legacy_context_lens": lambda p: dsa.legacy_context_lens(p["prefix"], 3),
    "context_lens_out": lambda p: written(
        strided_buffer(2, -7, torch.int32, rows=3), 2,
        lambda out: dsa.context_lens(p["prefix"], 2, "expanded", out=out)),
    "plan_schedule": lambda p: dsa.plan_schedule(p["lens"], 5, "per_token"),
    "plan_schedule_default_workers": lambda p: dsa.plan_schedule(p["lens"], num_threads=3),
    "plan_schedule_out": lambda p: dsa.plan_schedule(
        p["lens"], 4, path="native", out=torch.empty(5, 2, dtype=torch.int32)),
    "context_lens_and_schedule": lambda p: dsa.context_lens_and_schedule(
        p["prefix"], 3, "legacy", 5, "per_token"),
    "context_lens_and_schedule_default_workers": lambda p: dsa.context_lens_and_schedule(
        p["prefix"], 2, num_threads=3),
    "context_lens_and_schedule_out": lambda p: dsa.context_lens_and_schedule(
        p["prefix"], 2, path="native",
        out=(torch.empty(3, 2, dtype=torch.int32), torch.empty(5, 2, dtype=torch.int32))),
    "paged_mqa_logits": lambda p: dsa.paged_mqa_logits(
        *scoring(p), dsa.plan_schedule(p["lens"], 3, "per_token"), clean_logits=True,
        path="per_token"),
    "paged_mqa_logits_bfloat16": lambda p: dsa.paged_mqa_logits(
        *scoring(p), clean_logits=True, out_dtype="bfloat16"),
    "paged_mqa_logits_reference_float64": lambda p: dsa.paged_mqa_logits(
        *scoring(p), clean_logits=True, backend="cpu_reference", reference_float64=True),
    "paged_mqa_logits_out": lambda p: written(
        strided_buffer(p["max_len"], 3.0), p["max_len"],
        lambda out: dsa.paged_mqa_logits(*scoring(p), clean_logits=True, num_threads=2,
                                         out=out)),
    "mqa_logits": lambda p: dsa.mqa_logits(*prefill_args(p), clean_logits=True),
    "mqa_logits_compressed_bfloat16": lambda p: dsa.mqa_logits(
        *prefill_args(p), compressed=True, max_seqlen_k=p["pwidth"], clean_logits=True,
        out_dtype="bfloat16", backend="cpu_reference", reference_float64=True),
    "mqa_logits_out": lambda p: written(
        strided_buffer(p["pwidth"], 3.0), p["pwidth"],
        lambda out: dsa.mqa_logits(*prefill_args(p), clean_logits=True, compressed=True,
                                   max_seqlen_k=p["pwidth"], num_threads=2, out=out)),
    "mqa_logits_topk": lambda p: dsa.topk(
        dsa.mqa_logits(*prefill_args(p)), p["ke"] - p["ks"], 4, row_starts=p["ks"],
        position_offsets=p["ks"]),
    "deep_gemm_fp8_mqa_logits": lambda p: deep_gemm.fp8_mqa_logits(
        p["pq"], (p["pkeys"], p["pscales"]), p["pweights"], p["ks"], p["ke"]),
    "deep_gemm_fp8_fp4_mqa_logits_compressed": lambda p: deep_gemm.fp8_fp4_mqa_logits(
        (p["pq"], None), (p["pkeys"], p["pscales"]), p["pweights"], p["ks"], p["ke"],
        clean_logits=True, max_seqlen_k=p["pwidth"], logits_dtype=torch.bfloat16),
    "topk": lambda p: dsa.topk(
        dsa.paged_mqa_logits(*scoring(p)), p["lens"].reshape(-1), 7, sorted=True,
        block_table=p["table"], rows_per_request=2),
    "topk_out": lambda p: written(
        strided_buffer(7, -9, torch.int32), 7,
        lambda out: dsa.topk(dsa.paged_mqa_logits(*scoring(p)), p["lens"].reshape(-1), 7,
                             sorted=True, out=out)),
    "index_topk": lambda p: dsa.index_topk(
        *scoring(p), 16, dsa.plan_schedule(p["lens"], 2, "native"),
        (p["lens"].reshape(-1) - 1).clamp_min(0), sorted=True, physical_slots=True,
        path="native", strategy="logits_then_topk"),
    "index_topk_fused_out": lambda p: dsa.index_topk(
        *scoring(p), 8, sorted=True, strategy="fused", out=torch.empty(6, 8, dtype=torch.int32)),
    "deep_gemm": lambda p: deep_gemm.fp8_paged_mqa_logits(
        p["q"], p["cache"].view(-1, ref.PAGE, 1, D + 4), p["weights"], p["prefix"] + 2,
        p["table"], deep_gemm.get_paged_mqa_logits_metadata(p["prefix"] + 2, 64, 4),
        p["max_len"], True),
    # Requests of uneven row counts.
    "plan_schedule_request_offsets": lambda p: dsa.plan_schedule(
        p["lens"].reshape(-1), 3, request_offsets=varlen_offsets(p)),
    "paged_mqa_logits_request_offsets": lambda p: dsa.paged_mqa_logits(
        *varlen_scoring(p), clean_logits=True, request_offsets=varlen_offsets(p)),
    "index_topk_request_offsets": lambda p: dsa.index_topk(
        *varlen_scoring(p), 8, sorted=True, physical_slots=True,
        request_offsets=varlen_offsets(p)),
    "causal_context_lens_request_offsets": lambda p: dsa.causal_context_lens(
        p["prefix"], 1, request_offsets=varlen_offsets(p), total_rows=p["lens"].numel()),
    "deep_gemm_indices": lambda p: deep_gemm.fp8_fp4_paged_mqa_logits(
        (varlen_scoring(p)[0], None), p["cache"].view(-1, ref.PAGE, 1, D + 4), p["weights"],
        p["lens"].reshape(-1), p["table"].repeat_interleave(p["lens"].shape[1], 0),
        deep_gemm.get_paged_mqa_logits_metadata(p["lens"].reshape(-1), 64, 3,
                                                indices=varlen_indices(p)),
        p["max_len"], clean_logits=True, indices=varlen_indices(p)),
    # The page size, and the top-k's ragged options.
    "store_index_keys_page_size": lambda p: dsa.store_index_keys(
        p["keys"], p["slots"], torch.zeros(4, ref.page_bytes(D, 32), dtype=torch.uint8),
        page_size=32),
    "paged_mqa_logits_page_size": lambda p: dsa.paged_mqa_logits(
        *scoring(p), clean_logits=True, page_size=32),
    "index_topk_page_size": lambda p: dsa.index_topk(
        *scoring(p), 8, sorted=True, physical_slots=True, page_size=32),
    "topk_row_starts_position_offsets": lambda p: ragged_topk(
        p, sorted=True, position_offsets=ragged(p)["starts"] * 7),
    "topk_request_offsets_page_1": lambda p: ragged_topk(
        p, block_table=token_table(p, 4), page_size=1, request_offsets=ragged(p)["offsets"]),
    "topk_page_32": lambda p: dsa.topk(
        ragged(p)["score"], ragged(p)["lengths"], 5, sorted=True, block_table=p["table"],
        page_size=32, rows_per_request=2),
    # The compat modules' current names.
    "deep_gemm_fp8_fp4_page_32_bfloat16": lambda p: deep_gemm.fp8_fp4_paged_mqa_logits(
        (p["q"], None), p["cache"].view(-1, 32, 1, D + 4), p["weights"], p["lens"], p["table"],
        deep_gemm.get_paged_mqa_logits_metadata(p["lens"], 32, 2), p["max_len"],
        clean_logits=True, logits_dtype=torch.bfloat16),
    "sgl_kernel_fast_topk_v2": lambda p: sgl_kernel.fast_topk_v2(
        ragged(p)["score"], ragged(p)["lengths"], 5, ragged(p)["starts"]),
    "sgl_kernel_fast_topk_transform_fused": sgl_transform_fused,
    "sgl_kernel_fast_topk_transform_fused_decode": sgl_transform_fused_decode,
    "sgl_kernel_fast_topk_transform_ragged_fused": sgl_transform_ragged_fused,
    "vllm_top_k_per_row_prefill": vllm_prefill,
    "vllm_top_k_per_row_decode_total_lengths": lambda p: vllm_decode(p, p["lens"][:, -1].contiguous()),
    "vllm_top_k_per_row_decode_row_lengths": lambda p: vllm_decode(p, p["lens"]),
    "vllm_indexer_k_quant_and_cache": vllm_cache,
}
# The cases of caches of 32-token pages.
PAGES_OF_32 = {"store_index_keys_page_size", "paged_mqa_logits_page_size", "index_topk_page_size",
               "topk_page_32", "deep_gemm_fp8_fp4_page_32_bfloat16"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_calls_give_the_eager_result(case, backend):
    p = problem(page=32) if case in PAGES_OF_32 else problem()
    expected = CASES[case](fresh(p))
    assert_same(compile_whole(CASES[case], backend)(fresh(p)), expected)


def test_keywords_change_the_compiled_result_as_they_change_the_eager_one():
    # Beside agreeing with eager calls, the compiled calls differ where a keyword matters.
    p = problem()
    run = compile_whole(lambda p, **kw: dsa.paged_mqa_logits(*scoring(p), **kw))
    assert run(p).dtype == torch.float32
    assert run(p, out_dtype="bfloat16").dtype == torch.bfloat16
    plain = run(p, backend="cpu_reference")
    precise = run(p, backend="cpu_reference", reference_float64=True)
    assert not torch.equal(plain, precise)
    assert torch.isneginf(run(p, clean_logits=True)).any()
    prefill = compile_whole(lambda p, **kw: dsa.mqa_logits(*prefill_args(p), **kw))
    assert prefill(p).shape == (6, 40)
    assert prefill(p, compressed=True, max_seqlen_k=p["pwidth"]).shape == (6, p["pwidth"])
    assert prefill(p, out_dtype="bfloat16").dtype == torch.bfloat16
    assert torch.isneginf(prefill(p, clean_logits=True)).any()
    assert torch.equal(prefill(p, clean_logits=True),
                       dsa.mqa_logits(*prefill_args(p), clean_logits=True))
    assert not torch.equal(prefill(p, backend="cpu_reference", clean_logits=True),
                           prefill(p, backend="cpu_reference", reference_float64=True,
                                   clean_logits=True))
    schedule = compile_whole(lambda lens, **kw: dsa.plan_schedule(lens, **kw))
    assert schedule(p["lens"], num_threads=3).shape == (4, 2)
    assert schedule(p["lens"], num_threads=5).shape == (6, 2)
    indices = compile_whole(lambda p, **kw: dsa.index_topk(*scoring(p), 16, **kw))
    assert not torch.equal(indices(p, sorted=True), indices(p, sorted=True, physical_slots=True))
    r = ragged(p)
    selection = compile_whole(lambda r, **kw: dsa.topk(r["score"], r["lengths"], 5, sorted=True,
                                                       **kw))
    plain = selection(r)
    assert not torch.equal(plain, selection(r, row_starts=r["starts"]))
    assert torch.equal(selection(r, position_offsets=r["starts"]),
                       torch.where(plain >= 0, plain + r["starts"][:, None], -1))
    slots = {page: selection(r, block_table=token_table(p, 3), page_size=page,
                             rows_per_request=2) for page in (1, 32, 64)}
    assert not torch.equal(slots[1], slots[32]) and not torch.equal(slots[32], slots[64])
    assert not torch.equal(slots[1], selection(r, block_table=token_table(p, 4), page_size=1,
                                               request_offsets=r["offsets"]))
    p32 = problem(page=32)
    logits = compile_whole(lambda p, **kw: dsa.paged_mqa_logits(*scoring(p), **kw))
    with pytest.raises(Exception, match="key_cache: pages of .* 64-token pages"):
        logits(p32)  # a 2-D cache is read as pages of 64 tokens by default
    assert torch.equal(logits(p32, clean_logits=True, page_size=32),
                       dsa.paged_mqa_logits(*scoring(p32), clean_logits=True, page_size=32))


def test_out_is_written_and_returned(backend):
    p = problem()
    buffer = strided_buffer(p["max_len"], 3.0)
    out = buffer[:, :p["max_len"]]
    result = compile_whole(
        lambda p, out: dsa.paged_mqa_logits(*scoring(p), clean_logits=True, out=out),
        backend)(p, out)
    assert result.data_ptr() == out.data_ptr()
    assert torch.equal(out, dsa.paged_mqa_logits(*scoring(p), clean_logits=True))
    assert (buffer[:, p["max_len"]:] == 3.0).all()  # past max_context_len: never written


def test_execution_keywords_reach_the_library(monkeypatch, backend):
    seen = []
    make_context = _eager.make_context

    def recording_make_context(like, **execution):
        seen.append(execution)
        return make_context(like, **execution)

    monkeypatch.setattr(_eager, "make_context", recording_make_context)
    given = dict(backend="cpu", stream=12345, num_threads=2, reference_float64=True,
                 check_device_errors=True, pdl=True)
    assert set(given) == set(EXECUTION)
    p = problem()
    calls = [
        lambda p: dsa.store_index_keys(p["keys"], p["slots"], p["cache"], **given),
        lambda p: dsa.quantize_queries(p["q_high"], p["weights"], **given),
        lambda p: dsa.causal_context_lens(p["prefix"], 2, **given),
        lambda p: dsa.plan_schedule(p["lens"], **given),
        lambda p: dsa.paged_mqa_logits(*scoring(p), **given),
        lambda p: dsa.mqa_logits(*prefill_args(p), **given),
        lambda p: dsa.topk(p["weights"], p["lens"].reshape(-1) % 4, 2, **given),
        lambda p: dsa.index_topk(*scoring(p), 4, **given),
    ]
    for call in calls:
        seen.clear()
        torch._dynamo.reset()
        compile_whole(call, backend)(fresh(p))
        assert seen and all(execution == given for execution in seen)


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="Inductor's CPU code generation needs a C++ compiler")
@pytest.mark.parametrize("with_workspace", [False, True])
def test_inductor_lowers_the_operators(with_workspace):
    """Inductor (torch.compile's default backend) compiles a decode step and a prefill
    call made of the operators, with and without a caller's workspace, to the eager
    result."""
    p = problem()
    extra = dict(workspace=torch.zeros(1024, dtype=torch.uint8)) if with_workspace else {}

    def step(p):
        logits = dsa.paged_mqa_logits(*scoring(p), clean_logits=True, **extra)
        prefill = dsa.mqa_logits(*prefill_args(p), clean_logits=True, **extra)
        return logits, dsa.topk(logits, p["lens"].reshape(-1), 8, sorted=True, **extra), prefill

    expected = step(fresh(p))
    got = torch.compile(step, fullgraph=True)(fresh(p))
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", OPERATIONS)
def test_workspace_reaches_the_library(name, backend):
    p = problem()
    args = {
        "store_index_keys": (p["keys"], p["slots"], p["cache"]),
        "quantize_queries": (p["q_high"], p["weights"]),
        "context_lens": (p["prefix"], 2),
        "plan_schedule": (p["lens"], 2),
        "context_lens_and_schedule": (p["prefix"], 2),
        "paged_mqa_logits": scoring(p),
        "mqa_logits": prefill_args(p),
        "topk": (p["weights"], p["lens"].reshape(-1) % 4, 2),
        "index_topk": scoring(p) + (4,),
    }[name]
    function = getattr(dsa, name)
    run = compile_whole(lambda args, workspace: function(*args, workspace=workspace), backend)
    run(args, torch.zeros(1024, dtype=torch.uint8))
    # The binding checks the workspace's shape: a 2-D one reaching it is refused there.
    with pytest.raises(ValueError, match="workspace: must be a 1-D"):
        run(args, torch.zeros(4, 256, dtype=torch.uint8))


def test_unknown_keywords_are_named():
    p = problem()
    with pytest.raises(Exception, match="num_thread"):
        compile_whole(lambda p: dsa.topk(p["weights"], p["lens"].reshape(-1), 2,
                                         num_thread=2))(p)
    with pytest.raises(TypeError, match="num_thread"):
        dsa.topk(p["weights"], p["lens"].reshape(-1), 2, num_thread=2)


@pytest.mark.parametrize("name", OPERATIONS)
def test_operators_take_every_argument_of_their_function(name):
    """The schemas derive from the eager signatures; this pins them to the public ones."""
    public = inspect.signature(getattr(ops, name)).parameters.values()
    expected = {p.name for p in public if p.kind is not p.VAR_KEYWORD} | set(EXECUTION)
    packet = getattr(torch.ops.dsa_indexer, name)
    schemas = [getattr(packet, overload)._schema for overload in packet.overloads()]
    names = {argument.name for schema in schemas for argument in schema.arguments}
    if "out" in expected:  # the out overload's name for it
        expected = expected - {"out"} | {"output"}
    assert names == expected
    defaults = {argument.name: argument.default_value
                for argument in packet.default._schema.arguments if argument.has_default_value()}
    for parameter in public:
        # out and workspace select overloads (they are not arguments of the default one).
        if parameter.default is not parameter.empty and parameter.name not in ("out", "workspace"):
            assert defaults[parameter.name] == parameter.default, parameter.name


def test_operators_pass_opcheck():
    p = problem()
    lens = p["lens"]
    # q as its uint8 bytes: the checks compare tensors with torch.allclose, which float8
    # tensors do not implement.
    q = p["q"].view(torch.uint8)
    prefill_bytes = ((p["pq"].view(torch.uint8), p["pkeys"].view(torch.uint8))
                     + prefill_args(p)[2:])
    logits = dsa.paged_mqa_logits(*scoring(p), clean_logits=True)
    r = ragged(p)
    workspace = torch.zeros(64, dtype=torch.uint8)
    ops_ = torch.ops.dsa_indexer
    calls = [
        (ops_.store_index_keys.workspace, (p["keys"], p["slots"], p["cache"]),
         dict(power_of_two_scales=True, workspace=workspace)),
        (ops_.context_lens.default, (p["prefix"], 3), dict(convention="legacy")),
        (ops_.context_lens.out, (p["prefix"], 3),
         dict(output=torch.empty(3, 3, dtype=torch.int32))),
        (ops_.plan_schedule.default, (lens,), dict(num_workers=3, path="per_token")),
        (ops_.plan_schedule.default, (lens,), dict(num_threads=2)),
        (ops_.plan_schedule.out, (lens,), dict(output=torch.empty(3, 2, dtype=torch.int32),
                                               num_workers=2)),
        (ops_.context_lens_and_schedule.default, (p["prefix"], 3),
         dict(convention="expanded", num_workers=4)),
        (ops_.context_lens_and_schedule.out, (p["prefix"], 2),
         dict(output=[torch.empty(3, 2, dtype=torch.int32), torch.empty(4, 2, dtype=torch.int32)],
              path="native")),
        (ops_.paged_mqa_logits.workspace, (q,) + scoring(p)[1:],
         dict(clean_logits=True, out_dtype="bfloat16", workspace=workspace)),
        (ops_.paged_mqa_logits.out, (q,) + scoring(p)[1:],
         dict(output=torch.empty(6, p["max_len"]), clean_logits=True)),
        (ops_.mqa_logits.workspace, prefill_bytes,
         dict(clean_logits=True, out_dtype="bfloat16", workspace=workspace)),
        (ops_.mqa_logits.default, prefill_bytes,
         dict(compressed=True, max_seqlen_k=p["pwidth"], clean_logits=True)),
        (ops_.mqa_logits.out, prefill_bytes,
         dict(output=torch.empty(6, p["pwidth"]), compressed=True,
              max_seqlen_k=p["pwidth"], clean_logits=True)),
        (ops_.topk.default, (logits, lens.reshape(-1), 8),
         dict(sorted=True, block_table=p["table"], rows_per_request=2)),
        (ops_.topk.out, (logits, lens.reshape(-1), 8),
         dict(output=torch.empty(6, 8, dtype=torch.int32), sorted=True)),
        (ops_.index_topk.default, (q,) + scoring(p)[1:], dict(k=8, sorted=True)),
        (ops_.index_topk.out, (q,) + scoring(p)[1:],
         dict(output=torch.empty(6, 8, dtype=torch.int32), k=8, sorted=True)),
        (ops_.store_index_keys.default,
         (p["keys"], p["slots"], torch.zeros(4, ref.page_bytes(D, 32), dtype=torch.uint8)),
         dict(page_size=32)),
        (ops_.paged_mqa_logits.default, (q,) + scoring(p)[1:],
         dict(clean_logits=True, page_size=64)),
        (ops_.index_topk.default, (q,) + scoring(p)[1:],
         dict(k=8, physical_slots=True, page_size=64)),
        (ops_.topk.default, (r["score"], r["lengths"], 4),
         dict(row_starts=r["starts"], position_offsets=r["starts"])),
        (ops_.topk.default, (r["score"], r["lengths"], 4),
         dict(row_starts=r["starts"], block_table=token_table(p, 4), page_size=1,
              request_offsets=r["offsets"])),
        (ops_.topk.out, (r["score"], r["lengths"], 4),
         dict(output=torch.empty(6, 4, dtype=torch.int32), block_table=p["table"], page_size=32,
              rows_per_request=2)),
    ]
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic")
    for op, args, kwargs in calls:
        torch.library.opcheck(op, args, kwargs, test_utils=utils)
    # Its float8 output: only the fake is checked (the other checks compute with the
    # outputs, which PyTorch's CPU kernels do not for float8).
    for op, kwargs in ((ops_.quantize_queries.default, dict(weight_scale=0.5)),
                       (ops_.quantize_queries.out,
                        dict(output=[torch.empty(p["q_high"].shape, dtype=FP8),
                                  torch.empty(p["weights"].shape)]))):
        torch.library.opcheck(op, (p["q_high"], p["weights"]), kwargs,
                              test_utils=("test_faketensor",))
