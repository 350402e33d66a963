#include "pipeline.hpp"

#include <algorithm>

namespace dsa_cli {
namespace {

// Logits rows start on 256-byte boundaries, as engines usually lay them out.
constexpr std::int64_t kLogitsRowAlignment = 64;

}  // namespace

dsa::Status Pipeline::create(const WorkloadShape& shape, const WorkloadLayout& layout,
                             dsa::Device device, int num_workers, int k, Pipeline* out) {
  Pipeline p;
  p.shape_ = shape;
  p.num_tokens_ = layout.num_tokens();
  p.num_pages_ = layout.num_pages;
  p.max_blocks_ = std::max<std::int64_t>(layout.max_blocks, 1);
  p.max_context_len_ = layout.max_context_len;
  p.logits_stride_ = std::max<std::int64_t>(
      (layout.max_context_len + kLogitsRowAlignment - 1) / kLogitsRowAlignment * kLogitsRowAlignment,
      kLogitsRowAlignment);
  p.num_workers_ = num_workers;
  p.k_ = k;

  const auto bytes = [](std::int64_t count, dsa::DType dtype) {
    return static_cast<std::size_t>(count) * dsa::dtype_size(dtype);
  };
  const std::int64_t rows = shape.rows();
  const std::int64_t query_values = rows * shape.heads * shape.head_dim;
  using dsa::DType;
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(p.num_tokens_ * shape.head_dim, DType::bfloat16), device, &p.keys));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(p.num_tokens_, DType::int32), device, &p.slots));
  DSA_RETURN_IF_ERROR(Buffer::allocate(static_cast<std::size_t>(layout.cache_bytes(shape)), device, &p.cache));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(query_values, DType::bfloat16), device, &p.queries));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows * shape.heads, DType::bfloat16), device, &p.head_gate));
  // fp8: a byte a value; fp4: a byte per two values, plus a scale word per (row, head).
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(shape.fp4_queries() ? query_values / 2 : query_values, DType::uint8), device,
                                       &p.q_codes));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(shape.fp4_queries() ? rows * shape.heads : 0, DType::int32), device, &p.q_scales));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows * shape.heads, DType::float32), device, &p.weights));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(shape.batch, DType::int32), device, &p.prefix_lens));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows, DType::int32), device, &p.context_lens));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(shape.batch * p.max_blocks_, DType::int32), device, &p.block_table));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(2 * (num_workers + 1), DType::int32), device, &p.schedule));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows * p.logits_stride_, DType::float32), device, &p.logits));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows * k, DType::int32), device, &p.indices));
  DSA_RETURN_IF_ERROR(Buffer::allocate(bytes(rows * k, DType::int32), device, &p.fused_indices));

  DSA_RETURN_IF_ERROR(p.prefix_lens.upload(layout.prefix_lens.data(), p.prefix_lens.bytes()));
  DSA_RETURN_IF_ERROR(p.slots.upload(layout.slot_mapping.data(), p.slots.bytes()));
  if (!layout.block_table.empty()) {
    DSA_RETURN_IF_ERROR(p.block_table.upload(layout.block_table.data(), p.block_table.bytes()));
  }
  *out = std::move(p);
  return {};
}

dsa::Status Pipeline::upload_keys(const HostInputs& inputs) {
  return keys.upload(inputs.keys.data(), inputs.keys.size() * sizeof(std::uint16_t));
}

dsa::Status Pipeline::upload_queries(const HostInputs& inputs) {
  DSA_RETURN_IF_ERROR(queries.upload(inputs.queries.data(), inputs.queries.size() * sizeof(std::uint16_t)));
  return head_gate.upload(inputs.head_gate.data(), inputs.head_gate.size() * sizeof(std::uint16_t));
}

// The 2-D view: the calls give the page size in their options.
dsa::TensorView Pipeline::cache_view_of(const Buffer& memory) const {
  return memory.view(dsa::DType::uint8, {num_pages_, shape_.cache_layout().min_page_bytes()});
}

dsa::TensorView Pipeline::q_view() const {
  if (shape_.fp4_queries()) {
    return q_codes.view(dsa::DType::uint8, {shape_.batch, shape_.next_n, shape_.heads, shape_.head_dim / 2});
  }
  return q_codes.view(dsa::DType::float8_e4m3, {shape_.batch, shape_.next_n, shape_.heads, shape_.head_dim});
}

dsa::TensorView Pipeline::q_block_scales_view() const {
  if (!shape_.fp4_queries()) return {};
  return q_scales.view(dsa::DType::int32, {shape_.batch, shape_.next_n, shape_.heads});
}

dsa::TensorView Pipeline::weights_view() const {
  return weights.view(dsa::DType::float32, {shape_.rows(), shape_.heads});
}

dsa::TensorView Pipeline::context_lens_view() const {
  return context_lens.view(dsa::DType::int32, {shape_.batch, shape_.next_n});
}

dsa::TensorView Pipeline::row_lengths_view() const {
  return context_lens.view(dsa::DType::int32, {shape_.rows()});
}

dsa::TensorView Pipeline::block_table_view() const {
  return block_table.view(dsa::DType::int32, {shape_.batch, max_blocks_});
}

