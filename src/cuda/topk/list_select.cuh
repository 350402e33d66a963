// Exact top-k of one row from its candidate lists (candidate_lists.hpp), one
// CTA per row: the same narrowing and output as the top-k kernels
// (row_select.cuh), over the ranks the scoring pass listed instead of a row of
// logits. The lists of a row hold its top-k whatever the order the ranks were
// listed in, and ranks are unique, so the result is that of topk on the
// logits: the same set, bit for bit with sorted output (unsorted output is in
// position order here).
#pragma once

#include <cstdint>

#include "cuda/candidate_lists.hpp"
#include "cuda/topk/row_select.cuh"
#include "schedule_walk.hpp"

namespace dsa::detail::cuda::topk_impl {

// The ranks of one row's lists: the row's own lists (one per part), then
// those of the workers whose range starts inside the row's unit (schedule
// entries (unit, chunk > 0), which lie in [first_worker, end_worker) of a
// monotone schedule).
struct ListedRanks {
  const CandidateLists& lists;
  const std::int32_t* schedule;
  int first_worker;
  int end_worker;
  std::int64_t row;
  std::int64_t unit;
  int draft;  // the row's index within its unit

  // g(list index) for each of the row's lists.
  template <typename G>
  __device__ void for_each_list(G&& g) const {
    for (int part = 0; part < lists.parts; ++part) {
      g(candidate_list_index(lists, row - draft, draft, false, 0, part));
    }
    for (int w = first_worker; w < end_worker; ++w) {
      const WorkItem start = schedule_entry(schedule, w);
      if (start.unit != unit || start.chunk == 0) continue;
      for (int part = 0; part < lists.parts; ++part) {
        g(candidate_list_index(lists, row - draft, draft, true, w, part));
      }
    }
  }

  __device__ int total() const {
    int count = 0;
    for_each_list([&](std::int64_t index) { count += lists.counts[index]; });
    return count;
  }

  // As CandidateRanks::for_each, kLoadsAhead loads in flight per thread.
  template <typename F>
  __device__ void for_each(F&& f) const {
    for_each_list([&](std::int64_t index) {
      const Rank* ranks = lists.ranks + index * kListCapacity;
      const int count = lists.counts[index];
      for (int base = 0; base < count; base += kThreads * kLoadsAhead) {
        Rank batch[kLoadsAhead];
#pragma unroll
        for (int u = 0; u < kLoadsAhead; ++u) {
          const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
          batch[u] = i < count ? ranks[i] : Rank{0};
        }
#pragma unroll
        for (int u = 0; u < kLoadsAhead; ++u) {
          f(batch[u], base + u * kThreads + static_cast<int>(threadIdx.x) < count);
        }
      }
    });
  }
};

// The first worker whose schedule entry's unit is >= unit (> unit with
// `after`), by bisection over the monotone schedule (any other schedule was
// reported by the scoring; the search stays in bounds either way).
__device__ inline int first_worker_past(const std::int32_t* schedule, int workers, std::int64_t unit,
                                        bool after) {
  int low = 0;
  int high = workers;
  while (low < high) {
    const int middle = (low + high) / 2;
    const std::int64_t entry = schedule_entry(schedule, middle).unit;
    if (after ? entry <= unit : entry < unit) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return low;
}

// False when some worker's schedule entry comes before its predecessor's: then
// worker ranges overlap and a position may be listed twice. The scoring
// kernel has reported such a schedule (schedule_mismatch). Every thread of
// the CTA calls it.
__device__ inline bool schedule_is_monotone(const std::int32_t* schedule, int workers) {
  bool ordered = true;
  for (int w = static_cast<int>(threadIdx.x); w + 1 < workers; w += kThreads) {
    if (item_before(schedule_entry(schedule, w + 1), schedule_entry(schedule, w))) ordered = false;
  }
  return __syncthreads_and(ordered) != 0;
}

// Row `row` (its selection length in a.lengths) into a.indices.
__device__ inline void select_listed_row(const TopkArgs& a, const ListedRanks& source,
                                         SharedStorage& sm) {
  const std::int64_t row = source.row;
  const int length = a.lengths[row * a.lengths_stride];
  std::int32_t* out = a.indices + row * a.indices_stride;
  if (length <= a.k) {
    write_all_positions(a, row, length, out);
    return;
  }
  if (source.total() < a.k) {
    // Only a run whose schedule the scoring reported (one that leaves
    // positions unscored, such as a trailer of another batch) lists fewer
    // ranks than k; write what is there rather than read past it.
    const auto listed = CandidateRanks::contiguous(sm.candidates, collect_candidates(source, 0, sm));
    const int written = write_candidates(a, row, length, listed, 0, sm, out);
    for (int i = written + static_cast<int>(threadIdx.x); i < a.k; i += kThreads) out[i] = -1;
    return;
  }
  RankRange r{0, ~Rank{0}, a.k};
  bool agreed = narrow(source, r, a.k, kCandidateCapacity, sm);
  const auto candidates =
      CandidateRanks::contiguous(sm.candidates, collect_candidates(source, r.low, sm));
  agreed = narrow(candidates, r, a.k, -1, sm) && agreed;
  if (!agreed) report_disagreement(a, row);
  write_candidates(a, row, length, candidates, r.low, sm, out);
}

}  // namespace dsa::detail::cuda::topk_impl
