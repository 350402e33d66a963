// One decode step as a serving engine runs it under CUDA graphs: the length
// builder, the device planner, the logits and the top-k (or index_topk, with
// each strategy) captured once, then replayed with new prefix lengths written
// into the same device buffers.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <vector>

#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

class GpuGraph : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuGraph, ReplaysWithNewLengths) {
  DSA_REQUIRE_GPU();
  const Backend backend = GetParam();
  WorkloadSpec spec;
  spec.batch = 4;
  spec.next_n = 3;
  spec.min_prefix = 400;
  spec.max_prefix = 900;
  spec.seed = 21;
  const Workload w = make_workload(spec);  // the longest lengths any replay uses
  const std::int64_t rows = w.rows();
  const std::int64_t columns = w.max_context_len;
  const int k = 100;
  const DeviceWorkload dw(w);

  const dsa::DeviceBuffer prefix = device_copy(w.prefix_lens);
  const dsa::DeviceBuffer lens = device_filled(4 * rows, 0);
  const dsa::DeviceBuffer logits = device_filled(4 * rows * columns, 0xFF);
  const dsa::DeviceBuffer indices = device_filled(4 * rows * k, 0xFF);

  dsa::ExecContext query;
  query.backend = backend;
  GpuContext gpu(backend, dsa::topk_workspace_bytes(rows, columns, k, query));
  const dsa::ExecContext& ctx = gpu.ctx;
  const int workers = dsa::default_num_workers(kGpu, ctx);
  const dsa::DeviceBuffer schedule = device_filled(8 * (workers + 1), 0);
  const dsa::LogitsPath path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);

  const dsa::TensorView lens_2d = device_view(lens, DType::int32, {w.batch, w.next_n});
  const dsa::TensorView lens_flat = device_view(lens, DType::int32, {rows});
  const dsa::TensorView schedule_view = device_view(schedule, DType::int32, {workers + 1, 2});
  const dsa::TensorView logits_view = device_view(logits, DType::float32, {rows, columns});
  const dsa::TensorView indices_view = device_view(indices, DType::int32, {rows, k});
  dsa::LogitsOptions logits_options;
  logits_options.path = path;
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;

  auto stream = static_cast<cudaStream_t>(ctx.stream);
  cudaGraph_t raw_graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const dsa::Status captured[] = {
      dsa::causal_context_lens(device_view(prefix, DType::int32, {w.batch}), w.next_n, lens_2d, ctx),
      dsa::plan_schedule(lens_2d, workers, path, schedule_view, ctx),
      dsa::paged_mqa_logits(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d, dw.block_table_view(),
                            schedule_view, columns, logits_view, logits_options, ctx),
      dsa::topk(logits_view, lens_flat, k, indices_view, topk_options, ctx),
  };
  ASSERT_CUDA(cudaStreamEndCapture(stream, &raw_graph));
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
  for (const dsa::Status& status : captured) DSA_GPU_ASSERT_OK(status);
  cudaGraphExec_t raw_exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
  const std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec(raw_exec, cudaGraphExecDestroy);

  Rng rng(77);
  for (int replay = 0; replay < 4; ++replay) {
    std::vector<std::int32_t> new_prefix = w.prefix_lens;
    if (replay > 0) {
      for (auto& p : new_prefix) p = std::uniform_int_distribution<std::int32_t>(0, p)(rng);
    }
    ASSERT_CUDA(cudaMemcpyAsync(prefix.data(), new_prefix.data(), 4 * new_prefix.size(), cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));

    Workload now = w;
    now.prefix_lens = new_prefix;
    now.context_lens = causal_lens(new_prefix, w.next_n);
    now.causal_lens = now.context_lens;
    EXPECT_EQ(host_copy<std::int32_t>(lens), now.context_lens) << "replay " << replay;
    const std::vector<std::uint8_t> logits_bytes = host_copy<std::uint8_t>(logits);
    EXPECT_TRUE(logits_match(now, now.reference(), logits_bytes, DType::float32, columns, false,
                             logits_tolerance(backend)))
        << "replay " << replay;
    const std::vector<float> values = host_copy<float>(logits);
    const std::vector<std::int32_t> got = host_copy<std::int32_t>(indices);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::vector<std::int32_t> want = reference_topk(values.data() + r * columns, now.context_lens[r], k);
      const std::vector<std::int32_t> row(got.begin() + r * k, got.begin() + (r + 1) * k);
      ASSERT_EQ(row, want) << "replay " << replay << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuGraph, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param == Backend::cuda_generic ? "generic" : "automatic";
                         });

// index_topk captured with the steps before it; every replay must give
// exactly what paged_mqa_logits then topk give, run outside the graph on the
// replay's lengths and schedule.
struct IndexTopkGraphCase {
  Backend backend;
  dsa::IndexTopkStrategy strategy;
};

void PrintTo(const IndexTopkGraphCase& c, std::ostream* out) {
  *out << backend_tag(c.backend) << " " << dsa::index_topk_strategy_name(c.strategy);
}

