"""sgl-kernel-compatible top-k entry points: the names, arguments and results of
sgl_kernel.fast_topk_v2, fast_topk_transform_fused and fast_topk_transform_ragged_fused,
which sglang's DeepSeek sparse attention calls on the indexer logits.

    # from sgl_kernel import fast_topk_v2, fast_topk_transform_fused
    from dsa_indexer.compat.sgl_kernel import fast_topk_v2, fast_topk_transform_fused

  score       float32 (or bfloat16) [B, N], inner dimension contiguous, any row stride
  lengths     int32 [B]
  topk        1 .. 2048 (sgl-kernel's kernels serve 2048 only)
  row_starts  int32 [B] or None: row r's candidates are score[r, row_starts[r] + i] for
              0 <= i < lengths[r] (row_starts[r] = 0 when None)
  returns     int32 [B, topk]: where lengths[r] <= topk, i = 0 .. lengths[r] - 1 (as
              transformed below) then -1; otherwise the topk positions i of the largest
              scores, in no particular order, exactly (NaN counts as -inf; of equal scores
              the smaller i wins) and bitwise the same run to run

What each function writes for a selected i (the -1 padding stays -1):
  fast_topk_v2                      i itself (relative to the row's start)
  fast_topk_transform_fused         page_table_size_1[q, i], the token-level cache slot
                                    (int32 [R, max_len]) of the request q of row r:
                                    cu_seqlens_q (int32 [R + 1], cumulative rows per
                                    request from 0 to B) gives q with
                                    cu_seqlens_q[q] <= r < cu_seqlens_q[q + 1]; when
                                    row_starts is None and R == B, q = r (the decode case,
                                    where cu_seqlens_q is not read)
  fast_topk_transform_ragged_fused  i + topk_indices_offset[r] (int32 [B])

They run on the device of their arrays (CPU or CUDA) without host synchronization, so
they can be captured in CUDA graphs and traced by torch.compile. Shape errors name the
arguments above; errors the library finds in the data name the arguments of
dsa_indexer.topk: logits (score), block_table (page_table_size_1), request_offsets
(cu_seqlens_q), position_offsets (topk_indices_offset).
"""

from .. import ops
from ._arguments import check_rank as _check_rank


def _check_rows(op, score, topk, **row_vectors):
    """score is [B, N], every given vector [B] and topk in 1 .. MAX_TOPK."""
    if not 1 <= topk <= ops.MAX_TOPK:
        raise ValueError(f"{op}: topk: must be in 1 .. {ops.MAX_TOPK}, got {topk!r}")
    _check_rank(op, "score", score, 2, "[B, N]")
    rows = score.shape[0]
    for name, vector in row_vectors.items():
        if vector is None:
            continue
        _check_rank(op, name, vector, 1, "[B]")
        if vector.shape[0] != rows:
            raise ValueError(f"{op}: {name}: has {vector.shape[0]} entries but score has "
                             f"{rows} rows")


def fast_topk_v2(score, lengths, topk, row_starts=None):
    """int32 [B, topk]: the positions i (relative to row_starts) of each row's topk largest
    scores (see the module docstring)."""
    _check_rows("fast_topk_v2", score, topk, lengths=lengths, row_starts=row_starts)
    return ops.topk(score, lengths, topk, row_starts=row_starts)


def fast_topk_transform_fused(score, lengths, page_table_size_1, cu_seqlens_q, topk,
                              row_starts=None):
    """int32 [B, topk]: page_table_size_1[request of row r, i] for each selected i (see the
    module docstring)."""
    op = "fast_topk_transform_fused"
    _check_rows(op, score, topk, lengths=lengths, row_starts=row_starts)
    _check_rank(op, "page_table_size_1", page_table_size_1, 2, "[R, max_len]")
    _check_rank(op, "cu_seqlens_q", cu_seqlens_q, 1, "[R + 1]")
    requests = page_table_size_1.shape[0]
    if cu_seqlens_q.shape[0] != requests + 1:
        raise ValueError(f"{op}: cu_seqlens_q: has {cu_seqlens_q.shape[0]} entries but "
                         f"page_table_size_1 has {requests} rows (requests); expected "
                         f"{requests} + 1")
    decode = row_starts is None and requests == score.shape[0]
    return ops.topk(score, lengths, topk, row_starts=row_starts, block_table=page_table_size_1,
                    page_size=1, request_offsets=None if decode else cu_seqlens_q)


def fast_topk_transform_ragged_fused(score, lengths, topk_indices_offset, topk,
                                     row_starts=None):
    """int32 [B, topk]: i + topk_indices_offset[r] for each selected i (see the module
    docstring)."""
    _check_rows("fast_topk_transform_ragged_fused", score, topk, lengths=lengths,
                row_starts=row_starts, topk_indices_offset=topk_indices_offset)
    return ops.topk(score, lengths, topk, row_starts=row_starts,
                    position_offsets=topk_indices_offset)
