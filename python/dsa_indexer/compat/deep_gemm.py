"""DeepGEMM-compatible entry points: the names, arguments, defaults, shapes and results of
DeepGEMM's paged indexer functions, for every next_n (DeepGEMM's Hopper kernel serves
next_n <= 2 only), for caches of 64- or 32-token pages and for fp8 or fp4 queries and keys.

    num_sms = get_num_sms()
    schedule = get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)
    logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens,
                                      block_table, schedule, max_context_len,
                                      clean_logits=True, logits_dtype=torch.bfloat16)

fp8_paged_mqa_logits is the legacy name: the same function, with q itself instead of the
pair (q, None). set_num_sms / get_num_sms and set_pdl / get_pdl are DeepGEMM's process-wide
settings: the count get_num_sms reports (what engines plan schedules for), and whether the
compat functions launch with programmatic dependent launch (the same results either way).

  q               float8_e4m3fn [B, next_n, H, D] (or uint8 holding its bytes); the current
                  name takes the pair (q, None), or FP4 queries as the pair (q_fp4, q_sf):
                  q_fp4 packed e2m1 codes uint8 or int8 [B, next_n, H, 64] (element 2i in
                  the low nibble), q_sf int32 [B, next_n, H] (four ue8m0 block scales,
                  block 0 in the lowest byte); D = 128
  kv_cache        uint8 [num_blocks, block_kv, 1, W], block_kv 64 or 32: W = D + 4 for fp8
                  keys (per block: fp8 keys, then fp32 scales) or D / 2 + 4 = 68 for fp4
                  keys (per block: packed e2m1 codes, then the ue8m0 scale words); the
                  page size and key format are read from this view
  weights         float32 [B * next_n, H] (the fp8 query scale folded in; FP4 queries carry
                  their scales in q_sf)
  context_lens    int32 [B, next_n] (row j of request b sees positions < L[b, j]), or
                  the legacy int32 [B] (row j sees positions <= len_b - next_n + j)
  block_table     int32 [B, max_blocks] of block_kv-token blocks
  schedule_meta   get_paged_mqa_logits_metadata's schedule for these lengths, planned for
                  any num_sms (engines plan for part of the device, e.g. num_sms // 2)
  logits_dtype    torch.float32 (the default) or torch.bfloat16, or their names
                  "float32" / "bfloat16" (NumPy arrays have no bfloat16)
  indices         requests of uneven row counts (adaptive speculation, prefill chunks):
                  int32 [T], one entry a row; a run of consecutive equal entries is one
                  request, whose keys are read once for all of its rows (the values
                  themselves only tell where runs start and end). Then q is [T, 1, H, D],
                  weights [T, H], context_lens int32 [T] or [T, 1] (row r sees positions
                  < context_lens[r]), block_table int32 [T, max_blocks], one row a query
                  row as DeepGEMM takes it (the rows of a run repeat their request's
                  blocks: a run is read through its first row's), and the metadata must
                  be planned with the same indices
  returns         [B * next_n, max_context_len] (with indices [T, max_context_len])
                  logits of logits_dtype

Prefill scoring over a contiguous key run (dsa_indexer.mqa_logits):

    logits = fp8_fp4_mqa_logits((q, None), (keys, key_scales), weights, ks, ke,
                                clean_logits=True, max_seqlen_k=0)

  q               float8_e4m3fn [S, H, D] (fp8_mqa_logits) or the pair (q, None)
                  (fp8_fp4_mqa_logits, which also takes FP4 queries (q_fp4 uint8 or int8
                  [S, H, 64], q_sf int32 [S, H]), packed as for the paged form)
  kv              the pair (keys float8_e4m3fn [S_kv, D], key_scales float32 [S_kv]), or
                  for fp8_fp4_mqa_logits FP4 keys (keys uint8 or int8 [S_kv, 64] packed
                  e2m1 codes, key_scales int32 [S_kv] ue8m0 block-scale words);
                  fp8_mqa_logits refuses FP4 keys (NotImplementedError)
  weights         float32 [S, H]
  cu_seq_len_k_start, cu_seq_len_k_end   int32 [S]: row i scores keys [start, end)
  max_seqlen_k    0: logits [S, S_kv], key j at column j; > 0: compressed logits
                  [S, max_seqlen_k], key start[i] + c at column c
  returns         float32 logits (fp8_fp4_mqa_logits: logits_dtype), -inf outside each
                  row's range with clean_logits (the default)

The schedule is in tokens, whatever the page size: get_paged_mqa_logits_metadata checks
block_kv and keeps nothing. Errors the library finds name the arguments of
dsa_indexer.paged_mqa_logits (key_cache is kv_cache, schedule is schedule_meta).

The functions run on the device of their arrays without host synchronization, so they
can be captured in CUDA graphs and traced by torch.compile.
"""

