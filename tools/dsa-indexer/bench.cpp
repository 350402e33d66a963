#include "bench.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_prefill.hpp"
#include "device_timing.hpp"
#include "dsa/dsa.hpp"
#include "json.hpp"
#include "pipeline.hpp"
#include "report.hpp"
#include "run.hpp"
#include "timing.hpp"
#include "verify.hpp"
#include "workload.hpp"

namespace dsa_cli {
namespace {

constexpr double kSpread = 0.3;  // the reference grid: lengths uniform in +-30%
constexpr int kGpuIters = 50;
constexpr int kCpuIters = 3;
constexpr int kRateIters = 20;
constexpr int kMatmulSize = 8192;
constexpr std::size_t kCopyBytes = std::size_t{1} << 30;
// Native and per-token logits must agree this closely (relative to the row rms).
constexpr double kPathAgreementTolerance = 1e-2;

struct GridPoint {
  std::int64_t batch;
  std::int64_t avg_context;
  int next_n;
};

std::vector<GridPoint> grid_points(GridSize size) {
  std::vector<GridPoint> points;
  if (size == GridSize::topk) return points;  // the top-k lines alone
  if (size == GridSize::small) {
    // Small decode batches, where fixed costs dominate, then the corners of the full grid.
    for (const std::int64_t batch : {1, 4, 8, 16}) {
      for (const std::int64_t context : {4096, 16384}) {
        for (int next_n = 1; next_n <= 4; ++next_n) points.push_back({batch, context, next_n});
      }
    }
    for (const auto& [batch, context] : {std::pair<std::int64_t, std::int64_t>{32, 8192}, {128, 65536}}) {
      for (int next_n = 1; next_n <= 4; ++next_n) points.push_back({batch, context, next_n});
    }
    return points;
  }
  for (const std::int64_t batch : {32, 128}) {
    for (const std::int64_t context : {8192, 32768, 65536}) {
      for (int next_n = 1; next_n <= 4; ++next_n) points.push_back({batch, context, next_n});
    }
  }
  return points;
}

// Problems met while measuring, "; "-separated; empty when every check passed.
struct Problems {
  std::string problems;

  void note(const std::string& problem) { problems += (problems.empty() ? "" : "; ") + problem; }
};

struct PointResult : Problems {
  GridPoint point{};
  Traffic traffic;
  double native_s = kNotMeasured;
  double native_host_s = kNotMeasured;  // host time per native call
  double per_token_s = kNotMeasured;
  double topk_s = kNotMeasured;
  double topk_host_s = kNotMeasured;
  double index_topk_s = kNotMeasured;
  double index_topk_host_s = kNotMeasured;
  double fused_s = kNotMeasured;  // index_topk with the fused strategy
  // One decode step (lengths and schedule in one call -> logits -> top-k as cache slots)
  // replayed as a CUDA graph, the same graph captured with programmatic
  // dependent launch, and the same calls timed one by one; and one layer's
  // share of it (logits -> top-k as slots: the lengths and the schedule are
  // made once a step and serve every layer) replayed with PDL.
  double step_s = kNotMeasured;
  double step_pdl_s = kNotMeasured;
  double layer_pdl_s = kNotMeasured;
  double lengths_s = kNotMeasured;
  double plan_s = kNotMeasured;
  double lengths_and_plan_s = kNotMeasured;  // the two in one call, as the step runs them
  double topk_slots_s = kNotMeasured;
  double floor_s = kNotMeasured;       // max(native bytes / bandwidth, FLOPs / fp8 rate)
  double topk_floor_s = kNotMeasured;  // one read of the valid logits
  double path_difference = 0;          // native vs per-token, relative to the row rms
  int rotation = 1;

