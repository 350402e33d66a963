"""The eager implementations of dsa_indexer.ops: arrays handed to the extension through
DLPack, outputs and workspaces allocated in the caller's framework, one call into _core.

dsa_indexer.ops calls these directly, and while torch.compile traces, through the
torch.ops.dsa_indexer custom operators (dsa_indexer.torch_ops), whose kernels are these
same functions; their signatures are therefore the operators' schemas. The new_* helpers
allocate the outputs here and in the operators' fake implementations alike. See
dsa_indexer.ops for the arguments.
"""

import operator

from . import _core
from . import _frameworks as fw

_BACKENDS = {
    "auto": _core.Backend.automatic,
    "automatic": _core.Backend.automatic,
    "cpu_reference": _core.Backend.cpu_reference,
    "cpu": _core.Backend.cpu,
    "cuda_generic": _core.Backend.cuda_generic,
    "cuda_hopper": _core.Backend.cuda_hopper,
}
_PATHS = {
    "auto": _core.LogitsPath.automatic,
    "automatic": _core.LogitsPath.automatic,
    "native": _core.LogitsPath.native,
    "per_token": _core.LogitsPath.per_token,
}
_STRATEGIES = {
    "auto": _core.IndexTopkStrategy.automatic,
    "automatic": _core.IndexTopkStrategy.automatic,
    "fused": _core.IndexTopkStrategy.fused,
    "logits_then_topk": _core.IndexTopkStrategy.logits_then_topk,
}
_KEY_FORMATS = {
    "auto": _core.KeyFormat.automatic,
    "automatic": _core.KeyFormat.automatic,
    "fp8": _core.KeyFormat.fp8_e4m3,
    "fp8_e4m3": _core.KeyFormat.fp8_e4m3,
    "fp4": _core.KeyFormat.fp4_e2m1,
    "fp4_e2m1": _core.KeyFormat.fp4_e2m1,
}
_CONVENTIONS = {
    "causal": _core.LengthConvention.causal,
    "expanded": _core.LengthConvention.expanded,
    "legacy": _core.LengthConvention.legacy,
}
_LENGTH_BUILDERS = {
    "causal": _core.causal_context_lens,
    "expanded": _core.expanded_context_lens,
    "legacy": _core.legacy_context_lens,
}

MAX_TOPK = _core.MAX_TOPK
MAX_CPU_THREADS = _core.MAX_CPU_THREADS
PAGE_TOKENS = _core.PAGE_TOKENS  # the page size of a 2-D cache view given page_size=0
PAGE_SIZES = _core.PAGE_SIZES  # the page sizes of the key cache the library serves
CHUNK_TOKENS = _core.CHUNK_TOKENS


def _integer(value, op, name, bits):
    """`value` as an int for the library's `bits`-bit integer argument `name` of `op`: a
    value that is not an integer (2.5 would be truncated) raises TypeError, one beyond the
    argument's range ValueError, here, before any output is sized from it."""
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{op}: {name}: expected an integer, got {value!r}") from None
    if not -(2**(bits - 1)) <= number < 2**(bits - 1):
        raise ValueError(f"{op}: {name}: {number} is beyond the int{bits} range of the argument")
    return number


def _int32(value, op, name):
    return _integer(value, op, name, 32)


def _int64(value, op, name):
    return _integer(value, op, name, 64)


def _index_columns(k):
    """Columns of an index output allocated for `k`: the library accepts k up to MAX_TOPK and
    reports any other k itself."""
    return min(max(k, 0), MAX_TOPK)


def _choice(table, value, what):
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"{what}: unknown value {value!r}; accepted: {sorted(table)}") from None


def make_context(like, backend="auto", stream=None, num_threads=0, reference_float64=False,
                 check_device_errors=False, pdl=False):
    """The _core.ExecContext for arrays like `like` (the execution keywords of dsa_indexer.ops)."""
    ctx = _core.ExecContext()
    ctx.backend = _choice(_BACKENDS, backend, "backend")
    ctx.stream = fw.current_stream(like) if stream is None else int(stream)
    ctx.num_threads = _int32(num_threads, "ctx", "num_threads")
    ctx.reference_float64 = bool(reference_float64)
    ctx.check_device_errors = bool(check_device_errors)
    ctx.programmatic_dependent_launch = bool(pdl)
    return ctx


