// The sm_90a logits kernels, selected explicitly with Backend::cuda_hopper,
// against the float64 reference: every native next_n for H = 32 and 64, the
// schedule shapes that stress the kernel's pipeline (many requests per worker,
// one request over many workers, more workers than multiprocessors), output
// layouts, bitwise repeatability, and the data-dependent errors. Skips unless
// device 0 is a compute capability 9.0 GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

// How a case calls paged_mqa_logits.
struct CallShape {
  LogitsPath path = LogitsPath::native;
  DType dtype = DType::float32;
  bool clean = true;
  std::int64_t extra_stride = 0;  // row stride = max_context_len + extra_stride
  int workers = 0;                // 0: the device's multiprocessor count
};

struct HopperRun {
  dsa::Status status;
  std::vector<std::uint8_t> bytes;  // [rows, stride] elements, 0xFF where not written
  std::int64_t stride = 0;
};

// Scores `dw` into a poisoned output with the given schedule.
HopperRun run_with_schedule(const DeviceWorkload& dw, const dsa::TensorView& schedule, const CallShape& call,
                            const dsa::ExecContext& ctx) {
  const Workload& w = *dw.host;
  HopperRun run;
  run.stride = w.max_context_len + call.extra_stride;
  const std::size_t bytes = static_cast<std::size_t>(w.rows() * run.stride) * dsa::dtype_size(call.dtype);
  dsa::DeviceBuffer out = device_filled(std::max<std::size_t>(bytes, 16), 0xFF);
  dsa::LogitsOptions options;
  options.path = call.path;
  options.clean_logits = call.clean;
  run.status = dsa::paged_mqa_logits(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(),
                                     dw.block_table_view(), schedule, w.max_context_len,
                                     device_view(out, call.dtype, {w.rows(), w.max_context_len}, {run.stride, 1}),
                                     options, ctx);
  run.bytes = host_copy<std::uint8_t>(out);
  run.bytes.resize(bytes);
  return run;
}

// Plans a schedule for the workload's own lengths and scores it.
HopperRun run_hopper(const DeviceWorkload& dw, const CallShape& call, const dsa::ExecContext& ctx) {
  const int workers = call.workers > 0 ? call.workers : dsa::default_num_workers(kGpu, ctx);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, workers, call.path, ctx);
  return run_with_schedule(dw, schedule_view(schedule), call, ctx);
}

float logit(const HopperRun& run, std::int64_t row, std::int64_t p) {
  return logit_at(run.bytes, DType::float32, row * run.stride + p);
}

struct HopperCase {
  std::string name;
  WorkloadSpec spec;
  CallShape call;
};

