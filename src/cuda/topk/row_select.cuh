// Exact radix top-k of one row per CTA group.
//
// A row is split into contiguous segments, one per CTA of a group (a thread
// block cluster on sm_90, a single CTA elsewhere). Selection works on
// order-preserving keys (ordered_key.cuh), most significant 11-bit digit
// first: every pass builds a digit histogram of the elements still matching
// the prefix chosen so far, the group sums the histograms, and every CTA scans
// the sum for the bin that holds the k-th largest key. Passes stop once the
// full key is known or every element of the chosen bin is a winner. During the
// second pass, a CTA whose segment is in shared memory also lists the
// positions that can still win, so later passes visit only those. Winners
// are then the elements above the threshold plus the first `remaining`
// elements equal to it in position order; each is placed by counting, in
// position order (CTA rank, warp, iteration, lane), so the output never
// depends on scheduling.
#pragma once

#include <cooperative_groups.h>
#include <cuda_pipeline.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_radix_sort.cuh>

#include "cuda/topk/ordered_key.cuh"
#include "device_error.hpp"
#include "dsa/topk.hpp"

namespace dsa::detail::cuda::topk_impl {

inline constexpr int kThreads = 512;
inline constexpr int kWarps = kThreads / 32;
inline constexpr unsigned kFullMask = 0xffffffffu;
inline constexpr int kSortItemsPerThread = kMaxTopk / kThreads;
// Largest group of CTAs sharing one row (the portable cluster size limit).
inline constexpr int kMaxGroupSize = 8;
// Rows are split between CTAs in multiples of this many positions.
inline constexpr int kSegmentGranule = 64;

// Sorts one row's winners by key, largest first; stable, so equal keys keep
// the position order they are gathered in.
template <typename Bits>
using WinnerSort =
    cub::BlockRadixSort<typename OrderedKey<Bits>::Key, kThreads, kSortItemsPerThread, int>;

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
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0;
  std::int64_t max_blocks = 0;
  int rows_per_request = 1;
  DeviceErrorRecord* error = nullptr;
  int group_size = 1;  // CTAs per row
  // Byte offset of the survivor index lists in dynamic shared memory; 0: none.
  int survivor_offset = 0;
};

// Per-CTA scalars; cta_greater / cta_equal are read by the other CTAs.
struct RowShared {
  int warp_sums[kWarps];
  int warp_greater[kWarps];
  int warp_equal[kWarps];
  int cta_greater;
  int cta_equal;
  int greater_offset;
  int equal_offset;
  int found_bin;
  int found_above;
  int found_count;
  int warp_survivors[kWarps];
  unsigned overflow_passes;  // bit p: a warp overflowed its survivor slots in pass p
};

// Dynamic shared memory: two histogram buffers (passes alternate between
// them, see gather_histograms), the group's summed histogram, the scalars,
// the segment (or the sort's scratch), then the survivor lists if any. The
// histogram buffers and the sum double as the gather buffer of sorted output
// (keys, positions) once selection is over.
inline constexpr std::size_t kHistogramBytes = kMaxBins * sizeof(int);
inline constexpr int kHistogramBuffers = 2;
inline constexpr std::size_t kSegmentOffset =
    (kHistogramBuffers + 1) * kHistogramBytes + (sizeof(RowShared) + 15) / 16 * 16;

struct SharedLayout {
  int* histogram;
  int* totals;
  RowShared* shared;
  unsigned char* segment;
  __device__ explicit SharedLayout(unsigned char* base)
      : histogram(reinterpret_cast<int*>(base)),
        totals(reinterpret_cast<int*>(base + kHistogramBuffers * kHistogramBytes)),
        shared(reinterpret_cast<RowShared*>(base + (kHistogramBuffers + 1) * kHistogramBytes)),
        segment(base + kSegmentOffset) {}
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
  __device__ static void arrive() {}
  __device__ static void wait() {}
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
  // Split barrier that keeps every CTA's shared memory alive until the
  // others are done reading it.
  __device__ static void arrive() { (void)cooperative_groups::this_cluster().barrier_arrive(); }
  __device__ static void wait() { cooperative_groups::this_cluster().barrier_wait(); }
};
#endif