def _check_arrays(op, inputs=(), outputs=()):
    """Raises TypeError naming the argument of `op` that is not an array (NumPy, PyTorch or
    CuPy) and ValueError naming an output that is read-only; (name, value) pairs, where
    None is an absent optional argument."""
    for pairs, output in ((inputs, False), (outputs, True)):
        for name, value in pairs:
            if value is None:
                continue
            try:
                fw.framework_of(value)
            except TypeError as error:
                raise TypeError(f"{op}: {name}: {error}") from None
            if output and not fw.is_writable(value):
                raise ValueError(f"{op}: {name}: the array is read-only; the library writes it")


def _scoring_inputs(q, key_cache, weights, context_lens, block_table, schedule,
                    q_block_scales=None, request_offsets=None):
    return [("q", q), ("key_cache", key_cache), ("weights", weights),
            ("context_lens", context_lens), ("block_table", block_table), ("schedule", schedule),
            ("q_block_scales", q_block_scales), ("request_offsets", request_offsets)]


def _basic_workspace(like, ctx, workspace):
    """The caller's workspace, or one for operations that only keep the device error record."""
    if workspace is not None:
        return workspace
    return fw.workspace(like, _core.paged_mqa_logits_workspace_bytes(ctx))


def _extent(array, dim, fallback=0):
    """array.shape[dim], or `fallback` when the rank is too small (the library then reports
    the bad rank with its own message). Left as the framework gives it: symbolic in a fake
    implementation under torch.compile."""
    shape = array.shape
    return shape[dim] if -len(shape) <= dim < len(shape) else fallback


def _rows(q, request_offsets=None):
    """B * next_n, the rows of the outputs of q [B, next_n, H, D]; with request_offsets, the
    rows T of q [T, 1, H, D] or [T, H, D]."""
    if request_offsets is not None:
        return _extent(q, 0)
    return _extent(q, 0) * _extent(q, 1)


def _device(like):
    return fw.device_of(like)


# ---------------------------------------------------------------------------
# Outputs as the functions below allocate them when `out` is None, and as the custom
# operators' fake implementations report them


def new_quantized(q):
    """(q_fp8, weights) for q [B, next_n, H, D]."""
    rows = _rows(q) if len(q.shape) == 4 else 0
    return (fw.empty(q, q.shape, "float8_e4m3"), fw.empty(q, (rows, _extent(q, 2)), "float32"))


