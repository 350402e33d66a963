// The fp4 key and query formats on the CPU backends: the shared number
// formats, store_index_keys and quantize_queries_fp4 bit for bit against the
// independent quantizer of common/fp4_reference.hpp, paged_mqa_logits with
// fp4 keys (fp8 or fp4 queries) and fp4 queries against the float64
// reference, the same for requests of uneven row counts (request_offsets),
// index_topk on fp4 caches, and the validation of fp4 arguments.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/fp4_reference.hpp"
#include "common/number_formats.hpp"
#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

constexpr float kSentinel = 8192.0f;
constexpr int kD = 128;

// ---- Number formats -----------------------------------------------------------

TEST(Fp4Formats, E2m1DecodesEveryCode) {
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(dsa::detail::e2m1_to_float(static_cast<std::uint8_t>(code)), e2m1_value(static_cast<std::uint8_t>(code)))
        << "code " << code;
  }
}

TEST(Fp4Formats, E2m1EncodesNearestTiesToSmallerNoNegativeZero) {
  std::vector<float> values{0.0f, -0.0f, 0.1f, -0.1f, 0.25f, -0.25f, 0.2500001f, 0.5f, 0.75f, -0.75f, 0.7500001f,
                            1.0f, 1.25f, 1.25001f, 1.5f, 1.75f, -1.75f, 2.0f, 2.5f, 2.50001f, 3.0f, 3.5f, -3.5f,
                            4.0f, 5.0f, -5.0f, 5.0001f, 6.0f, -6.0f, 7.0f, -100.0f, 1e30f, 1e-30f, -1e-30f};
  for (int i = 0; i <= 1400; ++i) values.push_back(-7.0f + 0.01f * static_cast<float>(i));
  for (float x : values) {
    EXPECT_EQ(dsa::detail::float_to_e2m1(x), e2m1_nearest(x)) << "x = " << x;
  }
  EXPECT_EQ(dsa::detail::float_to_e2m1(0.25f), 0);
  EXPECT_EQ(dsa::detail::float_to_e2m1(-0.25f), 0);   // rounds to zero: code 0, not 8
  EXPECT_EQ(dsa::detail::float_to_e2m1(0.75f), 1);    // tie 0.5 / 1: the smaller
  EXPECT_EQ(dsa::detail::float_to_e2m1(-5.0f), 0xE);  // tie 4 / 6: -4
  EXPECT_EQ(dsa::detail::float_to_e2m1(100.0f), 7);   // saturates at 6
  EXPECT_EQ(dsa::detail::float_to_e2m1(NAN), 0);
}

// An e5m2 byte's value, decoded here from the format's definition: sign,
// 5 exponent bits (bias 15), 2 mantissa bits, subnormals in steps of 2^-16.
double e5m2_value(std::uint8_t byte) {
  const int exponent = (byte >> 2) & 0x1F;
  const int mantissa = byte & 0x3;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -16) : std::ldexp(1.0 + mantissa / 4.0, exponent - 15);
  return (byte & 0x80) ? -magnitude : magnitude;
}

TEST(Fp4Formats, E2m1ToE5m2IsExactForEveryShiftAndPosition) {
  const double magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (int shift = dsa::detail::kE5m2ExactShiftMin; shift <= 0; ++shift) {
    const dsa::detail::E5m2Table table = dsa::detail::e5m2_table(shift);
    for (int position = 0; position < 8; ++position) {
      for (std::uint32_t code = 0; code < 16; ++code) {
        // The other nibbles hold other codes, so positions cannot leak into each other.
        std::uint32_t codes = 0;
        for (int i = 0; i < 8; ++i) codes |= ((code + 5u * static_cast<std::uint32_t>(i)) & 0xFu) << (4 * i);
        codes = (codes & ~(0xFu << (4 * position))) | (code << (4 * position));
        std::uint32_t out[2];
        dsa::detail::e2m1x8_to_e5m2(codes, table, out);
        for (int i = 0; i < 8; ++i) {
          const std::uint32_t c = (codes >> (4 * i)) & 0xFu;
          const double want = ((c & 0x8u) ? -1.0 : 1.0) * std::ldexp(magnitudes[c & 0x7u], shift);
          const auto byte = static_cast<std::uint8_t>(out[i / 4] >> (8 * (i % 4)));
          ASSERT_EQ(e5m2_value(byte), want) << "shift " << shift << " code " << c << " at " << i;
          ASSERT_EQ(byte & 0x80u, (c & 0x8u) << 4) << "sign of code " << c;
        }
      }
    }
  }
}

// The bf16 values the CPU backend packs fp4 keys with: every code at every
// block exponent but 255 (a scale of infinity), against the value in double.
TEST(Fp4Formats, E2m1Bf16TableIsExactForEveryExponent) {
  const double magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  for (int exponent = 0; exponent < 255; ++exponent) {
    std::uint16_t table[16];
    dsa::detail::e2m1_bf16_table(static_cast<std::uint8_t>(exponent), table);
    for (int code = 0; code < 16; ++code) {
      const double magnitude = std::ldexp(magnitudes[code & 0x7], exponent - 127);
      const auto value = static_cast<float>((code & 0x8) ? -magnitude : magnitude);
      std::uint32_t bits = 0;
      std::memcpy(&bits, &value, sizeof bits);
      ASSERT_EQ(bits & 0xFFFFu, 0u) << "a bf16 value";
      ASSERT_EQ(table[code], bits >> 16) << "exponent " << exponent << " code " << code;
    }
  }
}

