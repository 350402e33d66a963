// Programmatic dependent launch (ExecContext::programmatic_dependent_launch):
// a decode step (lengths, the device planner, logits, top-k as cache slots,
// index_topk) gives bitwise what it gives without it, called one by one and
// replayed from a captured CUDA graph, and the error record still belongs to
// the last operation. So do chains beyond the decode step: store_index_keys
// and quantize_queries (fp8 and fp4) before the step scoring what they wrote
// (pages of 64 and 32 tokens, fp8 and fp4 caches), requests of uneven row
// counts (request_offsets, row tiles), and mqa_logits with the ragged top-k.
// Each step's inputs are written by the operation just before it, so a
// kernel that read before the one before it completed would read the poison
// its buffers start with.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/fp4_reference.hpp"
#include "common/prefill_inputs.hpp"
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

// ---- Chains beyond the decode step ---------------------------------------------

// A chain of library calls, each reading what the ones before it wrote, and
// the buffers it writes (poisoned with 0xFF bytes before every run).
struct PdlChain {
  Backend backend = Backend::cuda_generic;
  std::size_t workspace_bytes = 0;
  std::vector<std::pair<const char*, const dsa::DeviceBuffer*>> outputs;
  std::function<std::vector<dsa::Status>(const dsa::ExecContext&)> enqueue;
};

// Runs the chain with or without the overlap, called one by one or captured
// once and replayed twice, and returns the bytes it wrote.
std::vector<std::vector<std::uint8_t>> run_chain(const PdlChain& chain, bool overlap, bool captured) {
  GpuContext gpu(chain.backend, chain.workspace_bytes);
  gpu.ctx.programmatic_dependent_launch = overlap;
  const auto stream = static_cast<cudaStream_t>(gpu.ctx.stream);
  const auto poison = [&] {
    for (const auto& [name, buffer] : chain.outputs) {
      EXPECT_EQ(cudaMemsetAsync(buffer->data(), 0xFF, buffer->bytes(), stream), cudaSuccess) << name;
    }
  };
  if (captured) {
    cudaGraph_t raw_graph = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
    const std::vector<dsa::Status> statuses = chain.enqueue(gpu.ctx);
    EXPECT_EQ(cudaStreamEndCapture(stream, &raw_graph), cudaSuccess);
    const std::unique_ptr<CUgraph_st, decltype(&cudaGraphDestroy)> graph(raw_graph, cudaGraphDestroy);
    for (const dsa::Status& status : statuses) EXPECT_TRUE(status.ok()) << status.to_string();
    cudaGraphExec_t raw_exec = nullptr;
    if (raw_graph == nullptr || cudaGraphInstantiate(&raw_exec, graph.get(), 0) != cudaSuccess) {
      ADD_FAILURE() << "capture or instantiation failed";
      return {};
    }
    const std::unique_ptr<CUgraphExec_st, decltype(&cudaGraphExecDestroy)> exec(raw_exec, cudaGraphExecDestroy);
    for (int replay = 0; replay < 2; ++replay) {
      poison();
      EXPECT_EQ(cudaGraphLaunch(exec.get(), stream), cudaSuccess);
    }
    EXPECT_TRUE(gpu.sync().ok());  // before the graph is destroyed
  } else {
    poison();
    for (const dsa::Status& status : chain.enqueue(gpu.ctx)) EXPECT_TRUE(status.ok()) << status.to_string();
    EXPECT_TRUE(gpu.sync().ok());
  }
  const dsa::Status recorded = dsa::read_device_error(gpu.ctx);
  EXPECT_TRUE(recorded.ok()) << recorded.to_string();
  std::vector<std::vector<std::uint8_t>> bytes;
  for (const auto& output : chain.outputs) bytes.push_back(host_copy<std::uint8_t>(*output.second));
  return bytes;
}

// With the overlap, called one by one and replayed, the chain writes
// bitwise what it writes without it (`plain`).
void expect_overlap_changes_nothing(const PdlChain& chain, const std::vector<std::vector<std::uint8_t>>& plain) {
  for (const bool captured : {false, true}) {
    const auto got = run_chain(chain, true, captured);
    ASSERT_EQ(got.size(), plain.size());
    for (std::size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(got[i] == plain[i]) << chain.outputs[i].first << (captured ? " replayed" : " eager");
    }
  }
}