def new_quantized_fp4(q):
    """(q_codes, q_block_scales, weights) for q [B, next_n, H, D]: uint8 [B, next_n, H, D / 2],
    int32 [B, next_n, H], float32 [B * next_n, H]."""
    rows = _rows(q) if len(q.shape) == 4 else 0
    shape = tuple(q.shape)
    codes_shape = shape[:3] + (shape[3] // 2,) if len(shape) == 4 else shape
    return (fw.empty(q, codes_shape, "uint8"), fw.empty(q, shape[:3], "int32"),
            fw.empty(q, (rows, _extent(q, 2)), "float32"))


def new_context_lens(lens, next_n):
    return fw.empty(lens, (_extent(lens, 0), max(next_n, 0)), "int32")


def new_row_context_lens(lens, total_rows):
    """The rows' lengths [T] of requests of uneven row counts."""
    return fw.empty(lens, (max(total_rows, 0),), "int32")


def schedule_workers(context_lens, num_workers, ctx):
    """num_workers as an int32, default_num_workers() when None."""
    if num_workers is None:
        device_type, index = _device(context_lens)
        num_workers = _core.default_num_workers(device_type, index, ctx)
    return _int32(num_workers, "plan_schedule", "num_workers")


def new_schedule(context_lens, num_workers):
    return fw.empty(context_lens, (max(num_workers, 0) + 1, 2), "int32")


def new_logits(q, max_context_len, dtype, request_offsets=None):
    return fw.empty(q, (_rows(q, request_offsets), max(max_context_len, 0)), dtype)


def new_mqa_logits(q, keys, compressed, max_seqlen_k, dtype):
    """[S, S_kv], or [S, max_seqlen_k] with `compressed`, for q [S, H, D] and keys [S_kv, D]."""
    columns = max(max_seqlen_k, 0) if compressed else _extent(keys, 0)
    return fw.empty(q, (_extent(q, 0), columns), dtype)


def new_topk_indices(logits, k):
    return fw.empty(logits, (_extent(logits, 0), _index_columns(k)), "int32")


def new_index_topk_indices(q, k, request_offsets=None):
    return fw.empty(q, (_rows(q, request_offsets), _index_columns(k)), "int32")


# ---------------------------------------------------------------------------
# Keys and queries


def store_index_keys(keys, slot_mapping, cache, *, power_of_two_scales=False, page_size=0,
                     key_format="auto", workspace=None, **execution):
    page_size = _int32(page_size, "store_index_keys", "page_size")
    key_format_value = _choice(_KEY_FORMATS, key_format, "key_format")
    _check_arrays("store_index_keys", [("keys", keys), ("slot_mapping", slot_mapping)],
                  [("cache", cache), ("workspace", workspace)])
    ctx = make_context(cache, **execution)
    ws = workspace if workspace is not None else fw.workspace(
        cache, _core.store_index_keys_workspace_bytes(ctx))
    _core.store_index_keys(fw.export(keys), fw.export(slot_mapping), fw.export(cache),
                           bool(power_of_two_scales), page_size, key_format_value, ctx,
                           fw.export(ws))
    return cache


def quantize_queries(q, head_gate, *, power_of_two_scales=False, weight_scale=0.0, out=None,
                     workspace=None, **execution):
    _check_arrays("quantize_queries", [("q", q), ("head_gate", head_gate)],
                  [("workspace", workspace)])
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise TypeError("quantize_queries: out: expected a pair (q_fp8, weights)")
    q_fp8, weights = new_quantized(q) if out is None else out
    _check_arrays("quantize_queries", outputs=[("out[0]", q_fp8), ("out[1]", weights)])
    ctx = make_context(q, **execution)
    ws = workspace if workspace is not None else fw.workspace(
        q, _core.quantize_queries_workspace_bytes(ctx))
    _core.quantize_queries(fw.export(q), fw.export(head_gate), fw.export(q_fp8),
                           fw.export(weights), bool(power_of_two_scales), float(weight_scale),
                           ctx, fw.export(ws))
    return q_fp8, weights


def quantize_queries_fp4(q, head_gate, *, weight_scale=0.0, out=None, workspace=None,
                         **execution):
    _check_arrays("quantize_queries_fp4", [("q", q), ("head_gate", head_gate)],
                  [("workspace", workspace)])
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 3):
        raise TypeError("quantize_queries_fp4: out: expected a triple (q_codes, q_block_scales, "
                        "weights)")
    q_codes, q_block_scales, weights = new_quantized_fp4(q) if out is None else out
    _check_arrays("quantize_queries_fp4", outputs=[("out[0]", q_codes), ("out[1]", q_block_scales),
                                                   ("out[2]", weights)])
    ctx = make_context(q, **execution)
    ws = workspace if workspace is not None else fw.workspace(
        q, _core.quantize_queries_workspace_bytes(ctx))
    _core.quantize_queries_fp4(fw.export(q), fw.export(head_gate), fw.export(q_codes),
                               fw.export(q_block_scales), fw.export(weights), float(weight_scale),
                               ctx, fw.export(ws))
    return q_codes, q_block_scales, weights


# ---------------------------------------------------------------------------
# Context lengths and schedule


def _check_convention(op, convention, request_offsets):
    if request_offsets is not None and convention != "causal":
        raise ValueError(f"{op}: request_offsets: only the causal convention has the form of "
                         f"requests of uneven row counts")


def _lengths_output(op, lens, next_n, request_offsets, total_rows):
    """The context lengths a builder writes when the caller gives none: [B, next_n], or the
    rows' [T] with request_offsets (T given as total_rows)."""
    if request_offsets is None:
        return new_context_lens(lens, next_n)
    if total_rows is None:
        raise ValueError(f"{op}: total_rows: give the rows T (request_offsets[-1]) or `out` "
                         f"[T] with request_offsets; reading T from the device would "
                         f"synchronize")
    return new_row_context_lens(lens, _int64(total_rows, op, "total_rows"))


def context_lens(lens, next_n, convention="causal", *, request_offsets=None, total_rows=None,
                 out=None, workspace=None, **execution):
    builder = _choice(_LENGTH_BUILDERS, convention, "convention")
    op = f"{convention}_context_lens"
    next_n = _int32(next_n, op, "next_n")
    _check_arrays(op, [("lens", lens), ("request_offsets", request_offsets)],
                  [("out", out), ("workspace", workspace)])
    _check_convention(op, convention, request_offsets)
    if out is None:
        out = _lengths_output(op, lens, next_n, request_offsets, total_rows)
    ctx = make_context(lens, **execution)
    ws = _basic_workspace(lens, ctx, workspace)
    builder(fw.export(lens), next_n, fw.export(out), fw.export(request_offsets), ctx,
            fw.export(ws))
    return out