from .. import _core, ops
from .. import _frameworks as fw

try:
    import torch
except ImportError:  # NumPy-only installations
    torch = None

_LOGITS_DTYPES = ("float32", "bfloat16")
_FLOAT32 = torch.float32 if torch is not None else "float32"


def _is_legacy(context_lens):
    return context_lens.ndim == 1


def _check_indices(op, indices, q=None):
    """indices is 1-D; with q, q is [T, 1, H, D] for its T rows."""
    if len(indices.shape) != 1:
        raise ValueError(f"{op}: indices: expected int32 [T] (the request of each row), got "
                         f"shape {tuple(indices.shape)}")
    if q is not None and (len(q.shape) != 4 or q.shape[1] != 1 or q.shape[0] != indices.shape[0]):
        raise ValueError(f"{op}: q: with indices, expected [T, 1, H, D] with T = "
                         f"{indices.shape[0]} rows, got shape {tuple(q.shape)}")


def _run_offsets(indices):
    """request_offsets [T + 1] of the runs of equal consecutive indices: entry r is the first
    row of run r, T for the runs that do not occur (empty requests at the end)."""
    rows = indices.shape[0]
    return fw.request_offsets(fw.dense_request_ids(indices), rows)


def _logits_dtype_name(op, logits_dtype):
    """The library's name of `logits_dtype` (a torch dtype or its name)."""
    for name in _LOGITS_DTYPES:
        if isinstance(logits_dtype, str):
            if logits_dtype == name:
                return name
        elif torch is not None and logits_dtype == getattr(torch, name):
            return name
    raise ValueError(f"{op}: logits_dtype: must be torch.float32 or torch.bfloat16 (or the "
                     f"names 'float32', 'bfloat16'), got {logits_dtype!r}")


# DeepGEMM's process-wide runtime settings, which its callers set once (set_num_sms,
# set_pdl): the compat names keep them here, as DeepGEMM does, and pass them on.
_settings = {"num_sms": None, "pdl": False}


def _device_num_sms():
    ctx = _core.ExecContext()
    if _core.cuda_device_count() > 0:
        return _core.default_num_workers(_core.DeviceType.cuda, fw.current_cuda_device(), ctx)
    return _core.default_num_workers(_core.DeviceType.cpu, 0, ctx)


def get_num_sms():
    """The count set by set_num_sms, else the multiprocessor count of the current CUDA
    device (PyTorch's, else CuPy's); without a CUDA device, the CPU backend's worker count
    (what a schedule is planned for on the host)."""
    return _settings["num_sms"] if _settings["num_sms"] is not None else _device_num_sms()


def set_num_sms(num_sms):
    """What get_num_sms returns from now on (engines plan schedules for part of the device):
    1 up to the device's count."""
    limit = _device_num_sms()
    if isinstance(num_sms, bool) or not isinstance(num_sms, int) or not 1 <= num_sms <= limit:
        raise ValueError(f"set_num_sms: num_sms: must be an integer in [1, {limit}] (the "
                         f"device's count), got {num_sms!r}")
    _settings["num_sms"] = num_sms


def get_pdl():
    """Whether the compat functions launch with programmatic dependent launch."""
    return _settings["pdl"]


def set_pdl(enable):
    """Programmatic dependent launch for the compat functions from now on (results are the
    same either way; on CUDA each kernel's launch and prologue overlap the previous one's
    end)."""
    if not isinstance(enable, bool):
        raise TypeError(f"set_pdl: enable: must be a bool, got {type(enable).__name__}")
    _settings["pdl"] = enable


