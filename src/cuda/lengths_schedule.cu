// Context-length builders and the device-side schedule planner.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "backend.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda {

namespace {

constexpr int kLengthThreads = 256;

__device__ std::int32_t convention_length(LengthConvention convention, std::int64_t input,
                                          int next_n, int j) {
  std::int64_t length = 0;
  switch (convention) {
    case LengthConvention::causal:
      length = input + j + 1;
      break;
    case LengthConvention::expanded:
      length = input + next_n;
      break;
    case LengthConvention::legacy:
      length = input - next_n + j + 1;
      length = length > 0 ? length : 0;
      break;
  }
  return static_cast<std::int32_t>(length < INT32_MAX ? length : INT32_MAX);
}

// One thread per row of uneven requests: row r of request b (offsets[b] + t)
// gets the causal input[b] + t + 1; a row of no request is recorded and 0.
__global__ void row_context_lens_kernel(LengthsProblem p, DeviceErrorRecord* record) {
  for (std::int64_t row = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; row < p.rows;
       row += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t b = request_of_row(p.varlen.offsets, p.varlen.requests, row);
    if (b < 0) {
      report_device_error(record, kRowWithoutRequest, row, p.varlen.requests, p.varlen.offsets[p.varlen.requests]);
      p.out[row * p.out_stride_b] = 0;
      continue;
    }
    std::int32_t input = p.input[b * p.input_stride];
    if (input < 0) {
      if (row == p.varlen.offsets[b]) report_device_error(record, kNegativeLength, b, input, 0);
      input = 0;
    }
    p.out[row * p.out_stride_b] = convention_length(p.convention, input, 1, static_cast<int>(row - p.varlen.offsets[b]));
  }
}

// One thread per output element (b, j).
__global__ void context_lens_kernel(LengthsProblem p, DeviceErrorRecord* record) {
  const std::int64_t total = p.batch * p.next_n;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t b = i / p.next_n;
    const int j = static_cast<int>(i % p.next_n);
    std::int32_t input = p.input[b * p.input_stride];
    if (input < 0) {
      if (j == 0) report_device_error(record, kNegativeLength, b, input, 0);
      input = 0;
    }
    p.out[b * p.out_stride_b + j * p.out_stride_n] = convention_length(p.convention, input, p.next_n, j);
  }
}

// The planner runs as a single block: each thread owns a contiguous segment
// of units, the block scans the segments' item counts, and every thread then
// writes the starts of the workers whose first item falls in its segment.
constexpr int kPlanThreads = 1024;

__device__ std::int64_t block_exclusive_scan(std::int64_t value, std::int64_t* scratch,
                                             std::int64_t* total) {
  // Hillis-Steele over kPlanThreads entries; the planner runs once per step
  // on at most a few hundred thousand units, so simplicity wins over speed.
  const int t = threadIdx.x;
  scratch[t] = value;
  __syncthreads();
  for (int offset = 1; offset < kPlanThreads; offset *= 2) {
    const std::int64_t add = t >= offset ? scratch[t - offset] : 0;
    __syncthreads();
    scratch[t] += add;
    __syncthreads();
  }
  const std::int64_t inclusive = scratch[t];
  *total = scratch[kPlanThreads - 1];
  __syncthreads();
  return inclusive - value;
}

// floor(worker * total / workers), exactly and without overflow (as the host planner).
__device__ std::int64_t first_item_of(std::int64_t worker, std::int64_t total, std::int64_t workers) {
  const std::int64_t whole = total / workers, rest = total % workers;
  return worker * whole + worker * rest / workers;
}

// The smallest worker whose first item is >= item: ceil(item * workers / total).
__device__ std::int64_t first_worker_at_or_after(std::int64_t item, std::int64_t total,
                                                 std::int64_t workers) {
  const __int128 product = static_cast<__int128>(item) * workers;
  return static_cast<std::int64_t>((product + total - 1) / total);
}

__device__ void write_entry(std::int32_t* schedule, std::int64_t worker, std::int64_t unit,
                            std::int64_t chunk) {
  schedule[2 * worker] = static_cast<std::int32_t>(unit);
  schedule[2 * worker + 1] = static_cast<std::int32_t>(chunk);
}

