"""PyTorch custom operators: torch.ops.dsa_indexer.*.

Registered when PyTorch is installed, with fake (meta) implementations so that
torch.compile traces them into its graphs; the dsa_indexer functions dispatch
here while torch.compile traces. The operators allocate only through PyTorch
and never synchronize the host, so they can be captured in CUDA graphs; they
run on the current stream of the inputs' device.
"""

from typing import Optional, Tuple

from . import ops

try:
    import torch
except ImportError:  # NumPy-only installations
    torch = None


def _not_registered(*args, **kwargs):
    raise RuntimeError("the dsa_indexer custom operators need PyTorch")


store_index_keys = quantize_queries = context_lens = plan_schedule = _not_registered
paged_mqa_logits = topk = index_topk = _not_registered

if torch is None:

    def is_compiling():
        return False

else:
    is_compiling = torch.compiler.is_compiling

    def _fake_num_workers(context_lens, num_workers, backend):
        return num_workers if num_workers > 0 else ops.default_num_workers(context_lens,
                                                                           backend=backend)

    @torch.library.custom_op("dsa_indexer::store_index_keys", mutates_args=("cache",))
    def store_index_keys(keys: torch.Tensor, slot_mapping: torch.Tensor, cache: torch.Tensor,
                         power_of_two_scales: bool = False, backend: str = "auto") -> None:
        ops.store_index_keys(keys, slot_mapping, cache, power_of_two_scales=power_of_two_scales,
                             backend=backend)

    @store_index_keys.register_fake
    def _(keys, slot_mapping, cache, power_of_two_scales=False, backend="auto"):
        return None

    @torch.library.custom_op("dsa_indexer::quantize_queries", mutates_args=())
    def quantize_queries(q: torch.Tensor, head_gate: torch.Tensor,
                         power_of_two_scales: bool = False, weight_scale: float = 0.0,
                         backend: str = "auto") -> Tuple[torch.Tensor, torch.Tensor]:
        out = (torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device),
               torch.empty((q.shape[0] * q.shape[1], q.shape[2]), dtype=torch.float32,
                           device=q.device))
        return ops.quantize_queries(q, head_gate, power_of_two_scales=power_of_two_scales,
                                    weight_scale=weight_scale, out=out, backend=backend)

    @quantize_queries.register_fake
    def _(q, head_gate, power_of_two_scales=False, weight_scale=0.0, backend="auto"):
        return (q.new_empty(q.shape, dtype=torch.float8_e4m3fn),
                q.new_empty((q.shape[0] * q.shape[1], q.shape[2]), dtype=torch.float32))

    @torch.library.custom_op("dsa_indexer::context_lens", mutates_args=())
    def context_lens(lens: torch.Tensor, next_n: int, convention: str = "causal",
                     backend: str = "auto") -> torch.Tensor:
        out = torch.empty((lens.shape[0], next_n), dtype=torch.int32, device=lens.device)
        return ops.context_lens(lens, next_n, convention, out=out, backend=backend)

    @context_lens.register_fake
    def _(lens, next_n, convention="causal", backend="auto"):
        return lens.new_empty((lens.shape[0], next_n), dtype=torch.int32)

    @torch.library.custom_op("dsa_indexer::plan_schedule", mutates_args=())
    def plan_schedule(context_lens: torch.Tensor, num_workers: int = 0, path: str = "auto",
                      backend: str = "auto") -> torch.Tensor:
        workers = _fake_num_workers(context_lens, num_workers, backend)
        out = torch.empty((workers + 1, 2), dtype=torch.int32, device=context_lens.device)
        return ops.plan_schedule(context_lens, workers, path, out=out, backend=backend)

    @plan_schedule.register_fake
    def _(context_lens, num_workers=0, path="auto", backend="auto"):
        workers = _fake_num_workers(context_lens, num_workers, backend)
        return context_lens.new_empty((workers + 1, 2), dtype=torch.int32)

    @torch.library.custom_op("dsa_indexer::paged_mqa_logits", mutates_args=())
    def paged_mqa_logits(q: torch.Tensor, key_cache: torch.Tensor, weights: torch.Tensor,
                         context_lens: torch.Tensor, block_table: torch.Tensor,
                         schedule: Optional[torch.Tensor], max_context_len: int,
                         clean_logits: bool = False, path: str = "auto",
                         backend: str = "auto") -> torch.Tensor:
        out = torch.empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32,
                          device=q.device)
        return ops.paged_mqa_logits(q, key_cache, weights, context_lens, block_table,
                                    max_context_len, schedule, clean_logits=clean_logits,
                                    path=path, out=out, backend=backend)

    @paged_mqa_logits.register_fake
    def _(q, key_cache, weights, context_lens, block_table, schedule, max_context_len,
          clean_logits=False, path="auto", backend="auto"):
        return q.new_empty((q.shape[0] * q.shape[1], max_context_len), dtype=torch.float32)

    @torch.library.custom_op("dsa_indexer::topk", mutates_args=())
    def topk(logits: torch.Tensor, lengths: torch.Tensor, k: int, sorted: bool = False,
             block_table: Optional[torch.Tensor] = None, rows_per_request: int = 1,
             backend: str = "auto") -> torch.Tensor:
        out = torch.empty((logits.shape[0], k), dtype=torch.int32, device=logits.device)
        return ops.topk(logits, lengths, k, sorted=sorted, block_table=block_table,
                        rows_per_request=rows_per_request, out=out, backend=backend)

    @topk.register_fake
    def _(logits, lengths, k, sorted=False, block_table=None, rows_per_request=1,
          backend="auto"):
        return logits.new_empty((logits.shape[0], k), dtype=torch.int32)

    @torch.library.custom_op("dsa_indexer::index_topk", mutates_args=())
    def index_topk(q: torch.Tensor, key_cache: torch.Tensor, weights: torch.Tensor,
                   context_lens: torch.Tensor, block_table: torch.Tensor,
                   schedule: Optional[torch.Tensor], max_context_len: int,
                   topk_lens: Optional[torch.Tensor] = None, k: int = ops.MAX_TOPK,
                   sorted: bool = False, physical_slots: bool = False, path: str = "auto",
                   strategy: str = "auto", backend: str = "auto") -> torch.Tensor:
        out = torch.empty((q.shape[0] * q.shape[1], k), dtype=torch.int32, device=q.device)
        return ops.index_topk(q, key_cache, weights, context_lens, block_table, max_context_len,
                              k, schedule, topk_lens, sorted=sorted,
                              physical_slots=physical_slots, path=path, strategy=strategy,
                              out=out, backend=backend)

    @index_topk.register_fake
    def _(q, key_cache, weights, context_lens, block_table, schedule, max_context_len,
          topk_lens=None, k=ops.MAX_TOPK, sorted=False, physical_slots=False, path="auto",
          strategy="auto", backend="auto"):
        return q.new_empty((q.shape[0] * q.shape[1], k), dtype=torch.int32)
