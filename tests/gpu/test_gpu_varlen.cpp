// Requests of uneven row counts (request_offsets) on CUDA: the generic
// kernels against the float64 reference, the device planner against the
// host one, index_topk, the rules recorded on the device, and a captured
// graph replayed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;
using dsa::LogitsPath;

struct VarlenRun {
  dsa::Status status;
  std::vector<std::uint8_t> bytes;  // [T, stride], 0xFF where not written
};

VarlenRun run_varlen(const DeviceVarlen& dv, const dsa::DeviceBuffer& schedule, DType dtype, bool clean,
                     LogitsPath path, const dsa::ExecContext& ctx) {
  const std::int64_t rows = dv.total_rows();
  const std::int64_t stride = dv.host->rows.max_context_len;
  const std::size_t bytes = static_cast<std::size_t>(rows * stride) * dsa::dtype_size(dtype);
  dsa::DeviceBuffer out = device_filled(std::max<std::size_t>(bytes, 16), 0xFF);
  dsa::LogitsOptions options;
  options.clean_logits = clean;
  options.path = path;
  options.request_offsets = dv.offsets_view();
  VarlenRun run;
  run.status = dsa::paged_mqa_logits(dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), dv.lens_view(),
                                     dv.table_view(), schedule_view(schedule), stride,
                                     device_view(out, dtype, {rows, stride}), options, ctx);
  run.bytes = host_copy<std::uint8_t>(out);
  run.bytes.resize(bytes);
  return run;
}

struct VarlenCase {
  std::string name;
  VarlenSpec spec;
  DType dtype = DType::float32;
  bool clean = true;
  LogitsPath path = LogitsPath::automatic;
  int workers = 0;  // 0: one per multiprocessor
};

void PrintTo(const VarlenCase& c, std::ostream* os) { *os << c.name; }

