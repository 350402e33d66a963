// How a worker walks its share of a schedule (see include/dsa/schedule.hpp).
// Shared by the planner and every backend so that they agree on what an item
// is. Workers cover [schedule[w], schedule[w + 1]) in (unit, chunk) order,
// checked against the lengths they are given, so coverage is complete even
// for a schedule planned for other lengths or worker counts.
#pragma once

#include <cstdint>

#include "common/hostdevice.hpp"
#include "common/problem.hpp"
#include "dsa/schedule.hpp"

namespace dsa::detail {

DSA_HD std::int32_t row_length(const LengthsRef& lens, std::int64_t b, std::int64_t j) {
  return lens.data[b * lens.stride_b + j * lens.stride_n];
}

// Number of units: requests on the native path, rows on the per-token path
// (with request_offsets, batch is the number of rows T and next_n is 1: units
// are then named by their first row, T on either path).
DSA_HD std::int64_t schedule_units(std::int64_t batch, std::int64_t next_n, LogitsPath path) {
  return path == LogitsPath::per_token ? batch * next_n : batch;
}

// The request holding row `row` among requests of uneven row counts: the q
// with offsets[q] <= row < offsets[q + 1], by binary search over the
// requests + 1 entries, or -1 where none does (entries that do not cover the
// rows; only entries 0 .. requests are read). Exact for non-decreasing entries.
DSA_HD std::int64_t request_of_row(const std::int32_t* offsets, std::int64_t requests, std::int64_t row) {
  // The first q whose entry is beyond the row; every q before it that the
  // search looked at had an entry at or below the row.
  std::int64_t first = 0;
  std::int64_t count = requests;
  while (count > 0) {
    const std::int64_t half = count / 2;
    if (offsets[first + half] <= row) {
      first += half + 1;
      count -= half + 1;
    } else {
      count = half;
    }
  }
  const std::int64_t request = first - 1;
  return request >= 0 && row < offsets[request + 1] ? request : -1;
}

// The rule entry q (0 <= q <= requests) of request_offsets breaks, if any:
// offsets[0] == 0, offsets[q] >= offsets[q - 1], offsets[requests] == rows.
enum class OffsetsViolation { none, first_not_zero, decreasing, last_not_rows };

DSA_HD OffsetsViolation request_offsets_violation(const RequestRows& r, std::int64_t q, std::int64_t rows) {
  if (q == 0 && r.offsets[0] != 0) return OffsetsViolation::first_not_zero;
  if (q > 0 && r.offsets[q] < r.offsets[q - 1]) return OffsetsViolation::decreasing;
  if (q == r.requests && r.offsets[q] != rows) return OffsetsViolation::last_not_rows;
  return OffsetsViolation::none;
}

// How a call's rows form schedule units. Without request_offsets, the rows
// are (b, j) of lens [B, next_n]. With it, lens is [T, 1] and row r belongs
// to request request_of_row(r); the native units are then row tiles of
// kVarlenRowTile rows of one request, named by their first row.
struct UnitLayout {
  LengthsRef lens;
  std::int64_t next_n = 1;
  LogitsPath path = LogitsPath::native;
  std::int64_t units = 0;  // schedule_units(...): the trailer's unit count
  const std::int32_t* request_offsets = nullptr;  // [requests + 1], or nullptr
  std::int64_t requests = 0;
};

// One unit: rows first_row .. first_row + rows - 1 (flat, b * next_n + j),
// all of block-table row `request`; `next` names the unit that follows.
// request == -1 for a row no request covers: it has no items.
struct UnitSpan {
  std::int64_t unit = 0;
  std::int64_t next = 0;
  std::int64_t request = 0;
  std::int64_t first_row = 0;
  std::int64_t rows = 0;
};

// The unit holding `unit` (0 <= unit < layout.units) named as the schedule
// names units. Only with request_offsets on the native path can a name fall
// inside a unit (a row tile's later row): the span then starts before it.
// Its rows stay within [0, units) and it ends past `unit` whatever the
// offsets hold (the CUDA planner walks offsets nobody checked).
DSA_HD UnitSpan unit_containing(const UnitLayout& l, std::int64_t unit) {
  if (l.request_offsets == nullptr) {
    if (l.path == LogitsPath::per_token) return UnitSpan{unit, unit + 1, unit / l.next_n, unit, 1};
    return UnitSpan{unit, unit + 1, unit, unit * l.next_n, l.next_n};
  }
  const std::int64_t request = request_of_row(l.request_offsets, l.requests, unit);
  if (request < 0 || l.path == LogitsPath::per_token) return UnitSpan{unit, unit + 1, request, unit, 1};
  const std::int64_t begin = l.request_offsets[request];
  std::int64_t first = begin + (unit - begin) / kVarlenRowTile * kVarlenRowTile;
  std::int64_t end = first + kVarlenRowTile < l.request_offsets[request + 1] ? first + kVarlenRowTile
                                                                              : l.request_offsets[request + 1];
  first = first > 0 ? first : 0;
  end = end < l.units ? end : l.units;
  return UnitSpan{first, end, request, first, end - first};
}

template <typename Problem>
DSA_HD UnitLayout unit_layout(const Problem& p) {
  return UnitLayout{p.lens, p.next_n, p.path, schedule_units(p.batch, p.next_n, p.path), p.varlen.offsets,
                    p.varlen.requests};
}

// The block-table row of flat row `row` (b * next_n + j): its request.
template <typename Problem>
DSA_HD std::int64_t table_row_of(const Problem& p, std::int64_t row) {
  return p.varlen.offsets != nullptr ? request_of_row(p.varlen.offsets, p.varlen.requests, row)
                                     : row / p.next_n;
}

// Key positions a unit spans: its rows' longest length (negative lengths
// count as 0; a row of no request spans none).
DSA_HD std::int64_t unit_length(const UnitLayout& l, const UnitSpan& span) {
  if (span.request < 0) return 0;
  std::int64_t b = span.first_row / l.next_n, j = span.first_row % l.next_n;
  std::int32_t longest = 0;
  for (std::int64_t i = 0; i < span.rows; ++i) {
    const std::int32_t len = row_length(l.lens, b, j);
    longest = len > longest ? len : longest;
    if (++j == l.next_n) j = 0, ++b;
  }
  return longest;
}

// The layout of a call without request_offsets.
DSA_HD UnitLayout fixed_layout(const LengthsRef& lens, std::int64_t next_n, LogitsPath path,
                               std::int64_t units) {
  return UnitLayout{lens, next_n, path, units, nullptr, 0};
}

DSA_HD std::int64_t chunks_for_length(std::int64_t length) {
  return (length + kChunkTokens - 1) / kChunkTokens;
}

struct WorkItem {
  std::int64_t unit = 0;
  std::int64_t chunk = 0;
};

DSA_HD bool item_before(const WorkItem& a, const WorkItem& b) {
  return a.unit < b.unit || (a.unit == b.unit && a.chunk < b.chunk);
}

DSA_HD WorkItem schedule_entry(const std::int32_t* schedule, int index) {
  return WorkItem{schedule[2 * index], schedule[2 * index + 1]};
}

// The planners' split: worker w's first position among `total` weight
// positions shared by `workers` is floor(w * total / workers), computed
// exactly in 64 bits (w * (total % workers) < workers^2).
DSA_HD std::int64_t worker_first_position(std::int64_t worker, std::int64_t total, std::int64_t workers) {
  const std::int64_t whole = total / workers, rest = total % workers;
  return worker * whole + worker * rest / workers;
}

// What the split weighs (dsa/schedule.hpp): entering a unit of `rows` rows,
// and a whole unit of `chunks` items (one with none weighs nothing).
DSA_HD std::int64_t unit_start_weight(std::int64_t rows) {
  return rows <= kUnitStartWeightMaxRows ? kUnitStartWeight : 0;
}
DSA_HD std::int64_t unit_weight(std::int64_t chunks, std::int64_t rows) {
  return chunks > 0 ? unit_start_weight(rows) + chunks : 0;
}

// The chunk a worker starts at when its first position lies `offset` into
// the weight of a unit of `rows` rows: the unit's start positions name its
// first chunk.
DSA_HD std::int64_t chunk_at_weight_offset(std::int64_t offset, std::int64_t rows) {
  const std::int64_t start = unit_start_weight(rows);
  return offset > start ? offset - start : 0;
}

// Worker w's half-open range; the last worker runs to the end of the batch.
DSA_HD WorkItem worker_begin(const std::int32_t* schedule, int worker) {
  return schedule_entry(schedule, worker);
}
DSA_HD WorkItem worker_end(const std::int32_t* schedule, int worker, int num_workers,
                           std::int64_t units) {
  return worker + 1 < num_workers ? schedule_entry(schedule, worker + 1) : WorkItem{units, 0};
}

// The agreement rule between a schedule and the call it serves, checked by
// the host validation and by every scoring kernel (worker w checks entry w,
// worker 0 the trailer too): entry 0 is (0, 0); every entry lies within
// [0, units] with a chunk >= 0 and starts no earlier than the one before;
// the trailer is (units, kChunkTokens), so the schedule was planned for this
// batch, path and chunk size. Entries planned for other lengths or another
// worker count agree: the walk below still covers every item, checked
// against the lengths it is given. With request_offsets units are named by
// their first row and number T on either path, so entries planned for other
// offsets (or the other path) agree too: an entry inside a row tile is
// walked from the next tile (for_each_unit_item), and coverage stays complete.
DSA_HD bool schedule_entry_agrees(const std::int32_t* schedule, int index, int num_workers,
                                  std::int64_t units) {
  const WorkItem entry = schedule_entry(schedule, index);
  if (index == num_workers) return entry.unit == units && entry.chunk == kChunkTokens;
  if (index == 0) return entry.unit == 0 && entry.chunk == 0;
  return entry.unit >= 0 && entry.unit <= units && entry.chunk >= 0 &&
         !item_before(entry, schedule_entry(schedule, index - 1));
}

// Calls visit(span, chunk, unit_length) for every item of the worker's
// range. A worker whose first entry falls inside a unit (a schedule planned
// for other request_offsets) starts at the next unit: the worker before it
// ends past every item of that unit, since (first row, chunk) < (entry row, chunk).
template <typename Visit>
DSA_HD void for_each_unit_item(const std::int32_t* schedule, int worker, int num_workers,
                               const UnitLayout& layout, Visit&& visit) {
  WorkItem item = worker_begin(schedule, worker);
  const WorkItem end = worker_end(schedule, worker, num_workers, layout.units);
  if (item.unit < 0) item = WorkItem{0, 0};
  // A unit's length is read once, not at every item: the walk is on the
  // Hopper producers' path. The first is read before the loop, with nothing
  // to wait for but the schedule.
  UnitSpan span{};
  std::int64_t length = 0;
  if (item.unit < layout.units) {
    span = unit_containing(layout, item.unit);
    if (span.unit != item.unit) {
      item = WorkItem{span.next, 0};
      if (item.unit < layout.units) span = unit_containing(layout, item.unit);
    }
    length = unit_length(layout, span);
  }
  while (item.unit < layout.units && item_before(item, end)) {
    if (item.unit != span.unit) {
      span = unit_containing(layout, item.unit);
      length = unit_length(layout, span);
    }
    if (item.chunk < 0) item.chunk = 0;
    if (item.chunk >= chunks_for_length(length)) {
      item = WorkItem{span.next, 0};
      continue;
    }
    visit(span, item.chunk, length);
    ++item.chunk;
  }
}

// The walk of a call without request_offsets, as visit(unit, chunk, unit_length).
template <typename Visit>
DSA_HD void for_each_item(const std::int32_t* schedule, int worker, int num_workers,
                          std::int64_t units, const LengthsRef& lens, std::int64_t next_n,
                          LogitsPath path, Visit&& visit) {
  for_each_unit_item(schedule, worker, num_workers, fixed_layout(lens, next_n, path, units),
                     [&](const UnitSpan& span, std::int64_t chunk, std::int64_t length) {
                       visit(span.unit, chunk, length);
                     });
}

}  // namespace dsa::detail
