// Row samples of the fused index_topk: which key positions of a unit are
// scored ahead of the full pass, and the threshold each row's sample gives.
//
// The sample takes a run of a few adjacent tokens from every other page a
// unit reads (not whole pages: tokens of one page score alike, so a sample
// of whole pages misjudges rows whose scores vary from page to page), at an
// offset that moves from sampled page to sampled page. Adjacent tokens make
// one contiguous read of keys and scales per page: the pass is bound by the
// number of scattered reads, not by their bytes, so it reads half the pages
// rather than one token of each. A row's threshold is the sample value that as
// many as kSampleMargin * k of the row's positions are expected to reach;
// the selection pass then lists only values at or above it, which spares it
// almost every list compaction. The expectation can fail (a row whose
// sampled tokens score above its others): a row that lists fewer than k
// positions at or above its threshold is selected again without one, so the
// result never depends on the sample.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend.hpp"
#include "common/hostdevice.hpp"
#include "dsa/topk.hpp"

namespace dsa::detail::cuda {

// Calls whose longest row is shorter leave the sample out: their lists hold
// every position (candidate_lists.hpp) in a workspace that stays small, and
// the pass would cost more than it saves.
inline constexpr std::int64_t kSampledContext = 8 * kMaxTopk;
// Whether a call whose rows reach max_context_len positions scores a sample
// first and lists only what its rows' thresholds admit.
DSA_HD constexpr bool sampled_call(std::int64_t max_context_len) {
  return max_context_len >= kSampledContext;
}
// Samples one row keeps at most: the per-row workspace is fixed, whatever
// the context length.
inline constexpr int kSampleCapacity = 2 * kMaxTopk;
// Tokens sampled from each sampled page while the capacity allows, and the
// pages between two sampled ones at least (one token in 64: the pass costs
// about as much per page read as per token).
inline constexpr int kSampleTokensPerPageShift = 1;
inline constexpr int kSampleTokensPerPage = 1 << kSampleTokensPerPageShift;
inline constexpr int kSamplePageStep = 2;
// Positions a threshold aims to admit, in units of k, and at least this many
// standard deviations of the count of samples expected among the row's top
// k above that count. Sampling 1/64 of a row with k = 2048, 32 samples are
// expected there and the threshold is the 61st largest, to 16 bits (about
// 1.9 k admitted): fewer than k admissions, the row's second pass, has a
// probability near 2e-6 (binomial tail).
inline constexpr float kSampleMargin = 1.5f;
inline constexpr float kSampleSigmas = 5.0f;

// Which positions of a unit reading `pages` pages are sampled: sample u is
// token (o % (64 / per_page)) * per_page + u % per_page of page o * page_step,
// o = u / per_page the sampled page's ordinal. Positions grow with u, so the
// samples of a row shorter than the unit are a prefix. per_page is a power of
// two, kept as its logarithm, so that a position costs shifts and one
// multiply: the sampling pass computes one for every 16 bytes it gathers.
struct SampleMap {
  int per_page_shift = kSampleTokensPerPageShift;
  std::int32_t page_step = kSamplePageStep;
  std::int32_t count = 0;  // samples of the unit

  DSA_HD int per_page() const { return 1 << per_page_shift; }
};

DSA_HD SampleMap sample_map(std::int64_t pages) {
  SampleMap map;
  const std::int64_t capacity_step = (pages + kSampleCapacity - 1) / kSampleCapacity;
  map.page_step =
      static_cast<std::int32_t>(capacity_step > kSamplePageStep ? capacity_step : kSamplePageStep);
  const std::int64_t sampled_pages = (pages + map.page_step - 1) / map.page_step;
  while (map.per_page_shift > 0 && sampled_pages * map.per_page() > kSampleCapacity) --map.per_page_shift;
  map.count = static_cast<std::int32_t>(sampled_pages) * map.per_page();
  return map;
}

// The most samples a unit of at most `pages` pages has (fewer tokens a page
// beyond 2 * kSampleCapacity / kSampleTokensPerPage pages: the count does not
// grow with the pages).
DSA_HD std::int64_t most_samples(std::int64_t pages) {
  const std::int64_t all = (pages + kSamplePageStep - 1) / kSamplePageStep * kSampleTokensPerPage;
  return all < kSampleCapacity ? all : kSampleCapacity;
}

DSA_HD std::int64_t sample_position(const SampleMap& map, std::int32_t u) {
  const std::int32_t ordinal = u >> map.per_page_shift;
  const std::int64_t page = std::int64_t{ordinal} * map.page_step;
  const int runs_mask = (kStageTokens >> map.per_page_shift) - 1;  // runs a page holds, less one
  return page * kStageTokens + ((ordinal & runs_mask) << map.per_page_shift) + (u & (map.per_page() - 1));
}

// Samples of the map below `limit` (a prefix), by bisection.
DSA_HD std::int32_t samples_below(const SampleMap& map, std::int64_t limit) {
  std::int32_t low = 0;
  std::int32_t high = map.count;
  while (low < high) {
    const std::int32_t middle = low + (high - low) / 2;
    if (sample_position(map, middle) < limit) {
      low = middle + 1;
    } else {
      high = middle;
    }
  }
  return low;
}

// The rank (1 = largest) of the sample value a row's threshold takes, with
// `samples` of its positions below `length` sampled: about kSampleMargin
// times the samples expected among the row's top k, and at least
// kSampleSigmas standard deviations (of that count) above them. 0 when no
// threshold would spare anything (the row is too short for one).
DSA_HD std::int32_t threshold_rank(std::int32_t samples, std::int64_t length, int k) {
  if (samples <= 0 || length <= 0) return 0;
  if (static_cast<double>(kSampleMargin) * k >= static_cast<double>(length)) return 0;
  const double expected = static_cast<double>(k) * samples / static_cast<double>(length);
  const double rank = fmax(static_cast<double>(kSampleMargin) * expected,
                           expected + static_cast<double>(kSampleSigmas) * sqrt(expected));
  const std::int32_t r = static_cast<std::int32_t>(rank) + 1;
  return r <= samples ? r : 0;
}

}  // namespace dsa::detail::cuda