template <typename T>
std::vector<T> as_vector(const std::vector<std::uint8_t>& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// store_index_keys writes the cache and quantize_queries (or
// quantize_queries_fp4) the queries and weights that the decode step after
// them scores: lengths, the planner, paged_mqa_logits and index_topk.
struct WriteThenScoreCase {
  std::string name;
  bool fp4_keys;
  bool fp4_queries;
  int page_tokens;
  Backend backend;
};

void PrintTo(const WriteThenScoreCase& c, std::ostream* os) { *os << c.name; }

class GpuPdlWriteThenScore : public ::testing::TestWithParam<WriteThenScoreCase> {};

TEST_P(GpuPdlWriteThenScore, BitwiseTheSameAndRight) {
  DSA_REQUIRE_GPU();
  const WriteThenScoreCase c = GetParam();
  Workload w = make_workload(WorkloadSpec{.batch = 4, .next_n = 2, .min_prefix = 200, .max_prefix = 1500,
                                          .page_tokens = c.page_tokens, .seed = 60u + c.page_tokens});
  const CacheGeometry& g = w.geometry;
  const std::int64_t slots = g.num_slots(), rows = w.rows();
  // Keys for every slot: for an fp4 cache the values of the workload's fp8
  // codes (whose fp4 quantization fp4_cache_of models), else random keys
  // stored into the workload's own cache by the reference quantizer.
  std::vector<float> keys(static_cast<std::size_t>(slots * w.head_dim));
  Rng rng(61);
  for (std::int64_t slot = 0; slot < slots; ++slot) {
    float* key = keys.data() + slot * w.head_dim;
    if (c.fp4_keys) {
      for (int d = 0; d < w.head_dim; ++d) key[d] = cached_key(w.cache.data(), g, slot, d);
    } else {
      random_vector(rng, key, w.head_dim);
    }
  }
  Fp4Cache fp4_cache = fp4_cache_of(w);
  Fp4Queries fp4_queries = fp4_queries_of(w);
  if (!c.fp4_keys) {
    for (std::int64_t slot = 0; slot < slots; ++slot) {
      store_token(keys.data() + slot * w.head_dim, slot, g, false, w.cache.data());
    }
  }
  std::vector<std::int64_t> slot_mapping(static_cast<std::size_t>(slots));
  for (std::int64_t i = 0; i < slots; ++i) slot_mapping[static_cast<std::size_t>(i)] = slots - 1 - i;
  std::vector<float> reversed_keys(keys.size());
  for (std::int64_t i = 0; i < slots; ++i) {
    std::copy_n(keys.data() + (slots - 1 - i) * w.head_dim, w.head_dim, reversed_keys.data() + i * w.head_dim);
  }

  const DeviceWorkload dw(w);
  const dsa::DeviceBuffer keys_device = device_copy(reversed_keys), slots_device = device_copy(slot_mapping);
  const dsa::DeviceBuffer q_raw = device_copy(w.q), gate = device_copy(w.head_gate);
  const dsa::DeviceBuffer prefix = device_copy(w.prefix_lens);
  const std::int64_t width = c.fp4_keys ? 68 : w.head_dim + 4;
  const std::int64_t q_bytes = c.fp4_queries ? w.head_dim / 2 : w.head_dim;
  const int workers = workers_for(dsa::ExecContext{});
  const int k = 64;
  const dsa::DeviceBuffer cache = device_filled(static_cast<std::size_t>(g.num_pages * c.page_tokens * width), 0xFF);
  const dsa::DeviceBuffer q = device_filled(static_cast<std::size_t>(rows * w.heads * q_bytes), 0xFF);
  const dsa::DeviceBuffer q_scales = device_filled(static_cast<std::size_t>(4 * rows * w.heads), 0xFF);
  const dsa::DeviceBuffer weights = device_filled(static_cast<std::size_t>(4 * rows * w.heads), 0xFF);
  const dsa::DeviceBuffer lens = device_filled(static_cast<std::size_t>(4 * rows), 0xFF);
  const dsa::DeviceBuffer schedule = device_filled(static_cast<std::size_t>(8 * (workers + 1)), 0xFF);
  const dsa::DeviceBuffer logits = device_filled(static_cast<std::size_t>(4 * rows * w.max_context_len), 0xFF);
  const dsa::DeviceBuffer indices = device_filled(static_cast<std::size_t>(4 * rows * k), 0xFF);

  dsa::ExecContext query;
  query.backend = c.backend;
  dsa::IndexTopkOptions index_options;
  index_options.k = k;
  index_options.sorted = true;
  index_options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
  PdlChain chain;
  chain.backend = c.backend;
  chain.workspace_bytes = std::max({dsa::store_index_keys_workspace_bytes(query),
                                    dsa::quantize_queries_workspace_bytes(query),
                                    dsa::paged_mqa_logits_workspace_bytes(query),
                                    dsa::index_topk_workspace_bytes(rows, w.max_context_len, index_options, query)});
  chain.outputs = {{"cache", &cache}, {"q", &q},           {"weights", &weights}, {"lengths", &lens},
                   {"schedule", &schedule}, {"logits", &logits}, {"index_topk", &indices}};
  if (c.fp4_queries) chain.outputs.emplace_back("q_block_scales", &q_scales);
  chain.enqueue = [&](const dsa::ExecContext& ctx) {
    const dsa::TensorView cache_view = device_view(cache, DType::uint8, {g.num_pages, c.page_tokens, 1, width},
                                                   {c.page_tokens * width, width, width, 1});
    const dsa::TensorView q_view = device_view(q, c.fp4_queries ? DType::uint8 : DType::float8_e4m3,
                                               {w.batch, w.next_n, w.heads, q_bytes});
    const dsa::TensorView scales_view = device_view(q_scales, DType::int32, {w.batch, w.next_n, w.heads});
    const dsa::TensorView weights_view = device_view(weights, DType::float32, {rows, w.heads});
    const dsa::TensorView lens_view = device_view(lens, DType::int32, {w.batch, w.next_n});
    const dsa::TensorView schedule_view = device_view(schedule, DType::int32, {workers + 1, 2});
    const dsa::TensorView q_in = device_view(q_raw, DType::float32, {w.batch, w.next_n, w.heads, w.head_dim});
    const dsa::TensorView gate_in = device_view(gate, DType::float32, {rows, w.heads});
    const dsa::LogitsPath path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, ctx);
    dsa::LogitsOptions logits_options;
    logits_options.clean_logits = true;
    logits_options.path = path;
    dsa::IndexTopkOptions topk_options = index_options;
    topk_options.path = path;
    if (c.fp4_queries) {
      logits_options.q_block_scales = scales_view;
      topk_options.q_block_scales = scales_view;
    }
    dsa::QuantizeQueriesOptions quantize_options;
    quantize_options.weight_scale = default_weight_scale(w.heads, w.head_dim);
    return std::vector<dsa::Status>{
        dsa::store_index_keys(device_view(keys_device, DType::float32, {slots, w.head_dim}),
                              device_view(slots_device, DType::int64, {slots}), cache_view, {}, ctx),
        c.fp4_queries
            ? dsa::quantize_queries_fp4(q_in, gate_in, q_view, scales_view, weights_view, quantize_options, ctx)
            : dsa::quantize_queries(q_in, gate_in, q_view, weights_view, quantize_options, ctx),
        dsa::causal_context_lens(device_view(prefix, DType::int32, {w.batch}), w.next_n, lens_view, ctx),
        dsa::plan_schedule(lens_view, workers, path, schedule_view, ctx),
        dsa::paged_mqa_logits(q_view, cache_view, weights_view, lens_view, dw.block_table_view(), schedule_view,
                              w.max_context_len, device_view(logits, DType::float32, {rows, w.max_context_len}),
                              logits_options, ctx),
        dsa::index_topk(q_view, cache_view, weights_view, lens_view, dw.block_table_view(), schedule_view,
                        w.max_context_len, dsa::TensorView{}, device_view(indices, DType::int32, {rows, k}),
                        topk_options, ctx),
    };
  };

  // Without the overlap: what the references write.
  const auto plain = run_chain(chain, false, false);
  ASSERT_EQ(plain.size(), chain.outputs.size());
  EXPECT_TRUE(plain[0] == (c.fp4_keys ? fp4_cache.bytes : w.cache)) << "cache";
  EXPECT_TRUE(plain[1] == (c.fp4_queries ? fp4_queries.codes : w.q_fp8)) << "q";
  EXPECT_EQ(as_vector<float>(plain[2]), c.fp4_queries ? fp4_queries.weights : w.weights);
  EXPECT_EQ(as_vector<std::int32_t>(plain[3]), w.context_lens);
  if (c.fp4_queries) EXPECT_EQ(as_vector<std::int32_t>(plain[7]), fp4_queries.scales);
  const ReferenceLogits ref =
      c.fp4_keys ? fp4_reference_logits(w, fp4_cache, c.fp4_queries ? &fp4_queries : nullptr) : w.reference();
  EXPECT_TRUE(logits_match(w, ref, plain[5], DType::float32, w.max_context_len, true, logits_tolerance(c.backend)));
  expect_overlap_changes_nothing(chain, plain);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuPdlWriteThenScore,
    ::testing::Values(WriteThenScoreCase{"fp8_p64_generic", false, false, 64, Backend::cuda_generic},
                      WriteThenScoreCase{"fp8_p64_automatic", false, false, 64, Backend::automatic},
                      WriteThenScoreCase{"fp8_p32_generic", false, false, 32, Backend::cuda_generic},
                      WriteThenScoreCase{"fp8_p32_automatic", false, false, 32, Backend::automatic},
                      WriteThenScoreCase{"fp4_fp4_queries_p64_generic", true, true, 64, Backend::cuda_generic},
                      WriteThenScoreCase{"fp4_fp4_queries_p32_automatic", true, true, 32, Backend::automatic},
                      WriteThenScoreCase{"fp4_fp8_queries_p32_generic", true, false, 32, Backend::cuda_generic},
                      WriteThenScoreCase{"fp4_fp8_queries_p64_automatic", true, false, 64, Backend::automatic}),
    [](const ::testing::TestParamInfo<WriteThenScoreCase>& info) { return info.param.name; });