def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices=None):
    """The schedule int32 [num_sms + 1, 2] for these lengths (1-D or 2-D; with indices the
    rows' lengths [T]), on their device."""
    op = "get_paged_mqa_logits_metadata"
    if block_kv not in ops.PAGE_SIZES:
        raise ValueError(f"{op}: block_kv: must be one of {ops.PAGE_SIZES} (the tokens per "
                         f"block of kv_cache), got {block_kv!r}")
    if indices is not None:
        _check_indices(op, indices)
        # The schedule depends only on which consecutive rows share a request, so the
        # requests are renumbered densely: the batch (block_table's rows) is not known here.
        return ops.plan_schedule(context_lens, num_sms, "auto",
                                 request_offsets=_run_offsets(indices), pdl=get_pdl())
    if _is_legacy(context_lens):
        # The native schedule depends only on each request's longest row, which for
        # legacy lengths is len_b itself, so it is planned without knowing next_n.
        return ops.plan_schedule(context_lens[:, None], num_sms, "native", pdl=get_pdl())
    return ops.plan_schedule(context_lens, num_sms, "auto", pdl=get_pdl())


def _paged_mqa_logits(op, q, kv_cache, weights, context_lens, block_table, schedule_meta,
                      max_context_len, clean_logits, logits_dtype, q_block_scales=None,
                      indices=None):
    out_dtype = _logits_dtype_name(op, logits_dtype)
    offsets = None
    if indices is not None:
        _check_indices(op, indices, q)
        rows = indices.shape[0]
        if len(block_table.shape) != 2 or block_table.shape[0] != rows:
            raise ValueError(f"{op}: block_table: with indices, expected int32 [T, max_blocks] "
                             f"with T = {rows}, one row a query row, got shape "
                             f"{tuple(block_table.shape)}")
        lens, path = context_lens, "auto"
        # The library takes a block-table row a request: each run's first row's.
        offsets = _run_offsets(indices)
        first_rows = offsets[:-1] if rows == 0 else offsets[:-1].clip(0, rows - 1)
        block_table = fw.rows_at(block_table, first_rows)
    elif _is_legacy(context_lens):
        lens = ops.legacy_context_lens(context_lens, q.shape[1])
        path = "native"  # what get_paged_mqa_logits_metadata planned for 1-D lengths
    else:
        lens = context_lens
        path = "auto"
    return ops.paged_mqa_logits(q, kv_cache, weights, lens, block_table, max_context_len,
                                schedule_meta, clean_logits=bool(clean_logits), path=path,
                                q_block_scales=q_block_scales, request_offsets=offsets,
                                out_dtype=out_dtype, pdl=get_pdl())


def _fp4_codes(op, arg, codes, shape):
    """Packed e2m1 codes as the uint8 bytes the library reads (int8 and PyTorch's
    float4_e2m1fn_x2 hold the same bytes)."""
    dtype = getattr(codes, "dtype", None)
    if torch is not None and isinstance(codes, torch.Tensor):
        if dtype == torch.uint8:
            return codes
        if dtype == torch.int8 or dtype == getattr(torch, "float4_e2m1fn_x2", None):
            return codes.view(torch.uint8)
    elif str(dtype) == "uint8":
        return codes
    elif str(dtype) == "int8":
        return codes.view("uint8")
    raise TypeError(f"{op}: {arg}: must hold packed e2m1 codes as uint8 or int8 {shape}, got "
                    f"dtype {dtype}")


def _query_pair(op, q, shape):
    """(q, q_block_scales) of the fp8_fp4 names' pair: (q_fp8, None) or (q_fp4 codes, q_sf)."""
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise TypeError(f"{op}: q: expected the pair (q_fp8, None) or (q_fp4, q_sf), got "
                        f"{type(q).__name__}")
    values, q_sf = q
    if q_sf is None:
        return values, None
    return _fp4_codes(op, "q", values, shape), q_sf


