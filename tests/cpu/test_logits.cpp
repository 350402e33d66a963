// paged_mqa_logits on the CPU backends against the float64 reference.
#include <gtest/gtest.h>

#include <climits>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

constexpr float kSentinel = 8192.0f;  // exact in float32 and bfloat16

struct LogitsCase {
  std::string name;
  WorkloadSpec spec;
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
  bool view_4d = false;
  std::int64_t q_pad_bytes = 0;     // extra bytes after every q head vector
  std::int64_t logits_pad_cols = 0;  // row stride = max_context_len + this
  bool clean = true;
  bool bf16_out = false;
  bool float64 = false;
  // Dimensions of extent 1 (of q, and the page dimension of a one-page cache)
  // given stride 1, as PyTorch's DLPack export gives them: never stepped over.
  bool unit_strides_of_extent_one = false;
  // options.page_size states the page size even where the view tells it (a
  // 4-D view) or the default is right (64); otherwise it is 0 there.
  bool explicit_page_size = false;
};

// The page_size option of a case: what its view needs, or the page size itself.
int page_size_option(const LogitsCase& c) {
  const int page_tokens = c.spec.page_tokens;
  const bool view_tells = c.view_4d || page_tokens == dsa::kDefaultPageTokens;
  return c.explicit_page_size || !view_tells ? page_tokens : 0;
}

// Everything one scoring call needs, kept alive together.
struct LogitsCall {
  explicit LogitsCall(Workload w) : workload(std::move(w)) {}
  Workload workload;
  OwnedView strided_q;
  OwnedView logits;
  Schedule schedule;
};

OwnedView output_for(const Workload& w, const LogitsCase& c) {
  const std::int64_t stride = w.max_context_len + c.logits_pad_cols;
  if (c.bf16_out) return bf16_matrix(w.rows(), w.max_context_len, stride, bf16_encode(kSentinel));
  return float_matrix(w.rows(), w.max_context_len, stride, kSentinel);
}

// Runs the case with `schedule` (planned here for the actual lengths when it is empty).
dsa::Status run_case(LogitsCall& call, const LogitsCase& c, const dsa::ExecContext& ctx) {
  Workload& w = call.workload;
  call.logits = output_for(w, c);
  if (call.schedule.entries.empty()) {
    const dsa::Status planned =
        plan(w.context_lens, w.batch, w.next_n, dsa::default_num_workers(dsa::Device{}, ctx),
             resolved_path(c.path, w.next_n, w.heads, ctx), ctx, &call.schedule);
    if (!planned.ok()) return planned;
  }
  dsa::TensorView q = w.q_fp8_view();
  if (c.q_pad_bytes > 0) {
    call.strided_q = w.strided_q_fp8(c.q_pad_bytes);
    q = call.strided_q.view;
  }
  dsa::TensorView cache = c.view_4d ? w.cache_view_4d() : w.cache_view_2d();
  if (c.unit_strides_of_extent_one) {
    for (dsa::TensorView* view : {&q, &cache}) {
      for (int d = 0; d < view->ndim; ++d) {
        if (view->size(d) == 1) view->strides[static_cast<std::size_t>(d)] = 1;
      }
    }
  }
  dsa::LogitsOptions options;
  options.clean_logits = c.clean;
  options.path = c.path;
  options.page_size = page_size_option(c);
  return dsa::paged_mqa_logits(q, cache, w.weights_view(), w.context_lens_view(), w.block_table_view(),
                               call.schedule.view(), w.max_context_len, call.logits.view, options, ctx);
}

Precision precision_of(const LogitsCase& c, dsa::Backend backend) {
  if (c.bf16_out) return Precision::bfloat16;
  return c.float64 && backend == dsa::Backend::cpu_reference ? Precision::float64 : Precision::float32;
}

