"""Pythonic entry points to every dsa-indexer operation.

Each function takes arrays from NumPy, PyTorch or CuPy (any strides the
operation accepts; nothing is copied), runs on the device the arrays live on,
and returns its outputs. Outputs are allocated in the caller's framework on
the same device unless given with `out=` (written in place and returned).
The exact semantics and argument rules are those of the C++ API
(include/dsa/*.hpp); a broken rule raises ValueError whose message names the
operation, the argument and the rule.

Execution keywords accepted by every operation:
  backend             "auto" (default), "cpu_reference", "cpu", "cuda_generic", "cuda_hopper"
  stream              CUDA stream handle as an int; default: the framework's current
                      stream for the arrays' device (torch.cuda.current_stream(),
                      cupy.cuda.get_current_stream())
  num_threads         CPU backend worker threads, 0 to MAX_CPU_THREADS (0: all cores)
  reference_float64   cpu_reference: accumulate in float64
  check_device_errors CUDA: synchronize at the end and raise data-dependent errors
                      (not during graph capture)
  pdl                 CUDA: launch the kernels with programmatic dependent launch
                      (ExecContext::programmatic_dependent_launch): each overlaps the
                      end of the kernel before it on the stream; same results
  workspace           a 1-D uint8 array on the arrays' device to use as scratch
                      memory (default: allocated per call in the caller's framework);
                      keep it to call read_device_error() afterwards

fp8 arguments (queries) take float8_e4m3fn tensors or uint8 arrays holding the
e4m3fn bytes (NumPy and CuPy have no fp8 type).

Page size. The key cache has pages of P tokens, P in PAGE_SIZES (32 or 64). The
functions that take a cache (store_index_keys, paged_mqa_logits, index_topk) take
`page_size`: 0 (the default) reads P from DeepGEMM's view [pages, P, 1, D + 4], or
means PAGE_TOKENS (64) for a 2-D [pages, bytes] view; 32 or 64 states P (a 4-D view
that disagrees is refused).

Key format. The cache holds fp8 keys (D + 4 bytes a token) or fp4 keys (DeepSeek-V4.1's,
DeepGEMM's FP4 indexer layout: D / 2 bytes of e2m1 codes and a word of four ue8m0 block
scales, 68 bytes a token at D = 128). The same functions take `key_format`: "auto" (the
default) reads it from the 4-D view's last dimension (D + 4: fp8, D / 2 + 4: fp4), or
means "fp8" for a 2-D view; "fp8" or "fp4" states it (a 4-D view that disagrees is
refused). fp4 queries (quantize_queries_fp4) are uint8 codes [B, next_n, H, D / 2] passed
as q with their int32 block scales [B, next_n, H] as `q_block_scales`.

Under torch.compile the functions that run an operation dispatch to the
torch.ops.dsa_indexer custom operators, which take every argument and keyword
above (`out=` through their `out` overloads). The host queries
(default_num_workers, resolve_logits_path, workspace_bytes, read_device_error,
plan_mqa_logits_chunks)
are no operators: torch.compile breaks its graph at them (an error with
fullgraph=True), so call them outside the compiled code.
"""

from . import _eager, torch_ops
from ._eager import (  # noqa: F401  (re-exported)
    CHUNK_TOKENS,
    MAX_CPU_THREADS,
    MAX_TOPK,
    PAGE_SIZES,
    PAGE_TOKENS,
    default_num_workers,
    make_context,
    plan_mqa_logits_chunks,
    read_device_error,
    resolve_logits_path,
    workspace_bytes,
)


def _implementation(name):
    """The eager function `name`, or while torch.compile traces, the custom operator that runs
    it: the graph then holds the operator instead of a call into the extension."""
    return getattr(torch_ops if torch_ops.is_compiling() else _eager, name)


# ---------------------------------------------------------------------------
# Keys and queries


