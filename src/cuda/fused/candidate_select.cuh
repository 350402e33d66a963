// The selector warps of the fused sm_90a kernel (index_topk without the
// logits matrix; see candidate_lists.hpp).
//
// The consumers leave each page's logits in shared memory instead of storing
// them; the selector warps read them in page order, each for its own draft
// rows (kSelectorWarps apart, so the rows of a page are offered in
// parallel), and append, per draft row, every position whose rank
// (topk/ordered_key.cuh) is at least the row's floor to the row's list in
// global memory. The floor starts at the lowest rank; when a list is nearly
// full its warp narrows the ranks it holds to a new floor that still leaves
// at least k of them above it and drops the rest. So a list
// always holds the top-k of the positions this worker scored for the row,
// whatever the order they came in, and the floor only rises.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/fused/candidate_lists.hpp"
#include "cuda/topk/ordered_key.cuh"
#include "cuda/warp_scan.cuh"
#include "dsa/cache.hpp"

namespace dsa::detail::cuda::hopper {

using topk_impl::Rank;

inline constexpr int kSelectBins = 256;
// Selector warps of the fused kernel (one warpgroup). With at least as many
// draft rows as warps, warp s keeps the lists of rows s, s + kSelectorWarps,
// ... of every unit; with fewer, the warps split each row's pages
// (candidate_lists.hpp) and warp s keeps part s / rows of row s % rows.
inline constexpr int kSelectorWarps = kListWriters;
constexpr int active_selectors(int rows) {
  return rows < kSelectorWarps ? rows * list_parts(rows) : kSelectorWarps;
}
constexpr int rows_per_selector(int rows) { return (rows + kSelectorWarps - 1) / kSelectorWarps; }
// Ranks each lane loads before using any of them (latency of L2 hits).
inline constexpr int kSelectLoadsAhead = 16;
// A selector offers kPagesPerOffer pages (candidate_lists.hpp) together when
// consecutive stages hold consecutive pages of one unit (select_pages): one
// chain of dependent steps for both.
// The part (candidate_lists.hpp) that keeps the page of index page_index
// within its row: pairs of pages go to one part, so that they can be offered
// together.
template <int kParts>
__device__ __forceinline__ int part_of_page(std::int64_t page_index) {
  return static_cast<int>(static_cast<std::uint32_t>(page_index) / kPagesPerOffer % kParts);
}

// A row's list while the worker scores its unit.
struct OpenList {
  Rank* ranks = nullptr;  // nullptr: the row needs no list
  int count = 0;
  Rank floor = 0;
  float floor_value = -INFINITY;  // the float of the floor's key
  // Bounds on the keys this lane appended (each lane its own), so that a
  // compaction need not read the list to find its range: lowest_key falls
  // back to the floor's at each compaction, highest_key is kept.
  std::uint32_t lowest_key = ~0u;
  std::uint32_t highest_key = 0;
};

// The list's ranks base + 32 u + lane, u < kSelectLoadsAhead (0 past its end),
// all loads issued before any is used.
__device__ __forceinline__ void load_batch(const OpenList& list, int base,
                                           Rank (&batch)[kSelectLoadsAhead]) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int u = 0; u < kSelectLoadsAhead; ++u) {
    const int i = base + 32 * u + lane;
    batch[u] = i < list.count ? list.ranks[i] : Rank{0};
  }
}

// The smallest rank `floor` such that at least k and at most keep_limit of
// the list's ranks are >= floor (exactly k when no coarser bound fits); all
// ranks lie in [lo, hi]. The whole warp calls it.
__device__ inline Rank narrow_floor(const OpenList& list, Rank lo, Rank hi, int k, int keep_limit,
                                    int* histogram) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int needed = k;  // winners among the ranks in [lo, hi]
  int above = 0;   // ranks above hi
  for (;;) {
    const int shift = max(0, 64 - __clzll(static_cast<long long>(hi - lo)) - 8);
    for (int bin = lane; bin < kSelectBins; bin += 32) histogram[bin] = 0;
    __syncwarp();
    for (int base = 0; base < list.count; base += 32 * kSelectLoadsAhead) {
      Rank batch[kSelectLoadsAhead];
      load_batch(list, base, batch);
#pragma unroll
      for (int u = 0; u < kSelectLoadsAhead; ++u) {
        const bool inside = base + 32 * u + lane < list.count && batch[u] >= lo && batch[u] <= hi;
        // A plain shared atomic per rank: the warp does not wait for it, while
        // grouping lanes by bin (match.any) stalled every batch on its latency.
        if (inside) atomicAdd(&histogram[static_cast<int>((batch[u] - lo) >> shift)], 1);
      }
    }
    __syncwarp();
    static_assert(kSelectBins == 256, "warp_bin_from_top reads 256 bins");
    const BinFromTop found = warp_bin_from_top(histogram, needed);
    __syncwarp();  // the histogram is read before the next round clears it
    above += found.above;
    needed -= found.above;
    lo += static_cast<Rank>(found.bin) << shift;
    // lo + width may pass 2^64 near the top ranks (+inf): compare the gap instead.
    const Rank width = (Rank{1} << shift) - 1;
    if (hi - lo > width) hi = lo + width;
    if (above + found.count <= keep_limit || shift == 0) return lo;
  }
}