// The rule the Hopper kernels turn fp4 rows by (keys and queries): every code
// of a row it accepts, as e5m2 of code * 2^(exponent - top) times the float
// scale 2^(top - 127), is the exact value; a row it turns down for its span
// has a code e5m2 cannot hold (0.5 * 2^(bottom - top) below e5m2's least
// subnormal, 2^-16).
TEST(Fp4Formats, E5m2HoldsExactlyTheRowsTheRuleAccepts) {
  const double magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  std::mt19937 rng(5);
  int accepted = 0, spans = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    const int base = static_cast<int>(rng() % 256);
    std::uint32_t word = 0;
    for (int b = 0; b < 4; ++b) {
      const int exponent = std::clamp(base + static_cast<int>(rng() % 37) - 18, 0, 255);
      word |= static_cast<std::uint32_t>(exponent) << (8 * b);
    }
    const unsigned used = rng() % 16;
    const dsa::detail::Fp4RowExponents e = dsa::detail::fp4_row_exponents(word, used);
    if (!dsa::detail::e5m2_holds_fp4_row(e, used)) {
      if (e.bottom >= 1 && e.top <= 254) {
        ++spans;
        ASSERT_LT(std::ldexp(0.5, e.bottom - e.top), std::ldexp(1.0, -16)) << "word " << word << " used " << used;
      }
      continue;
    }
    ++accepted;
    for (int b = 0; b < 4; ++b) {
      if ((used >> b & 1u) == 0) continue;
      const int exponent = static_cast<int>((word >> (8 * b)) & 0xFFu);
      const dsa::detail::E5m2Table table = dsa::detail::e5m2_table(exponent - e.top);
      for (std::uint32_t code = 0; code < 16; ++code) {
        std::uint32_t out[2];
        dsa::detail::e2m1x8_to_e5m2(code, table, out);
        const double want = ((code & 0x8u) ? -1.0 : 1.0) * std::ldexp(magnitudes[code & 0x7u], exponent - 127);
        const double got = e5m2_value(static_cast<std::uint8_t>(out[0] & 0xFFu)) * std::ldexp(1.0, e.top - 127);
        ASSERT_EQ(got, want) << "word " << word << " used " << used << " block " << b << " code " << code;
      }
    }
  }
  EXPECT_GT(accepted, 1000);
  EXPECT_GT(spans, 1000);
}

