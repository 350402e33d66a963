"""dsa_indexer: index selection for DeepSeek Sparse Attention.

The lightning indexer's paged MQA logits (and prefill MQA logits over a contiguous
key run), exact top-k and their fused form,
plus the cache store, query quantization, context-length builders and the
work schedule, for NumPy (CPU backend), PyTorch and CuPy arrays on the CPU or
a CUDA device. See dsa_indexer.ops for the conventions every function shares,
dsa_indexer.compat.deep_gemm and dsa_indexer.compat.sgl_kernel for entry points
compatible with DeepGEMM's and sgl-kernel's, and dsa_indexer.integration for
serving-engine helpers. PAGE_TOKENS (64) is the default page size of the key cache,
PAGE_SIZES the page sizes served (32 and 64). With PyTorch installed the
operations are also torch.ops.dsa_indexer.* custom operators.
"""

from . import _core
from .ops import (
    CHUNK_TOKENS,
    MAX_CPU_THREADS,
    MAX_TOPK,
    PAGE_SIZES,
    PAGE_TOKENS,
    causal_context_lens,
    context_lens,
    context_lens_and_schedule,
    default_num_workers,
    expanded_context_lens,
    index_topk,
    legacy_context_lens,
    make_context,
    mqa_logits,
    paged_mqa_logits,
    plan_schedule,
    quantize_queries,
    quantize_queries_fp4,
    read_device_error,
    plan_mqa_logits_chunks,
    resolve_logits_path,
    store_index_keys,
    topk,
    workspace_bytes,
)

built_with_cuda = _core.built_with_cuda
cuda_device_count = _core.cuda_device_count
device_info = _core.device_info

__version__ = "0.1.0"

__all__ = [
    "CHUNK_TOKENS",
    "MAX_CPU_THREADS",
    "MAX_TOPK",
    "PAGE_SIZES",
    "PAGE_TOKENS",
    "built_with_cuda",
    "causal_context_lens",
    "context_lens",
    "context_lens_and_schedule",
    "cuda_device_count",
    "default_num_workers",
    "device_info",
    "expanded_context_lens",
    "index_topk",
    "legacy_context_lens",
    "make_context",
    "mqa_logits",
    "paged_mqa_logits",
    "plan_schedule",
    "quantize_queries",
    "quantize_queries_fp4",
    "read_device_error",
    "plan_mqa_logits_chunks",
    "resolve_logits_path",
    "store_index_keys",
    "topk",
    "workspace_bytes",
]
