// The threaded CPU path's block kernels, each against a float64 evaluation
// of the same formula: the one this processor runs through the library's
// calls is covered by the other suites, the other one only here.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/random_inputs.hpp"
#include "common/reference.hpp"
#include "cpu/score_block.hpp"

namespace dsa_test {
namespace {

using dsa::detail::cpu::BlockInputs;
using dsa::detail::cpu::kBlockKeys;

struct Block {
  int heads;
  int head_dim;
  std::vector<float> query, weights, keys, scales;  // keys [kBlockKeys][head_dim]
  std::vector<std::uint32_t> query_pairs, key_pairs;

  BlockInputs inputs() const {
    return BlockInputs{heads, head_dim, query.data(), query_pairs.data(), weights.data(), key_pairs.data(),
                       scales.data()};
  }
};

// Values of random e4m3 codes (NaN codes avoided unless allowed).
float random_e4m3(Rng& rng, bool allow_nan) {
  std::uniform_int_distribution<int> code(0, 255);
  for (;;) {
    const auto c = static_cast<std::uint8_t>(code(rng));
    if (allow_nan || (c & 0x7F) != 0x7F) return e4m3_decode(c);
  }
}

// One key in three negative-scaled, padding keys (zero, scale 0) past `count`,
// and with `nan_key` one NaN in that key.
Block make_block(int heads, int head_dim, int count, int nan_key, std::uint64_t seed) {
  Rng rng(seed);
  Block b{heads, head_dim, {}, {}, {}, {}, {}, {}};
  std::normal_distribution<float> normal;
  b.query.resize(static_cast<std::size_t>(heads * head_dim));
  for (float& q : b.query) q = random_e4m3(rng, false);
  b.weights.resize(static_cast<std::size_t>(heads));
  for (float& w : b.weights) w = normal(rng);
  b.keys.assign(static_cast<std::size_t>(kBlockKeys * head_dim), 0.0f);
  b.scales.assign(kBlockKeys, 0.0f);
  for (int i = 0; i < count; ++i) {
    for (int d = 0; d < head_dim; ++d) b.keys[static_cast<std::size_t>(i * head_dim + d)] = random_e4m3(rng, false);
    b.scales[static_cast<std::size_t>(i)] = std::abs(normal(rng)) * (i % 3 == 1 ? -0.01f : 0.01f);
  }
  if (nan_key >= 0) b.keys[static_cast<std::size_t>(nan_key * head_dim + 5)] = std::numeric_limits<float>::quiet_NaN();
  for (int h = 0; h < heads; ++h) {
    for (int w = 0; w < head_dim / 2; ++w) {
      const float* q = b.query.data() + h * head_dim + 2 * w;
      b.query_pairs.push_back(dsa::detail::cpu::bf16_pair(q[0], q[1]));
    }
  }
  b.key_pairs.resize(static_cast<std::size_t>(head_dim / 2 * kBlockKeys));
  for (int w = 0; w < head_dim / 2; ++w) {
    for (int i = 0; i < kBlockKeys; ++i) {
      const float* k = b.keys.data() + i * head_dim + 2 * w;
      b.key_pairs[static_cast<std::size_t>(w * kBlockKeys + i)] = dsa::detail::cpu::bf16_pair(k[0], k[1]);
    }
  }
  return b;
}

// Checks out[] against the formula in float64, within float32 rounding of
// the sums' magnitudes.
::testing::AssertionResult matches_formula(const Block& b, const float* out) {
  for (int i = 0; i < kBlockKeys; ++i) {
    double logit = 0.0, magnitude = 0.0;
    for (int h = 0; h < b.heads; ++h) {
      double dot = 0.0, dot_magnitude = 0.0;
      for (int d = 0; d < b.head_dim; ++d) {
        const double term = double{b.query[static_cast<std::size_t>(h * b.head_dim + d)]} *
                            b.keys[static_cast<std::size_t>(i * b.head_dim + d)];
        dot += term;
        dot_magnitude += std::abs(term);
      }
      const double scaled = b.scales[static_cast<std::size_t>(i)] * dot;
      logit += b.weights[static_cast<std::size_t>(h)] * (scaled > 0 ? scaled : 0.0);  // NaN gives 0
      if (!std::isnan(dot_magnitude)) {
        magnitude += std::abs(b.weights[static_cast<std::size_t>(h)] * b.scales[static_cast<std::size_t>(i)]) *
                     dot_magnitude;
      }
    }
    const double bound = 1e-5 * magnitude + 1e-30;
    if (!(std::abs(out[i] - logit) <= bound)) {
      return ::testing::AssertionFailure() << "key " << i << ": got " << out[i] << ", want " << logit << " (bound "
                                           << bound << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

struct Shape {
  int heads;
  int head_dim;
  int count;
  int nan_key;
};

class ScoreBlockTest : public ::testing::TestWithParam<Shape> {};

TEST_P(ScoreBlockTest, KernelsMatchTheFormula) {
  const Shape s = GetParam();
  const Block b = make_block(s.heads, s.head_dim, s.count, s.nan_key,
                             static_cast<std::uint64_t>(s.heads * 1000 + s.head_dim * 10 + s.count));
  float out[kBlockKeys];
  dsa::detail::cpu::score_key_block_fma(b.inputs(), out);
  EXPECT_TRUE(matches_formula(b, out)) << "fma kernel";
  if (dsa::detail::cpu::bf16_dot_available()) {
    dsa::detail::cpu::score_key_block_bf16_dot(b.inputs(), out);
    EXPECT_TRUE(matches_formula(b, out)) << "bf16 dot kernel";
  }
}

// Heads in and past the kernels' groups (4 and 8), head dims from the
// smallest, padding lanes, a NaN key.
INSTANTIATE_TEST_SUITE_P(Shapes, ScoreBlockTest,
                         ::testing::Values(Shape{64, 128, kBlockKeys, -1}, Shape{1, 16, kBlockKeys, -1},
                                           Shape{7, 48, kBlockKeys, -1}, Shape{13, 256, 5, -1},
                                           Shape{32, 128, kBlockKeys - 1, 3}, Shape{9, 64, 1, 0}));

}  // namespace
}  // namespace dsa_test