def default_num_workers(like, **execution):
    """Workers plan_schedule plans for by default: the multiprocessor count of the arrays'
    CUDA device, the CPU backend's thread count on the host."""
    device_type, index = _device(like)
    return _core.default_num_workers(device_type, index, make_context(like, **execution))


def resolve_logits_path(path, next_n, num_heads, like, **execution):
    """The path ("native" or "per_token") `path` resolves to for this shape and device."""
    device_type, index = _device(like)
    resolved = _core.resolve_logits_path(_choice(_PATHS, path, "path"),
                                         _int32(next_n, "resolve_logits_path", "next_n"),
                                         _int32(num_heads, "resolve_logits_path", "num_heads"),
                                         device_type, index,
                                         make_context(like, **execution))
    return resolved.name


def plan_schedule(context_lens, num_workers=None, path="auto", *, request_offsets=None, out=None,
                  workspace=None, **execution):
    _choice(_PATHS, path, "path")
    _check_arrays("plan_schedule", [("context_lens", context_lens),
                                    ("request_offsets", request_offsets)],
                  [("out", out), ("workspace", workspace)])
    ctx = make_context(context_lens, **execution)
    num_workers = schedule_workers(context_lens, num_workers, ctx)
    if out is None:
        out = new_schedule(context_lens, num_workers)
    ws = _basic_workspace(context_lens, ctx, workspace)
    _core.plan_schedule(fw.export(context_lens), num_workers, _PATHS[path], fw.export(out),
                        fw.export(request_offsets), ctx, fw.export(ws))
    return out


def new_lengths_and_schedule(lens, next_n, convention, num_workers, request_offsets, total_rows,
                             ctx):
    """(context_lens, schedule) as context_lens_and_schedule allocates them."""
    op = "context_lens_and_schedule"
    _check_convention(op, convention, request_offsets)
    lengths = _lengths_output(op, lens, next_n, request_offsets, total_rows)
    return lengths, new_schedule(lens, schedule_workers(lens, num_workers, ctx))


def context_lens_and_schedule(lens, next_n, convention="causal", num_workers=None, path="auto", *,
                              request_offsets=None, total_rows=None, out=None, workspace=None,
                              **execution):
    op = "context_lens_and_schedule"
    convention_value = _choice(_CONVENTIONS, convention, "convention")
    path_value = _choice(_PATHS, path, "path")
    next_n = _int32(next_n, op, "next_n")
    _check_arrays(op, [("lens", lens), ("request_offsets", request_offsets)],
                  [("workspace", workspace)])
    if out is not None and (not isinstance(out, (tuple, list)) or len(out) != 2):
        raise TypeError(f"{op}: out: expected a pair (context_lens, schedule)")
    _check_convention(op, convention, request_offsets)
    ctx = make_context(lens, **execution)
    if out is None:
        lengths, schedule = new_lengths_and_schedule(lens, next_n, convention, num_workers,
                                                     request_offsets, total_rows, ctx)
    else:
        lengths, schedule = out
        _check_arrays(op, outputs=[("out[0]", lengths), ("out[1]", schedule)])
    workers = _int32(num_workers if num_workers is not None else _extent(schedule, 0) - 1, op,
                     "num_workers")
    ws = _basic_workspace(lens, ctx, workspace)
    _core.context_lens_and_schedule(convention_value, fw.export(lens), next_n, fw.export(lengths),
                                    workers, path_value, fw.export(schedule),
                                    fw.export(request_offsets), ctx, fw.export(ws))
    return lengths, schedule


def _scoring_schedule(q, context_lens, schedule, path, request_offsets, execution):
    """The caller's schedule, or one planned now on the device for the path the call uses
    (with request_offsets the library resolves "auto" itself)."""
    if schedule is not None:
        return schedule
    if request_offsets is not None:
        return plan_schedule(context_lens, path=path, request_offsets=request_offsets, **execution)
    resolved = resolve_logits_path(path, _extent(q, 1, 1), _extent(q, 2, 1), q, **execution)
    return plan_schedule(context_lens, path=resolved, **execution)


# ---------------------------------------------------------------------------
# Scoring and selection


