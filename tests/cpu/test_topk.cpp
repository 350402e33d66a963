// topk on the CPU backends against a full sort under the documented order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/device_error.hpp"
#include "common/ragged_topk.hpp"
#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

constexpr std::int32_t kUntouched = -77;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

enum class Values { normal, small_integers, constant, specials, times_1e8, narrow_1e8, plus_100, all_nan };

const char* values_name(Values v) {
  switch (v) {
    case Values::normal: return "normal";
    case Values::small_integers: return "small_integers";
    case Values::constant: return "constant";
    case Values::specials: return "specials";
    case Values::times_1e8: return "times_1e8";
    case Values::narrow_1e8: return "narrow_1e8";
    case Values::plus_100: return "plus_100";
    case Values::all_nan: return "all_nan";
  }
  return "?";
}

float draw_value(Values kind, Rng& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> die(0, 9);
  switch (kind) {
    case Values::normal: return normal(rng);
    case Values::small_integers: return static_cast<float>(die(rng) / 2);
    case Values::constant: return 0.75f;
    case Values::specials: {
      static constexpr float specials[] = {kNan, -kInf, kInf, -0.0f, 0.0f, -kNan};
      const int roll = die(rng);
      return roll < 6 ? specials[roll] : normal(rng);
    }
    case Values::times_1e8: return normal(rng) * 1e-8f;
    case Values::narrow_1e8: return 1.0f + normal(rng) * 1e-8f;
    case Values::plus_100: return normal(rng) + 100.0f;
    case Values::all_nan: return kNan;
  }
  return 0.0f;
}

// Host inputs of one topk call; `values` is what the library sees (bf16 inputs decoded).
struct TopkInputs {
  std::int64_t rows = 0, cols = 0, stride = 0;
  std::vector<float> values;
  OwnedView logits;
  std::vector<std::int32_t> lengths;
};

TopkInputs make_inputs(std::int64_t rows, std::int64_t cols, std::int64_t stride, Values kind, bool bf16,
                       std::function<std::int32_t(std::int64_t)> length_of, std::uint64_t seed) {
  Rng rng(seed);
  TopkInputs in;
  in.rows = rows;
  in.cols = cols;
  in.stride = stride;
  in.values.assign(static_cast<std::size_t>(std::max<std::int64_t>(rows * stride, 1)), kNan);
  in.logits = bf16 ? bf16_matrix(rows, cols, stride, bf16_encode(kNan)) : float_matrix(rows, cols, stride, kNan);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t p = 0; p < cols; ++p) {
      const std::int64_t i = r * stride + p;
      const float v = draw_value(kind, rng);
      if (bf16) {
        const std::uint16_t bits = bf16_encode(v);
        std::memcpy(in.logits.bytes.data() + 2 * i, &bits, sizeof bits);
        in.values[i] = bf16_decode(bits);
      } else {
        std::memcpy(in.logits.bytes.data() + 4 * i, &v, sizeof v);
        in.values[i] = v;
      }
    }
    in.lengths.push_back(length_of(r));
  }
  in.lengths.reserve(1);
  return in;
}

struct TopkRun {
  OwnedView indices;
  std::int64_t width = 0;
};

dsa::Status run_topk(TopkInputs& in, int k, std::int64_t width, const dsa::TopkOptions& options,
                     const dsa::ExecContext& ctx, TopkRun* run) {
  run->width = width;
  run->indices = int32_matrix(in.rows, width, width, kUntouched);
  return dsa::topk(in.logits.view, dsa::make_view(in.lengths.data(), dsa::DType::int32, {in.rows}), k,
                   run->indices.view, options, ctx);
}

const std::int32_t* row_of(const TopkRun& run, std::int64_t r) {
  return reinterpret_cast<const std::int32_t*>(run.indices.bytes.data()) + r * run.width;
}