std::vector<LogitsCase> logits_cases() {
  std::vector<LogitsCase> cases;
  auto add = [&](std::string name, WorkloadSpec spec) -> LogitsCase& {
    spec.seed = cases.size() + 101;
    cases.push_back(LogitsCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  add("decode_h64", WorkloadSpec{.batch = 3, .next_n = 1});
  add("decode_h32", WorkloadSpec{.batch = 3, .next_n = 1, .heads = 32});
  for (int n = 2; n <= 8; ++n) add("causal_next_n" + std::to_string(n), WorkloadSpec{.batch = 2, .next_n = n, .max_prefix = 400});
  add("expanded_next_n3", WorkloadSpec{.batch = 3, .next_n = 3, .convention = LengthConvention::expanded});
  add("legacy_next_n4_short", WorkloadSpec{.batch = 4, .next_n = 4, .convention = LengthConvention::legacy,
                                           .max_prefix = 10});
  add("legacy_next_n2", WorkloadSpec{.batch = 3, .next_n = 2, .convention = LengthConvention::legacy,
                                     .max_prefix = 700});
  add("edge_lengths", WorkloadSpec{.batch = 13, .next_n = 1,
                                   .context_lens = {0, 1, 2, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1000}});
  add("ragged_rows", WorkloadSpec{.batch = 3, .next_n = 3, .context_lens = {5, 300, 64, 0, 0, 0, 700, 1, 256}});
  add("all_zero_lengths", WorkloadSpec{.batch = 3, .next_n = 2, .context_lens = {0, 0, 0, 0, 0, 0},
                                       .extra_context = 0})
      .logits_pad_cols = 3;
  add("empty_batch", WorkloadSpec{.batch = 0, .next_n = 2});
  add("shared_pages", WorkloadSpec{.batch = 5, .next_n = 2, .min_prefix = 100, .max_prefix = 600,
                                   .share_pages = true});
  add("view_4d", WorkloadSpec{.batch = 3, .next_n = 2}).view_4d = true;
  add("view_4d_padded_pages", WorkloadSpec{.batch = 3, .next_n = 2, .page_padding_bytes = 64}).view_4d = true;
  add("view_2d_padded_pages", WorkloadSpec{.batch = 3, .next_n = 2, .page_padding_bytes = 48});
  {
    LogitsCase& c = add("strided_q_and_logits", WorkloadSpec{.batch = 3, .next_n = 3});
    c.q_pad_bytes = 16;
    c.logits_pad_cols = 37;
  }
  add("garbage_block_table_padding", WorkloadSpec{.batch = 3, .next_n = 2, .padding_columns = 5,
                                                  .block_table_padding = INT_MAX});
  add("unclean", WorkloadSpec{.batch = 3, .next_n = 2}).clean = false;
  add("bf16_logits", WorkloadSpec{.batch = 3, .next_n = 2}).bf16_out = true;
  add("bf16_logits_unclean", WorkloadSpec{.batch = 2, .next_n = 1}).bf16_out = true;
  cases.back().clean = false;
  add("float64", WorkloadSpec{.batch = 3, .next_n = 3}).float64 = true;
  add("power_of_two_scales", WorkloadSpec{.batch = 3, .next_n = 2, .power_of_two_scales = true});
  add("native_next_n4", WorkloadSpec{.batch = 2, .next_n = 4}).path = dsa::LogitsPath::native;
  add("per_token_next_n4", WorkloadSpec{.batch = 2, .next_n = 4}).path = dsa::LogitsPath::per_token;
  add("per_token_expanded", WorkloadSpec{.batch = 2, .next_n = 3, .convention = LengthConvention::expanded})
      .path = dsa::LogitsPath::per_token;
  add("small_heads_d64", WorkloadSpec{.batch = 3, .next_n = 2, .heads = 8, .head_dim = 64});
  add("long_context", WorkloadSpec{.batch = 2, .next_n = 4, .min_prefix = 2000, .max_prefix = 3000});
  add("many_requests", WorkloadSpec{.batch = 40, .next_n = 1, .heads = 32, .max_prefix = 200});
  add("negative_scales", WorkloadSpec{.batch = 3, .next_n = 2, .negative_scales = true});
  add("extreme_products", WorkloadSpec{.batch = 3, .next_n = 2, .extreme_products = true});
  add("unit_strides_decode_one_page", WorkloadSpec{.batch = 1, .next_n = 1, .max_prefix = 60, .extra_pages = 0})
      .unit_strides_of_extent_one = true;
  add("unit_strides_one_head", WorkloadSpec{.batch = 2, .next_n = 3, .heads = 1})
      .unit_strides_of_extent_one = true;
  // Heads beyond the threaded path's groups of four, and a head dim under 128.
  add("seven_heads_d48", WorkloadSpec{.batch = 3, .next_n = 2, .heads = 7, .head_dim = 48});

  // Every next_n at both head counts, with bf16 and fp32 logits, clean or
  // not, and block-table entries past ceil(L / P) holding -1 or garbage.
  for (int n = 1; n <= 8; ++n) {
    for (const int heads : {32, 64}) {
      const bool bf16 = (n + heads / 32) % 2 == 1;
      const bool clean = n % 3 != 0;
      LogitsCase& c = add("next_n" + std::to_string(n) + "_h" + std::to_string(heads) + (bf16 ? "_bf16" : "_fp32") +
                              (clean ? "_clean" : ""),
                          WorkloadSpec{.batch = 3, .next_n = n, .heads = heads, .max_prefix = 420,
                                       .block_table_padding = n % 2 == 0 ? -1 : INT_MAX});
      c.bf16_out = bf16;
      c.clean = clean;
    }
  }
  // Lengths that end at, before and after 32-token pages and 64-token tiles,
  // and the page size stated where the view tells it or 64 is the default.
  add("page_edge_lengths",
      WorkloadSpec{.batch = 16, .next_n = 1,
                   .context_lens = {0, 1, 2, 31, 32, 33, 63, 64, 65, 95, 96, 97, 255, 256, 257, 1000}});
  {
    LogitsCase& c = add("view_4d_page_size_stated", WorkloadSpec{.batch = 3, .next_n = 2, .page_padding_bytes = 32});
    c.view_4d = true;
    c.explicit_page_size = true;
  }
  add("view_2d_page_size_stated", WorkloadSpec{.batch = 2, .next_n = 3}).explicit_page_size = true;
  // Every case so far again on 32-token pages.
  repeat_on_32_token_pages(cases);
  return cases;
}

void PrintTo(const LogitsCase& c, std::ostream* os) { *os << c.name; }

class LogitsTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, LogitsCase>> {};

TEST_P(LogitsTest, MatchesReference) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend, 2, c.float64);
  LogitsCall call{make_workload(c.spec)};
  DSA_ASSERT_OK(run_case(call, c, ctx));
  EXPECT_TRUE(logits_match(call.workload, call.workload.reference(), call.logits, precision_of(c, backend),
                           c.clean, kSentinel));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, LogitsTest, ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(logits_cases())),
    [](const ::testing::TestParamInfo<LogitsTest::ParamType>& info) {
      return std::get<1>(info.param).name + "_" +
             backend_label({std::get<0>(info.param), info.index});
    });

class LogitsPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

// Bytes of the defined region (valid positions and the cleaned tail) of every row.
std::vector<std::uint8_t> defined_bytes(const LogitsCall& call) {
  const Workload& w = call.workload;
  const std::size_t element = dsa::dtype_size(call.logits.view.dtype);
  const std::size_t row_bytes = static_cast<std::size_t>(w.max_context_len) * element;
  std::vector<std::uint8_t> out;
  for (std::int64_t r = 0; r < w.rows(); ++r) {
    const std::uint8_t* row = call.logits.bytes.data() + r * call.logits.view.stride(0) * element;
    out.insert(out.end(), row, row + row_bytes);
  }
  return out;
}

TEST_P(LogitsPropertyTest, NativeAndPerTokenPathsAgreeBitwise) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  for (int next_n = 1; next_n <= 8; ++next_n) {
    for (const bool bf16_out : {false, true}) {
      const int page_tokens = (next_n + bf16_out) % 2 == 0 ? 64 : 32;
      SCOPED_TRACE("next_n " + std::to_string(next_n) + (bf16_out ? " bf16" : " fp32") + ", pages of " +
                   std::to_string(page_tokens));
      const WorkloadSpec spec{.batch = 3, .next_n = next_n, .max_prefix = 350, .page_tokens = page_tokens,
                              .seed = static_cast<std::uint64_t>(next_n * 7 + bf16_out)};
      LogitsCase native{"native", spec, dsa::LogitsPath::native};
      LogitsCase per_token{"per_token", spec, dsa::LogitsPath::per_token};
      native.bf16_out = per_token.bf16_out = bf16_out;
      LogitsCall a{make_workload(spec)}, b{make_workload(spec)};
      DSA_ASSERT_OK(run_case(a, native, ctx));
      DSA_ASSERT_OK(run_case(b, per_token, ctx));
      EXPECT_TRUE(defined_bytes(a) == defined_bytes(b));
      if (!bf16_out) {
        EXPECT_TRUE(logits_match(a.workload, a.workload.reference(), a.logits, Precision::float32, true, kSentinel));
      }
    }
  }
}