def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                             max_context_len, clean_logits=False, logits_dtype=_FLOAT32,
                             indices=None):
    """Paged MQA logits [B * next_n, max_context_len] of q = (q_fp8, None) or
    (q_fp4, q_sf) (see the module docstring)."""
    op = "fp8_fp4_paged_mqa_logits"
    q_values, q_sf = _query_pair(op, q, "[B, next_n, H, 64]")
    return _paged_mqa_logits(op, q_values, kv_cache, weights, context_lens, block_table,
                             schedule_meta, max_context_len, clean_logits, logits_dtype,
                             q_block_scales=q_sf, indices=indices)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta,
                         max_context_len, clean_logits=False, logits_dtype=_FLOAT32,
                         indices=None):
    """Paged MQA logits [B * next_n, max_context_len] (see the module docstring)."""
    return _paged_mqa_logits("fp8_paged_mqa_logits", q, kv_cache, weights, context_lens,
                             block_table, schedule_meta, max_context_len, clean_logits,
                             logits_dtype, indices=indices)


def _is_int32(array):
    dtype = getattr(array, "dtype", None)
    return (torch is not None and dtype == torch.int32) or str(dtype) == "int32"


def _key_pair(op, kv, fp4_allowed):
    """(keys, key_scales) of DeepGEMM's kv pair: fp8 keys with float32 scales, or (where
    fp4_allowed) packed fp4 keys with int32 scale words."""
    if not isinstance(kv, (tuple, list)) or len(kv) != 2:
        raise TypeError(f"{op}: kv: expected the pair (keys float8_e4m3fn [S_kv, D], "
                        f"key_scales float32 [S_kv]), got {type(kv).__name__}")
    keys, scales = kv
    fp4 = _is_int32(scales) or (torch is not None and getattr(keys, "dtype", None) == torch.int8)
    if fp4 and not fp4_allowed:
        raise NotImplementedError(
            f"{op}: kv: FP4 keys (packed keys with integer scale factors) are fp8_fp4_mqa_logits'; "
            f"pass (keys float8_e4m3fn [S_kv, D], key_scales float32 [S_kv])")
    return (_fp4_codes(op, "kv", keys, "[S_kv, 64]") if fp4 else keys), scales


def _mqa_logits(op, q, q_sf, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits,
                max_seqlen_k, logits_dtype):
    out_dtype = _logits_dtype_name(op, logits_dtype)
    keys, scales = _key_pair(op, kv, fp4_allowed=op == "fp8_fp4_mqa_logits")
    max_seqlen_k = int(max_seqlen_k)
    if max_seqlen_k < 0:
        raise ValueError(f"{op}: max_seqlen_k: must be >= 0 (0: logits [S, S_kv]), got "
                         f"{max_seqlen_k}")
    return ops.mqa_logits(q, keys, scales, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                          clean_logits=bool(clean_logits), compressed=max_seqlen_k > 0,
                          max_seqlen_k=max_seqlen_k, q_block_scales=q_sf, out_dtype=out_dtype,
                          pdl=get_pdl())


def fp8_fp4_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
                       max_seqlen_k=0, logits_dtype=_FLOAT32):
    """MQA logits of q = (q_fp8, None) or (q_fp4, q_sf) against kv = (keys, key_scales) of
    fp8 or fp4 keys, row i over the keys [cu_seq_len_k_start[i], cu_seq_len_k_end[i]) (see
    the module docstring)."""
    op = "fp8_fp4_mqa_logits"
    q_values, q_sf = _query_pair(op, q, "[S, H, 64]")
    return _mqa_logits(op, q_values, q_sf, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end,
                       clean_logits, max_seqlen_k, logits_dtype)


def fp8_mqa_logits(q, kv, weights, cu_seq_len_k_start, cu_seq_len_k_end, clean_logits=True,
                   max_seqlen_k=0):
    """float32 MQA logits of q float8_e4m3fn [S, H, D] against kv = (keys, key_scales) (see
    the module docstring)."""
    return _mqa_logits("fp8_mqa_logits", q, None, kv, weights, cu_seq_len_k_start,
                       cu_seq_len_k_end, clean_logits, max_seqlen_k, "float32")
