// The sample map and threshold rank of the fused index_topk's sampling pass
// (src/cuda/fused/row_samples.hpp), checked against brute force: which positions
// are sampled, how many a unit has at most (what sizes the sampling grid),
// the prefix below a length, and the margin a threshold keeps.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "cuda/fused/row_samples.hpp"

namespace {

namespace sampling = dsa::detail::cuda;

std::vector<std::int64_t> positions_of(const sampling::SampleMap& map) {
  std::vector<std::int64_t> positions;
  for (std::int32_t u = 0; u < map.count; ++u) positions.push_back(sampling::sample_position(map, u));
  return positions;
}

TEST(RowSamples, RunsOfAdjacentTokensFromEveryOtherPageWhileTheyFit) {
  for (std::int64_t pages : {1, 2, 17, 1000, 1024, 2047, 2048}) {
    const std::int64_t sampled_pages = (pages + 1) / 2;
    const sampling::SampleMap map = sampling::sample_map(pages);
    ASSERT_EQ(map.count, sampled_pages * sampling::kSampleTokensPerPage) << pages;
    const std::vector<std::int64_t> positions = positions_of(map);
    std::set<std::int64_t> starts_of_16_pages;
    for (std::int64_t ordinal = 0; ordinal < sampled_pages; ++ordinal) {
      const std::int64_t first = positions[ordinal * sampling::kSampleTokensPerPage];
      EXPECT_EQ(first / sampling::kStageTokens, 2 * ordinal);
      for (int i = 1; i < sampling::kSampleTokensPerPage; ++i) {
        EXPECT_EQ(positions[ordinal * sampling::kSampleTokensPerPage + i], first + i) << ordinal;
      }
      if (ordinal < 16) starts_of_16_pages.insert(first % sampling::kStageTokens);
    }
    // The run moves from sampled page to sampled page: 16 of them start it at 16 offsets.
    if (sampled_pages >= 16) EXPECT_EQ(starts_of_16_pages.size(), 16u) << pages;
  }
}

// The map's documented formula, with divisions, against its shifts.
TEST(RowSamples, PositionsFollowTheMapsFormula) {
  for (std::int64_t pages : {1, 5, 1024, 2047, 2048, 2049, 3000, 4096, 4097, 9000, 70001}) {
    const sampling::SampleMap map = sampling::sample_map(pages);
    const int per_page = map.per_page();
    // Every other page at least; more apart, and fewer tokens a page, only
    // where the capacity asks for it.
    // (A step one shorter would sample more pages than the capacity.)
    const std::int64_t pages_one_step_closer = (pages + map.page_step - 2) / (map.page_step - 1);
    ASSERT_TRUE(map.page_step == 2 || pages_one_step_closer > sampling::kSampleCapacity) << pages;
    const std::int64_t sampled_pages = (pages + map.page_step - 1) / map.page_step;
    ASSERT_TRUE(per_page == sampling::kSampleTokensPerPage ||
                sampled_pages * 2 * per_page > sampling::kSampleCapacity)
        << pages;
    for (std::int32_t u = 0; u < map.count; ++u) {
      const std::int64_t ordinal = u / per_page;
      const std::int64_t token = ordinal % (sampling::kStageTokens / per_page) * per_page + u % per_page;
      ASSERT_EQ(sampling::sample_position(map, u), ordinal * map.page_step * sampling::kStageTokens + token)
          << pages << " " << u;
    }
  }
}

TEST(RowSamples, PositionsGrowAndStayInsideTheUnit) {
  for (std::int64_t pages : {1, 1025, 2048, 2049, 4096, 4097, 10000, 70001}) {
    const sampling::SampleMap map = sampling::sample_map(pages);
    EXPECT_LE(map.count, sampling::kSampleCapacity) << pages;
    const std::vector<std::int64_t> positions = positions_of(map);
    for (std::size_t i = 0; i < positions.size(); ++i) {
      EXPECT_LT(positions[i], pages * sampling::kStageTokens) << pages;
      if (i > 0) EXPECT_GT(positions[i], positions[i - 1]) << pages << " sample " << i;
    }
  }
}

// The sampling grid is sized for the longest row: no shorter unit may have
// more samples than most_samples of the longest's pages.
TEST(RowSamples, MostSamplesBoundsEveryShorterUnit) {
  for (std::int64_t longest : {100, 1024, 1025, 1400, 3000, 5000}) {
    for (std::int64_t pages = 1; pages <= longest; ++pages) {
      ASSERT_LE(sampling::sample_map(pages).count, sampling::most_samples(longest))
          << pages << " pages under a longest unit of " << longest;
    }
  }
}

TEST(RowSamples, SamplesBelowALengthAreTheirPrefix) {
  for (std::int64_t pages : {3, 700, 1500, 5000}) {
    const sampling::SampleMap map = sampling::sample_map(pages);
    const std::vector<std::int64_t> positions = positions_of(map);
    for (std::int64_t limit : {std::int64_t{0}, std::int64_t{1}, std::int64_t{63}, std::int64_t{64},
                               std::int64_t{150}, pages * 32 + 7, pages * 64 - 1, pages * 64}) {
      std::int32_t below = 0;
      for (std::int64_t position : positions) below += position < limit ? 1 : 0;
      EXPECT_EQ(sampling::samples_below(map, limit), below) << pages << " pages, limit " << limit;
    }
  }
}

TEST(RowSamples, ThresholdRankKeepsItsMargin) {
  for (int k : {1, 17, 64, 2048}) {
    for (std::int64_t length : {std::int64_t{10}, std::int64_t{3000}, std::int64_t{20000},
                                std::int64_t{65536}, std::int64_t{300000}}) {
      for (std::int32_t samples : {0, 1, 50, 1250, 4096}) {
        if (samples > length) continue;
        const std::int32_t r = sampling::threshold_rank(samples, length, k);
        EXPECT_LE(r, samples);
        if (r == 0) continue;
        EXPECT_LT(sampling::kSampleMargin * k, static_cast<double>(length));
        // Samples expected among the row's top k, and the margin above them.
        const double expected = static_cast<double>(k) * samples / static_cast<double>(length);
        EXPECT_GE(r, sampling::kSampleMargin * expected) << k << " " << length << " " << samples;
        EXPECT_GE(r, expected + sampling::kSampleSigmas * std::sqrt(expected))
            << k << " " << length << " " << samples;
      }
    }
  }
  // A row no longer than the margin times k gets no threshold.
  EXPECT_EQ(sampling::threshold_rank(100, 3000, 2048), 0);
}

}  // namespace
