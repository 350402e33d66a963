// List capacities of the fused index_topk (src/cuda/fused/candidate_lists.hpp),
// checked against a count of the positions each part of a row is offered:
// pairs of consecutive pages go to the parts in turn.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cuda/fused/candidate_lists.hpp"
#include "dsa/cache.hpp"
#include "dsa/topk.hpp"

namespace {

namespace lists = dsa::detail::cuda;

// The most positions of a row of `length` positions that one of `parts`
// parts is offered.
std::int64_t most_offered(std::int64_t length, int parts) {
  std::vector<std::int64_t> offered(static_cast<std::size_t>(parts), 0);
  for (std::int64_t position = 0; position < length; ++position) {
    const std::int64_t pair = position / lists::kStageTokens / 2;
    ++offered[static_cast<std::size_t>(pair % parts)];
  }
  return *std::max_element(offered.begin(), offered.end());
}

TEST(CandidateLists, WithoutThresholdsAListHoldsItsWholePartAndRoomForAnOffer) {
  for (int rows_per_unit = 1; rows_per_unit <= 8; ++rows_per_unit) {
    const int parts = lists::list_parts(rows_per_unit);
    for (std::int64_t length : {1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 4095, 4096, 8191, 8192, 8193,
                                10650, 12000, 16383}) {
      ASSERT_FALSE(lists::sampled_call(length)) << length;
      const int capacity = lists::list_capacity(rows_per_unit, length);
      // A list compacts once it holds more than capacity - one offer.
      const std::int64_t room = capacity - lists::kPagesPerOffer * lists::kStageTokens;
      EXPECT_GE(room, most_offered(length, parts)) << rows_per_unit << " rows, " << length;
      EXPECT_GE(capacity, 2 * dsa::kMaxTopk) << rows_per_unit << " rows, " << length;
      // The documented bound: about 8 bytes a position of the row.
      const std::int64_t row_bytes = std::int64_t{parts} * capacity * 8;
      const std::int64_t smallest_lists = std::int64_t{parts} * 2 * dsa::kMaxTopk * 8;
      EXPECT_LE(row_bytes, std::max(8 * length + 8 * parts * 256, smallest_lists))
          << rows_per_unit << " rows, " << length;
    }
  }
}

TEST(CandidateLists, WithThresholdsListsOfFewerPartsHoldMore) {
  // A threshold admits about 1.9 k positions a row: two k per list where
  // four share a row, three k where one or two do; whatever the context.
  for (std::int64_t length : {16384, 65536, 1 << 20}) {
    ASSERT_TRUE(lists::sampled_call(length)) << length;
    EXPECT_EQ(lists::list_capacity(1, length), 2 * dsa::kMaxTopk);
    for (int rows_per_unit = 2; rows_per_unit <= 8; ++rows_per_unit) {
      EXPECT_EQ(lists::list_capacity(rows_per_unit, length), 3 * dsa::kMaxTopk) << rows_per_unit;
    }
  }
}

}  // namespace