def paged_mqa_logits(q, key_cache, weights, context_lens, block_table, max_context_len,
                     schedule=None, *, clean_logits=False, path="auto", page_size=0,
                     key_format="auto", q_block_scales=None, request_offsets=None, out=None,
                     out_dtype="float32", workspace=None, **execution):
    max_context_len = _int64(max_context_len, "paged_mqa_logits", "max_context_len")
    page_size = _int32(page_size, "paged_mqa_logits", "page_size")
    path_value = _choice(_PATHS, path, "path")
    key_format_value = _choice(_KEY_FORMATS, key_format, "key_format")
    _check_arrays("paged_mqa_logits", _scoring_inputs(q, key_cache, weights, context_lens,
                                                      block_table, schedule, q_block_scales,
                                                      request_offsets),
                  [("out", out), ("workspace", workspace)])
    schedule = _scoring_schedule(q, context_lens, schedule, path, request_offsets, execution)
    if out is None:
        out = new_logits(q, max_context_len, out_dtype, request_offsets)
    ctx = make_context(q, **execution)
    ws = workspace if workspace is not None else fw.workspace(
        q, _core.paged_mqa_logits_workspace_bytes(ctx))
    _core.paged_mqa_logits(fw.export(q), fw.export(key_cache), fw.export(weights),
                           fw.export(context_lens), fw.export(block_table), fw.export(schedule),
                           max_context_len, fw.export(out), bool(clean_logits), path_value,
                           page_size, key_format_value, fw.export(q_block_scales),
                           fw.export(request_offsets), ctx, fw.export(ws))
    return out


def mqa_logits(q, keys, key_scales, weights, ks, ke, *, clean_logits=False, compressed=False,
               max_seqlen_k=0, q_block_scales=None, out=None, out_dtype="float32", workspace=None,
               **execution):
    max_seqlen_k = _int64(max_seqlen_k, "mqa_logits", "max_seqlen_k")
    _check_arrays("mqa_logits", [("q", q), ("keys", keys), ("key_scales", key_scales),
                                 ("weights", weights), ("ks", ks), ("ke", ke),
                                 ("q_block_scales", q_block_scales)],
                  [("out", out), ("workspace", workspace)])
    if out is None:
        out = new_mqa_logits(q, keys, bool(compressed), max_seqlen_k, out_dtype)
    ctx = make_context(q, **execution)
    ws = workspace if workspace is not None else fw.workspace(
        q, _core.mqa_logits_workspace_bytes(ctx))
    _core.mqa_logits(fw.export(q), fw.export(keys), fw.export(key_scales), fw.export(weights),
                     fw.export(ks), fw.export(ke), fw.export(out), bool(clean_logits),
                     bool(compressed), max_seqlen_k, fw.export(q_block_scales), ctx,
                     fw.export(ws))
    return out


def plan_mqa_logits_chunks(ks, ke, num_keys, budget_bytes, *, compressed=False,
                           out_dtype="float32"):
    """Consecutive row chunks [(begin, end, max_seqlen_k), ...] whose mqa_logits outputs
    (full [rows, num_keys], or compressed [rows, widest range] with max_seqlen_k that
    width) each fit budget_bytes; ks and ke in host memory (see dsa/prefill.hpp)."""
    if out_dtype not in ("float32", "bfloat16"):
        raise ValueError(f"plan_mqa_logits_chunks: out_dtype: must be 'float32' or 'bfloat16', "
                         f"got {out_dtype!r}")
    _check_arrays("plan_mqa_logits_chunks", [("ks", ks), ("ke", ke)], [])
    return _core.plan_mqa_logits_chunks(
        fw.export(ks), fw.export(ke), _int64(num_keys, "plan_mqa_logits_chunks", "num_keys"),
        bool(compressed), out_dtype == "bfloat16",
        _int64(budget_bytes, "plan_mqa_logits_chunks", "budget_bytes"))


