// The schedule walk every scoring kernel follows (src/common/schedule_walk.hpp),
// over requests of uneven row counts: for a schedule planned by the library,
// and for one planned for other offsets or another worker count, the workers
// together visit every (row tile, chunk) item of the call exactly once, each
// worker in increasing order, and every tile holds 1..kVarlenRowTile rows of
// one request. Checked against items counted independently from the offsets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/schedule_walk.hpp"
#include "dsa/dsa.hpp"

namespace {

using dsa::LogitsPath;

struct Layout {
  std::vector<std::int32_t> offsets;  // [B + 1]
  std::vector<std::int32_t> lens;     // [T]
};

// Rows per request as given; every row's length drawn from [0, max_length],
// the request's last row the longest.
Layout make_layout(const std::vector<int>& rows_per_request, int max_length, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  Layout l;
  l.offsets.push_back(0);
  for (int rows : rows_per_request) {
    std::vector<std::int32_t> lens(static_cast<std::size_t>(rows));
    for (auto& len : lens) len = static_cast<std::int32_t>(rng() % (static_cast<std::uint64_t>(max_length) + 1));
    if (rows > 0) std::swap(*std::max_element(lens.begin(), lens.end()), lens.back());
    l.lens.insert(l.lens.end(), lens.begin(), lens.end());
    l.offsets.push_back(static_cast<std::int32_t>(l.lens.size()));
  }
  return l;
}

// (first row of the tile, chunk) -> 1 for every item the call has, counted
// from the offsets: tiles of up to 8 rows of one request (1 on the per-token
// path), ceil(longest row / 256) chunks each.
std::map<std::pair<std::int64_t, std::int64_t>, int> expected_items(const Layout& l, LogitsPath path) {
  const std::int64_t tile = path == LogitsPath::native ? dsa::kVarlenRowTile : 1;
  std::map<std::pair<std::int64_t, std::int64_t>, int> items;
  for (std::size_t b = 0; b + 1 < l.offsets.size(); ++b) {
    for (std::int64_t first = l.offsets[b]; first < l.offsets[b + 1]; first += tile) {
      const std::int64_t end = std::min<std::int64_t>(first + tile, l.offsets[b + 1]);
      std::int32_t longest = 0;
      for (std::int64_t r = first; r < end; ++r) longest = std::max(longest, l.lens[static_cast<std::size_t>(r)]);
      for (std::int64_t c = 0; c * dsa::kChunkTokens < longest; ++c) items[{first, c}] = 1;
    }
  }
  return items;
}

std::vector<std::int32_t> plan(const Layout& l, int workers, LogitsPath path) {
  std::vector<std::int32_t> lens = l.lens, offsets = l.offsets;
  lens.reserve(1);  // a valid pointer for no rows
  std::vector<std::int32_t> schedule(static_cast<std::size_t>(2 * (workers + 1)));
  dsa::ExecContext ctx;
  ctx.backend = dsa::Backend::cpu_reference;
  const dsa::Status status = dsa::plan_schedule(
      dsa::make_view(lens.data(), dsa::DType::int32, {static_cast<std::int64_t>(l.lens.size())}), workers, path,
      dsa::make_view(schedule.data(), dsa::DType::int32, {workers + 1, 2}), ctx,
      dsa::make_view(offsets.data(), dsa::DType::int32, {static_cast<std::int64_t>(l.offsets.size())}));
  EXPECT_TRUE(status.ok()) << status.to_string();
  return schedule;
}

// Walks `schedule` with `workers` workers over layout `l` and checks the items.
void expect_exact_cover(const Layout& l, const std::vector<std::int32_t>& schedule, int workers, LogitsPath path) {
  const std::int64_t rows = static_cast<std::int64_t>(l.lens.size());
  const dsa::detail::UnitLayout layout{
      dsa::detail::LengthsRef{l.lens.data(), 1, 0}, 1, path, rows, l.offsets.data(),
      static_cast<std::int64_t>(l.offsets.size()) - 1};
  std::map<std::pair<std::int64_t, std::int64_t>, int> seen;
  for (int w = 0; w < workers; ++w) {
    std::pair<std::int64_t, std::int64_t> previous{-1, -1};
    dsa::detail::for_each_unit_item(
        schedule.data(), w, workers, layout,
        [&](const dsa::detail::UnitSpan& span, std::int64_t chunk, std::int64_t length) {
          ASSERT_GE(span.request, 0);
          ASSERT_GE(span.rows, 1);
          ASSERT_LE(span.rows, path == LogitsPath::native ? dsa::kVarlenRowTile : 1);
          ASSERT_GE(span.first_row, l.offsets[static_cast<std::size_t>(span.request)]);
          ASSERT_LE(span.first_row + span.rows, l.offsets[static_cast<std::size_t>(span.request) + 1]);
          ASSERT_LT(chunk * dsa::kChunkTokens, length);
          const std::pair<std::int64_t, std::int64_t> item{span.first_row, chunk};
          ASSERT_LT(previous, item) << "worker " << w << " walks out of order";
          previous = item;
          ++seen[item];
        });
  }
  EXPECT_EQ(seen, expected_items(l, path));
}

TEST(ScheduleWalk, UnevenRequestsAreCoveredExactlyOnce) {
  const std::vector<std::vector<int>> shapes{
      {0, 130, 2, 0, 5}, {1, 4, 2, 8, 3}, {1, 133, 2, 0, 6}, {0, 3, 0, 0, 9, 0}, {17}, {0, 0}, {8, 8, 9, 7}};
  std::uint64_t seed = 1;
  for (const auto& shape : shapes) {
    for (int max_length : {0, 300, 3000}) {
      const Layout l = make_layout(shape, max_length, seed++);
      for (LogitsPath path : {LogitsPath::native, LogitsPath::per_token}) {
        for (int workers : {1, 3, 16, 132}) {
          SCOPED_TRACE("shape of " + std::to_string(shape.size()) + " requests, lengths to " +
                       std::to_string(max_length) + ", " + std::to_string(workers) + " workers, " +
                       dsa::logits_path_name(path));
          const std::vector<std::int32_t> schedule = plan(l, workers, path);
          expect_exact_cover(l, schedule, workers, path);
          // A schedule planned for other offsets (the rows regrouped) still covers this call.
          Layout regrouped = l;
          for (std::size_t b = 1; b + 1 < regrouped.offsets.size(); ++b) {
            regrouped.offsets[b] = std::min(regrouped.offsets[b] + 3, regrouped.offsets[b + 1]);
          }
          expect_exact_cover(l, plan(regrouped, workers, path), workers, path);
        }
      }
    }
  }
}

}  // namespace
