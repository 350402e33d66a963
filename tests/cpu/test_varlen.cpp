// Requests of uneven row counts (request_offsets) on the CPU backends:
// paged_mqa_logits against the float64 reference, the row-tile schedule,
// index_topk, and every rule request_offsets brings.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

constexpr float kSentinel = 8192.0f;  // exact in float32 and bfloat16
constexpr int kRowTile = 8;           // the documented row tile of the native path

struct VarlenCase {
  std::string name;
  VarlenSpec spec;
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
  bool clean = true;
  bool bf16_out = false;
  bool q_3d = false;        // q as [T, H, D] rather than [T, 1, H, D]
  bool lens_2d = false;     // context_lens as [T, 1] rather than [T]
};

void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.name; }

// Row counts drawn uniformly from [lo, hi] for `requests` requests.
std::vector<int> random_rows(int requests, int lo, int hi, std::uint64_t seed) {
  Rng rng(seed);
  std::vector<int> rows(static_cast<std::size_t>(requests));
  for (int& n : rows) n = std::uniform_int_distribution<int>(lo, hi)(rng);
  return rows;
}

struct VarlenCall {
  explicit VarlenCall(VarlenWorkload w) : v(std::move(w)) {}
  VarlenWorkload v;
  OwnedView logits;
  Schedule schedule;
};

dsa::Status run_varlen(VarlenCall& call, const VarlenCase& c, const dsa::ExecContext& ctx) {
  Workload& w = call.v.rows;
  const std::int64_t stride = w.max_context_len + 3;
  call.logits = c.bf16_out ? bf16_matrix(w.rows(), w.max_context_len, stride, bf16_encode(kSentinel))
                           : float_matrix(w.rows(), w.max_context_len, stride, kSentinel);
  if (call.schedule.entries.empty()) {
    const dsa::Status planned = plan_varlen(w.context_lens, call.v.request_offsets, 3, c.path, ctx, &call.schedule);
    if (!planned.ok()) return planned;
  }
  dsa::LogitsOptions options;
  options.clean_logits = c.clean;
  options.path = c.path;
  options.page_size = c.spec.page_tokens;
  options.request_offsets = call.v.request_offsets_view();
  const dsa::TensorView q = c.q_3d ? call.v.q_view_3d() : w.q_fp8_view();
  const dsa::TensorView lens = c.lens_2d ? w.context_lens_view() : call.v.row_lengths_view();
  return dsa::paged_mqa_logits(q, w.cache_view_2d(), w.weights_view(), lens, call.v.table_view(),
                               call.schedule.view(), w.max_context_len, call.logits.view, options, ctx);
}

