// One decode step as a serving engine runs it under CUDA graphs: the length
// builder, the device planner, the logits and the top-k (or index_topk, with
// each strategy) captured once, then replayed with new prefix lengths written
// into the same device buffers; and a prefill chunk (mqa_logits, then the
// ragged top-k) replayed with new key ranges.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/prefill_inputs.hpp"
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

// Prefill as an engine captures it: mqa_logits over the chunk's keys, then
// the ragged top-k of each row's range (row_starts = position_offsets = ks,
// lengths = ke - ks), captured once and replayed after new ranges are
// written into the same ks, ke and lengths buffers. Every replay gives
// bitwise what the same calls give one by one, and those match the float64
// reference and the reference selection.
class GpuPrefillGraph : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuPrefillGraph, ReplaysWithNewRangesAsEagerCalls) {
  DSA_REQUIRE_GPU();
  const Backend backend = GetParam();
  MqaWorkload w = make_mqa_workload(
      MqaSpec{.rows = 24, .heads = 64, .num_keys = 1200, .ranges = RangeShape::random, .seed = 31});
  const std::int64_t rows = w.rows, keys = w.num_keys;
  const int k = 100;
  const dsa::DeviceBuffer q = device_copy(w.q_fp8), weights = device_copy(w.weights);
  const dsa::DeviceBuffer key_codes = device_copy(w.keys), key_scales = device_copy(w.key_scales);
  dsa::DeviceBuffer ks = device_copy(w.ks), ke = device_copy(w.ke);  // rewritten between replays
  dsa::DeviceBuffer lengths = device_filled(4 * rows, 0);
  const dsa::DeviceBuffer graph_logits = device_filled(4 * rows * keys, 0xFF);
  const dsa::DeviceBuffer graph_indices = device_filled(4 * rows * k, 0xFF);
  const dsa::DeviceBuffer eager_logits = device_filled(4 * rows * keys, 0xFF);
  const dsa::DeviceBuffer eager_indices = device_filled(4 * rows * k, 0xFF);

  dsa::ExecContext query;
  query.backend = backend;
  GpuContext gpu(backend, std::max(dsa::mqa_logits_workspace_bytes(query),
                                   dsa::topk_workspace_bytes(rows, keys, k, query)));
  const dsa::ExecContext& ctx = gpu.ctx;
  const dsa::TensorView ks_view = device_view(ks, DType::int32, {rows});
  dsa::MqaLogitsOptions logits_options;
  logits_options.clean_logits = true;
  dsa::TopkOptions topk_options;
  topk_options.sorted = true;
  topk_options.row_starts = ks_view;
  topk_options.position_offsets = ks_view;
  const auto enqueue = [&](const dsa::DeviceBuffer& logits, const dsa::DeviceBuffer& indices) {
    const dsa::TensorView logits_view = device_view(logits, DType::float32, {rows, keys});
    return std::vector<dsa::Status>{
        dsa::mqa_logits(device_view(q, DType::float8_e4m3, {rows, w.heads, w.head_dim}),
                        device_view(key_codes, DType::float8_e4m3, {keys, w.head_dim}),
                        device_view(key_scales, DType::float32, {keys}),
                        device_view(weights, DType::float32, {rows, w.heads}), ks_view,
                        device_view(ke, DType::int32, {rows}), logits_view, logits_options, ctx),
        dsa::topk(logits_view, device_view(lengths, DType::int32, {rows}), k,
                  device_view(indices, DType::int32, {rows, k}), topk_options, ctx),
    };
  };
  auto stream = static_cast<cudaStream_t>(ctx.stream);
  const GraphExec exec = capture(stream, [&] { return enqueue(graph_logits, graph_indices); });
  ASSERT_NE(exec, nullptr);

  Rng rng(32);
  for (int replay = 0; replay < 4; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    if (replay > 0) {
      // New ranges anywhere in the keys, some empty, some ending at the last key.
      std::uniform_int_distribution<std::int32_t> key(0, static_cast<std::int32_t>(keys));
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int32_t a = key(rng), b = key(rng);
        w.ks[r] = std::min(a, b);
        w.ke[r] = r % 7 == 3 ? w.ks[r] : r % 5 == 1 ? static_cast<std::int32_t>(keys) : std::max(a, b);
      }
    }
    std::vector<std::int32_t> lens(static_cast<std::size_t>(rows));
    for (std::int64_t r = 0; r < rows; ++r) lens[r] = w.ke[r] - w.ks[r];
    DSA_GPU_ASSERT_OK(ks.copy_from_host(w.ks.data(), 4 * rows));
    DSA_GPU_ASSERT_OK(ke.copy_from_host(w.ke.data(), 4 * rows));
    DSA_GPU_ASSERT_OK(lengths.copy_from_host(lens.data(), 4 * rows));
    for (const dsa::DeviceBuffer* buffer : {&graph_logits, &graph_indices, &eager_logits, &eager_indices}) {
      ASSERT_CUDA(cudaMemsetAsync(buffer->data(), 0xFF, buffer->bytes(), stream));
    }
    ASSERT_CUDA(cudaGraphLaunch(exec.get(), stream));
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));
    for (const dsa::Status& status : enqueue(eager_logits, eager_indices)) DSA_GPU_ASSERT_OK(status);
    ASSERT_CUDA(cudaStreamSynchronize(stream));
    DSA_GPU_ASSERT_OK(dsa::read_device_error(ctx));
    const std::vector<std::uint8_t> logits_bytes = host_copy<std::uint8_t>(graph_logits);
    EXPECT_TRUE(logits_bytes == host_copy<std::uint8_t>(eager_logits)) << "logits";
    const std::vector<std::int32_t> got = host_copy<std::int32_t>(graph_indices);
    EXPECT_EQ(got, host_copy<std::int32_t>(eager_indices)) << "indices";

    const auto read = [&](std::int64_t r, std::int64_t c) { return logit_at(logits_bytes, DType::float32, r * keys + c); };
    const auto bound = [&](double, double magnitude) { return logits_tolerance(backend) * magnitude; };
    const auto untouched = [](std::int64_t, std::int64_t) { return true; };  // no column past the width
    EXPECT_TRUE(check_mqa_logits(w, w.reference(), false, keys, keys, true, read, bound, untouched));
    const std::vector<float> values = host_copy<float>(graph_logits);
    for (std::int64_t r = 0; r < rows; ++r) {
      std::vector<std::int32_t> want = reference_topk(values.data() + r * keys + w.ks[r], lens[r], k);
      for (auto& i : want) i = i < 0 ? i : i + w.ks[r];
      const std::vector<std::int32_t> row(got.begin() + r * k, got.begin() + (r + 1) * k);
      ASSERT_EQ(row, want) << "row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuPrefillGraph, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) { return backend_tag(info.param); });

}  // namespace
}  // namespace dsa_test::gpu
