// Exact top-k of one row per CTA group, reading the row once.
//
// A row is split into contiguous segments, one per CTA of a group (a thread
// block cluster on sm_90, a single CTA elsewhere). Selection works on
// order-preserving keys and on 64-bit ranks (key, then position) that make
// every element of a row distinct (ordered_key.cuh).
//
//  1. Window. Every CTA takes the same sample of 2048 keys spread over the
//     row and, from a histogram over the sample's range (refined in a
//     crowded bin), two of its quantiles around the expected k-th largest:
//     `low`, below which (with overwhelming probability) nothing wins, and
//     `high`. Keys in (low, high] are split into 2047 equal bins; so the bins
//     adapt to the row's value range (narrow, offset or spread alike).
//  2. One pass over the segment, straight from global memory: keys above
//     `low` are appended to a candidate list in shared memory, each warp to
//     its own slice, which it then counts per bin; keys equal to `low` are
//     only counted (bin 0), so heavy ties and constant rows cost nothing here.
//  3. The CTAs of a group sum the counts (each a share of the bins, for
//     all), find the bin holding the k-th largest key and move the candidates
//     at or above that bin to the group's first CTA (which packs its own
//     slices first to make room), each CTA's after those of the CTAs ranked
//     before it and in its own list's order.
//  4. That CTA finds the exact k-th largest rank among the few candidates of
//     that bin (ranking them against each other, or narrowing [low, high]
//     when the bin is crowded) and writes the winners in an order fixed by
//     the row: in list order (a CTA alone's slices, a group's gathered
//     list), or by rank when sorted output is asked for; so the output never
//     depends on scheduling. When the k-th largest key is `low` itself, the
//     winners above it come first and then those equal to it, the first ones
//     in position order, found by a short ordered scan from the start of the
//     row.
// A row the sample misjudges (candidates beyond the list's capacity, or fewer
// than k keys at or above `low`) is narrowed by the first CTA alone over the
// whole row (several reads) until its candidates fit; slower, equally exact.
// Its winners, collected in no fixed order, are written in position order
// (through a bitmap of the row, or a sort beyond kBitmapPositions).
#pragma once

#include <cooperative_groups.h>

#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "common/device_error.hpp"
#include "common/logit_rules.hpp"
#include "common/problem.hpp"
#include "cuda/device_error.cuh"
#include "cuda/topk/ordered_key.cuh"
#include "cuda/warp_scan.cuh"
#include "dsa/topk.hpp"

namespace dsa::detail::cuda::topk_impl {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kItemsPerThread = kMaxTopk / kThreads;
inline constexpr int kSampleSize = kThreads * kItemsPerThread;
// Largest group of CTAs sharing one row (the portable cluster size limit).
inline constexpr int kMaxGroupSize = 8;
// Rows are split between CTAs in multiples of this many positions.
inline constexpr int kSegmentGranule = 64;
inline constexpr int kBins = 2048;
// Candidates one CTA can hold: room for the ~k + 5% of a segment expected
// above `low` for segments up to ~128K positions.
inline constexpr int kCandidateCapacity = 6144;
// During the scan each warp appends to its own slice of the list, so that no
// atomic is needed; the slices stay the list of a CTA alone, and the first
// CTA of a group packs them.
inline constexpr int kWarpCapacity = kCandidateCapacity / kWarps;
// Longest row whose winners are put in position order through a bitmap
// (one bit per position, over the staging area) rather than sorted.
inline constexpr int kBitmapPositions = kMaxTopk * 64;
inline constexpr int kVectorItems = 4;  // values per vector load
inline constexpr int kLoadsAhead = 4;   // loads each thread keeps in flight
// Sample keys a window bin may hold and still give `low` without refinement.
inline constexpr int kCoarseBinSamples = 4;
// Most sample keys of a bin that are ranked against each other to refine
// `low` (each thread compares one with all); a second histogram level costs
// less beyond, as with heavily tied rows.
inline constexpr int kRankedSampleKeys = 64;

using RankSort = cub::BlockRadixSort<Rank, kThreads, kItemsPerThread>;

struct TopkArgs {
  const void* logits = nullptr;
  std::int64_t logits_stride = 0;
  std::int64_t cols = 0;
  const std::int32_t* lengths = nullptr;
  std::int64_t lengths_stride = 0;
  int k = 0;
  std::int32_t* indices = nullptr;
  std::int64_t indices_stride = 0;
  bool sorted = false;
  const std::int32_t* row_starts = nullptr;
  const std::int32_t* position_offsets = nullptr;
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0;
  std::int64_t max_blocks = 0;
  int page_size = 64;
  int rows_per_request = 1;
  const std::int32_t* request_offsets = nullptr;
  std::int64_t requests = 0;
  DeviceErrorRecord* error = nullptr;
  int group_size = 1;  // CTAs per row
  // First CTA of the second wave: the CTAs from it on take the rows from it
  // on longest first (row_by_length); 0 when every CTA takes its own row.
  int second_wave = 0;
};

inline TopkArgs topk_args(const TopkProblem& p, DeviceErrorRecord* error) {
  TopkArgs args;
  args.logits = p.logits;
  args.logits_stride = p.logits_stride;
  args.cols = p.cols;
  args.lengths = p.lengths;
  args.lengths_stride = p.lengths_stride;
  args.k = p.k;
  args.indices = p.indices;
  args.indices_stride = p.indices_stride;
  args.sorted = p.sorted;
  args.row_starts = p.row_starts;
  args.position_offsets = p.position_offsets;
  args.block_table = p.block_table;
  args.block_table_stride = p.block_table_stride;
  args.max_blocks = p.max_blocks;
  args.page_size = p.page_size;
  args.rows_per_request = p.rows_per_request;
  args.request_offsets = p.request_offsets;
  args.requests = p.requests;
  args.error = error;
  return args;
}

// Bin holding the target-th largest counted element (-1 when fewer are
// counted), how many lie above it and how many in it.
struct FoundBin {
  int bin;
  int above;
  int count;
};

// Per-CTA scalars; candidate_count, equal_count and push_count are read by
// the group's other CTAs.
struct RowShared {
  int warp_sums[kWarps];
  std::uint32_t window_low;
  std::uint32_t sample_min;
  std::uint32_t sample_max;
  std::uint32_t ranked_key;
  int window_shift;
  int candidate_count;  // this CTA's; beyond the capacity when a slice overflowed
  int warp_fill[kWarps];  // the scan's candidates per warp slice (may exceed it)
  int equal_count;      // keys equal to window_low in this CTA's segment
  int kept;             // list length while collecting or gathering
  int push_count;       // this CTA's candidates moved to the group's first CTA
  int first_count;      // candidate_count of the group's first CTA
  int staged_count;
  FoundBin found[2];
  int overflow;
  int ordered_row;      // row_by_length's choice
  int request;          // the row's request under request_offsets (-1: none)
  int first_column;     // where the row's candidates start (row_values)
  int range_count;
  Rank range_min;
  Rank range_max;
};

// Dynamic shared memory of one CTA. The radix sort's scratch overlays the
// candidate list (the winners are sorted after the candidates have been
// read). The group's summed counts and the winners' position bitmap overlay
// the staged winners; each is used at a different time.
struct SharedStorage {
  int histogram[kBins];
  union {
    Rank staged[kMaxTopk];
    int totals[kBins];
    std::uint32_t bitmap[kBitmapPositions / 32];
  };
  RowShared s;
  union {
    Rank candidates[kCandidateCapacity];
    typename RankSort::TempStorage sort;
  };
};

// One CTA alone owns the row.
struct SingleBlock {
  __device__ static unsigned rank() { return 0; }
  __device__ static unsigned size() { return 1; }
  __device__ static void sync() { __syncthreads(); }
  template <typename T>
  __device__ static T* remote(T* local, unsigned /*rank*/) {
    return local;
  }
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// The CTAs of a thread block cluster share the row through distributed
// shared memory.
struct BlockCluster {
  __device__ static unsigned rank() { return cooperative_groups::this_cluster().block_rank(); }
  __device__ static unsigned size() { return cooperative_groups::this_cluster().num_blocks(); }
  __device__ static void sync() { cooperative_groups::this_cluster().sync(); }
  template <typename T>
  __device__ static T* remote(T* local, unsigned rank) {
    return cooperative_groups::this_cluster().map_shared_rank(local, static_cast<int>(rank));
  }
};
#endif

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x) & 31; }
__device__ inline int warp_id() { return static_cast<int>(threadIdx.x) >> 5; }