def store_index_keys(keys, slot_mapping, cache, *, power_of_two_scales=False, page_size=0,
                     key_format="auto", workspace=None, **execution):
    """Quantizes keys [N, D] (bfloat16/float32) to fp8 or fp4 (key_format: see above) and
    writes them into `cache` at the slots `slot_mapping` [N] (int32/int64; negative:
    skipped): slot s is row s % P of page s // P (page_size: see above). Returns `cache`."""
    _implementation("store_index_keys")(keys, slot_mapping, cache,
                                        power_of_two_scales=power_of_two_scales,
                                        page_size=page_size, key_format=key_format,
                                        workspace=workspace, **execution)
    return cache


def quantize_queries(q, head_gate, *, power_of_two_scales=False, weight_scale=0.0, out=None,
                     workspace=None, **execution):
    """Quantizes q [B, next_n, H, D] per (row, head) and folds the scales into the gate.

    Returns (q_fp8 [B, next_n, H, D], weights float32 [B * next_n, H]); `out` may give
    both as a pair. weight_scale 0 means H^-0.5 * D^-0.5."""
    return _implementation("quantize_queries")(q, head_gate,
                                               power_of_two_scales=power_of_two_scales,
                                               weight_scale=weight_scale, out=out,
                                               workspace=workspace, **execution)


def quantize_queries_fp4(q, head_gate, *, weight_scale=0.0, out=None, workspace=None,
                         **execution):
    """Quantizes q [B, next_n, H, 128] to fp4: each block of 32 values gets a ue8m0 scale
    (max |q| / 6 rounded up to a power of two) and e2m1 codes, two a byte (element 2i in
    the low nibble), as fp4 keys are.

    Returns (q_codes uint8 [B, next_n, H, 64], q_block_scales int32 [B, next_n, H] with
    block b's scale byte in byte b, weights float32 [B * next_n, H] = head_gate *
    weight_scale); `out` may give all three. weight_scale 0 means H^-0.5 * D^-0.5."""
    return _implementation("quantize_queries_fp4")(q, head_gate, weight_scale=weight_scale,
                                                   out=out, workspace=workspace, **execution)


# ---------------------------------------------------------------------------
# Context lengths and schedule


def context_lens(lens, next_n, convention="causal", *, request_offsets=None, total_rows=None,
                 out=None, workspace=None, **execution):
    """Builds int32 context_lens [B, next_n] from int32 lengths [B].

    convention "causal":   L[b, j] = lens[b] + j + 1        (lens = committed prefix)
               "expanded": L[b, j] = lens[b] + next_n       (lens = committed prefix)
               "legacy":   L[b, j] = max(0, lens[b] - next_n + j + 1)  (1-D lengths)

    Requests of uneven row counts (causal only, next_n 1): with request_offsets int32
    [B + 1] the result is the rows' lengths int32 [T], row request_offsets[b] + t getting
    lens[b] + t + 1; give T as total_rows (or `out` [T])."""
    return _implementation("context_lens")(lens, next_n, convention=convention,
                                           request_offsets=request_offsets,
                                           total_rows=total_rows, out=out, workspace=workspace,
                                           **execution)


def causal_context_lens(prefix_lens, next_n, **kwargs):
    """context_lens(prefix_lens, next_n, "causal"): L[b, j] = prefix_lens[b] + j + 1."""
    return context_lens(prefix_lens, next_n, "causal", **kwargs)


def expanded_context_lens(prefix_lens, next_n, **kwargs):
    """context_lens(prefix_lens, next_n, "expanded"): L[b, j] = prefix_lens[b] + next_n."""
    return context_lens(prefix_lens, next_n, "expanded", **kwargs)


def legacy_context_lens(lens, next_n, **kwargs):
    """context_lens(lens, next_n, "legacy"): L[b, j] = max(0, lens[b] - next_n + j + 1)."""
    return context_lens(lens, next_n, "legacy", **kwargs)