// Requests of uneven row counts: lengths and the planner with
// request_offsets, paged_mqa_logits over row tiles, topk as cache slots
// through each request's block-table row, index_topk.
class GpuPdlVarlen : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuPdlVarlen, RowTilesBitwiseTheSameAndRight) {
  DSA_REQUIRE_GPU();
  const VarlenWorkload v = make_varlen_workload(
      VarlenSpec{.rows_per_request = {1, 19, 3, 0, 9, 2}, .heads = 64, .max_prefix = 2500, .seed = 71});
  const DeviceVarlen dv(v);
  const std::int64_t rows = v.total_rows(), cols = v.rows.max_context_len;
  // The causal lengths prefix_b + t + 1: each request's prefix is its first row's length - 1.
  std::vector<std::int32_t> prefix(static_cast<std::size_t>(v.requests), 0);
  for (std::int64_t b = 0; b < v.requests; ++b) {
    const std::int32_t first = v.request_offsets[static_cast<std::size_t>(b)];
    if (first < v.request_offsets[static_cast<std::size_t>(b) + 1]) {
      prefix[static_cast<std::size_t>(b)] = v.rows.context_lens[static_cast<std::size_t>(first)] - 1;
    }
  }
  const dsa::DeviceBuffer prefix_device = device_copy(prefix);
  const int workers = workers_for(dsa::ExecContext{});
  const int k = 64;
  const dsa::DeviceBuffer lens = device_filled(static_cast<std::size_t>(4 * rows), 0xFF);
  const dsa::DeviceBuffer schedule = device_filled(static_cast<std::size_t>(8 * (workers + 1)), 0xFF);
  const dsa::DeviceBuffer logits = device_filled(static_cast<std::size_t>(4 * rows * cols), 0xFF);
  const dsa::DeviceBuffer slots = device_filled(static_cast<std::size_t>(4 * rows * k), 0xFF);
  const dsa::DeviceBuffer indices = device_filled(static_cast<std::size_t>(4 * rows * k), 0xFF);

