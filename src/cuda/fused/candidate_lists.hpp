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

#include "common/hostdevice.hpp"
#include "cuda/fused/row_samples.hpp"
#include "dsa/cache.hpp"
#include "dsa/topk.hpp"

namespace dsa::detail::cuda {

// Selector warps of the fused kernel's CTA, each writing its own lists.
inline constexpr int kListWriters = 4;

// Lists per (row or worker row): the selector warps a unit's rows leave idle.
DSA_HD constexpr int list_parts(int rows_per_unit) {
  return rows_per_unit < kListWriters ? kListWriters / rows_per_unit : 1;
}

// Pages a selector offers together: pairs of consecutive pages of a row go
// to one part (candidate_select.cuh), and a list keeps room for one more
// offer.
inline constexpr int kPagesPerOffer = 2;

// Ranks one list of a call whose rows reach max_context_len positions
// holds; a list is compacted to between k and about k + (capacity - k) / 16
// ranks when it is nearly full, which stalls its worker's pipeline while one
// selector warp reads the list over.
// - Without thresholds (calls without a sample, row_samples.hpp) every
//   position is listed: a list holds all its part can be offered, about
//   16 K ranks a row at most, and never compacts.
// - With them about 1.9 k positions a row are listed (spread ~0.25 k): a
//   part of one or two, which one worker often fills with most of the row's
//   share, holds three k; a part of four holds two k. Should the thresholds
//   fail, the row's second pass lists everything and compacts.
DSA_HD constexpr int list_capacity(int rows_per_unit, std::int64_t max_context_len) {
  const int parts = list_parts(rows_per_unit);
  if (sampled_call(max_context_len)) return parts < kListWriters ? 3 * kMaxTopk : 2 * kMaxTopk;
  constexpr std::int64_t kOfferPositions = kPagesPerOffer * kStageTokens;
  const std::int64_t offers = (max_context_len + kOfferPositions - 1) / kOfferPositions;
  const std::int64_t whole = ((offers + parts - 1) / parts + 1) * kOfferPositions;
  return static_cast<int>(whole > 2 * kMaxTopk ? whole : 2 * kMaxTopk);
}

struct CandidateLists {
  unsigned long long* ranks = nullptr;  // [lists][capacity]
  std::int32_t* counts = nullptr;       // [lists] ranks held; 0 for a list never written
  std::int64_t rows = 0;
  int rows_per_unit = 1;
  int parts = 1;     // list_parts(rows_per_unit)
  int capacity = 0;  // list_capacity(rows_per_unit, the call's max_context_len)
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
