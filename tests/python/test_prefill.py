"""dsa_indexer.mqa_logits (prefill scoring over a contiguous key run) and DeepGEMM's
fp8_mqa_logits / fp8_fp4_mqa_logits on the CPU backend, against the NumPy float64
reference (PyTorch CPU tensors where NumPy lacks a type: bfloat16, float8)."""

import numpy as np
import pytest

import dsa_indexer as dsa
import reference as ref
from dsa_indexer.compat import deep_gemm, sgl_kernel


@pytest.fixture
def rng():
    return np.random.default_rng(97)


def prefill_problem(rng, rows=13, keys=90, heads=4, head_dim=32):
    """Random fp8 codes and ranges: some empty, not monotone in the row, one the whole run."""
    starts = rng.integers(0, keys + 1, size=rows)
    ends = np.minimum(keys, starts + rng.integers(0, keys // 2, size=rows))
    starts[0], ends[0] = 0, keys
    starts[1] = ends[1] = min(7, keys)  # empty
    starts[2] = ends[2] = keys  # empty at the end
    return dict(
        q=ref.e4m3_encode(rng.standard_normal((rows, heads, head_dim)).astype(np.float32)),
        keys=ref.e4m3_encode(rng.standard_normal((keys, head_dim)).astype(np.float32) * 3),
        scales=rng.uniform(0.01, 2.0, size=keys).astype(np.float32),
        weights=rng.standard_normal((rows, heads)).astype(np.float32),
        ks=starts.astype(np.int32), ke=ends.astype(np.int32))


def args(p):
    return p["q"], p["keys"], p["scales"], p["weights"], p["ks"], p["ke"]


def widest(p):
    return int((p["ke"] - p["ks"]).max())


def expected(p, max_seqlen_k=0):
    return ref.mqa_logits(*args(p), max_seqlen_k=max_seqlen_k)


def check(actual, wanted, clean, rtol=2e-4):
    """actual matches the reference where a row scores; with clean_logits it is -inf
    exactly where the reference is."""
    with np.errstate(invalid="ignore"):  # unscored columns without clean_logits: any bits
        actual = np.asarray(actual, dtype=np.float64)
    assert actual.shape == wanted.shape
    ref.assert_logits_close(actual, wanted, rtol=rtol)
    if clean:
        np.testing.assert_array_equal(np.isneginf(actual), np.isneginf(wanted))


def test_ranges_are_empty_and_not_monotone(rng):
    p = prefill_problem(rng)
    assert (p["ks"] == p["ke"]).sum() >= 2 and (np.diff(p["ks"]) < 0).any()


@pytest.mark.parametrize("heads", [1, 32, 64])
@pytest.mark.parametrize("head_dim", [32, 128])
@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("clean", [False, True])
def test_mqa_logits(rng, heads, head_dim, compressed, clean):
    p = prefill_problem(rng, rows=9, keys=70, heads=heads, head_dim=head_dim)
    width = widest(p) + 3 if compressed else 0
    logits = dsa.mqa_logits(*args(p), clean_logits=clean, compressed=compressed,
                            max_seqlen_k=width)
    assert logits.dtype == np.float32
    check(logits, expected(p, width), clean)


@pytest.mark.parametrize("backend", ["cpu_reference", "cpu"])
def test_backends_agree_with_the_reference(rng, backend):
    p = prefill_problem(rng, heads=8)
    check(dsa.mqa_logits(*args(p), clean_logits=True, backend=backend, num_threads=3),
          expected(p), True)


def test_out_with_row_stride_is_written_in_its_width_only(rng):
    p = prefill_problem(rng)
    width = widest(p)
    buffer = np.full((len(p["ks"]), width + 6), 5.0, dtype=np.float32)
    out = buffer[:, :width]
    result = dsa.mqa_logits(*args(p), clean_logits=True, compressed=True, max_seqlen_k=width,
                            out=out)
    assert result is out
    check(out, expected(p, width), True)
    assert (buffer[:, width:] == 5.0).all()


def test_compressed_width_zero_for_empty_ranges(rng):
    p = prefill_problem(rng)
    p["ke"] = p["ks"].copy()
    logits = dsa.mqa_logits(*args(p), clean_logits=True, compressed=True, max_seqlen_k=0)
    assert logits.shape == (len(p["ks"]), 0)


@pytest.mark.parametrize("compressed", [False, True])
def test_chunks_fit_the_budget_and_score_as_the_whole(rng, compressed):
    p = prefill_problem(rng)
    rows, num_keys = len(p["ks"]), len(p["scales"])
    budget = 4 * (widest(p) if compressed else num_keys) * 5  # about five rows a chunk
    chunks = dsa.plan_mqa_logits_chunks(p["ks"], p["ke"], num_keys, budget, compressed=compressed)
    assert chunks[0][0] == 0 and chunks[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
    whole = dsa.mqa_logits(*args(p), clean_logits=True, compressed=compressed,
                           max_seqlen_k=widest(p) if compressed else 0)
    for begin, end, width in chunks:
        span = (p["ke"][begin:end] - p["ks"][begin:end]).max()
        assert (end - begin) * 4 * (max(span, 1) if compressed else num_keys) <= budget
        assert width == (span if compressed else 0)
        part = dsa.mqa_logits(p["q"][begin:end], p["keys"], p["scales"], p["weights"][begin:end],
                              p["ks"][begin:end], p["ke"][begin:end], clean_logits=True,
                              compressed=compressed, max_seqlen_k=width)
        np.testing.assert_array_equal(part, whole[begin:end, :part.shape[1]])


def test_chunk_plan_refusals(rng):
    p = prefill_problem(rng)
    num_keys = len(p["scales"])
    with pytest.raises(ValueError, match="budget_bytes"):
        dsa.plan_mqa_logits_chunks(p["ks"], p["ke"], num_keys, 4 * num_keys - 1)
    with pytest.raises(ValueError, match="out_dtype"):
        dsa.plan_mqa_logits_chunks(p["ks"], p["ke"], num_keys, 1 << 20, out_dtype="float16")
    with pytest.raises(ValueError, match="ke"):
        dsa.plan_mqa_logits_chunks(p["ks"], p["ke"], num_keys - 1, 1 << 20)
    with pytest.raises(TypeError, match="ks"):
        dsa.plan_mqa_logits_chunks([0, 1], p["ke"], num_keys, 1 << 20)


def test_bfloat16_output_through_torch(rng):
    torch = pytest.importorskip("torch")
    p = prefill_problem(rng, heads=16)
    tensors = [torch.from_numpy(a) for a in args(p)]
    tensors[0] = tensors[0].view(torch.float8_e4m3fn)
    tensors[1] = tensors[1].view(torch.float8_e4m3fn)
    for compressed, width in ((False, 0), (True, widest(p))):
        logits = dsa.mqa_logits(*tensors, clean_logits=True, compressed=compressed,
                                max_seqlen_k=width, out_dtype="bfloat16")
        assert logits.dtype == torch.bfloat16
        check(logits.float().numpy(), expected(p, width), True, rtol=1e-2)


def test_full_logits_feed_the_ragged_topk(rng):
    p = prefill_problem(rng, rows=11, keys=300, heads=8)
    k = 16
    logits = dsa.mqa_logits(*args(p))
    lengths = p["ke"] - p["ks"]
    assert (lengths > k).any() and (lengths <= k).any()
    selected = dsa.topk(logits, lengths, k, sorted=True, row_starts=p["ks"],
                        position_offsets=p["ks"])
    via_sgl = sgl_kernel.fast_topk_transform_ragged_fused(logits, lengths, p["ks"], k, p["ks"])
    np.testing.assert_array_equal(np.sort(via_sgl, axis=1), np.sort(selected, axis=1))
    # The reference selection over the reference logits, as key positions.
    wanted = expected(p)
    positions = ref.topk(wanted, lengths, k, row_starts=p["ks"])
    positions = np.where(positions >= 0, positions + p["ks"][:, None], -1)
    for r in range(len(lengths)):
        got, exp = selected[r][selected[r] >= 0], positions[r][positions[r] >= 0]
        assert len(got) == len(exp)
        assert ((got >= p["ks"][r]) & (got < p["ke"][r])).all()
        # The same keys, up to ties closer than float32 rounding.
        np.testing.assert_allclose(np.sort(wanted[r, got]), np.sort(wanted[r, exp]),
                                   rtol=1e-5, atol=1e-5)
    # And exactly the selection of the library's own logits.
    own = ref.topk(logits, lengths, k, row_starts=p["ks"])
    np.testing.assert_array_equal(selected, np.where(own >= 0, own + p["ks"][:, None], -1))


# ---------------------------------------------------------------------------
# Refusals


def test_refusals_name_the_argument(rng):
    p = prefill_problem(rng)
    q, keys, scales, weights, ks, ke = args(p)
    with pytest.raises(ValueError, match="mqa_logits.*keys"):
        dsa.mqa_logits(q, keys[:, :16], scales, weights, ks, ke)
    with pytest.raises(ValueError, match="mqa_logits.*weights"):
        dsa.mqa_logits(q, keys, scales, weights[:, :2], ks, ke)
    with pytest.raises(ValueError, match="mqa_logits.*key_scales"):
        dsa.mqa_logits(q, keys, scales[:5], weights, ks, ke)
    with pytest.raises(ValueError, match="mqa_logits.*ke"):
        dsa.mqa_logits(q, keys, scales, weights, ks, ke[:4])
    with pytest.raises(ValueError, match="mqa_logits.*max_seqlen_k"):
        dsa.mqa_logits(*args(p), max_seqlen_k=4)  # without compressed
    with pytest.raises(ValueError, match="mqa_logits.*ke"):
        dsa.mqa_logits(*args(p), compressed=True, max_seqlen_k=widest(p) - 1)
    bad = ke.copy()
    bad[3] = keys.shape[0] + 1
    with pytest.raises(ValueError, match="mqa_logits.*ke"):
        dsa.mqa_logits(q, keys, scales, weights, ks, bad)
    with pytest.raises(TypeError, match="mqa_logits: ks"):
        dsa.mqa_logits(q, keys, scales, weights, list(ks), ke)
    with pytest.raises(ValueError, match="mqa_logits: out"):
        out = np.empty((len(ks), keys.shape[0]), dtype=np.float32)
        out.flags.writeable = False
        dsa.mqa_logits(*args(p), out=out)


# ---------------------------------------------------------------------------
# DeepGEMM


def torch_args(p):
    torch = pytest.importorskip("torch")
    fp8 = torch.float8_e4m3fn
    return (torch.from_numpy(p["q"]).view(fp8),
            (torch.from_numpy(p["keys"]).view(fp8), torch.from_numpy(p["scales"])),
            torch.from_numpy(p["weights"]), torch.from_numpy(p["ks"]),
            torch.from_numpy(p["ke"]))


def test_deep_gemm_fp8_mqa_logits(rng):
    torch = pytest.importorskip("torch")
    p = prefill_problem(rng, heads=32, head_dim=128)
    q, kv, weights, ks, ke = torch_args(p)
    full = deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke)  # clean_logits=True by default
    assert full.dtype == torch.float32 and full.shape == (len(p["ks"]), len(p["scales"]))
    check(full.numpy(), expected(p), True)
    width = widest(p) + 1
    compressed = deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke, True, width)
    assert compressed.shape == (len(p["ks"]), width)
    check(compressed.numpy(), expected(p, width), True)
    unclean = deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke, clean_logits=False)
    check(unclean.numpy(), expected(p), False)