class GpuIndexTopkGraph : public ::testing::TestWithParam<IndexTopkGraphCase> {};

TEST_P(GpuIndexTopkGraph, ReplaysWithNewLengths) {
  DSA_REQUIRE_GPU();
  const IndexTopkGraphCase param = GetParam();
  if (param.strategy == dsa::IndexTopkStrategy::fused) DSA_REQUIRE_HOPPER();
  WorkloadSpec spec;
  spec.batch = 5;
  spec.next_n = 4;
  spec.min_prefix = 300;
  spec.max_prefix = 5000;
  spec.seed = 23;
  const Workload w = make_workload(spec);  // the longest lengths any replay uses
  const std::int64_t rows = w.rows();
  const std::int64_t columns = w.max_context_len;
  const int k = 512;
  const DeviceWorkload dw(w);

  const dsa::DeviceBuffer prefix = device_copy(w.prefix_lens);
  const dsa::DeviceBuffer lens = device_filled(4 * rows, 0);
  const dsa::DeviceBuffer indices = device_filled(4 * rows * k, 0xFF);
  const dsa::DeviceBuffer logits = device_filled(4 * rows * columns, 0xFF);
  const dsa::DeviceBuffer expected = device_filled(4 * rows * k, 0xFF);

  dsa::IndexTopkOptions options;
  options.k = k;
  options.sorted = true;
  options.strategy = param.strategy;
  dsa::ExecContext query;
  query.backend = param.backend;
  GpuContext gpu(param.backend, std::max(dsa::index_topk_workspace_bytes(rows, columns, options, query),
                                         dsa::topk_workspace_bytes(rows, columns, k, query)));
  const dsa::ExecContext& ctx = gpu.ctx;
  const int workers = workers_for(ctx);
  options.path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);
  const dsa::DeviceBuffer schedule = device_filled(8 * (workers + 1), 0);

  const dsa::TensorView lens_2d = device_view(lens, DType::int32, {w.batch, w.next_n});
  const dsa::TensorView lens_flat = device_view(lens, DType::int32, {rows});
  const dsa::TensorView schedule_view = device_view(schedule, DType::int32, {workers + 1, 2});
  const dsa::TensorView indices_view = device_view(indices, DType::int32, {rows, k});

  auto stream = static_cast<cudaStream_t>(ctx.stream);
  cudaGraph_t raw_graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const dsa::Status captured[] = {
      dsa::causal_context_lens(device_view(prefix, DType::int32, {w.batch}), w.next_n, lens_2d, ctx),
      dsa::plan_schedule(lens_2d, workers, options.path, schedule_view, ctx),
      dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d, dw.block_table_view(),
                      schedule_view, columns, dsa::TensorView{}, indices_view, options, ctx),
  };
  ASSERT_CUDA(cudaStreamEndCapture(stream, &raw_graph));
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
  for (const dsa::Status& status : captured) DSA_GPU_ASSERT_OK(status);
  cudaGraphExec_t raw_exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
  const std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec(raw_exec, cudaGraphExecDestroy);

  dsa::LogitsOptions logits_options;
  logits_options.path = options.path;
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;
  Rng rng(78);
  for (int replay = 0; replay < 4; ++replay) {
    std::vector<std::int32_t> new_prefix = w.prefix_lens;
    if (replay > 0) {
      for (auto& p : new_prefix) p = std::uniform_int_distribution<std::int32_t>(0, p)(rng);
    }
    ASSERT_CUDA(cudaMemcpyAsync(prefix.data(), new_prefix.data(), 4 * new_prefix.size(), cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaMemsetAsync(indices.data(), 0xFF, indices.bytes(), stream));
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));
    EXPECT_EQ(host_copy<std::int32_t>(lens), causal_lens(new_prefix, w.next_n)) << "replay " << replay;

    DSA_GPU_ASSERT_OK(dsa::paged_mqa_logits(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d,
                                            dw.block_table_view(), schedule_view, columns,
                                            device_view(logits, DType::float32, {rows, columns}), logits_options,
                                            ctx));
    DSA_GPU_ASSERT_OK(dsa::topk(device_view(logits, DType::float32, {rows, columns}), lens_flat, k,
                                device_view(expected, DType::int32, {rows, k}), topk_options, ctx));
    DSA_GPU_ASSERT_OK(gpu.sync());
    ASSERT_EQ(host_copy<std::int32_t>(indices), host_copy<std::int32_t>(expected)) << "replay " << replay;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, GpuIndexTopkGraph,
    ::testing::Values(IndexTopkGraphCase{Backend::cuda_generic, dsa::IndexTopkStrategy::logits_then_topk},
                      IndexTopkGraphCase{Backend::automatic, dsa::IndexTopkStrategy::logits_then_topk},
                      IndexTopkGraphCase{Backend::automatic, dsa::IndexTopkStrategy::fused}),
    [](const ::testing::TestParamInfo<IndexTopkGraphCase>& info) {
      return backend_tag(info.param.backend) + "_" + dsa::index_topk_strategy_name(info.param.strategy);
    });

}  // namespace
}  // namespace dsa_test::gpu