TEST_P(LogitsPropertyTest, DeterministicRunToRun) {
  const dsa::ExecContext ctx = cpu_context(GetParam(), 3);
  for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    const WorkloadSpec spec{.batch = 4, .next_n = 3, .max_prefix = 900, .seed = 77};
    const LogitsCase c{"determinism", spec, path};
    LogitsCall first{make_workload(spec)}, second{make_workload(spec)};
    DSA_ASSERT_OK(run_case(first, c, ctx));
    DSA_ASSERT_OK(run_case(second, c, ctx));
    EXPECT_TRUE(first.logits.bytes == second.logits.bytes) << dsa::logits_path_name(path);
  }
}

// Schedules planned for other lengths or worker counts still cover everything.
TEST_P(LogitsPropertyTest, StaleSchedulesGiveCorrectLogits) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const WorkloadSpec spec{.batch = 4, .next_n = 3, .context_lens = {300, 301, 302, 5, 6, 7, 700, 701, 702, 64, 65, 66},
                          .seed = 5};
  struct Stale {
    std::string name;
    std::vector<std::int32_t> planned_lens;
    int workers;
  };
  const std::vector<Stale> stale{
      {"all_zero", std::vector<std::int32_t>(12, 0), 4},
      {"leading_zeros", {0, 0, 0, 0, 0, 0, 900, 900, 900, 300, 300, 300}, 3},
      {"longer", std::vector<std::int32_t>(12, 2000), 5},
      {"shorter", std::vector<std::int32_t>(12, 1), 2},
      {"one_worker", spec.context_lens, 1},
      {"many_workers", spec.context_lens, 300},
  };
  for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
    for (const Stale& s : stale) {
      SCOPED_TRACE(s.name + " " + dsa::logits_path_name(path));
      const LogitsCase c{"stale", spec, path};
      LogitsCall call{make_workload(spec)};
      DSA_ASSERT_OK(plan(s.planned_lens, 4, 3, s.workers, path, ctx, &call.schedule));
      DSA_ASSERT_OK(run_case(call, c, ctx));
      EXPECT_TRUE(logits_match(call.workload, call.workload.reference(), call.logits, Precision::float32, true,
                               kSentinel));
    }
  }
}

TEST_P(LogitsPropertyTest, AnyThreadCountMatchesReference) {
  const WorkloadSpec spec{.batch = 5, .next_n = 2, .max_prefix = 600, .seed = 9};
  const LogitsCase c{"threads", spec};
  LogitsCall first{make_workload(spec)};
  const ReferenceLogits ref = first.workload.reference();
  for (const int threads : {1, 2, 5, 0}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    LogitsCall call{make_workload(spec)};
    DSA_ASSERT_OK(run_case(call, c, cpu_context(GetParam(), threads)));
    EXPECT_TRUE(logits_match(call.workload, ref, call.logits, Precision::float32, true, kSentinel));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, LogitsPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

}  // namespace
}  // namespace dsa_test