TEST(Fp4Formats, BlockScaleRoundsUpToPowersOfTwo) {
  std::vector<float> amaxes{0.0f, 1e-30f, 1e-4f, 2e-4f, 0.5f, 6.0f, std::nextafter(6.0f, 7.0f), 7.0f, 12.0f,
                            3.0f, 448.0f, 1e20f, 1e38f, FLT_MAX};
  for (int e = -20; e <= 20; ++e) {
    const float exact = 6.0f * std::ldexp(1.0f, e);
    amaxes.insert(amaxes.end(), {exact, std::nextafter(exact, 0.0f), std::nextafter(exact, INFINITY)});
  }
  for (float amax : amaxes) {
    EXPECT_EQ(dsa::detail::fp4_block_scale(amax), ue8m0_for_amax(amax)) << "amax = " << amax;
  }
  EXPECT_EQ(dsa::detail::fp4_block_scale(6.0f), 127);
  EXPECT_EQ(dsa::detail::fp4_block_scale(FLT_MAX), 253);
  EXPECT_EQ(dsa::detail::ue8m0_to_float(127), 1.0f);
  EXPECT_EQ(dsa::detail::ue8m0_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(dsa::detail::ue8m0_to_float(254), std::ldexp(1.0f, 127));
}

// ---- store_index_keys ----------------------------------------------------------

// Token keys that reach every rule: a zero block, ties between codes, values
// rounding to zero from below, a tiny amax (clamped at 1e-4), huge and
// extreme blocks, NaN left out of amax; then random keys.
std::vector<float> fp4_test_keys(std::int64_t tokens, std::uint64_t seed) {
  std::vector<float> keys(static_cast<std::size_t>(tokens * kD));
  Rng rng(seed);
  for (std::int64_t t = 0; t < tokens; ++t) random_vector(rng, keys.data() + t * kD, kD);
  auto block = [&](std::int64_t token, int b) { return keys.data() + token * kD + b * 32; };
  const std::vector<float> ties{6.0f, 0.25f, -0.25f, 0.75f, -0.75f, 1.25f, -1.25f, 1.75f, 2.5f, -2.5f, 3.5f, 5.0f,
                                -5.0f, -6.0f, -0.1f, 0.1f, -0.0f, 0.2f, -0.3f, 4.5f, 5.5f, -5.5f};
  std::fill(block(0, 0), block(0, 0) + 32, 0.0f);
  std::copy(ties.begin(), ties.end(), block(0, 1));
  std::fill(block(0, 1) + ties.size(), block(0, 1) + 32, 0.0f);
  for (int i = 0; i < 32; ++i) block(0, 2)[i] = (i % 2 ? -1.0f : 1.0f) * 1e-6f * static_cast<float>(i);
  for (int i = 0; i < 32; ++i) block(0, 3)[i] = (i % 3 ? -1.0f : 1.0f) * 1e37f * static_cast<float>(i % 5);
  if (tokens > 1) {
    std::fill(block(1, 0), block(1, 0) + 32, 3e38f);  // near the largest finite float (and bfloat16)
    block(1, 0)[3] = -3e38f;
    for (int i = 0; i < 32; ++i) block(1, 1)[i] = 7.0f * static_cast<float>(i) / 31.0f;  // amax 7: scale 2
    block(1, 2)[5] = NAN;
    std::fill(block(1, 3), block(1, 3) + 32, -3e-5f);  // clamped amax: all round to zero
  }
  return keys;
}

struct Fp4StoreCase {
  int page_tokens;
  bool bf16_keys;
  bool view_4d;
  bool explicit_format;
};

class Fp4Store : public ::testing::TestWithParam<std::tuple<dsa::Backend, Fp4StoreCase>> {};

TEST_P(Fp4Store, MatchesTheIndependentQuantizerBitForBit) {
  const auto [backend, c] = GetParam();
  const std::int64_t tokens = 150, num_pages = 7;
  std::vector<float> keys = fp4_test_keys(tokens, 11 + c.page_tokens);
  std::vector<std::uint16_t> keys_bf16(keys.size());
  if (c.bf16_keys) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      keys_bf16[i] = bf16_encode(keys[i]);
      keys[i] = bf16_decode(keys_bf16[i]);  // what the library reads
    }
  }
  // Slots: a permutation across the pages, some padding (-1).
  std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    slots[static_cast<std::size_t>(t)] = t % 17 == 5 ? -1 : (t * 37) % (num_pages * c.page_tokens);
  }
  Fp4Cache want;
  want.geometry = Fp4CacheGeometry{num_pages, std::int64_t{c.page_tokens} * 68 + 16, c.page_tokens};
  want.bytes.assign(static_cast<std::size_t>(num_pages * want.geometry.page_stride), 0x5A);
  Fp4Cache got;
  got.geometry = want.geometry;
  got.bytes = want.bytes;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t slot = slots[static_cast<std::size_t>(t)];
    if (slot < 0) continue;
    const std::uint32_t word = fp4_quantize(keys.data() + t * kD, kD, want.bytes.data() + want.geometry.code_byte(slot));
    std::memcpy(want.bytes.data() + want.geometry.word_byte(slot), &word, sizeof word);
  }
  dsa::StoreKeysOptions options;
  options.page_size = c.view_4d ? 0 : c.page_tokens;
  options.key_format = c.explicit_format ? dsa::KeyFormat::fp4_e2m1 : dsa::KeyFormat::automatic;
  const dsa::TensorView key_view = c.bf16_keys ? dsa::make_view(keys_bf16.data(), dsa::DType::bfloat16, {tokens, kD})
                                               : dsa::make_view(keys.data(), dsa::DType::float32, {tokens, kD});
  const dsa::TensorView cache = c.view_4d ? got.view_4d() : got.view_2d();
  DSA_ASSERT_OK(dsa::store_index_keys(key_view, dsa::make_view(slots.data(), dsa::DType::int64, {tokens}), cache,
                                      options, cpu_context(backend)));
  std::int64_t mismatches = 0;
  for (std::size_t i = 0; i < got.bytes.size(); ++i) {
    if (got.bytes[i] != want.bytes[i] && ++mismatches <= 5) {
      ADD_FAILURE() << "byte " << i << " (page " << i / want.geometry.page_stride << ", offset "
                    << i % want.geometry.page_stride << "): got " << int{got.bytes[i]} << ", want "
                    << int{want.bytes[i]};
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, Fp4Store,
    ::testing::Combine(::testing::ValuesIn(cpu_backends()),
                       ::testing::Values(Fp4StoreCase{64, false, false, true}, Fp4StoreCase{32, false, false, true},
                                         Fp4StoreCase{64, true, true, false}, Fp4StoreCase{32, false, true, true},
                                         Fp4StoreCase{32, true, true, false})));

// ---- paged_mqa_logits and index_topk -------------------------------------------

struct Fp4LogitsCase {
  std::string name;
  WorkloadSpec spec;
  bool fp4_keys = true;
  bool fp4_queries = false;
  bool view_4d = false;
  std::int64_t page_padding = 0;
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
};

std::vector<Fp4LogitsCase> fp4_logits_cases() {
  std::vector<Fp4LogitsCase> cases;
  auto add = [&](std::string name, WorkloadSpec spec) -> Fp4LogitsCase& {
    spec.seed = cases.size() + 301;
    cases.push_back(Fp4LogitsCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  add("decode", WorkloadSpec{.batch = 3, .next_n = 1});
  add("causal_next_n3", WorkloadSpec{.batch = 2, .next_n = 3, .max_prefix = 500});
  add("per_token_next_n2", WorkloadSpec{.batch = 2, .next_n = 2}).path = dsa::LogitsPath::per_token;
  add("view_4d_padded", WorkloadSpec{.batch = 2, .next_n = 2}).view_4d = true;
  cases.back().page_padding = 32;
  add("edge_lengths", WorkloadSpec{.batch = 6, .next_n = 1, .context_lens = {0, 1, 31, 32, 65, 300}});
  add("heads_5", WorkloadSpec{.batch = 2, .next_n = 2, .heads = 5});
  add("fp4_queries_fp4_keys", WorkloadSpec{.batch = 3, .next_n = 2}).fp4_queries = true;
  add("fp4_queries_fp4_keys_4d", WorkloadSpec{.batch = 2, .next_n = 1}).fp4_queries = true;
  cases.back().view_4d = true;
  add("fp4_queries_fp8_keys", WorkloadSpec{.batch = 2, .next_n = 3}).fp4_queries = true;
  cases.back().fp4_keys = false;
  repeat_on_32_token_pages(cases);
  return cases;
}

// One case's inputs: the workload (fp8 cache and queries), its fp4 cache and fp4 queries.
struct Fp4Setup {
  Workload w;
  Fp4Cache cache;
  Fp4Queries queries;
  Schedule schedule;

  dsa::TensorView q() { return c.fp4_queries ? queries.codes_view(w) : w.q_fp8_view(); }
  dsa::TensorView weights() { return c.fp4_queries ? queries.weights_view(w) : w.weights_view(); }
  dsa::TensorView q_block_scales() { return c.fp4_queries ? queries.scales_view(w) : dsa::TensorView{}; }
  dsa::TensorView key_cache() {
    if (!c.fp4_keys) return c.view_4d ? w.cache_view_4d() : w.cache_view_2d();
    return c.view_4d ? cache.view_4d() : cache.view_2d();
  }
  // The options a 2-D view needs: its page size and format.
  int page_size() const { return c.view_4d ? 0 : w.geometry.page_tokens; }
  dsa::KeyFormat key_format() const {
    if (c.view_4d) return dsa::KeyFormat::automatic;
    return c.fp4_keys ? dsa::KeyFormat::fp4_e2m1 : dsa::KeyFormat::fp8_e4m3;
  }
  ReferenceLogits reference() const {
    if (!c.fp4_keys) return fp4_reference_logits_fp8_keys();
    return fp4_reference_logits(w, cache, c.fp4_queries ? &queries : nullptr);
  }
  // fp4 queries against the workload's fp8 cache, in float64.
  ReferenceLogits fp4_reference_logits_fp8_keys() const;

  Fp4LogitsCase c;
};

ReferenceLogits Fp4Setup::fp4_reference_logits_fp8_keys() const {
  ReferenceLogits ref;
  ref.rows = w.rows();
  ref.cols = w.max_context_len;
  ref.value.assign(static_cast<std::size_t>(ref.rows * ref.cols), std::nan(""));
  ref.magnitude.assign(ref.value.size(), 0.0);
  for (std::int64_t r = 0; r < ref.rows; ++r) {
    const std::int32_t* table_row = w.block_table.data() + (r / w.next_n) * w.max_blocks;
    for (std::int64_t p = 0; p < w.context_lens[static_cast<std::size_t>(r)]; ++p) {
      const std::int64_t slot = w.geometry.position_slot(table_row, p);
      double logit = 0.0, magnitude = 0.0;
      for (std::int64_t h = 0; h < w.heads; ++h) {
        const std::int64_t v = r * w.heads + h;
        double dot = 0.0, dot_magnitude = 0.0;
        for (int d = 0; d < kD; ++d) {
          const double term = fp4_value(queries.codes.data() + v * 64,
                                        static_cast<std::uint32_t>(queries.scales[static_cast<std::size_t>(v)]), d) *
                              cached_key(w.cache.data(), w.geometry, slot, d) *
                              cached_scale(w.cache.data(), w.geometry, slot);
          dot += term;
          dot_magnitude += std::fabs(term);
        }
        const double weight = queries.weights[static_cast<std::size_t>(v)];
        logit += weight * std::fmax(dot, 0.0);
        magnitude += std::fabs(weight) * dot_magnitude;
      }
      ref.value[static_cast<std::size_t>(r * ref.cols + p)] = logit;
      ref.magnitude[static_cast<std::size_t>(r * ref.cols + p)] = magnitude;
    }
  }
  return ref;
}

std::unique_ptr<Fp4Setup> make_setup(const Fp4LogitsCase& c, const dsa::ExecContext& ctx) {
  auto s = std::make_unique<Fp4Setup>();
  s->c = c;
  s->w = make_workload(c.spec);
  s->cache = fp4_cache_of(s->w, c.page_padding);
  s->queries = fp4_queries_of(s->w);
  const dsa::Status planned =
      plan(s->w.context_lens, s->w.batch, s->w.next_n, dsa::default_num_workers(dsa::Device{}, ctx),
           resolved_path(c.path, s->w.next_n, s->w.heads, ctx), ctx, &s->schedule);
  EXPECT_TRUE(planned.ok()) << planned.to_string();
  return s;
}

dsa::Status run_logits(Fp4Setup& s, const dsa::ExecContext& ctx, OwnedView* logits) {
  *logits = float_matrix(s.w.rows(), s.w.max_context_len, s.w.max_context_len + 3, kSentinel);
  dsa::LogitsOptions options;
  options.clean_logits = true;
  options.path = s.c.path;
  options.page_size = s.page_size();
  options.key_format = s.key_format();
  options.q_block_scales = s.q_block_scales();
  return dsa::paged_mqa_logits(s.q(), s.key_cache(), s.weights(), s.w.context_lens_view(), s.w.block_table_view(),
                               s.schedule.view(), s.w.max_context_len, logits->view, options, ctx);
}

class Fp4Logits : public ::testing::TestWithParam<std::tuple<dsa::Backend, Fp4LogitsCase>> {};

TEST_P(Fp4Logits, MatchesTheFloat64Reference) {
  const auto& [backend, c] = GetParam();
  for (const bool float64 : {false, true}) {
    if (float64 && backend != dsa::Backend::cpu_reference) continue;
    const dsa::ExecContext ctx = cpu_context(backend, 2, float64);
    auto s = make_setup(c, ctx);
    OwnedView logits;
    DSA_ASSERT_OK(run_logits(*s, ctx, &logits));
    EXPECT_TRUE(logits_match(s->w, s->reference(), logits, float64 ? Precision::float64 : Precision::float32, true,
                             kSentinel));
  }
}

TEST_P(Fp4Logits, IndexTopkEqualsTopkOfTheLogits) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  auto s = make_setup(c, ctx);
  OwnedView logits;
  DSA_ASSERT_OK(run_logits(*s, ctx, &logits));
  for (const bool physical : {false, true}) {
    const int k = 40;
    dsa::TopkOptions topk_options;
    topk_options.sorted = true;
    if (physical) {
      topk_options.block_table = s->w.block_table_view();
      topk_options.rows_per_request = s->w.next_n;
      topk_options.page_size = s->w.geometry.page_tokens;
    }
    OwnedView want = int32_matrix(s->w.rows(), k, k, -77);
    DSA_ASSERT_OK(dsa::topk(logits.view, s->w.causal_lens_view(), k, want.view, topk_options, ctx));
    for (const auto strategy : {dsa::IndexTopkStrategy::fused, dsa::IndexTopkStrategy::logits_then_topk}) {
      dsa::IndexTopkOptions options;
      options.k = k;
      options.sorted = true;
      options.physical_slots = physical;
      options.path = c.path;
      options.strategy = strategy;
      options.page_size = s->page_size();
      options.key_format = s->key_format();
      options.q_block_scales = s->q_block_scales();
      OwnedView got = int32_matrix(s->w.rows(), k, k, -77);
      DSA_ASSERT_OK(dsa::index_topk(s->q(), s->key_cache(), s->weights(), s->w.context_lens_view(),
                                    s->w.block_table_view(), s->schedule.view(), s->w.max_context_len,
                                    s->w.causal_lens_view(), got.view, options, ctx));
      EXPECT_EQ(got.bytes, want.bytes) << index_topk_strategy_name(strategy) << (physical ? " physical" : "");
    }
  }
}

// "cpu_" or "reference_", then the case's name.
const auto backend_and_case_name = [](const auto& info) {
  return std::string(std::get<0>(info.param) == dsa::Backend::cpu ? "cpu_" : "reference_") +
         std::get<1>(info.param).name;
};

INSTANTIATE_TEST_SUITE_P(Cpu, Fp4Logits,
                         ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(fp4_logits_cases())),
                         backend_and_case_name);

// ---- Requests of uneven row counts (request_offsets) --------------------------------

struct Fp4VarlenCase {
  std::string name;
  VarlenSpec spec;
  bool fp4_queries = false;
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
};

void PrintTo(const Fp4VarlenCase& c, std::ostream* os) { *os << c.name; }

std::vector<Fp4VarlenCase> fp4_varlen_cases() {
  std::vector<Fp4VarlenCase> cases;
  auto add = [&](std::string name, VarlenSpec spec) -> Fp4VarlenCase& {
    spec.seed = cases.size() + 601;
    cases.push_back(Fp4VarlenCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  add("rows_1_to_8", VarlenSpec{.rows_per_request = {3, 1, 8, 5, 2}});
  add("rows_1_to_8_fp4_queries", VarlenSpec{.rows_per_request = {2, 7, 1, 4}}).fp4_queries = true;
  add("any_order_row_tiles_fp4_queries",
      VarlenSpec{.rows_per_request = {17, 0, 9, 1}, .heads = 8, .causal = false, .max_prefix = 600})
      .fp4_queries = true;
  add("prefill_among_decodes", VarlenSpec{.rows_per_request = {1, 40, 0, 2}, .heads = 4, .max_prefix = 400});
  add("per_token_fp4_queries", VarlenSpec{.rows_per_request = {3, 10, 1}, .heads = 5, .causal = false}).path =
      dsa::LogitsPath::per_token;
  cases.back().fp4_queries = true;
  add("all_requests_empty", VarlenSpec{.rows_per_request = {0, 0}}).fp4_queries = true;
  repeat_on_32_token_pages(cases);
  return cases;
}

// One case's inputs: the rows (fp8 queries and cache), their fp4 cache, fp4 queries and schedule.
struct Fp4VarlenSetup {
  Fp4VarlenSetup(const Fp4VarlenCase& varlen_case, const dsa::ExecContext& ctx)
      : c(varlen_case), v(make_varlen_workload(c.spec)), cache(fp4_cache_of(v.rows)), queries(fp4_queries_of(v.rows)) {
    const dsa::Status planned = plan_varlen(v.rows.context_lens, v.request_offsets, 3, c.path, ctx, &schedule);
    EXPECT_TRUE(planned.ok()) << planned.to_string();
  }

  dsa::TensorView q() { return c.fp4_queries ? queries.codes_view(v.rows) : v.rows.q_fp8_view(); }
  dsa::TensorView weights() { return c.fp4_queries ? queries.weights_view(v.rows) : v.rows.weights_view(); }
  dsa::TensorView q_block_scales() { return c.fp4_queries ? queries.scales_view(v.rows) : dsa::TensorView{}; }
  ReferenceLogits reference() const { return fp4_reference_logits(v, cache, c.fp4_queries ? &queries : nullptr); }

  // paged_mqa_logits over the fp4 cache (a 2-D view, its format given) into `logits`.
  dsa::Status run_logits(const dsa::ExecContext& ctx, OwnedView* logits) {
    Workload& w = v.rows;
    *logits = float_matrix(w.rows(), w.max_context_len, w.max_context_len + 3, kSentinel);
    dsa::LogitsOptions options;
    options.clean_logits = true;
    options.path = c.path;
    options.page_size = c.spec.page_tokens;
    options.key_format = dsa::KeyFormat::fp4_e2m1;
    options.q_block_scales = q_block_scales();
    options.request_offsets = v.request_offsets_view();
    return dsa::paged_mqa_logits(q(), cache.view_2d(), weights(), v.row_lengths_view(), v.table_view(),
                                 schedule.view(), w.max_context_len, logits->view, options, ctx);
  }

  Fp4VarlenCase c;
  VarlenWorkload v;
  Fp4Cache cache;
  Fp4Queries queries;
  Schedule schedule;
};

class Fp4Varlen : public ::testing::TestWithParam<std::tuple<dsa::Backend, Fp4VarlenCase>> {};

TEST_P(Fp4Varlen, MatchesTheFloat64Reference) {
  const auto& [backend, c] = GetParam();
  for (const bool float64 : {false, true}) {
    if (float64 && backend != dsa::Backend::cpu_reference) continue;
    const dsa::ExecContext ctx = cpu_context(backend, 2, float64);
    Fp4VarlenSetup s(c, ctx);
    OwnedView logits;
    DSA_ASSERT_OK(s.run_logits(ctx, &logits));
    EXPECT_TRUE(logits_match(s.v.rows, s.reference(), logits, float64 ? Precision::float64 : Precision::float32,
                             true, kSentinel));
  }
}

// index_topk with request_offsets over an fp4 cache is topk of those logits
// (positions, and cache slots through each request's block-table row).
TEST_P(Fp4Varlen, IndexTopkEqualsTopkOfTheLogits) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  Fp4VarlenSetup s(c, ctx);
  OwnedView logits;
  DSA_ASSERT_OK(s.run_logits(ctx, &logits));
  const std::int64_t rows = s.v.total_rows();
  const int k = 40;
  for (const bool physical : {false, true}) {
    dsa::TopkOptions topk_options;
    topk_options.sorted = true;
    if (physical) {
      topk_options.block_table = s.v.table_view();
      topk_options.request_offsets = s.v.request_offsets_view();
      topk_options.page_size = c.spec.page_tokens;
    }
    OwnedView want = int32_matrix(rows, k, k, -77);
    DSA_ASSERT_OK(dsa::topk(logits.view, s.v.row_lengths_view(), k, want.view, topk_options, ctx));
    for (const auto strategy : {dsa::IndexTopkStrategy::fused, dsa::IndexTopkStrategy::logits_then_topk}) {
      dsa::IndexTopkOptions options;
      options.k = k;
      options.sorted = true;
      options.physical_slots = physical;
      options.path = c.path;
      options.strategy = strategy;
      options.page_size = c.spec.page_tokens;
      options.key_format = dsa::KeyFormat::fp4_e2m1;
      options.q_block_scales = s.q_block_scales();
      options.request_offsets = s.v.request_offsets_view();
      OwnedView got = int32_matrix(rows, k, k, -77);
      DSA_ASSERT_OK(dsa::index_topk(s.q(), s.cache.view_2d(), s.weights(), s.v.row_lengths_view(), s.v.table_view(),
                                    s.schedule.view(), s.v.rows.max_context_len, dsa::TensorView{}, got.view, options,
                                    ctx));
      EXPECT_EQ(got.bytes, want.bytes) << index_topk_strategy_name(strategy) << (physical ? " physical" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Fp4Varlen,
                         ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(fp4_varlen_cases())),
                         backend_and_case_name);

// ---- mqa_logits (prefill) ------------------------------------------------------------

struct Fp4PrefillCase {
  bool fp4_queries;
  bool fp4_keys;
};

class Fp4Prefill : public ::testing::TestWithParam<std::tuple<dsa::Backend, Fp4PrefillCase>> {};

TEST_P(Fp4Prefill, MatchesTheFloat64Reference) {
  const auto [backend, c] = GetParam();
  const std::int64_t rows = 9, heads = 4, num_keys = 150;
  Rng rng(31 + (c.fp4_queries ? 1 : 0) + (c.fp4_keys ? 2 : 0));
  std::vector<float> q(static_cast<std::size_t>(rows * heads * kD)), keys(static_cast<std::size_t>(num_keys * kD));
  for (std::int64_t v = 0; v < rows * heads; ++v) random_vector(rng, q.data() + v * kD, kD);
  for (std::int64_t j = 0; j < num_keys; ++j) random_vector(rng, keys.data() + j * kD, kD);
  std::vector<float> weights(static_cast<std::size_t>(rows * heads));
  for (float& w : weights) w = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  // Queries and keys, encoded and as the float64 values they stand for.
  std::vector<std::uint8_t> q_codes(static_cast<std::size_t>(rows * heads * (c.fp4_queries ? kD / 2 : kD)));
  std::vector<std::int32_t> q_scales(static_cast<std::size_t>(rows * heads));
  std::vector<double> q_values(q.size());
  for (std::int64_t v = 0; v < rows * heads; ++v) {
    for (int d = 0; d < kD; ++d) {
      if (!c.fp4_queries) q_codes[static_cast<std::size_t>(v * kD + d)] = e4m3_encode(q[static_cast<std::size_t>(v * kD + d)]);
    }
    if (c.fp4_queries) {
      q_scales[static_cast<std::size_t>(v)] =
          static_cast<std::int32_t>(fp4_quantize(q.data() + v * kD, kD, q_codes.data() + v * kD / 2));
    }
    for (int d = 0; d < kD; ++d) {
      q_values[static_cast<std::size_t>(v * kD + d)] =
          c.fp4_queries ? fp4_value(q_codes.data() + v * kD / 2, static_cast<std::uint32_t>(q_scales[static_cast<std::size_t>(v)]), d)
                        : e4m3_decode(q_codes[static_cast<std::size_t>(v * kD + d)]);
    }
  }
  std::vector<std::uint8_t> key_codes(static_cast<std::size_t>(num_keys * (c.fp4_keys ? kD / 2 : kD)));
  std::vector<std::int32_t> key_words(static_cast<std::size_t>(num_keys));
  std::vector<float> key_scales(static_cast<std::size_t>(num_keys));
  std::vector<double> key_values(keys.size());
  for (std::int64_t j = 0; j < num_keys; ++j) {
    const float* key = keys.data() + j * kD;
    if (c.fp4_keys) {
      key_words[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(fp4_quantize(key, kD, key_codes.data() + j * kD / 2));
    } else {
      key_scales[static_cast<std::size_t>(j)] = 0.25f + 0.01f * static_cast<float>(j);
      for (int d = 0; d < kD; ++d) key_codes[static_cast<std::size_t>(j * kD + d)] = e4m3_encode(key[d]);
    }
    for (int d = 0; d < kD; ++d) {
      key_values[static_cast<std::size_t>(j * kD + d)] =
          c.fp4_keys ? fp4_value(key_codes.data() + j * kD / 2, static_cast<std::uint32_t>(key_words[static_cast<std::size_t>(j)]), d)
                     : e4m3_decode(key_codes[static_cast<std::size_t>(j * kD + d)]) * static_cast<double>(key_scales[static_cast<std::size_t>(j)]);
    }
  }
  std::vector<std::int32_t> ks(static_cast<std::size_t>(rows)), ke(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    ks[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i * 7);
    ke[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(std::min<std::int64_t>(num_keys, 40 + i * 13));
  }
  OwnedView logits = float_matrix(rows, num_keys, num_keys, kSentinel);
  dsa::MqaLogitsOptions options;
  options.clean_logits = true;
  if (c.fp4_queries) options.q_block_scales = dsa::make_view(q_scales.data(), dsa::DType::int32, {rows, heads});
  const dsa::TensorView q_view =
      dsa::make_view(q_codes.data(), c.fp4_queries ? dsa::DType::uint8 : dsa::DType::float8_e4m3,
                     {rows, heads, c.fp4_queries ? kD / 2 : kD});
  const dsa::TensorView keys_view =
      dsa::make_view(key_codes.data(), c.fp4_keys ? dsa::DType::uint8 : dsa::DType::float8_e4m3,
                     {num_keys, c.fp4_keys ? kD / 2 : kD});
  const dsa::TensorView scales_view = c.fp4_keys ? view_of(key_words, {num_keys}) : view_of(key_scales, {num_keys});
  DSA_ASSERT_OK(dsa::mqa_logits(q_view, keys_view, scales_view, view_of(weights, {rows, heads}), view_of(ks, {rows}),
                                view_of(ke, {rows}), logits.view, options, cpu_context(backend)));
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < num_keys; ++j) {
      const float got = read_logit(logits, i, j);
      if (j < ks[static_cast<std::size_t>(i)] || j >= ke[static_cast<std::size_t>(i)]) {
        EXPECT_TRUE(std::isinf(got) && got < 0) << "row " << i << " key " << j;
        continue;
      }
      double want = 0.0, magnitude = 0.0;
      for (std::int64_t h = 0; h < heads; ++h) {
        double dot = 0.0, dot_magnitude = 0.0;
        for (int d = 0; d < kD; ++d) {
          const double term = q_values[static_cast<std::size_t>((i * heads + h) * kD + d)] * key_values[static_cast<std::size_t>(j * kD + d)];
          dot += term;
          dot_magnitude += std::fabs(term);
        }
        want += weights[static_cast<std::size_t>(i * heads + h)] * std::fmax(dot, 0.0);
        magnitude += std::fabs(weights[static_cast<std::size_t>(i * heads + h)]) * dot_magnitude;
      }
      ASSERT_NEAR(got, want, 2e-5 * magnitude + 1e-30) << "row " << i << " key " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Fp4Prefill,
                         ::testing::Combine(::testing::ValuesIn(cpu_backends()),
                                            ::testing::Values(Fp4PrefillCase{true, true}, Fp4PrefillCase{false, true},
                                                              Fp4PrefillCase{true, false})));

// ---- quantize_queries_fp4 --------------------------------------------------------

class Fp4QueryQuantization : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(Fp4QueryQuantization, MatchesTheIndependentQuantizerBitForBit) {
  const dsa::Backend backend = GetParam();
  for (const bool bf16 : {false, true}) {
    Workload w = make_workload(WorkloadSpec{.batch = 3, .next_n = 2, .heads = 8, .seed = 77});
    std::vector<float> q = w.q;
    std::vector<float> special = fp4_test_keys(2, 5);  // the store test's rule-reaching vectors
    std::copy(special.begin(), special.end(), q.begin());
    std::vector<std::uint16_t> q_bf16(q.size());
    if (bf16) {
      for (std::size_t i = 0; i < q.size(); ++i) {
        q_bf16[i] = bf16_encode(q[i]);
        q[i] = bf16_decode(q_bf16[i]);
      }
    }
    w.q = q;
    const Fp4Queries want = fp4_queries_of(w);
    std::vector<std::uint8_t> codes(want.codes.size(), 0xEE);
    std::vector<std::int32_t> scales(want.scales.size(), -5);
    std::vector<float> weights(want.weights.size(), kSentinel);
    dsa::QuantizeQueriesOptions options;
    options.weight_scale = default_weight_scale(w.heads, kD);
    const dsa::TensorView q_view = bf16 ? dsa::make_view(q_bf16.data(), dsa::DType::bfloat16, {w.batch, w.next_n, w.heads, kD})
                                        : dsa::make_view(q.data(), dsa::DType::float32, {w.batch, w.next_n, w.heads, kD});
    DSA_ASSERT_OK(dsa::quantize_queries_fp4(
        q_view, view_of(w.head_gate, {w.rows(), w.heads}),
        dsa::make_view(codes.data(), dsa::DType::uint8, {w.batch, w.next_n, w.heads, kD / 2}),
        dsa::make_view(scales.data(), dsa::DType::int32, {w.batch, w.next_n, w.heads}),
        view_of(weights, {w.rows(), w.heads}), options, cpu_context(backend)));
    EXPECT_EQ(codes, want.codes) << (bf16 ? "bf16" : "fp32");
    EXPECT_EQ(scales, want.scales);
    EXPECT_EQ(weights, want.weights);
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, Fp4QueryQuantization, ::testing::ValuesIn(cpu_backends()), backend_label);

// ---- Validation ----------------------------------------------------------------------

// A message holds every fragment.
::testing::AssertionResult fails_with(const dsa::Status& status, dsa::ErrorCode code,
                                      std::initializer_list<const char*> fragments) {
  if (status.ok()) return ::testing::AssertionFailure() << "succeeded";
  if (status.code() != code) return ::testing::AssertionFailure() << "wrong code: " << status.to_string();
  for (const char* fragment : fragments) {
    if (status.message().find(fragment) == std::string::npos) {
      return ::testing::AssertionFailure() << "no \"" << fragment << "\" in: " << status.to_string();
    }
  }
  return ::testing::AssertionSuccess();
}

class Fp4Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    c.spec = WorkloadSpec{.batch = 2, .next_n = 2, .heads = 4};
    s = make_setup(c, ctx);
  }
  dsa::Status logits(const dsa::TensorView& q, const dsa::TensorView& cache, const dsa::LogitsOptions& options) {
    out = float_matrix(s->w.rows(), s->w.max_context_len, s->w.max_context_len, 0.0f);
    return dsa::paged_mqa_logits(q, cache, s->weights(), s->w.context_lens_view(), s->w.block_table_view(),
                                 s->schedule.view(), s->w.max_context_len, out.view, options, ctx);
  }
  dsa::ExecContext ctx = cpu_context(dsa::Backend::cpu);
  Fp4LogitsCase c;
  std::unique_ptr<Fp4Setup> s;
  OwnedView out;
};

TEST_F(Fp4Validation, CacheWidthAndFormatOption) {
  dsa::LogitsOptions options;
  dsa::TensorView cache = s->cache.view_4d();
  cache.shape[3] = 70;
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), cache, options), dsa::ErrorCode::bad_shape,
                         {"key_cache", "W = D + 4 = 132", "D / 2 + 4 = 68"}));
  options.key_format = dsa::KeyFormat::fp8_e4m3;
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), s->cache.view_4d(), options), dsa::ErrorCode::bad_shape,
                         {"68-byte tokens", "fp4_e2m1", "options.key_format is fp8_e4m3"}));
  options.key_format = dsa::KeyFormat::fp4_e2m1;
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), s->w.cache_view_4d(), options), dsa::ErrorCode::bad_shape,
                         {"132-byte tokens", "options.key_format is fp4_e2m1"}));
  options.key_format = static_cast<dsa::KeyFormat>(9);
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), s->cache.view_2d(), options), dsa::ErrorCode::invalid_argument,
                         {"options.key_format", "not a KeyFormat value"}));
  // A 2-D view of fp4 pages read as fp8 is too small for fp8 pages.
  options.key_format = dsa::KeyFormat::automatic;
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), s->cache.view_2d(), options), dsa::ErrorCode::bad_shape,
                         {"smaller than P * (D + 4)", "fp8_e4m3"}));
}