// Keys held in shared memory; the first pass turns raw bits into keys in place.
template <typename Bits>
struct SharedKeys {
  using Key = typename OrderedKey<Bits>::Key;
  Key* keys;
  int count;
  __device__ Key first_pass_key(int j) const {
    const Key key = OrderedKey<Bits>::from_bits(keys[j]);
    keys[j] = key;
    return key;
  }
  __device__ Key key(int j) const { return keys[j]; }
  static constexpr bool kCanCompact = true;
  template <typename F>
  __device__ void for_each(bool first, F&& f) const;
};

// Keys computed from global memory on every pass.
template <typename Bits>
struct GlobalKeys {
  using Key = typename OrderedKey<Bits>::Key;
  const Bits* bits;
  int count;
  __device__ Key first_pass_key(int j) const { return key(j); }
  __device__ Key key(int j) const { return OrderedKey<Bits>::from_bits(__ldg(bits + j)); }
  static constexpr bool kCanCompact = false;
  template <typename F>
  __device__ void for_each(bool /*first*/, F&& f) const;
};

__device__ inline int lane_id() { return static_cast<int>(threadIdx.x) & 31; }
__device__ inline int warp_id() { return static_cast<int>(threadIdx.x) >> 5; }

// Each warp walks its own contiguous range of [0, count), 32 elements per
// step, lane-interleaved; f(j, valid, key) runs on the whole warp every step,
// so position order is (warp, step, lane). Keys of a few steps are loaded
// ahead to keep several global loads in flight.
__device__ inline int warp_range_length(int count) {
  return ((count + kWarps - 1) / kWarps + 31) & ~31;
}

template <typename Load, typename F>
__device__ void for_each_key_in_warp_range(int count, Load&& load, F&& f) {
  constexpr int kStepsAhead = 4;
  const int per_warp = warp_range_length(count);
  const int begin = warp_id() * per_warp;
  const int end = min(begin + per_warp, count);
  for (int base = begin; base < end; base += 32 * kStepsAhead) {
    unsigned keys[kStepsAhead];
#pragma unroll
    for (int step = 0; step < kStepsAhead; ++step) {
      const int j = base + step * 32 + lane_id();
      keys[step] = j < end ? static_cast<unsigned>(load(j)) : 0u;
    }
#pragma unroll
    for (int step = 0; step < kStepsAhead; ++step) {
      if (base + step * 32 < end) {
        const int j = base + step * 32 + lane_id();
        f(j, j < end, keys[step]);
      }
    }
  }
}

template <typename Bits>
template <typename F>
__device__ void SharedKeys<Bits>::for_each(bool first, F&& f) const {
  if (first) {
    for_each_key_in_warp_range(
        count, [&](int j) { return first_pass_key(j); }, f);
  } else {
    for_each_key_in_warp_range(
        count, [&](int j) { return key(j); }, f);
  }
}

template <typename Bits>
template <typename F>
__device__ void GlobalKeys<Bits>::for_each(bool /*first*/, F&& f) const {
  for_each_key_in_warp_range(
      count, [&](int j) { return key(j); }, f);
}

// The elements of a shared segment that can still be winners: each warp
// keeps the positions (in its own range, in order) that survived a pass, so
// later passes and the collection visit only those, in the same order.
template <typename Bits>
struct CompactedKeys {
  using Key = typename OrderedKey<Bits>::Key;
  const Key* keys;
  std::uint16_t* survivors;  // per warp: `capacity` slots
  int* warp_counts;
  int capacity;
  template <typename F>
  __device__ void for_each(bool /*first*/, F&& f) const {
    constexpr int kStepsAhead = 4;
    const std::uint16_t* mine = survivors + warp_id() * capacity;
    const int count = warp_counts[warp_id()];
    for (int base = 0; base < count; base += 32 * kStepsAhead) {
      int js[kStepsAhead];
      unsigned ks[kStepsAhead];
#pragma unroll
      for (int step = 0; step < kStepsAhead; ++step) {
        const int t = base + step * 32 + lane_id();
        js[step] = t < count ? mine[t] : 0;
        ks[step] = t < count ? static_cast<unsigned>(keys[js[step]]) : 0u;
      }
#pragma unroll
      for (int step = 0; step < kStepsAhead; ++step) {
        if (base + step * 32 < count) f(js[step], base + step * 32 + lane_id() < count, ks[step]);
      }
    }
  }
};