  // The step's calls timed one by one, added up.
  double step_parts_s() const { return lengths_and_plan_s + native_s + topk_slots_s; }
};

// Times `launch`; an `unsupported` backend leaves the time unmeasured, any
// other error is noted on the result.
double timed_or_note(const Bench& bench, const char* what, const std::function<dsa::Status(int)>& launch,
                     Problems* result, double* host_seconds = nullptr) {
  double seconds = kNotMeasured;
  const dsa::Status status = bench.time(launch, &seconds, host_seconds);
  if (status.code() == dsa::ErrorCode::unsupported) return kNotMeasured;
  if (!status.ok()) {
    result->note(std::string(what) + ": " + status.to_string());
    return kNotMeasured;
  }
  return seconds;
}

// A logits call's floor: its bytes at copy bandwidth or its FLOPs at the
// fp8 matrix rate, whichever takes longer.
double logits_floor(const Bench& bench, const Traffic& traffic) {
  return std::max(traffic.native_bytes / bench.copy_bandwidth, traffic.flops / bench.fp8_rate);
}

dsa::Status prepare_point(const Bench& bench, const WorkloadShape& shape, const WorkloadLayout& layout, int k,
                          Pipeline* pipeline, Buffer* per_token_schedule, Buffer* workspace,
                          dsa::ExecContext* ctx) {
  *ctx = bench.ctx;
  const int workers = dsa::default_num_workers(bench.target.device, *ctx);
  DSA_RETURN_IF_ERROR(Pipeline::create(shape, layout, bench.target.device, workers, k, pipeline));
  if (bench.gpu()) {
    DSA_RETURN_IF_ERROR(Buffer::allocate(pipeline->workspace_bytes(*ctx), bench.target.device, workspace));
    ctx->workspace = {workspace->data(), workspace->bytes()};
    DSA_RETURN_IF_ERROR(fill_random_bf16(pipeline->keys.data(), pipeline->keys.bytes() / 2,
                                         static_cast<std::size_t>(shape.head_dim), shape.seed, ctx->stream));
    DSA_RETURN_IF_ERROR(pipeline->upload_queries(make_host_queries(shape)));
  } else {
    const HostInputs inputs = make_host_inputs(shape, layout);
    DSA_RETURN_IF_ERROR(pipeline->upload_keys(inputs));
    DSA_RETURN_IF_ERROR(pipeline->upload_queries(inputs));
  }
  DSA_RETURN_IF_ERROR(Buffer::allocate(pipeline->schedule.bytes(), bench.target.device, per_token_schedule));
  dsa::ExecContext checked = *ctx;
  checked.check_device_errors = bench.gpu();
  DSA_RETURN_IF_ERROR(pipeline->run_store_keys(checked));
  DSA_RETURN_IF_ERROR(pipeline->run_quantize(checked));
  DSA_RETURN_IF_ERROR(pipeline->run_lengths(checked));
  DSA_RETURN_IF_ERROR(pipeline->run_plan(dsa::LogitsPath::native, pipeline->schedule, checked));
  DSA_RETURN_IF_ERROR(pipeline->run_plan(dsa::LogitsPath::per_token, *per_token_schedule, checked));
  pipeline->keys = Buffer{};  // the bf16 keys are in the cache now
  return {};
}

// A decode step on the native path: its calls one by one, then the whole
// step as CUDA-graph replays (a graph per rotated cache, so the replays read
// memory as the calls did), captured without and with programmatic dependent
// launch. The difference between the calls and the graph is what launches
// and gaps cost; the second graph shows how much of the gaps the overlap
// hides. Then what an engine replays for each layer of the step: the logits
// and the top-k alone, with PDL (the lengths and the schedule serve every
// layer).
void measure_step(const Bench& bench, const Pipeline& pipeline, const Rotation& caches, PointResult* result) {
  const dsa::ExecContext& ctx = bench.ctx;
  result->lengths_s = timed_or_note(bench, "lengths", [&](int) { return pipeline.run_lengths(ctx); }, result);
  result->plan_s = timed_or_note(bench, "plan", [&](int) {
    return pipeline.run_plan(dsa::LogitsPath::native, pipeline.schedule, ctx);
  }, result);
  result->lengths_and_plan_s = timed_or_note(bench, "lengths and plan", [&](int) {
    return pipeline.run_lengths_and_plan(dsa::LogitsPath::native, pipeline.schedule, ctx);
  }, result);
  result->topk_slots_s = timed_or_note(bench, "topk slots", [&](int) {
    return pipeline.run_topk(pipeline.logits_view(), ctx, true);
  }, result);
  const auto graph_time = [&](bool overlap, bool whole_step, const char* what) {
    dsa::ExecContext step_ctx = ctx;
    step_ctx.programmatic_dependent_launch = overlap;
    std::vector<CapturedGraph> steps(static_cast<std::size_t>(caches.size()));
    for (int set = 0; set < caches.size(); ++set) {
      const dsa::Status captured = CapturedGraph::capture(step_ctx.stream, [&]() -> dsa::Status {
        if (whole_step) {
          DSA_RETURN_IF_ERROR(pipeline.run_lengths_and_plan(dsa::LogitsPath::native, pipeline.schedule, step_ctx));
        }
        DSA_RETURN_IF_ERROR(pipeline.run_logits(dsa::LogitsPath::native, pipeline.schedule,
                                                pipeline.cache_view_of(caches.at(set)), step_ctx));
        return pipeline.run_topk(pipeline.logits_view(), step_ctx, true);
      }, &steps[static_cast<std::size_t>(set)]);
      if (!captured.ok()) {
        result->note(std::string(what) + ": " + captured.to_string());
        return kNotMeasured;
      }
    }
    return timed_or_note(bench, what, [&](int run) {
      return steps[static_cast<std::size_t>(run) % steps.size()].replay(ctx.stream);
    }, result);
  };
  result->step_s = graph_time(false, true, "step graph");
  result->step_pdl_s = graph_time(true, true, "step graph with PDL");
  result->layer_pdl_s = graph_time(true, false, "layer graph with PDL");
}

WorkloadShape grid_shape(const GridPoint& point, const Options& options, std::uint64_t seed) {
  WorkloadShape shape;
  shape.batch = point.batch;
  shape.avg_context = point.avg_context;
  shape.next_n = point.next_n;
  shape.heads = options.heads;
  shape.spread = kSpread;
  shape.seed = seed;
  shape.page_tokens = options.page_size;
  shape.key_format = options.key_format;
  shape.query_format = options.resolved_query_format();
  return shape;
}

PointResult measure_point(const Bench& bench, const GridPoint& point, const Options& options, std::uint64_t seed) {
  PointResult result;
  result.point = point;
  const WorkloadShape shape = grid_shape(point, options, seed);
  const int k = options.k;
  const WorkloadLayout layout = make_layout(shape);
  result.traffic = traffic_of(shape, layout);
  const std::int64_t rows = shape.rows();

  Pipeline pipeline;
  Buffer per_token_schedule, workspace;
  dsa::ExecContext ctx;
  const dsa::Status prepared =
      prepare_point(bench, shape, layout, k, &pipeline, &per_token_schedule, &workspace, &ctx);
  if (!prepared.ok()) {
    result.note("setup: " + prepared.to_string());
    return result;
  }
  Bench point_bench = bench;
  point_bench.ctx = ctx;

  Rotation caches;
  if (const dsa::Status status = caches.create(pipeline.cache, point_bench); !status.ok()) {
    result.note("rotation: " + status.to_string());
    return result;
  }
  result.rotation = caches.size();

  const auto logits_with = [&](dsa::LogitsPath path, const Buffer& schedule) {
    return [&pipeline, &caches, &ctx, path, schedule_memory = &schedule](int run) {
      return pipeline.run_logits(path, *schedule_memory, pipeline.cache_view_of(caches.at(run)), ctx);
    };
  };
  std::vector<float> native_logits, per_token_logits;
  result.native_s = timed_or_note(point_bench, "native logits",
                                  logits_with(dsa::LogitsPath::native, pipeline.schedule), &result,
                                  &result.native_host_s);
  if (!std::isnan(result.native_s)) {
    native_logits.resize(pipeline.logits.bytes() / sizeof(float));
    if (!pipeline.logits.download(native_logits.data(), pipeline.logits.bytes()).ok()) native_logits.clear();
  }
  result.per_token_s = timed_or_note(point_bench, "per-token logits",
                                     logits_with(dsa::LogitsPath::per_token, per_token_schedule), &result);
  if (!std::isnan(result.per_token_s)) {
    per_token_logits.resize(pipeline.logits.bytes() / sizeof(float));
    if (!pipeline.logits.download(per_token_logits.data(), pipeline.logits.bytes()).ok()) per_token_logits.clear();
  }
  if (!native_logits.empty() && !per_token_logits.empty()) {
    const LogitsComparison agreement = compare_logits(per_token_logits.data(), native_logits.data(), rows,
                                                      pipeline.logits_stride(), layout.context_lens.data());
    result.path_difference = agreement.max_relative_error;
    if (!agreement.passed(kPathAgreementTolerance)) {
      result.note(format("native and per-token logits differ by %.1e", agreement.max_relative_error));
    }
  }

  Rotation logits_sets;
  if (const dsa::Status status = logits_sets.create(pipeline.logits, point_bench); !status.ok()) {
    result.note("rotation: " + status.to_string());
    return result;
  }
  result.topk_s = timed_or_note(point_bench, "topk", [&](int run) {
    return pipeline.run_topk(pipeline.logits_view_of(logits_sets.at(run)), ctx);
  }, &result, &result.topk_host_s);
  const dsa::LogitsPath fused_path =
      std::isnan(result.native_s) ? dsa::LogitsPath::per_token : dsa::LogitsPath::native;
  const Buffer& fused_schedule = std::isnan(result.native_s) ? per_token_schedule : pipeline.schedule;
  result.index_topk_s = timed_or_note(point_bench, "index_topk", [&](int run) {
    return pipeline.run_index_topk(fused_path, fused_schedule, pipeline.cache_view_of(caches.at(run)),
                                   dsa::IndexTopkStrategy::automatic, ctx);
  }, &result, &result.index_topk_host_s);
  const auto check_against_topk = [&](const char* what) {
    std::vector<std::int32_t> indices(pipeline.indices.bytes() / 4), fused(pipeline.fused_indices.bytes() / 4);
    if (pipeline.indices.download(indices.data(), pipeline.indices.bytes()).ok() &&
        pipeline.fused_indices.download(fused.data(), pipeline.fused_indices.bytes()).ok()) {
      const std::int64_t differing = rows_with_different_sets(fused.data(), indices.data(), k, rows, k);
      if (differing > 0) result.note(format("%s differs from topk in %lld rows", what, static_cast<long long>(differing)));
    }
  };
  if (!std::isnan(result.topk_s) && !std::isnan(result.index_topk_s)) check_against_topk("index_topk");
  result.fused_s = timed_or_note(point_bench, "index_topk fused", [&](int run) {
    return pipeline.run_index_topk(fused_path, fused_schedule, pipeline.cache_view_of(caches.at(run)),
                                   dsa::IndexTopkStrategy::fused, ctx);
  }, &result);
  if (!std::isnan(result.topk_s) && !std::isnan(result.fused_s)) check_against_topk("fused index_topk");
  if (bench.gpu() && !std::isnan(result.native_s)) measure_step(point_bench, pipeline, caches, &result);
  if (bench.gpu()) {
    if (const dsa::Status status = dsa::read_device_error(ctx); !status.ok()) {
      result.note("device error: " + status.to_string());
    }
    result.floor_s = logits_floor(bench, result.traffic);
    result.topk_floor_s = result.traffic.logits_bytes / bench.copy_bandwidth;
  }
  return result;
}

// ---- requests of uneven row counts ------------------------------------------

// The varlen line: decode requests of 1..kVarlenMaxRows rows (adaptive
// speculation) around the grid's 32K contexts.
constexpr std::int64_t kVarlenRequests = 128;
constexpr std::int64_t kVarlenContext = 32768;
constexpr int kVarlenMaxRows = 4;
constexpr double kVarlenSpeedupTarget = 1.6;  // flattened time / varlen time, at least
constexpr double kVarlenFixedTarget = 1.10;   // varlen time / fixed-next_n time, at most

struct VarlenLine : Problems {
  std::int64_t rows = 0;  // T, over kVarlenRequests requests
  int fixed_next_n = 0;   // n of the fixed-next_n call: round(T / B)
  Traffic traffic;        // of the varlen call
  double varlen_s = kNotMeasured;
  double flattened_s = kNotMeasured;
  double fixed_s = kNotMeasured;
  double floor_s = kNotMeasured;
  int rotation = 1;
};

// Three native paged_mqa_logits calls over one cache: the T rows as requests
// of uneven row counts (request_offsets); the same rows flattened into T
// requests of one row each, every row with its request's block-table row (so
// a request's keys are read once per row); and kVarlenRequests requests of
// round(T / B) rows each, the fixed-next_n kernel at about the same rows.
// The cache is laid out as a next_n = kVarlenMaxRows grid point, so every
// request's rows (causal: prefix + t + 1) lie within its pages.
VarlenLine measure_varlen(const Bench& bench, const Options& options) {
  VarlenLine line;
  const WorkloadShape shape = grid_shape({kVarlenRequests, kVarlenContext, kVarlenMaxRows}, options, options.seed);
  const WorkloadLayout layout = make_layout(shape);
  const std::int64_t batch = shape.batch;
  const std::int64_t heads = shape.heads;
  const std::int64_t dim = shape.head_dim;

  const std::vector<std::int32_t> row_counts = varied_row_counts(batch, kVarlenMaxRows, options.seed);
  std::vector<std::int32_t> offsets(static_cast<std::size_t>(batch) + 1, 0);
  for (std::size_t b = 0; b < row_counts.size(); ++b) offsets[b + 1] = offsets[b] + row_counts[b];
  const std::int64_t rows = offsets.back();
  const std::int64_t fixed_n = std::clamp<std::int64_t>(
      std::llround(static_cast<double>(rows) / static_cast<double>(batch)), 1, kVarlenMaxRows);
  line.rows = rows;
  line.fixed_next_n = static_cast<int>(fixed_n);
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(rows));
  std::vector<std::int32_t> flat_table(static_cast<std::size_t>(rows * layout.max_blocks));
  for (std::size_t b = 0; b < row_counts.size(); ++b) {
    const auto table_row = layout.block_table.begin() + static_cast<std::ptrdiff_t>(b) * layout.max_blocks;
    for (std::int32_t r = offsets[b]; r < offsets[b + 1]; ++r) {
      lengths[static_cast<std::size_t>(r)] = layout.prefix_lens[b] + (r - offsets[b]) + 1;
      std::copy(table_row, table_row + layout.max_blocks, flat_table.begin() + r * layout.max_blocks);
    }
  }
  line.traffic = traffic_of_rows(shape, lengths, offsets);

