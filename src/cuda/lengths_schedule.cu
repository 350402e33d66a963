// Context-length builders and the device-side schedule planner.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "backend.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/warp_scan.cuh"

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

// The lengths of a builder call, one element at a time: element `i` is row
// i of uneven requests (row r of request b, offsets[b] + t, gets the causal
// input[b] + t + 1; a row of no request is recorded and 0), or element
// (b, j) = (i / next_n, i % next_n) of [B, next_n].
__host__ __device__ std::int64_t length_elements(const LengthsProblem& p) {
  return p.varlen.offsets != nullptr ? p.rows : p.batch * p.next_n;
}

__device__ void write_context_length(const LengthsProblem& p, std::int64_t i, DeviceErrorRecord* record) {
  if (p.varlen.offsets != nullptr) {
    const std::int64_t b = request_of_row(p.varlen.offsets, p.varlen.requests, i);
    if (b < 0) {
      report_device_error(record, kRowWithoutRequest, i, p.varlen.requests, p.varlen.offsets[p.varlen.requests]);
      p.out[i * p.out_stride_b] = 0;
      return;
    }
    std::int32_t input = p.input[b * p.input_stride];
    if (input < 0) {
      if (i == p.varlen.offsets[b]) report_device_error(record, kNegativeLength, b, input, 0);
      input = 0;
    }
    p.out[i * p.out_stride_b] = convention_length(p.convention, input, 1, static_cast<int>(i - p.varlen.offsets[b]));
    return;
  }
  const std::int64_t b = i / p.next_n;
  const int j = static_cast<int>(i % p.next_n);
  std::int32_t input = p.input[b * p.input_stride];
  if (input < 0) {
    if (j == 0) report_device_error(record, kNegativeLength, b, input, 0);
    input = 0;
  }
  p.out[b * p.out_stride_b + j * p.out_stride_n] = convention_length(p.convention, input, p.next_n, j);
}

__global__ void context_lens_kernel(LengthsProblem p, DeviceErrorRecord* record) {
  enter_dependent_grid();
  const std::int64_t elements = length_elements(p);
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < elements;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    write_context_length(p, i, record);
  }
}

// The planner runs as a single block in three steps: each thread counts the
// items of a contiguous segment of units, the block scans the counts (two
// barriers), then each thread takes workers: it finds the segment holding
// the worker's first item by binary search over the scanned counts and walks
// that segment alone. No step is serial in the number of workers, and no
// thread walks more than one segment per worker.
constexpr int kPlanThreads = 1024;
constexpr int kPlanWarps = kPlanThreads / 32;

// The unit a thread starts at: the first one named in [first, last) (a row
// tile named before `first` belongs to the thread whose segment names it).
__device__ UnitSpan first_owned_unit(const UnitLayout& layout, std::int64_t first, std::int64_t last) {
  const UnitSpan none{last, last, -1, last, 0};
  if (first >= last) return none;
  const UnitSpan span = unit_containing(layout, first);
  if (span.unit == first) return span;
  return span.next < last ? unit_containing(layout, span.next) : none;
}

// Calls visit(span, chunks) for the units named in [first, last), in walk
// order, until it returns true. Ends whatever the lengths or offsets hold:
// every span ends past the unit it is asked for.
template <typename Visit>
__device__ void walk_segment(const UnitLayout& layout, std::int64_t first, std::int64_t last, Visit&& visit) {
  for (UnitSpan span = first_owned_unit(layout, first, last); span.unit < last;) {
    if (visit(span, chunks_for_length(unit_length(layout, span)))) return;
    if (span.next >= last) return;
    span = unit_containing(layout, span.next);
  }
}

__device__ void write_entry(std::int32_t* schedule, std::int64_t worker, std::int64_t unit,
                            std::int64_t chunk) {
  schedule[2 * worker] = static_cast<std::int32_t>(unit);
  schedule[2 * worker + 1] = static_cast<std::int32_t>(chunk);
}