  dsa::ExecContext query;
  query.backend = GetParam();
  dsa::IndexTopkOptions index_options;
  index_options.k = k;
  index_options.sorted = true;
  index_options.path = dsa::LogitsPath::native;
  index_options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
  index_options.request_offsets = dv.offsets_view();
  PdlChain chain;
  chain.backend = GetParam();
  chain.workspace_bytes = std::max({dsa::paged_mqa_logits_workspace_bytes(query),
                                    dsa::topk_workspace_bytes(rows, cols, k, query),
                                    dsa::index_topk_workspace_bytes(rows, cols, index_options, query)});
  chain.outputs = {{"lengths", &lens}, {"schedule", &schedule}, {"logits", &logits}, {"topk slots", &slots},
                   {"index_topk", &indices}};
  chain.enqueue = [&](const dsa::ExecContext& ctx) {
    const dsa::TensorView lens_view = device_view(lens, DType::int32, {rows});
    const dsa::TensorView schedule_view = device_view(schedule, DType::int32, {workers + 1, 2});
    const dsa::TensorView logits_view = device_view(logits, DType::float32, {rows, cols});
    dsa::LogitsOptions logits_options;
    logits_options.clean_logits = true;
    logits_options.path = dsa::LogitsPath::native;
    logits_options.request_offsets = dv.offsets_view();
    dsa::TopkOptions topk_options;
    topk_options.sorted = true;
    topk_options.block_table = dv.table_view();
    topk_options.request_offsets = dv.offsets_view();
    topk_options.page_size = v.rows.geometry.page_tokens;
    return std::vector<dsa::Status>{
        dsa::causal_context_lens(device_view(prefix_device, DType::int32, {v.requests}), 1, lens_view, ctx,
                                 dv.offsets_view()),
        dsa::plan_schedule(lens_view, workers, dsa::LogitsPath::native, schedule_view, ctx, dv.offsets_view()),
        dsa::paged_mqa_logits(dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), lens_view, dv.table_view(),
                              schedule_view, cols, logits_view, logits_options, ctx),
        dsa::topk(logits_view, lens_view, k, device_view(slots, DType::int32, {rows, k}), topk_options, ctx),
        dsa::index_topk(dv.q_view(), dv.rows.cache_view(), dv.rows.weights_view(), lens_view, dv.table_view(),
                        schedule_view, cols, dsa::TensorView{}, device_view(indices, DType::int32, {rows, k}),
                        index_options, ctx),
    };
  };
  const auto plain = run_chain(chain, false, false);
  ASSERT_EQ(plain.size(), chain.outputs.size());
  EXPECT_EQ(as_vector<std::int32_t>(plain[0]), v.rows.context_lens);
  EXPECT_TRUE(logits_match(v.rows, v.reference(), plain[2], DType::float32, cols, true,
                           logits_tolerance(GetParam())));
  expect_overlap_changes_nothing(chain, plain);
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuPdlVarlen, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) { return backend_tag(info.param); });