// Adds the active lanes' digits to a shared histogram. When all active lanes
// share one digit (the common case once a few passes have narrowed the
// candidates, and for heavily tied rows) a single atomic adds them all, so
// concentrated distributions do not serialize on one bin; otherwise each lane
// adds its own, as shared atomics on spread bins rarely collide.
__device__ inline void add_to_histogram(int* histogram, bool active, unsigned digit) {
  const unsigned active_lanes = __ballot_sync(kFullMask, active);
  const int leader = __ffs(active_lanes) - 1;
  const unsigned leader_digit = __shfl_sync(kFullMask, digit, leader);
  if (__all_sync(kFullMask, !active || digit == leader_digit)) {
    if (lane_id() == leader) atomicAdd(histogram + digit, __popc(active_lanes));
  } else if (active) {
    atomicAdd(histogram + digit, 1);
  }
}

// Exclusive prefix sum of one value per thread in thread order.
__device__ inline int block_exclusive_sum(int value, int* warp_sums) {
  int inclusive = value;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane_id() >= offset) inclusive += other;
  }
  if (lane_id() == 31) warp_sums[warp_id()] = inclusive;
  __syncthreads();
  int before = 0;
  for (int w = 0; w < warp_id(); ++w) before += warp_sums[w];
  __syncthreads();
  return before + inclusive - value;
}

// Histogram of the next digit over the elements whose key matches `prefix`
// above `shift` (all elements in the first pass).
template <typename Keys>
__device__ void histogram_pass(const Keys& keys, int* histogram, bool first, unsigned prefix,
                               int shift, int digit_shift, unsigned digit_mask) {
  keys.for_each(first, [&](int /*j*/, bool valid, unsigned key) {
    const bool candidate = valid && (first || (key >> shift) == prefix);
    if (__any_sync(kFullMask, candidate)) {
      add_to_histogram(histogram, candidate, (key >> digit_shift) & digit_mask);
    }
  });
}

// histogram_pass over the whole segment that also records, per warp, the
// positions whose key is at or above `prefix` (every possible winner).
// A warp with more than `capacity` of them sets bit `pass` of overflow_passes.
template <typename Bits>
__device__ void histogram_and_compact_pass(const SharedKeys<Bits>& keys,
                                           const CompactedKeys<Bits>& out, int* histogram,
                                           unsigned prefix, int shift, int digit_shift,
                                           unsigned digit_mask, int pass, RowShared* s) {
  std::uint16_t* mine = out.survivors + warp_id() * out.capacity;
  const unsigned lanes_below = (1u << lane_id()) - 1u;
  int kept = 0;
  keys.for_each(false, [&](int j, bool valid, unsigned key) {
    const unsigned digits = key >> shift;
    const unsigned survivors = __ballot_sync(kFullMask, valid && digits >= prefix);
    if (survivors != 0) {
      const int slot = kept + __popc(survivors & lanes_below);
      if (((survivors >> lane_id()) & 1u) && slot < out.capacity) {
        mine[slot] = static_cast<std::uint16_t>(j);
      }
      kept += __popc(survivors);
      const bool candidate = valid && digits == prefix;
      if (__any_sync(kFullMask, candidate)) {
        add_to_histogram(histogram, candidate, (key >> digit_shift) & digit_mask);
      }
    }
  });
  if (lane_id() == 0) {
    out.warp_counts[warp_id()] = kept;
    if (kept > out.capacity) atomicOr(&s->overflow_passes, 1u << pass);
  }
}