std::vector<VarlenCase> varlen_cases() {
  std::vector<VarlenCase> cases;
  auto add = [&](std::string name, VarlenSpec spec) -> VarlenCase& {
    spec.seed = 700 + cases.size();
    cases.push_back(VarlenCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  add("rows_1_to_4", VarlenSpec{.rows_per_request = {1, 4, 2, 3, 1, 4, 2}, .heads = 64, .max_prefix = 900});
  add("rows_1_to_8_any_order", VarlenSpec{.rows_per_request = {8, 1, 5, 7, 3, 2}, .heads = 32, .causal = false,
                                          .max_prefix = 1200});
  add("prefill_among_decodes", VarlenSpec{.rows_per_request = {1, 133, 2, 0, 6}, .heads = 64, .max_prefix = 800});
  // A long request first empty, rows in any order, few workers: each walks many row tiles.
  add("long_request_sixteen_workers", VarlenSpec{.rows_per_request = {0, 130, 2, 0, 5}, .heads = 64, .causal = false,
                                                 .max_prefix = 3000})
      .workers = 16;
  add("empty_requests", VarlenSpec{.rows_per_request = {0, 3, 0, 0, 9, 0}, .causal = false});
  add("all_requests_empty", VarlenSpec{.rows_per_request = {0, 0}});
  add("bf16_unclean", VarlenSpec{.rows_per_request = {2, 7, 1, 12}, .causal = false}).dtype = DType::bfloat16;
  cases.back().clean = false;
  add("per_token", VarlenSpec{.rows_per_request = {3, 10, 1}, .causal = false}).path = LogitsPath::per_token;
  // Every case again on 32-token pages.
  repeat_on_32_token_pages(cases);
  return cases;
}

class GpuVarlen : public ::testing::TestWithParam<std::tuple<Backend, VarlenCase>> {};

TEST_P(GpuVarlen, MatchesReferenceAndTheHostPlan) {
  DSA_REQUIRE_GPU();
  const auto& [backend, c] = GetParam();
  const VarlenWorkload v = make_varlen_workload(c.spec);
  const DeviceVarlen dv(v);
  GpuContext gpu(backend, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  gpu.ctx.check_device_errors = true;
  const int workers = c.workers > 0 ? c.workers : workers_for(gpu.ctx);
  const dsa::DeviceBuffer schedule = plan_varlen(dv, workers, c.path, gpu.ctx);
  // The device planner writes what the host planner writes.
  {
    std::vector<std::int32_t> lens = v.rows.context_lens, offsets = v.request_offsets;
    lens.reserve(1);
    std::vector<std::int32_t> host_plan(static_cast<std::size_t>(2 * (workers + 1)), -7);
    dsa::ExecContext cpu;
    cpu.backend = Backend::cpu;
    DSA_GPU_ASSERT_OK(dsa::plan_schedule(
        dsa::make_view(lens.data(), DType::int32, {v.total_rows()}), workers, c.path,
        dsa::make_view(host_plan.data(), DType::int32, {workers + 1, 2}), cpu,
        dsa::make_view(offsets.data(), DType::int32, {v.requests + 1})));
    EXPECT_EQ(host_copy<std::int32_t>(schedule), host_plan);
  }
  const VarlenRun run = run_varlen(dv, schedule, c.dtype, c.clean, c.path, gpu.ctx);
  DSA_GPU_ASSERT_OK(run.status);
  EXPECT_TRUE(logits_match(v.rows, v.reference(), run.bytes, c.dtype, v.rows.max_context_len, c.clean,
                           logits_tolerance(backend)));
  const VarlenRun again = run_varlen(dv, schedule, c.dtype, c.clean, c.path, gpu.ctx);
  EXPECT_TRUE(run.bytes == again.bytes) << "not bitwise repeatable";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuVarlen,
    ::testing::Combine(::testing::Values(Backend::cuda_generic, Backend::automatic), ::testing::ValuesIn(varlen_cases())),
    [](const ::testing::TestParamInfo<GpuVarlen::ParamType>& info) {
      return std::get<1>(info.param).name + "_" + backend_tag(std::get<0>(info.param));
    });

TEST(GpuVarlenPaths, NativePerTokenAndOtherPlansAgreeBitwise) {
  DSA_REQUIRE_GPU();
  const VarlenWorkload v = make_varlen_workload(
      VarlenSpec{.rows_per_request = {4, 21, 0, 1, 8, 9}, .causal = false, .max_prefix = 1500, .seed = 801});
  const DeviceVarlen dv(v);
  GpuContext gpu(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  gpu.ctx.check_device_errors = true;
  const VarlenRun native =
      run_varlen(dv, plan_varlen(dv, workers_for(gpu.ctx), LogitsPath::native, gpu.ctx), DType::float32, true,
                 LogitsPath::native, gpu.ctx);
  DSA_GPU_ASSERT_OK(native.status);
  const VarlenRun per_token =
      run_varlen(dv, plan_varlen(dv, 5, LogitsPath::per_token, gpu.ctx), DType::float32, true,
                 LogitsPath::per_token, gpu.ctx);
  DSA_GPU_ASSERT_OK(per_token.status);
  EXPECT_TRUE(native.bytes == per_token.bytes);
  // A plan for other offsets of the same rows (one request) and another worker count.
  std::vector<std::int32_t> one_request{0, static_cast<std::int32_t>(v.total_rows())};
  const dsa::DeviceBuffer other_offsets = device_copy(one_request);
  dsa::DeviceBuffer stale = device_filled(sizeof(std::int32_t) * 2 * 8, 0xFF);
  DSA_GPU_ASSERT_OK(dsa::plan_schedule(dv.lens_view(), 7, LogitsPath::native, schedule_view(stale), gpu.ctx,
                                       device_view(other_offsets, DType::int32, {2})));
  const VarlenRun other = run_varlen(dv, stale, DType::float32, true, LogitsPath::native, gpu.ctx);
  DSA_GPU_ASSERT_OK(other.status);
  EXPECT_TRUE(native.bytes == other.bytes);
}

// Hopper logits against the generic kernel's: -inf where it has -inf, and
// within the tensor cores' rounding elsewhere (their fp8 sums keep about 13
// mantissa bits, so each row is bounded by its largest logit).
void expect_near_generic(const VarlenRun& hopper, const VarlenRun& generic, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r) {
    double largest = 0.0;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float want = logit_at(generic.bytes, DType::float32, r * cols + c);
      if (std::isfinite(want)) largest = std::max(largest, static_cast<double>(std::fabs(want)));
    }
    for (std::int64_t c = 0; c < cols; ++c) {
      const float want = logit_at(generic.bytes, DType::float32, r * cols + c);
      const float got = logit_at(hopper.bytes, DType::float32, r * cols + c);
      if (std::isinf(want)) {
        ASSERT_EQ(want, got) << "row " << r << " col " << c;
      } else {
        ASSERT_NEAR(got, want, 4e-3 * (largest + 1.0)) << "row " << r << " col " << c;
      }
    }
  }
}

// Many requests of 1..4 rows over long contexts, as engines verify drafts:
// each worker walks many short units and chunks, which its producer warps
// share. The Hopper kernel's row tiles against its own per-token path (the
// same products and sums, so the same bits) and against the generic kernel.
class GpuVarlenLong : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GpuVarlenLong, HopperRowTilesMatchPerTokenAndGeneric) {
  DSA_REQUIRE_HOPPER();
  const auto [requests, max_prefix] = GetParam();
  std::vector<int> rows_per_request;
  for (int b = 0; b < requests; ++b) rows_per_request.push_back(1 + (b * 7 + 3) % 4);
  const VarlenWorkload v = make_varlen_workload(VarlenSpec{
      .rows_per_request = rows_per_request, .heads = 64, .max_prefix = max_prefix, .seed = 900u + requests});
  const DeviceVarlen dv(v);
  GpuContext hopper(Backend::cuda_hopper, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  hopper.ctx.check_device_errors = true;
  const int workers = workers_for(hopper.ctx);
  const VarlenRun tiles = run_varlen(dv, plan_varlen(dv, workers, LogitsPath::native, hopper.ctx), DType::float32,
                                     true, LogitsPath::native, hopper.ctx);
  DSA_GPU_ASSERT_OK(tiles.status);
  const VarlenRun per_token = run_varlen(dv, plan_varlen(dv, workers, LogitsPath::per_token, hopper.ctx),
                                         DType::float32, true, LogitsPath::per_token, hopper.ctx);
  DSA_GPU_ASSERT_OK(per_token.status);
  EXPECT_TRUE(tiles.bytes == per_token.bytes);
  GpuContext generic(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  const VarlenRun reference = run_varlen(dv, plan_varlen(dv, workers, LogitsPath::native, generic.ctx),
                                         DType::float32, true, LogitsPath::native, generic.ctx);
  DSA_GPU_ASSERT_OK(reference.status);
  expect_near_generic(tiles, reference, v.total_rows(), v.rows.max_context_len);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuVarlenLong,
                         ::testing::Values(std::make_tuple(8, 3000), std::make_tuple(8, 30000),
                                           std::make_tuple(100, 3000), std::make_tuple(100, 20000)),
                         [](const auto& info) {
                           return "r" + std::to_string(std::get<0>(info.param)) + "_p" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(GpuVarlenBackends, HopperScoresRowTilesAndIndexTopkStages) {
  DSA_REQUIRE_GPU();
  const VarlenWorkload v =
      make_varlen_workload(VarlenSpec{.rows_per_request = {2, 9, 1}, .heads = 64, .causal = false, .seed = 811});
  const DeviceVarlen dv(v);
  GpuContext hopper(Backend::cuda_hopper, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  hopper.ctx.check_device_errors = true;
  const dsa::DeviceBuffer schedule = plan_varlen(dv, 4, LogitsPath::native, hopper.ctx);
  if (device_is_sm90()) {
    // The sm_90a kernel scores row tiles of uneven requests (a request of 9 rows: two tiles).
    const VarlenRun served = run_varlen(dv, schedule, DType::float32, true, LogitsPath::native, hopper.ctx);
    DSA_GPU_ASSERT_OK(served.status);
    GpuContext generic(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
    const VarlenRun reference = run_varlen(dv, schedule, DType::float32, true, LogitsPath::native, generic.ctx);
    DSA_GPU_ASSERT_OK(reference.status);
    expect_near_generic(served, reference, v.total_rows(), v.rows.max_context_len);
  }

  // index_topk (automatic: logits then top-k) is topk of the logits, with physical slots.
  const int k = 50;
  const std::int64_t rows = v.total_rows();
  dsa::IndexTopkOptions options;
  options.k = k;
  options.sorted = true;
  options.physical_slots = true;
  options.request_offsets = dv.offsets_view();
  GpuContext gpu(Backend::automatic,
                 dsa::index_topk_workspace_bytes(rows, v.rows.max_context_len, options, dsa::ExecContext{}));
  gpu.ctx.check_device_errors = true;
  const VarlenRun logits = run_varlen(dv, schedule, DType::float32, false, LogitsPath::native, gpu.ctx);
  DSA_GPU_ASSERT_OK(logits.status);
  const dsa::DeviceBuffer logits_copy = device_copy(logits.bytes);
  dsa::DeviceBuffer want = device_filled(4 * rows * k, 0xFF), got = device_filled(4 * rows * k, 0xFF);
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;
  topk_options.block_table = dv.table_view();
  topk_options.request_offsets = dv.offsets_view();
  topk_options.page_size = v.rows.geometry.page_tokens;
  DSA_GPU_ASSERT_OK(dsa::topk(device_view(logits_copy, DType::float32, {rows, v.rows.max_context_len}),
                              dv.lens_view(), k, device_view(want, DType::int32, {rows, k}), topk_options, gpu.ctx));
  DSA_GPU_ASSERT_OK(dsa::index_topk(dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), dv.lens_view(),
                                    dv.table_view(), schedule_view(schedule), v.rows.max_context_len,
                                    dsa::TensorView{}, device_view(got, DType::int32, {rows, k}), options, gpu.ctx));
  EXPECT_EQ(host_copy<std::int32_t>(want), host_copy<std::int32_t>(got));
  options.strategy = dsa::IndexTopkStrategy::fused;
  const dsa::Status fused = dsa::index_topk(dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(),
                                            dv.lens_view(), dv.table_view(), schedule_view(schedule),
                                            v.rows.max_context_len, dsa::TensorView{},
                                            device_view(got, DType::int32, {rows, k}), options, gpu.ctx);
  EXPECT_EQ(fused.code(), dsa::ErrorCode::unsupported) << fused.to_string();
}

// Offsets that break the rules on the device: recorded, every row NaN over
// [0, max_context_len), nothing written past it.
TEST(GpuVarlenErrors, BrokenOffsetsAreRecordedAndRowsNaN) {
  DSA_REQUIRE_GPU();
  const VarlenWorkload v = make_varlen_workload(VarlenSpec{.rows_per_request = {3, 6, 2}, .seed = 821});
  const DeviceVarlen dv(v);
  const std::int64_t rows = v.total_rows(), cols = v.rows.max_context_len;
  GpuContext gpu(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  const dsa::DeviceBuffer schedule = plan_varlen(dv, 4, LogitsPath::native, gpu.ctx);
  const std::vector<std::vector<std::int32_t>> broken{
      {0, 6, 3, 11}, {1, 3, 9, 11}, {0, 3, 9, 10}, {0, 3, 9, 12}, {-5, 3, 9, 11}, {0, 3, 40, 11}};
  for (const auto& offsets : broken) {
    const dsa::DeviceBuffer bad = device_copy(offsets);
    // The device planner walks the unchecked offsets without reading out of bounds.
    dsa::DeviceBuffer bad_schedule = device_filled(8 * 6, 0xFF);
    gpu.ctx.check_device_errors = false;
    DSA_GPU_ASSERT_OK(dsa::plan_schedule(dv.lens_view(), 5, LogitsPath::native, schedule_view(bad_schedule),
                                         gpu.ctx, device_view(bad, DType::int32, {4})));
    DSA_GPU_ASSERT_OK(gpu.sync());
    dsa::DeviceBuffer out = device_filled(4 * rows * (cols + 1), 0xFF);
    dsa::LogitsOptions options;
    options.request_offsets = device_view(bad, DType::int32, {4});
    gpu.ctx.check_device_errors = true;
    const dsa::Status status = dsa::paged_mqa_logits(
        dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), dv.lens_view(), dv.table_view(),
        schedule_view(schedule), cols, device_view(out, DType::float32, {rows, cols}, {cols + 1, 1}), options,
        gpu.ctx);
    EXPECT_EQ(status.code(), dsa::ErrorCode::invalid_argument) << status.to_string();
    EXPECT_NE(status.message().find("request_offsets"), std::string::npos) << status.message();
    const std::vector<float> values = host_copy<float>(out);
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t p = 0; p < cols; ++p) ASSERT_TRUE(std::isnan(values[r * (cols + 1) + p])) << r << ", " << p;
      std::uint32_t bits;
      std::memcpy(&bits, &values[r * (cols + 1) + cols], sizeof bits);
      EXPECT_EQ(bits, 0xFFFFFFFFu) << "column past max_context_len written in row " << r;
    }
  }
}

TEST(GpuVarlenErrors, LengthBeyondMaxContextNaNsTheRow) {
  DSA_REQUIRE_GPU();
  VarlenWorkload v = make_varlen_workload(VarlenSpec{.rows_per_request = {3, 6}, .causal = false, .seed = 831});
  const std::int64_t cols = v.rows.max_context_len;
  v.rows.context_lens[4] = static_cast<std::int32_t>(cols + 1);
  const DeviceVarlen dv(v);
  GpuContext gpu(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  const dsa::DeviceBuffer schedule = plan_varlen(dv, 3, LogitsPath::native, gpu.ctx);
  gpu.ctx.check_device_errors = true;
  const VarlenRun run = run_varlen(dv, schedule, DType::float32, true, LogitsPath::native, gpu.ctx);
  EXPECT_EQ(run.status.code(), dsa::ErrorCode::length_out_of_range) << run.status.to_string();
  for (std::int64_t p = 0; p < cols; ++p) EXPECT_TRUE(std::isnan(logit_at(run.bytes, DType::float32, 4 * cols + p)));
}

// causal_context_lens with request_offsets: row offsets[b] + t gets prefix[b]
// + t + 1; a row that no request covers is recorded and set to 0.
TEST(GpuVarlenLengths, CausalRowsAndUncoveredRows) {
  DSA_REQUIRE_GPU();
  GpuContext gpu(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  gpu.ctx.check_device_errors = true;
  const dsa::DeviceBuffer prefix = device_copy(std::vector<std::int32_t>{10, 5, 0, 300});
  const dsa::DeviceBuffer offsets = device_copy(std::vector<std::int32_t>{0, 2, 2, 7, 8});
  dsa::DeviceBuffer out = device_filled(4 * 8, 0xFF);
  DSA_GPU_ASSERT_OK(dsa::causal_context_lens(device_view(prefix, DType::int32, {4}), 1,
                                             device_view(out, DType::int32, {8}), gpu.ctx,
                                             device_view(offsets, DType::int32, {5})));
  EXPECT_EQ(host_copy<std::int32_t>(out), (std::vector<std::int32_t>{11, 12, 1, 2, 3, 4, 5, 301}));
  const dsa::DeviceBuffer short_offsets = device_copy(std::vector<std::int32_t>{0, 2, 2, 7, 7});
  const dsa::Status status = dsa::causal_context_lens(device_view(prefix, DType::int32, {4}), 1,
                                                      device_view(out, DType::int32, {8}), gpu.ctx,
                                                      device_view(short_offsets, DType::int32, {5}));
  EXPECT_EQ(status.code(), dsa::ErrorCode::invalid_argument) << status.to_string();
  EXPECT_NE(status.message().find("request_offsets"), std::string::npos) << status.message();
  EXPECT_EQ(host_copy<std::int32_t>(out)[7], 0);
}

// plan_schedule and paged_mqa_logits with request_offsets captured once and
// replayed after new row lengths are written into the same buffers.
TEST(GpuVarlenGraph, CapturedPlanAndLogitsReplay) {
  DSA_REQUIRE_GPU();
  VarlenWorkload v = make_varlen_workload(
      VarlenSpec{.rows_per_request = {5, 1, 17, 2}, .causal = false, .max_prefix = 900, .seed = 841});
  DeviceVarlen dv(v);
  const std::int64_t rows = v.total_rows(), cols = v.rows.max_context_len;
  GpuContext gpu(Backend::cuda_generic, dsa::paged_mqa_logits_workspace_bytes(dsa::ExecContext{}));
  const int workers = workers_for(gpu.ctx);
  dsa::DeviceBuffer schedule = device_filled(8 * (workers + 1), 0xFF);
  dsa::DeviceBuffer out = device_filled(4 * rows * cols, 0xFF);
  dsa::LogitsOptions options;
  options.clean_logits = true;
  options.request_offsets = dv.offsets_view();
  const auto stream = static_cast<cudaStream_t>(gpu.ctx.stream);
  cudaGraph_t raw_graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const dsa::Status planned = dsa::plan_schedule(dv.lens_view(), workers, LogitsPath::native,
                                                 schedule_view(schedule), gpu.ctx, dv.offsets_view());
  const dsa::Status scored = dsa::paged_mqa_logits(
      dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), dv.lens_view(), dv.table_view(),
      schedule_view(schedule), cols, device_view(out, DType::float32, {rows, cols}), options, gpu.ctx);
  ASSERT_EQ(cudaStreamEndCapture(stream, &raw_graph), cudaSuccess);
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
  DSA_GPU_ASSERT_OK(planned);
  DSA_GPU_ASSERT_OK(scored);
  cudaGraphExec_t raw_exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&raw_exec, graph.get(), 0), cudaSuccess);
  const std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec(raw_exec, cudaGraphExecDestroy);
  Rng rng(851);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay > 0) {
      for (auto& length : v.rows.context_lens) length = std::uniform_int_distribution<std::int32_t>(0, length)(rng);
      DSA_GPU_ASSERT_OK(dv.rows.context_lens.copy_from_host(v.rows.context_lens.data(), 4 * rows));
    }
    ASSERT_EQ(cudaGraphLaunch(exec.get(), stream), cudaSuccess);
    DSA_GPU_ASSERT_OK(gpu.sync());
    DSA_GPU_ASSERT_OK(dsa::read_device_error(gpu.ctx));
    EXPECT_TRUE(logits_match(v.rows, v.reference(), host_copy<std::uint8_t>(out), DType::float32, cols, true,
                             logits_tolerance(Backend::cuda_generic)));
  }
}

}  // namespace
}  // namespace dsa_test::gpu
