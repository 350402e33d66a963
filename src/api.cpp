// The public operations: validate -> choose a backend -> call exactly one
// backend entry point (src/backend.hpp).
#include <algorithm>
#include <cstdint>
#include <new>
#include <string>

#include "backend.hpp"
#include "common/device_error.hpp"
#include "cpu/parallel.hpp"
#include "dsa/dsa.hpp"
#include "validate.hpp"

namespace dsa {

using detail::Engine;
namespace cpu = detail::cpu;
namespace cuda = detail::cuda;

namespace {

// The head dimension resolve_logits_path assumes (the DeepSeek-V3.2 indexer's).
constexpr int kModelHeadDim = 128;
// plan_schedule resolves `automatic` for the model's indexer head count.
constexpr int kModelHeads = 64;

bool is_cpu_backend(Backend backend) {
  return backend == Backend::cpu || backend == Backend::cpu_reference;
}

bool is_cuda_engine(Engine engine) {
  return engine == Engine::cuda_generic || engine == Engine::cuda_hopper;
}

// The engine for an operation without a Hopper-specific kernel.
Status select_engine(const char* op, Device device, const ExecContext& ctx, Engine* engine) {
  if (!is_cpu_backend(ctx.backend) && ctx.backend != Backend::automatic &&
      ctx.backend != Backend::cuda_generic && ctx.backend != Backend::cuda_hopper) {
    return {ErrorCode::invalid_argument, std::string(op) + ": ctx.backend: not a Backend value, got " +
                                             std::to_string(static_cast<int>(ctx.backend))};
  }
  const bool on_cuda = device.type == DeviceType::cuda;
  if (on_cuda == is_cpu_backend(ctx.backend) && ctx.backend != Backend::automatic) {
    return {ErrorCode::bad_device, std::string(op) + ": ctx.backend: the " + backend_name(ctx.backend) +
                                       " backend cannot run on tensors in " +
                                       (on_cuda ? "CUDA device memory" : "host memory")};
  }
  if (!on_cuda) {
    if (ctx.num_threads < 0 || ctx.num_threads > kMaxCpuThreads) {
      return {ErrorCode::invalid_argument,
              std::string(op) + ": ctx.num_threads: must be in [0, " + std::to_string(kMaxCpuThreads) +
                  "] (0: the hardware concurrency), got " + std::to_string(ctx.num_threads)};
    }
    *engine = ctx.backend == Backend::cpu_reference ? Engine::cpu_reference : Engine::cpu_parallel;
  } else {
    *engine = Engine::cuda_generic;
  }
  return Status::success();
}

bool hopper_candidate(Device device, const ExecContext& ctx) {
  return device.type == DeviceType::cuda &&
         (ctx.backend == Backend::automatic || ctx.backend == Backend::cuda_hopper) &&
         cuda::hopper_available(device.index);
}

// The page size takes no part (the Hopper kernels read both), so that
// plan_schedule, which sees no cache, resolves `automatic` as the scoring
// call does. Rows of uneven requests (request_offsets) are scored natively,
// in row tiles, by every backend.
LogitsPath resolve_path(LogitsPath requested, std::int64_t next_n, std::int64_t heads, int head_dim,
                        Device device, const ExecContext& ctx, bool uneven = false) {
  if (requested != LogitsPath::automatic) return requested;
  if (uneven) return LogitsPath::native;
  // The CPU and generic CUDA backends score every next_n natively; the Hopper
  // kernels only some, and flatten the rest when their next_n = 1 variant exists.
  if (hopper_candidate(device, ctx) &&
      !cuda::hopper_supports_native(static_cast<int>(next_n), static_cast<int>(heads), head_dim) &&
      cuda::hopper_supports_native(1, static_cast<int>(heads), head_dim)) {
    return LogitsPath::per_token;
  }
  return LogitsPath::native;
}

// The engine for the scoring operations (paged_mqa_logits, index_topk).
Status select_scoring_engine(const char* op, const detail::LogitsProblem& p, const ExecContext& ctx,
                             Engine* engine) {
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, engine));
  if (!is_cuda_engine(*engine)) return Status::success();
  // The Hopper kernels read fp8 keys with fp8 queries and fp4 keys with fp8
  // or fp4 queries; fp4 queries over fp8 keys go to the generic kernels.
  const bool fp4_refused = p.fp4_queries() && !p.fp4_keys();
  if (ctx.backend == Backend::cuda_hopper && fp4_refused) {
    return {ErrorCode::unsupported,
            std::string(op) + ": ctx.backend: cuda_hopper reads fp8 keys with fp8 queries and fp4 keys with fp8 or "
                "fp4 queries, this call has fp4 queries over fp8 keys; use automatic or cuda_generic"};
  }
  const bool hopper_serves =
      hopper_candidate(p.device, ctx) && !fp4_refused &&
      cuda::hopper_supports_native(p.rows_per_unit(), static_cast<int>(p.heads), p.head_dim);
  if (ctx.backend == Backend::cuda_hopper && !hopper_serves) {
    return {ErrorCode::unsupported,
            std::string(op) + ": ctx.backend: cuda_hopper needs an sm_90 device, a build with sm_90a and a " +
                "kernel for next_n = " + std::to_string(p.rows_per_unit()) + ", H = " +
                std::to_string(p.heads) + ", D = " + std::to_string(p.head_dim) + " (" +
                logits_path_name(p.path) + " path)"};
  }
  *engine = hopper_serves ? Engine::cuda_hopper : Engine::cuda_generic;
  return Status::success();
}

