// paged_mqa_logits on the CUDA backends against the float64 reference:
// shapes and length edge cases, output layouts, repeatability, path
// agreement, and the data-dependent errors only the device can see.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;
using dsa::LogitsPath;

struct LogitsRun {
  dsa::Status status;
  std::vector<std::uint8_t> bytes;  // [rows, stride] elements, 0xFF where not written
};

// Runs paged_mqa_logits into a poisoned [rows, max_context_len] output whose
// rows are `stride` elements apart.
LogitsRun run_logits(const DeviceWorkload& dw, const dsa::TensorView& schedule, std::int64_t max_context_len,
                     DType dtype, std::int64_t stride, const dsa::LogitsOptions& options,
                     const dsa::ExecContext& ctx) {
  const std::int64_t rows = dw.host->rows();
  const std::size_t bytes = static_cast<std::size_t>(rows * stride) * dsa::dtype_size(dtype);
  dsa::DeviceBuffer out = device_filled(std::max<std::size_t>(bytes, 16), 0xFF);
  const dsa::TensorView logits = device_view(out, dtype, {rows, max_context_len}, {stride, 1});
  LogitsRun run;
  run.status = dsa::paged_mqa_logits(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(),
                                     dw.block_table_view(), schedule, max_context_len, logits, options, ctx);
  run.bytes = host_copy<std::uint8_t>(out);  // waits for the device
  run.bytes.resize(bytes);
  return run;
}

struct LogitsCase {
  std::string name;
  WorkloadSpec spec;
  bool clean = false;
  DType dtype = DType::float32;
  std::int64_t extra_stride = 0;  // row stride = max_context_len + extra_stride
  LogitsPath path = LogitsPath::automatic;
};

