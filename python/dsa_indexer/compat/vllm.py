"""vLLM-compatible indexer entry points: the names, arguments and in-place results of the
custom operators vLLM's DeepSeek sparse-attention indexer calls beside DeepGEMM's scoring
(which dsa_indexer.compat.deep_gemm provides): the top-k of each logits row and the
index-key cache write.

    # from vllm import _custom_ops as ops; ops.top_k_per_row_prefill(...)
    from dsa_indexer.compat import vllm as ops

Top-k (the selection is exact and bitwise the same run to run: NaN counts as -inf, of
equal logits the smaller position wins; the order within a row is unspecified, as
vLLM's is):

  top_k_per_row_prefill(logits, row_starts, row_ends, indices, num_rows, stride0,
                        stride1, top_k=None)
      row r (r < num_rows) of logits float32 [rows, N] selects among the columns
      row_starts[r] <= j < row_ends[r] (int32 [rows]) and writes the positions
      j - row_starts[r] of its top_k largest logits into indices[r, :top_k]
  top_k_per_row_decode(logits, next_n, seq_lens, indices, num_rows, stride0, stride1,
                       top_k=None)
      row r selects among columns 0 <= j < L[r] and writes the positions j, where
      L[r] = max(0, seq_lens[r // next_n] - next_n + r % next_n + 1) for seq_lens int32
      [B] (each request's total length; its next_n rows are causal), or L[r] =
      seq_lens[r // next_n, r % next_n] for seq_lens int32 [B, next_n] (each row's own
      length)
  persistent_topk(logits, lengths, output, workspace, k, max_seq_len)
      row r selects among columns 0 <= j < lengths[r] (lengths int32 [rows] or [B, n]
      flattened to one a row); workspace and max_seq_len are not needed and not read

  A row whose candidates number at most top_k lists 0 .. count - 1 then -1. top_k
  defaults to indices.shape[1] (vLLM's older operators took it from there), 1 .. 2048.
  indices (output) is int32 [rows, >= top_k], inner dimension contiguous; it is
  written in place and also returned. stride0 and stride1 must be the logits' own
  strides (logits.stride(0), logits.stride(1)): the logits are read through the array,
  and stride1 must be 1.

Index keys:

  indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt)
      quantizes k bfloat16/float32 [num_tokens, D] to fp8 e4m3 with one scale a token
      (quant_block_size == D), scale = max(amax, 1e-4) / 448 (scale_fmt "ue8m0": rounded
      up to a power of two), and writes token t into kv_cache uint8 [num_blocks,
      block_size, D + 4] at slot slot_mapping[t] (negative: skipped) as
      dsa_indexer.store_index_keys does: a block's D-byte keys, then its float32 scales

They run on the device of their arrays (CPU or CUDA) without host synchronization, so
they can be captured in CUDA graphs. Shape errors name the arguments above; errors the
library finds in the data name the arguments of dsa_indexer.topk (lengths: the rows'
candidate counts, row_ends - row_starts for the prefill form) and store_index_keys.
"""

import math

from .. import _frameworks as fw
from .. import ops
from ._arguments import check_rank as _shape

_FP8_SCALE_FORMATS = {None: False, "": False, "fp32": False, "ue8m0": True}