def test_deep_gemm_fp8_fp4_mqa_logits(rng):
    torch = pytest.importorskip("torch")
    p = prefill_problem(rng, heads=64)
    q, kv, weights, ks, ke = torch_args(p)
    width = widest(p)
    logits = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke, clean_logits=True,
                                          max_seqlen_k=width)
    assert logits.dtype == torch.float32
    check(logits.numpy(), expected(p, width), True)
    bf16 = deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke,
                                        logits_dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and bf16.shape == (len(p["ks"]), len(p["scales"]))
    check(bf16.float().numpy(), expected(p), True, rtol=1e-2)
    assert torch.equal(deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke),
                       deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke))


def test_deep_gemm_mqa_logits_refusals(rng):
    torch = pytest.importorskip("torch")
    p = prefill_problem(rng)
    q, kv, weights, ks, ke = torch_args(p)
    sf = torch.zeros(q.shape[0], q.shape[1], 1, dtype=torch.int32)
    with pytest.raises(TypeError, match="fp8_fp4_mqa_logits: q: must hold packed e2m1 codes"):
        deep_gemm.fp8_fp4_mqa_logits((q, sf), kv, weights, ks, ke)
    with pytest.raises(TypeError, match=r"fp8_fp4_mqa_logits: q: expected the pair"):
        deep_gemm.fp8_fp4_mqa_logits(q, kv, weights, ks, ke)
    packed = (kv[0].view(torch.uint8)[:, :16].contiguous().view(torch.int8),
              torch.zeros(kv[0].shape[0], dtype=torch.int32))
    with pytest.raises(NotImplementedError, match="fp8_mqa_logits: kv: FP4 keys"):
        deep_gemm.fp8_mqa_logits(q, packed, weights, ks, ke)
    with pytest.raises(TypeError, match="fp8_mqa_logits: kv: expected the pair"):
        deep_gemm.fp8_mqa_logits(q, kv[0], weights, ks, ke)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        deep_gemm.fp8_mqa_logits(q, kv, weights, ks, ke, True, -1)
    with pytest.raises(ValueError, match="logits_dtype"):
        deep_gemm.fp8_fp4_mqa_logits((q, None), kv, weights, ks, ke,
                                     logits_dtype=torch.float16)
    with pytest.raises(ValueError, match="mqa_logits.*weights"):
        deep_gemm.fp8_mqa_logits(q, kv, weights[:3], ks, ke)
