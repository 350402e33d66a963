// Programmatic dependent launch (ExecContext::programmatic_dependent_launch):
// a decode step (lengths, the device planner, logits, top-k as cache slots,
// index_topk) gives bitwise what it gives without it, called one by one and
// replayed from a captured CUDA graph, and the error record still belongs to
// the last operation. Each step's inputs are written by the operation just
// before it, so a kernel that read before the one before it completed
// would read the poison its buffers start with.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr int kTopk = 64;

// What one step writes, poisoned (0xFF bytes) before it runs.
struct StepOutputs {
  StepOutputs(const Workload& w, int workers)
      : lens(device_filled(4 * w.rows(), 0xFF)),
        schedule(device_filled(8 * (workers + 1), 0xFF)),
        logits(device_filled(4 * w.rows() * w.max_context_len, 0xFF)),
        slots(device_filled(4 * w.rows() * kTopk, 0xFF)),
        staged(device_filled(4 * w.rows() * kTopk, 0xFF)),
        fused(device_filled(4 * w.rows() * kTopk, 0xFF)) {}

  std::vector<std::vector<std::uint8_t>> bytes() const {
    return {host_copy<std::uint8_t>(lens),   host_copy<std::uint8_t>(schedule), host_copy<std::uint8_t>(logits),
            host_copy<std::uint8_t>(slots),  host_copy<std::uint8_t>(staged),   host_copy<std::uint8_t>(fused)};
  }

  dsa::DeviceBuffer lens, schedule, logits, slots, staged, fused;
};

const char* const kOutputNames[] = {"lengths", "schedule", "logits", "topk slots", "index_topk", "fused index_topk"};

// The step of a workload on one backend: the workload on the device and the
// calls that make up the step.
struct PdlStep {
  PdlStep(Backend step_backend, const WorkloadSpec& spec)
      : backend(step_backend),
        w(make_workload(spec)),
        dw(w),
        workers(workers_for(dsa::ExecContext{})),
        prefix(device_copy(w.prefix_lens)),
        fused(step_backend == Backend::automatic && device_is_sm90()) {}
  PdlStep(const PdlStep&) = delete;
  PdlStep& operator=(const PdlStep&) = delete;

  std::size_t workspace_bytes() const {
    dsa::ExecContext query;
    query.backend = backend;
    dsa::IndexTopkOptions options;
    options.k = kTopk;
    std::size_t bytes = std::max(dsa::topk_workspace_bytes(w.rows(), w.max_context_len, kTopk, query),
                                 dsa::paged_mqa_logits_workspace_bytes(query));
    for (const auto strategy : {dsa::IndexTopkStrategy::logits_then_topk, dsa::IndexTopkStrategy::fused}) {
      if (strategy == dsa::IndexTopkStrategy::fused && !fused) continue;
      options.strategy = strategy;
      bytes = std::max(bytes, dsa::index_topk_workspace_bytes(w.rows(), w.max_context_len, options, query));
    }
    return bytes;
  }