  Pipeline pipeline;
  Buffer per_token_schedule, workspace;
  dsa::ExecContext ctx;
  if (auto s = prepare_point(bench, shape, layout, options.k, &pipeline, &per_token_schedule, &workspace, &ctx);
      !s.ok()) {
    line.note("setup: " + s.to_string());
    return line;
  }
  Bench line_bench = bench;
  line_bench.ctx = ctx;
  const dsa::Device device = bench.target.device;
  const std::int64_t schedule_rows = static_cast<std::int64_t>(pipeline.schedule.bytes() / (2 * sizeof(std::int32_t)));
  const int workers = static_cast<int>(schedule_rows - 1);
  Buffer offsets_memory, varlen_lens, fixed_lens, flat_table_memory, varlen_schedule, flat_schedule, fixed_schedule;
  const auto setup = [&]() -> dsa::Status {
    DSA_RETURN_IF_ERROR(Buffer::allocate(offsets.size() * sizeof(std::int32_t), device, &offsets_memory));
    DSA_RETURN_IF_ERROR(offsets_memory.upload(offsets.data(), offsets_memory.bytes()));
    DSA_RETURN_IF_ERROR(Buffer::allocate(flat_table.size() * sizeof(std::int32_t), device, &flat_table_memory));
    DSA_RETURN_IF_ERROR(flat_table_memory.upload(flat_table.data(), flat_table_memory.bytes()));
    DSA_RETURN_IF_ERROR(Buffer::allocate(static_cast<std::size_t>(rows) * sizeof(std::int32_t), device, &varlen_lens));
    DSA_RETURN_IF_ERROR(
        Buffer::allocate(static_cast<std::size_t>(batch * fixed_n) * sizeof(std::int32_t), device, &fixed_lens));
    for (Buffer* schedule : {&varlen_schedule, &flat_schedule, &fixed_schedule}) {
      DSA_RETURN_IF_ERROR(Buffer::allocate(pipeline.schedule.bytes(), device, schedule));
    }
    dsa::ExecContext checked = ctx;
    checked.check_device_errors = true;
    const dsa::TensorView prefix = pipeline.prefix_lens.view(dsa::DType::int32, {batch});
    const dsa::TensorView offsets_view = offsets_memory.view(dsa::DType::int32, {batch + 1});
    DSA_RETURN_IF_ERROR(
        dsa::causal_context_lens(prefix, 1, varlen_lens.view(dsa::DType::int32, {rows}), checked, offsets_view));
    DSA_RETURN_IF_ERROR(dsa::causal_context_lens(prefix, static_cast<int>(fixed_n),
                                                 fixed_lens.view(dsa::DType::int32, {batch, fixed_n}), checked));
    const auto plan = [&](const Buffer& lens, std::initializer_list<std::int64_t> lens_shape, const Buffer& schedule,
                          const dsa::TensorView& request_offsets) {
      return dsa::plan_schedule(lens.view(dsa::DType::int32, lens_shape), workers, dsa::LogitsPath::native,
                                schedule.view(dsa::DType::int32, {schedule_rows, 2}), checked, request_offsets);
    };
    DSA_RETURN_IF_ERROR(plan(varlen_lens, {rows}, varlen_schedule, offsets_view));
    DSA_RETURN_IF_ERROR(plan(varlen_lens, {rows, 1}, flat_schedule, {}));
    return plan(fixed_lens, {batch, fixed_n}, fixed_schedule, {});
  };
  if (auto s = setup(); !s.ok()) {
    line.note("setup: " + s.to_string());
    return line;
  }
  Rotation caches;
  if (auto s = caches.create(pipeline.cache, line_bench); !s.ok()) {
    line.note("rotation: " + s.to_string());
    return line;
  }
  line.rotation = caches.size();