Status check_workspace(const char* op, const ExecContext& ctx, std::size_t required) {
  if (required == 0) return Status::success();
  const std::string where = std::string(op) + ": ctx.workspace: ";
  if (ctx.workspace.bytes < required) {
    return {ErrorCode::workspace_too_small,
            where + "has " + std::to_string(ctx.workspace.bytes) + " bytes but " + op + " needs " +
                std::to_string(required) + " (see " + op + "_workspace_bytes)"};
  }
  if (ctx.workspace.data == nullptr) return {ErrorCode::null_pointer, where + "data pointer is null"};
  if (reinterpret_cast<std::uintptr_t>(ctx.workspace.data) % kWorkspaceAlignment != 0) {
    return {ErrorCode::bad_alignment,
            where + "pointer is not " + std::to_string(kWorkspaceAlignment) + "-byte aligned"};
  }
  return Status::success();
}

// CPU operations allocate their buffers (staged logits, per-thread scratch)
// as they run: a failed allocation becomes the call's Status.
template <typename Call>
Status run_cpu(const char* op, Call&& call) {
  try {
    return call();
  } catch (const std::bad_alloc&) {
    return {ErrorCode::out_of_memory,
            std::string(op) + ": the host memory the CPU backend needs for this call could not be allocated"};
  }
}

// Checks the workspace, launches inside the operation's scope on the
// tensors' device (cuda::OperationScope), and with ctx.check_device_errors
// waits for and returns the first data-dependent error the kernels recorded.
template <typename Launch>
Status run_cuda(const char* op, Device device, const ExecContext& ctx, std::size_t required_workspace,
                Launch&& launch, cuda::RecordClear clear = cuda::RecordClear::by_scope) {
  DSA_RETURN_IF_ERROR(check_workspace(op, ctx, required_workspace));
  {
    cuda::OperationScope scope;
    DSA_RETURN_IF_ERROR(scope.enter(device.index, ctx, clear));
    DSA_RETURN_IF_ERROR(launch());
  }
  if (ctx.check_device_errors) return cuda::read_device_error(ctx, op);
  return Status::success();
}

// `automatic` runs the fused pass where it measured at least as fast as
// staging the logits and selecting from them (docs/performance.md).
// On CUDA nowhere: the Hopper fused pass is slower than logits then top-k
// at every point measured (docs/performance.md).
bool fused_on_cuda(IndexTopkStrategy strategy) { return strategy == IndexTopkStrategy::fused; }