std::vector<HopperCase> hopper_cases() {
  std::vector<HopperCase> cases;
  auto add = [&](std::string name, WorkloadSpec spec, CallShape call = {}) {
    spec.seed = 500 + cases.size();
    cases.push_back(HopperCase{std::move(name), std::move(spec), call});
  };
  WorkloadSpec base;
  base.batch = 3;
  base.max_prefix = 900;
  base.block_table_padding = 1 << 30;  // entries past the needed pages must never be read
  for (int heads : {32, 64}) {
    for (int next_n = 1; next_n <= 8; ++next_n) {
      WorkloadSpec s = base;
      s.heads = heads;
      s.next_n = next_n;
      add("native_n" + std::to_string(next_n) + "_h" + std::to_string(heads), s);
    }
  }
  {
    WorkloadSpec s = base;  // every request boundary inside a worker's range
    s.batch = 40;
    s.next_n = 3;
    s.max_prefix = 300;
    CallShape call;
    call.workers = 3;
    add("many_requests_per_worker", s, call);
  }
  {
    WorkloadSpec s = base;  // the widest unit (8 rows, 64 KiB of queries a slot), query slots reused often
    s.batch = 24;
    s.next_n = 8;
    s.max_prefix = 3000;
    CallShape call;
    call.workers = 4;
    add("n8_many_requests_per_worker", s, call);
  }
  {
    WorkloadSpec s = base;  // one request spread over many workers
    s.batch = 1;
    s.next_n = 4;
    s.min_prefix = 9000;
    s.max_prefix = 9000;
    add("one_long_request", s);
  }
  {
    WorkloadSpec s = base;  // one worker walks > 4096 pages of a request: queries loaded again
    s.batch = 1;
    s.next_n = 2;
    s.min_prefix = 4300 * 64;
    s.max_prefix = 4300 * 64;
    CallShape call;
    call.workers = 1;
    add("one_worker_reloads_queries", s, call);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    CallShape call;
    call.workers = 1000;  // more CTAs than multiprocessors, most with nothing to do
    add("more_workers_than_sms", s, call);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 5;
    s.batch = 2;
    s.context_lens = {0, 1, 63, 64, 65, 700, 129, 0, 3, 128};  // rows of a request differ arbitrarily
    add("per_row_lengths", s);
  }
  {
    WorkloadSpec s = base;
    s.convention = LengthConvention::legacy;
    s.next_n = 3;
    s.prefix_lens = {0, 0, 0};
    add("all_zero_lengths", s);
  }
  {
    WorkloadSpec s = base;
    s.convention = LengthConvention::expanded;
    s.next_n = 6;
    s.share_pages = true;
    add("expanded_shared_pages", s);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 7;
    s.heads = 32;
    CallShape call;
    call.dtype = DType::bfloat16;
    call.extra_stride = 9;
    add("bf16_strided", s, call);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 2;
    CallShape call;
    call.dtype = DType::bfloat16;
    call.clean = false;
    add("bf16_unclean", s, call);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 4;
    s.page_padding_bytes = 48;
    s.power_of_two_scales = true;
    CallShape call;
    call.clean = false;
    call.extra_stride = 37;
    add("padded_pages_unclean_strided", s, call);
  }
  {
    WorkloadSpec s = base;
    s.next_n = 3;
    CallShape call;
    call.path = LogitsPath::per_token;
    add("per_token_n3", s, call);
  }
  {
    WorkloadSpec s = base;  // beyond the native variants: served row by row
    s.next_n = 12;
    s.batch = 2;
    s.max_prefix = 400;
    CallShape call;
    call.path = LogitsPath::per_token;
    add("per_token_n12", s, call);
  }
  {
    WorkloadSpec s = base;
    s.batch = 0;
    add("empty_batch", s);
  }
  for (int heads : {32, 64}) {  // the consumers' scaled epilogue
    WorkloadSpec s = base;
    s.heads = heads;
    s.next_n = heads == 32 ? 1 : 4;
    s.negative_scales = true;
    add("negative_scales_h" + std::to_string(heads), s);
  }
  for (int heads : {32, 64}) {  // products at the edge of the consumers' ReLU range
    WorkloadSpec s = base;
    s.heads = heads;
    s.next_n = heads == 32 ? 2 : 4;
    s.extreme_products = true;
    add("extreme_products_h" + std::to_string(heads), s);
  }
  // Every case again on 32-token pages: a stage holds two of them.
  repeat_on_32_token_pages(cases);
  return cases;
}

class GpuHopperLogits : public ::testing::TestWithParam<HopperCase> {};

