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
// so rows + workers * rows_per_unit lists cover every case.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dsa/topk.hpp"
#include "hostdevice.hpp"

namespace dsa::detail::cuda {

// Ranks one list holds; a list is compacted to between k and about
// k + (capacity - k) / 16 ranks when it is nearly full.
inline constexpr int kListCapacity = 2 * kMaxTopk;

struct CandidateLists {
  unsigned long long* ranks = nullptr;  // [lists][kListCapacity]
  std::int32_t* counts = nullptr;       // [lists] ranks held; 0 for a list never written
  std::int64_t rows = 0;
  int rows_per_unit = 1;
};

inline std::int64_t candidate_list_count(std::int64_t rows, int rows_per_unit, int workers) {
  return rows + static_cast<std::int64_t>(workers) * rows_per_unit;
}

// The list worker `worker` writes for draft row j of a unit whose first
// logits row is first_row; starts_inside: its range starts inside the unit.
DSA_HD std::int64_t candidate_list_index(const CandidateLists& lists, std::int64_t first_row,
                                                int j, bool starts_inside, int worker) {
  return starts_inside ? lists.rows + static_cast<std::int64_t>(worker) * lists.rows_per_unit + j
                       : first_row + j;
}

}  // namespace dsa::detail::cuda