// On the CPU everywhere: it costs what staging costs, less where rows no
// longer than k need no scores, and spares the logits matrix
// (docs/performance.md, CPU backend).
bool fused_on_cpu(IndexTopkStrategy strategy) { return strategy != IndexTopkStrategy::logits_then_topk; }

Status context_lens_op(const char* op, detail::LengthConvention convention, const TensorView& input,
                       int next_n, const TensorView& out, const ExecContext& ctx,
                       const TensorView& request_offsets = {}) {
  detail::LengthsProblem p;
  DSA_RETURN_IF_ERROR(
      detail::validate_context_lens(op, convention, input, next_n, "out", out, request_offsets, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) return run_cpu(op, [&] { return cpu::context_lens(p, ctx); });
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::context_lens(p, ctx); });
}

}  // namespace

const char* backend_name(Backend backend) noexcept {
  switch (backend) {
    case Backend::automatic: return "automatic";
    case Backend::cpu_reference: return "cpu_reference";
    case Backend::cpu: return "cpu";
    case Backend::cuda_generic: return "cuda_generic";
    case Backend::cuda_hopper: return "cuda_hopper";
  }
  return "unknown";
}

const char* key_format_name(KeyFormat format) noexcept {
  switch (format) {
    case KeyFormat::automatic: return "automatic";
    case KeyFormat::fp8_e4m3: return "fp8_e4m3";
    case KeyFormat::fp4_e2m1: return "fp4_e2m1";
  }
  return "unknown";
}

const char* logits_path_name(LogitsPath path) noexcept {
  switch (path) {
    case LogitsPath::automatic: return "automatic";
    case LogitsPath::native: return "native";
    case LogitsPath::per_token: return "per_token";
  }
  return "unknown";
}

const char* index_topk_strategy_name(IndexTopkStrategy strategy) noexcept {
  switch (strategy) {
    case IndexTopkStrategy::automatic: return "automatic";
    case IndexTopkStrategy::fused: return "fused";
    case IndexTopkStrategy::logits_then_topk: return "logits_then_topk";
  }
  return "unknown";
}

Status read_device_error(const ExecContext& ctx) {
  // CPU operations report their errors directly; only a CUDA workspace holds a record.
  if (is_cpu_backend(ctx.backend) || ctx.workspace.data == nullptr || !built_with_cuda()) {
    return Status::success();
  }
  return cuda::read_device_error(ctx, "read_device_error");
}

LogitsPath resolve_logits_path(LogitsPath requested, int next_n, int num_heads, Device device,
                               const ExecContext& ctx) {
  return resolve_path(requested, next_n, num_heads, kModelHeadDim, device, ctx);
}

int default_num_workers(Device device, const ExecContext& ctx) {
  if (device.type == DeviceType::cuda) return std::max(cuda::multiprocessor_count(device.index), 1);
  return cpu::thread_count(ctx);
}

Status plan_schedule(const TensorView& context_lens, int num_workers, LogitsPath path,
                     const TensorView& schedule, const ExecContext& ctx, const TensorView& request_offsets) {
  const char* op = "plan_schedule";
  detail::ScheduleProblem p;
  DSA_RETURN_IF_ERROR(
      detail::validate_plan_schedule(op, context_lens, num_workers, path, schedule, request_offsets, &p));
  p.path = resolve_path(path, p.next_n, kModelHeads, kModelHeadDim, p.device, ctx, p.varlen.offsets != nullptr);
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) return run_cpu(op, [&] { return cpu::plan_schedule(p, ctx); });
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(), [&] { return cuda::plan_schedule(p, ctx); },
                  cuda::RecordClear::by_first_kernel);
}