TEST_P(GpuHopperLogits, MatchesReferenceAndRepeatsBitwise) {
  DSA_REQUIRE_HOPPER();
  const HopperCase& c = GetParam();
  const Workload w = make_workload(c.spec);
  const DeviceWorkload dw(w);
  GpuContext gpu(Backend::cuda_hopper, 0);
  gpu.ctx.check_device_errors = true;
  const HopperRun first = run_hopper(dw, c.call, gpu.ctx);
  DSA_GPU_ASSERT_OK(first.status);
  EXPECT_TRUE(logits_match(w, w.reference(), first.bytes, c.call.dtype, first.stride, c.call.clean,
                           logits_tolerance(Backend::cuda_hopper)));
  for (int repeat = 0; repeat < 2; ++repeat) {
    const HopperRun again = run_hopper(dw, c.call, gpu.ctx);
    DSA_GPU_ASSERT_OK(again.status);
    // Without clean_logits the positions past a row's length are unspecified.
    for (std::int64_t r = 0; r < w.rows(); ++r) {
      const std::int64_t defined = c.call.clean ? w.max_context_len : w.context_lens[r];
      const std::size_t offset = static_cast<std::size_t>(r * first.stride) * dsa::dtype_size(c.call.dtype);
      ASSERT_EQ(0, std::memcmp(first.bytes.data() + offset, again.bytes.data() + offset,
                               static_cast<std::size_t>(defined) * dsa::dtype_size(c.call.dtype)))
          << "row " << r << " differs on repeat " << repeat;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuHopperLogits, ::testing::ValuesIn(hopper_cases()),
                         [](const ::testing::TestParamInfo<HopperCase>& info) { return info.param.name; });

// The native kernel (one key read for all draft rows) and the per-token one
// compute the same function.
TEST(GpuHopperPaths, NativeAndPerTokenAgree) {
  DSA_REQUIRE_HOPPER();
  for (int heads : {32, 64}) {
    for (int next_n : {2, 5, 8}) {
      WorkloadSpec spec;
      spec.batch = 2;
      spec.next_n = next_n;
      spec.heads = heads;
      spec.max_prefix = 800;
      spec.seed = 70 + next_n + heads;
      const Workload w = make_workload(spec);
      const ReferenceLogits ref = w.reference();
      const DeviceWorkload dw(w);
      GpuContext gpu(Backend::cuda_hopper, 0);
      gpu.ctx.check_device_errors = true;
      for (LogitsPath path : {LogitsPath::native, LogitsPath::per_token}) {
        CallShape call;
        call.path = path;
        const HopperRun run = run_hopper(dw, call, gpu.ctx);
        DSA_GPU_ASSERT_OK(run.status);
        EXPECT_TRUE(logits_match(w, ref, run.bytes, DType::float32, run.stride, true,
                                 logits_tolerance(Backend::cuda_hopper)))
            << "H " << heads << " next_n " << next_n << " " << dsa::logits_path_name(path);
      }
    }
  }
}

TEST(GpuHopperShapes, UnservedShapesAreUnsupported) {
  DSA_REQUIRE_HOPPER();
  for (const auto& [next_n, heads] : {std::pair{9, 64}, std::pair{2, 48}}) {
    WorkloadSpec spec;
    spec.batch = 2;
    spec.next_n = next_n;
    spec.heads = heads;
    spec.max_prefix = 100;
    const Workload w = make_workload(spec);
    const DeviceWorkload dw(w);
    GpuContext gpu(Backend::cuda_hopper, 0);
    const HopperRun run = run_hopper(dw, CallShape{}, gpu.ctx);
    EXPECT_EQ(run.status.code(), dsa::ErrorCode::unsupported) << run.status.to_string();
  }
}

// 32-token pages: cuda_hopper serves them (the logits and the fused
// index_topk), and automatic picks it, bit for bit.
TEST(GpuHopperShapes, Page32OnTheHopperKernels) {
  DSA_REQUIRE_HOPPER();
  const Workload w = make_workload(WorkloadSpec{.batch = 3, .next_n = 2, .max_prefix = 500, .page_tokens = 32,
                                                .seed = 32});
  const DeviceWorkload dw(w);
  GpuContext hopper(Backend::cuda_hopper, 0);
  hopper.ctx.check_device_errors = true;
  GpuContext automatic(Backend::automatic, 0);
  automatic.ctx.check_device_errors = true;
  const HopperRun from_hopper = run_hopper(dw, CallShape{}, hopper.ctx);
  const HopperRun from_automatic = run_hopper(dw, CallShape{}, automatic.ctx);
  DSA_GPU_ASSERT_OK(from_hopper.status);
  DSA_GPU_ASSERT_OK(from_automatic.status);
  EXPECT_TRUE(logits_match(w, w.reference(), from_hopper.bytes, DType::float32, from_hopper.stride, true,
                           logits_tolerance(Backend::cuda_hopper)));
  EXPECT_EQ(from_automatic.bytes, from_hopper.bytes);

  dsa::IndexTopkOptions options;
  options.k = 64;
  options.sorted = true;  // the order of an unsorted selection is the strategy's own
  options.path = LogitsPath::native;
  options.physical_slots = true;
  std::vector<std::vector<std::int32_t>> selections;
  for (auto strategy : {dsa::IndexTopkStrategy::fused, dsa::IndexTopkStrategy::logits_then_topk}) {
    options.strategy = strategy;
    GpuContext gpu(Backend::cuda_hopper,
                   dsa::index_topk_workspace_bytes(w.rows(), w.max_context_len, options, hopper.ctx));
    gpu.ctx.check_device_errors = true;
    const dsa::DeviceBuffer schedule = plan_on_device(dw, workers_for(gpu.ctx), LogitsPath::native, gpu.ctx);
    const dsa::DeviceBuffer indices = device_filled(4 * w.rows() * options.k, 0xFF);
    DSA_GPU_ASSERT_OK(dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(),
                                      dw.block_table_view(), schedule_view(schedule), w.max_context_len,
                                      dw.causal_view(), device_view(indices, DType::int32, {w.rows(), options.k}),
                                      options, gpu.ctx));
    selections.push_back(host_copy<std::int32_t>(indices));
  }
  EXPECT_EQ(selections[0], selections[1]);  // the fused pass selects exactly what the staged one does
}

// ---- Data-dependent errors ------------------------------------------------------

class GpuHopperErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!device_is_sm90()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";
    WorkloadSpec spec;
    spec.batch = 3;
    spec.next_n = 4;
    spec.min_prefix = 300;
    spec.max_prefix = 700;
    spec.seed = 77;
    w_ = make_workload(spec);
  }
  Workload w_;
};