std::vector<LogitsCase> logits_cases() {
  std::vector<LogitsCase> cases;
  auto add = [&](std::string name, WorkloadSpec spec) {
    LogitsCase c;
    c.name = std::move(name);
    c.spec = std::move(spec);
    c.spec.seed = 100 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  WorkloadSpec base;
  base.batch = 4;
  base.max_prefix = 700;
  base.block_table_padding = 1 << 30;  // entries past the needed pages must never be read
  for (int next_n = 1; next_n <= 8; ++next_n) {
    for (int heads : {32, 64}) {
      if (next_n > 4 && heads == 32 && next_n % 2 == 1) continue;
      WorkloadSpec s = base;
      s.next_n = next_n;
      s.heads = heads;
      s.batch = next_n <= 4 ? 4 : 2;
      add("causal_n" + std::to_string(next_n) + "_h" + std::to_string(heads), s);
    }
  }
  {
    WorkloadSpec s = base;  // lengths 0, 1, 63, 64, 65 ... through the legacy convention
    s.convention = LengthConvention::legacy;
    s.next_n = 2;
    s.prefix_lens = {0, 1, 2, 3, 64, 65, 66, 129};
    s.batch = 8;
    add("legacy_short_lengths", s);
  }
  {
    WorkloadSpec s = base;
    s.convention = LengthConvention::legacy;
    s.next_n = 3;
    s.prefix_lens = {0, 0, 0};
    s.batch = 3;
    add("all_zero_lengths", s)->clean = true;
  }
  {
    WorkloadSpec s = base;
    s.convention = LengthConvention::expanded;
    s.next_n = 4;
    add("expanded_n4", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    s.share_pages = true;
    s.batch = 5;
    add("shared_pages", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 3;
    s.context_lens = {5, 300, 64, 700, 0, 129};  // rows of one request differ arbitrarily
    s.batch = 2;
    add("per_row_lengths", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    LogitsCase* c = add("clean_strided_f32", s);
    c->clean = true;
    c->extra_stride = 37;
  }
  {
    WorkloadSpec s = base;
    s.next_n = 3;
    LogitsCase* c = add("bf16_clean_strided", s);
    c->clean = true;
    c->dtype = DType::bfloat16;
    c->extra_stride = 9;
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    add("bf16_unclean", s)->dtype = DType::bfloat16;
  }
  {
    WorkloadSpec s = base;
    s.next_n = 3;
    add("per_token_path_n3", s)->path = LogitsPath::per_token;
  }
  {
    WorkloadSpec s = base;
    s.next_n = 4;
    add("native_path_n4", s)->path = LogitsPath::native;
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    s.batch = 2;
    s.min_prefix = 2500;
    s.max_prefix = 3500;
    s.page_padding_bytes = 48;
    s.power_of_two_scales = true;
    add("long_padded_pages_pow2", s);
  }
  {
    WorkloadSpec s = base;  // shapes only the generic kernels serve
    s.next_n = 2;
    s.heads = 3;
    s.head_dim = 32;
    add("h3_d32", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    s.heads = 20;
    s.head_dim = 256;
    s.batch = 2;
    add("h20_d256", s);
  }
  {
    WorkloadSpec s = base;
    s.batch = 0;
    add("empty_batch", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 3;
    s.negative_scales = true;
    add("negative_scales", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    s.extreme_products = true;
    add("extreme_products", s);
  }
  {
    WorkloadSpec s = base;  // lengths ending at, before and after 32-token pages and 64-position tiles
    s.next_n = 1;
    s.context_lens = {0, 1, 2, 31, 32, 33, 63, 64, 65, 95, 96, 97, 255, 256, 257, 700};
    s.batch = 16;
    add("page_and_tile_edges", s)->clean = true;
  }
  // Every case again on 32-token pages (a generic-kernel tile gathers two).
  repeat_on_32_token_pages(cases);
  return cases;
}

class GpuLogits : public ::testing::TestWithParam<std::tuple<Backend, LogitsCase>> {};

TEST_P(GpuLogits, MatchesReferenceAndRepeats) {
  DSA_REQUIRE_GPU();
  const auto& [backend, c] = GetParam();
  const Workload w = make_workload(c.spec);
  const ReferenceLogits ref = w.reference();
  const DeviceWorkload dw(w);
  GpuContext gpu(backend, 0);
  gpu.ctx.check_device_errors = true;
  const LogitsPath path = dsa::resolve_logits_path(c.path, w.next_n, w.heads, kGpu, gpu.ctx);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, workers_for(gpu.ctx), path, gpu.ctx);
  dsa::LogitsOptions options;
  options.clean_logits = c.clean;
  options.path = path;
  const std::int64_t stride = w.max_context_len + c.extra_stride;

  const LogitsRun first = run_logits(dw, schedule_view(schedule), w.max_context_len, c.dtype, stride, options, gpu.ctx);
  DSA_GPU_ASSERT_OK(first.status);
  EXPECT_TRUE(logits_match(w, ref, first.bytes, c.dtype, stride, c.clean, logits_tolerance(backend)));

  gpu.ctx.check_device_errors = false;
  for (int repeat = 0; repeat < 2; ++repeat) {
    const LogitsRun again = run_logits(dw, schedule_view(schedule), w.max_context_len, c.dtype, stride, options, gpu.ctx);
    DSA_GPU_ASSERT_OK(again.status);
    DSA_GPU_ASSERT_OK(dsa::read_device_error(gpu.ctx));
    // Positions past the lengths are unspecified without clean_logits, so
    // compare only what the contract defines (and the untouched padding).
    for (std::int64_t r = 0; r < w.rows(); ++r) {
      const std::int64_t defined = c.clean ? w.max_context_len : w.context_lens[r];
      const std::size_t row_bytes = dsa::dtype_size(c.dtype);
      ASSERT_EQ(0, std::memcmp(first.bytes.data() + r * stride * row_bytes,
                               again.bytes.data() + r * stride * row_bytes, defined * row_bytes))
          << "row " << r << " differs on repeat " << repeat;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuLogits,
    ::testing::Combine(::testing::Values(Backend::cuda_generic, Backend::automatic), ::testing::ValuesIn(logits_cases())),
    [](const ::testing::TestParamInfo<GpuLogits::ParamType>& info) {
      return backend_tag(std::get<0>(info.param)) + "_" + std::get<1>(info.param).name;
    });

// The generic kernels reduce every (row, position) in the same order on both
// paths, so they agree bit for bit; other backends agree within rounding.
TEST(GpuLogitsPaths, NativeAndPerTokenAgree) {
  DSA_REQUIRE_GPU();
  for (Backend backend : {Backend::cuda_generic, Backend::automatic}) {
    for (int next_n : {2, 3, 4, 8}) {
      WorkloadSpec spec;
      spec.batch = 3;
      spec.next_n = next_n;
      spec.max_prefix = 900;
      spec.page_tokens = next_n % 2 == 0 ? 32 : 64;
      spec.seed = 7 + next_n;
      const Workload w = make_workload(spec);
      const ReferenceLogits ref = w.reference();
      const DeviceWorkload dw(w);
      GpuContext gpu(backend, 0);
      gpu.ctx.check_device_errors = true;
      std::vector<std::vector<std::uint8_t>> outputs;
      for (LogitsPath path : {LogitsPath::native, LogitsPath::per_token}) {
        dsa::LogitsOptions options;
        options.path = path;
        options.clean_logits = true;
        const dsa::DeviceBuffer schedule = plan_on_device(dw, workers_for(gpu.ctx), path, gpu.ctx);
        const LogitsRun run = run_logits(dw, schedule_view(schedule), w.max_context_len, DType::float32,
                                         w.max_context_len, options, gpu.ctx);
        if (backend == Backend::automatic && run.status.code() == dsa::ErrorCode::unsupported) continue;
        DSA_GPU_ASSERT_OK(run.status);
        EXPECT_TRUE(logits_match(w, ref, run.bytes, DType::float32, w.max_context_len, true,
                                 logits_tolerance(backend)))
            << backend_tag(backend) << " next_n " << next_n << " " << dsa::logits_path_name(path);
        outputs.push_back(run.bytes);
      }
      if (backend == Backend::cuda_generic) {
        ASSERT_EQ(outputs.size(), 2u);
        EXPECT_EQ(outputs[0], outputs[1]) << "next_n " << next_n;
      }
    }
  }
}

// ---- Data-dependent errors --------------------------------------------------

class GpuLogitsErrors : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (dsa::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device available";
    WorkloadSpec spec;
    spec.batch = 3;
    spec.next_n = 2;
    spec.min_prefix = 100;
    spec.max_prefix = 400;
    spec.seed = 31;
    w_ = make_workload(spec);
  }

  // Runs with and without check_device_errors and returns the reported code
  // (both ways must agree); `bytes` receives the output of the checked run.
  dsa::ErrorCode run_both_ways(const Workload& w, const dsa::TensorView* schedule_override,
                               std::vector<std::uint8_t>* bytes, std::int64_t stride) {
    const DeviceWorkload dw(w);
    GpuContext gpu(GetParam(), 0);
    const LogitsPath path = dsa::resolve_logits_path(LogitsPath::automatic, w.next_n, w.heads, kGpu, gpu.ctx);
    const dsa::DeviceBuffer planned = plan_on_device(dw, workers_for(gpu.ctx), path, gpu.ctx);
    const dsa::TensorView schedule = schedule_override ? *schedule_override : schedule_view(planned);
    dsa::LogitsOptions options;
    options.path = path;

    gpu.ctx.check_device_errors = true;
    const LogitsRun checked = run_logits(dw, schedule, w.max_context_len, DType::float32, stride, options, gpu.ctx);
    gpu.ctx.check_device_errors = false;
    const LogitsRun unchecked = run_logits(dw, schedule, w.max_context_len, DType::float32, stride, options, gpu.ctx);
    EXPECT_TRUE(unchecked.status.ok()) << unchecked.status.to_string();
    const dsa::Status later = dsa::read_device_error(gpu.ctx);
    EXPECT_EQ(later.code(), checked.status.code()) << later.to_string() << " vs " << checked.status.to_string();
    EXPECT_FALSE(checked.status.message().empty() && !checked.status.ok());
    *bytes = checked.bytes;
    return checked.status.code();
  }

  Workload w_;
};

float logit_of(const std::vector<std::uint8_t>& bytes, std::int64_t stride, std::int64_t row, std::int64_t p) {
  return logit_at(bytes, DType::float32, row * stride + p);
}

TEST_P(GpuLogitsErrors, NeededPageOutOfRange) {
  for (std::int32_t bad : {-1, static_cast<std::int32_t>(w_.geometry.num_pages), 1 << 30}) {
    Workload w = w_;
    w.block_table[1 * w.max_blocks + 1] = bad;  // request 1 needs >= 2 pages (prefix >= 100)
    std::vector<std::uint8_t> bytes;
    EXPECT_EQ(run_both_ways(w, nullptr, &bytes, w.max_context_len), dsa::ErrorCode::page_out_of_range) << bad;
    for (int j = 0; j < w.next_n; ++j) {
      const std::int64_t row = 1 * w.next_n + j;
      for (std::int64_t p = 64; p < std::min<std::int64_t>(128, w.context_lens[row]); ++p) {
        ASSERT_TRUE(std::isnan(logit_of(bytes, w.max_context_len, row, p))) << "row " << row << " pos " << p;
      }
    }
    // Requests with valid pages are still scored.
    const ReferenceLogits ref = w_.reference();
    const std::int64_t row = 0;
    for (std::int64_t p = 0; p < w.context_lens[row]; ++p) {
      const double want = ref.value[row * ref.cols + p];
      ASSERT_NEAR(logit_of(bytes, w.max_context_len, row, p), want,
                  logits_tolerance(GetParam()) * ref.magnitude[row * ref.cols + p] + 1e-30);
    }
  }
}

TEST_P(GpuLogitsErrors, LengthBeyondBlockTable) {
  Workload w = w_;
  const std::int32_t too_long = static_cast<std::int32_t>(w.max_blocks * 64 + 1);
  w.context_lens[3] = too_long;
  w.max_context_len = too_long + 10;
  const std::int64_t stride = w.max_context_len + 8;
  std::vector<std::uint8_t> bytes;
  EXPECT_EQ(run_both_ways(w, nullptr, &bytes, stride), dsa::ErrorCode::length_out_of_range);
  for (std::int64_t p = 0; p < w.max_context_len; ++p) ASSERT_TRUE(std::isnan(logit_of(bytes, stride, 3, p))) << p;
  for (std::int64_t r = 0; r < w.rows(); ++r)
    for (std::int64_t p = w.max_context_len; p < stride; ++p)
      ASSERT_EQ(bytes[4 * (r * stride + p)], 0xFF) << "row " << r << " padding column " << p << " was written";
}

TEST_P(GpuLogitsErrors, LengthBeyondMaxContext) {
  Workload w = w_;
  w.context_lens[2] = static_cast<std::int32_t>(w.max_context_len + 1);
  const std::int64_t stride = w.max_context_len + 4;
  std::vector<std::uint8_t> bytes;
  EXPECT_EQ(run_both_ways(w, nullptr, &bytes, stride), dsa::ErrorCode::length_out_of_range);
  for (std::int64_t r = 0; r < w.rows(); ++r)
    for (std::int64_t p = w.max_context_len; p < stride; ++p)
      ASSERT_EQ(bytes[4 * (r * stride + p)], 0xFF) << "row " << r << " column " << p << " was written";
}

TEST_P(GpuLogitsErrors, ScheduleForAnotherBatchOrNotMonotone) {
  const int workers = 4;
  const std::vector<std::vector<std::int32_t>> schedules = {
      {0, 0, 1, 0, 2, 0, 2, 1, static_cast<std::int32_t>(w_.batch + 2), 256},  // trailer of another batch
      {0, 0, 2, 0, 1, 0, 2, 1, static_cast<std::int32_t>(w_.batch), 256},      // not monotone
      {0, 0, 1, 0, 2, 0, 2, 1, static_cast<std::int32_t>(w_.batch), 64},       // another chunk size
  };
  for (const auto& entries : schedules) {
    const dsa::DeviceBuffer buffer = device_copy(entries);
    const dsa::TensorView view = device_view(buffer, DType::int32, {workers + 1, 2});
    std::vector<std::uint8_t> bytes;
    EXPECT_EQ(run_both_ways(w_, &view, &bytes, w_.max_context_len), dsa::ErrorCode::schedule_mismatch);
  }
}

// A schedule planned for other lengths and another worker count is still
// correct, only less balanced.
TEST_P(GpuLogitsErrors, StaleScheduleStillCovers) {
  WorkloadSpec other;
  other.batch = w_.batch;
  other.next_n = w_.next_n;
  other.min_prefix = 0;
  other.max_prefix = 5;
  other.seed = 99;
  const Workload stale = make_workload(other);
  const DeviceWorkload stale_device(stale);
  GpuContext gpu(GetParam(), 0);
  const LogitsPath path = dsa::resolve_logits_path(LogitsPath::automatic, w_.next_n, w_.heads, kGpu, gpu.ctx);
  const dsa::DeviceBuffer schedule = plan_on_device(stale_device, 7, path, gpu.ctx);
  const dsa::TensorView view = schedule_view(schedule);
  std::vector<std::uint8_t> bytes;
  EXPECT_EQ(run_both_ways(w_, &view, &bytes, w_.max_context_len), dsa::ErrorCode::ok);
  EXPECT_TRUE(logits_match(w_, w_.reference(), bytes, DType::float32, w_.max_context_len, false,
                           logits_tolerance(GetParam())));
}

// 32-token pages: a refused entry turns only its own page's positions into
// NaN, whichever half of a generic-kernel tile it fills; the other half and
// every other page are scored.
TEST_P(GpuLogitsErrors, Page32NeededPageOutOfRangeInEitherHalfOfATile) {
  const Workload base = make_workload(WorkloadSpec{.batch = 3, .next_n = 2, .min_prefix = 200, .max_prefix = 400,
                                                   .block_table_padding = 1 << 30, .page_tokens = 32, .seed = 32});
  const ReferenceLogits ref = base.reference();
  for (const std::int64_t column : {2, 3}) {  // positions 64..95 and 96..127: the halves of the second tile
    for (const std::int32_t bad : {-1, static_cast<std::int32_t>(base.geometry.num_pages)}) {
      SCOPED_TRACE("column " + std::to_string(column) + " entry " + std::to_string(bad));
      Workload w = base;
      w.block_table[1 * w.max_blocks + column] = bad;
      std::vector<std::uint8_t> bytes;
      EXPECT_EQ(run_both_ways(w, nullptr, &bytes, w.max_context_len), dsa::ErrorCode::page_out_of_range);
      for (std::int64_t row = 0; row < w.rows(); ++row) {
        for (std::int64_t p = 0; p < w.context_lens[row]; ++p) {
          const float got = logit_of(bytes, w.max_context_len, row, p);
          if (row / w.next_n == 1 && p / 32 == column) {
            ASSERT_TRUE(std::isnan(got)) << "row " << row << " pos " << p;
          } else {
            ASSERT_NEAR(got, ref.value[row * ref.cols + p],
                        logits_tolerance(GetParam()) * ref.magnitude[row * ref.cols + p] + 1e-30)
                << "row " << row << " pos " << p;
          }
        }
      }
    }
  }
}

TEST_P(GpuLogitsErrors, Page32LengthBeyondBlockTable) {
  Workload w = make_workload(WorkloadSpec{.batch = 3, .next_n = 2, .max_prefix = 300, .page_tokens = 32, .seed = 33});
  const std::int32_t too_long = static_cast<std::int32_t>(w.max_blocks * 32 + 1);  // fits 64-token pages
  w.context_lens[3] = too_long;
  w.max_context_len = too_long + 10;
  std::vector<std::uint8_t> bytes;
  EXPECT_EQ(run_both_ways(w, nullptr, &bytes, w.max_context_len), dsa::ErrorCode::length_out_of_range);
  for (std::int64_t p = 0; p < w.max_context_len; ++p) {
    ASSERT_TRUE(std::isnan(logit_of(bytes, w.max_context_len, 3, p))) << p;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuLogitsErrors, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) { return backend_tag(info.param); });

}  // namespace
}  // namespace dsa_test::gpu
