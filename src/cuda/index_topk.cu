// index_topk on CUDA.
//
// logits_then_topk: the logits of every row are staged in the workspace, then
// selected by the top-k kernels. Workspace: [error record][staged logits]
// [top-k lengths]. The top-k kernels record into the same record, where the
// first violation (the scoring's, when it found one) stays.
//
// fused (Hopper): the selection kernel scores like the logits kernel but
// leaves candidate lists (candidate_lists.hpp) instead of logits; one CTA per
// row then selects from its lists. Workspace: [error record][top-k lengths]
// [list counts][lists]; nothing in it grows with the context length.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend.hpp"
#include "cuda/device_error.cuh"
#include "cuda/candidate_lists.hpp"
#include "cuda/generic_kernels.hpp"
#include "cuda/hopper/logits_sm90.hpp"
#include "cuda/launch_utils.hpp"
#include "cuda/scoring_rules.cuh"
#include "cuda/topk/list_select.cuh"

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

// The length each row selects among: topk_lens[r] (or the context length),
// limited to the positions the scoring defined. Rows whose context length
// breaks a rule select nothing (their logits are NaN and the violation is
// recorded by the scoring); a top-k length beyond the context or negative is
// recorded here.
__global__ void topk_lengths_kernel(LogitsProblem p, const std::int32_t* topk_lens,
                                    std::int64_t topk_lens_stride, std::int32_t* out,
                                    DeviceErrorRecord* record) {
  const std::int64_t rows = p.batch * p.next_n;
  for (std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; row < rows;
       row += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t b = row / p.next_n;
    const std::int64_t j = row % p.next_n;
    const std::int64_t context = usable_length(p, b, j);
    std::int64_t length = context;
    if (topk_lens != nullptr) {
      length = topk_lens[row * topk_lens_stride];
      if (length < 0) {
        report_device_error(record, kNegativeLength, row, length, 0);
        length = 0;
      } else if (length > row_length(p.lens, b, j)) {
        report_device_error(record, kTopkLengthBeyondContext, row, length, row_length(p.lens, b, j));
      }
      length = std::min(length, context);
    }
    out[row] = static_cast<std::int32_t>(length);
  }
}

// Fused workspace: [error record][top-k lengths][list counts][lists].
struct FusedPlan {
  std::size_t lengths_offset = 0;
  std::size_t counts_offset = 0;
  std::size_t counts_bytes = 0;
  std::size_t lists_offset = 0;
  std::size_t total = 0;
};

FusedPlan plan_fused_workspace(std::int64_t rows, int workers, int rows_per_unit) {
  const std::int64_t lists = candidate_list_count(rows, rows_per_unit, workers);
  FusedPlan plan;
  plan.lengths_offset = kDeviceErrorRecordBytes;
  plan.counts_offset =
      plan.lengths_offset + align_workspace(static_cast<std::size_t>(rows) * sizeof(std::int32_t));
  plan.counts_bytes = static_cast<std::size_t>(lists) * sizeof(std::int32_t);
  plan.lists_offset = plan.counts_offset + align_workspace(plan.counts_bytes);
  plan.total = plan.lists_offset + static_cast<std::size_t>(lists) * kListCapacity *
                                       sizeof(topk_impl::Rank);
  return plan;
}

__global__ void __launch_bounds__(topk_impl::kThreads, 2)
    select_listed_kernel(topk_impl::TopkArgs args, CandidateLists lists, const std::int32_t* schedule,
                         int workers) {
  extern __shared__ __align__(16) unsigned char shared_base[];
  auto& storage = *reinterpret_cast<topk_impl::ListedStorage*>(shared_base);
  const std::int64_t row = blockIdx.x;
  if (!topk_impl::schedule_is_monotone(schedule, workers)) {
    // The result is void (the error is recorded); leave no stale indices.
    for (int i = static_cast<int>(threadIdx.x); i < args.k; i += topk_impl::kThreads) {
      args.indices[row * args.indices_stride + i] = -1;
    }
    return;
  }
  topk_impl::select_listed_row(args, lists, schedule, workers, row, storage);
}