TEST_F(GpuHopperErrors, NeededPageOutOfRangeIsNaNAndReported) {
  for (std::int32_t bad : {-1, static_cast<std::int32_t>(w_.geometry.num_pages)}) {
    Workload w = w_;
    const std::int64_t block = 4;  // the first page of the request's second chunk
    w.block_table[1 * w.max_blocks + block] = bad;
    const DeviceWorkload dw(w);
    GpuContext gpu(Backend::cuda_hopper, 0);
    gpu.ctx.check_device_errors = true;
    const HopperRun run = run_hopper(dw, CallShape{}, gpu.ctx);
    EXPECT_EQ(run.status.code(), dsa::ErrorCode::page_out_of_range) << run.status.to_string();
    const ReferenceLogits ref = w_.reference();
    for (std::int64_t row = 0; row < w.rows(); ++row) {
      for (std::int64_t p = 0; p < w.context_lens[row]; ++p) {
        const float got = logit(run, row, p);
        if (row / w.next_n == 1 && p / 64 == block) {
          ASSERT_TRUE(std::isnan(got)) << "row " << row << " pos " << p;
        } else {
          ASSERT_NEAR(got, ref.value[row * ref.cols + p],
                      logits_tolerance(Backend::cuda_hopper) * ref.magnitude[row * ref.cols + p] + 1e-30)
              << "row " << row << " pos " << p;
        }
      }
    }
  }
}

TEST_F(GpuHopperErrors, LengthBeyondMaxContextIsNaNRow) {
  Workload w = w_;
  const std::int64_t bad_row = 5;
  w.context_lens[bad_row] = static_cast<std::int32_t>(w.max_context_len + 1);
  const DeviceWorkload dw(w);
  GpuContext gpu(Backend::cuda_hopper, 0);
  gpu.ctx.check_device_errors = true;
  CallShape call;
  call.extra_stride = 6;
  const HopperRun run = run_hopper(dw, call, gpu.ctx);
  EXPECT_EQ(run.status.code(), dsa::ErrorCode::length_out_of_range) << run.status.to_string();
  for (std::int64_t p = 0; p < w.max_context_len; ++p) ASSERT_TRUE(std::isnan(logit(run, bad_row, p))) << p;
  for (std::int64_t r = 0; r < w.rows(); ++r)
    for (std::int64_t p = w.max_context_len; p < run.stride; ++p)
      ASSERT_EQ(run.bytes[4 * (r * run.stride + p)], 0xFF) << "row " << r << " column " << p << " was written";
}

TEST_F(GpuHopperErrors, ScheduleForAnotherBatchIsReported) {
  const int workers = 2;
  const std::vector<std::int32_t> entries = {0, 0, 1, 1, static_cast<std::int32_t>(w_.batch + 1), 256};
  const dsa::DeviceBuffer buffer = device_copy(entries);
  const DeviceWorkload dw(w_);
  GpuContext gpu(Backend::cuda_hopper, 0);
  gpu.ctx.check_device_errors = true;
  const HopperRun run =
      run_with_schedule(dw, device_view(buffer, DType::int32, {workers + 1, 2}), CallShape{}, gpu.ctx);
  EXPECT_EQ(run.status.code(), dsa::ErrorCode::schedule_mismatch) << run.status.to_string();
}

}  // namespace
}  // namespace dsa_test::gpu