dsa::TensorView Pipeline::logits_view_of(const Buffer& memory) const {
  return dsa::make_view(memory.data(), dsa::DType::float32, {shape_.rows(), max_context_len_},
                        {logits_stride_, 1}, memory.device());
}

dsa::Status Pipeline::run_store_keys(const dsa::ExecContext& ctx) const {
  dsa::StoreKeysOptions options;
  options.page_size = shape_.page_tokens;
  options.key_format = shape_.key_format;
  return dsa::store_index_keys(keys.view(dsa::DType::bfloat16, {num_tokens_, shape_.head_dim}),
                               slots.view(dsa::DType::int32, {num_tokens_}), cache_view(), options, ctx);
}

dsa::Status Pipeline::run_quantize(const dsa::ExecContext& ctx) const {
  const dsa::TensorView q =
      queries.view(dsa::DType::bfloat16, {shape_.batch, shape_.next_n, shape_.heads, shape_.head_dim});
  const dsa::TensorView gate = head_gate.view(dsa::DType::bfloat16, {shape_.rows(), shape_.heads});
  if (shape_.fp4_queries()) return dsa::quantize_queries_fp4(q, gate, q_view(), q_block_scales_view(), weights_view(), {}, ctx);
  return dsa::quantize_queries(q, gate, q_view(), weights_view(), {}, ctx);
}

dsa::Status Pipeline::run_lengths(const dsa::ExecContext& ctx) const {
  return dsa::causal_context_lens(prefix_lens.view(dsa::DType::int32, {shape_.batch}), shape_.next_n,
                                  context_lens_view(), ctx);
}

dsa::Status Pipeline::run_plan(dsa::LogitsPath path, const Buffer& schedule_memory,
                           const dsa::ExecContext& ctx) const {
  return dsa::plan_schedule(context_lens_view(), num_workers_, path,
                            schedule_memory.view(dsa::DType::int32, {num_workers_ + 1, 2}), ctx);
}

dsa::Status Pipeline::run_lengths_and_plan(dsa::LogitsPath path, const Buffer& schedule_memory,
                                       const dsa::ExecContext& ctx) const {
  return dsa::context_lens_and_schedule(dsa::LengthConvention::causal, prefix_lens.view(dsa::DType::int32, {shape_.batch}),
                                        shape_.next_n, context_lens_view(), num_workers_, path,
                                        schedule_memory.view(dsa::DType::int32, {num_workers_ + 1, 2}), ctx);
}

dsa::Status Pipeline::run_logits(dsa::LogitsPath path, const Buffer& schedule_memory, const dsa::TensorView& cache_in,
                             const dsa::ExecContext& ctx) const {
  dsa::LogitsOptions options;
  options.path = path;
  options.page_size = shape_.page_tokens;
  options.key_format = shape_.key_format;
  options.q_block_scales = q_block_scales_view();
  return dsa::paged_mqa_logits(q_view(), cache_in, weights_view(), context_lens_view(), block_table_view(),
                               schedule_memory.view(dsa::DType::int32, {num_workers_ + 1, 2}), max_context_len_,
                               logits_view(), options, ctx);
}

dsa::Status Pipeline::run_topk(const dsa::TensorView& logits_in, const dsa::ExecContext& ctx,
                               bool physical_slots) const {
  dsa::TopkOptions options;
  if (physical_slots) {
    options.block_table = block_table_view();
    options.rows_per_request = static_cast<int>(shape_.next_n);
  }
  return dsa::topk(logits_in, row_lengths_view(), k_, indices.view(dsa::DType::int32, {shape_.rows(), k_}),
                   options, ctx);
}

dsa::Status Pipeline::run_index_topk(dsa::LogitsPath path, const Buffer& schedule_memory,
                                     const dsa::TensorView& cache_in, dsa::IndexTopkStrategy strategy,
                                     const dsa::ExecContext& ctx) const {
  dsa::IndexTopkOptions options;
  options.k = k_;
  options.path = path;
  options.strategy = strategy;
  options.page_size = shape_.page_tokens;
  options.key_format = shape_.key_format;
  options.q_block_scales = q_block_scales_view();
  return dsa::index_topk(q_view(), cache_in, weights_view(), context_lens_view(), block_table_view(),
                         schedule_memory.view(dsa::DType::int32, {num_workers_ + 1, 2}), max_context_len_,
                         dsa::TensorView{}, fused_indices.view(dsa::DType::int32, {shape_.rows(), k_}), options,
                         ctx);
}

std::size_t Pipeline::workspace_bytes(const dsa::ExecContext& ctx) const {
  dsa::IndexTopkOptions staged;
  staged.k = k_;
  staged.strategy = dsa::IndexTopkStrategy::logits_then_topk;
  dsa::IndexTopkOptions fused = staged;
  fused.strategy = dsa::IndexTopkStrategy::fused;
  return std::max({dsa::store_index_keys_workspace_bytes(ctx), dsa::quantize_queries_workspace_bytes(ctx),
                   dsa::paged_mqa_logits_workspace_bytes(ctx),
                   dsa::topk_workspace_bytes(shape_.rows(), max_context_len_, k_, ctx),
                   dsa::index_topk_workspace_bytes(shape_.rows(), max_context_len_, staged, ctx),
                   dsa::index_topk_workspace_bytes(shape_.rows(), max_context_len_, fused, ctx)});
}

}  // namespace dsa_cli
