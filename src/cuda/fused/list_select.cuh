// Exact top-k of one row from its candidate lists (candidate_lists.hpp), one
// CTA per row: the same narrowing and output as the top-k kernels
// (row_select.cuh), over the ranks the scoring pass listed instead of a row of
// logits. The lists of a row hold its top-k whatever the order the ranks were
// listed in, and ranks are unique, so the result is that of topk on the
// logits: the same set, bit for bit with sorted output (unsorted output is in
// position order here).
//
// A row's lists are read as one sequence of ranks, through a table in shared
// memory of where each list lies in it: every thread keeps kLoadsAhead loads
// in flight whatever the number and sizes of the lists, where reading them
// one after another would wait for each list's count, then for each of its
// batches, on every pass of the narrowing.
#pragma once

#include <cstdint>

#include "common/schedule_walk.hpp"
#include "cuda/fused/candidate_lists.hpp"
#include "cuda/topk/row_select.cuh"

namespace dsa::detail::cuda::topk_impl {

// Lists one table holds: one per thread, which fills its entry.
inline constexpr int kTableLists = kThreads;

// Up to kTableLists of a row's lists laid end to end: entry e holds ranks
// [ends[e - 1], ends[e]) of the sequence (from 0 for e = 0), rank i at
// address origins[e] + i * sizeof(Rank) (its list's first rank, less the
// ranks before it: one multiply-add per rank).
struct ListTable {
  std::uintptr_t origins[kTableLists];
  int ends[kTableLists];
  int warp_sums[kWarps];  // the scan's
  // The row's, kept here rather than in the passes' registers (ListedRanks):
  int first_worker;
  int slots;
  int total;  // ranks over every window
};

// Dynamic shared memory of the list selection's CTA.
struct ListedStorage {
  SharedStorage select;
  ListTable table;
};

// The ranks of one row's lists. Its table slots are `parts` per candidate
// (one per part): candidate 0 is the row itself (its own lists), candidate
// c > 0 is worker table.first_worker + c - 1 (the workers whose schedule
// entry lies in the row's unit), whose lists count when its range starts
// inside the unit (schedule entry (unit, chunk > 0)). A row of at most
// kTableLists slots keeps its table for every pass; a longer one is read in
// windows of kTableLists slots, each table filled again on every pass.
struct ListedRanks {
  const CandidateLists& lists;
  const std::int32_t* schedule;
  std::int64_t row;
  ListTable& table;

  // Fills the table with slots [first, first + kTableLists) and returns how
  // many ranks they hold: the schedule entries and counts are loaded
  // together, one slot per thread, then scanned. Every thread calls it.
  __device__ int load_window(int first) const {
    const int slot = first + static_cast<int>(threadIdx.x);
    const int candidate = slot / lists.parts;
    const int part = slot % lists.parts;
    const int worker = table.first_worker + candidate - 1;
    const int draft = static_cast<int>(row % lists.rows_per_unit);
    std::int64_t list = -1;
    if (candidate == 0) {
      list = candidate_list_index(lists, row - draft, draft, false, 0, part);
    } else if (slot < table.slots && schedule_entry(schedule, worker).chunk != 0) {
      list = candidate_list_index(lists, row - draft, draft, true, worker, part);
    }
    const int count = list >= 0 ? lists.counts[list] : 0;
    // An empty entry's ranks are never read: any list serves.
    const Rank* ranks = lists.ranks + max(list, std::int64_t{0}) * lists.capacity;
    int window_total = 0;
    // No entry is written before the scan's barrier, which every thread
    // reaches only once done with the previous window.
    const int start = block_exclusive_sum(count, table.warp_sums, &window_total);
    table.origins[threadIdx.x] =
        reinterpret_cast<std::uintptr_t>(ranks) - static_cast<std::uintptr_t>(start) * sizeof(Rank);
    table.ends[threadIdx.x] = start + count;
    __syncthreads();
    return window_total;
  }

  // f(rank, i) over the `count` ranks of the table, rank i of the sequence
  // (valid when i < count): every lane calls f equally often. A slot is
  // loaded again as soon as its rank is taken, so that kLoadsAhead loads stay
  // in flight while the ranks are consumed.
  template <typename F>
  __device__ void walk_table(int count, F&& f) const {
    if (count == 0) return;  // no last rank to read again (below)
    // The entry of this thread's rank, searched onwards from the last one:
    // a thread's ranks only grow, so it steps through each list once.
    int entry = 0;
    int entry_end = table.ends[0];
    std::uintptr_t entry_origin = table.origins[0];
    const auto load_rank = [&](int i) {
      // Past the end the last rank is read again (and passed as invalid):
      // no branch around the load, and the search stops inside the table.
      i = min(i, count - 1);
      while (i >= entry_end) {
        ++entry;
        entry_end = table.ends[entry];
        entry_origin = table.origins[entry];
      }
      const std::uintptr_t address = entry_origin + static_cast<unsigned>(i) * sizeof(Rank);
      return __ldg(reinterpret_cast<const Rank*>(address));
    };
    Rank ahead[kLoadsAhead];
#pragma unroll
    for (int u = 0; u < kLoadsAhead; ++u) {
      ahead[u] = load_rank(u * kThreads + static_cast<int>(threadIdx.x));
    }
    for (int base = 0; base < count; base += kThreads * kLoadsAhead) {
#pragma unroll
      for (int u = 0; u < kLoadsAhead; ++u) {
        const int i = base + u * kThreads + static_cast<int>(threadIdx.x);
        const Rank rank = ahead[u];
        ahead[u] = load_rank(i + kThreads * kLoadsAhead);
        f(rank, i);
      }
    }
  }

