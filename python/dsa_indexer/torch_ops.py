"""PyTorch custom operators: torch.ops.dsa_indexer.*.

Registered when PyTorch is installed, with fake implementations so that torch.compile
traces them into its graphs; the dsa_indexer functions call them, through the functions of
the same names here, while torch.compile traces. Operator NAME runs dsa_indexer._eager.NAME
and its schema is derived from that function's signature: the arguments without a default
are positional, the others (the execution keywords included) keyword-only with the same
defaults. So every keyword a dsa_indexer function takes reaches the library under
torch.compile as it does eagerly, and a keyword added to a function without a schema type
here fails at import, not silently. The default overload returns new tensors. A call
with out= goes to the `out` overload, which writes the caller's arrays and returns nothing
(an operator's returned tensors may not alias its inputs); there the argument is named
`output`, because torch.compile refuses a non-contiguous operator argument named `out`,
as a row-strided logits output is. `cache`, `output` and `workspace` are declared as
written. A caller's workspace goes to the `workspace` (or `out_workspace`) overload, where
it is a required argument: Inductor cannot lower an optional written argument left None,
so the overloads without it have no workspace argument at all.

The operators allocate only through PyTorch and synchronize the host only when
check_device_errors asks for it, so they can be captured in CUDA graphs; they run on the
current stream of the inputs' device unless given `stream`.
"""

import inspect
import json

from . import _eager

try:
    import torch
except ImportError:  # NumPy-only installations
    torch = None

# Schema types of the eager functions' arguments by name ("?" is added where the default is
# None); the arguments the library writes carry an alias annotation.
_TYPES = {
    **dict.fromkeys(("keys", "slot_mapping", "q", "head_gate", "lens", "context_lens",
                     "key_cache", "weights", "block_table", "schedule", "topk_lens", "logits",
                     "lengths", "row_starts", "position_offsets", "request_offsets", "key_scales",
                     "ks", "ke", "q_block_scales"), "Tensor"),
    "cache": "Tensor(c!)",
    "workspace": "Tensor(w!)",
    **dict.fromkeys(("next_n", "num_workers", "max_context_len", "k", "rows_per_request",
                     "page_size", "stream", "num_threads", "max_seqlen_k", "total_rows"), "int"),
    "weight_scale": "float",
    **dict.fromkeys(("power_of_two_scales", "clean_logits", "sorted", "physical_slots",
                     "reference_float64", "check_device_errors", "pdl", "compressed"), "bool"),
    **dict.fromkeys(("convention", "path", "out_dtype", "strategy", "backend", "key_format"), "str"),
}


def _schema(function, output=None, workspace=False):
    """The argument list of the operator that runs `function`; `output` is the schema type
    of the out overloads' `output` (None: the overloads without it); `workspace` whether
    the caller's workspace is a (required) argument."""
    execution = list(inspect.signature(_eager.make_context).parameters.values())[1:]
    parameters = [p for p in inspect.signature(function).parameters.values()
                  if p.kind is not p.VAR_KEYWORD and p.name not in ("out", "workspace")]
    positional = [f"{_TYPES[p.name]} {p.name}" for p in parameters if p.default is p.empty]
    keywords = [f"{output} output"] if output else []
    if workspace:
        keywords.append(f"{_TYPES['workspace']} workspace")
    for p in parameters + execution:
        if p.default is not p.empty:
            optional = "?" if p.default is None else ""
            default = json.dumps(p.default) if isinstance(p.default, str) else repr(p.default)
            keywords.append(f"{_TYPES[p.name]}{optional} {p.name}={default}")
    return f"({', '.join(positional + ['*'] + keywords)})"


