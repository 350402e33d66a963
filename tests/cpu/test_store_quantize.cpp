// store_index_keys and quantize_queries against the brute-force fp8 encoder,
// bit for bit; plus checks of the reference formats themselves.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

TEST(ReferenceFormats, E4m3DecodesKnownCodes) {
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(e4m3_decode(0xB8), -1.0f);
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_decode(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(e4m3_decode(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_decode(0x3A), 1.25f);
  EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_decode(0xFF)));
}

TEST(ReferenceFormats, E4m3EncodesNearestTiesToEvenAndSaturates) {
  EXPECT_EQ(e4m3_encode(1.0f), 0x38);
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);  // halfway 1 .. 1.125: even mantissa
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3A);  // halfway 1.125 .. 1.25: even mantissa
  EXPECT_EQ(e4m3_encode(1.07f), 0x39);
  EXPECT_EQ(e4m3_encode(464.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(1e9f), 0x7E);
  EXPECT_EQ(e4m3_encode(-1e9f), 0xFE);
  EXPECT_EQ(e4m3_encode(INFINITY), 0x7E);
  EXPECT_EQ(e4m3_encode(std::ldexp(1.0f, -10)), 0x00);      // halfway 0 .. 2^-9
  EXPECT_EQ(e4m3_encode(3 * std::ldexp(1.0f, -10)), 0x02);  // halfway 2^-9 .. 2^-8
  EXPECT_EQ(e4m3_encode(-0.0f), 0x80);
  EXPECT_EQ(e4m3_encode(NAN) & 0x7F, 0x7F);
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7F) == 0x7F) continue;
    EXPECT_EQ(e4m3_encode(e4m3_decode(static_cast<std::uint8_t>(code))), code);
  }
}

