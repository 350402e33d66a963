"""DeepGEMM-compatible entry points: the same names, arguments, shapes and results as
deep_gemm.get_paged_mqa_logits_metadata and deep_gemm.fp8_paged_mqa_logits, for every
next_n (DeepGEMM's Hopper kernel serves next_n <= 2 only).

    schedule = get_paged_mqa_logits_metadata(context_lens, block_kv=64, num_sms=132)
    logits = fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table,
                                  schedule, max_context_len, clean_logits=True)

  q               float8_e4m3fn [B, next_n, H, D] (or uint8 holding its bytes)
  kv_cache        uint8 [num_pages, 64, 1, D + 4] (fp8 keys then fp32 scales per page)
  weights         float32 [B * next_n, H]
  context_lens    int32 [B, next_n] (row j of request b sees positions < L[b, j]), or
                  the legacy int32 [B] (row j sees positions <= len_b - next_n + j)
  block_table     int32 [B, max_blocks]
  returns         float32 [B * next_n, max_context_len]

Both functions run on the device of their arrays without host synchronization,
so they can be captured in CUDA graphs and traced by torch.compile.
"""

from .. import ops


def _is_legacy(context_lens):
    return context_lens.ndim == 1


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
    """The schedule int32 [num_sms + 1, 2] for these lengths (1-D or 2-D)."""
    if block_kv != ops.PAGE_TOKENS:
        raise ValueError(
            f"get_paged_mqa_logits_metadata: block_kv: must be {ops.PAGE_TOKENS} (the cache's "
            f"page size), got {block_kv}")
    if _is_legacy(context_lens):
        # The native schedule depends only on each request's longest row, which for
        # legacy lengths is len_b itself, so it is planned without knowing next_n.
        return ops.plan_schedule(context_lens[:, None], num_sms, "native")
    return ops.plan_schedule(context_lens, num_sms, "auto")


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False):
    """Paged MQA logits float32 [B * next_n, max_context_len] (see the module docstring)."""
    if _is_legacy(context_lens):
        lens = ops.legacy_context_lens(context_lens, q.shape[1])
        path = "native"  # what get_paged_mqa_logits_metadata planned for 1-D lengths
    else:
        lens = context_lens
        path = "auto"
    return ops.paged_mqa_logits(q, kv_cache, weights, lens, block_table, max_context_len,
                                schedule_meta, clean_logits=bool(clean_logits), path=path)