// Keeps the ranks >= floor at the front of the list (in place).
__device__ inline void drop_below(OpenList& list, Rank floor) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int kept = 0;
  for (int base = 0; base < list.count; base += 32 * kSelectLoadsAhead) {
    Rank batch[kSelectLoadsAhead];
    load_batch(list, base, batch);
    // Every lane has read the batch before any lane writes into it.
    __syncwarp();
#pragma unroll
    for (int u = 0; u < kSelectLoadsAhead; ++u) {
      const bool keep = base + 32 * u + lane < list.count && batch[u] >= floor;
      const unsigned keeping = __ballot_sync(0xffffffffu, keep);
      if (keep) list.ranks[kept + __popc(keeping & lanes_below())] = batch[u];
      kept += __popc(keeping);
    }
    __syncwarp();
  }
  list.count = kept;
  list.floor = floor;
  list.lowest_key = topk_impl::key_of(floor);
  list.floor_value = topk_impl::float_of_key(list.lowest_key);
}

// Whether the value at `position` (valid below `limit`) reaches the list's
// floor, and its rank. Most values are decided on the float alone: one above
// the floor's value wins, one below loses; only a value with the floor's key
// (equal, or NaN at a floor of -inf) compares positions.
__device__ __forceinline__ bool reaches_floor(const OpenList& list, float value,
                                              std::int64_t position, std::int64_t limit,
                                              Rank* rank) {
  const std::uint32_t key = topk_impl::OrderedKey<std::uint32_t>::from_bits(__float_as_uint(value));
  *rank = topk_impl::rank_of(key, static_cast<std::uint32_t>(position));
  // Bitwise, not short-circuit: predicates instead of branches on the warp's chain.
  const bool same_key =
      (value == list.floor_value) | (isnan(value) & (list.floor_value == -INFINITY));
  return (position < limit) & ((value > list.floor_value) | (same_key & (*rank >= list.floor)));
}

// Appends those of kPages pages' 64 positions each (two adjacent ones per
// lane; page i starts at positions[i] - 2 lane) that reach the list's floor.
// Every position is decided before any is stored, so the warp runs one chain
// of dependent steps for all of them, not one per position.
template <int kPages>
__device__ __forceinline__ void offer(OpenList& list, const float2 (&values)[kPages],
                                      const std::int64_t (&positions)[kPages], std::int64_t limit) {
  constexpr int kOffers = 2 * kPages;
  Rank ranks[kOffers];
  bool take[kOffers];
  unsigned taking[kOffers];
  unsigned anyone = 0;
#pragma unroll
  for (int i = 0; i < kPages; ++i) {
    take[2 * i] = reaches_floor(list, values[i].x, positions[i], limit, &ranks[2 * i]);
    take[2 * i + 1] = reaches_floor(list, values[i].y, positions[i] + 1, limit, &ranks[2 * i + 1]);
  }
#pragma unroll
  for (int v = 0; v < kOffers; ++v) {
    taking[v] = __ballot_sync(0xffffffffu, take[v]);
    anyone |= taking[v];
  }
  if (anyone == 0) return;
  int base = list.count;
#pragma unroll
  for (int v = 0; v < kOffers; ++v) {
    if (take[v]) {
      list.ranks[base + __popc(taking[v] & lanes_below())] = ranks[v];
      list.lowest_key = min(list.lowest_key, topk_impl::key_of(ranks[v]));
      list.highest_key = max(list.highest_key, topk_impl::key_of(ranks[v]));
    }
    base += __popc(taking[v]);
  }
  list.count = base;
}