def _strides(array):
    """Element strides of a PyTorch tensor, or of a NumPy or CuPy array."""
    if fw.framework_of(array) == fw.TORCH:
        return tuple(array.stride())
    return tuple(s // array.itemsize for s in array.strides)


def _selection(op, logits, indices, num_rows, stride0, stride1, top_k):
    """Checks the arguments every top-k form shares (stride0 and stride1 None where the
    form takes no strides); returns (rows, k)."""
    logits_shape = _shape(op, "logits", logits, 2, "[rows, N]")
    indices_shape = _shape(op, "indices", indices, 2, "[rows, top_k]")
    rows = int(num_rows)
    if not 0 <= rows <= min(logits_shape[0], indices_shape[0]):
        raise ValueError(f"{op}: num_rows: must be in 0 .. {min(logits_shape[0], indices_shape[0])} "
                         f"(the rows of logits and of indices), got {num_rows!r}")
    k = indices_shape[1] if top_k is None else int(top_k)
    if not 1 <= k <= min(ops.MAX_TOPK, indices_shape[1]):
        raise ValueError(f"{op}: top_k: must be in 1 .. {min(ops.MAX_TOPK, indices_shape[1])} "
                         f"(at most {ops.MAX_TOPK} and the columns of indices), got {top_k!r}")
    actual = _strides(logits)
    if stride0 is not None and (int(stride0), int(stride1)) != actual:
        raise ValueError(f"{op}: stride0, stride1: must be the logits' strides {actual}, got "
                         f"({stride0}, {stride1})")
    if actual[1] != 1 and logits_shape[1] > 1:
        raise ValueError(f"{op}: stride1: the logits' columns must be contiguous (stride 1), got "
                         f"{actual[1]}")
    return rows, k


def _run_topk(logits, lengths, k, indices, rows, row_starts=None):
    if rows > 0:
        ops.topk(logits[:rows], lengths, k, row_starts=row_starts, out=indices[:rows])
    return indices


def top_k_per_row_prefill(logits, row_starts, row_ends, indices, num_rows, stride0, stride1,
                          top_k=None):
    """Writes into indices[r, :top_k] the positions (relative to row_starts[r]) of the
    top_k largest logits[r, row_starts[r]:row_ends[r]]; returns indices (see the module
    docstring)."""
    op = "top_k_per_row_prefill"
    rows, k = _selection(op, logits, indices, num_rows, stride0, stride1, top_k)
    for name, vector in (("row_starts", row_starts), ("row_ends", row_ends)):
        if _shape(op, name, vector, 1, "[rows]")[0] < rows:
            raise ValueError(f"{op}: {name}: has {vector.shape[0]} entries, fewer than num_rows "
                             f"({rows})")
    starts = row_starts[:rows]
    return _run_topk(logits, row_ends[:rows] - starts, k, indices, rows, row_starts=starts)


def top_k_per_row_decode(logits, next_n, seq_lens, indices, num_rows, stride0, stride1,
                         top_k=None):
    """Writes into indices[r, :top_k] the positions of the top_k largest logits[r, :L[r]],
    L from seq_lens and next_n (see the module docstring); returns indices."""
    op = "top_k_per_row_decode"
    rows, k = _selection(op, logits, indices, num_rows, stride0, stride1, top_k)
    next_n = int(next_n)
    if next_n < 1:
        raise ValueError(f"{op}: next_n: must be at least 1, got {next_n}")
    shape = getattr(seq_lens, "shape", None)
    if shape is None or len(shape) not in (1, 2):
        raise ValueError(f"{op}: seq_lens: expected [B] or [B, next_n], got "
                         f"{None if shape is None else tuple(shape)}")
    requests = -(-rows // next_n)
    if shape[0] < requests or (len(shape) == 2 and shape[1] != next_n):
        raise ValueError(f"{op}: seq_lens: expected [B] or [B, next_n] with B >= "
                         f"ceil(num_rows / next_n) = {requests} and next_n = {next_n}, got "
                         f"{tuple(shape)}")
    if len(shape) == 2:
        lengths = seq_lens[:requests].reshape(-1)[:rows]
    else:
        # Row b * next_n + j of request b sees its first seq_lens[b] - next_n + j + 1 keys.
        lengths = ops.legacy_context_lens(seq_lens[:requests], next_n).reshape(-1)[:rows]
    return _run_topk(logits, lengths, k, indices, rows)


def persistent_topk(logits, lengths, output, workspace, k, max_seq_len):
    """Writes into output[r, :k] the positions of the k largest logits[r, :lengths[r]];
    returns output (workspace and max_seq_len are not read)."""
    del workspace, max_seq_len
    op = "persistent_topk"
    rows, k = _selection(op, logits, output, logits.shape[0], None, None, k)
    shape = getattr(lengths, "shape", None)
    if shape is None or len(shape) not in (1, 2) or math.prod(shape) != rows:
        raise ValueError(f"{op}: lengths: expected [rows] or [B, next_n] with one entry a row "
                         f"({rows}), got {None if shape is None else tuple(shape)}")
    return _run_topk(logits, lengths.reshape(-1), k, output, rows)


def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
    """Quantizes k [num_tokens, D] to fp8 with a scale a token and writes it into the paged
    kv_cache [num_blocks, block_size, D + 4] at slot_mapping (see the module docstring)."""
    op = "indexer_k_quant_and_cache"
    tokens, head_dim = _shape(op, "k", k, 2, "[num_tokens, D]")
    width = _shape(op, "kv_cache", kv_cache, 3, "[num_blocks, block_size, D + 4]")[2]
    if int(quant_block_size) != head_dim:
        raise ValueError(f"{op}: quant_block_size: the cache holds one scale a token, so it must "
                         f"be D = {head_dim}, got {quant_block_size!r}")
    if width != head_dim + 4:
        raise ValueError(f"{op}: kv_cache: the last dimension must be D + 4 = {head_dim + 4} (a "
                         f"token's fp8 key and float32 scale), got {width}")
    if scale_fmt not in _FP8_SCALE_FORMATS:
        raise ValueError(f"{op}: scale_fmt: expected one of "
                         f"{sorted(str(f) for f in _FP8_SCALE_FORMATS)}, got {scale_fmt!r}")
    if _shape(op, "slot_mapping", slot_mapping, 1, "[num_tokens]")[0] != tokens:
        raise ValueError(f"{op}: slot_mapping: has {slot_mapping.shape[0]} entries but k has "
                         f"{tokens} tokens")
    # DeepGEMM's view [num_blocks, block_size, 1, D + 4], which states the page size.
    ops.store_index_keys(k, slot_mapping, kv_cache[:, :, None, :],
                         power_of_two_scales=_FP8_SCALE_FORMATS[scale_fmt], key_format="fp8")
    return kv_cache
