// The fused index_topk on CUDA (fused_index_topk.hpp): each row's threshold
// from its sample, the workspace plan, the selection from the candidate
// lists, and the order of the passes.
#include "cuda/fused/fused_index_topk.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/device_error.cuh"
#include "cuda/fused/candidate_lists.hpp"
#include "cuda/fused/hopper_passes.hpp"
#include "cuda/fused/list_select.cuh"
#include "cuda/fused/row_samples.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/index_topk_selection.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/warp_scan.cuh"

namespace dsa::detail::cuda {

namespace {

// ---- thresholds from the samples (fused) --------------------------------------

// Eight keys a thread: the kernel is a chain of dependent rounds, which
// more warps shorten, but rows beyond the multiprocessors' count want
// several CTAs resident on each.
constexpr int kThresholdThreads = 512;
constexpr int kThresholdKeysPerThread = kSampleCapacity / kThresholdThreads;
constexpr int kDigitBins = 256;  // warp_bin_from_top's

struct ThresholdStorage {
  int histogram[kDigitBins];
  int digit;
  int remaining;
  std::uint32_t lowest;   // of the valid keys
  std::uint32_t highest;
  std::int32_t valid_samples;  // below the row's selection length
  std::int32_t rank;           // threshold_rank's, 0 for none
};

// Digits a floor resolves below the highest digit in which a row's sample
// keys differ: 16 bits of the key from there on (a float to within 1 % or
// finer), after which the rounds would only refine a hint.
constexpr int kFloorDigits = 2;

// The r-th largest (r >= 1) of the keys the CTA holds (`valid` of them per
// thread at most; the others are ignored), to kFloorDigits 8-bit digits
// from the highest digit in which the keys differ (a row's samples mostly
// share their top digits), the digits below 0: a key at or below the r-th
// largest, one digit a round. Every thread calls it; storage.lowest and
// storage.highest start at ~0 and 0.
__device__ std::uint32_t floor_key(const std::uint32_t (&keys)[kThresholdKeysPerThread],
                                   const bool (&valid)[kThresholdKeysPerThread], int r,
                                   ThresholdStorage& storage) {
  const int thread = static_cast<int>(threadIdx.x);
  const int lane = thread % 32;
  std::uint32_t lowest = ~0u;
  std::uint32_t highest = 0;
#pragma unroll
  for (int i = 0; i < kThresholdKeysPerThread; ++i) {
    if (valid[i]) {
      lowest = min(lowest, keys[i]);
      highest = max(highest, keys[i]);
    }
  }
  lowest = warp_min(lowest);
  highest = warp_max(highest);
  if (lane == 0) {
    atomicMin(&storage.lowest, lowest);
    atomicMax(&storage.highest, highest);
  }
  __syncthreads();
  const std::uint32_t differing = storage.lowest ^ storage.highest;
  if (differing == 0) return storage.lowest;
  const int top_shift = (31 - __clz(static_cast<int>(differing))) / 8 * 8;
  // The digits above top_shift are common to every key.
  std::uint32_t prefix_mask = top_shift == 24 ? 0u : ~0u << (top_shift + 8);
  std::uint32_t prefix = storage.lowest & prefix_mask;
  int remaining = r;
  const int last_shift = max(0, top_shift - 8 * (kFloorDigits - 1));
  for (int shift = top_shift; shift >= last_shift; shift -= 8) {
    for (int bin = thread; bin < kDigitBins; bin += kThresholdThreads) storage.histogram[bin] = 0;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kThresholdKeysPerThread; ++i) {
      // The lanes with lane 0's digit add together, the others one by one.
      const int bin = valid[i] && (keys[i] & prefix_mask) == prefix
                          ? static_cast<int>((keys[i] >> shift) & (kDigitBins - 1))
                          : -1;
      const int common = __shfl_sync(0xffffffffu, bin, 0);
      const unsigned peers = __ballot_sync(0xffffffffu, bin == common);
      if (bin >= 0 && bin != common) atomicAdd(&storage.histogram[bin], 1);
      if (lane == 0 && common >= 0) atomicAdd(&storage.histogram[common], __popc(peers));
    }
    __syncthreads();
    if (thread < 32) {
      const BinFromTop found = warp_bin_from_top(storage.histogram, remaining);
      if (thread == 0) {
        storage.digit = found.bin;
        storage.remaining = remaining - found.above;
      }
    }
    __syncthreads();
    prefix |= static_cast<std::uint32_t>(storage.digit) << shift;
    prefix_mask |= static_cast<std::uint32_t>(kDigitBins - 1) << shift;
    remaining = storage.remaining;
    __syncthreads();  // the digit is read before the next round writes it
  }
  return prefix;
}

// One CTA per row: the row's selection length, and with samples its floor
// (the lowest rank its lists take): the threshold_rank-th largest of its
// samples below that length (floor_key's), or 0 (no floor). Also clears
// the list counts and the flag.
__global__ void __launch_bounds__(kThresholdThreads)
    sample_thresholds_kernel(LogitsProblem p, const std::int32_t* topk_lens,
                             std::int64_t topk_lens_stride, int k, hopper::RowSamples samples,
                             std::int32_t* lengths, topk_impl::Rank* floors, std::int32_t* counts,
                             std::int64_t counts_to_clear, DeviceErrorRecord* record) {
  __shared__ ThresholdStorage storage;
  const std::int64_t row = blockIdx.x;
  const int thread = static_cast<int>(threadIdx.x);
  enter_dependent_grid();
  for (std::int64_t i = row * kThresholdThreads + thread; i < counts_to_clear;
       i += std::int64_t{gridDim.x} * kThresholdThreads) {
    counts[i] = 0;
  }
  // The keys are loaded while thread 0 finds how many of them count: every
  // slot of the row's sample, a stale one ignored below.
  std::uint32_t keys[kThresholdKeysPerThread] = {};
  if (samples.maps != nullptr) {
    const float* values = samples.values + row * kSampleCapacity;
#pragma unroll
    for (int i = 0; i < kThresholdKeysPerThread; ++i) {
      keys[i] = topk_impl::OrderedKey<std::uint32_t>::from_bits(
          __float_as_uint(values[thread + kThresholdThreads * i]));
    }
  }
  if (thread == 0) {
    const std::int32_t length = selection_length(p, topk_lens, topk_lens_stride, row, record);
    lengths[row] = length;
    // The bisection over the sample map is done once, not by every thread.
    // The length is within the row's valid positions (0 for a row breaking
    // a rule), so the samples below it are the row's to count.
    storage.valid_samples = 0;
    if (samples.maps != nullptr && length > k) {
      storage.valid_samples = samples_below(samples.maps[row], length);
    }
    storage.rank = threshold_rank(storage.valid_samples, length, k);
    storage.lowest = ~0u;
    storage.highest = 0;
    if (samples.maps != nullptr && storage.rank == 0) floors[row] = 0;
  }
  __syncthreads();
  // No sample: no floors. No rank: the floor is the lowest.
  const std::int32_t r = storage.rank;
  if (r == 0) return;
  bool valid[kThresholdKeysPerThread];
#pragma unroll
  for (int i = 0; i < kThresholdKeysPerThread; ++i) {
    valid[i] = thread + kThresholdThreads * i < storage.valid_samples;
  }
  const std::uint32_t key = floor_key(keys, valid, r, storage);
  if (thread == 0) floors[row] = topk_impl::rank_of(key, 0xffffffffu);
}

// Fused workspace: [error record][top-k lengths][list counts, flag][lists]
// [samples][sample maps][floors].
struct FusedPlan {
  std::size_t lengths_offset = 0;
  std::size_t counts_offset = 0;
  std::int64_t counts = 0;  // list counts, then the flag
  std::size_t lists_offset = 0;
  int list_capacity = 0;  // ranks a list holds (candidate_lists.hpp)
  std::size_t samples_offset = 0;
  std::size_t maps_offset = 0;
  std::size_t floors_offset = 0;
  std::size_t total = 0;
};

FusedPlan plan_fused_workspace(std::int64_t rows, std::int64_t max_context_len, int workers,
                               int rows_per_unit) {
  const std::int64_t lists = candidate_list_count(rows, rows_per_unit, workers);
  const auto bytes = [](std::int64_t count, std::size_t size) {
    return align_workspace(static_cast<std::size_t>(count) * size);
  };
  FusedPlan plan;
  plan.lengths_offset = kDeviceErrorRecordBytes;
  plan.counts_offset = plan.lengths_offset + bytes(rows, sizeof(std::int32_t));
  plan.counts = lists;
  plan.lists_offset = plan.counts_offset + bytes(lists + 1, sizeof(std::int32_t));
  plan.list_capacity = list_capacity(rows_per_unit, max_context_len);
  plan.samples_offset =
      plan.lists_offset + bytes(lists * plan.list_capacity, sizeof(topk_impl::Rank));
  plan.maps_offset = plan.samples_offset + bytes(rows * kSampleCapacity, sizeof(float));
  plan.floors_offset = plan.maps_offset + bytes(rows, sizeof(SampleMap));
  plan.total = plan.floors_offset + bytes(rows, sizeof(topk_impl::Rank));
  return plan;
}

// run_if: as CandidateSelection's; short_rows: raised when a row's lists
// hold fewer than k ranks (nullptr: not watched).
__global__ void __launch_bounds__(topk_impl::kThreads, 2)
    select_listed_kernel(topk_impl::TopkArgs args, CandidateLists lists, const std::int32_t* schedule,
                         int workers, const std::int32_t* run_if, std::int32_t* short_rows) {
  enter_dependent_grid();
  if (run_if != nullptr && *run_if == 0) return;
  extern __shared__ __align__(16) unsigned char shared_base[];
  auto& storage = *reinterpret_cast<topk_impl::ListedStorage*>(shared_base);
  const std::int64_t row = blockIdx.x;
  // Issued before the schedule's read, so that the two loads overlap.
  const int length = args.lengths[row * args.lengths_stride];
  const topk_impl::UnitWorkers unit =
      topk_impl::unit_workers(schedule, workers, row / lists.rows_per_unit);
  if (!unit.monotone) {
    // The result is void (the error is recorded); leave no stale indices.
    for (int i = static_cast<int>(threadIdx.x); i < args.k; i += topk_impl::kThreads) {
      args.indices[row * args.indices_stride + i] = -1;
    }
    return;
  }
  topk_impl::select_listed_row(args, lists, schedule, unit, length, row, short_rows, storage);
}

Status launch_select_listed(const topk_impl::TopkArgs& args, const CandidateLists& lists,
                            const LogitsProblem& p, const std::int32_t* run_if,
                            std::int32_t* short_rows, const ExecContext& ctx) {
  constexpr int kSharedBytes = sizeof(topk_impl::ListedStorage);
  DSA_RETURN_IF_ERROR(allow_shared_bytes<&select_listed_kernel>(kSharedBytes));
  return launch_kernel("select_listed_kernel", select_listed_kernel,
                       {static_cast<unsigned>(p.rows()), topk_impl::kThreads, kSharedBytes}, ctx, args, lists,
                       p.schedule, p.num_workers, run_if, short_rows);
}

}  // namespace