  // One call over `requests` x `per_request` rows of the queries, weights and
  // logits; the data-dependent checks it recorded are read after timing it.
  const auto time_logits = [&](const char* what, std::int64_t requests, std::int64_t per_request,
                               const dsa::TensorView& lens, const dsa::TensorView& table, const Buffer& schedule,
                               const dsa::TensorView& request_offsets) {
    const std::int64_t call_rows = requests * per_request;
    dsa::LogitsOptions logits_options;
    logits_options.path = dsa::LogitsPath::native;
    logits_options.page_size = shape.page_tokens;
    logits_options.key_format = shape.key_format;
    logits_options.request_offsets = request_offsets;
    dsa::TensorView q;
    if (shape.fp4_queries()) {
      q = pipeline.q_codes.view(dsa::DType::uint8, {requests, per_request, heads, dim / 2});
      logits_options.q_block_scales = pipeline.q_scales.view(dsa::DType::int32, {requests, per_request, heads});
    } else {
      q = pipeline.q_codes.view(dsa::DType::float8_e4m3, {requests, per_request, heads, dim});
    }
    const dsa::TensorView weights = pipeline.weights.view(dsa::DType::float32, {call_rows, heads});
    const dsa::TensorView logits = dsa::make_view(pipeline.logits.data(), dsa::DType::float32,
                                                  {call_rows, pipeline.max_context_len()},
                                                  {pipeline.logits_stride(), 1}, device);
    const dsa::TensorView schedule_view = schedule.view(dsa::DType::int32, {schedule_rows, 2});
    const double seconds = timed_or_note(line_bench, what, [&](int run) {
      return dsa::paged_mqa_logits(q, pipeline.cache_view_of(caches.at(run)), weights, lens, table, schedule_view,
                                   pipeline.max_context_len(), logits, logits_options, ctx);
    }, &line);
    if (auto s = dsa::read_device_error(ctx); !s.ok()) line.note(std::string(what) + " device error: " + s.to_string());
    return seconds;
  };
  line.varlen_s = time_logits("varlen logits", rows, 1, varlen_lens.view(dsa::DType::int32, {rows}),
                              pipeline.block_table_view(), varlen_schedule,
                              offsets_memory.view(dsa::DType::int32, {batch + 1}));
  line.flattened_s = time_logits("flattened logits", rows, 1, varlen_lens.view(dsa::DType::int32, {rows, 1}),
                                 flat_table_memory.view(dsa::DType::int32, {rows, layout.max_blocks}), flat_schedule,
                                 {});
  line.fixed_s = time_logits("fixed-next_n logits", batch, fixed_n,
                             fixed_lens.view(dsa::DType::int32, {batch, fixed_n}), pipeline.block_table_view(),
                             fixed_schedule, {});
  line.floor_s = logits_floor(bench, line.traffic);
  return line;
}

Json varlen_json(const VarlenLine& line) {
  Json entry = Json::object();
  entry.set("requests", kVarlenRequests);
  entry.set("avg_context", kVarlenContext);
  entry.set("rows_per_request", format("uniform in 1..%d", kVarlenMaxRows));
  entry.set("rows", line.rows);
  entry.set("fixed_next_n", line.fixed_next_n);
  entry.set("native_bytes", line.traffic.native_bytes);
  entry.set("flops", line.traffic.flops);
  entry.set("varlen_us", line.varlen_s * 1e6);
  entry.set("flattened_us", line.flattened_s * 1e6);
  entry.set("fixed_us", line.fixed_s * 1e6);
  entry.set("floor_us", line.floor_s * 1e6);
  entry.set("fraction_of_floor", line.floor_s / line.varlen_s);
  entry.set("speedup_over_flattened", line.flattened_s / line.varlen_s);
  entry.set("speedup_target", kVarlenSpeedupTarget);
  entry.set("varlen_over_fixed", line.varlen_s / line.fixed_s);
  entry.set("varlen_over_fixed_target", kVarlenFixedTarget);
  entry.set("rotating_input_sets", line.rotation);
  entry.set("ok", line.problems.empty());
  if (!line.problems.empty()) entry.set("problems", line.problems);
  return entry;
}

void print_varlen_line(std::FILE* out, const VarlenLine& line, int heads) {
  std::fprintf(out, "\nrequests of uneven row counts: B=%lld, ctx %s +-30%%, 1..%d rows a request, H=%d, native path; "
                    "flattened = one request per row (keys read once per row), fixed = B requests of n rows; "
                    "floor of the varlen call (keys read once per request); targets: speedup >= %.1f, "
                    "varlen/fixed <= %.2f\n",
               static_cast<long long>(kVarlenRequests), context_label(kVarlenContext).c_str(), kVarlenMaxRows, heads,
               kVarlenSpeedupTarget, kVarlenFixedTarget);
  std::fprintf(out, "%5s | %9s %9s %7s | %12s %7s | %2s %8s %12s | %s\n", "T", "varlen us", "floor us", "floor/t",
               "flattened us", "speedup", "n", "fixed us", "varlen/fixed", "check");
  std::fprintf(out, "%5lld | %9s %9s %7s | %12s %7s | %2d %8s %12s | %s\n", static_cast<long long>(line.rows),
               microseconds(line.varlen_s).c_str(), microseconds(line.floor_s).c_str(),
               ratio(line.floor_s, line.varlen_s).c_str(), microseconds(line.flattened_s).c_str(),
               ratio(line.flattened_s, line.varlen_s).c_str(), line.fixed_next_n, microseconds(line.fixed_s).c_str(),
               ratio(line.varlen_s, line.fixed_s).c_str(), line.problems.empty() ? "ok" : line.problems.c_str());
}

struct TopkLine {
  std::int64_t rows = 0;
  std::int64_t length = 0;  // average row length
  double spread = 0;        // row lengths uniform in length * (1 +- spread)
  LogitsDistribution distribution = LogitsDistribution::uniform;
  double seconds = kNotMeasured;
  double host_s = kNotMeasured;  // host time per call
  double floor_s = kNotMeasured;
  int rotation = 1;
  std::string problems;
};

// Top-k alone over rows of synthetic values of one distribution, every row
// `length` long or, with a spread, of lengths drawn around it (the logits are
// as wide as the longest); the selection is checked against the
// multithreaded CPU backend.
TopkLine measure_topk_line(const Bench& bench, std::int64_t rows, std::int64_t length, double spread,
                           LogitsDistribution distribution, int k, std::uint64_t seed) {
  TopkLine line;
  line.rows = rows;
  line.length = length;
  line.spread = spread;
  line.distribution = distribution;
  // With no spread every row is `length` long.
  std::vector<std::int32_t> host_lengths = varied_lengths(rows, length, spread, seed);
  // Rows start on 256-byte boundaries, as an engine's logits rows do.
  const std::int64_t cols = (*std::max_element(host_lengths.begin(), host_lengths.end()) + 63) / 64 * 64;
  double valid = 0;
  for (const std::int32_t l : host_lengths) valid += l;
  const auto fail = [&](const char* what, const dsa::Status& status) {
    line.problems = std::string(what) + ": " + status.to_string();
    return line;
  };
  const dsa::Device device = bench.target.device;
  Buffer logits, lengths, indices, workspace;
  const std::size_t values = static_cast<std::size_t>(rows * cols);
  if (auto s = Buffer::allocate(values * sizeof(float), device, &logits); !s.ok()) return fail("allocate", s);
  if (auto s = Buffer::allocate(static_cast<std::size_t>(rows) * 4, device, &lengths); !s.ok()) return fail("allocate", s);
  if (auto s = Buffer::allocate(static_cast<std::size_t>(rows * k) * 4, device, &indices); !s.ok()) return fail("allocate", s);
  dsa::ExecContext ctx = bench.ctx;
  if (auto s = Buffer::allocate(dsa::topk_workspace_bytes(rows, cols, k, ctx), device, &workspace); !s.ok()) {
    return fail("allocate", s);
  }
  ctx.workspace = {workspace.data(), workspace.bytes()};
  if (auto s = lengths.upload(host_lengths.data(), lengths.bytes()); !s.ok()) return fail("upload", s);
  if (auto s = fill_logits(static_cast<float*>(logits.data()), values, distribution, seed, ctx.stream); !s.ok()) {
    return fail("fill", s);
  }
  Bench line_bench = bench;
  line_bench.ctx = ctx;
  Rotation sets;
  if (auto s = sets.create(logits, line_bench); !s.ok()) return fail("rotation", s);
  line.rotation = sets.size();
  const dsa::TensorView lengths_view = lengths.view(dsa::DType::int32, {rows});
  const dsa::TensorView indices_view = indices.view(dsa::DType::int32, {rows, k});
  if (auto s = line_bench.time([&](int run) {
        return dsa::topk(sets.at(run).view(dsa::DType::float32, {rows, cols}), lengths_view, k, indices_view, {},
                         ctx);
      }, &line.seconds, &line.host_s);
      !s.ok()) {
    return fail("topk", s);
  }
  line.floor_s = 4.0 * valid / bench.copy_bandwidth;

  std::vector<float> host_logits(values);
  std::vector<std::int32_t> selected(static_cast<std::size_t>(rows * k)), expected(selected.size());
  if (auto s = logits.download(host_logits.data(), logits.bytes()); !s.ok()) return fail("download", s);
  if (auto s = indices.download(selected.data(), indices.bytes()); !s.ok()) return fail("download", s);
  dsa::ExecContext cpu;
  cpu.backend = dsa::Backend::cpu;
  if (auto s = dsa::topk(dsa::make_view(host_logits.data(), dsa::DType::float32, {rows, cols}),
                         dsa::make_view(host_lengths.data(), dsa::DType::int32, {rows}), k,
                         dsa::make_view(expected.data(), dsa::DType::int32, {rows, k}), {}, cpu);
      !s.ok()) {
    return fail("cpu topk", s);
  }
  const std::int64_t differing = rows_with_different_sets(selected.data(), expected.data(), k, rows, k);
  if (differing > 0) line.problems = format("%lld rows differ from the CPU selection", static_cast<long long>(differing));
  return line;
}

Json point_json(const PointResult& r) {
  Json entry = Json::object();
  entry.set("batch", r.point.batch);
  entry.set("avg_context", r.point.avg_context);
  entry.set("next_n", r.point.next_n);
  entry.set("sum_lengths", r.traffic.sum_lengths);
  entry.set("native_bytes", r.traffic.native_bytes);
  entry.set("per_token_bytes", r.traffic.per_token_bytes);
  entry.set("flops", r.traffic.flops);
  entry.set("native_us", r.native_s * 1e6);
  entry.set("native_host_us", r.native_host_s * 1e6);
  entry.set("per_token_us", r.per_token_s * 1e6);
  entry.set("floor_us", r.floor_s * 1e6);
  entry.set("fraction_of_floor", r.floor_s / r.native_s);
  entry.set("native_speedup_over_per_token", r.per_token_s / r.native_s);
  entry.set("topk_us", r.topk_s * 1e6);
  entry.set("topk_host_us", r.topk_host_s * 1e6);
  entry.set("topk_floor_us", r.topk_floor_s * 1e6);
  entry.set("topk_fraction_of_floor", r.topk_floor_s / r.topk_s);
  entry.set("index_topk_us", r.index_topk_s * 1e6);
  entry.set("index_topk_host_us", r.index_topk_host_s * 1e6);
  entry.set("fused_index_topk_us", r.fused_s * 1e6);
  entry.set("fused_over_logits", r.fused_s / r.native_s);
  entry.set("lengths_us", r.lengths_s * 1e6);
  entry.set("plan_us", r.plan_s * 1e6);
  entry.set("lengths_and_plan_us", r.lengths_and_plan_s * 1e6);
  entry.set("topk_slots_us", r.topk_slots_s * 1e6);
  entry.set("step_parts_us", r.step_parts_s() * 1e6);
  entry.set("step_graph_us", r.step_s * 1e6);
  entry.set("step_graph_pdl_us", r.step_pdl_s * 1e6);
  entry.set("step_graph_pdl_over_logits", r.step_pdl_s / r.native_s);
  entry.set("layer_graph_pdl_us", r.layer_pdl_s * 1e6);
  entry.set("layer_graph_pdl_over_logits", r.layer_pdl_s / r.native_s);
  entry.set("path_max_relative_difference", r.path_difference);
  entry.set("rotating_input_sets", r.rotation);
  entry.set("ok", r.problems.empty());
  if (!r.problems.empty()) entry.set("problems", r.problems);
  return entry;
}

void print_grid_table(std::FILE* out, const std::vector<PointResult>& results, bool with_floor) {
  std::fprintf(out, "%5s %5s %2s | %10s %9s %7s %7s | %12s %7s | %9s %7s | %13s | %9s %7s | %s\n", "B", "ctx",
               "n", "native us", "floor us", "floor/t", "host us", "per-token us", "speedup", "topk us", "floor/t",
               "index_topk us", "fused us", "/native", "check");
  for (const PointResult& r : results) {
    std::fprintf(out, "%5lld %5s %2d | %10s %9s %7s %7s | %12s %7s | %9s %7s | %13s | %9s %7s | %s\n",
                 static_cast<long long>(r.point.batch), context_label(r.point.avg_context).c_str(), r.point.next_n,
                 microseconds(r.native_s).c_str(), with_floor ? microseconds(r.floor_s).c_str() : "-",
                 with_floor ? ratio(r.floor_s, r.native_s).c_str() : "-",
                 with_floor ? microseconds(r.native_host_s).c_str() : "-", microseconds(r.per_token_s).c_str(),
                 ratio(r.per_token_s, r.native_s).c_str(), microseconds(r.topk_s).c_str(),
                 with_floor ? ratio(r.topk_floor_s, r.topk_s).c_str() : "-", microseconds(r.index_topk_s).c_str(),
                 microseconds(r.fused_s).c_str(), ratio(r.fused_s, r.native_s).c_str(),
                 r.problems.empty() ? "ok" : r.problems.c_str());
  }
}

void print_step_table(std::FILE* out, const std::vector<PointResult>& results) {
  std::fprintf(out, "%5s %5s %2s | %8s %8s %9s | %9s %9s %9s | %9s %9s %8s | %9s %8s | %9s %8s\n", "B", "ctx",
               "n", "lengths", "plan", "one call", "logits", "topk slots", "sum us", "graph us", "/sum", "/logits",
               "pdl us", "/logits", "layer us", "/logits");
  for (const PointResult& r : results) {
    std::fprintf(out, "%5lld %5s %2d | %8s %8s %9s | %9s %9s %9s | %9s %9s %8s | %9s %8s | %9s %8s\n",
                 static_cast<long long>(r.point.batch), context_label(r.point.avg_context).c_str(), r.point.next_n,
                 microseconds(r.lengths_s).c_str(), microseconds(r.plan_s).c_str(),
                 microseconds(r.lengths_and_plan_s).c_str(), microseconds(r.native_s).c_str(),
                 microseconds(r.topk_slots_s).c_str(), microseconds(r.step_parts_s()).c_str(),
                 microseconds(r.step_s).c_str(), ratio(r.step_s, r.step_parts_s()).c_str(),
                 ratio(r.step_s, r.native_s).c_str(), microseconds(r.step_pdl_s).c_str(),
                 ratio(r.step_pdl_s, r.native_s).c_str(), microseconds(r.layer_pdl_s).c_str(),
                 ratio(r.layer_pdl_s, r.native_s).c_str());
  }
}

// The copy bandwidth and the cuBLASLt fp8 matrix rate; with `tensor_core`
// (the prefill grid) also the fp8 tensor-core rate its floor uses, where a
// GPU without it (or without cuBLASLt's fp8 product) leaves that rate 0.
dsa::Status measure_rates(Bench* bench, bool tensor_core, std::FILE* text, Json* document) {
  const std::size_t copy_bytes = std::min<std::size_t>(kCopyBytes, bench->rotation_budget / 2);
  DSA_RETURN_IF_ERROR(measure_copy_bandwidth(bench->ctx.stream, copy_bytes, kRateIters, &bench->copy_bandwidth));
  Json& rates = document->set("rates", Json::object());
  Json& copy = rates.set("copy_bandwidth", Json::object());
  copy.set("bytes_per_second", bench->copy_bandwidth);
  copy.set("buffer_bytes", static_cast<std::int64_t>(copy_bytes));
  copy.set("method", "cudaMemcpyAsync device to device, bytes read + written, median");
  std::fprintf(text, "copy bandwidth  %.2f TB/s (device-to-device cudaMemcpyAsync of %zu MiB, read + write, median of %d)\n",
               bench->copy_bandwidth * 1e-12, copy_bytes >> 20, kRateIters);

  MatmulRate rate;
  const dsa::Status matmul_status = measure_fp8_matmul_rate(bench->ctx.stream, kMatmulSize, kRateIters, &rate);
  Json& matmul = rates.set("fp8_matmul", Json::object());
  matmul.set("method", "cuBLASLt e4m3 x e4m3, fp32 accumulation, median");
  if (tensor_core && matmul_status.code() == dsa::ErrorCode::unsupported) {
    matmul.set("unavailable", matmul_status.message());
    std::fprintf(text, "fp8 matrix rate not measured: %s\n", matmul_status.message().c_str());
  } else {
    DSA_RETURN_IF_ERROR(matmul_status);
    bench->fp8_rate = rate.flops_per_second;
    matmul.set("flops_per_second", rate.flops_per_second);
    matmul.set("size", rate.size);
    matmul.set("output_type", rate.output_type);
    std::fprintf(text, "fp8 matrix rate %.0f TFLOP/s (cuBLASLt e4m3 x e4m3 %d^3, %s output, fp32 accumulation, median of %d)\n",
                 bench->fp8_rate * 1e-12, rate.size, rate.output_type.c_str(), kRateIters);
  }
  if (!tensor_core) return {};

  TensorCoreRate peak;
  const dsa::Status peak_status = measure_fp8_tensor_core_rate(bench->ctx.stream, kRateIters, &peak);
  Json& tensor_core_json = rates.set("fp8_tensor_core", Json::object());
  tensor_core_json.set("method", "back-to-back wgmma m64nNk32 e4m3 x e4m3 -> float32, operands in shared memory, "
                                 "every multiprocessor filled, median; the faster of N = 128 and 256");
  if (peak_status.code() == dsa::ErrorCode::unsupported) {
    tensor_core_json.set("unavailable", peak_status.message());
    std::fprintf(text, "fp8 tensor-core rate not measured (%s): no fp8 rate floor\n", peak_status.message().c_str());
    return {};
  }
  DSA_RETURN_IF_ERROR(peak_status);
  bench->fp8_peak_rate = peak.flops_per_second;
  tensor_core_json.set("flops_per_second", peak.flops_per_second);
  tensor_core_json.set("n", peak.n);
  tensor_core_json.set("ctas", peak.ctas);
  tensor_core_json.set("warpgroups_per_sm", peak.warpgroups_per_sm);
  Json& by_n = tensor_core_json.set("by_n", Json::array());
  std::string others;
  for (const auto& [n, flops_per_second] : peak.by_n) {
    Json& entry = by_n.push(Json::object());
    entry.set("n", n);
    entry.set("flops_per_second", flops_per_second);
    if (n != peak.n) others += format(", m64n%dk32: %.0f", n, flops_per_second * 1e-12);
  }
  std::fprintf(text, "fp8 tensor-core rate %.0f TFLOP/s (wgmma m64n%dk32 e4m3 from shared memory, %d CTAs, "
                     "%d warpgroups per SM, median of %d%s)\n",
               peak.flops_per_second * 1e-12, peak.n, peak.ctas, peak.warpgroups_per_sm, kRateIters, others.c_str());
  return {};
}

int gpu_bench(const Options& options, const Target& target, std::FILE* text, Json* document) {
  Bench bench;
  bench.target = target;
  bench.ctx.backend = target.backend;
  bench.iters = options.iters.value_or(kGpuIters);
  dsa::DeviceStream stream;
  dsa::DeviceInfo info;
  if (auto s = dsa::DeviceStream::create(target.device.index, &stream); !s.ok()) {
    std::fprintf(stderr, "dsa-indexer bench: %s\n", s.to_string().c_str());
    return 1;
  }
  if (auto s = dsa::get_device_info(target.device.index, &info); !s.ok()) {
    std::fprintf(stderr, "dsa-indexer bench: %s\n", s.to_string().c_str());
    return 1;
  }
  bench.ctx.stream = stream.handle();
  bench.l2_bytes = info.l2_cache_bytes;
  bench.rotation_budget = info.global_memory_bytes / 4;

  const std::string device_text = describe_device(target);
  std::fprintf(text, "dsa-indexer bench: backend %s (%s) on %s\n", backend_choice_name(options.backend),
               dsa::backend_name(target.backend), device_text.c_str());
  document->set("device", device_text);
  document->set("backend", dsa::backend_name(target.backend));
  const bool prefill = options.grid == GridSize::prefill;
  if (auto s = measure_rates(&bench, prefill, text, document); !s.ok()) {
    std::fprintf(stderr, "dsa-indexer bench: measuring the floor rates: %s\n", s.to_string().c_str());
    document->set("error", s.to_string());
    return 1;
  }
  if (prefill) return prefill_grid(bench, options, text, document);
  Json& parameters = document->set("parameters", Json::object());
  parameters.set("grid", grid_size_name(options.grid));
  parameters.set("heads", options.heads);
  parameters.set("head_dim", kHeadDim);
  parameters.set("k", options.k);
  parameters.set("spread", kSpread);
  parameters.set("lengths", "causal");
  parameters.set("page_order", "random permutation");
  parameters.set("page_size", options.page_size);
  parameters.set("key_format", dsa::key_format_name(options.key_format));
  parameters.set("query_format", dsa::key_format_name(options.resolved_query_format()));
  parameters.set("seed", static_cast<std::int64_t>(options.seed));
  Json& timing = document->set("timing", Json::object());
  timing.set("method", "CUDA events around the enqueued work of each call, the stream held until the call is "
                      "enqueued (host time excluded; *_host_us report it), median");
  timing.set("warmup", bench.warmup);
  timing.set("iters", bench.iters);
  timing.set("rotation", "inputs copied until they span 4x the L2 cache (2..16 sets)");

  const std::vector<GridPoint> points = grid_points(options.grid);
  std::vector<PointResult> results;
  Json& grid = document->set("grid", Json::array());
  bool all_ok = true;
  for (std::size_t i = 0; i < points.size(); ++i) {
    std::fprintf(text, "  [%zu/%zu] B=%lld ctx=%s next_n=%d ...\n", i + 1, points.size(),
                 static_cast<long long>(points[i].batch), context_label(points[i].avg_context).c_str(),
                 points[i].next_n);
    std::fflush(text);
    results.push_back(measure_point(bench, points[i], options, options.seed + i));
    grid.push(point_json(results.back()));
    all_ok = all_ok && results.back().problems.empty();
  }
  // The varlen line goes with the decode grids (not the top-k lines alone).
  std::optional<VarlenLine> varlen;
  if (options.grid != GridSize::topk) {
    std::fprintf(text, "  [varlen] B=%lld ctx=%s, 1..%d rows a request ...\n", static_cast<long long>(kVarlenRequests),
                 context_label(kVarlenContext).c_str(), kVarlenMaxRows);
    std::fflush(text);
    varlen = measure_varlen(bench, options);
    document->set("varlen", varlen_json(*varlen));
    all_ok = all_ok && varlen->problems.empty();
  }

  struct TopkCase {
    std::int64_t rows, length;
    double spread;
    LogitsDistribution distribution;
  };
  // The 512-row lines have lengths uniform within +-30 % of 64K, as the
  // grid's contexts; the first line's shape with every row full length is
  // kept as well.
  const std::vector<TopkCase> cases = {
      {512, 65536, 0.3, LogitsDistribution::uniform},      {512, 65536, 0.0, LogitsDistribution::uniform},
      {32, 131072, 0.0, LogitsDistribution::uniform},      {512, 65536, 0.3, LogitsDistribution::concentrated},
      {512, 65536, 0.3, LogitsDistribution::tied},         {512, 65536, 0.3, LogitsDistribution::constant},
  };
  std::vector<TopkLine> lines;
  Json& topk_json = document->set("topk", Json::array());
  for (const TopkCase& c : cases) {
    lines.push_back(measure_topk_line(bench, c.rows, c.length, c.spread, c.distribution, options.k, options.seed));
    const TopkLine& line = lines.back();
    Json& entry = topk_json.push(Json::object());
    entry.set("rows", line.rows);
    entry.set("length", line.length);
    entry.set("length_spread", line.spread);
    entry.set("k", options.k);
    entry.set("distribution", distribution_name(line.distribution));
    entry.set("us", line.seconds * 1e6);
    entry.set("host_us", line.host_s * 1e6);
    entry.set("floor_us", line.floor_s * 1e6);
    entry.set("fraction_of_floor", line.floor_s / line.seconds);
    entry.set("rotating_input_sets", line.rotation);
    entry.set("ok", line.problems.empty());
    if (!line.problems.empty()) entry.set("problems", line.problems);
    all_ok = all_ok && line.problems.empty();
  }

  if (!results.empty()) {
    std::fprintf(text, "\nreference grid: H=%d D=%d k=%d, causal lengths +-30%%, %d-token pages of %s keys (%s "
                       "queries) in random order; median of %d runs (CUDA events around the enqueued work), inputs "
                       "rotated over >= 2 copies\n",
                 options.heads, kHeadDim, options.k, options.page_size, dsa::key_format_name(options.key_format),
                 dsa::key_format_name(options.resolved_query_format()), bench.iters);
    std::fprintf(text, "floor = max(bytes / copy bandwidth, FLOPs / fp8 rate); floor/t = fraction of the floor reached; "
                       "host = the host's time per native call (validation and enqueue); speedup = per-token / native\n");
    print_grid_table(text, results, true);
    std::fprintf(text, "\ndecode step on the native path (lengths -> schedule -> logits -> top-k as cache slots, "
                       "k=%d): each call timed alone, their sum, and the whole step replayed as a CUDA graph, "
                       "without and with programmatic dependent launch (pdl); layer = logits -> top-k as slots "
                       "replayed with pdl, what each layer repeats (the lengths and the schedule serve them all)\n",
                 options.k);
    print_step_table(text, results);
  }
  if (varlen) print_varlen_line(text, *varlen, options.heads);
  std::fprintf(text, "\ntop-k alone (k=%d; floor = one read of the logits at copy bandwidth):\n", options.k);
  std::fprintf(text, "%5s %9s %-13s | %9s %9s %7s %7s | %s\n", "T", "length", "values", "us", "floor us", "floor/t",
               "host us", "check");
  for (const TopkLine& line : lines) {
    const std::string length_label =
        context_label(line.length) + (line.spread > 0 ? format("+-%.0f%%", line.spread * 100) : std::string());
    std::fprintf(text, "%5lld %9s %-13s | %9s %9s %7s %7s | %s\n", static_cast<long long>(line.rows),
                 length_label.c_str(), distribution_name(line.distribution),
                 microseconds(line.seconds).c_str(), microseconds(line.floor_s).c_str(),
                 ratio(line.floor_s, line.seconds).c_str(), microseconds(line.host_s).c_str(),
                 line.problems.empty() ? "ok" : line.problems.c_str());
  }
  return all_ok ? 0 : 1;
}

// Without a GPU: one small point on the CPU backend, without a floor.
int cpu_bench(const Options& options, const Target& target, std::FILE* text, Json* document) {
  const bool prefill = options.grid == GridSize::prefill;
  const std::string reason =
      std::string(prefill ? "the prefill grid" : "the reference grid") + " and its floor need a CUDA GPU; " +
      (options.backend == BackendChoice::automatic
           ? std::string("none is available")
           : format("--backend %s runs on the host", backend_choice_name(options.backend)));
  std::fprintf(text, "dsa-indexer bench: %s.\nTiming one small point on the %s backend instead (%s):\n",
               reason.c_str(), dsa::backend_name(target.backend), describe_device(target).c_str());
  document->set("grid", Json());
  document->set("note", reason);
  Bench bench;
  bench.target = target;
  bench.ctx.backend = target.backend;
  bench.iters = options.iters.value_or(kCpuIters);
  if (prefill) return prefill_cpu_point(bench, options, text, document);
  const GridPoint point{2, 2048, 2};
  const PointResult result = measure_point(bench, point, options, options.seed);
  Json& cpu = document->set("cpu_point", point_json(result));
  cpu.set("method", "std::chrono wall clock, median");
  cpu.set("iters", bench.iters);
  print_grid_table(text, {result}, false);
  return result.problems.empty() ? 0 : 1;
}

}  // namespace

const char* distribution_name(LogitsDistribution distribution) noexcept {
  switch (distribution) {
    case LogitsDistribution::uniform: return "uniform";
    case LogitsDistribution::concentrated: return "concentrated";
    case LogitsDistribution::tied: return "tied";
    case LogitsDistribution::constant: return "constant";
  }
  return "?";
}

int bench_command(const Options& options) {
  std::FILE* text = options.json && options.json_file.empty() ? stderr : stdout;
  Json document = Json::object();
  document.set("tool", "dsa-indexer");
  document.set("command", "bench");
  Target target;
  std::string error;
  int exit_code = 0;
  if (!resolve_target(options.backend, &target, &error)) {
    std::fprintf(stderr, "dsa-indexer bench: %s\n", error.c_str());
    document.set("error", error);
    exit_code = 1;
  } else {
    exit_code = target.on_gpu() ? gpu_bench(options, target, text, &document)
                                : cpu_bench(options, target, text, &document);
  }
  if (options.json && !write_json(document, options.json_file, &error)) {
    std::fprintf(stderr, "dsa-indexer: %s\n", error.c_str());
    return 1;
  }
  return exit_code;
}

}  // namespace dsa_cli