def plan_schedule(context_lens, num_workers=None, path="auto", *, request_offsets=None, out=None,
                  workspace=None, **execution):
    """Plans the scoring schedule int32 [num_workers + 1, 2] for context_lens [B, next_n].

    num_workers defaults to default_num_workers(); path must match the scoring call
    ("auto" resolves as for H = 64). With request_offsets (int32 [B + 1], see
    paged_mqa_logits), context_lens holds the rows' lengths int32 [T] and the units are
    row tiles of up to 8 rows of one request. Runs on the device of context_lens (no host
    sync)."""
    return _implementation("plan_schedule")(context_lens, num_workers=num_workers, path=path,
                                            request_offsets=request_offsets, out=out,
                                            workspace=workspace, **execution)


def context_lens_and_schedule(lens, next_n, convention="causal", num_workers=None, path="auto", *,
                              request_offsets=None, total_rows=None, out=None, workspace=None,
                              **execution):
    """(context_lens, schedule): context_lens(lens, next_n, convention) then
    plan_schedule(context_lens, num_workers, path), the same arrays bit for bit, in one
    call (one kernel on CUDA, where the two take two launches and a clearing of the error
    record): what a decode step needs before its layers score. Arguments as in those two
    functions; `out` is a pair (context_lens, schedule), num_workers then defaults to the
    schedule's rows - 1."""
    return _implementation("context_lens_and_schedule")(
        lens, next_n, convention=convention, num_workers=num_workers, path=path,
        request_offsets=request_offsets, total_rows=total_rows, out=out, workspace=workspace,
        **execution)


# ---------------------------------------------------------------------------
# Scoring and selection


def paged_mqa_logits(q, key_cache, weights, context_lens, block_table, max_context_len,
                     schedule=None, *, clean_logits=False, path="auto", page_size=0,
                     key_format="auto", q_block_scales=None, request_offsets=None, out=None,
                     out_dtype="float32", workspace=None, **execution):
    """Lightning-indexer logits [B * next_n, max_context_len] (float32 by default).

    q fp8 [B, next_n, H, D], or fp4 codes uint8 [B, next_n, H, D / 2] with
    q_block_scales int32 [B, next_n, H]; key_cache uint8 paged cache ([pages, bytes] or
    DeepGEMM's [pages, P, 1, W]; page_size and key_format: see above); weights float32
    [B * next_n, H] (fp8 query scales folded in; fp4 queries carry theirs);
    context_lens int32 [B, next_n]; block_table int32 [B, max_blocks] of P-token pages
    (a strided view is fine); schedule from plan_schedule (planned now when None).
    `out` may have any row stride >= max_context_len; out_dtype "bfloat16" asks for
    bf16 logits when `out` is None.

    Requests of uneven row counts: request_offsets int32 [B + 1] (0 first, non-decreasing,
    T last, like cu_seqlens_q) gives request b the rows request_offsets[b] ..
    request_offsets[b + 1] - 1; then q is [T, 1, H, D] or [T, H, D], weights [T, H],
    context_lens the rows' lengths int32 [T] (or [T, 1]), the result [T, max_context_len],
    and the schedule must be planned with the same request_offsets. A request's keys are
    read once per tile of 8 of its rows, on every backend (the Hopper kernels included)."""
    return _implementation("paged_mqa_logits")(
        q, key_cache, weights, context_lens, block_table, max_context_len, schedule=schedule,
        clean_logits=clean_logits, path=path, page_size=page_size, key_format=key_format,
        q_block_scales=q_block_scales, request_offsets=request_offsets, out=out,
        out_dtype=out_dtype, workspace=workspace,
        **execution)