// One selector warp's view of its rows of one unit: rows[r] is draft row
// draft_row(r) (when below kRows), of which the warp keeps part part().
template <int kRows>
struct UnitLists {
  static constexpr int kMine = rows_per_selector(kRows);
  static constexpr int kParts = list_parts(kRows);
  OpenList rows[kMine];
  std::int32_t limit[kMine];  // positions [0, limit) compete; 0 when the row needs no list
  int selector = 0;
  std::int64_t first_row = -1;
  bool starts_inside = false;  // which lists (candidate_lists.hpp)

  __device__ int draft_row(int r) const {
    return (kParts > 1 ? selector % kRows : selector) + kSelectorWarps * r;
  }
  __device__ int part() const { return kParts > 1 ? selector / kRows : 0; }
};

// Publishes the lists of the unit being left.
template <int kRows>
__device__ void close_lists(const CandidateLists& lists, const UnitLists<kRows>& unit) {
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int r = 0; r < UnitLists<kRows>::kMine; ++r) {
    if (unit.rows[r].ranks != nullptr) {
      lists.counts[candidate_list_index(lists, unit.first_row, unit.draft_row(r), unit.starts_inside,
                                        static_cast<int>(blockIdx.x), unit.part())] =
          unit.rows[r].count;
    }
  }
}

// Opens the lists of the unit whose first logits row is first_row (see
// candidate_lists.hpp for which ones); a row whose selection length is at
// most k gets none (every position wins). With floors, a row's lists start
// at its floor (the sampled threshold, row_samples.hpp) instead of the
// lowest rank.
template <int kRows>
__device__ void open_lists(const CandidateLists& lists, const std::int32_t* select_lengths,
                           const Rank* floors, int k, std::int64_t first_row, bool starts_inside,
                           UnitLists<kRows>& unit) {
  unit.first_row = first_row;
  unit.starts_inside = starts_inside;
#pragma unroll
  for (int r = 0; r < UnitLists<kRows>::kMine; ++r) {
    const int j = unit.draft_row(r);
    unit.rows[r] = OpenList{};
    unit.limit[r] = 0;
    if (j >= kRows) continue;
    const std::int32_t length = select_lengths[first_row + j];
    unit.limit[r] = length > k ? length : 0;
    if (unit.limit[r] == 0) continue;
    unit.rows[r].ranks =
        lists.ranks + candidate_list_index(lists, first_row, j, starts_inside,
                                           static_cast<int>(blockIdx.x), unit.part()) *
                          lists.capacity;
    if (floors != nullptr) {
      unit.rows[r].floor = floors[first_row + j];
      unit.rows[r].floor_value = topk_impl::float_of_key(topk_impl::key_of(unit.rows[r].floor));
    }
  }
}

// Offers kPages consecutive pages' logits ([kRows][64] each in shared
// memory, key positions first_position ...) of the warp's rows to their
// lists (`capacity` ranks each), compacting a list that could not take two
// more pages. Pages of another part are left to the warp that keeps them.
template <int kRows, int kPages>
__device__ void offer_pages(const float* const (&page_logits)[kPages], std::int64_t first_position,
                            int k, int keep_limit, int capacity, int* histogram,
                            UnitLists<kRows>& unit) {
  constexpr int kParts = UnitLists<kRows>::kParts;
  if (kParts > 1 && part_of_page<kParts>(first_position / kStageTokens) != unit.part()) return;
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int r = 0; r < UnitLists<kRows>::kMine; ++r) {
    OpenList& list = unit.rows[r];
    if (first_position >= unit.limit[r]) continue;  // also every row past kRows
    float2 values[kPages];
    std::int64_t positions[kPages];
#pragma unroll
    for (int i = 0; i < kPages; ++i) {
      values[i] = reinterpret_cast<const float2*>(page_logits[i] + unit.draft_row(r) * kStageTokens)[lane];
      positions[i] = first_position + i * kStageTokens + 2 * lane;
    }
    offer(list, values, positions, unit.limit[r]);
    if (list.count > capacity - kPagesPerOffer * kStageTokens) {  // room for the next offer
      __syncwarp();  // the appended ranks are visible to every lane
      const Rank lo = topk_impl::rank_of(warp_min(list.lowest_key), 0xffffffffu);
      const Rank hi = topk_impl::rank_of(warp_max(list.highest_key), 0u);
      drop_below(list, narrow_floor(list, lo, hi, k, keep_limit, histogram));
    }
  }
}

}  // namespace dsa::detail::cuda::hopper