  // Enqueues the step on ctx.stream, writing into `out`.
  std::vector<dsa::Status> enqueue(const dsa::ExecContext& ctx, const StepOutputs& out) const {
    const dsa::TensorView lens_2d = device_view(out.lens, DType::int32, {w.batch, w.next_n});
    const dsa::TensorView lens_flat = device_view(out.lens, DType::int32, {w.rows()});
    const dsa::TensorView schedule = device_view(out.schedule, DType::int32, {workers + 1, 2});
    const dsa::TensorView logits = device_view(out.logits, DType::float32, {w.rows(), w.max_context_len});
    const auto indices = [&](const dsa::DeviceBuffer& buffer) {
      return device_view(buffer, DType::int32, {w.rows(), kTopk});
    };
    dsa::LogitsOptions logits_options;
    logits_options.path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);
    logits_options.clean_logits = true;
    dsa::TopkOptions topk_options;
    topk_options.sorted = true;
    topk_options.block_table = dw.block_table_view();
    topk_options.rows_per_request = w.next_n;
    dsa::IndexTopkOptions index_options;
    index_options.k = kTopk;
    index_options.sorted = true;
    index_options.path = logits_options.path;
    index_options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
    std::vector<dsa::Status> statuses{
        dsa::causal_context_lens(device_view(prefix, DType::int32, {w.batch}), w.next_n, lens_2d, ctx),
        dsa::plan_schedule(lens_2d, workers, logits_options.path, schedule, ctx),
        dsa::paged_mqa_logits(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d, dw.block_table_view(),
                              schedule, w.max_context_len, logits, logits_options, ctx),
        dsa::topk(logits, lens_flat, kTopk, indices(out.slots), topk_options, ctx),
        dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d, dw.block_table_view(), schedule,
                        w.max_context_len, dsa::TensorView{}, indices(out.staged), index_options, ctx),
    };
    if (fused) {
      index_options.strategy = dsa::IndexTopkStrategy::fused;
      statuses.push_back(dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), lens_2d,
                                         dw.block_table_view(), schedule, w.max_context_len, dsa::TensorView{},
                                         indices(out.fused), index_options, ctx));
    }
    return statuses;
  }

  // Runs the step eagerly with or without the overlap and returns its outputs.
  std::vector<std::vector<std::uint8_t>> run(bool overlap) const {
    GpuContext gpu(backend, workspace_bytes());
    gpu.ctx.programmatic_dependent_launch = overlap;
    const StepOutputs out(w, workers);
    for (const dsa::Status& status : enqueue(gpu.ctx, out)) EXPECT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(gpu.sync().ok());
    const dsa::Status recorded = dsa::read_device_error(gpu.ctx);
    EXPECT_TRUE(recorded.ok()) << recorded.to_string();
    return out.bytes();
  }

  const Backend backend;
  const Workload w;
  const DeviceWorkload dw;
  const int workers;
  dsa::DeviceBuffer prefix;  // rewritten between replays
  const bool fused;  // the fused index_topk runs too (the Hopper kernels serve the step)
};

void expect_same_outputs(const std::vector<std::vector<std::uint8_t>>& want,
                         const std::vector<std::vector<std::uint8_t>>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size());
  for (std::size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(want[i] == got[i]) << kOutputNames[i] << " " << what;
}

class GpuPdl : public ::testing::TestWithParam<Backend> {};

// The same outputs with and without the overlap, and the ones without it
// right: the causal lengths, the host planner's schedule, logits within the
// float64 reference's bound.
TEST_P(GpuPdl, EagerStepIsBitwiseTheSame) {
  DSA_REQUIRE_GPU();
  for (const int next_n : {1, 2, 4}) {
    const PdlStep step(GetParam(), WorkloadSpec{.batch = 6, .next_n = next_n, .min_prefix = 200,
                                                .max_prefix = 3000, .seed = 40u + next_n});
    const Workload& w = step.w;
    const auto plain = step.run(false);
    EXPECT_EQ(plain[0].size(), 4 * w.context_lens.size());
    std::vector<std::int32_t> lens(w.context_lens.size());
    std::memcpy(lens.data(), plain[0].data(), 4 * lens.size());
    EXPECT_EQ(lens, w.context_lens);
    std::vector<std::int32_t> host_plan(static_cast<std::size_t>(2 * (step.workers + 1)));
    dsa::ExecContext on_gpu;
    on_gpu.backend = GetParam();
    dsa::ExecContext cpu;
    cpu.backend = Backend::cpu_reference;
    DSA_GPU_ASSERT_OK(dsa::plan_schedule(
        dsa::make_view(lens.data(), DType::int32, {w.batch, w.next_n}), step.workers,
        dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, on_gpu),
        dsa::make_view(host_plan.data(), DType::int32, {step.workers + 1, 2}), cpu));
    std::vector<std::int32_t> schedule(host_plan.size());
    std::memcpy(schedule.data(), plain[1].data(), 4 * schedule.size());
    EXPECT_EQ(schedule, host_plan);
    EXPECT_TRUE(logits_match(w, w.reference(), plain[2], DType::float32, w.max_context_len, true,
                             logits_tolerance(GetParam())));
    for (int run = 0; run < 3; ++run) expect_same_outputs(plain, step.run(true), "eager");
  }
}