// Appends value_of(m) for every bit m of `take` to out[reserve(total) ...],
// where total is the warp's number of values; the whole warp calls it
// together, and reserve returns the same first slot to every lane. Values past
// `capacity` are not stored. A lane's slots come from one ballot per item (no
// scan across lanes); its values take consecutive slots, so each store needs
// only a predicate, not a branch.
template <int kItems, typename ValueOf, typename Reserve>
__device__ void append_reserved(unsigned take, ValueOf&& value_of, Rank* out, Reserve&& reserve,
                                int capacity) {
  const unsigned below = lanes_below();
  unsigned taken[kItems];
  int before = 0;
  int total = 0;
#pragma unroll
  for (int m = 0; m < kItems; ++m) {
    taken[m] = __ballot_sync(kFullMask, ((take >> m) & 1u) != 0);
    before += __popc(taken[m] & below);
    total += __popc(taken[m]);
  }
  if (total == 0) return;
  int slot = reserve(total) + before;
#pragma unroll
  for (int m = 0; m < kItems; ++m) {
    const bool mine = ((take >> m) & 1u) != 0;
    if (mine && slot < capacity) out[slot] = value_of(m);
    slot += mine ? 1 : 0;
  }
}

// append_reserved to out[*counter ...], shared by the CTA's warps: each warp
// reserves its slots with one shared-memory atomic, so the order between
// warps is not fixed (callers sort or compare by rank). Values past
// `capacity` are counted, not stored.
template <int kItems, typename ValueOf>
__device__ void append_items(unsigned take, ValueOf&& value_of, Rank* out, int* counter,
                             int capacity) {
  const auto reserve_shared = [counter](int total) {
    int base = 0;
    if (lane_id() == 0) base = atomicAdd(counter, total);
    return __shfl_sync(kFullMask, base, 0);
  };
  append_reserved<kItems>(take, value_of, out, reserve_shared, capacity);
}

// append_items for one value per lane.
__device__ inline void append(bool take, Rank value, Rank* out, int* counter, int capacity) {
  append_items<1>(take ? 1u : 0u, [&](int) { return value; }, out, counter, capacity);
}

// Exclusive prefix sum of one value per thread in thread order; *total gets
// the sum over the CTA.
__device__ inline int block_exclusive_sum(int value, int* warp_sums, int* total) {
  const int inclusive = warp_inclusive_sum(value);
  if (lane_id() == 31) warp_sums[warp_id()] = inclusive;
  __syncthreads();
  int before = 0;
  int all = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp_id()) before += warp_sums[w];
    all += warp_sums[w];
  }
  __syncthreads();
  *total = all;
  return before + inclusive - value;
}

// Adds one to histogram[bin] for every active lane; one atomic when the
// active lanes share a bin, so concentrated values do not serialize.
__device__ inline void add_to_histogram(int* histogram, bool active, int bin) {
  const unsigned active_lanes = __ballot_sync(kFullMask, active);
  if (active_lanes == 0) return;
  const int leader = __ffs(active_lanes) - 1;
  const int leader_bin = __shfl_sync(kFullMask, bin, leader);
  if (__all_sync(kFullMask, !active || bin == leader_bin)) {
    if (lane_id() == leader) atomicAdd(histogram + bin, __popc(active_lanes));
  } else if (active) {
    atomicAdd(histogram + bin, 1);
  }
}

// Finds, for each target, the bin (scanning from the largest down) that holds
// the target-th largest element: above < target <= above + count. One prefix
// sum serves every target.
template <int kTargets>
__device__ void find_threshold_bins(const int* histogram, const int (&targets)[kTargets],
                                    RowShared& s, FoundBin (&found)[kTargets]) {
  static_assert(kTargets <= 2, "RowShared holds two results");
  constexpr int kBinsPerThread = kBins / kThreads;
  if (threadIdx.x < kTargets) s.found[threadIdx.x] = FoundBin{-1, 0, 0};
  const int top = kBins - 1 - static_cast<int>(threadIdx.x) * kBinsPerThread;
  int counts[kBinsPerThread];
  int sum = 0;
#pragma unroll
  for (int m = 0; m < kBinsPerThread; ++m) {
    counts[m] = histogram[top - m];
    sum += counts[m];
  }
  int total = 0;
  int above = block_exclusive_sum(sum, s.warp_sums, &total);  // also orders the reset above
#pragma unroll
  for (int m = 0; m < kBinsPerThread; ++m) {
#pragma unroll
    for (int t = 0; t < kTargets; ++t) {
      if (above < targets[t] && above + counts[m] >= targets[t]) {
        s.found[t] = FoundBin{top - m, above, counts[m]};
      }
    }
    above += counts[m];
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kTargets; ++t) found[t] = s.found[t];
  __syncthreads();  // every thread has read the results before a later search resets them
}

__device__ inline FoundBin find_threshold_bin(const int* histogram, int target, RowShared& s) {
  const int targets[1] = {target};
  FoundBin found[1];
  find_threshold_bins(histogram, targets, s, found);
  return found[0];
}

// Row `row`'s output transform (common/logit_rules.hpp). Its request is
// looked up only with a block table; under request_offsets, select_row has
// left it in s.request (one search per row, not per output). The writers
// below derive it after their last barrier rather than hold it through
// the selection: the cluster kernel has no register to spare.
__device__ inline TopkRowOutput row_output(const TopkArgs& a, std::int64_t row, const RowShared& s) {
  const std::int64_t request = a.block_table == nullptr       ? 0
                               : a.request_offsets != nullptr ? s.request
                                                              : row / a.rows_per_request;
  return topk_row_output(a, row, request);
}

// Positions 0 .. length-1 (transformed), then -1 padding.
__device__ inline void write_all_positions(const TopkArgs& a, const TopkRowOutput& output, int length,
                                           std::int32_t* out) {
  for (int i = static_cast<int>(threadIdx.x); i < a.k; i += kThreads) {
    out[i] = i < length ? output(i) : -1;
  }
}
// For index_topk's selection (list_select.cuh), whose rows map to requests
// by rows_per_request alone (its TopkArgs carry no request_offsets).
__device__ inline void write_all_positions(const TopkArgs& a, std::int64_t row, int length,
                                           std::int32_t* out) {
  write_all_positions(a, topk_row_output(a, row, a.block_table == nullptr ? 0 : row / a.rows_per_request),
                      length, out);
}