// Every CTA reads all the group's histograms into its own `totals`, so a
// pass needs one group barrier. `next_histogram`, the buffer the next pass
// fills, was last read by the other CTAs in the previous pass, which they have
// all finished once past this barrier; clearing it here needs no second one.
template <typename Group>
__device__ void gather_histograms(const int* histogram, int* next_histogram, int* totals,
                                  int bins) {
  Group::sync();
  const unsigned group_size = Group::size();
  for (int bin = static_cast<int>(threadIdx.x); bin < bins; bin += kThreads) {
    int sum = 0;
    for (unsigned r = 0; r < group_size; ++r) sum += Group::remote(histogram, r)[bin];
    totals[bin] = sum;
  }
  for (int bin = static_cast<int>(threadIdx.x); bin < kMaxBins; bin += kThreads) {
    next_histogram[bin] = 0;
  }
  __syncthreads();
}

// Finds the bin, scanning from the largest digit down, that holds the
// target-th largest element: above < target <= above + count.
__device__ inline void find_threshold_bin(const int* totals, int bins, int target, RowShared* s) {
  constexpr int kBinsPerThread = kMaxBins / kThreads;
  const int top = bins - 1 - static_cast<int>(threadIdx.x) * kBinsPerThread;
  int counts[kBinsPerThread];
  int sum = 0;
#pragma unroll
  for (int m = 0; m < kBinsPerThread; ++m) {
    counts[m] = top - m >= 0 ? totals[top - m] : 0;
    sum += counts[m];
  }
  int above = block_exclusive_sum(sum, s->warp_sums);
#pragma unroll
  for (int m = 0; m < kBinsPerThread; ++m) {
    if (top - m >= 0 && above < target && above + counts[m] >= target) {
      s->found_bin = top - m;
      s->found_above = above;
      s->found_count = counts[m];
    }
    above += counts[m];
  }
  __syncthreads();
}

__device__ inline void record_error(DeviceErrorRecord* record, std::int32_t code, std::int32_t a0,
                                    std::int32_t a1, std::int32_t a2) {
  if (atomicCAS(&record->code, 0, code) == 0) {
    record->args[0] = a0;
    record->args[1] = a1;
    record->args[2] = a2;
  }
}

// Position p of row `row` as written to the output (cache slot when a block
// table is given).
__device__ inline std::int32_t output_slot(const TopkArgs& a, std::int64_t row, int position) {
  if (a.block_table == nullptr) return position;
  const std::int32_t* table = a.block_table + (row / a.rows_per_request) * a.block_table_stride;
  return static_cast<std::int32_t>(static_cast<std::int64_t>(table[position / 64]) * 64 +
                                   position % 64);
}

// Positions 0 .. length-1, then -1 padding.
__device__ inline void write_all_positions(const TopkArgs& a, std::int64_t row, int length,
                                           std::int32_t* out) {
  for (int i = static_cast<int>(threadIdx.x); i < a.k; i += kThreads) {
    out[i] = i < length ? output_slot(a, row, i) : -1;
  }
}

// Copies positions [begin, end) of the row into shared memory with 16-byte
// asynchronous copies; returns where position begin landed. The buffer needs
// room for end - begin + 16 / sizeof(Bits) values.
template <typename Bits>
__device__ Bits* load_segment(const Bits* row_bits, int begin, int end, Bits* buffer) {
  constexpr int kVector = 16 / sizeof(Bits);
  const Bits* source = row_bits + begin;
  const int misalign =
      static_cast<int>((reinterpret_cast<std::uintptr_t>(source) / sizeof(Bits)) % kVector);
  // Shifting by the global misalignment makes 16-byte chunks line up in both.
  Bits* keys = buffer + misalign;
  const int count = end - begin;
  const int head = min(count, (kVector - misalign) % kVector);
  const int chunks = (count - head) / kVector;
  const int body_end = head + chunks * kVector;
  for (int c = static_cast<int>(threadIdx.x); c < chunks; c += kThreads) {
    __pipeline_memcpy_async(keys + head + c * kVector, source + head + c * kVector, 16);
  }
  __pipeline_commit();
  const int t = static_cast<int>(threadIdx.x);
  if (t < head) keys[t] = source[t];
  if (t < count - body_end) keys[body_end + t] = source[body_end + t];
  __pipeline_wait_prior(0);
  __syncthreads();
  return keys;
}