TEST_F(Fp4Validation, Fp4NeedsHeadDim128) {
  std::vector<float> keys(4 * 64, 1.0f);
  std::vector<std::int32_t> slots{0, 1, 2, 3};
  std::vector<std::uint8_t> cache(64 * 36 * 2, 0);
  dsa::StoreKeysOptions options;
  options.key_format = dsa::KeyFormat::fp4_e2m1;
  const dsa::Status status = dsa::store_index_keys(
      dsa::make_view(keys.data(), dsa::DType::float32, {4, 64}), view_of(slots, {4}),
      dsa::make_view(cache.data(), dsa::DType::uint8, {2, 64 * 36}), options, ctx);
  EXPECT_TRUE(fails_with(status, dsa::ErrorCode::bad_shape, {"cache", "fp4_e2m1", "head dim 128 only", "got head dim 64"}));
  // A 4-D view of W = D / 2 + 4 for D = 64 is the fp4 format too.
  options.key_format = dsa::KeyFormat::automatic;
  const dsa::Status view_status = dsa::store_index_keys(
      dsa::make_view(keys.data(), dsa::DType::float32, {4, 64}), view_of(slots, {4}),
      dsa::make_view(cache.data(), dsa::DType::uint8, {2, 64, 1, 36}), options, ctx);
  EXPECT_TRUE(fails_with(view_status, dsa::ErrorCode::bad_shape, {"head dim 128 only"}));
}