template <typename Bits>
struct VectorOf;
template <>
struct VectorOf<std::uint32_t> {
  using Type = uint4;
  __device__ static void unpack(const uint4& v, std::uint32_t (&bits)[kVectorItems]) {
    bits[0] = v.x;
    bits[1] = v.y;
    bits[2] = v.z;
    bits[3] = v.w;
  }
};
template <>
struct VectorOf<std::uint16_t> {
  using Type = uint2;
  __device__ static void unpack(const uint2& v, std::uint16_t (&bits)[kVectorItems]) {
    bits[0] = static_cast<std::uint16_t>(v.x & 0xffffu);
    bits[1] = static_cast<std::uint16_t>(v.x >> 16);
    bits[2] = static_cast<std::uint16_t>(v.y & 0xffffu);
    bits[3] = static_cast<std::uint16_t>(v.y >> 16);
  }
};

template <typename Bits>
__device__ std::uint32_t load_key(const Bits* bits, int position) {
  return OrderedKey<Bits>::from_bits(__ldg(bits + position));
}

// Counts the sample keys in [base, base + range) into the histogram by
// (key - base) >> shift (shift keeps every such key within kBins bins).
__device__ inline void histogram_of_sample(const std::uint32_t (&keys)[kItemsPerThread],
                                           std::uint32_t base, std::uint64_t range, int shift,
                                           SharedStorage& sm) {
  for (int bin = static_cast<int>(threadIdx.x); bin < kBins; bin += kThreads) {
    sm.histogram[bin] = 0;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kItemsPerThread; ++m) {
    const std::uint32_t offset = keys[m] - base;
    if (keys[m] >= base && offset < range) atomicAdd(&sm.histogram[offset >> shift], 1);
  }
  __syncthreads();
}

// The target-th largest of the sample keys in [base, base + 2^shift), when
// that bin holds at most kRankedSampleKeys of them: they are gathered, and
// each is compared with all the others.
__device__ inline std::uint32_t ranked_sample_key(const std::uint32_t (&keys)[kItemsPerThread],
                                                  std::uint32_t base, int shift, int target,
                                                  SharedStorage& sm) {
  static_assert(kRankedSampleKeys <= kThreads &&
                    sizeof(sm.histogram) >= kRankedSampleKeys * sizeof(Rank),
                "one thread and room per gathered key");
  Rank* const gathered = reinterpret_cast<Rank*>(sm.histogram);
  if (threadIdx.x == 0) {
    sm.s.kept = 0;
    sm.s.ranked_key = base;  // kept only if the counts disagree: more candidates, still exact
  }
  __syncthreads();
  unsigned inside = 0;
#pragma unroll
  for (int m = 0; m < kItemsPerThread; ++m) {
    inside |= (keys[m] >= base && ((keys[m] - base) >> shift) == 0 ? 1u : 0u) << m;
  }
  append_items<kItemsPerThread>(
      inside, [&](int m) { return static_cast<Rank>(keys[m]); }, gathered, &sm.s.kept,
      kRankedSampleKeys);
  __syncthreads();
  const int count = min(sm.s.kept, kRankedSampleKeys);
  if (static_cast<int>(threadIdx.x) < count) {
    const auto mine = static_cast<std::uint32_t>(gathered[threadIdx.x]);
    int larger = 0;
    int at_least = 0;
    for (int j = 0; j < count; ++j) {
      const auto other = static_cast<std::uint32_t>(gathered[j]);
      larger += other > mine ? 1 : 0;
      at_least += other >= mine ? 1 : 0;
    }
    // Equal keys all qualify and store the same value.
    if (larger < target && target <= at_least) sm.s.ranked_key = mine;
  }
  __syncthreads();
  const std::uint32_t key = sm.s.ranked_key;
  __syncthreads();  // every thread has read it before the shared fields are reused
  return key;
}

// Sets the window from a sample of the whole row, 4 neighbours at each of
// kThreads evenly spaced places (identical in every CTA of the group): `low`
// is the sample's b-th largest key (the foot of its 1/2^11 bin of the
// sample's range when that bin holds at most kCoarseBinSamples sample keys,
// within 1/2^22 of the range when it holds more than kRankedSampleKeys,
// else exact),
// with b a few standard deviations above the number of winners expected in
// the sample; `high` is at or above its (expected / 4)-th largest. One
// histogram over the sample's own range finds both (a second level refines
// `low` in a crowded bin), so the window adapts to narrow, offset and spread
// rows alike.
template <typename Bits>
__device__ void choose_window(const Bits* bits, int length, int k, SharedStorage& sm) {
  static_assert(kItemsPerThread == kVectorItems, "one vector of neighbours per thread");
  using Vector = VectorOf<Bits>;
  // The neighbours come from one aligned vector load where the row allows it:
  // a quarter of the memory requests of single loads.
  const std::int64_t spot = static_cast<std::int64_t>(threadIdx.x) * length / kThreads;
  const int misalign = static_cast<int>(
      (reinterpret_cast<std::uintptr_t>(bits) / sizeof(Bits)) % kVectorItems);
  const std::int64_t start = spot - (spot + misalign) % kVectorItems;
  std::uint32_t keys[kItemsPerThread];
  if (start >= 0 && start + kVectorItems <= length) {
    Bits raw[kVectorItems];
    Vector::unpack(__ldg(reinterpret_cast<const typename Vector::Type*>(bits + start)), raw);
#pragma unroll
    for (int m = 0; m < kItemsPerThread; ++m) keys[m] = OrderedKey<Bits>::from_bits(raw[m]);
  } else {
#pragma unroll
    for (int m = 0; m < kItemsPerThread; ++m) {
      keys[m] = load_key(bits, static_cast<int>(min(spot + m, static_cast<std::int64_t>(length - 1))));
    }
  }
  std::uint32_t smallest = ~0u;
  std::uint32_t largest = 0;
#pragma unroll
  for (int m = 0; m < kItemsPerThread; ++m) {
    smallest = min(smallest, keys[m]);
    largest = max(largest, keys[m]);
  }
  smallest = warp_min(smallest);
  largest = warp_max(largest);
  __syncthreads();  // sample_min and sample_max are initialized
  if (lane_id() == 0) {
    atomicMin(&sm.s.sample_min, smallest);
    atomicMax(&sm.s.sample_max, largest);
  }
  __syncthreads();
  const std::uint32_t base = sm.s.sample_min;
  const std::uint32_t span = sm.s.sample_max - base;
  const int shift = max(0, 32 - __clz(static_cast<int>(span)) - 11);
  histogram_of_sample(keys, base, std::uint64_t{span} + 1, shift, sm);

  const int expected = static_cast<int>(static_cast<std::int64_t>(k) * kSampleSize / length);
  const int top = expected / 4;
  const int bottom =
      min(expected + 4 * static_cast<int>(sqrtf(static_cast<float>(expected))) + 16,
          kSampleSize - 1);
  const int targets[2] = {top + 1, bottom + 1};
  FoundBin found[2];
  find_threshold_bins(sm.histogram, targets, sm.s, found);
  const FoundBin& top_bin = found[0];
  const FoundBin& bottom_bin = found[1];
  const std::uint64_t high = min(
      std::uint64_t{base} + ((static_cast<std::uint64_t>(top_bin.bin) + 1) << shift) - 1,
      std::uint64_t{0xffffffffu});
  const std::uint32_t bin_base =
      base + static_cast<std::uint32_t>(static_cast<std::uint64_t>(bottom_bin.bin) << shift);
  std::uint32_t low = bin_base;
  // Refine `low` within its bin when the bin is crowded (narrow or tied
  // values). A bin of a few sample keys is left whole: it adds about
  // kCoarseBinSamples / kSampleSize of the row to the candidates at most.
  if (shift > 0 && bottom_bin.count > kCoarseBinSamples) {
    const int target = bottom + 1 - bottom_bin.above;
    if (bottom_bin.count <= kRankedSampleKeys) {
      low = ranked_sample_key(keys, bin_base, shift, target, sm);
    } else {
      const int fine_shift = max(0, shift - 11);
      histogram_of_sample(keys, bin_base, std::uint64_t{1} << shift, fine_shift, sm);
      const FoundBin fine_bin = find_threshold_bin(sm.histogram, target, sm.s);
      low += static_cast<std::uint32_t>(static_cast<std::uint64_t>(fine_bin.bin) << fine_shift);
    }
  }
  // The key just below +0.0's belongs to no value (-0.0 takes +0.0's key),
  // and the scan cannot compare floats with it (LowComparison); the key
  // below it serves as well.
  if (low == OrderedKey<std::uint32_t>::from_bits(0u) - 1u) --low;
  if (threadIdx.x == 0) {
    sm.s.window_low = low;
    const std::uint32_t width = static_cast<std::uint32_t>(max(high, std::uint64_t{low})) - low;
    int window_shift = 0;
    while (width > 1 && ((width - 1) >> window_shift) > static_cast<std::uint32_t>(kBins - 2)) {
      ++window_shift;
    }
    sm.s.window_shift = window_shift;
  }
  // Cleared for the scan's counts.
  for (int bin = static_cast<int>(threadIdx.x); bin < kBins; bin += kThreads) {
    sm.histogram[bin] = 0;
  }
  __syncthreads();
}