def mqa_logits(q, keys, key_scales, weights, ks, ke, *, clean_logits=False, compressed=False,
               max_seqlen_k=0, q_block_scales=None, out=None, out_dtype="float32", workspace=None,
               **execution):
    """Prefill logits of query rows against a contiguous run of keys, row i over the keys
    [ks[i], ke[i]) (DeepGEMM's fp8_mqa_logits):

        logit(i, j) = sum_h weights[i, h] * max(0, key_scales[j] * q[i, h] . keys[j])

    q fp8 [S, H, D]; keys fp8 [S_kv, D]; key_scales float32 [S_kv]; weights float32 [S, H];
    ks, ke int32 [S] with 0 <= ks[i] <= ke[i] <= S_kv (ranges may be empty and need not be
    monotone). Returns [S, S_kv] with key j at column j, or with `compressed` [S,
    max_seqlen_k] with key ks[i] + c at column c (ke[i] - ks[i] <= max_seqlen_k). With
    clean_logits the columns a row does not score hold -inf, otherwise unspecified values.
    `out` may have any row stride >= its width (columns past it are never written);
    out_dtype "bfloat16" asks for bf16 logits when `out` is None. The full output feeds
    topk(logits, ke - ks, k, row_starts=ks, position_offsets=ks).

    fp4 (D = 128): q may be packed codes uint8 [S, H, 64] with q_block_scales int32 [S, H],
    and keys packed codes uint8 [S_kv, 64] with key_scales int32 [S_kv] (the scale words;
    see "Key format" above)."""
    return _implementation("mqa_logits")(
        q, keys, key_scales, weights, ks, ke, clean_logits=clean_logits, compressed=compressed,
        max_seqlen_k=max_seqlen_k, q_block_scales=q_block_scales, out=out, out_dtype=out_dtype,
        workspace=workspace, **execution)


def topk(logits, lengths, k, *, sorted=False, row_starts=None, position_offsets=None,
         block_table=None, page_size=64, rows_per_request=1, request_offsets=None, out=None,
         workspace=None, **execution):
    """Indices int32 [T, k] of the k largest logits of each row: row r's candidates are
    logits[r, s + i] for 0 <= i < lengths[r], s = row_starts[r] (int32 [T]; 0 when None),
    and the row selects positions i. Rows with lengths[r] <= k give 0 .. lengths[r] - 1
    then -1; otherwise the k largest (NaN as -inf, ties to the smaller i), in any order
    unless `sorted` (largest first).

    Each selected i is written transformed (-1 padding stays -1), by at most one of:
      position_offsets  int32 [T]: i + position_offsets[r]
      block_table       int32 [R, max_blocks]: the cache slot
                        block_table[q, i // page_size] * page_size + i % page_size of the
                        request q of row r; page_size 64 or 32 (cache pages) or 1 (a
                        token-level table: block_table[q, i]). q is r // rows_per_request,
                        or with request_offsets (int32 [R + 1], cumulative rows per request
                        from 0 to T, like cu_seqlens_q) the q with
                        request_offsets[q] <= r < request_offsets[q + 1]."""
    return _implementation("topk")(logits, lengths, k, sorted=sorted, row_starts=row_starts,
                                   position_offsets=position_offsets, block_table=block_table,
                                   page_size=page_size, rows_per_request=rows_per_request,
                                   request_offsets=request_offsets, out=out,
                                   workspace=workspace, **execution)


def index_topk(q, key_cache, weights, context_lens, block_table, max_context_len, k=MAX_TOPK,
               schedule=None, topk_lens=None, *, sorted=False, physical_slots=False, path="auto",
               strategy="auto", page_size=0, key_format="auto", q_block_scales=None,
               request_offsets=None, out=None, workspace=None, **execution):
    """topk(paged_mqa_logits(...), topk_lens, k) without materializing the logits.

    topk_lens int32 [B * next_n] (None: the context lengths, the causal convention;
    with expanded lengths pass the causal ones). Returns int32 [B * next_n, k]; with
    physical_slots, cache slots block_table[b, p // P] * P + p % P of the cache's page
    size P (page_size, key_format and fp4 queries: see above and paged_mqa_logits).
    request_offsets as for paged_mqa_logits (rows T, the slots of a row from its request's
    block-table row); on CUDA it runs "logits_then_topk" ("fused" refuses it)."""
    return _implementation("index_topk")(
        q, key_cache, weights, context_lens, block_table, max_context_len, k=k,
        schedule=schedule, topk_lens=topk_lens, sorted=sorted, physical_slots=physical_slots,
        path=path, strategy=strategy, page_size=page_size, key_format=key_format,
        q_block_scales=q_block_scales, request_offsets=request_offsets, out=out,
        workspace=workspace, **execution)