TEST_F(Fp4Validation, Fp4QueryArguments) {
  dsa::LogitsOptions options;
  // uint8 codes without their scales.
  EXPECT_TRUE(fails_with(logits(s->queries.codes_view(s->w), s->cache.view_4d(), options), dsa::ErrorCode::bad_dtype,
                         {"q", "q_block_scales"}));
  options.q_block_scales = s->queries.scales_view(s->w);
  // fp8 queries with scales.
  EXPECT_TRUE(fails_with(logits(s->w.q_fp8_view(), s->cache.view_4d(), options), dsa::ErrorCode::bad_dtype,
                         {"q", "uint8"}));
  // Codes of the wrong width.
  dsa::TensorView q = s->queries.codes_view(s->w);
  q.shape[3] = 32;
  EXPECT_TRUE(fails_with(logits(q, s->cache.view_4d(), options), dsa::ErrorCode::bad_shape,
                         {"q", "dimension 3 must be 64"}));
  // Scales of the wrong dtype or shape.
  options.q_block_scales.dtype = dsa::DType::float32;
  EXPECT_TRUE(fails_with(logits(s->queries.codes_view(s->w), s->cache.view_4d(), options), dsa::ErrorCode::bad_dtype,
                         {"q_block_scales", "int32"}));
  options.q_block_scales = s->queries.scales_view(s->w);
  options.q_block_scales.shape[2] = 3;
  EXPECT_TRUE(fails_with(logits(s->queries.codes_view(s->w), s->cache.view_4d(), options), dsa::ErrorCode::bad_shape,
                         {"q_block_scales", "dimension 2"}));
  options.q_block_scales = s->queries.scales_view(s->w);
  options.q_block_scales.ndim = 2;
  EXPECT_TRUE(fails_with(logits(s->queries.codes_view(s->w), s->cache.view_4d(), options), dsa::ErrorCode::bad_shape,
                         {"q_block_scales", "rank 3"}));
}

