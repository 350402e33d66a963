// Candidate lists of the fused index_topk: where the scoring pass leaves, for
// every (worker, row) it scores, a list of 64-bit ranks (topk/ordered_key.cuh)
// that contains the top-k of the positions that worker scored for that row.
// The union of a row's lists therefore contains the row's top-k; the
// selection kernel narrows it to exactly k.
//
// Which list a worker writes follows from the schedule alone: the worker that
// scores a unit's first chunk writes the rows' own lists (list r for row r);
// a worker whose range starts inside a unit (schedule entry with chunk > 0)
// writes its own lists for that first unit, rows + w * rows_per_unit + j for
// the unit's draft row j. A worker's range starts inside at most one unit,
// so rows + workers * rows_per_unit such lists cover every case.
//
// Each of those is `parts` lists: a unit of fewer rows than the fused kernel
// has selector warps (kListWriters) would leave some idle, so the warps
// split each row's pages instead, each part with its own list (which part
// keeps which page is the selectors' choice: any split gives the same union).
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsa/topk.hpp"
#include "hostdevice.hpp"

namespace dsa::detail::cuda {

// Ranks one list holds; a list is compacted to between k and about
// k + (capacity - k) / 16 ranks when it is nearly full.
inline constexpr int kListCapacity = 2 * kMaxTopk;

// Selector warps of the fused kernel's CTA, each writing its own lists.
inline constexpr int kListWriters = 4;

// Lists per (row or worker row): the selector warps a unit's rows leave idle.
DSA_HD constexpr int list_parts(int rows_per_unit) {
  return rows_per_unit < kListWriters ? kListWriters / rows_per_unit : 1;
}

struct CandidateLists {
  unsigned long long* ranks = nullptr;  // [lists][kListCapacity]
  std::int32_t* counts = nullptr;       // [lists] ranks held; 0 for a list never written
  std::int64_t rows = 0;
  int rows_per_unit = 1;
  int parts = 1;  // list_parts(rows_per_unit)
};

inline std::int64_t candidate_list_count(std::int64_t rows, int rows_per_unit, int workers) {
  return (rows + static_cast<std::int64_t>(workers) * rows_per_unit) * list_parts(rows_per_unit);
}

// The list worker `worker` writes for part `part` of draft row j of a unit
// whose first logits row is first_row; starts_inside: its range starts inside
// the unit.
DSA_HD std::int64_t candidate_list_index(const CandidateLists& lists, std::int64_t first_row,
                                                int j, bool starts_inside, int worker, int part) {
  const std::int64_t row_list =
      starts_inside ? lists.rows + static_cast<std::int64_t>(worker) * lists.rows_per_unit + j
                    : first_row + j;
  return row_list * lists.parts + part;
}

}  // namespace dsa::detail::cuda
