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

// Number of units: requests on the native path, rows on the per-token path.
DSA_HD std::int64_t schedule_units(std::int64_t batch, std::int64_t next_n, LogitsPath path) {
  return path == LogitsPath::per_token ? batch * next_n : batch;
}

// Key positions a unit spans (negative lengths count as 0).
DSA_HD std::int64_t unit_length(const LengthsRef& lens, std::int64_t next_n, LogitsPath path,
                                std::int64_t unit) {
  if (path == LogitsPath::per_token) {
    const std::int32_t len = row_length(lens, unit / next_n, unit % next_n);
    return len > 0 ? len : 0;
  }
  std::int32_t longest = 0;
  for (std::int64_t j = 0; j < next_n; ++j) {
    const std::int32_t len = row_length(lens, unit, j);
    longest = len > longest ? len : longest;
  }
  return longest;
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
// against the lengths it is given.
DSA_HD bool schedule_entry_agrees(const std::int32_t* schedule, int index, int num_workers,
                                  std::int64_t units) {
  const WorkItem entry = schedule_entry(schedule, index);
  if (index == num_workers) return entry.unit == units && entry.chunk == kChunkTokens;
  if (index == 0) return entry.unit == 0 && entry.chunk == 0;
  return entry.unit >= 0 && entry.unit <= units && entry.chunk >= 0 &&
         !item_before(entry, schedule_entry(schedule, index - 1));
}

// Calls visit(unit, chunk, unit_length) for every item of the worker's range.
template <typename Visit>
DSA_HD void for_each_item(const std::int32_t* schedule, int worker, int num_workers,
                          std::int64_t units, const LengthsRef& lens, std::int64_t next_n,
                          LogitsPath path, Visit&& visit) {
  WorkItem item = worker_begin(schedule, worker);
  const WorkItem end = worker_end(schedule, worker, num_workers, units);
  if (item.unit < 0) item = WorkItem{0, 0};
  // A unit's length is read once, not at every item: the walk is on the
  // Hopper producers' path. The first is read before the loop, with nothing
  // to wait for but the schedule.
  std::int64_t length_unit = item.unit;
  std::int64_t length = item.unit < units ? unit_length(lens, next_n, path, item.unit) : 0;
  while (item.unit < units && item_before(item, end)) {
    if (item.unit != length_unit) {
      length_unit = item.unit;
      length = unit_length(lens, next_n, path, item.unit);
    }
    if (item.chunk < 0) item.chunk = 0;
    if (item.chunk >= chunks_for_length(length)) {
      item = WorkItem{item.unit + 1, 0};
      continue;
    }
    visit(item.unit, item.chunk, length);
    ++item.chunk;
  }
}

}  // namespace dsa::detail
