// The tensors of one index-selection step and the library calls on them, in
// host memory or on a CUDA device.
#pragma once

#include <cstdint>

#include "buffer.hpp"
#include "dsa/dsa.hpp"
#include "workload.hpp"

namespace dsa_cli {

class Pipeline {
 public:
  // Allocates every tensor of the step on `device` and uploads the layout
  // (prefix lengths, block table, slot mapping). `num_workers` sizes the
  // schedule; `k` the index outputs.
  static dsa::Status create(const WorkloadShape& shape, const WorkloadLayout& layout,
                            dsa::Device device, int num_workers, int k, Pipeline* out);

  // Uploads bf16 keys (host memory, [num_tokens, D]) and queries / head gate.
  dsa::Status upload_keys(const HostInputs& inputs);
  dsa::Status upload_queries(const HostInputs& inputs);

  // The library calls, in pipeline order. `cache` is the key cache to read
  // (cache_view() or a copy of it with the same layout).
  dsa::Status run_store_keys(const dsa::ExecContext& ctx) const;
  dsa::Status run_quantize(const dsa::ExecContext& ctx) const;
  dsa::Status run_lengths(const dsa::ExecContext& ctx) const;
  dsa::Status run_plan(dsa::LogitsPath path, const Buffer& schedule, const dsa::ExecContext& ctx) const;
  // run_lengths then run_plan as one operation (context_lens_and_schedule).
  dsa::Status run_lengths_and_plan(dsa::LogitsPath path, const Buffer& schedule, const dsa::ExecContext& ctx) const;
  dsa::Status run_logits(dsa::LogitsPath path, const Buffer& schedule, const dsa::TensorView& cache,
                     const dsa::ExecContext& ctx) const;
  // Top-k of `logits` (logits_view() or a copy of it) into `indices`, as
  // positions or (physical_slots) as the cache slots sparse attention reads.
  dsa::Status run_topk(const dsa::TensorView& logits, const dsa::ExecContext& ctx,
                       bool physical_slots = false) const;
  dsa::Status run_index_topk(dsa::LogitsPath path, const Buffer& schedule, const dsa::TensorView& cache,
                             dsa::IndexTopkStrategy strategy, const dsa::ExecContext& ctx) const;

  // Largest workspace any of the calls needs under `ctx` (0 on the CPU).
  std::size_t workspace_bytes(const dsa::ExecContext& ctx) const;

  dsa::TensorView cache_view() const { return cache_view_of(cache); }
  dsa::TensorView cache_view_of(const Buffer& memory) const;
  // fp8 queries [B, next_n, H, D], or fp4 codes [B, next_n, H, D / 2] with
  // their block scales q_block_scales_view() (empty for fp8).
  dsa::TensorView q_view() const;
  dsa::TensorView q_block_scales_view() const;
  dsa::TensorView weights_view() const;
  dsa::TensorView context_lens_view() const;
  dsa::TensorView block_table_view() const;
  dsa::TensorView logits_view() const { return logits_view_of(logits); }
  dsa::TensorView logits_view_of(const Buffer& memory) const;
  // context_lens as [B * next_n]: the top-k lengths of the causal convention.
  dsa::TensorView row_lengths_view() const;

  const WorkloadShape& shape() const { return shape_; }
  std::int64_t max_context_len() const { return max_context_len_; }
  std::int64_t logits_stride() const { return logits_stride_; }

  Buffer keys, slots, cache, queries, head_gate, q_codes, q_scales, weights;
  Buffer prefix_lens, context_lens, block_table, schedule, logits, indices, fused_indices;

 private:
  WorkloadShape shape_;
  std::int64_t num_tokens_ = 0;
  std::int64_t num_pages_ = 0;
  std::int64_t max_blocks_ = 0;
  std::int64_t max_context_len_ = 0;
  std::int64_t logits_stride_ = 0;
  int num_workers_ = 1;
  int k_ = dsa::kMaxTopk;
};

}  // namespace dsa_cli