// Prefill: mqa_logits in the full form, the ragged top-k of each row's range
// (row_starts = position_offsets = ks), then the compressed form and its
// top-k (position_offsets = ks).
class GpuPdlPrefill : public ::testing::TestWithParam<Backend> {};

TEST_P(GpuPdlPrefill, MqaLogitsAndRaggedTopkBitwiseTheSame) {
  DSA_REQUIRE_GPU();
  const MqaWorkload w = make_mqa_workload(
      MqaSpec{.rows = 20, .heads = 64, .num_keys = 900, .ranges = RangeShape::random, .seed = 81});
  const std::int64_t rows = w.rows, keys = w.num_keys, width = std::max<std::int64_t>(w.longest_range(), 1);
  const int k = 64;
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) lengths[r] = w.ke[r] - w.ks[r];
  const dsa::DeviceBuffer q = device_copy(w.q_fp8), weights = device_copy(w.weights);
  const dsa::DeviceBuffer key_codes = device_copy(w.keys), key_scales = device_copy(w.key_scales);
  const dsa::DeviceBuffer ks = device_copy(w.ks), ke = device_copy(w.ke), lengths_device = device_copy(lengths);
  const dsa::DeviceBuffer full = device_filled(static_cast<std::size_t>(4 * rows * keys), 0xFF);
  const dsa::DeviceBuffer full_indices = device_filled(static_cast<std::size_t>(4 * rows * k), 0xFF);
  const dsa::DeviceBuffer compressed = device_filled(static_cast<std::size_t>(4 * rows * width), 0xFF);
  const dsa::DeviceBuffer compressed_indices = device_filled(static_cast<std::size_t>(4 * rows * k), 0xFF);

  dsa::ExecContext query;
  query.backend = GetParam();
  PdlChain chain;
  chain.backend = GetParam();
  chain.workspace_bytes = std::max({dsa::mqa_logits_workspace_bytes(query),
                                    dsa::topk_workspace_bytes(rows, keys, k, query)});
  chain.outputs = {{"full logits", &full}, {"full top-k", &full_indices}, {"compressed logits", &compressed},
                   {"compressed top-k", &compressed_indices}};
  chain.enqueue = [&](const dsa::ExecContext& ctx) {
    const dsa::TensorView ks_view = device_view(ks, DType::int32, {rows});
    const dsa::TensorView lengths_view = device_view(lengths_device, DType::int32, {rows});
    const dsa::TensorView full_view = device_view(full, DType::float32, {rows, keys});
    const dsa::TensorView compressed_view = device_view(compressed, DType::float32, {rows, width});
    const auto score = [&](const dsa::TensorView& out, bool compressed_form) {
      dsa::MqaLogitsOptions options;
      options.clean_logits = true;
      options.compressed = compressed_form;
      options.max_seqlen_k = compressed_form ? width : 0;
      return dsa::mqa_logits(device_view(q, DType::float8_e4m3, {rows, w.heads, w.head_dim}),
                             device_view(key_codes, DType::float8_e4m3, {keys, w.head_dim}),
                             device_view(key_scales, DType::float32, {keys}),
                             device_view(weights, DType::float32, {rows, w.heads}), ks_view,
                             device_view(ke, DType::int32, {rows}), out, options, ctx);
    };
    dsa::TopkOptions full_topk;
    full_topk.sorted = true;
    full_topk.row_starts = ks_view;
    full_topk.position_offsets = ks_view;
    dsa::TopkOptions compressed_topk;
    compressed_topk.sorted = true;
    compressed_topk.position_offsets = ks_view;
    return std::vector<dsa::Status>{
        score(full_view, false),
        dsa::topk(full_view, lengths_view, k, device_view(full_indices, DType::int32, {rows, k}), full_topk, ctx),
        score(compressed_view, true),
        dsa::topk(compressed_view, lengths_view, k, device_view(compressed_indices, DType::int32, {rows, k}),
                  compressed_topk, ctx),
    };
  };
  const auto plain = run_chain(chain, false, false);
  ASSERT_EQ(plain.size(), chain.outputs.size());
  const auto read = [&](std::int64_t r, std::int64_t c) { return logit_at(plain[0], DType::float32, r * keys + c); };
  const auto bound = [&](double, double magnitude) { return logits_tolerance(GetParam()) * magnitude; };
  const auto untouched = [](std::int64_t, std::int64_t) { return true; };  // no column past the width
  EXPECT_TRUE(check_mqa_logits(w, w.reference(), false, keys, keys, true, read, bound, untouched));
  // Each top-k: the reference selection from the logits it read, as key indices.
  const auto expect_selection = [&](std::size_t values_output, std::int64_t stride, bool full_form) {
    const std::vector<float> values = as_vector<float>(plain[values_output]);
    const std::vector<std::int32_t> got = as_vector<std::int32_t>(plain[values_output + 1]);
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int32_t ks_r = w.ks[static_cast<std::size_t>(r)];
      std::vector<std::int32_t> want =
          reference_topk(values.data() + r * stride + (full_form ? ks_r : 0), lengths[r], k);
      for (auto& i : want) i = i < 0 ? i : i + ks_r;
      const std::vector<std::int32_t> row(got.begin() + r * k, got.begin() + (r + 1) * k);
      ASSERT_EQ(row, want) << chain.outputs[values_output + 1].first << " row " << r;
    }
  };
  expect_selection(0, keys, true);
  expect_selection(2, width, false);
  expect_overlap_changes_nothing(chain, plain);
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuPdlPrefill, ::testing::Values(Backend::cuda_generic, Backend::automatic),
                         [](const ::testing::TestParamInfo<Backend>& info) { return backend_tag(info.param); });

}  // namespace
}  // namespace dsa_test::gpu