Status context_lens_and_schedule(LengthConvention convention, const TensorView& lens, int next_n,
                                 const TensorView& context_lens, int num_workers, LogitsPath path,
                                 const TensorView& schedule, const ExecContext& ctx,
                                 const TensorView& request_offsets) {
  const char* op = "context_lens_and_schedule";
  detail::LengthsProblem lengths;
  detail::ScheduleProblem plan;
  DSA_RETURN_IF_ERROR(detail::validate_context_lens_and_schedule(
      convention, lens, next_n, context_lens, num_workers, path, schedule, request_offsets, &lengths, &plan));
  plan.path =
      resolve_path(path, plan.next_n, kModelHeads, kModelHeadDim, plan.device, ctx, plan.varlen.offsets != nullptr);
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, plan.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::context_lens_and_schedule(lengths, plan, ctx); });
  }
  return run_cuda(op, plan.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::context_lens_and_schedule(lengths, plan, ctx); },
                  cuda::RecordClear::by_first_kernel);
}

Status store_index_keys(const TensorView& keys, const TensorView& slot_mapping, const TensorView& cache,
                        const StoreKeysOptions& options, const ExecContext& ctx) {
  const char* op = "store_index_keys";
  detail::StoreKeysProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_store_keys(keys, slot_mapping, cache, options, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::store_index_keys(p, engine == Engine::cpu_parallel, ctx); });
  }
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::store_index_keys(p, ctx); });
}

std::size_t store_index_keys_workspace_bytes(const ExecContext& ctx) {
  return is_cpu_backend(ctx.backend) ? 0 : cuda::workspace_bytes_basic();
}

Status quantize_queries(const TensorView& q, const TensorView& head_gate, const TensorView& q_fp8,
                        const TensorView& weights, const QuantizeQueriesOptions& options,
                        const ExecContext& ctx) {
  const char* op = "quantize_queries";
  detail::QuantizeQueriesProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_quantize_queries(q, head_gate, q_fp8, nullptr, weights, options, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::quantize_queries(p, engine == Engine::cpu_parallel, ctx); });
  }
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::quantize_queries(p, ctx); });
}

Status quantize_queries_fp4(const TensorView& q, const TensorView& head_gate, const TensorView& q_codes,
                            const TensorView& q_block_scales, const TensorView& weights,
                            const QuantizeQueriesOptions& options, const ExecContext& ctx) {
  const char* op = "quantize_queries_fp4";
  detail::QuantizeQueriesProblem p;
  DSA_RETURN_IF_ERROR(
      detail::validate_quantize_queries(q, head_gate, q_codes, &q_block_scales, weights, options, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::quantize_queries(p, engine == Engine::cpu_parallel, ctx); });
  }
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::quantize_queries(p, ctx); });
}

std::size_t quantize_queries_workspace_bytes(const ExecContext& ctx) {
  return is_cpu_backend(ctx.backend) ? 0 : cuda::workspace_bytes_basic();
}

Status causal_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                           const ExecContext& ctx) {
  return causal_context_lens(prefix_lens, next_n, out, ctx, TensorView{});
}

Status causal_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                           const ExecContext& ctx, const TensorView& request_offsets) {
  return context_lens_op("causal_context_lens", detail::LengthConvention::causal, prefix_lens, next_n,
                         out, ctx, request_offsets);
}

Status expanded_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                             const ExecContext& ctx) {
  return context_lens_op("expanded_context_lens", detail::LengthConvention::expanded, prefix_lens,
                         next_n, out, ctx);
}

Status legacy_context_lens(const TensorView& lens, int next_n, const TensorView& out,
                           const ExecContext& ctx) {
  return context_lens_op("legacy_context_lens", detail::LengthConvention::legacy, lens, next_n, out, ctx);
}