// `map` turns a reference position into the expected output value.
::testing::AssertionResult topk_matches(const TopkInputs& in, int k, bool sorted, const TopkRun& run,
                                        const std::function<std::int32_t(std::int64_t, std::int32_t)>& map) {
  for (std::int64_t r = 0; r < in.rows; ++r) {
    const std::int64_t length = in.lengths[r];
    std::vector<std::int32_t> want = reference_topk(in.values.data() + r * in.stride, length, k);
    std::vector<std::int32_t> by_value = want;
    if (length <= k) {
      // Sorted output of a short row may be given in value order too; both are
      // read as allowed, the rest of the contract is the same.
      std::vector<std::int32_t> positions(want.begin(), want.begin() + length);
      std::sort(positions.begin(), positions.end(), [&](std::int32_t a, std::int32_t b) {
        return ranks_before(in.values[r * in.stride + a], a, in.values[r * in.stride + b], b);
      });
      std::copy(positions.begin(), positions.end(), by_value.begin());
    }
    std::vector<std::int32_t> got(row_of(run, r), row_of(run, r) + k);
    for (auto* v : {&want, &by_value})
      for (auto& p : *v) p = p < 0 ? -1 : map(r, p);
    bool same = got == want || (sorted && length <= k && got == by_value);
    if (!sorted && length > k) {
      std::vector<std::int32_t> a = got, b = want;
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      same = a == b;
    }
    if (!same) {
      auto result = ::testing::AssertionFailure() << "row " << r << " (length " << length << ", k " << k << "):";
      for (std::size_t i = 0; i < std::min<std::size_t>(got.size(), 12); ++i)
        result << " [" << i << "] got " << got[i] << " want " << want[i] << ";";
      return result;
    }
    for (std::int64_t c = k; c < run.width; ++c) {
      if (row_of(run, r)[c] != kUntouched)
        return ::testing::AssertionFailure() << "row " << r << " column " << c << " >= k was written";
    }
  }
  return ::testing::AssertionSuccess();
}

std::int32_t identity(std::int64_t, std::int32_t p) { return p; }

struct TopkCase {
  Values values;
  int k;
  bool bf16;
  bool sorted;
};

void PrintTo(const TopkCase& c, std::ostream* os) {
  *os << values_name(c.values) << " k " << c.k << (c.bf16 ? " bf16" : " fp32") << (c.sorted ? " sorted" : "");
}

class TopkTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, TopkCase>> {};

TEST_P(TopkTest, MatchesFullSort) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  // Lengths around k and around the page size, plus 0, 1 and the full width.
  const std::int64_t cols = std::max(3 * c.k + 70, 700);
  const std::vector<std::int64_t> lengths{0,         1,         2,         c.k - 1,  c.k,     c.k + 1,
                                          2 * c.k,   63,        64,        65,       cols - 1, cols,
                                          c.k + 300, (cols * 2) / 3};
  std::vector<std::int32_t> clamped;
  for (const std::int64_t len : lengths) clamped.push_back(static_cast<std::int32_t>(std::clamp<std::int64_t>(len, 0, cols)));
  TopkInputs in = make_inputs(static_cast<std::int64_t>(clamped.size()), cols, cols + 13, c.values, c.bf16,
                              [&](std::int64_t r) { return clamped[r]; },
                              static_cast<std::uint64_t>(c.k * 31 + static_cast<int>(c.values)));
  dsa::TopkOptions options;
  options.sorted = c.sorted;
  TopkRun run;
  DSA_ASSERT_OK(run_topk(in, c.k, c.k + 3, options, ctx, &run));
  EXPECT_TRUE(topk_matches(in, c.k, c.sorted, run, identity));
}

std::vector<TopkCase> topk_cases() {
  std::vector<TopkCase> cases;
  for (const Values v : {Values::normal, Values::small_integers, Values::constant, Values::specials,
                         Values::times_1e8, Values::narrow_1e8, Values::plus_100, Values::all_nan}) {
    for (const int k : {1, 2, 64, 2048}) {
      for (const bool sorted : {false, true}) cases.push_back({v, k, false, sorted});
    }
    cases.push_back({v, 100, true, false});
    cases.push_back({v, 100, true, true});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TopkTest, ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(topk_cases())),
    [](const ::testing::TestParamInfo<TopkTest::ParamType>& info) {
      const TopkCase& c = std::get<1>(info.param);
      return std::string(values_name(c.values)) + "_k" + std::to_string(c.k) + (c.bf16 ? "_bf16" : "_fp32") +
             (c.sorted ? "_sorted_" : "_unsorted_") + backend_label({std::get<0>(info.param), info.index});
    });

class TopkPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(TopkPropertyTest, PhysicalSlotsWithSeveralRowsPerRequest) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  constexpr int kRowsPerRequest = 3, kRequests = 4, kMaxBlocks = 12;
  const std::int64_t cols = kMaxBlocks * 64;
  Rng rng(17);
  std::vector<std::int32_t> table(kRequests * kMaxBlocks);
  std::uniform_int_distribution<std::int32_t> page(0, 500);
  for (auto& e : table) e = page(rng);
  std::uniform_int_distribution<std::int32_t> length(0, static_cast<std::int32_t>(cols));
  std::vector<std::int32_t> lens;
  for (int r = 0; r < kRequests * kRowsPerRequest; ++r) lens.push_back(r == 0 ? 5 : length(rng));
  for (const bool sorted : {false, true}) {
    for (const int k : {1, 40, 300}) {
      SCOPED_TRACE("k " + std::to_string(k) + (sorted ? " sorted" : " unsorted"));
      TopkInputs in = make_inputs(kRequests * kRowsPerRequest, cols, cols, Values::small_integers, false,
                                  [&](std::int64_t r) { return lens[r]; }, 3 + k);
      dsa::TopkOptions options;
      options.sorted = sorted;
      options.block_table = dsa::make_view(table.data(), dsa::DType::int32, {kRequests, kMaxBlocks});
      options.rows_per_request = kRowsPerRequest;
      TopkRun run;
      DSA_ASSERT_OK(run_topk(in, k, k, options, ctx, &run));
      EXPECT_TRUE(topk_matches(in, k, sorted, run, [&](std::int64_t r, std::int32_t p) {
        return table[(r / kRowsPerRequest) * kMaxBlocks + p / 64] * 64 + p % 64;
      }));
    }
  }
}