// Threshold found so far: the top (kBits - shift) bits of the k-th largest
// key are `prefix`; `remaining` winners are still to be taken from it.
struct Threshold {
  unsigned prefix;
  int shift;
  int remaining;
  int pass;
};

// One radix pass: `build(histogram, digit_shift, digit_mask)` fills this
// CTA's histogram, the group sums them and t moves to the chosen bin.
// Returns whether the threshold is final.
template <typename Bits, typename Group, typename Build>
__device__ bool radix_pass(Threshold& t, const SharedLayout& smem, Build&& build) {
  constexpr int kBits = OrderedKey<Bits>::kBits;
  RowShared* s = smem.shared;
  const int pass = t.pass;
  const int digit_shift = digit_shift_after_pass(kBits, pass);
  const int width = t.shift - digit_shift;
  const int bins = 1 << width;
  int* histogram = smem.histogram + (pass & 1) * kMaxBins;
  build(histogram, digit_shift, static_cast<unsigned>(bins - 1));
  gather_histograms<Group>(histogram, smem.histogram + ((pass + 1) & 1) * kMaxBins, smem.totals,
                           bins);
  find_threshold_bin(smem.totals, bins, t.remaining, s);
  t.prefix = (t.prefix << width) | static_cast<unsigned>(s->found_bin);
  t.shift = digit_shift;
  t.remaining -= s->found_above;
  t.pass = pass + 1;
  return t.shift == 0 || s->found_count == t.remaining;
}

template <typename Bits, typename Group, typename Keys>
__device__ void collect_winners(const TopkArgs& a, std::int64_t row, int begin, const Keys& keys,
                                const Threshold& t, const SharedLayout& smem);

// Selects this CTA's share of the row's winners and writes them (or, for
// sorted output, gathers them into the group's first CTA and sorts there).
// With a shared segment and room for survivor lists, the second pass records
// the possible winners, and if no warp ran out of slots the remaining passes
// and the collection visit only those; otherwise it tries again on the next
// pass, and falls back to the whole segment.
template <typename Bits, typename Group, typename Keys>
__device__ void select_segment(const TopkArgs& a, std::int64_t row, int begin, const Keys& keys,
                               const SharedLayout& smem) {
  constexpr int kBits = OrderedKey<Bits>::kBits;
  Threshold t{0u, kBits, a.k, 0};
  const auto full_pass = [&](int* histogram, int digit_shift, unsigned digit_mask) {
    histogram_pass(keys, histogram, t.pass == 0, t.prefix, t.shift, digit_shift, digit_mask);
  };
  bool done = radix_pass<Bits, Group>(t, smem, full_pass);
  if constexpr (Keys::kCanCompact) {
    if (a.survivor_offset != 0) {
      RowShared* s = smem.shared;
      const CompactedKeys<Bits> compacted{
          keys.keys,
          reinterpret_cast<std::uint16_t*>(reinterpret_cast<unsigned char*>(smem.histogram) +
                                           a.survivor_offset),
          // A quarter of each warp's range: room for every possible winner
          // unless the row is badly concentrated (then the lists overflow).
          s->warp_survivors, warp_range_length(keys.count) / 4};
      while (!done) {
        const int pass = t.pass;
        done = radix_pass<Bits, Group>(
            t, smem, [&](int* histogram, int digit_shift, unsigned digit_mask) {
              histogram_and_compact_pass(keys, compacted, histogram, t.prefix, t.shift, digit_shift,
                                         digit_mask, pass, s);
            });
        if (((s->overflow_passes >> pass) & 1u) == 0) {
          const auto compacted_pass = [&](int* histogram, int digit_shift, unsigned digit_mask) {
            histogram_pass(compacted, histogram, false, t.prefix, t.shift, digit_shift, digit_mask);
          };
          while (!done) done = radix_pass<Bits, Group>(t, smem, compacted_pass);
          collect_winners<Bits, Group>(a, row, begin, compacted, t, smem);
          return;
        }
      }
    }
  }
  while (!done) done = radix_pass<Bits, Group>(t, smem, full_pass);
  collect_winners<Bits, Group>(a, row, begin, keys, t, smem);
}