// The unit a thread starts at: the first one named in [first, last) (a row
// tile named before `first` belongs to the thread whose segment names it).
__device__ UnitSpan first_owned_unit(const UnitLayout& layout, std::int64_t first, std::int64_t last) {
  const UnitSpan none{last, last, -1, last, 0};
  if (first >= last) return none;
  const UnitSpan span = unit_containing(layout, first);
  if (span.unit == first) return span;
  return span.next < last ? unit_containing(layout, span.next) : none;
}

__global__ void __launch_bounds__(kPlanThreads) plan_schedule_kernel(ScheduleProblem p) {
  __shared__ std::int64_t scratch[kPlanThreads];
  const UnitLayout layout = unit_layout(p);
  const std::int64_t units = layout.units;
  const std::int64_t workers = p.num_workers;
  const std::int64_t per_thread = (units + kPlanThreads - 1) / kPlanThreads;
  const std::int64_t first = threadIdx.x * per_thread < units ? threadIdx.x * per_thread : units;
  const std::int64_t last = first + per_thread < units ? first + per_thread : units;
  const UnitSpan owned = first_owned_unit(layout, first, last);

  // Each thread owns the units named in its segment [first, last).
  std::int64_t segment_items = 0;
  for (UnitSpan span = owned; span.unit < last;) {
    segment_items += chunks_for_length(unit_length(layout, span));
    if (span.next >= last) break;
    span = unit_containing(layout, span.next);
  }
  std::int64_t total = 0;
  std::int64_t before = block_exclusive_scan(segment_items, scratch, &total);

  if (threadIdx.x == 0) write_entry(p.schedule, workers, units, kChunkTokens);
  // Workers whose first item is item 0 start at (0, 0), the start of the
  // walk, so that a schedule used with other lengths still covers everything.
  for (std::int64_t w = threadIdx.x; w < workers && first_item_of(w, total, workers) == 0;
       w += kPlanThreads) {
    write_entry(p.schedule, w, 0, 0);
  }
  if (total == 0) return;
  // The other workers start inside the unit holding their first item: unit u
  // holds items [before, before + chunks), so it starts the workers w with
  // before <= floor(w * total / workers) < before + chunks.
  for (UnitSpan span = owned; span.unit < last;) {
    const std::int64_t chunks = chunks_for_length(unit_length(layout, span));
    if (chunks > 0) {
      std::int64_t w = first_worker_at_or_after(before > 1 ? before : 1, total, workers);
      const std::int64_t w_end = first_worker_at_or_after(before + chunks, total, workers);
      for (; w < w_end; ++w) write_entry(p.schedule, w, span.unit, first_item_of(w, total, workers) - before);
    }
    before += chunks;
    if (span.next >= last) break;
    span = unit_containing(layout, span.next);
  }
}

}  // namespace

Status context_lens(const LengthsProblem& p, const ExecContext& ctx) {
  if (p.varlen.offsets != nullptr) {
    if (p.rows > 0) {
      row_context_lens_kernel<<<grid_for(p.rows, kLengthThreads), kLengthThreads, 0, stream_of(ctx)>>>(
          p, error_record(ctx));
      DSA_CUDA_CHECK_LAUNCH("row_context_lens_kernel");
    }
    return Status::success();
  }
  const std::int64_t total = p.batch * p.next_n;
  if (total > 0) {
    context_lens_kernel<<<grid_for(total, kLengthThreads), kLengthThreads, 0, stream_of(ctx)>>>(
        p, error_record(ctx));
    DSA_CUDA_CHECK_LAUNCH("context_lens_kernel");
  }
  return Status::success();
}

Status plan_schedule(const ScheduleProblem& p, const ExecContext& ctx) {
  plan_schedule_kernel<<<1, kPlanThreads, 0, stream_of(ctx)>>>(p);
  DSA_CUDA_CHECK_LAUNCH("plan_schedule_kernel");
  return Status::success();
}

}  // namespace dsa::detail::cuda