TEST_F(Fp4Validation, QuantizeQueriesFp4Outputs) {
  Workload& w = s->w;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(w.rows() * w.heads * kD));
  std::vector<std::int32_t> scales(static_cast<std::size_t>(w.rows() * w.heads));
  std::vector<float> weights(scales.size());
  const dsa::TensorView q = dsa::make_view(w.q.data(), dsa::DType::float32, {w.batch, w.next_n, w.heads, kD});
  const dsa::TensorView gate = view_of(w.head_gate, {w.rows(), w.heads});
  const dsa::TensorView scales_view = dsa::make_view(scales.data(), dsa::DType::int32, {w.batch, w.next_n, w.heads});
  const dsa::TensorView weights_view = view_of(weights, {w.rows(), w.heads});
  EXPECT_TRUE(fails_with(
      dsa::quantize_queries_fp4(q, gate, dsa::make_view(codes.data(), dsa::DType::uint8, {w.batch, w.next_n, w.heads, kD}),
                                scales_view, weights_view, {}, ctx),
      dsa::ErrorCode::bad_shape, {"quantize_queries_fp4", "q_codes", "D / 2"}));
  EXPECT_TRUE(fails_with(
      dsa::quantize_queries_fp4(q, gate, dsa::make_view(codes.data(), dsa::DType::uint8, {w.batch, w.next_n, w.heads, kD / 2}),
                                dsa::make_view(scales.data(), dsa::DType::int32, {w.batch, w.next_n, w.heads - 1}),
                                weights_view, {}, ctx),
      dsa::ErrorCode::bad_shape, {"q_block_scales"}));
  std::vector<float> q64(static_cast<std::size_t>(w.rows() * w.heads * 64));
  EXPECT_TRUE(fails_with(
      dsa::quantize_queries_fp4(dsa::make_view(q64.data(), dsa::DType::float32, {w.batch, w.next_n, w.heads, 64}), gate,
                                dsa::make_view(codes.data(), dsa::DType::uint8, {w.batch, w.next_n, w.heads, 32}),
                                scales_view, weights_view, {}, ctx),
      dsa::ErrorCode::bad_shape, {"q", "head dim 128 only"}));
}