// Bin of a key above the window's low key: 1 .. kBins - 1 (bin 0 counts the
// keys equal to it).
__device__ inline int window_bin(std::uint32_t key, std::uint32_t low, int shift) {
  return static_cast<int>(min((key - low - 1u) >> shift, static_cast<std::uint32_t>(kBins - 2))) +
         1;
}

// Compares values with the window's low key as their keys would compare.
template <typename Bits>
struct LowComparison;
// float32 values are compared as floats, which costs less than their keys: the
// max takes NaN as -inf and float comparison has -0.0 equal to +0.0, as the
// keys have. Exact for every low key but the one just below +0.0's, which
// choose_window never gives.
template <>
struct LowComparison<std::uint32_t> {
  using Compared = float;
  float low;
  __device__ explicit LowComparison(std::uint32_t low_key) : low(float_of_key(low_key)) {}
  __device__ bool above(std::uint32_t bits, float* value) const {
    *value = fmaxf(__uint_as_float(bits), -INFINITY);
    return *value > low;
  }
  __device__ bool equal(float value) const { return value == low; }
  // Rank of a value above `low` (so not NaN): adding +0.0 turns -0.0 into
  // +0.0, then the key is the bits with the sign flipped (all bits for
  // negatives), as OrderedKey gives.
  __device__ static Rank rank(float value, std::uint32_t position) {
    const std::uint32_t bits = __float_as_uint(__fadd_rn(value, 0.0f));
    const auto sign_fill = static_cast<std::uint32_t>(static_cast<std::int32_t>(bits) >> 31);
    const std::uint32_t key = bits ^ (sign_fill | 0x80000000u);
    return rank_of(key, position);
  }
};
template <>
struct LowComparison<std::uint16_t> {
  using Compared = std::uint32_t;
  std::uint32_t low;
  __device__ explicit LowComparison(std::uint32_t low_key) : low(low_key) {}
  __device__ bool above(std::uint16_t bits, std::uint32_t* key) const {
    *key = OrderedKey<std::uint16_t>::from_bits(bits);
    return *key > low;
  }
  __device__ bool equal(std::uint32_t key) const { return key == low; }
  __device__ static Rank rank(std::uint32_t key, std::uint32_t position) {
    return rank_of(key, position);
  }
};

// Step 2 over positions [begin, end) of the row, with vector loads; only
// candidates get their rank.
template <typename Bits>
__device__ void scan_segment(const Bits* row_bits, int begin, int end, SharedStorage& sm) {
  using Vector = VectorOf<Bits>;
  const LowComparison<Bits> low(sm.s.window_low);
  using Compared = typename LowComparison<Bits>::Compared;
  int equal = 0;
  // This warp's slice of the list and its fill (the same in every lane).
  Rank* const slice = sm.candidates + warp_id() * kWarpCapacity;
  int fill = 0;
  const auto reserve_in_slice = [&fill](int total) {
    const int first = fill;
    fill += total;
    return first;
  };
  // bits[m] is at position first + m when bit m of `valid` is set (all of
  // them inside the vector loop, which then needs no masks).
  const auto consume = [&](const Bits (&bits)[kVectorItems], int first, unsigned valid) {
    unsigned take = 0;
    Compared compared[kVectorItems];
#pragma unroll
    for (int m = 0; m < kVectorItems; ++m) {
      const bool inside = ((valid >> m) & 1u) != 0;
      take |= (low.above(bits[m], &compared[m]) && inside ? 1u : 0u) << m;
      equal += low.equal(compared[m]) && inside ? 1 : 0;
    }
    append_reserved<kVectorItems>(
        take,
        [&](int m) {
          return LowComparison<Bits>::rank(compared[m], static_cast<std::uint32_t>(first + m));
        },
        slice, reserve_in_slice, kWarpCapacity);
  };

  const Bits* source = row_bits + begin;
  const int count = end - begin;
  const int misalign = static_cast<int>(
      (reinterpret_cast<std::uintptr_t>(source) / sizeof(Bits)) % kVectorItems);
  const int head = min(count, (kVectorItems - misalign) % kVectorItems);
  const int vectors = (count - head) / kVectorItems;
  const int tail_begin = head + vectors * kVectorItems;
  const auto* vector_source = reinterpret_cast<const typename Vector::Type*>(source + head);
  // Each thread keeps kLoadsAhead vector loads in flight: a slot is reloaded
  // as soon as its vector is consumed (consuming first lets the reload reuse
  // the slot's registers).
  typename Vector::Type ahead[kLoadsAhead];
#pragma unroll
  for (int u = 0; u < kLoadsAhead; ++u) {
    const int v = u * kThreads + static_cast<int>(threadIdx.x);
    ahead[u] = v < vectors ? __ldg(vector_source + v) : typename Vector::Type{};
  }
  for (int base = 0; base < vectors; base += kThreads * kLoadsAhead) {
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
      const int v = base + u * kThreads + static_cast<int>(threadIdx.x);
      const auto consume_loaded = [&](unsigned valid) {
        Bits bits[kVectorItems];
        Vector::unpack(ahead[u], bits);
        consume(bits, begin + head + v * kVectorItems, valid);
      };
      if (base + (u + 1) * kThreads <= vectors) {
        consume_loaded(0xfu);  // every thread has a vector: no masks
      } else if (base + u * kThreads < vectors) {
        consume_loaded(v < vectors ? 0xfu : 0u);
      }
      const int next = v + kThreads * kLoadsAhead;
      ahead[u] = next < vectors ? __ldg(vector_source + next) : typename Vector::Type{};
    }
  }
  // The unaligned head and tail: fewer than kVectorItems values each.
  {
    const int t = static_cast<int>(threadIdx.x);
    int offset = -1;
    if (t < head) {
      offset = t;
    } else if (t >= kVectorItems && t - kVectorItems < count - tail_begin) {
      offset = tail_begin + t - kVectorItems;
    }
    Bits bits[kVectorItems] = {};
    if (offset >= 0) bits[0] = source[offset];
    consume(bits, begin + offset, offset >= 0 ? 1u : 0u);
  }
  equal = warp_sum(equal);
  // This warp's candidates, counted per window bin (choose_window cleared the
  // histogram) while other warps still scan. A slice that overflowed gives
  // short counts, but then the row takes the slow path.
  __syncwarp();
  const std::uint32_t low_key = sm.s.window_low;
  const int shift = sm.s.window_shift;
  for (int j = lane_id(); j < min(fill, kWarpCapacity); j += 32) {
    atomicAdd(&sm.histogram[window_bin(key_of(slice[j]), low_key, shift)], 1);
  }
  if (lane_id() == 0) {
    if (equal > 0) atomicAdd(&sm.s.equal_count, equal);
    sm.s.warp_fill[warp_id()] = fill;
    atomicAdd(&sm.s.candidate_count, fill > kWarpCapacity ? kCandidateCapacity + 1 : fill);
  }
}