// The top-k problem of the selection step: the rows' lengths and the output.
TopkProblem selection_problem(const IndexTopkProblem& p, const std::int32_t* lengths,
                              const void* logits, std::int64_t logits_stride) {
  TopkProblem select;
  select.device = p.logits.device;
  select.rows = p.logits.rows();
  select.cols = p.logits.max_context_len;
  select.logits = logits;
  select.logits_dtype = DType::float32;
  select.logits_stride = logits_stride;
  select.lengths = lengths;
  select.lengths_stride = 1;
  select.k = p.k;
  select.indices = p.indices;
  select.indices_stride = p.indices_stride;
  select.sorted = p.sorted;
  if (p.physical_slots) {
    select.block_table = p.logits.block_table;
    select.block_table_stride = p.logits.block_table_stride;
    select.max_blocks = p.logits.max_blocks;
    select.rows_per_request = static_cast<int>(p.logits.next_n);
  }
  return select;
}

Status launch_topk_lengths(const IndexTopkProblem& p, std::int32_t* lengths, const ExecContext& ctx) {
  const std::int64_t rows = p.logits.rows();
  if (rows == 0) return Status::success();
  topk_lengths_kernel<<<grid_for(rows, kLengthThreads), kLengthThreads, 0, stream_of(ctx)>>>(
      p.logits, p.topk_lens, p.topk_lens_stride, lengths, error_record(ctx));
  DSA_CUDA_CHECK_LAUNCH("topk_lengths_kernel");
  return Status::success();
}

Status fused_index_topk(const IndexTopkProblem& p, const ExecContext& ctx) {
  const std::int64_t rows = p.logits.rows();
  const FusedPlan plan = plan_fused_workspace(rows, p.logits.num_workers, p.logits.rows_per_unit());
  unsigned char* workspace = static_cast<unsigned char*>(ctx.workspace.data);
  const cudaStream_t stream = stream_of(ctx);
  auto* lengths = reinterpret_cast<std::int32_t*>(workspace + plan.lengths_offset);
  DSA_RETURN_IF_ERROR(launch_topk_lengths(p, lengths, ctx));
  if (rows == 0) return Status::success();

  hopper::CandidateSelection selection;
  selection.lengths = lengths;
  selection.k = p.k;
  selection.lists.ranks = reinterpret_cast<topk_impl::Rank*>(workspace + plan.lists_offset);
  selection.lists.counts = reinterpret_cast<std::int32_t*>(workspace + plan.counts_offset);
  selection.lists.rows = rows;
  selection.lists.rows_per_unit = p.logits.rows_per_unit();
  selection.lists.parts = list_parts(selection.lists.rows_per_unit);
  // A list no worker writes reads as empty.
  DSA_CUDA_CHECK(cudaMemsetAsync(selection.lists.counts, 0, plan.counts_bytes, stream));
  DSA_RETURN_IF_ERROR(hopper::paged_mqa_candidates(p.logits, selection, ctx));

  const topk_impl::TopkArgs args =
      topk_impl::topk_args(selection_problem(p, lengths, nullptr, 0), error_record(ctx));
  constexpr int kSharedBytes = sizeof(topk_impl::ListedStorage);
  DSA_CUDA_CHECK(cudaFuncSetAttribute(select_listed_kernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  select_listed_kernel<<<static_cast<unsigned>(rows), topk_impl::kThreads, kSharedBytes, stream>>>(
      args, selection.lists, p.logits.schedule, p.logits.num_workers);
  DSA_CUDA_CHECK_LAUNCH("select_listed_kernel");
  return Status::success();
}

}  // namespace

std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len, int /*k*/,
                                       bool fused, int workers, int rows_per_unit, int /*device*/) {
  if (fused) return plan_fused_workspace(rows, workers, rows_per_unit).total;
  return plan_workspace(rows, max_context_len).total;
}

Status index_topk(const IndexTopkProblem& p, bool hopper, const ExecContext& ctx) {
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(p.logits.device.index));
  DSA_RETURN_IF_ERROR(clear_device_error(ctx));
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
  DSA_RETURN_IF_ERROR(launch_paged_mqa_logits(scoring, hopper, ctx));

  const TopkProblem select = selection_problem(p, lengths, scoring.logits, scoring.logits_stride);
  return launch_topk(select, ctx);
}

}  // namespace dsa::detail::cuda