Status fused_index_topk(const IndexTopkProblem& p, const ExecContext& ctx) {
  const std::int64_t rows = p.logits.rows();
  if (rows == 0) return Status::success();
  const FusedPlan plan =
      plan_fused_workspace(rows, p.logits.max_context_len, p.logits.num_workers, p.logits.rows_per_unit());
  unsigned char* workspace = static_cast<unsigned char*>(ctx.workspace.data);
  auto* lengths = reinterpret_cast<std::int32_t*>(workspace + plan.lengths_offset);
  auto* counts = reinterpret_cast<std::int32_t*>(workspace + plan.counts_offset);
  std::int32_t* short_rows = counts + plan.counts;  // the flag
  auto* floors = reinterpret_cast<topk_impl::Rank*>(workspace + plan.floors_offset);

  hopper::RowSamples samples;
  const bool sampled = sampled_call(p.logits.max_context_len);
  if (sampled) {
    samples.values = reinterpret_cast<float*>(workspace + plan.samples_offset);
    samples.maps = reinterpret_cast<SampleMap*>(workspace + plan.maps_offset);
    DSA_RETURN_IF_ERROR(hopper::paged_mqa_samples(p.logits, samples, ctx));
  }
  // A list no worker writes reads as empty: the counts (and the flag) start at 0.
  DSA_RETURN_IF_ERROR(launch_kernel("sample_thresholds_kernel", sample_thresholds_kernel,
                                    {static_cast<unsigned>(rows), kThresholdThreads}, ctx, p.logits, p.topk_lens,
                                    p.topk_lens_stride, p.k, samples, lengths, floors, counts, plan.counts + 1,
                                    error_record(ctx)));

  hopper::CandidateSelection selection;
  selection.lengths = lengths;
  selection.k = p.k;
  selection.lists.ranks = reinterpret_cast<topk_impl::Rank*>(workspace + plan.lists_offset);
  selection.lists.counts = counts;
  selection.lists.rows = rows;
  selection.lists.rows_per_unit = p.logits.rows_per_unit();
  selection.lists.parts = list_parts(selection.lists.rows_per_unit);
  selection.lists.capacity = plan.list_capacity;
  selection.floors = sampled ? floors : nullptr;
  DSA_RETURN_IF_ERROR(hopper::paged_mqa_candidates(p.logits, selection, ctx));
  const topk_impl::TopkArgs args =
      topk_impl::topk_args(selection_problem(p, lengths, nullptr, 0), error_record(ctx));
  DSA_RETURN_IF_ERROR(launch_select_listed(args, selection.lists, p.logits, nullptr,
                                           sampled ? short_rows : nullptr, ctx));
  if (!sampled) return Status::success();

  // Rows the thresholds left short: everything again, without them.
  selection.floors = nullptr;
  selection.run_if = short_rows;
  DSA_RETURN_IF_ERROR(hopper::paged_mqa_candidates(p.logits, selection, ctx));
  return launch_select_listed(args, selection.lists, p.logits, short_rows, nullptr, ctx);
}

std::size_t fused_index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len,
                                             int workers, int rows_per_unit) {
  // Sized for every call of up to max_context_len positions: the lists of
  // calls without a sample grow with their context, up to more than a
  // sampled call's.
  const std::int64_t longest_unsampled = std::min(max_context_len, kSampledContext - 1);
  return std::max(plan_fused_workspace(rows, max_context_len, workers, rows_per_unit).total,
                  plan_fused_workspace(rows, longest_unsampled, workers, rows_per_unit).total);
}

}  // namespace dsa::detail::cuda