std::vector<VarlenCase> varlen_cases() {
  std::vector<VarlenCase> cases;
  auto add = [&](std::string name, VarlenSpec spec) -> VarlenCase& {
    spec.seed = cases.size() + 501;
    cases.push_back(VarlenCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  add("rows_1_to_4", VarlenSpec{.rows_per_request = random_rows(7, 1, 4, 1)});
  add("rows_1_to_8", VarlenSpec{.rows_per_request = random_rows(6, 1, 8, 2)});
  add("rows_1_to_8_any_order", VarlenSpec{.rows_per_request = random_rows(6, 1, 8, 3), .causal = false});
  add("rows_up_to_20_any_order", VarlenSpec{.rows_per_request = {20, 9, 16, 17}, .causal = false, .max_prefix = 700});
  add("prefill_127_rows", VarlenSpec{.rows_per_request = {127}, .heads = 8, .max_prefix = 200});
  add("prefill_among_decodes", VarlenSpec{.rows_per_request = {1, 104, 2, 0, 3}, .heads = 8, .max_prefix = 300});
  add("empty_requests", VarlenSpec{.rows_per_request = {0, 3, 0, 0, 5, 0}});
  add("all_requests_empty", VarlenSpec{.rows_per_request = {0, 0, 0}});
  add("no_requests", VarlenSpec{.rows_per_request = {}});
  add("unclean", VarlenSpec{.rows_per_request = random_rows(5, 1, 8, 4)}).clean = false;
  add("bf16_logits", VarlenSpec{.rows_per_request = random_rows(5, 1, 8, 5)}).bf16_out = true;
  add("native", VarlenSpec{.rows_per_request = random_rows(5, 1, 12, 6), .causal = false}).path =
      dsa::LogitsPath::native;
  add("per_token", VarlenSpec{.rows_per_request = random_rows(5, 1, 12, 7), .causal = false}).path =
      dsa::LogitsPath::per_token;
  add("q_3d", VarlenSpec{.rows_per_request = random_rows(4, 1, 8, 8)}).q_3d = true;
  add("lens_2d", VarlenSpec{.rows_per_request = random_rows(4, 1, 8, 9)}).lens_2d = true;
  add("seven_heads_d64", VarlenSpec{.rows_per_request = random_rows(4, 1, 8, 10), .heads = 7, .head_dim = 64});
  // Every case again on 32-token pages.
  repeat_on_32_token_pages(cases);
  return cases;
}

class VarlenLogitsTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, VarlenCase>> {};

TEST_P(VarlenLogitsTest, MatchesReference) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  VarlenCall call{make_varlen_workload(c.spec)};
  DSA_ASSERT_OK(run_varlen(call, c, ctx));
  EXPECT_TRUE(logits_match(call.v.rows, call.v.reference(), call.logits,
                           c.bf16_out ? Precision::bfloat16 : Precision::float32, c.clean, kSentinel));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, VarlenLogitsTest, ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(varlen_cases())),
    [](const ::testing::TestParamInfo<VarlenLogitsTest::ParamType>& info) {
      return std::get<1>(info.param).name + "_" + backend_label({std::get<0>(info.param), info.index});
    });

class VarlenPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

// Bytes of the defined region (valid positions and the cleaned tail) of every row.
std::vector<std::uint8_t> defined_bytes(const VarlenCall& call) {
  const Workload& w = call.v.rows;
  const std::size_t element = dsa::dtype_size(call.logits.view.dtype);
  std::vector<std::uint8_t> out;
  for (std::int64_t r = 0; r < w.rows(); ++r) {
    const std::uint8_t* row = call.logits.bytes.data() + r * call.logits.view.stride(0) * element;
    out.insert(out.end(), row, row + w.max_context_len * static_cast<std::int64_t>(element));
  }
  return out;
}

TEST_P(VarlenPropertyTest, NativeAndPerTokenPathsAgreeBitwise) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  for (const int page_tokens : {32, 64}) {
    const VarlenSpec spec{.rows_per_request = {3, 17, 1, 0, 8, 9}, .causal = false, .max_prefix = 500,
                          .page_tokens = page_tokens, .seed = 31};
    VarlenCase native{"native", spec, dsa::LogitsPath::native};
    VarlenCase per_token{"per_token", spec, dsa::LogitsPath::per_token};
    VarlenCall a{make_varlen_workload(spec)}, b{make_varlen_workload(spec)};
    DSA_ASSERT_OK(run_varlen(a, native, ctx));
    DSA_ASSERT_OK(run_varlen(b, per_token, ctx));
    EXPECT_TRUE(defined_bytes(a) == defined_bytes(b)) << "pages of " << page_tokens;
  }
}