def _define(name, returns, fake, output=None):
    """Defines operator `name` (returning `returns`) and, with `output` (the schema type of
    the `out` it writes), its out overload. `fake` takes the eager function's arguments, defaults
    applied, and returns new outputs shaped as the eager function allocates them. Returns
    the function that calls the operator as dsa_indexer.ops calls _eager.`name`."""
    function = getattr(_eager, name)
    signature = inspect.signature(function)
    qualname = f"dsa_indexer::{name}"

    def run_for_effect(*args, **kwargs):
        function(*args, **kwargs)

    def run_into_output(*args, output, **kwargs):
        function(*args, out=output, **kwargs)

    def bound_fake(*args, **kwargs):
        # The dispatcher passes keyword-only arguments only where they differ from the default.
        arguments = signature.bind(*args, **kwargs)
        arguments.apply_defaults()
        return fake(**arguments.arguments)

    for overload, with_workspace in (("", False), (".workspace", True)):
        torch.library.define(qualname + overload,
                             f"{_schema(function, workspace=with_workspace)} -> {returns}")
        torch.library.register_kernel(qualname + overload, None,
                                      run_for_effect if returns == "()" else function)
        torch.library.register_fake(qualname + overload, bound_fake)
        if output:
            name_out = f"{qualname}.out{'_workspace' if with_workspace else ''}"
            torch.library.define(name_out, f"{_schema(function, output, with_workspace)} -> ()")
            torch.library.register_kernel(name_out, None, run_into_output)
            torch.library.register_fake(name_out, lambda *args, **kwargs: None)
    operator = getattr(torch.ops.dsa_indexer, name)

    def call(*args, out=None, workspace=None, **kwargs):
        if workspace is not None:
            kwargs["workspace"] = workspace
        if out is None:
            return (operator.default if workspace is None else operator.workspace)(*args, **kwargs)
        (operator.out if workspace is None else operator.out_workspace)(*args, output=out, **kwargs)
        return out

    return call


if torch is None:

    def is_compiling():
        return False

else:
    is_compiling = torch.compiler.is_compiling

    def _quantized_fake(q, **_):
        return _eager.new_quantized(q)

    def _quantized_fp4_fake(q, **_):
        return _eager.new_quantized_fp4(q)

    def _context_lens_fake(lens, next_n, request_offsets, total_rows, **_):
        if request_offsets is not None and total_rows is not None:
            return _eager.new_row_context_lens(lens, total_rows)
        return _eager.new_context_lens(lens, next_n)

    def _schedule_fake(context_lens, num_workers, execution, **_):
        ctx = _eager.make_context(context_lens, **execution)
        return _eager.new_schedule(context_lens,
                                   _eager.schedule_workers(context_lens, num_workers, ctx))

    def _lengths_and_schedule_fake(lens, next_n, convention, num_workers, request_offsets,
                                   total_rows, execution, **_):
        ctx = _eager.make_context(lens, **execution)
        return _eager.new_lengths_and_schedule(lens, next_n, convention, num_workers,
                                               request_offsets, total_rows, ctx)

    def _logits_fake(q, max_context_len, out_dtype, request_offsets, **_):
        return _eager.new_logits(q, max_context_len, out_dtype, request_offsets)

    def _mqa_logits_fake(q, keys, compressed, max_seqlen_k, out_dtype, **_):
        return _eager.new_mqa_logits(q, keys, compressed, max_seqlen_k, out_dtype)

    def _topk_fake(logits, k, **_):
        return _eager.new_topk_indices(logits, k)

    def _index_topk_fake(q, k, request_offsets, **_):
        return _eager.new_index_topk_indices(q, k, request_offsets)

    store_index_keys = _define("store_index_keys", "()", lambda **_: None)
    quantize_queries = _define("quantize_queries", "(Tensor, Tensor)", _quantized_fake,
                               output="Tensor(o!)[]")
    quantize_queries_fp4 = _define("quantize_queries_fp4", "(Tensor, Tensor, Tensor)",
                                   _quantized_fp4_fake, output="Tensor(o!)[]")
    context_lens = _define("context_lens", "Tensor", _context_lens_fake, output="Tensor(o!)")
    plan_schedule = _define("plan_schedule", "Tensor", _schedule_fake, output="Tensor(o!)")
    context_lens_and_schedule = _define("context_lens_and_schedule", "(Tensor, Tensor)",
                                        _lengths_and_schedule_fake, output="Tensor(o!)[]")
    paged_mqa_logits = _define("paged_mqa_logits", "Tensor", _logits_fake, output="Tensor(o!)")
    mqa_logits = _define("mqa_logits", "Tensor", _mqa_logits_fake, output="Tensor(o!)")
    topk = _define("topk", "Tensor", _topk_fake, output="Tensor(o!)")
    index_topk = _define("index_topk", "Tensor", _index_topk_fake, output="Tensor(o!)")