def topk(logits, lengths, k, *, sorted=False, row_starts=None, position_offsets=None,
         block_table=None, page_size=64, rows_per_request=1, request_offsets=None, out=None,
         workspace=None, **execution):
    k = _int32(k, "topk", "k")
    page_size = _int32(page_size, "topk", "page_size")
    rows_per_request = _int32(rows_per_request, "topk", "rows_per_request")
    _check_arrays("topk", [("logits", logits), ("lengths", lengths), ("row_starts", row_starts),
                           ("position_offsets", position_offsets), ("block_table", block_table),
                           ("request_offsets", request_offsets)],
                  [("out", out), ("workspace", workspace)])
    if out is None:
        out = new_topk_indices(logits, k)
    ctx = make_context(logits, **execution)
    if workspace is None:
        nbytes = _core.topk_workspace_bytes(_extent(logits, 0), _extent(logits, 1), k, ctx)
        workspace = fw.workspace(logits, nbytes)
    _core.topk(fw.export(logits), fw.export(lengths), k, fw.export(out), bool(sorted),
               fw.export(row_starts), fw.export(position_offsets), fw.export(block_table),
               page_size, rows_per_request, fw.export(request_offsets), ctx,
               fw.export(workspace))
    return out


def _index_topk_options(k, sorted, physical_slots, path, strategy, page_size=0,
                        key_format="auto"):
    options = _core.IndexTopkOptions()
    options.k = _int32(k, "index_topk", "k")
    options.sorted = bool(sorted)
    options.physical_slots = bool(physical_slots)
    options.path = _choice(_PATHS, path, "path")
    options.strategy = _choice(_STRATEGIES, strategy, "strategy")
    options.page_size = _int32(page_size, "index_topk", "page_size")
    options.key_format = _choice(_KEY_FORMATS, key_format, "key_format")
    return options


def index_topk(q, key_cache, weights, context_lens, block_table, max_context_len, k=MAX_TOPK,
               schedule=None, topk_lens=None, *, sorted=False, physical_slots=False, path="auto",
               strategy="auto", page_size=0, key_format="auto", q_block_scales=None,
               request_offsets=None, out=None, workspace=None, **execution):
    max_context_len = _int64(max_context_len, "index_topk", "max_context_len")
    options = _index_topk_options(k, sorted, physical_slots, path, strategy, page_size, key_format)
    _check_arrays("index_topk", _scoring_inputs(q, key_cache, weights, context_lens, block_table,
                                                schedule, q_block_scales, request_offsets)
                  + [("topk_lens", topk_lens)],
                  [("out", out), ("workspace", workspace)])
    schedule = _scoring_schedule(q, context_lens, schedule, path, request_offsets, execution)
    if out is None:
        out = new_index_topk_indices(q, options.k, request_offsets)
    ctx = make_context(q, **execution)
    if workspace is None:
        nbytes = _core.index_topk_workspace_bytes(_rows(q, request_offsets), max_context_len,
                                                  options, ctx)
        workspace = fw.workspace(q, nbytes)
    _core.index_topk(fw.export(q), fw.export(key_cache), fw.export(weights),
                     fw.export(context_lens), fw.export(block_table), fw.export(schedule),
                     max_context_len, fw.export(topk_lens), fw.export(out), options,
                     fw.export(q_block_scales), fw.export(request_offsets), ctx,
                     fw.export(workspace))
    return out


def read_device_error(workspace, *, like=None, **execution):
    """Synchronizes the stream and raises the first data-dependent error that the last CUDA
    operation given this `workspace` recorded (its own arrays' device and stream)."""
    _check_arrays("read_device_error", [("workspace", workspace), ("like", like)])
    ctx = make_context(workspace if like is None else like, **execution)
    _core.read_device_error(ctx, fw.export(workspace))


def workspace_bytes(operation, like, *, rows=0, max_length=0, k=MAX_TOPK, sorted=False,
                    physical_slots=False, path="auto", strategy="auto", **execution):
    """Bytes of workspace `operation` needs (add workspace_alignment() when allocating a
    buffer whose start may not be aligned)."""
    ctx = make_context(like, **execution)
    rows = _int64(rows, "workspace_bytes", "rows")
    max_length = _int64(max_length, "workspace_bytes", "max_length")
    if operation == "topk":
        return _core.topk_workspace_bytes(rows, max_length, _int32(k, "workspace_bytes", "k"), ctx)
    if operation == "index_topk":
        options = _index_topk_options(k, sorted, physical_slots, path, strategy)
        return _core.index_topk_workspace_bytes(rows, max_length, options, ctx)
    if operation == "store_index_keys":
        return _core.store_index_keys_workspace_bytes(ctx)
    if operation in ("quantize_queries", "quantize_queries_fp4"):
        return _core.quantize_queries_workspace_bytes(ctx)
    if operation == "mqa_logits":
        return _core.mqa_logits_workspace_bytes(ctx)
    return _core.paged_mqa_logits_workspace_bytes(ctx)