Status paged_mqa_logits(const TensorView& q, const TensorView& key_cache, const TensorView& weights,
                        const TensorView& context_lens, const TensorView& block_table,
                        const TensorView& schedule, std::int64_t max_context_len,
                        const TensorView& logits, const LogitsOptions& options, const ExecContext& ctx) {
  const char* op = "paged_mqa_logits";
  detail::LogitsProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_scoring_inputs(
      op, {q, key_cache, weights, context_lens, block_table, schedule, max_context_len, options.page_size,
           options.key_format, options.q_block_scales, options.request_offsets},
      &p));
  DSA_RETURN_IF_ERROR(detail::validate_logits_output(logits, options, &p));
  p.path = resolve_path(options.path, p.next_n, p.heads, p.head_dim, p.device, ctx, p.varlen.offsets != nullptr);
  Engine engine;
  DSA_RETURN_IF_ERROR(select_scoring_engine(op, p, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::paged_mqa_logits(p, engine == Engine::cpu_parallel, ctx); });
  }
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(),
                  [&] { return cuda::paged_mqa_logits(p, engine == Engine::cuda_hopper, ctx); });
}

Status plan_mqa_logits_chunks(const TensorView& ks, const TensorView& ke, std::int64_t num_keys,
                              bool compressed, DType logits_dtype, std::size_t budget_bytes,
                              std::vector<MqaLogitsChunk>* chunks) {
  if (chunks == nullptr) {
    return {ErrorCode::null_pointer, "plan_mqa_logits_chunks: chunks: the output vector is null"};
  }
  detail::MqaLogitsProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_mqa_chunk_plan(ks, ke, num_keys, logits_dtype, &p));
  DSA_RETURN_IF_ERROR(detail::check_mqa_logits_data(p));
  return run_cpu("plan_mqa_logits_chunks",
                 [&] { return cpu::plan_mqa_logits_chunks(p, compressed, budget_bytes, chunks); });
}

std::size_t paged_mqa_logits_workspace_bytes(const ExecContext& ctx) {
  return is_cpu_backend(ctx.backend) ? 0 : cuda::workspace_bytes_basic();
}

Status mqa_logits(const TensorView& q, const TensorView& keys, const TensorView& key_scales,
                  const TensorView& weights, const TensorView& ks, const TensorView& ke,
                  const TensorView& logits, const MqaLogitsOptions& options, const ExecContext& ctx) {
  const char* op = "mqa_logits";
  detail::MqaLogitsProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_mqa_logits(q, keys, key_scales, weights, ks, ke, logits, options, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::mqa_logits(p, engine == Engine::cpu_parallel, ctx); });
  }
  const bool hopper = hopper_candidate(p.device, ctx) && cuda::hopper_supports_mqa_logits(p);
  if (ctx.backend == Backend::cuda_hopper && !hopper) {
    return {ErrorCode::unsupported,
            std::string(op) + ": ctx.backend: cuda_hopper needs an sm_90 device, a build with sm_90a, fp8 q with "
            "fp8 or fp4 keys or fp4 q with fp4 keys, H in {32, 64}, D == 128, at least one key and q and keys "
            "starting on 16-byte boundaries; got H = " +
                std::to_string(p.heads) + ", D = " + std::to_string(p.head_dim) + ", S_kv = " +
                std::to_string(p.num_keys)};
  }
  return run_cuda(op, p.device, ctx, cuda::workspace_bytes_basic(), [&] { return cuda::mqa_logits(p, hopper, ctx); });
}

std::size_t mqa_logits_workspace_bytes(const ExecContext& ctx) {
  return is_cpu_backend(ctx.backend) ? 0 : cuda::workspace_bytes_basic();
}

Status topk(const TensorView& logits, const TensorView& lengths, int k, const TensorView& indices,
            const TopkOptions& options, const ExecContext& ctx) {
  const char* op = "topk";
  detail::TopkProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_topk(logits, lengths, k, indices, options, &p));
  Engine engine;
  DSA_RETURN_IF_ERROR(select_engine(op, p.device, ctx, &engine));
  if (!is_cuda_engine(engine)) {
    return run_cpu(op, [&] { return cpu::topk(p, engine == Engine::cpu_parallel, ctx); });
  }
  return run_cuda(op, p.device, ctx, cuda::topk_workspace_bytes(), [&] { return cuda::topk(p, ctx); });
}