// Packs the scan's warp slices into one list of candidate_count ranks at the
// front of `candidates` (the first CTA of a group makes room so for the
// group's winners). A list whose slice overflowed stays as it is: the row
// takes the slow path, which does not read it.
__device__ inline void pack_warp_slices(SharedStorage& sm) {
  constexpr int kSlotsPerThread = kCandidateCapacity / kThreads;
  __syncthreads();  // every slice, fill and candidate_count is written
  const int packed = sm.s.candidate_count;
  if (packed > kCandidateCapacity) return;
  if (warp_id() == 0) {
    const int fill = lane_id() < kWarps ? sm.s.warp_fill[lane_id()] : 0;
    const int end = warp_inclusive_sum(fill);
    if (lane_id() < kWarps) sm.s.warp_fill[lane_id()] = end - fill;  // now the slice's new start
  }
  // Read every kept entry and its destination before any is overwritten.
  Rank values[kSlotsPerThread];
  int destinations[kSlotsPerThread];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSlotsPerThread; ++i) {
    const int slot = i * kThreads + static_cast<int>(threadIdx.x);
    const int slice = slot / kWarpCapacity;
    const int destination = sm.s.warp_fill[slice] + slot % kWarpCapacity;
    const int slice_end = slice + 1 < kWarps ? sm.s.warp_fill[slice + 1] : packed;
    destinations[i] = destination < slice_end ? destination : -1;
    values[i] = destinations[i] >= 0 ? sm.candidates[slot] : Rank{0};
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kSlotsPerThread; ++i) {
    if (destinations[i] >= 0) sm.candidates[destinations[i]] = values[i];
  }
}

// A candidate list in kWarps slices: slice w holds fill(w) ranks from
// ranks + w * stride. The scan's list keeps its warp slices (in an order
// fixed by the row alone); a contiguous list is split evenly. for_each hands
// each slice to its own warp, so f(rank, valid) runs the same number of times
// on every lane of a warp (warp-collective calls inside f are allowed), and a
// warp's lanes visit its slice in order.
struct CandidateRanks {
  const Rank* ranks;
  int stride;
  const int* fills;  // per slice, or nullptr for a contiguous list of `count`
  int count;
  bool fixed_order;  // the order does not depend on scheduling

  __device__ static CandidateRanks contiguous(const Rank* ranks, int count,
                                              bool fixed_order = false) {
    return {ranks, (count + kWarps - 1) / kWarps, nullptr, count, fixed_order};
  }
  __device__ static CandidateRanks warp_slices(const Rank* ranks, const int* fills) {
    return {ranks, kWarpCapacity, fills, 0, true};
  }
  __device__ int fill(int slice) const {
    return fills != nullptr ? min(fills[slice], stride)
                            : max(0, min(count - slice * stride, stride));
  }
  template <typename F>
  __device__ void for_each(F&& f) const {
    const Rank* const slice = ranks + warp_id() * stride;
    const int n = fill(warp_id());
    for (int base = 0; base < n; base += 32) {
      const int j = base + lane_id();
      f(j < n ? slice[j] : Rank{0}, j < n);
    }
  }
};

// Step 3, every CTA alike: returns the group's bin counts (bin 0: keys equal
// to `low`) and sets whether any CTA's candidate list overflowed (and, in a
// group, the first CTA's list length). A CTA alone has its own histogram for
// the counts. In a group, each CTA sums its share of the bins over the group
// and stores the sums in every CTA's `totals`, so no CTA reads all of its
// peers' counts.
template <typename Group>
__device__ const int* merge_group_counts(SharedStorage& sm) {
  const unsigned group_size = Group::size();
  if (group_size == 1) {
    if (threadIdx.x == 0) {
      sm.histogram[0] = sm.s.equal_count;
      sm.s.overflow = sm.s.candidate_count > kCandidateCapacity ? 1 : 0;
    }
    __syncthreads();
    return sm.histogram;
  }
  const int share = (kBins - 1 + static_cast<int>(group_size) - 1) / static_cast<int>(group_size);
  const int first_bin = 1 + static_cast<int>(Group::rank()) * share;
  const int end_bin = min(kBins, first_bin + share);
  for (int bin = first_bin + static_cast<int>(threadIdx.x); bin < end_bin; bin += kThreads) {
    int sum = 0;
#pragma unroll
    for (unsigned r = 0; r < kMaxGroupSize; ++r) {
      if (r < group_size) sum += Group::remote(&sm, r)->histogram[bin];
    }
#pragma unroll
    for (unsigned r = 0; r < kMaxGroupSize; ++r) {
      if (r < group_size) Group::remote(&sm, r)->totals[bin] = sum;
    }
  }
  if (warp_id() == 0) {
    // One lane per peer, so the remote reads overlap.
    const unsigned peer_rank = static_cast<unsigned>(lane_id());
    int equal = 0;
    bool overflow = false;
    if (peer_rank < group_size) {
      const RowShared& peer = Group::remote(&sm, peer_rank)->s;
      equal = peer.equal_count;
      overflow = peer.candidate_count > kCandidateCapacity;
      if (peer_rank == 0) sm.s.first_count = peer.candidate_count;
    }
    equal = warp_sum(equal);
    overflow = __any_sync(kFullMask, overflow);
    if (lane_id() == 0) {
      sm.totals[0] = equal;
      sm.s.overflow = overflow ? 1 : 0;
    }
  }
  Group::sync();  // every share of the totals has landed in every CTA
  return sm.totals;
}

// The winners of a list (ranks at or above `floor`) laid out in list order:
// the slot of this warp's first winner and the CTA's number of winners.
struct WinnerSlots {
  int first_of_warp;
  int total;
};

__device__ inline WinnerSlots winner_slots(const CandidateRanks& list, Rank floor, RowShared& s) {
  int mine = 0;
  list.for_each([&](Rank v, bool valid) {
    mine += __popc(__ballot_sync(kFullMask, valid && v >= floor));
  });
  if (lane_id() == 0) s.warp_sums[warp_id()] = mine;
  __syncthreads();
  WinnerSlots slots{0, 0};
  for (int w = 0; w < kWarps; ++w) {
    const int winners = s.warp_sums[w];
    slots.first_of_warp += w < warp_id() ? winners : 0;
    slots.total += winners;
  }
  __syncthreads();  // warp_sums is read before anything reuses it
  return slots;
}

// Calls f(rank, slot) for each winner of the list, its slot counted in list
// order from `slot`, this warp's first (winner_slots).
template <typename F>
__device__ void for_each_winner(const CandidateRanks& list, Rank floor, int slot, F&& f) {
  const unsigned below = lanes_below();
  list.for_each([&](Rank v, bool valid) {
    const bool take = valid && v >= floor;
    const unsigned taken = __ballot_sync(kFullMask, take);
    if (take) f(v, slot + __popc(taken & below));
    slot += __popc(taken);
  });
}