TEST_P(TopkPropertyTest, DeterministicRunToRun) {
  const dsa::ExecContext ctx = cpu_context(GetParam(), 3);
  for (const bool sorted : {false, true}) {
    TopkInputs in = make_inputs(9, 5000, 5000, Values::small_integers, false,
                                [](std::int64_t r) { return static_cast<std::int32_t>(4000 + 100 * r); }, 21);
    dsa::TopkOptions options;
    options.sorted = sorted;
    TopkRun first, second;
    DSA_ASSERT_OK(run_topk(in, 2048, 2048, options, ctx, &first));
    DSA_ASSERT_OK(run_topk(in, 2048, 2048, options, ctx, &second));
    EXPECT_TRUE(first.indices.bytes == second.indices.bytes);
    EXPECT_TRUE(topk_matches(in, 2048, sorted, first, identity));
  }
}

TEST_P(TopkPropertyTest, ZeroRows) {
  TopkInputs in = make_inputs(0, 100, 100, Values::normal, false, [](std::int64_t) { return 0; }, 1);
  TopkRun run;
  DSA_ASSERT_OK(run_topk(in, 10, 10, dsa::TopkOptions{}, cpu_context(GetParam()), &run));
}

// Rows where many positions share the values around the k-th: the tie rule
// alone decides which of them are kept.
TEST_P(TopkPropertyTest, ManyEqualValuesAroundTheThreshold) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  TopkInputs in = make_inputs(4, 6000, 6000, Values::constant, false,
                              [](std::int64_t) { return 6000; }, 2);
  // Row 1: 3000 equal values above the rest; row 2: exactly k values above; row 3: k - 1 above.
  const float higher = 2.0f;
  auto set = [&](std::int64_t r, std::int64_t p, float v) {
    in.values[r * in.stride + p] = v;
    std::memcpy(in.logits.bytes.data() + 4 * (r * in.stride + p), &v, sizeof v);
  };
  for (std::int64_t p = 0; p < 6000; p += 2) set(1, p, higher);
  for (std::int64_t p = 0; p < 2048; ++p) set(2, 5999 - 2 * p, higher);
  for (std::int64_t p = 0; p < 2047; ++p) set(3, 2 * p + 1, std::nextafter(0.75f, 1.0f));
  for (const bool sorted : {false, true}) {
    dsa::TopkOptions options;
    options.sorted = sorted;
    TopkRun run;
    DSA_ASSERT_OK(run_topk(in, 2048, 2048, options, ctx, &run));
    EXPECT_TRUE(topk_matches(in, 2048, sorted, run, identity)) << (sorted ? "sorted" : "unsorted");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TopkPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// ---- Ragged rows and output transforms (TopkOptions) ----------------------

// The library's output for t on a CPU backend (k + 3 columns, the last 3
// must stay untouched).
dsa::Status run_ragged(RaggedTopk& t, const dsa::ExecContext& ctx, std::vector<std::int32_t>* out) {
  const Int32ViewOf host_view = [](const std::vector<std::int32_t>& array, std::int64_t rows, std::int64_t cols) {
    auto* data = const_cast<std::int32_t*>(array.data());
    return cols == 0 ? dsa::make_view(data, dsa::DType::int32, {rows}) : dsa::make_view(data, dsa::DType::int32, {rows, cols});
  };
  const std::int64_t rows = t.spec.rows, width = t.spec.k + 3;
  out->assign(static_cast<std::size_t>(rows * width), kUntouched);
  void* logits = t.spec.bf16 ? static_cast<void*>(t.bf16.data()) : static_cast<void*>(t.values.data());
  return dsa::topk(dsa::make_view(logits, t.spec.bf16 ? dsa::DType::bfloat16 : dsa::DType::float32,
                                  {rows, t.spec.cols}, {t.stride, 1}),
                   host_view(t.lengths, rows, 0), t.spec.k,
                   dsa::make_view(out->data(), dsa::DType::int32, {rows, width}), ragged_options(t, host_view), ctx);
}

::testing::AssertionResult ragged_matches(const RaggedTopk& t, const std::vector<std::int32_t>& out) {
  const std::string mismatch = t.mismatch(out.data(), t.spec.k + 3, kUntouched);
  if (mismatch.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatch;
}

class TopkRaggedTest
    : public ::testing::TestWithParam<std::tuple<dsa::Backend, RaggedOptionSet, RaggedValues, int>> {};

// Every combination of the options against the reference, in float32 and
// bfloat16, sorted and not.
TEST_P(TopkRaggedTest, MatchesReference) {
  const auto& [backend, o, values, k] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  for (const bool bf16 : {false, true}) {
    for (const bool sorted : {false, true}) {
      const std::uint64_t seed = static_cast<std::uint64_t>(k * 7 + static_cast<int>(values)) + (bf16 ? 100 : 0);
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + (sorted ? " sorted" : " unsorted"));
      RaggedTopk t = make_ragged_topk(o.applied_to(short_rows_spec(k, values, bf16, sorted, seed)));
      std::vector<std::int32_t> out;
      DSA_ASSERT_OK(run_ragged(t, ctx, &out));
      EXPECT_TRUE(ragged_matches(t, out));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TopkRaggedTest,
    ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(ragged_option_sets()),
                       ::testing::Values(RaggedValues::normal, RaggedValues::few_values, RaggedValues::specials),
                       ::testing::Values(1, 7, 2048)),
    [](const ::testing::TestParamInfo<TopkRaggedTest::ParamType>& info) {
      return std::string(std::get<1>(info.param).name) + "_" + ragged_values_name(std::get<2>(info.param)) +
             "_k" + std::to_string(std::get<3>(info.param)) + "_" +
             backend_label({std::get<0>(info.param), info.index});
    });

class TopkRaggedPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

// A row's candidates are its own columns only: values outside them (huge
// ones before the start and after the end) are never selected, and a row's
// output does not depend on where its candidates lie.
TEST_P(TopkRaggedPropertyTest, StartsSelectWithinTheRowsColumns) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  RaggedTopkSpec spec;
  spec.rows = 12;
  spec.cols = 5000;
  spec.k = 100;
  RaggedTopk t = make_ragged_topk(spec);
  for (std::int64_t r = 0; r < spec.rows; ++r) {
    for (std::int64_t c = 0; c < spec.cols; ++c) {
      if (c < t.row_starts[r] || c >= t.row_starts[r] + t.lengths[r]) t.values[r * t.stride + c] = 1e30f;
    }
  }
  std::vector<std::int32_t> out;
  DSA_ASSERT_OK(run_ragged(t, ctx, &out));
  EXPECT_TRUE(ragged_matches(t, out));
}

// The same inputs give bitwise the same output, whatever the thread count.
TEST_P(TopkRaggedPropertyTest, DeterministicWithEveryOption) {
  RaggedTopkSpec spec;
  spec.rows = 30;
  spec.cols = 9000;
  spec.k = 2048;
  spec.values = RaggedValues::few_values;
  spec.transform = RaggedTransform::block_table;
  spec.page_size = 32;
  spec.request_offsets = true;
  RaggedTopk t = make_ragged_topk(spec);
  std::vector<std::int32_t> first, again;
  DSA_ASSERT_OK(run_ragged(t, cpu_context(GetParam(), 3), &first));
  DSA_ASSERT_OK(run_ragged(t, cpu_context(GetParam(), 1), &again));
  EXPECT_EQ(first, again);
  EXPECT_TRUE(ragged_matches(t, first));
}

INSTANTIATE_TEST_SUITE_P(Backends, TopkRaggedPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// The CUDA kernels' records of the new row rules decode to messages that
// name the argument and the rule.
TEST(TopkDeviceErrors, RowStartAndRequestRecordsDecode) {
  using dsa::detail::DeviceErrorRecord;
  const dsa::Status start = dsa::detail::decode_device_error(
      DeviceErrorRecord{dsa::detail::kRowStartOutOfRange, {3, 4100, 4000}}, "topk");
  EXPECT_EQ(start.code(), dsa::ErrorCode::length_out_of_range);
  EXPECT_NE(start.message().find("topk: row_starts: row 3 starts at column 4100, outside [0, 4000]"),
            std::string::npos)
      << start.message();
  const dsa::Status request = dsa::detail::decode_device_error(
      DeviceErrorRecord{dsa::detail::kRowWithoutRequest, {7, 2, 5}}, "topk");
  EXPECT_EQ(request.code(), dsa::ErrorCode::invalid_argument);
  EXPECT_NE(request.message().find("topk: request_offsets: row 7 lies in no request"), std::string::npos)
      << request.message();
  EXPECT_NE(request.message().find("request_offsets[2] = 5"), std::string::npos) << request.message();
}

}  // namespace
}  // namespace dsa_test