// The same rows as fixed next_n requests and as request_offsets of equal
// counts give the same bytes.
TEST_P(VarlenPropertyTest, EvenRequestsMatchTheFixedForm) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const int next_n = 3;
  const WorkloadSpec spec{.batch = 4, .next_n = next_n, .heads = 16, .max_prefix = 400, .seed = 41};
  Workload w = make_workload(spec);
  std::vector<std::int32_t> offsets;
  for (std::int64_t b = 0; b <= w.batch; ++b) offsets.push_back(static_cast<std::int32_t>(b * next_n));
  std::vector<std::int32_t> row_lens = w.context_lens;
  const std::int64_t rows = w.rows();
  OwnedView fixed = float_matrix(rows, w.max_context_len, w.max_context_len, kSentinel);
  OwnedView uneven = float_matrix(rows, w.max_context_len, w.max_context_len, kSentinel);
  Schedule fixed_schedule, uneven_schedule;
  DSA_ASSERT_OK(plan(w.context_lens, w.batch, next_n, 2, dsa::LogitsPath::native, ctx, &fixed_schedule));
  DSA_ASSERT_OK(plan_varlen(row_lens, offsets, 2, dsa::LogitsPath::native, ctx, &uneven_schedule));
  dsa::LogitsOptions options;
  options.clean_logits = true;
  DSA_ASSERT_OK(dsa::paged_mqa_logits(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(), w.context_lens_view(),
                                      w.block_table_view(), fixed_schedule.view(), w.max_context_len, fixed.view,
                                      options, ctx));
  options.request_offsets = view_of(offsets, {w.batch + 1});
  const dsa::TensorView q = dsa::make_view(w.q_fp8.data(), dsa::DType::float8_e4m3, {rows, 1, w.heads, w.head_dim});
  DSA_ASSERT_OK(dsa::paged_mqa_logits(q, w.cache_view_2d(), w.weights_view(), view_of(row_lens, {rows}),
                                      w.block_table_view(), uneven_schedule.view(), w.max_context_len, uneven.view,
                                      options, ctx));
  EXPECT_TRUE(fixed.bytes == uneven.bytes);
}

// Schedules planned for other lengths, offsets, paths or worker counts still cover everything.
TEST_P(VarlenPropertyTest, StaleSchedulesGiveCorrectLogits) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const VarlenSpec spec{.rows_per_request = {5, 20, 0, 2, 9}, .causal = false, .max_prefix = 900, .seed = 51};
  const std::int64_t total = 36;
  struct Stale {
    std::string name;
    std::vector<std::int32_t> lens;
    std::vector<std::int32_t> offsets;
    int workers;
    dsa::LogitsPath path;
  };
  std::vector<std::int32_t> long_lens(total, 1500), zero_lens(total, 0);
  const std::vector<Stale> stale{
      {"all_zero", zero_lens, {0, 5, 25, 25, 27, 36}, 4, dsa::LogitsPath::native},
      {"longer_other_offsets", long_lens, {0, 3, 4, 30, 31, 36}, 7, dsa::LogitsPath::native},
      {"one_request", long_lens, {0, 36}, 5, dsa::LogitsPath::native},
      {"one_row_per_request", long_lens, {}, 9, dsa::LogitsPath::native},  // filled below
      {"per_token_plan", long_lens, {0, 5, 25, 25, 27, 36}, 6, dsa::LogitsPath::per_token},
      {"many_workers", long_lens, {0, 5, 25, 25, 27, 36}, 300, dsa::LogitsPath::native},
  };
  for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    for (Stale s : stale) {
      if (s.offsets.empty()) {
        for (std::int32_t r = 0; r <= total; ++r) s.offsets.push_back(r);
      }
      SCOPED_TRACE(s.name + " used on the " + dsa::logits_path_name(path) + " path");
      VarlenCall call{make_varlen_workload(spec)};
      ASSERT_EQ(call.v.total_rows(), total);
      DSA_ASSERT_OK(plan_varlen(s.lens, s.offsets, s.workers, s.path, ctx, &call.schedule));
      DSA_ASSERT_OK(run_varlen(call, VarlenCase{"stale", spec, path}, ctx));
      EXPECT_TRUE(logits_match(call.v.rows, call.v.reference(), call.logits, Precision::float32, true, kSentinel));
    }
  }
}

TEST_P(VarlenPropertyTest, DeterministicRunToRun) {
  const dsa::ExecContext ctx = cpu_context(GetParam(), 3);
  const VarlenSpec spec{.rows_per_request = {4, 30, 1, 7}, .causal = false, .max_prefix = 700, .seed = 61};
  VarlenCall first{make_varlen_workload(spec)}, second{make_varlen_workload(spec)};
  DSA_ASSERT_OK(run_varlen(first, VarlenCase{"a", spec}, ctx));
  DSA_ASSERT_OK(run_varlen(second, VarlenCase{"b", spec}, ctx));
  EXPECT_TRUE(first.logits.bytes == second.logits.bytes);
}