// Moves this CTA's candidates ranked at or above `floor` to the group's
// first CTA's list from slot `start` on, after those of the CTAs ranked
// before it and in its own list order, so that the gathered list's order is
// fixed by the row. Returns how many the group moved. The caller has checked
// that they fit and that the first CTA's own candidates lie below `start`;
// every CTA of the group calls it.
template <typename Group>
__device__ int push_candidates(const CandidateRanks& own, Rank floor, int start,
                               SharedStorage& sm) {
  const WinnerSlots slots = winner_slots(own, floor, sm.s);
  if (threadIdx.x == 0) sm.s.push_count = slots.total;
  Group::sync();  // every CTA's count is published
  int before = 0;
  int moved = 0;
  for (unsigned r = 0; r < Group::size(); ++r) {
    const int count = Group::remote(&sm, r)->s.push_count;
    before += r < Group::rank() ? count : 0;
    moved += count;
  }
  Rank* const gathered = Group::remote(&sm, 0)->candidates + start;
  const int room = kCandidateCapacity - start;
  for_each_winner(own, floor, before + slots.first_of_warp, [&](Rank v, int slot) {
    if (slot < room) gathered[slot] = v;
  });
  return min(moved, room);
}

template <typename Bits>
struct RowRanks {
  const Bits* bits;
  int length;
  template <typename F>
  __device__ void for_each(F&& f) const {
    for (int base = 0; base < length; base += kThreads * kLoadsAhead) {
      std::uint32_t keys[kLoadsAhead];
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
        keys[u] = i < length ? load_key(bits, i) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
        f(rank_of(keys[u], static_cast<std::uint32_t>(i)), i < length);
      }
    }
  }
};

// Ranks in [low, high] of which `needed` are still winners; the k - needed
// others are above high.
struct RankRange {
  Rank low;
  Rank high;
  int needed;
};

// Count, smallest and largest of the source's ranks within r.
template <typename Source>
__device__ void range_stats(const Source& source, const RankRange& r, RowShared& s) {
  if (threadIdx.x == 0) {
    s.range_count = 0;
    s.range_min = ~Rank{0};
    s.range_max = 0;
  }
  __syncthreads();
  int count = 0;
  Rank smallest = ~Rank{0};
  Rank largest = 0;
  source.for_each([&](Rank v, bool valid) {
    if (valid && v >= r.low && v <= r.high) {
      ++count;
      smallest = min(smallest, v);
      largest = max(largest, v);
    }
  });
  count = warp_sum(count);
  smallest = warp_min(smallest);
  largest = warp_max(largest);
  if (lane_id() == 0 && count > 0) {
    atomicAdd(&s.range_count, count);
    atomicMin(&s.range_min, smallest);
    atomicMax(&s.range_max, largest);
  }
  __syncthreads();
}

// Splits [smallest, largest] of the range (from range_stats) into bins and
// moves r to the one holding its needed-th largest rank.
template <typename Source>
__device__ void narrow_once(const Source& source, RankRange& r, SharedStorage& sm) {
  const Rank low = sm.s.range_min;
  const Rank high = sm.s.range_max;
  const int shift = max(0, 64 - __clzll(static_cast<long long>(high - low)) - 11);
  for (int bin = static_cast<int>(threadIdx.x); bin < kBins; bin += kThreads) {
    sm.histogram[bin] = 0;
  }
  __syncthreads();
  source.for_each([&](Rank v, bool valid) {
    const bool inside = valid && v >= low && v <= high;
    add_to_histogram(sm.histogram, inside, inside ? static_cast<int>((v - low) >> shift) : 0);
  });
  __syncthreads();
  const FoundBin found = find_threshold_bin(sm.histogram, r.needed, sm.s);
  r.needed -= found.above;
  r.low = low + (static_cast<Rank>(found.bin) << shift);
  r.high = min(high, r.low + ((Rank{1} << shift) - 1));
}

// Moves r to the single r.needed-th largest of the source's ranks in
// [r.low, r.high] when the range holds `expected` of them, at most kThreads:
// they are gathered, and each is compared with all the others (one step
// instead of narrow's rounds). Returns false, r unchanged, when the range
// holds another number of ranks or no single one qualifies.
template <typename Source>
__device__ bool select_in_small_range(const Source& source, RankRange& r, int expected,
                                      SharedStorage& sm) {
  static_assert(sizeof(sm.histogram) >= kThreads * sizeof(Rank), "room for the gathered ranks");
  Rank* const gathered = reinterpret_cast<Rank*>(sm.histogram);
  __syncthreads();  // the caller's reads of the shared fields reset below are done
  if (threadIdx.x == 0) {
    sm.s.kept = 0;
    sm.s.range_count = 0;
  }
  __syncthreads();
  source.for_each([&](Rank v, bool valid) {
    append(valid && v >= r.low && v <= r.high, v, gathered, &sm.s.kept, kThreads);
  });
  __syncthreads();
  const int count = sm.s.kept;
  if (count != expected) return false;
  if (static_cast<int>(threadIdx.x) < count) {
    const Rank mine = gathered[threadIdx.x];
    int larger = 0;
    for (int j = 0; j < count; ++j) larger += gathered[j] > mine ? 1 : 0;
    if (larger == r.needed - 1) {
      sm.s.range_min = mine;
      atomicAdd(&sm.s.range_count, 1);
    }
  }
  __syncthreads();
  const bool single = sm.s.range_count == 1;
  if (single) r = {sm.s.range_min, sm.s.range_min, 1};
  __syncthreads();  // every thread has read the result before the shared fields are reused
  return single;
}

// Ranks narrow takes to select_in_small_range: as many pairwise comparisons
// per thread cost about one round of narrowing.
inline constexpr int kSmallRange = 64;

// Narrows r until it holds exactly r.needed ranks of the source, or, with
// fit_total >= 0, until the ranks at or above r.low number at most fit_total.
// Returns false, rather than loop, when the source disagrees with the counts
// that led here: one rank value counted more than once (a source that lists a
// rank twice, after a reported error) or fewer ranks in r than promised.
template <typename Source>
__device__ bool narrow(const Source& source, RankRange& r, int k, int fit_total,
                       SharedStorage& sm) {
  for (;;) {
    range_stats(source, r, sm.s);
    const int count = sm.s.range_count;
    if (count == r.needed || k - r.needed + count <= fit_total) return true;
    if (sm.s.range_min == sm.s.range_max || count < r.needed) return false;
    // Few ranks left: one comparison step instead of more rounds (which
    // finds no single rank only where ranks repeat: a disagreement).
    if (fit_total < 0 && count <= kSmallRange) return select_in_small_range(source, r, count, sm);
    narrow_once(source, r, sm);
  }
}

// Records that row `row`'s selection stopped on counts that disagree with its
// ranks: its indices are written but not exact.
__device__ inline void report_disagreement(const TopkArgs& a, std::int64_t row) {
  if (threadIdx.x == 0) {
    report_device_error(a.error, kSelectionDisagreement, row, 0, 0);
  }
}

// Collects the source's ranks at or above `floor` as the candidate list.
template <typename Source>
__device__ int collect_candidates(const Source& source, Rank floor, SharedStorage& sm) {
  if (threadIdx.x == 0) sm.s.kept = 0;
  __syncthreads();
  source.for_each([&](Rank v, bool valid) {
    append(valid && v >= floor, v, sm.candidates, &sm.s.kept, kCandidateCapacity);
  });
  __syncthreads();
  return sm.s.kept;
}

