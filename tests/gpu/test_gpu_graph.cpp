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

using GraphExec = std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)>;

// Captures the library calls `enqueue` makes on `stream` (it returns their
// statuses, all of which must be ok) and instantiates the graph; null after
// a failure, which the test has then reported.
template <typename Enqueue>
GraphExec capture(cudaStream_t stream, Enqueue&& enqueue) {
  GraphExec none(nullptr, cudaGraphExecDestroy);
  cudaGraph_t raw_graph = nullptr;
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const auto statuses = enqueue();
  EXPECT_EQ(cudaStreamEndCapture(stream, &raw_graph), cudaSuccess);
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
  bool ok = raw_graph != nullptr;
  for (const dsa::Status& status : statuses) {
    EXPECT_TRUE(status.ok()) << status.to_string();
    ok = ok && status.ok();
  }
  cudaGraphExec_t raw_exec = nullptr;
  if (!ok || cudaGraphInstantiate(&raw_exec, graph.get(), 0) != cudaSuccess) {
    ADD_FAILURE() << "capture or instantiation failed";
    return none;
  }
  return GraphExec(raw_exec, cudaGraphExecDestroy);
}

// The prefix lengths of replay `replay`: the longest ones first, then random
// shorter ones.
std::vector<std::int32_t> replay_prefix(const std::vector<std::int32_t>& longest, int replay, Rng& rng) {
  std::vector<std::int32_t> prefix = longest;
  if (replay > 0) {
    for (auto& p : prefix) p = std::uniform_int_distribution<std::int32_t>(0, p)(rng);
  }
  return prefix;
}

// A decode step to capture and replay: the workload at the longest lengths
// any replay uses, on the device, and the buffers the step writes (lengths,
// schedule, logits, indices).
struct ReplayedStep {
  ReplayedStep(const WorkloadSpec& spec, int top_k)
      : w(make_workload(spec)),
        dw(w),
        k(top_k),
        workers(workers_for(dsa::ExecContext{})),
        prefix(device_copy(w.prefix_lens)),
        lens(device_filled(4 * w.rows(), 0)),
        schedule(device_filled(8 * (workers + 1), 0)),
        logits(device_filled(4 * w.rows() * w.max_context_len, 0xFF)),
        indices(device_filled(4 * w.rows() * k, 0xFF)) {}
  ReplayedStep(const ReplayedStep&) = delete;
  ReplayedStep& operator=(const ReplayedStep&) = delete;

  dsa::TensorView prefix_view() const { return device_view(prefix, DType::int32, {w.batch}); }
  dsa::TensorView lens_2d() const { return device_view(lens, DType::int32, {w.batch, w.next_n}); }
  dsa::TensorView lens_flat() const { return device_view(lens, DType::int32, {w.rows()}); }
  dsa::TensorView schedule_view() const { return device_view(schedule, DType::int32, {workers + 1, 2}); }
  dsa::TensorView logits_view() const {
    return device_view(logits, DType::float32, {w.rows(), w.max_context_len});
  }
  dsa::TensorView indices_view(const dsa::DeviceBuffer& buffer) const {
    return device_view(buffer, DType::int32, {w.rows(), k});
  }

  const Workload w;
  const DeviceWorkload dw;
  const int k;
  const int workers;
  const dsa::DeviceBuffer prefix, lens, schedule, logits, indices;
};

class GpuGraph : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuGraph, ReplaysWithNewLengths) {
  DSA_REQUIRE_GPU();
  const Backend backend = GetParam();
  const ReplayedStep step(WorkloadSpec{.batch = 4, .next_n = 3, .min_prefix = 400, .max_prefix = 900, .seed = 21},
                          100);
  const Workload& w = step.w;
  const std::int64_t columns = w.max_context_len;
  const int k = step.k;

  dsa::ExecContext query;
  query.backend = backend;
  GpuContext gpu(backend, dsa::topk_workspace_bytes(w.rows(), columns, k, query));
  const dsa::ExecContext& ctx = gpu.ctx;
  dsa::LogitsOptions logits_options;
  logits_options.path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;

  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const GraphExec exec = capture(stream, [&] {
    return std::vector<dsa::Status>{
        dsa::causal_context_lens(step.prefix_view(), w.next_n, step.lens_2d(), ctx),
        dsa::plan_schedule(step.lens_2d(), step.workers, logits_options.path, step.schedule_view(), ctx),
        dsa::paged_mqa_logits(step.dw.q_view(), step.dw.cache_view(), step.dw.weights_view(), step.lens_2d(),
                              step.dw.block_table_view(), step.schedule_view(), columns, step.logits_view(),
                              logits_options, ctx),
        dsa::topk(step.logits_view(), step.lens_flat(), k, step.indices_view(step.indices), topk_options, ctx),
    };
  });
  ASSERT_NE(exec, nullptr);