// The planned schedule against the documented plan: units are row tiles of
// 8 rows of one request (rows on the per-token path) named by their first
// row, items ordered by (unit, chunk), worker w starting at the item that
// weight position floor(w * total / W) names (a unit of n items weighs n + 2
// where it has at most two rows, its first three positions naming its first
// item, else n; position 0 as (0, 0)), trailer (T, 256).
TEST_P(VarlenPropertyTest, ScheduleIsTheDocumentedPlan) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const VarlenSpec spec{.rows_per_request = {3, 0, 19, 8, 1, 0, 12}, .causal = false, .max_prefix = 1200, .seed = 71};
  VarlenWorkload v = make_varlen_workload(spec);
  const std::vector<std::int32_t>& lens = v.rows.context_lens;
  for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    // (unit name, chunk) that every weight position names, written from the contract.
    std::vector<std::pair<std::int32_t, std::int32_t>> items;
    for (std::int64_t b = 0; b < v.requests; ++b) {
      const int tile = path == dsa::LogitsPath::native ? kRowTile : 1;
      for (std::int32_t first = v.request_offsets[b]; first < v.request_offsets[b + 1]; first += tile) {
        const std::int32_t end = std::min(first + tile, v.request_offsets[b + 1]);
        const std::int32_t longest = *std::max_element(lens.begin() + first, lens.begin() + end);
        for (std::int32_t c = 0; c < (longest + 255) / 256; ++c) {
          const int copies = c == 0 && end - first <= 2 ? 3 : 1;
          for (int copy = 0; copy < copies; ++copy) items.emplace_back(first, c);
        }
      }
    }
    for (const int workers : {1, 2, 5, 13, 64}) {
      SCOPED_TRACE(std::string(dsa::logits_path_name(path)) + ", " + std::to_string(workers) + " workers");
      Schedule s;
      DSA_ASSERT_OK(plan_varlen(lens, v.request_offsets, workers, path, ctx, &s));
      const auto total = static_cast<std::int64_t>(items.size());
      for (int w = 0; w < workers; ++w) {
        const std::int64_t first = w * total / workers;
        const std::pair<std::int32_t, std::int32_t> want = first == 0 ? std::make_pair(0, 0) : items[first];
        EXPECT_EQ(s.entries[2 * w], want.first) << "worker " << w;
        EXPECT_EQ(s.entries[2 * w + 1], want.second) << "worker " << w;
      }
      EXPECT_EQ(s.entries[2 * workers], v.total_rows());
      EXPECT_EQ(s.entries[2 * workers + 1], 256);
    }
  }
}