TEST(ReferenceFormats, Bf16RoundsToNearestEven) {
  EXPECT_EQ(bf16_encode(1.0f), 0x3F80);
  EXPECT_EQ(bf16_encode(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  EXPECT_EQ(bf16_encode(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(bf16_encode(-2.0f), 0xC000);
  EXPECT_EQ(bf16_encode(FLT_MAX), 0x7F80);
  EXPECT_EQ(bf16_encode(-INFINITY), 0xFF80);
  EXPECT_TRUE(std::isnan(bf16_decode(bf16_encode(NAN))));
}

TEST(ReferenceFormats, PowerOfTwoScalesRoundUp) {
  EXPECT_EQ(quantization_scale(448.0f, true), 1.0f);
  EXPECT_EQ(quantization_scale(449.0f, true), 2.0f);
  EXPECT_EQ(quantization_scale(0.0f, false), 1e-4f / 448.0f);
  EXPECT_EQ(quantization_scale(100.0f, false), 100.0f / 448.0f);
}

// ---- store_index_keys -------------------------------------------------------

struct StoreCase {
  int head_dim;
  bool bf16_keys;
  bool int64_slots;
  bool power_of_two;
  bool view_4d;
  std::int64_t page_padding;
  int page_tokens = 64;
};

void PrintTo(const StoreCase& c, std::ostream* os) {
  *os << "D " << c.head_dim << (c.bf16_keys ? " bf16" : " fp32") << (c.view_4d ? " 4-D" : " 2-D") << " P "
      << c.page_tokens;
}

class StoreKeysTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, StoreCase>> {};
class StoreKeysEncodingTest : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(StoreKeysTest, WritesExactlyTheReferenceBytes) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  Rng rng(static_cast<std::uint64_t>(c.head_dim + 7 * c.bf16_keys + 13 * c.power_of_two + c.page_padding));
  // 384 slots whatever the page size.
  CacheGeometry geometry{c.head_dim, 384 / c.page_tokens, c.page_tokens * (c.head_dim + 4) + c.page_padding,
                         c.page_tokens};
  const std::int64_t slots_total = geometry.num_slots();

  // Tokens: random keys, an all-zero key, a key with one huge value and tiny
  // others (fp8 subnormals), a key of exact powers of two.
  const int num_tokens = 220;
  std::vector<float> keys(static_cast<std::size_t>(num_tokens) * c.head_dim);
  for (int t = 0; t < num_tokens; ++t) random_vector(rng, keys.data() + t * c.head_dim, c.head_dim);
  std::fill(keys.begin(), keys.begin() + c.head_dim, 0.0f);
  for (int d = 0; d < c.head_dim; ++d) {
    keys[c.head_dim + d] = d == 3 ? 3e4f : 1e-3f * static_cast<float>(d);
    keys[2 * c.head_dim + d] = std::ldexp(d % 2 ? -1.0f : 1.0f, d % 20 - 10);
  }
  std::vector<std::uint16_t> keys_bf16(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys_bf16[i] = bf16_encode(keys[i]);
    if (c.bf16_keys) keys[i] = bf16_decode(keys_bf16[i]);
  }

  // Slots: distinct ones, then padding (negative) and repeats of earlier slots.
  std::vector<std::int64_t> permutation(static_cast<std::size_t>(slots_total));
  for (std::int64_t s = 0; s < slots_total; ++s) permutation[s] = s;
  std::shuffle(permutation.begin(), permutation.end(), rng);
  std::vector<std::int64_t> slots;
  for (int t = 0; t < num_tokens; ++t) {
    if (t % 11 == 5) slots.push_back(t % 2 ? -1 : -1000);
    else if (t > 150) slots.push_back(slots[static_cast<std::size_t>(t - 100)] < 0 ? permutation[t] : slots[t - 100]);
    else slots.push_back(permutation[t]);
  }
  std::vector<std::int32_t> slots32(slots.begin(), slots.end());

  std::vector<std::uint8_t> cache(static_cast<std::size_t>(geometry.bytes()));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : cache) b = static_cast<std::uint8_t>(byte(rng));
  std::vector<std::uint8_t> expected = cache;
  for (int t = 0; t < num_tokens; ++t)
    if (slots[t] >= 0) store_token(keys.data() + t * c.head_dim, slots[t], geometry, c.power_of_two, expected.data());

  const dsa::TensorView keys_view =
      c.bf16_keys ? dsa::make_view(keys_bf16.data(), dsa::DType::bfloat16, {num_tokens, c.head_dim})
                  : dsa::make_view(keys.data(), dsa::DType::float32, {num_tokens, c.head_dim});
  const dsa::TensorView slots_view = c.int64_slots ? dsa::make_view(slots.data(), dsa::DType::int64, {num_tokens})
                                                   : dsa::make_view(slots32.data(), dsa::DType::int32, {num_tokens});
  const std::int64_t width = c.head_dim + 4;
  const dsa::TensorView cache_view =
      c.view_4d ? dsa::make_view(cache.data(), dsa::DType::uint8, {geometry.num_pages, c.page_tokens, 1, width},
                                 {geometry.page_stride, width, width, 1})
                : dsa::make_view(cache.data(), dsa::DType::uint8, {geometry.num_pages, c.page_tokens * width},
                                 {geometry.page_stride, 1});
  dsa::StoreKeysOptions options;
  options.power_of_two_scales = c.power_of_two;
  options.page_size = c.view_4d ? 0 : c.page_tokens;  // a 2-D view does not tell it
  DSA_ASSERT_OK(dsa::store_index_keys(keys_view, slots_view, cache_view, options, ctx));
  std::int64_t mismatches = 0, first = -1;
  for (std::size_t i = 0; i < cache.size(); ++i) {
    if (cache[i] != expected[i] && mismatches++ == 0) first = static_cast<std::int64_t>(i);
  }
  EXPECT_EQ(mismatches, 0) << "first differing byte " << first << " (page " << first / geometry.page_stride
                           << ", offset " << first % geometry.page_stride << "): got "
                           << int{cache[static_cast<std::size_t>(std::max<std::int64_t>(first, 0))]} << " want "
                           << int{expected[static_cast<std::size_t>(std::max<std::int64_t>(first, 0))]};
}

// Keys whose largest magnitude is 448 are stored with scale 1, so their
// bytes are the encoding of the values themselves: a sweep of float bit
// patterns below 448, every midpoint between neighbouring codes with the
// floats on either side of it, and rows holding NaN, infinity and values
// past 448.
TEST_P(StoreKeysEncodingTest, EncodesEveryRangeAsTheReference) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  constexpr int kHeadDim = 256;
  std::vector<float> values;
  for (std::uint32_t bits = 0; bits < 0x43E00000u; bits += 997) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    values.push_back(values.size() % 2 ? -x : x);
  }
  for (int code = 0; code < 0x7E; ++code) {
    const float midpoint = (e4m3_decode(static_cast<std::uint8_t>(code)) +
                            e4m3_decode(static_cast<std::uint8_t>(code + 1))) / 2.0f;
    for (const float x : {std::nextafter(midpoint, 0.0f), midpoint, std::nextafter(midpoint, 448.0f)}) {
      values.push_back(x);
      values.push_back(-x);
    }
  }
  const int rows_of_values = static_cast<int>((values.size() + kHeadDim - 2) / (kHeadDim - 1));
  std::vector<float> keys(static_cast<std::size_t>(rows_of_values + 2) * kHeadDim, 0.0f);
  for (int row = 0; row < rows_of_values; ++row) {
    keys[static_cast<std::size_t>(row) * kHeadDim] = row % 2 ? -448.0f : 448.0f;
    for (int d = 1; d < kHeadDim; ++d) {
      const std::size_t v = static_cast<std::size_t>(row) * (kHeadDim - 1) + static_cast<std::size_t>(d - 1);
      if (v < values.size()) keys[static_cast<std::size_t>(row) * kHeadDim + d] = values[v];
    }
  }
  float* special = keys.data() + static_cast<std::size_t>(rows_of_values) * kHeadDim;
  const float specials[] = {448.0f, NAN, -NAN, 447.99f, 464.0f, -1e30f, 1.0f, FLT_TRUE_MIN, -FLT_MIN};
  std::copy(std::begin(specials), std::end(specials), special);  // amax 1e30 (NaN skipped)
  const float with_infinity[] = {1.0f, -INFINITY, NAN, 2.0f};
  std::copy(std::begin(with_infinity), std::end(with_infinity), special + kHeadDim);  // scale infinity

  const int num_tokens = rows_of_values + 2;
  CacheGeometry geometry{kHeadDim, (num_tokens + 63) / 64, 64 * (kHeadDim + 4)};
  std::vector<std::int32_t> slots(static_cast<std::size_t>(num_tokens));
  for (int t = 0; t < num_tokens; ++t) slots[static_cast<std::size_t>(t)] = t;
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(geometry.bytes()), 0);
  std::vector<std::uint8_t> expected = cache;
  for (int t = 0; t < num_tokens; ++t) store_token(keys.data() + t * kHeadDim, t, geometry, false, expected.data());
  DSA_ASSERT_OK(dsa::store_index_keys(
      dsa::make_view(keys.data(), dsa::DType::float32, {num_tokens, kHeadDim}),
      dsa::make_view(slots.data(), dsa::DType::int32, {num_tokens}),
      dsa::make_view(cache.data(), dsa::DType::uint8, {geometry.num_pages, geometry.page_stride}), {}, ctx));
  for (int t = 0; t < num_tokens; ++t) {
    for (int d = 0; d < kHeadDim; ++d) {
      const std::size_t byte = static_cast<std::size_t>(geometry.key_byte(t) + d);
      ASSERT_EQ(int{cache[byte]}, int{expected[byte]})
          << "token " << t << " value " << keys[static_cast<std::size_t>(t) * kHeadDim + d];
    }
    ASSERT_EQ(0, std::memcmp(cache.data() + geometry.scale_byte(t), expected.data() + geometry.scale_byte(t), 4))
        << "scale of token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreKeysEncodingTest, ::testing::ValuesIn(cpu_backends()), backend_label);

std::vector<StoreCase> store_cases() {
  std::vector<StoreCase> cases;
  for (const bool bf16 : {false, true})
    for (const bool int64_slots : {false, true})
      for (const bool pow2 : {false, true}) cases.push_back({128, bf16, int64_slots, pow2, false, 0});
  cases.push_back({128, false, false, false, true, 0});
  cases.push_back({128, true, true, true, true, 32});
  cases.push_back({128, false, true, false, false, 48});
  cases.push_back({64, true, false, false, false, 0});
  cases.push_back({256, false, false, true, true, 16});
  cases.push_back({16, false, false, false, false, 0});
  // 32-token pages, through either view.
  cases.push_back({128, false, false, false, false, 0, 32});
  cases.push_back({128, true, true, true, false, 48, 32});
  cases.push_back({128, true, false, false, true, 0, 32});
  cases.push_back({64, false, true, true, true, 16, 32});
  cases.push_back({256, true, false, false, false, 0, 32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, StoreKeysTest, ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(store_cases())),
    [](const ::testing::TestParamInfo<StoreKeysTest::ParamType>& info) {
      const StoreCase& c = std::get<1>(info.param);
      return "d" + std::to_string(c.head_dim) + (c.bf16_keys ? "_bf16" : "_fp32") + (c.int64_slots ? "_i64" : "_i32") +
             (c.power_of_two ? "_pow2" : "") + (c.view_4d ? "_4d" : "_2d") + "_pad" + std::to_string(c.page_padding) +
             "_p" + std::to_string(c.page_tokens) + "_" + backend_label({std::get<0>(info.param), info.index});
    });

// ---- quantize_queries -------------------------------------------------------

struct QuantizeCase {
  bool bf16_q;
  bool bf16_gate;
  bool power_of_two;
  float weight_scale;
  std::int64_t pad;  // extra elements after every head vector of q and q_fp8
  int heads;
};

void PrintTo(const QuantizeCase& c, std::ostream* os) {
  *os << (c.bf16_q ? "q bf16" : "q fp32") << " heads " << c.heads << " pad " << c.pad;
}

class QuantizeQueriesTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, QuantizeCase>> {};

TEST_P(QuantizeQueriesTest, MatchesReference) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  constexpr std::int64_t kBatch = 3, kNextN = 2, kDim = 128;
  const std::int64_t rows = kBatch * kNextN, heads = c.heads, stride = kDim + c.pad;
  Rng rng(static_cast<std::uint64_t>(heads + c.pad + 2 * c.bf16_q + 4 * c.bf16_gate));

  std::vector<float> q(static_cast<std::size_t>(rows * heads * kDim));
  for (std::int64_t i = 0; i < rows * heads; ++i) random_vector(rng, q.data() + i * kDim, kDim);
  std::fill(q.begin(), q.begin() + kDim, 0.0f);  // an all-zero head: amax clamps to 1e-4
  std::vector<float> gate(static_cast<std::size_t>(rows * heads));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& g : gate) g = normal(rng);
  if (c.bf16_q)
    for (auto& v : q) v = bf16_round(v);
  if (c.bf16_gate)
    for (auto& g : gate) g = bf16_round(g);

  // Library inputs, with `pad` elements after every head vector.
  std::vector<float> q_f32(static_cast<std::size_t>(rows * heads * stride), NAN);
  std::vector<std::uint16_t> q_b16(q_f32.size(), bf16_encode(NAN));
  for (std::int64_t i = 0; i < rows * heads; ++i) {
    for (std::int64_t d = 0; d < kDim; ++d) {
      q_f32[i * stride + d] = q[i * kDim + d];
      q_b16[i * stride + d] = bf16_encode(q[i * kDim + d]);
    }
  }
  std::vector<float> gate_f32 = gate;
  std::vector<std::uint16_t> gate_b16;
  for (const float g : gate) gate_b16.push_back(bf16_encode(g));
  std::initializer_list<std::int64_t> q_strides{kNextN * heads * stride, heads * stride, stride, 1};
  const dsa::TensorView q_view =
      c.bf16_q ? dsa::make_view(q_b16.data(), dsa::DType::bfloat16, {kBatch, kNextN, heads, kDim}, q_strides)
               : dsa::make_view(q_f32.data(), dsa::DType::float32, {kBatch, kNextN, heads, kDim}, q_strides);
  const dsa::TensorView gate_view = c.bf16_gate ? dsa::make_view(gate_b16.data(), dsa::DType::bfloat16, {rows, heads})
                                                : dsa::make_view(gate_f32.data(), dsa::DType::float32, {rows, heads});
  std::vector<std::uint8_t> q_fp8(static_cast<std::size_t>(rows * heads * stride), 0xAB);
  std::vector<float> weights(static_cast<std::size_t>(rows * heads), NAN);
  const dsa::TensorView q_fp8_view =
      dsa::make_view(q_fp8.data(), dsa::DType::float8_e4m3, {kBatch, kNextN, heads, kDim}, q_strides);

  dsa::QuantizeQueriesOptions options;
  options.power_of_two_scales = c.power_of_two;
  options.weight_scale = c.weight_scale;
  DSA_ASSERT_OK(dsa::quantize_queries(q_view, gate_view, q_fp8_view, view_of(weights, {rows, heads}), options, ctx));

  const float weight_scale = c.weight_scale == 0.0f ? default_weight_scale(c.heads, kDim) : c.weight_scale;
  std::vector<std::uint8_t> want_fp8(static_cast<std::size_t>(rows * heads * kDim));
  std::vector<float> want_weights(weights.size());
  quantize_queries(q.data(), gate.data(), rows, c.heads, kDim, c.power_of_two, weight_scale, want_fp8.data(),
                   want_weights.data());
  int reported = 0;
  for (std::int64_t i = 0; i < rows * heads; ++i) {
    for (std::int64_t d = 0; d < stride; ++d) {
      const std::uint8_t want = d < kDim ? want_fp8[i * kDim + d] : 0xAB;
      if (q_fp8[i * stride + d] != want && reported++ < 5)
        ADD_FAILURE() << "q_fp8 head " << i << " element " << d << ": got " << int{q_fp8[i * stride + d]}
                      << " want " << int{want};
    }
    EXPECT_NEAR(weights[i], want_weights[i], 3e-7 * std::fabs(want_weights[i])) << "weight " << i;
  }
}

std::vector<QuantizeCase> quantize_cases() {
  return {
      {false, false, false, 0.0f, 0, 64}, {true, false, false, 0.0f, 0, 64}, {false, true, true, 0.0f, 0, 32},
      {true, true, true, 0.37f, 0, 64},   {false, false, false, 1.0f, 16, 32}, {true, false, true, 0.0f, 32, 8},
  };
}

INSTANTIATE_TEST_SUITE_P(
    Cases, QuantizeQueriesTest,
    ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(quantize_cases())),
    [](const ::testing::TestParamInfo<QuantizeQueriesTest::ParamType>& info) {
      const QuantizeCase& c = std::get<1>(info.param);
      return std::string(c.bf16_q ? "q_bf16" : "q_fp32") + (c.bf16_gate ? "_gate_bf16" : "_gate_fp32") +
             (c.power_of_two ? "_pow2" : "") + "_ws" + std::to_string(static_cast<int>(c.weight_scale * 100)) +
             "_pad" + std::to_string(c.pad) + "_h" + std::to_string(c.heads) + "_" +
             backend_label({std::get<0>(info.param), info.index});
    });

}  // namespace
}  // namespace dsa_test