  __device__ int total() const { return table.total; }

  // As CandidateRanks::for_each, kLoadsAhead loads in flight per thread.
  template <typename F>
  __device__ void for_each(F&& f) const {
    const auto walk = [&](int count) { walk_table(count, [&](Rank rank, int i) { f(rank, i < count); }); };
    if (table.slots <= kTableLists) {
      walk(total());
      return;
    }
    for (int first = 0; first < table.slots; first += kTableLists) walk(load_window(first));
  }

  // Whether copy_to can take the ranks: one table, and room for them.
  __device__ bool fits(int capacity) const { return table.slots <= kTableLists && total() <= capacity; }

  // Copies the ranks to out[0, total()) in sequence order (fits() holds),
  // an order fixed by the row. Every thread calls it.
  __device__ void copy_to(Rank* out) const {
    const int count = total();
    walk_table(count, [&](Rank rank, int i) {
      if (i < count) out[i] = rank;
    });
    __syncthreads();
  }
};

// What a row's selection needs of the schedule: the workers whose entry lies
// in the row's unit, [first, end) when the schedule is monotone, and whether
// it is: false when some worker's entry comes before its predecessor's, so
// that worker ranges overlap and a position may be listed twice (the scoring
// kernel has reported such a schedule).
struct UnitWorkers {
  int first;
  int end;
  bool monotone;
};

// UnitWorkers of unit `unit`, from one read of the schedule: a thread per
// worker counts rather than searches, which would wait for one load after
// another. Every thread of the CTA calls it.
__device__ inline UnitWorkers unit_workers(const std::int32_t* schedule, int workers,
                                           std::int64_t unit) {
  UnitWorkers found{0, 0, true};
  for (int base = 0; base < workers; base += kThreads) {
    const int w = base + static_cast<int>(threadIdx.x);
    std::int64_t entry_unit = unit + 1;
    bool in_order = true;
    if (w < workers) {
      const WorkItem entry = schedule_entry(schedule, w);
      entry_unit = entry.unit;
      in_order = w + 1 == workers || !item_before(schedule_entry(schedule, w + 1), entry);
    }
    found.first += __syncthreads_count(entry_unit < unit);
    found.end += __syncthreads_count(entry_unit <= unit);
    found.monotone = __syncthreads_and(in_order) != 0 && found.monotone;
  }
  return found;
}

// Row `row`'s lists, their table loaded (its only window, or each window in
// turn to count the ranks); `unit` is the row's unit's. Every thread of the
// CTA calls it.
__device__ inline ListedRanks listed_ranks(const CandidateLists& lists, const std::int32_t* schedule,
                                           const UnitWorkers& unit, std::int64_t row,
                                           ListTable& table) {
  if (threadIdx.x == 0) {
    table.first_worker = unit.first;
    table.slots = (1 + unit.end - unit.first) * lists.parts;
  }
  __syncthreads();
  const ListedRanks source{lists, schedule, row, table};
  int total = 0;
  for (int first = 0; first < table.slots; first += kTableLists) total += source.load_window(first);
  if (threadIdx.x == 0) table.total = total;
  __syncthreads();
  return source;
}

// Row `row`, of selection length `length` (a.lengths'), into a.indices,
// from the lists of a monotone schedule (`unit`: the row's unit's workers).
// A row whose lists hold fewer than k ranks raises *short_rows (when given).
__device__ inline void select_listed_row(const TopkArgs& a, const CandidateLists& lists,
                                         const std::int32_t* schedule, const UnitWorkers& unit,
                                         int length, std::int64_t row, std::int32_t* short_rows,
                                         ListedStorage& storage) {
  SharedStorage& sm = storage.select;
  std::int32_t* out = a.indices + row * a.indices_stride;
  if (length <= a.k) {
    write_all_positions(a, row, length, out);
    return;
  }
  const ListedRanks source = listed_ranks(lists, schedule, unit, row, storage.table);
  if (source.total() < a.k) {
    // Lists that started at a threshold the row did not reach k times, or a
    // run whose schedule the scoring reported (one that leaves positions
    // unscored, such as a trailer of another batch). Write what is there
    // rather than read past it; the flag has the row selected again.
    if (short_rows != nullptr && threadIdx.x == 0) *short_rows = 1;
    const auto listed = CandidateRanks::contiguous(sm.candidates, collect_candidates(source, 0, sm));
    const int written = write_candidates(a, row, length, listed, 0, sm, out);
    for (int i = written + static_cast<int>(threadIdx.x); i < a.k; i += kThreads) out[i] = -1;
    return;
  }
  RankRange r{0, ~Rank{0}, a.k};
  bool agreed = true;
  CandidateRanks candidates{};
  if (source.fits(kCandidateCapacity)) {
    // The usual case with floors: the lists, copied whole in their order,
    // are the candidates, and the winners are written in that order.
    source.copy_to(sm.candidates);
    candidates = CandidateRanks::contiguous(sm.candidates, source.total(), true);
  } else {
    agreed = narrow(source, r, a.k, kCandidateCapacity, sm);
    candidates = CandidateRanks::contiguous(sm.candidates, collect_candidates(source, r.low, sm));
  }
  agreed = narrow(candidates, r, a.k, -1, sm) && agreed;
  if (!agreed) report_disagreement(a, row);
  write_candidates(a, row, length, candidates, r.low, sm, out);
}

}  // namespace dsa::detail::cuda::topk_impl