// write_candidates for unsorted output of a list in a fixed order: the
// winners in list order, each warp's after those of the warps before it.
__device__ inline int write_in_list_order(const TopkArgs& a, std::int64_t row,
                                          const CandidateRanks& list, Rank floor,
                                          SharedStorage& sm, std::int32_t* out) {
  const WinnerSlots slots = winner_slots(list, floor, sm.s);
  const TopkRowOutput output = row_output(a, row, sm.s);
  for_each_winner(list, floor, slots.first_of_warp, [&](Rank v, int slot) {
    // More than k winners only after a reported error (a rank listed twice).
    if (slot < a.k) out[slot] = output(static_cast<std::int32_t>(position_of(v)));
  });
  return min(slots.total, a.k);
}

// write_candidates for unsorted output of a row of at most kBitmapPositions:
// the winners' positions are marked in a bitmap that each thread then reads
// in order over its own run of words.
__device__ inline int write_in_position_order(const TopkArgs& a, std::int64_t row, int length,
                                              const CandidateRanks& list, Rank floor,
                                              SharedStorage& sm, std::int32_t* out) {
  const int words = (length + 31) / 32;
  for (int w = static_cast<int>(threadIdx.x); w < words; w += kThreads) sm.bitmap[w] = 0;
  __syncthreads();
  list.for_each([&](Rank v, bool valid) {
    if (valid && v >= floor) {
      const std::uint32_t p = position_of(v);
      atomicOr(&sm.bitmap[p >> 5], 1u << (p & 31u));
    }
  });
  __syncthreads();
  const int per_thread = (words + kThreads - 1) / kThreads;
  const int first = static_cast<int>(threadIdx.x) * per_thread;
  int mine = 0;
  for (int w = first; w < min(first + per_thread, words); ++w) mine += __popc(sm.bitmap[w]);
  int total = 0;
  int slot = block_exclusive_sum(mine, sm.s.warp_sums, &total);
  const TopkRowOutput output = row_output(a, row, sm.s);
  for (int w = first; w < min(first + per_thread, words); ++w) {
    for (std::uint32_t marks = sm.bitmap[w]; marks != 0; marks &= marks - 1) {
      // More than k marks only after a reported error (a rank listed twice).
      if (slot < a.k) out[slot] = output(w * 32 + __ffs(static_cast<int>(marks)) - 1);
      ++slot;
    }
  }
  return min(total, a.k);
}

// Writes the candidates ranked at or above `floor` (at most k of them) to
// out[0, count): in an order fixed by the row (list order, or position order
// when the list's own order is not fixed), or in rank order for sorted
// output; returns count.
__device__ inline int write_candidates(const TopkArgs& a, std::int64_t row, int length,
                                       const CandidateRanks& list, Rank floor, SharedStorage& sm,
                                       std::int32_t* out) {
  if (!a.sorted && list.fixed_order) return write_in_list_order(a, row, list, floor, sm, out);
  if (!a.sorted && length <= kBitmapPositions) {
    return write_in_position_order(a, row, length, list, floor, sm, out);
  }
  if (threadIdx.x == 0) sm.s.staged_count = 0;
  __syncthreads();
  list.for_each([&](Rank v, bool valid) {
    // Sorted ascending below: ~rank puts the best first; both forms keep
    // the position in their low 32 bits.
    append(valid && v >= floor, a.sorted ? ~v : static_cast<Rank>(position_of(v)), sm.staged,
           &sm.s.staged_count, kMaxTopk);
  });
  __syncthreads();
  const int count = min(sm.s.staged_count, a.k);  // more than k only after a reported error
  Rank items[kItemsPerThread];
#pragma unroll
  for (int m = 0; m < kItemsPerThread; ++m) {
    const int i = static_cast<int>(threadIdx.x) * kItemsPerThread + m;
    items[m] = i < count ? sm.staged[i] : ~Rank{0};
  }
  __syncthreads();  // the sort's scratch overlays the candidates
  if (count > 0) {
    const int end_bit = a.sorted ? 64 : 32 - __clz(length);
    RankSort(sm.sort).Sort(items, 0, end_bit);
  }
  const TopkRowOutput output = row_output(a, row, sm.s);
#pragma unroll
  for (int m = 0; m < kItemsPerThread; ++m) {
    const int i = static_cast<int>(threadIdx.x) * kItemsPerThread + m;
    if (i < count) out[i] = output(static_cast<std::int32_t>(static_cast<std::uint32_t>(items[m])));
  }
  return count;
}

// Writes the first `needed` positions (in position order) whose key is `key`
// to out[0, needed), reading the row from its start only as far as needed.
template <typename Bits>
__device__ void write_equal_positions(const TopkArgs& a, std::int64_t row, const Bits* bits,
                                      int length, std::uint32_t key, int needed,
                                      std::int32_t* out, RowShared& s) {
  constexpr int kChunk = kThreads * kVectorItems;  // consecutive positions per thread
  const TopkRowOutput output = row_output(a, row, s);
  int taken = 0;
  for (int base = 0; base < length && taken < needed; base += kChunk * kLoadsAhead) {
    bool equal[kLoadsAhead][kVectorItems];
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
#pragma unroll
      for (int m = 0; m < kVectorItems; ++m) {
        const int p = base + u * kChunk + static_cast<int>(threadIdx.x) * kVectorItems + m;
        equal[u][m] = p < length && load_key(bits, p) == key;
      }
    }
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
      if (base + u * kChunk >= length || taken >= needed) break;
      int mine = 0;
#pragma unroll
      for (int m = 0; m < kVectorItems; ++m) mine += equal[u][m] ? 1 : 0;
      int total = 0;
      int rank = taken + block_exclusive_sum(mine, s.warp_sums, &total);
#pragma unroll
      for (int m = 0; m < kVectorItems; ++m) {
        if (equal[u][m]) {
          const int p = base + u * kChunk + static_cast<int>(threadIdx.x) * kVectorItems + m;
          if (rank < needed) out[rank] = output(p);
          ++rank;
        }
      }
      taken += total;
    }
  }
}

// Most rows row_by_length orders: kOrderedRowsPerThread per thread.
inline constexpr int kOrderedRowsPerThread = 8;
inline constexpr int kMaxOrderedRows = kThreads * kOrderedRowsPerThread;

// Sets sm.s.ordered_row to the place-th longest (ties by row) of rows
// [first, rows), for the place-th CTA of the second wave. CTAs start in index
// order, so the longest rows start first and the short ones fill the
// multiprocessors that free up last: the rows end closer together than in row
// order. The first wave keeps row order, as ordering it would delay every
// CTA's start alike. Every CTA derives the same order from the lengths
// (clamped to [0, cols], grouped into kBins bins of that range), so each row
// is taken once. Rows are spread over the threads (row first + m·kThreads +
// thread), one pass each: every CTA of the wave pays for the order.
__device__ inline void row_by_length(const TopkArgs& a, int first, int rows, int place,
                                     SharedStorage& sm) {
  const int passes = (rows - first + kThreads - 1) / kThreads;
  const float bins_per_position =
      static_cast<float>(kBins - 1) / static_cast<float>(max(a.cols, std::int64_t{1}));
  for (int bin = static_cast<int>(threadIdx.x); bin < kBins; bin += kThreads) sm.histogram[bin] = 0;
  __syncthreads();
  int bins[kOrderedRowsPerThread];
#pragma unroll
  for (int m = 0; m < kOrderedRowsPerThread; ++m) {
    if (m >= passes) break;
    const std::int64_t row = first + std::int64_t{m} * kThreads + threadIdx.x;
    bins[m] = -1;
    if (row < rows) {
      const std::int64_t length =
          min(max(std::int64_t{a.lengths[row * a.lengths_stride]}, std::int64_t{0}), a.cols);
      bins[m] = min(static_cast<int>(static_cast<float>(length) * bins_per_position), kBins - 1);
    }
    add_to_histogram(sm.histogram, bins[m] >= 0, bins[m]);
  }
  __syncthreads();
  // The bin holding the place-th longest row, then that row: the
  // (place - above)-th of the bin's rows in row order.
  const FoundBin found = find_threshold_bin(sm.histogram, place + 1, sm.s);
  int index = place - found.above;
#pragma unroll
  for (int m = 0; m < kOrderedRowsPerThread; ++m) {
    if (m >= passes) break;
    const bool in_bin = bins[m] == found.bin;
    int in_pass = 0;
    const int before = block_exclusive_sum(in_bin ? 1 : 0, sm.s.warp_sums, &in_pass);
    if (in_bin && before == index) {
      sm.s.ordered_row = first + m * kThreads + static_cast<int>(threadIdx.x);
    }
    index -= in_pass;
    if (index < 0) break;
  }
  __syncthreads();
}