// index_topk with request_offsets is topk of the logits with the same
// request_offsets, positions and physical slots alike.
TEST_P(VarlenPropertyTest, IndexTopkIsTopkOfTheLogits) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const VarlenSpec spec{.rows_per_request = {2, 0, 11, 1, 6}, .causal = false, .max_prefix = 600, .page_tokens = 32,
                        .seed = 81};
  const int k = 40;
  for (const bool physical : {false, true}) {
    for (const dsa::IndexTopkStrategy strategy :
         {dsa::IndexTopkStrategy::fused, dsa::IndexTopkStrategy::logits_then_topk}) {
      SCOPED_TRACE(std::string(physical ? "slots, " : "positions, ") + dsa::index_topk_strategy_name(strategy));
      VarlenCall call{make_varlen_workload(spec)};
      DSA_ASSERT_OK(run_varlen(call, VarlenCase{"logits", spec}, ctx));
      Workload& w = call.v.rows;
      const std::int64_t rows = w.rows();
      OwnedView want = int32_matrix(rows, k, k, -7);
      OwnedView got = int32_matrix(rows, k, k, -7);
      dsa::TopkOptions topk_options;
      topk_options.sorted = true;
      if (physical) {
        topk_options.block_table = call.v.table_view();
        topk_options.request_offsets = call.v.request_offsets_view();
        topk_options.page_size = 32;
      }
      DSA_ASSERT_OK(dsa::topk(call.logits.view, call.v.row_lengths_view(), k, want.view, topk_options, ctx));
      dsa::IndexTopkOptions options;
      options.k = k;
      options.sorted = true;
      options.physical_slots = physical;
      options.strategy = strategy;
      options.page_size = 32;
      options.request_offsets = call.v.request_offsets_view();
      DSA_ASSERT_OK(dsa::index_topk(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(), call.v.row_lengths_view(),
                                    call.v.table_view(), call.schedule.view(), w.max_context_len, dsa::TensorView{},
                                    got.view, options, ctx));
      EXPECT_TRUE(want.bytes == got.bytes);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// ---- Validation -------------------------------------------------------------

::testing::AssertionResult fails_naming(const dsa::Status& s, dsa::ErrorCode code, const std::string& argument) {
  if (s.code() != code) {
    return ::testing::AssertionFailure() << "expected " << dsa::error_code_name(code) << ", got " << s.to_string();
  }
  if (s.message().find(argument) == std::string::npos) {
    return ::testing::AssertionFailure() << "message does not name " << argument << ": " << s.message();
  }
  return ::testing::AssertionSuccess();
}

class VarlenValidationTest : public ::testing::TestWithParam<dsa::Backend> {
 protected:
  VarlenValidationTest() : call(make_varlen_workload(VarlenSpec{.rows_per_request = {2, 0, 5}, .seed = 91})) {}

  dsa::Status score(dsa::TensorView offsets, dsa::TensorView table) {
    Workload& w = call.v.rows;
    call.logits = float_matrix(w.rows(), w.max_context_len, w.max_context_len, kSentinel);
    dsa::LogitsOptions options;
    options.request_offsets = offsets;
    return dsa::paged_mqa_logits(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(), call.v.row_lengths_view(),
                                 table, schedule.view(), w.max_context_len, call.logits.view, options,
                                 cpu_context(GetParam()));
  }
  dsa::Status score(std::vector<std::int32_t>& offsets) {
    return score(view_of(offsets, {static_cast<std::int64_t>(offsets.size())}), call.v.table_view());
  }

  void SetUp() override {
    DSA_ASSERT_OK(plan_varlen(call.v.rows.context_lens, call.v.request_offsets, 2, dsa::LogitsPath::native,
                              cpu_context(GetParam()), &schedule));
  }

  VarlenCall call;
  Schedule schedule;
};

TEST_P(VarlenValidationTest, RequestOffsetsRules) {
  using dsa::ErrorCode;
  DSA_ASSERT_OK(score(call.v.request_offsets));
  std::vector<std::int32_t> first_not_zero{1, 2, 2, 7};
  EXPECT_TRUE(fails_naming(score(first_not_zero), ErrorCode::invalid_argument, "request_offsets"));
  std::vector<std::int32_t> decreasing{0, 3, 2, 7};
  EXPECT_TRUE(fails_naming(score(decreasing), ErrorCode::invalid_argument, "request_offsets"));
  std::vector<std::int32_t> short_of_rows{0, 2, 2, 6};
  EXPECT_TRUE(fails_naming(score(short_of_rows), ErrorCode::invalid_argument, "request_offsets"));
  std::vector<std::int32_t> past_rows{0, 2, 2, 8};
  EXPECT_TRUE(fails_naming(score(past_rows), ErrorCode::invalid_argument, "request_offsets"));
  // B + 1 entries for another B: the block table's rows disagree.
  std::vector<std::int32_t> other_batch{0, 2, 7};
  EXPECT_TRUE(fails_naming(score(other_batch), ErrorCode::bad_shape, "block_table"));
  std::vector<std::int64_t> wide{0, 2, 2, 7};
  EXPECT_TRUE(fails_naming(score(dsa::make_view(wide.data(), dsa::DType::int64, {4}), call.v.table_view()),
                           ErrorCode::bad_dtype, "request_offsets"));
  std::vector<std::int32_t> none;
  none.reserve(1);
  EXPECT_TRUE(fails_naming(score(dsa::make_view(none.data(), dsa::DType::int32, {0}), call.v.table_view()),
                           ErrorCode::bad_shape, "request_offsets"));
  std::vector<std::int32_t> two_d{0, 2, 2, 7};
  EXPECT_TRUE(fails_naming(score(view_of(two_d, {2, 2}), call.v.table_view()), ErrorCode::bad_shape,
                           "request_offsets"));
  std::vector<std::int32_t> spaced{0, -1, 2, -1, 2, -1, 7, -1};
  EXPECT_TRUE(fails_naming(score(dsa::make_view(spaced.data(), dsa::DType::int32, {4}, {2}), call.v.table_view()),
                           ErrorCode::bad_stride, "request_offsets"));
  // Block table with another number of rows than requests.
  const dsa::TensorView table = call.v.table_view();
  EXPECT_TRUE(fails_naming(
      score(call.v.request_offsets_view(), dsa::make_view(table.data, dsa::DType::int32, {2, table.size(1)})),
      ErrorCode::bad_shape, "block_table"));
}

TEST_P(VarlenValidationTest, ShapesOfTheRows) {
  using dsa::ErrorCode;
  Workload& w = call.v.rows;
  const dsa::ExecContext ctx = cpu_context(GetParam());
  call.logits = float_matrix(w.rows(), w.max_context_len, w.max_context_len, kSentinel);
  dsa::LogitsOptions options;
  options.request_offsets = call.v.request_offsets_view();
  const auto run = [&](dsa::TensorView q, dsa::TensorView lens) {
    return dsa::paged_mqa_logits(q, w.cache_view_2d(), w.weights_view(), lens, call.v.table_view(), schedule.view(),
                                 w.max_context_len, call.logits.view, options, ctx);
  };
  const dsa::TensorView q = w.q_fp8_view();
  // q of next_n > 1 with request_offsets.
  EXPECT_TRUE(fails_naming(run(dsa::make_view(q.data, q.dtype, {1, 7, w.heads, w.head_dim}), call.v.row_lengths_view()),
                           ErrorCode::bad_shape, "q"));
  // Lengths [T, 2] or of another T.
  EXPECT_TRUE(fails_naming(run(q, dsa::make_view(w.context_lens.data(), dsa::DType::int32, {3, 2})),
                           ErrorCode::bad_shape, "context_lens"));
  EXPECT_TRUE(fails_naming(run(q, dsa::make_view(w.context_lens.data(), dsa::DType::int32, {6})),
                           ErrorCode::bad_shape, "context_lens"));
  DSA_ASSERT_OK(run(call.v.q_view_3d(), w.context_lens_view()));
}

TEST_P(VarlenValidationTest, PlanScheduleChecksTheOffsets) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  Schedule s;
  EXPECT_TRUE(fails_naming(plan_varlen(call.v.rows.context_lens, {0, 3, 2, 7}, 2, dsa::LogitsPath::native, ctx, &s),
                           dsa::ErrorCode::invalid_argument, "request_offsets"));
  EXPECT_TRUE(fails_naming(plan_varlen(call.v.rows.context_lens, {0, 2, 2, 6}, 2, dsa::LogitsPath::native, ctx, &s),
                           dsa::ErrorCode::invalid_argument, "request_offsets"));
  // A fixed-form schedule used for the rows of uneven requests: the trailer disagrees.
  Schedule fixed;
  DSA_ASSERT_OK(plan({1, 2, 3, 4}, 2, 2, 2, dsa::LogitsPath::native, ctx, &fixed));
  schedule = fixed;
  EXPECT_TRUE(fails_naming(score(call.v.request_offsets), dsa::ErrorCode::schedule_mismatch, "schedule"));
}

TEST_P(VarlenValidationTest, LengthRulesNameTheRow) {
  Workload& w = call.v.rows;
  w.context_lens[4] = static_cast<std::int32_t>(w.max_context_len + 1);
  const dsa::Status s = score(call.v.request_offsets);
  EXPECT_TRUE(fails_naming(s, dsa::ErrorCode::length_out_of_range, "context_lens[4]"));
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenValidationTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// causal_context_lens with request_offsets: row offsets[b] + t gets prefix[b] + t + 1.
class VarlenCausalLensTest : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(VarlenCausalLensTest, RowsOfEachRequest) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  std::vector<std::int32_t> prefix{10, 5, 0, 300};
  std::vector<std::int32_t> offsets{0, 2, 2, 7, 8};
  std::vector<std::int32_t> out(8, -7);
  DSA_ASSERT_OK(dsa::causal_context_lens(view_of(prefix, {4}), 1, view_of(out, {8}), ctx, view_of(offsets, {5})));
  EXPECT_EQ(out, (std::vector<std::int32_t>{11, 12, 1, 2, 3, 4, 5, 301}));
  std::vector<std::int32_t> out_2d(8, -7);
  DSA_ASSERT_OK(dsa::causal_context_lens(view_of(prefix, {4}), 1, view_of(out_2d, {8, 1}), ctx, view_of(offsets, {5})));
  EXPECT_EQ(out_2d, out);

  // The lengths of a prefill chunk of 120 new tokens after 37 committed ones.
  std::vector<std::int32_t> one_prefix{37}, one_request{0, 120}, rows(120, -7);
  DSA_ASSERT_OK(
      dsa::causal_context_lens(view_of(one_prefix, {1}), 1, view_of(rows, {120}), ctx, view_of(one_request, {2})));
  for (int t = 0; t < 120; ++t) EXPECT_EQ(rows[t], 37 + t + 1);
}

TEST_P(VarlenCausalLensTest, Rules) {
  using dsa::ErrorCode;
  const dsa::ExecContext ctx = cpu_context(GetParam());
  std::vector<std::int32_t> prefix{10, 5, 0};
  std::vector<std::int32_t> out(7, -7);
  const auto build = [&](std::vector<std::int32_t> offsets, int next_n, dsa::TensorView out_view) {
    return dsa::causal_context_lens(view_of(prefix, {3}), next_n, out_view, ctx,
                                    view_of(offsets, {static_cast<std::int64_t>(offsets.size())}));
  };
  EXPECT_TRUE(fails_naming(build({0, 2, 2, 7}, 2, view_of(out, {7})), ErrorCode::invalid_argument, "next_n"));
  EXPECT_TRUE(fails_naming(build({0, 2, 7}, 1, view_of(out, {7})), ErrorCode::bad_shape, "prefix_lens"));
  EXPECT_TRUE(fails_naming(build({0, 3, 2, 7}, 1, view_of(out, {7})), ErrorCode::invalid_argument, "request_offsets"));
  EXPECT_TRUE(fails_naming(build({0, 2, 2, 6}, 1, view_of(out, {7})), ErrorCode::invalid_argument, "request_offsets"));
  EXPECT_TRUE(fails_naming(build({0, 2, 2, 7}, 1, view_of(out, {7, 2})), ErrorCode::bad_shape, "out"));
  std::vector<std::int32_t> negative{10, -1, 0};
  std::vector<std::int32_t> offsets{0, 2, 2, 7};
  EXPECT_TRUE(fails_naming(dsa::causal_context_lens(view_of(negative, {3}), 1, view_of(out, {7}), ctx,
                                                    view_of(offsets, {4})),
                           ErrorCode::invalid_argument, "prefix_lens"));
  // Offsets are rejected before anything is written.
  EXPECT_EQ(out, std::vector<std::int32_t>(7, -7));
}

INSTANTIATE_TEST_SUITE_P(Backends, VarlenCausalLensTest, ::testing::ValuesIn(cpu_backends()), backend_label);

}  // namespace
}  // namespace dsa_test