// The step captured with the overlap and replayed with new prefix lengths
// gives what the calls give one by one without it.
TEST_P(GpuPdl, CapturedStepIsBitwiseTheSame) {
  DSA_REQUIRE_GPU();
  PdlStep step(GetParam(), WorkloadSpec{.batch = 5, .next_n = 3, .min_prefix = 300, .max_prefix = 5000, .seed = 47});
  GpuContext gpu(step.backend, step.workspace_bytes());
  gpu.ctx.programmatic_dependent_launch = true;
  auto stream = static_cast<cudaStream_t>(gpu.ctx.stream);
  const StepOutputs out(step.w, step.workers);

  cudaGraph_t raw_graph = nullptr;
  ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const std::vector<dsa::Status> statuses = step.enqueue(gpu.ctx, out);
  ASSERT_CUDA(cudaStreamEndCapture(stream, &raw_graph));
  const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
  for (const dsa::Status& status : statuses) DSA_GPU_ASSERT_OK(status);
  // On compute capability 9.0 (the library's sm_90a code waits) every
  // dependency between the step's kernels is a programmatic edge.
  if (device_is_sm90()) {
    std::size_t edges = 0;
    ASSERT_CUDA(cudaGraphGetEdges(graph.get(), nullptr, nullptr, nullptr, &edges));
    std::vector<cudaGraphNode_t> from(edges), to(edges);
    std::vector<cudaGraphEdgeData> data(edges);
    ASSERT_CUDA(cudaGraphGetEdges(graph.get(), from.data(), to.data(), data.data(), &edges));
    const auto programmatic = std::count_if(data.begin(), data.end(), [](const cudaGraphEdgeData& edge) {
      return edge.type == cudaGraphDependencyTypeProgrammatic;
    });
    EXPECT_GT(edges, 0u);
    EXPECT_EQ(static_cast<std::size_t>(programmatic), edges);
  }
  cudaGraphExec_t raw_exec = nullptr;
  ASSERT_CUDA(cudaGraphInstantiate(&raw_exec, graph.get(), 0));
  const std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec(raw_exec, cudaGraphExecDestroy);

  Rng rng(48);
  const std::vector<std::int32_t> longest = step.w.prefix_lens;
  for (int replay = 0; replay < 3; ++replay) {
    std::vector<std::int32_t> prefix = longest;
    if (replay > 0) {
      for (auto& p : prefix) p = std::uniform_int_distribution<std::int32_t>(0, p)(rng);
    }
    DSA_GPU_ASSERT_OK(step.prefix.copy_from_host(prefix.data(), 4 * prefix.size()));
    for (const dsa::DeviceBuffer* buffer : {&out.lens, &out.schedule, &out.logits, &out.slots, &out.staged, &out.fused}) {
      ASSERT_CUDA(cudaMemsetAsync(buffer->data(), 0xFF, buffer->bytes(), stream));
    }
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(gpu.ctx));
    expect_same_outputs(step.run(false), out.bytes(), "replayed");
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuPdl, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) { return backend_tag(info.param); });

// Each operation clears the error record before its kernels record, with
// and without the overlap: a violation the lengths builder records is what
// read_device_error returns after it, and the planner enqueued right after
// it (with no synchronization between them; its kernel clears the record
// itself) leaves a clean record.
class GpuPdlErrors : public ::testing::TestWithParam<bool> {};

TEST_P(GpuPdlErrors, RecordBelongsToTheLastOperation) {
  DSA_REQUIRE_GPU();
  GpuContext gpu(Backend::cuda_generic, 0);
  gpu.ctx.programmatic_dependent_launch = GetParam();
  const std::vector<std::int32_t> prefix{7, -3, 12};
  const dsa::DeviceBuffer prefix_device = device_copy(prefix);
  const dsa::DeviceBuffer lens = device_filled(4 * 3 * 2, 0xFF);
  const dsa::DeviceBuffer schedule = device_filled(8 * 5, 0xFF);
  const dsa::TensorView lens_view = device_view(lens, DType::int32, {3, 2});
  const auto lengths = [&] {
    return dsa::causal_context_lens(device_view(prefix_device, DType::int32, {3}), 2, lens_view, gpu.ctx);
  };
  for (int round = 0; round < 3; ++round) {
    DSA_GPU_ASSERT_OK(lengths());
    const dsa::Status recorded = dsa::read_device_error(gpu.ctx);
    EXPECT_EQ(recorded.code(), dsa::ErrorCode::invalid_argument) << recorded.to_string();
    DSA_GPU_ASSERT_OK(lengths());
    DSA_GPU_ASSERT_OK(dsa::plan_schedule(lens_view, 4, dsa::LogitsPath::native,
                                         device_view(schedule, DType::int32, {5, 2}), gpu.ctx));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(gpu.ctx));
  }
  EXPECT_EQ(host_copy<std::int32_t>(lens), (std::vector<std::int32_t>{8, 9, 1, 2, 13, 14}));
}

INSTANTIATE_TEST_SUITE_P(Overlap, GpuPdlErrors, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "pdl" : "plain"; });

}  // namespace
}  // namespace dsa_test::gpu