// row_by_length's choice, read again each time (see select_row).
__device__ inline int ordered_row(const SharedStorage& sm) {
  return *static_cast<const volatile int*>(&sm.s.ordered_row);
}

// The row's candidates after the scan, from the start select_row left in
// shared memory, read again at each use rather than held in a register
// through the selection (as ordered_row).
template <typename Bits>
__device__ const Bits* row_values(const TopkArgs& a, std::int64_t row, const SharedStorage& sm) {
  return static_cast<const Bits*>(a.logits) + row * a.logits_stride +
         *static_cast<const volatile int*>(&sm.s.first_column);
}

// The row row_of() names, shared by the Group::size() CTAs of a group.
// row_of is asked again after the scan rather than its answer held through
// it: the scan's loads need every register.
template <typename Bits, typename Group, typename RowOf>
__device__ void select_row(const TopkArgs& a, RowOf&& row_of, SharedStorage& sm) {
  const unsigned group_size = Group::size();
  const unsigned group_rank = Group::rank();
  std::int64_t row = row_of();
  const int length = a.lengths[row * a.lengths_stride];
  // Any column: the loads below take a row's unaligned head and tail one
  // value at a time and the rest as aligned vectors.
  const int first_column = topk_row_start(a, row);
  std::int32_t* out = a.indices + row * a.indices_stride;

  RowViolation violation = topk_row_violation(a, length, first_column);
  if (a.request_offsets != nullptr) {
    // One thread searches the row's request; the CTA reads its answer.
    if (threadIdx.x == 0) sm.s.request = static_cast<int>(topk_request(a, row));
    __syncthreads();
    if (violation.kind == kNoDeviceError && sm.s.request < 0) {
      violation = {kRowWithoutRequest, a.requests, a.request_offsets[a.requests]};
    }
  }
  const bool refused = violation.kind != kNoDeviceError;
  if (refused || length <= a.k) {
    if (group_rank == 0) {
      if (refused && threadIdx.x == 0) {
        report_device_error(a.error, violation.kind, row, violation.value, violation.bound);
      }
      // A refused row selects nothing: all -1, no transform read.
      write_all_positions(a, refused ? TopkRowOutput{} : row_output(a, row, sm.s), refused ? 0 : length, out);
    }
    return;
  }

  const Bits* bits = static_cast<const Bits*>(a.logits) + row * a.logits_stride + first_column;
  if (threadIdx.x == 0) {
    sm.s.first_column = first_column;
    sm.s.equal_count = 0;
    sm.s.candidate_count = 0;
    sm.s.sample_min = ~0u;
    sm.s.sample_max = 0;
  }
  choose_window(bits, length, a.k, sm);
  const std::int64_t share =
      (static_cast<std::int64_t>(length + group_size - 1) / group_size + kSegmentGranule - 1) /
      kSegmentGranule * kSegmentGranule;
  const int begin = static_cast<int>(min(group_rank * share, static_cast<std::int64_t>(length)));
  const int end = static_cast<int>(min(begin + share, static_cast<std::int64_t>(length)));
  scan_segment(bits, begin, end, sm);
  row = row_of();
  out = a.indices + row * a.indices_stride;
  // The first CTA of a group packs its list to make room for the group's
  // winners; the others push theirs from their slices.
  const bool packed = group_size > 1 && group_rank == 0;
  if (packed) pack_warp_slices(sm);
  Group::sync();  // every CTA's counts and candidates are complete

  const std::uint32_t low = sm.s.window_low;
  const int shift = sm.s.window_shift;
  const int* totals = merge_group_counts<Group>(sm);
  const FoundBin threshold = find_threshold_bin(totals, a.k, sm.s);
  const int bin = threshold.bin;
  const int above = threshold.above;
  // The candidates at or above the threshold's bin: all of the list of a
  // single CTA; a group's move to the end of its first CTA's list, above the
  // candidates that list still holds.
  const int winners_and_bin = above + (bin > 0 ? threshold.count : 0);
  const bool gathered =
      bin >= 0 && sm.s.overflow == 0 &&
      winners_and_bin + (group_size > 1 ? sm.s.first_count : 0) <= kCandidateCapacity;
  CandidateRanks list =
      packed ? CandidateRanks::contiguous(sm.candidates, min(sm.s.candidate_count, kCandidateCapacity))
             : CandidateRanks::warp_slices(sm.candidates, sm.s.warp_fill);
  if (group_size > 1) {
    const int start = kCandidateCapacity - winners_and_bin;
    int moved = 0;
    if (gathered) {
      const std::uint64_t floor_key =
          bin == 0 ? std::uint64_t{low} + 1
                   : std::uint64_t{low} + 1 + (static_cast<std::uint64_t>(bin - 1) << shift);
      moved = push_candidates<Group>(list, static_cast<Rank>(floor_key) << 32, start, sm);
    }
    Group::sync();  // every push has landed; no CTA reads another's memory
    if (group_rank != 0) return;
    list = CandidateRanks::contiguous(sm.candidates + start, min(moved, winners_and_bin),
                                      /*fixed_order=*/true);
  }

  RankRange r{};
  if (!gathered) {
    // The sample misjudged the row: narrow over the whole row until the
    // candidates fit, then collect them.
    const RowRanks<Bits> whole_row{row_values<Bits>(a, row, sm), length};
    r = {0, ~Rank{0}, a.k};
    if (!narrow(whole_row, r, a.k, kCandidateCapacity, sm)) report_disagreement(a, row);
    list = CandidateRanks::contiguous(sm.candidates, collect_candidates(whole_row, r.low, sm));
  } else if (bin == 0) {
    // The k-th largest key is `low`: every candidate wins, then the first
    // equal keys in position order.
    const int written = write_candidates(a, row, length, list, 0, sm, out);
    write_equal_positions(a, row, row_values<Bits>(a, row, sm), length, low, a.k - written, out + written,
                          sm.s);
    return;
  } else {
    const std::uint64_t bin_low = std::uint64_t{low} + 1 + (static_cast<std::uint64_t>(bin - 1) << shift);
    const std::uint64_t bin_high =
        bin == kBins - 1 ? 0xffffffffull
                         : min(std::uint64_t{low} + (static_cast<std::uint64_t>(bin) << shift),
                               static_cast<std::uint64_t>(0xffffffffull));
    r = {static_cast<Rank>(bin_low) << 32, (static_cast<Rank>(bin_high) << 32) | 0xffffffffull,
         a.k - above};
  }
  // The threshold's bin holds few ranks but for crowded rows.
  const bool selected = gathered && threshold.count <= kThreads &&
                        select_in_small_range(list, r, threshold.count, sm);
  if (!selected && !narrow(list, r, a.k, -1, sm)) report_disagreement(a, row);
  write_candidates(a, row, length, list, r.low, sm, out);
}

}  // namespace dsa::detail::cuda::topk_impl