std::size_t topk_workspace_bytes(std::int64_t /*rows*/, std::int64_t /*max_length*/, int /*k*/,
                                 const ExecContext& ctx) {
  return is_cpu_backend(ctx.backend) ? 0 : cuda::topk_workspace_bytes();
}

Status index_topk(const TensorView& q, const TensorView& key_cache, const TensorView& weights,
                  const TensorView& context_lens, const TensorView& block_table, const TensorView& schedule,
                  std::int64_t max_context_len, const TensorView& topk_lens, const TensorView& indices,
                  const IndexTopkOptions& options, const ExecContext& ctx) {
  const char* op = "index_topk";
  detail::IndexTopkProblem p;
  DSA_RETURN_IF_ERROR(detail::validate_scoring_inputs(
      op, {q, key_cache, weights, context_lens, block_table, schedule, max_context_len, options.page_size,
           options.key_format, options.q_block_scales, options.request_offsets},
      &p.logits));
  DSA_RETURN_IF_ERROR(detail::validate_index_topk_outputs(topk_lens, indices, options, &p));
  const bool uneven = p.logits.varlen.offsets != nullptr;
  p.logits.path = resolve_path(options.path, p.logits.next_n, p.logits.heads, p.logits.head_dim,
                               p.logits.device, ctx, uneven);
  Engine engine;
  DSA_RETURN_IF_ERROR(select_scoring_engine(op, p.logits, ctx, &engine));
  const bool on_cuda = is_cuda_engine(engine);
  const bool fused = on_cuda ? fused_on_cuda(options.strategy) : fused_on_cpu(options.strategy);
  if (fused && on_cuda && uneven) {
    return {ErrorCode::unsupported,
            "index_topk: strategy: the fused pass on CUDA does not take request_offsets (requests of uneven "
            "row counts); use automatic or logits_then_topk"};
  }
  if (fused && on_cuda && p.logits.fp4_keys()) {
    return {ErrorCode::unsupported,
            "index_topk: strategy: the fused pass on CUDA reads fp8 keys only; use automatic or logits_then_topk"};
  }
  if (fused && engine == Engine::cuda_generic) {
    return {ErrorCode::unsupported,
            "index_topk: strategy: the fused pass on CUDA runs on the Hopper kernels only (sm_90, "
            "H in {32, 64}, D == 128, fp8 queries and keys); use automatic or logits_then_topk"};
  }
  p.fused = fused;
  if (!on_cuda) return run_cpu(op, [&] { return cpu::index_topk(p, engine == Engine::cpu_parallel, ctx); });
  // The CUDA backend lays out its workspace (error record, staged logits or
  // candidate lists, ...) itself.
  const std::size_t required = cuda::index_topk_workspace_bytes(
      p.logits.rows(), max_context_len, fused, p.logits.num_workers, p.logits.rows_per_unit());
  return run_cuda(op, p.logits.device, ctx, required,
                  [&] { return cuda::index_topk(p, engine == Engine::cuda_hopper, ctx); });
}

std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len,
                                       const IndexTopkOptions& options, const ExecContext& ctx) {
  if (is_cpu_backend(ctx.backend)) return 0;  // the CPU stages logits in its own memory
  // The fused lists depend on the schedule: sized here for one worker per
  // multiprocessor and the most any unit of up to kMaxNativeRows draft rows
  // needs (units of fewer rows split each row's lists into parts).
  const int workers = std::max(cuda::multiprocessor_count(0), 1);
  const int max_rows_per_unit =
      static_cast<int>(std::min<std::int64_t>(std::max<std::int64_t>(rows, 1), cuda::kMaxNativeRows));
  std::size_t most = 0;
  for (int rows_per_unit = 1; rows_per_unit <= max_rows_per_unit; ++rows_per_unit) {
    most = std::max(most, cuda::index_topk_workspace_bytes(rows, max_context_len,
                                                           fused_on_cuda(options.strategy), workers,
                                                           rows_per_unit));
  }
  return most;
}

}  // namespace dsa
