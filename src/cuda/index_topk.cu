// index_topk on CUDA: the choice between the strategies, and the staged one.
//
// logits_then_topk: the logits of every row are staged in the workspace, then
// selected by the top-k kernels. Workspace: [error record][staged logits]
// [top-k lengths]. The top-k kernels record into the same record, where the
// first violation (the scoring's, when it found one) stays.
//
// fused (Hopper): fused/fused_index_topk.hpp.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend.hpp"
#include "cuda/fused/fused_index_topk.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/index_topk_selection.cuh"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda {

namespace {

constexpr int kLengthThreads = 256;

// Row stride of the staged logits: whole 64-float groups, so that every row
// starts 256-byte aligned.
std::int64_t staged_logits_stride(std::int64_t max_context_len) {
  return std::max<std::int64_t>((max_context_len + 63) / 64 * 64, 64);
}

struct WorkspacePlan {
  std::size_t logits_offset = 0;  // from the workspace start
  std::int64_t logits_stride = 0;
  std::size_t lengths_offset = 0;
  std::size_t total = 0;
};

WorkspacePlan plan_workspace(std::int64_t rows, std::int64_t max_context_len) {
  WorkspacePlan plan;
  plan.logits_offset = kDeviceErrorRecordBytes;
  plan.logits_stride = staged_logits_stride(max_context_len);
  const auto logits_bytes = static_cast<std::size_t>(rows * plan.logits_stride) * sizeof(float);
  plan.lengths_offset = plan.logits_offset + align_workspace(logits_bytes);
  plan.total =
      plan.lengths_offset + align_workspace(static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  return plan;
}

__global__ void topk_lengths_kernel(LogitsProblem p, const std::int32_t* topk_lens,
                                    std::int64_t topk_lens_stride, std::int32_t* out,
                                    DeviceErrorRecord* record) {
  enter_dependent_grid();
  const std::int64_t rows = p.batch * p.next_n;
  for (std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += std::int64_t{gridDim.x} * blockDim.x) {
    out[row] = selection_length(p, topk_lens, topk_lens_stride, row, record);
  }
}

Status launch_topk_lengths(const IndexTopkProblem& p, std::int32_t* lengths, const ExecContext& ctx) {
  const std::int64_t rows = p.logits.rows();
  if (rows == 0) return Status::success();
  return launch_kernel("topk_lengths_kernel", topk_lengths_kernel, {grid_for(rows, kLengthThreads), kLengthThreads},
                       ctx, p.logits, p.topk_lens, p.topk_lens_stride, lengths, error_record(ctx));
}

}  // namespace

std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len, bool fused,
                                       int workers, int rows_per_unit) {
  if (fused) return fused_index_topk_workspace_bytes(rows, max_context_len, workers, rows_per_unit);
  return plan_workspace(rows, max_context_len).total;
}

Status index_topk(const IndexTopkProblem& p, bool hopper, const ExecContext& ctx) {
  // The public API checked the workspace against index_topk_workspace_bytes
  // and that the fused strategy runs on the Hopper kernels only.
  if (p.fused) return fused_index_topk(p, ctx);
  const std::int64_t rows = p.logits.rows();
  const WorkspacePlan plan = plan_workspace(rows, p.logits.max_context_len);
  unsigned char* workspace = static_cast<unsigned char*>(ctx.workspace.data);

  // The scoring writes into the staged buffer.
  LogitsProblem scoring = p.logits;
  scoring.logits = workspace + plan.logits_offset;
  scoring.logits_dtype = DType::float32;
  scoring.logits_stride = plan.logits_stride;
  scoring.clean_logits = false;
  auto* lengths = reinterpret_cast<std::int32_t*>(workspace + plan.lengths_offset);
  DSA_RETURN_IF_ERROR(launch_topk_lengths(p, lengths, ctx));
  DSA_RETURN_IF_ERROR(paged_mqa_logits(scoring, hopper, ctx));

  const TopkProblem select = selection_problem(p, lengths, scoring.logits, scoring.logits_stride);
  return topk(select, ctx);
}

}  // namespace dsa::detail::cuda