// It also clears the operation's error record (RecordClear::by_first_kernel):
// it is the operation's only kernel, one CTA. With `lengths` (its out is
// p's lengths; out == nullptr: none) the CTA first builds them, so that a
// step's lengths and schedule take one launch; whatever the build records
// follows the clearing, and the plan reads the lengths after a block
// barrier, which makes the CTA's global writes visible to all its threads.
__global__ void __launch_bounds__(kPlanThreads)
    plan_schedule_kernel(LengthsProblem lengths, ScheduleProblem p, DeviceErrorRecord* record) {
  // Per thread, the weight of the segments up to its own within its warp;
  // per warp, the weight up to its own: the scan's two halves.
  __shared__ std::int64_t warp_scanned[kPlanThreads];
  __shared__ std::int64_t warp_ends[kPlanWarps];
  const UnitLayout layout = unit_layout(p);
  const std::int64_t units = layout.units;
  const std::int64_t workers = p.num_workers;
  const std::int64_t per_thread = (units + kPlanThreads - 1) / kPlanThreads;
  const auto segment_first = [&](std::int64_t thread) {
    return thread * per_thread < units ? thread * per_thread : units;
  };
  const auto segment_last = [&](std::int64_t thread) {
    return segment_first(thread) + per_thread < units ? segment_first(thread) + per_thread : units;
  };

  enter_dependent_grid();
  if (threadIdx.x == 0) clear_error_record(record);
  if (lengths.out != nullptr) {
    __syncthreads();
    const std::int64_t elements = length_elements(lengths);
    for (std::int64_t i = threadIdx.x; i < elements; i += kPlanThreads) write_context_length(lengths, i, record);
    __syncthreads();
  }
  std::int64_t segment_weight = 0;
  walk_segment(layout, segment_first(threadIdx.x), segment_last(threadIdx.x),
               [&](const UnitSpan& span, std::int64_t chunks) {
                 segment_weight += unit_weight(chunks, span.rows);
                 return false;
               });
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const std::int64_t in_warp = warp_inclusive_sum(segment_weight);
  warp_scanned[threadIdx.x] = in_warp;
  if (lane == 31) warp_ends[warp] = in_warp;
  __syncthreads();
  if (warp == 0) {
    const std::int64_t scanned = warp_inclusive_sum(lane < kPlanWarps ? warp_ends[lane] : std::int64_t{0});
    __syncwarp();
    if (lane < kPlanWarps) warp_ends[lane] = scanned;
  }
  __syncthreads();
  // Weight of the segments of threads 0 .. thread.
  const auto weight_through = [&](std::int64_t thread) {
    return warp_scanned[thread] + (thread >= 32 ? warp_ends[thread / 32 - 1] : 0);
  };
  const std::int64_t total = warp_ends[kPlanWarps - 1];
  const std::int64_t segments = per_thread > 0 ? (units + per_thread - 1) / per_thread : 0;

  if (threadIdx.x == 0) write_entry(p.schedule, workers, units, kChunkTokens);
  for (std::int64_t w = threadIdx.x; w < workers; w += kPlanThreads) {
    const std::int64_t position = worker_first_position(w, total, workers);
    // Position 0 is written (0, 0), the start of the walk, so that a schedule
    // used with other lengths still covers everything.
    if (position == 0) {
      write_entry(p.schedule, w, 0, 0);
      continue;
    }
    // The first segment whose weight runs past `position` (position < total, so one does).
    std::int64_t low = 0, count = segments;
    while (count > 0) {
      const std::int64_t half = count / 2;
      if (weight_through(low + half) <= position) {
        low += half + 1;
        count -= half + 1;
      } else {
        count = half;
      }
    }
    // Within it, the unit holding the position: the first whose weight runs past it.
    std::int64_t before = low > 0 ? weight_through(low - 1) : 0;
    walk_segment(layout, segment_first(low), segment_last(low), [&](const UnitSpan& span, std::int64_t chunks) {
      const std::int64_t weight = unit_weight(chunks, span.rows);
      if (position < before + weight) {
        write_entry(p.schedule, w, span.unit, chunk_at_weight_offset(position - before, span.rows));
        return true;
      }
      before += weight;
      return false;
    });
  }
}

}  // namespace

Status context_lens(const LengthsProblem& p, const ExecContext& ctx) {
  const std::int64_t elements = length_elements(p);
  if (elements == 0) return Status::success();
  return launch_kernel("context_lens_kernel", context_lens_kernel, {grid_for(elements, kLengthThreads), kLengthThreads},
                       ctx, p, error_record(ctx));
}

Status plan_schedule(const ScheduleProblem& p, const ExecContext& ctx) {
  return launch_kernel("plan_schedule_kernel", plan_schedule_kernel, {1, kPlanThreads}, ctx, LengthsProblem{}, p,
                       error_record(ctx));
}

Status context_lens_and_schedule(const LengthsProblem& lengths, const ScheduleProblem& plan, const ExecContext& ctx) {
  return launch_kernel("plan_schedule_kernel", plan_schedule_kernel, {1, kPlanThreads}, ctx, lengths, plan,
                       error_record(ctx));
}

}  // namespace dsa::detail::cuda