  Rng rng(77);
  for (int replay = 0; replay < 4; ++replay) {
    const std::vector<std::int32_t> new_prefix = replay_prefix(w.prefix_lens, replay, rng);
    ASSERT_CUDA(cudaMemcpyAsync(step.prefix.data(), new_prefix.data(), 4 * new_prefix.size(),
                                cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));

    Workload now = w;
    now.prefix_lens = new_prefix;
    now.context_lens = causal_lens(new_prefix, w.next_n);
    now.causal_lens = now.context_lens;
    EXPECT_EQ(host_copy<std::int32_t>(step.lens), now.context_lens) << "replay " << replay;
    const std::vector<std::uint8_t> logits_bytes = host_copy<std::uint8_t>(step.logits);
    EXPECT_TRUE(logits_match(now, now.reference(), logits_bytes, DType::float32, columns, false,
                             logits_tolerance(backend)))
        << "replay " << replay;
    const std::vector<float> values = host_copy<float>(step.logits);
    const std::vector<std::int32_t> got = host_copy<std::int32_t>(step.indices);
    for (std::int64_t r = 0; r < w.rows(); ++r) {
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
  const ReplayedStep step(WorkloadSpec{.batch = 5, .next_n = 4, .min_prefix = 300, .max_prefix = 5000, .seed = 23},
                          512);
  const Workload& w = step.w;
  const std::int64_t columns = w.max_context_len;
  const dsa::DeviceBuffer expected = device_filled(4 * w.rows() * step.k, 0xFF);

  dsa::IndexTopkOptions options;
  options.k = step.k;
  options.sorted = true;
  options.strategy = param.strategy;
  dsa::ExecContext query;
  query.backend = param.backend;
  GpuContext gpu(param.backend, std::max(dsa::index_topk_workspace_bytes(w.rows(), columns, options, query),
                                         dsa::topk_workspace_bytes(w.rows(), columns, step.k, query)));
  const dsa::ExecContext& ctx = gpu.ctx;
  options.path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);

  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const GraphExec exec = capture(stream, [&] {
    return std::vector<dsa::Status>{
        dsa::causal_context_lens(step.prefix_view(), w.next_n, step.lens_2d(), ctx),
        dsa::plan_schedule(step.lens_2d(), step.workers, options.path, step.schedule_view(), ctx),
        dsa::index_topk(step.dw.q_view(), step.dw.cache_view(), step.dw.weights_view(), step.lens_2d(),
                        step.dw.block_table_view(), step.schedule_view(), columns, dsa::TensorView{},
                        step.indices_view(step.indices), options, ctx),
    };
  });
  ASSERT_NE(exec, nullptr);

  dsa::LogitsOptions logits_options;
  logits_options.path = options.path;
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;
  Rng rng(78);
  for (int replay = 0; replay < 4; ++replay) {
    const std::vector<std::int32_t> new_prefix = replay_prefix(w.prefix_lens, replay, rng);
    ASSERT_CUDA(cudaMemcpyAsync(step.prefix.data(), new_prefix.data(), 4 * new_prefix.size(),
                                cudaMemcpyHostToDevice, stream));
    ASSERT_CUDA(cudaMemsetAsync(step.indices.data(), 0xFF, step.indices.bytes(), stream));
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));
    EXPECT_EQ(host_copy<std::int32_t>(step.lens), causal_lens(new_prefix, w.next_n)) << "replay " << replay;

    DSA_GPU_ASSERT_OK(dsa::paged_mqa_logits(step.dw.q_view(), step.dw.cache_view(), step.dw.weights_view(),
                                            step.lens_2d(), step.dw.block_table_view(), step.schedule_view(),
                                            columns, step.logits_view(), logits_options, ctx));
    DSA_GPU_ASSERT_OK(
        dsa::topk(step.logits_view(), step.lens_flat(), step.k, step.indices_view(expected), topk_options, ctx));
    DSA_GPU_ASSERT_OK(gpu.sync());
    ASSERT_EQ(host_copy<std::int32_t>(step.indices), host_copy<std::int32_t>(expected)) << "replay " << replay;
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