// Winners: key above the threshold prefix, or equal to it and among the
// first `remaining` such elements in position order.
template <typename Bits, typename Group, typename Keys>
__device__ void collect_winners(const TopkArgs& a, std::int64_t row, int begin, const Keys& keys,
                                const Threshold& t, const SharedLayout& smem) {
  using Key = typename OrderedKey<Bits>::Key;
  RowShared* s = smem.shared;
  const unsigned prefix = t.prefix;
  const int shift = t.shift;
  const int remaining = t.remaining;
  const int greater_total = a.k - remaining;

  int warp_greater = 0;
  int warp_equal = 0;
  keys.for_each(false, [&](int /*j*/, bool valid, unsigned key) {
    const unsigned digits = key >> shift;
    warp_greater += __popc(__ballot_sync(kFullMask, valid && digits > prefix));
    warp_equal += __popc(__ballot_sync(kFullMask, valid && digits == prefix));
  });
  if (lane_id() == 0) {
    s->warp_greater[warp_id()] = warp_greater;
    s->warp_equal[warp_id()] = warp_equal;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int greater = 0;
    int equal = 0;
    for (int w = 0; w < kWarps; ++w) {
      const int g = s->warp_greater[w];
      const int e = s->warp_equal[w];
      s->warp_greater[w] = greater;
      s->warp_equal[w] = equal;
      greater += g;
      equal += e;
    }
    s->cta_greater = greater;
    s->cta_equal = equal;
  }
  Group::sync();
  if (threadIdx.x == 0) {
    int greater = 0;
    int equal = 0;
    for (unsigned r = 0; r < Group::rank(); ++r) {
      greater += *Group::remote(&s->cta_greater, r);
      equal += *Group::remote(&s->cta_equal, r);
    }
    s->greater_offset = greater;
    s->equal_offset = equal;
  }
  __syncthreads();
  if (!a.sorted) Group::arrive();

  std::int32_t* out = a.indices + row * a.indices_stride;
  Key* gather_keys = Group::remote(reinterpret_cast<Key*>(smem.histogram), 0);
  int* gather_positions = Group::remote(smem.totals, 0);
  const unsigned lanes_below = (1u << lane_id()) - 1u;
  int next_greater = s->greater_offset + s->warp_greater[warp_id()];
  int next_equal = s->equal_offset + s->warp_equal[warp_id()];
  keys.for_each(false, [&](int j, bool valid, unsigned key) {
    const unsigned digits = key >> shift;
    const bool greater = valid && digits > prefix;
    const bool equal = valid && digits == prefix;
    const unsigned greater_lanes = __ballot_sync(kFullMask, greater);
    const unsigned equal_lanes = __ballot_sync(kFullMask, equal);
    int slot = -1;
    if (greater) {
      slot = next_greater + __popc(greater_lanes & lanes_below);
    } else if (equal) {
      const int tie_rank = next_equal + __popc(equal_lanes & lanes_below);
      if (tie_rank < remaining) slot = greater_total + tie_rank;
    }
    if (slot >= 0) {
      const int position = begin + j;
      if (a.sorted) {
        gather_keys[slot] = static_cast<Key>(key);
        gather_positions[slot] = position;
      } else {
        out[slot] = output_slot(a, row, position);
      }
    }
    next_greater += __popc(greater_lanes);
    next_equal += __popc(equal_lanes);
  });

  if (!a.sorted) {
    Group::wait();
    return;
  }
  Group::sync();
  if (Group::rank() != 0) return;
  // Gathered order is position order within the greater and the equal
  // winners, and every equal winner has the smallest key, so a stable sort by
  // key gives (value desc, position asc).
  Key sort_keys[kSortItemsPerThread];
  int sort_positions[kSortItemsPerThread];
#pragma unroll
  for (int m = 0; m < kSortItemsPerThread; ++m) {
    const int i = static_cast<int>(threadIdx.x) * kSortItemsPerThread + m;
    // Key 0 is never produced by a value (it would be a NaN), so padding sorts last.
    sort_keys[m] = i < a.k ? gather_keys[i] : Key{0};
    sort_positions[m] = i < a.k ? gather_positions[i] : -1;
  }
  using Sort = WinnerSort<Bits>;
  auto* storage = reinterpret_cast<typename Sort::TempStorage*>(smem.segment);
  Sort(*storage).SortDescending(sort_keys, sort_positions);
#pragma unroll
  for (int m = 0; m < kSortItemsPerThread; ++m) {
    const int i = static_cast<int>(threadIdx.x) * kSortItemsPerThread + m;
    if (i < a.k) out[i] = output_slot(a, row, sort_positions[m]);
  }
}

