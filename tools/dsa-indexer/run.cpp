#include "run.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>
#include <vector>

#include "dsa/dsa.hpp"
#include "json.hpp"
#include "pipeline.hpp"
#include "report.hpp"
#include "stages.hpp"
#include "timing.hpp"
#include "verify.hpp"
#include "workload.hpp"

namespace dsa_cli {
namespace {

// Defaults: small enough for a 2-core CPU to finish in seconds, a serving
// size on a GPU.
constexpr std::int64_t kCpuBatch = 4;
constexpr std::int64_t kGpuBatch = 32;
constexpr std::int64_t kCpuContext = 4096;
constexpr std::int64_t kGpuContext = 32768;
constexpr int kCpuIters = 3;
constexpr int kGpuIters = 100;
// quantize_queries weights: gate * q_scale * weight_scale, products of floats.
constexpr double kWeightsTolerance = 1e-6;

// Logits of requests [first, last) with the reference backend, planning a
// one-worker schedule for just those requests.
dsa::Status reference_logits_slice(const Pipeline& ref, std::int64_t first, std::int64_t last,
                                   const dsa::ExecContext& ctx) {
  const WorkloadShape& shape = ref.shape();
  const std::int64_t requests = last - first;
  const std::int64_t first_row = first * shape.next_n;
  const std::int64_t max_blocks = ref.block_table_view().size(1);
  const dsa::TensorView all_q = ref.q_view();  // contiguous: the slice starts first_row * H rows in
  const std::int64_t q_row_bytes = all_q.size(3);
  const dsa::TensorView q = dsa::make_view(
      static_cast<std::uint8_t*>(ref.q_codes.data()) + first_row * shape.heads * q_row_bytes, all_q.dtype,
      {requests, shape.next_n, shape.heads, q_row_bytes});
  const dsa::TensorView weights = dsa::make_view(
      static_cast<float*>(ref.weights.data()) + first_row * shape.heads, dsa::DType::float32,
      {requests * shape.next_n, shape.heads});
  const dsa::TensorView lengths = dsa::make_view(static_cast<std::int32_t*>(ref.context_lens.data()) + first_row,
                                                 dsa::DType::int32, {requests, shape.next_n});
  const dsa::TensorView block_table =
      dsa::make_view(static_cast<std::int32_t*>(ref.block_table.data()) + first * max_blocks, dsa::DType::int32,
                     {requests, max_blocks});
  const dsa::TensorView logits =
      dsa::make_view(static_cast<float*>(ref.logits.data()) + first_row * ref.logits_stride(), dsa::DType::float32,
                     {requests * shape.next_n, ref.max_context_len()}, {ref.logits_stride(), 1});
  std::vector<std::int32_t> schedule_memory(4);
  const dsa::TensorView schedule = dsa::make_view(schedule_memory.data(), dsa::DType::int32, {2, 2});
  DSA_RETURN_IF_ERROR(dsa::plan_schedule(lengths, 1, dsa::LogitsPath::native, schedule, ctx));
  dsa::LogitsOptions options;
  options.path = dsa::LogitsPath::native;
  options.page_size = shape.page_tokens;
  options.key_format = shape.key_format;
  if (shape.fp4_queries()) {
    options.q_block_scales =
        dsa::make_view(static_cast<std::int32_t*>(ref.q_scales.data()) + first_row * shape.heads, dsa::DType::int32,
                       {requests, shape.next_n, shape.heads});
  }
  return dsa::paged_mqa_logits(q, ref.cache_view(), weights, lengths, block_table, schedule,
                               ref.max_context_len(), logits, options, ctx);
}

// The reference logits, requests spread over the hardware threads (rows are
// independent, so slicing the batch changes nothing but the wall time).
dsa::Status reference_logits(const Pipeline& ref, const dsa::ExecContext& ctx) {
  return run_in_slices(ref.shape().batch, [&](std::int64_t first, std::int64_t end) {
    return reference_logits_slice(ref, first, end, ctx);
  });
}

double max_relative_difference(const std::vector<float>& actual, const std::vector<float>& reference) {
  double worst = 0;
  for (std::size_t i = 0; i < reference.size(); ++i) {
    const double scale = std::max(std::fabs(static_cast<double>(reference[i])), 1e-30);
    const double error = std::fabs(static_cast<double>(actual[i]) - reference[i]) / scale;
    worst = std::isnan(error) ? INFINITY : std::max(worst, error);
  }
  return worst;
}

// True when the valid parts of two logits matrices are bitwise equal.
bool valid_logits_identical(const std::vector<float>& a, const std::vector<float>& b, std::int64_t stride,
                            const std::vector<std::int32_t>& lengths) {
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const std::size_t start = r * static_cast<std::size_t>(stride);
    const auto length = static_cast<std::size_t>(lengths[r]);
    if (!std::equal(a.begin() + static_cast<std::ptrdiff_t>(start),
                    a.begin() + static_cast<std::ptrdiff_t>(start + length),
                    b.begin() + static_cast<std::ptrdiff_t>(start),
                    [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; })) {
      return false;
    }
  }
  return true;
}

std::string percent_text(double fraction) { return format("%.0f%%", fraction * 100); }

dsa::Status execute_run(const Options& options, std::FILE* text, Json* document, bool* passed) {
  Target target;
  std::string target_error;
  if (!resolve_target(options.backend, &target, &target_error)) {
    return {dsa::ErrorCode::unsupported, target_error};
  }
  const bool gpu = target.on_gpu();

  WorkloadShape shape;
  shape.batch = options.batch.value_or(gpu ? kGpuBatch : kCpuBatch);
  shape.avg_context = options.context.value_or(gpu ? kGpuContext : kCpuContext);
  shape.next_n = options.next_n;
  shape.heads = options.heads;
  shape.spread = options.spread;
  shape.seed = options.seed;
  shape.page_tokens = options.page_size;
  shape.key_format = options.key_format;
  shape.query_format = options.resolved_query_format();
  const int k = options.k;
  const int iters = options.iters.value_or(gpu ? kGpuIters : kCpuIters);
  const int warmup = gpu ? kGpuWarmup : 0;  // the CPU was just warmed by the checked pass
  const double tolerance = options.tolerance.value_or(gpu ? kGpuTolerance : kCpuTolerance);

  // Cache slots are int32 in the library; refused before anything is allocated.
  if (const std::int64_t slots = max_cache_slots(shape); slots > std::numeric_limits<std::int32_t>::max()) {
    return {dsa::ErrorCode::invalid_argument,
            format("--batch %lld with --context %lld: up to %lld cache slots, beyond the int32 slot range "
                   "(2147483647); lower --batch or --context",
                   static_cast<long long>(shape.batch), static_cast<long long>(shape.avg_context),
                   static_cast<long long>(slots))};
  }
  const WorkloadLayout layout = make_layout(shape);
  const HostInputs inputs = make_host_inputs(shape, layout);
  const Traffic traffic = traffic_of(shape, layout);
  const std::int64_t rows = shape.rows();

  dsa::ExecContext ctx;
  ctx.backend = target.backend;
  dsa::DeviceStream stream;
  if (gpu) {
    DSA_RETURN_IF_ERROR(dsa::DeviceStream::create(target.device.index, &stream));
    ctx.stream = stream.handle();
  }
  const int workers = dsa::default_num_workers(target.device, ctx);
  const dsa::LogitsPath path =
      dsa::resolve_logits_path(options.path, shape.next_n, shape.heads, target.device, ctx);

  Pipeline pipeline;
  DSA_RETURN_IF_ERROR(Pipeline::create(shape, layout, target.device, workers, k, &pipeline));
  DSA_RETURN_IF_ERROR(pipeline.upload_keys(inputs));
  DSA_RETURN_IF_ERROR(pipeline.upload_queries(inputs));
  Buffer workspace;
  if (gpu) {
    DSA_RETURN_IF_ERROR(Buffer::allocate(pipeline.workspace_bytes(ctx), target.device, &workspace));
    ctx.workspace = {workspace.data(), workspace.bytes()};
  }

  const std::string device_text = report_backend(options, target, document);
  Json& shape_json = document->set("workload", Json::object());
  shape_json.set("batch", shape.batch);
  shape_json.set("next_n", shape.next_n);
  shape_json.set("heads", shape.heads);
  shape_json.set("head_dim", shape.head_dim);
  shape_json.set("k", k);
  shape_json.set("avg_context", shape.avg_context);
  shape_json.set("spread", shape.spread);
  shape_json.set("seed", static_cast<std::int64_t>(shape.seed));
  shape_json.set("lengths", "causal");
  shape_json.set("max_context_len", layout.max_context_len);
  shape_json.set("num_pages", layout.num_pages);
  shape_json.set("page_size", shape.page_tokens);
  shape_json.set("key_format", dsa::key_format_name(shape.key_format));
  shape_json.set("query_format", dsa::key_format_name(shape.query_format));
  shape_json.set("page_order", "random permutation");
  shape_json.set("path", dsa::logits_path_name(path));
  shape_json.set("num_workers", workers);

  std::fprintf(text, "dsa-indexer: backend %s (%s) on %s\n", backend_choice_name(options.backend),
               dsa::backend_name(target.backend), device_text.c_str());
  std::fprintf(text,
               "workload: B=%lld next_n=%d H=%d D=%d k=%d; causal lengths avg %lld +-%s (max %lld); "
               "%lld pages of %d tokens (%s keys, %s queries), random order; %s path, %d workers\n",
               static_cast<long long>(shape.batch), shape.next_n, shape.heads, shape.head_dim, k,
               static_cast<long long>(shape.avg_context), percent_text(shape.spread).c_str(),
               static_cast<long long>(layout.max_context_len), static_cast<long long>(layout.num_pages),
               shape.page_tokens, dsa::key_format_name(shape.key_format), dsa::key_format_name(shape.query_format),
               dsa::logits_path_name(path), workers);

  dsa::IndexTopkStrategy strategy = dsa::IndexTopkStrategy::fused;
  const std::vector<Stage> stages = {
      {"store_index_keys", [&](const dsa::ExecContext& c) { return pipeline.run_store_keys(c); }},
      {"quantize_queries", [&](const dsa::ExecContext& c) { return pipeline.run_quantize(c); }},
      {"context_lens_and_schedule",
       [&](const dsa::ExecContext& c) { return pipeline.run_lengths_and_plan(path, pipeline.schedule, c); }},
      {"paged_mqa_logits",
       [&](const dsa::ExecContext& c) {
         return pipeline.run_logits(path, pipeline.schedule, pipeline.cache_view(), c);
       },
       path == dsa::LogitsPath::native ? traffic.native_bytes : traffic.per_token_bytes, traffic.flops},
      {"topk", [&](const dsa::ExecContext& c) { return pipeline.run_topk(pipeline.logits_view(), c); }},
      {"index_topk",
       [&](const dsa::ExecContext& c) {
         dsa::Status status = pipeline.run_index_topk(path, pipeline.schedule, pipeline.cache_view(), strategy, c);
         if (status.code() == dsa::ErrorCode::unsupported && strategy == dsa::IndexTopkStrategy::fused) {
           strategy = dsa::IndexTopkStrategy::logits_then_topk;  // no fused pass on this backend
           status = pipeline.run_index_topk(path, pipeline.schedule, pipeline.cache_view(), strategy, c);
         }
         return status;
       }},
  };

  // One pass with device-side errors checked after every stage. index_topk
  // runs fused where the backend has a fused pass (the first call finds out).
  DSA_RETURN_IF_ERROR(run_stages_checked(stages, gpu, ctx));
  shape_json.set("index_topk_strategy", dsa::index_topk_strategy_name(strategy));
  std::fprintf(text, "index_topk strategy: %s\n", dsa::index_topk_strategy_name(strategy));
  std::vector<float> first_logits;
  std::vector<std::int32_t> first_indices, first_fused;
  DSA_RETURN_IF_ERROR(download(pipeline.logits, &first_logits));
  DSA_RETURN_IF_ERROR(download(pipeline.indices, &first_indices));
  DSA_RETURN_IF_ERROR(download(pipeline.fused_indices, &first_fused));

  // Timing: every stage repeated on the outputs of the previous ones.
  DSA_RETURN_IF_ERROR(time_stages(stages, gpu, ctx, warmup, iters, text, document));

  std::vector<std::uint8_t> cache_bytes, q_bytes, q_scale_bytes;
  std::vector<float> weights, logits;
  std::vector<std::int32_t> lengths, schedule, indices, fused;
  DSA_RETURN_IF_ERROR(download(pipeline.cache, &cache_bytes));
  DSA_RETURN_IF_ERROR(download(pipeline.q_codes, &q_bytes));
  DSA_RETURN_IF_ERROR(download(pipeline.q_scales, &q_scale_bytes));
  // fp4 queries: their codes and block scales compared as one byte string.
  q_bytes.insert(q_bytes.end(), q_scale_bytes.begin(), q_scale_bytes.end());
  DSA_RETURN_IF_ERROR(download(pipeline.weights, &weights));
  DSA_RETURN_IF_ERROR(download(pipeline.context_lens, &lengths));
  DSA_RETURN_IF_ERROR(download(pipeline.schedule, &schedule));
  DSA_RETURN_IF_ERROR(download(pipeline.logits, &logits));
  DSA_RETURN_IF_ERROR(download(pipeline.indices, &indices));
  DSA_RETURN_IF_ERROR(download(pipeline.fused_indices, &fused));

  // The same pipeline on the reference backend, in host memory.
  dsa::ExecContext ref_ctx;
  ref_ctx.backend = dsa::Backend::cpu_reference;
  ref_ctx.reference_float64 = true;
  Pipeline ref;
  DSA_RETURN_IF_ERROR(Pipeline::create(shape, layout, dsa::Device{}, workers, k, &ref));
  DSA_RETURN_IF_ERROR(ref.upload_keys(inputs));
  DSA_RETURN_IF_ERROR(ref.upload_queries(inputs));
  DSA_RETURN_IF_ERROR(in_stage("reference store_index_keys", ref.run_store_keys(ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage("reference quantize_queries", ref.run_quantize(ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage("reference causal_context_lens", ref.run_lengths(ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage("reference plan_schedule", ref.run_plan(path, ref.schedule, ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage("reference paged_mqa_logits", reference_logits(ref, ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage("reference topk", ref.run_topk(ref.logits_view(), ref_ctx)));
  // The exact selection of the backend's own logits, for the top-k kernel alone.
  std::vector<std::int32_t> own_selection(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k));
  DSA_RETURN_IF_ERROR(in_stage(
      "reference topk of the backend logits",
      dsa::topk(dsa::make_view(logits.data(), dsa::DType::float32, {rows, pipeline.max_context_len()},
                               {pipeline.logits_stride(), 1}),
                ref.row_lengths_view(), k, dsa::make_view(own_selection.data(), dsa::DType::int32, {rows, k}), {},
                ref_ctx)));

  const auto* ref_cache = static_cast<const std::uint8_t*>(ref.cache.data());
  std::vector<std::uint8_t> ref_q_bytes, ref_q_scale_bytes;
  DSA_RETURN_IF_ERROR(download(ref.q_codes, &ref_q_bytes));
  DSA_RETURN_IF_ERROR(download(ref.q_scales, &ref_q_scale_bytes));
  ref_q_bytes.insert(ref_q_bytes.end(), ref_q_scale_bytes.begin(), ref_q_scale_bytes.end());
  const auto* ref_q = ref_q_bytes.data();
  const auto* ref_lengths = static_cast<const std::int32_t*>(ref.context_lens.data());
  const auto* ref_schedule = static_cast<const std::int32_t*>(ref.schedule.data());
  const auto* ref_logits = static_cast<const float*>(ref.logits.data());
  const auto* ref_indices = static_cast<const std::int32_t*>(ref.indices.data());
  std::vector<float> ref_weights;
  DSA_RETURN_IF_ERROR(download(ref.weights, &ref_weights));

  CheckList checks;
  {
    const ByteComparison cache = compare_bytes(cache_bytes.data(), ref_cache, static_cast<std::int64_t>(cache_bytes.size()));
    checks.add("cache bytes", cache.passed(),
               cache.passed() ? format("bit-exact (%zu bytes)", cache_bytes.size())
                              : format("%lld bytes differ, first at byte %lld", static_cast<long long>(cache.mismatches),
                                       static_cast<long long>(cache.first_mismatch)));
  }
  {
    const ByteComparison q = compare_bytes(q_bytes.data(), ref_q, static_cast<std::int64_t>(q_bytes.size()));
    checks.add(shape.fp4_queries() ? "fp4 queries" : "fp8 queries", q.passed(),
               q.passed() ? format("bit-exact (%zu bytes)", q_bytes.size())
                          : format("%lld bytes differ, first at byte %lld", static_cast<long long>(q.mismatches),
                                   static_cast<long long>(q.first_mismatch)));
  }
  {
    const double error = max_relative_difference(weights, ref_weights);
    checks.add("weights", error <= kWeightsTolerance,
               format("max relative error %.2e (tolerance %.0e)", error, kWeightsTolerance))
        .set("max_relative_error", error);
  }
  {
    const bool same = std::equal(lengths.begin(), lengths.end(), ref_lengths);
    checks.add("context_lens", same, same ? "exact" : "differ from prefix + j + 1");
  }
  {
    const bool same = std::equal(schedule.begin(), schedule.end(), ref_schedule);
    checks.add("schedule", same, same ? format("exact (%d workers)", workers) : "differs from the host plan");
  }
  {
    const LogitsComparison result = compare_logits(logits.data(), ref_logits, rows, pipeline.logits_stride(), ref_lengths);
    std::string detail = format("max relative error %.2e (tolerance %.0e)", result.max_relative_error, tolerance);
    if (result.worst_row >= 0) {
      detail += format(", worst at row %lld position %lld", static_cast<long long>(result.worst_row),
                       static_cast<long long>(result.worst_position));
    }
    if (result.non_finite > 0) detail += format(", %lld non-finite values", static_cast<long long>(result.non_finite));
    Json& entry = checks.add("logits", result.passed(tolerance), detail);
    entry.set("max_relative_error", result.max_relative_error);
    entry.set("tolerance", tolerance);
    entry.set("non_finite", result.non_finite);
  }
  add_topk_checks(checks, check_topk(indices.data(), ref_indices, k, ref_logits, pipeline.logits_stride(),
                                        ref_lengths, rows, k, tolerance),
                  rows_with_different_sets(indices.data(), own_selection.data(), k, rows, k));
  {
    const std::int64_t differing = rows_with_different_sets(fused.data(), indices.data(), k, rows, k);
    checks.add("index_topk == topk", differing == 0,
               differing == 0 ? "same sets in every row" : format("%lld rows differ", static_cast<long long>(differing)));
  }
  {
    const bool logits_same = valid_logits_identical(first_logits, logits, pipeline.logits_stride(), lengths);
    const bool indices_same = first_indices == indices && first_fused == fused;
    checks.add("repeatability", logits_same && indices_same,
               logits_same && indices_same
                   ? format("logits, topk and index_topk bitwise identical over %d runs", 1 + warmup + iters)
                   : std::string(logits_same ? "indices" : "logits") + " changed between runs");
  }

  report_verification(checks, text, document, passed);
  return {};
}

}  // namespace

bool resolve_target(BackendChoice choice, Target* target, std::string* error) {
  const bool gpu_present = dsa::cuda_device_count() > 0;
  const dsa::Device gpu{dsa::DeviceType::cuda, 0};
  switch (choice) {
    case BackendChoice::automatic:
      *target = gpu_present ? Target{dsa::Backend::automatic, gpu} : Target{dsa::Backend::cpu, {}};
      return true;
    case BackendChoice::cpu:
      *target = {dsa::Backend::cpu, {}};
      return true;
    case BackendChoice::cpu_reference:
      *target = {dsa::Backend::cpu_reference, {}};
      return true;
    case BackendChoice::cuda:
      *target = {dsa::Backend::automatic, gpu};
      break;
    case BackendChoice::cuda_generic:
      *target = {dsa::Backend::cuda_generic, gpu};
      break;
    case BackendChoice::cuda_hopper:
      *target = {dsa::Backend::cuda_hopper, gpu};
      break;
  }
  if (gpu_present) return true;
  *error = std::string("--backend ") + backend_choice_name(choice) + ": no CUDA device is available" +
           (dsa::built_with_cuda() ? "" : " (this build has no CUDA backends)");
  return false;
}

std::string describe_device(const Target& target) {
  if (!target.on_gpu()) {
    return format("the host CPU (%u hardware threads)", std::thread::hardware_concurrency());
  }
  dsa::DeviceInfo info;
  if (!dsa::get_device_info(target.device.index, &info).ok()) return "CUDA device 0";
  return format("%s (sm_%d%d, %d SMs, %.0f GiB)", info.name.c_str(), info.compute_major, info.compute_minor,
                info.multiprocessors, static_cast<double>(info.global_memory_bytes) / (1ull << 30));
}

int run_command(const Options& options) {
  return verified_command(options, "run", [&](std::FILE* text, Json* document, bool* passed) {
    return execute_run(options, text, document, passed);
  });
}

}  // namespace dsa_cli