TEST(Fp4PrefillValidation, KeysScalesAndQueries) {
  const std::int64_t rows = 2, heads = 2, num_keys = 8;
  std::vector<std::uint8_t> q(static_cast<std::size_t>(rows * heads * kD)), keys(static_cast<std::size_t>(num_keys * kD));
  std::vector<std::int32_t> words(static_cast<std::size_t>(num_keys)), q_scales(static_cast<std::size_t>(rows * heads));
  std::vector<float> scales(static_cast<std::size_t>(num_keys)), weights(static_cast<std::size_t>(rows * heads));
  std::vector<std::int32_t> ks{0, 0}, ke{4, 8};
  OwnedView out = float_matrix(rows, num_keys, num_keys, 0.0f);
  const dsa::ExecContext ctx = cpu_context(dsa::Backend::cpu);
  const dsa::TensorView fp8_q = dsa::make_view(q.data(), dsa::DType::float8_e4m3, {rows, heads, kD});
  const dsa::TensorView fp4_keys = dsa::make_view(keys.data(), dsa::DType::uint8, {num_keys, kD / 2});
  auto call = [&](const dsa::TensorView& q_view, const dsa::TensorView& keys_view, const dsa::TensorView& scales_view,
                  const dsa::MqaLogitsOptions& options) {
    return dsa::mqa_logits(q_view, keys_view, scales_view, view_of(weights, {rows, heads}), view_of(ks, {rows}),
                           view_of(ke, {rows}), out.view, options, ctx);
  };
  DSA_ASSERT_OK(call(fp8_q, fp4_keys, view_of(words, {num_keys}), {}));
  EXPECT_TRUE(fails_with(call(fp8_q, fp4_keys, view_of(scales, {num_keys}), {}), dsa::ErrorCode::bad_dtype,
                         {"mqa_logits", "key_scales", "int32"}));
  EXPECT_TRUE(fails_with(call(fp8_q, dsa::make_view(keys.data(), dsa::DType::uint8, {num_keys, kD}),
                              view_of(words, {num_keys}), {}),
                         dsa::ErrorCode::bad_shape, {"keys", "dimension 1 must be 64"}));
  dsa::MqaLogitsOptions options;
  options.q_block_scales = dsa::make_view(q_scales.data(), dsa::DType::int32, {rows, heads});
  DSA_ASSERT_OK(call(dsa::make_view(q.data(), dsa::DType::uint8, {rows, heads, kD / 2}), fp4_keys,
                     view_of(words, {num_keys}), options));
  EXPECT_TRUE(fails_with(call(dsa::make_view(q.data(), dsa::DType::uint8, {rows, heads, kD}), fp4_keys,
                              view_of(words, {num_keys}), options),
                         dsa::ErrorCode::bad_shape, {"q", "[S, H, D / 2]", "dimension 2 must be 64"}));
  options.q_block_scales = dsa::make_view(q_scales.data(), dsa::DType::int32, {rows, heads + 1});
  EXPECT_TRUE(fails_with(call(dsa::make_view(q.data(), dsa::DType::uint8, {rows, heads, kD / 2}), fp4_keys,
                              view_of(words, {num_keys}), options),
                         dsa::ErrorCode::bad_shape, {"q_block_scales", "dimension 1"}));
}

}  // namespace
}  // namespace dsa_test