// Row `row`, shared by the Group::size() CTAs of a group.
// kInShared: each CTA first copies its segment to shared memory.
template <typename Bits, typename Group, bool kInShared>
__device__ void select_row(const TopkArgs& a, std::int64_t row, unsigned char* shared_base) {
  const SharedLayout smem(shared_base);
  const unsigned group_size = Group::size();
  const unsigned rank = Group::rank();
  const int length = a.lengths[row * a.lengths_stride];
  std::int32_t* out = a.indices + row * a.indices_stride;

  std::int32_t error = kNoDeviceError;
  std::int64_t limit = 0;
  if (length < 0) {
    error = kNegativeLength;
  } else if (length > a.cols) {
    error = kLengthBeyondLogits;
    limit = a.cols;
  } else if (a.block_table != nullptr && length > a.max_blocks * 64) {
    error = kLengthBeyondBlockTable;
    limit = a.max_blocks;
  }
  if (error != kNoDeviceError || length <= a.k) {
    if (rank == 0) {
      if (error != kNoDeviceError && threadIdx.x == 0) {
        record_error(a.error, error, static_cast<std::int32_t>(row), length,
                     static_cast<std::int32_t>(limit));
      }
      write_all_positions(a, row, error != kNoDeviceError ? 0 : length, out);
    }
    return;
  }

  if (threadIdx.x == 0) smem.shared->overflow_passes = 0;
  for (int bin = static_cast<int>(threadIdx.x); bin < kHistogramBuffers * kMaxBins;
       bin += kThreads) {
    smem.histogram[bin] = 0;
  }
  const std::int64_t share =
      (static_cast<std::int64_t>(length + group_size - 1) / group_size + kSegmentGranule - 1) /
      kSegmentGranule * kSegmentGranule;
  const std::int64_t length64 = length;
  const int begin = static_cast<int>(std::min<std::int64_t>(rank * share, length64));
  const int end = static_cast<int>(std::min<std::int64_t>(begin + share, length64));
  const Bits* row_bits = static_cast<const Bits*>(a.logits) + row * a.logits_stride;
  if constexpr (kInShared) {
    Bits* keys = load_segment(row_bits, begin, end, reinterpret_cast<Bits*>(smem.segment));
    select_segment<Bits, Group>(a, row, begin, SharedKeys<Bits>{keys, end - begin}, smem);
  } else {
    __syncthreads();
    select_segment<Bits, Group>(a, row, begin, GlobalKeys<Bits>{row_bits + begin, end - begin},
                                smem);
  }
}

}  // namespace dsa::detail::cuda::topk_impl
