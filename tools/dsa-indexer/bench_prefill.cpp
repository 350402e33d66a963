#include "bench_prefill.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "device_timing.hpp"
#include "dsa/dsa.hpp"
#include "report.hpp"
#include "verify.hpp"
#include "workload.hpp"

namespace dsa_cli {
namespace {

// One mqa_logits call's float32 logits may take at most this much (and half
// the free device memory); a point whose logits are larger is split into
// consecutive row chunks, as engines split a long prefill, and the chunks'
// calls are timed together.
constexpr std::size_t kLogitsBudget = std::size_t{8} << 30;
// A point's timed runs take about this long at most: a point whose call
// takes longer than kPointSeconds / --iters gets fewer runs, at least
// kMinRuns (and one warm-up), so that slow kernels finish the grid.
constexpr double kPointSeconds = 2.0;
constexpr int kMinRuns = 5;

// A causal prefill chunk: S new tokens over a prefix of P, the contiguous
// form (keys = the prefix then the new tokens, S_kv = P + S; row i scores
// keys [0, P + i + 1)).
struct PrefillPoint {
  int heads = 64;
  std::int64_t seq = 0;
  std::int64_t prefix = 0;
  std::int64_t kv() const { return prefix + seq; }
};

std::vector<PrefillPoint> grid_points() {
  std::vector<PrefillPoint> points;
  for (const int heads : {64, 32}) {
    for (const std::int64_t seq : {512, 4096, 16384}) {
      for (const std::int64_t prefix : {0, 32768, 98304}) points.push_back({heads, seq, prefix});
    }
  }
  return points;
}

// The ragged top-k line is taken on this point's logits.
constexpr PrefillPoint kTopkPoint{64, 4096, 32768};
constexpr PrefillPoint kCpuPoint{64, 64, 256};

// mqa_logits' inputs in host memory: random e4m3 queries and keys (finite,
// magnitudes below 2), signed head weights, positive key scales, causal ranges.
struct PrefillInputs {
  std::vector<std::uint8_t> q;        // [S, H, D]
  std::vector<std::uint8_t> keys;     // [S_kv, D]
  std::vector<float> weights;         // [S, H]
  std::vector<float> key_scales;      // [S_kv]
  std::vector<std::int32_t> ks, ke;   // [S]
  std::vector<std::int32_t> lengths;  // [S] ke - ks
};

void fill_e4m3(std::vector<std::uint8_t>& bytes, std::mt19937_64& random) {
  // Eight bytes a draw; clearing bit 6 keeps the exponent field below 8,
  // which also rules out the NaN codes.
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    std::uint64_t bits = random();
    for (std::size_t j = i; j < std::min(i + 8, bytes.size()); ++j, bits >>= 8) {
      bytes[j] = static_cast<std::uint8_t>(bits & 0xBF);
    }
  }
}

PrefillInputs make_inputs(const PrefillPoint& point, std::uint64_t seed) {
  const std::int64_t dim = kHeadDim;
  PrefillInputs in;
  std::mt19937_64 random(seed);
  in.q.resize(static_cast<std::size_t>(point.seq * point.heads * dim));
  in.keys.resize(static_cast<std::size_t>(point.kv() * dim));
  fill_e4m3(in.q, random);
  fill_e4m3(in.keys, random);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f), scale(0.5f / 448, 2.0f / 448);
  in.weights.resize(static_cast<std::size_t>(point.seq * point.heads));
  for (float& w : in.weights) w = weight(random);
  in.key_scales.resize(static_cast<std::size_t>(point.kv()));
  for (float& s : in.key_scales) s = scale(random);
  in.ks.assign(static_cast<std::size_t>(point.seq), 0);
  in.ke.resize(in.ks.size());
  in.lengths.resize(in.ks.size());
  for (std::int64_t i = 0; i < point.seq; ++i) {
    const auto row = static_cast<std::size_t>(i);
    in.ke[row] = static_cast<std::int32_t>(point.prefix + i + 1);
    in.lengths[row] = in.ke[row] - in.ks[row];
  }
  return in;
}

// The times of one form of the call. Only the contiguous form is measured;
// the paged form (rows scored straight from a request's cache pages) takes
// its own FormTimes beside it once the library has it.
struct FormTimes {
  double seconds = kNotMeasured;
  double host_s = kNotMeasured;  // host time per timed run (all its calls)
  int calls = 0;                 // mqa_logits calls per timed run (row chunks)
  int runs = 0;                  // timed runs, the median's sample
  std::int64_t rows_per_call = 0;
};

struct PrefillResult {
  PrefillPoint point;
  double pairs = 0;         // valid (row, key) pairs: sum of ke - ks
  double flops = 0;         // 2 * H * D * pairs
  double logits_bytes = 0;  // 4 * S * S_kv: every column written (clean_logits)
  double bytes = 0;         // the inputs read once plus the logits written once
  double compute_floor_s = kNotMeasured;
  double memory_floor_s = kNotMeasured;
  FormTimes contiguous;
  int rotation = 1;
  std::string problems;  // empty when the point was measured and checked

  void note(const std::string& problem) { problems += (problems.empty() ? "" : "; ") + problem; }
  double floor_s() const { return std::max(compute_floor_s, memory_floor_s); }  // NaN without a rate
  const char* bound() const {
    if (std::isnan(compute_floor_s)) return "-";
    return compute_floor_s >= memory_floor_s ? "compute" : "memory";
  }
};

// dsa::topk over the rows of one chunk's full logits, row i's candidates
// [ks[i], ke[i]), against one read of the valid logits.
struct RaggedTopk {
  PrefillPoint point;
  int k = 0;
  double valid_bytes = 0;
  double seconds = kNotMeasured;
  double host_s = kNotMeasured;
  double floor_s = kNotMeasured;
  int rotation = 1;
  std::string problems;
  bool measured = false;
};

template <typename T>
dsa::Status upload(const std::vector<T>& values, dsa::Device device, Buffer* out) {
  DSA_RETURN_IF_ERROR(Buffer::allocate(values.size() * sizeof(T), device, out));
  return out->upload(values.data(), values.size() * sizeof(T));
}

// The ragged top-k of `logits` (the point's full [S, S_kv] logits), checked
// against the CPU backend's selection of the same rows.
void measure_ragged_topk(const Bench& bench, const PrefillInputs& in, const Buffer& logits, const Buffer& ks,
                         const Buffer& lengths, dsa::ExecContext ctx, RaggedTopk* line) {
  const PrefillPoint& point = line->point;
  const std::int64_t rows = point.seq, cols = point.kv();
  const int k = line->k;
  line->measured = true;
  const auto fail = [&](const char* what, const dsa::Status& status) {
    line->problems = std::string(what) + ": " + status.to_string();
  };
  const dsa::Device device = bench.target.device;
  Buffer indices;
  if (auto s = Buffer::allocate(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k) * 4, device, &indices);
      !s.ok()) {
    return fail("allocate", s);
  }
  Bench line_bench = bench;
  line_bench.ctx = ctx;
  Rotation sets;
  if (auto s = sets.create(logits, line_bench); !s.ok()) return fail("rotation", s);
  line->rotation = sets.size();
  dsa::TopkOptions options;
  options.row_starts = ks.view(dsa::DType::int32, {rows});
  options.position_offsets = options.row_starts;
  const dsa::TensorView lengths_view = lengths.view(dsa::DType::int32, {rows});
  const dsa::TensorView indices_view = indices.view(dsa::DType::int32, {rows, k});
  if (auto s = line_bench.time([&](int run) {
        return dsa::topk(sets.at(run).view(dsa::DType::float32, {rows, cols}), lengths_view, k, indices_view,
                         options, ctx);
      }, &line->seconds, &line->host_s);
      !s.ok()) {
    return fail("topk", s);
  }
  if (auto s = dsa::read_device_error(ctx); !s.ok()) return fail("device error", s);
  line->floor_s = line->valid_bytes / bench.copy_bandwidth;

  std::vector<float> host_logits(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  std::vector<std::int32_t> selected(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k));
  std::vector<std::int32_t> expected(selected.size());
  if (auto s = logits.download(host_logits.data(), host_logits.size() * sizeof(float)); !s.ok()) {
    return fail("download", s);
  }
  if (auto s = indices.download(selected.data(), selected.size() * sizeof(std::int32_t)); !s.ok()) {
    return fail("download", s);
  }
  dsa::ExecContext cpu;
  cpu.backend = dsa::Backend::cpu;
  dsa::TopkOptions host_options;
  host_options.row_starts = dsa::make_view(const_cast<std::int32_t*>(in.ks.data()), dsa::DType::int32, {rows});
  host_options.position_offsets = host_options.row_starts;
  if (auto s = dsa::topk(dsa::make_view(host_logits.data(), dsa::DType::float32, {rows, cols}),
                         dsa::make_view(const_cast<std::int32_t*>(in.lengths.data()), dsa::DType::int32, {rows}), k,
                         dsa::make_view(expected.data(), dsa::DType::int32, {rows, k}), host_options, cpu);
      !s.ok()) {
    return fail("cpu topk", s);
  }
  const std::int64_t differing = rows_with_different_sets(selected.data(), expected.data(), k, rows, k);
  if (differing > 0) {
    line->problems = format("%lld rows differ from the CPU selection", static_cast<long long>(differing));
  }
}

// Times mqa_logits on one point (every chunk's call in each timed run) and,
// with `topk`, the ragged top-k of its logits.
PrefillResult measure_point(const Bench& bench, const PrefillPoint& point, std::uint64_t seed, RaggedTopk* topk) {
  PrefillResult result;
  result.point = point;
  const std::int64_t seq = point.seq, kv = point.kv(), heads = point.heads, dim = kHeadDim;
  const PrefillInputs in = make_inputs(point, seed);
  for (const std::int32_t length : in.lengths) result.pairs += length;
  result.flops = 2.0 * static_cast<double>(heads * dim) * result.pairs;
  result.logits_bytes = 4.0 * static_cast<double>(seq) * static_cast<double>(kv);
  result.bytes = static_cast<double>(in.q.size() + in.keys.size()) +
                 4.0 * static_cast<double>(in.weights.size() + in.key_scales.size() + in.ks.size() + in.ke.size()) +
                 result.logits_bytes;
  if (bench.gpu()) {
    result.memory_floor_s = result.bytes / bench.copy_bandwidth;
    if (bench.fp8_peak_rate > 0) result.compute_floor_s = result.flops / bench.fp8_peak_rate;
  }

  const dsa::Device device = bench.target.device;
  const auto failed = [&](const char* what, const dsa::Status& status) {
    result.note(std::string(what) + ": " + status.to_string());
    return result;
  };
  Buffer q, keys, weights, key_scales, ks, ke, lengths, workspace, logits;
  const dsa::Status uploaded = [&]() -> dsa::Status {
    DSA_RETURN_IF_ERROR(upload(in.q, device, &q));
    DSA_RETURN_IF_ERROR(upload(in.keys, device, &keys));
    DSA_RETURN_IF_ERROR(upload(in.weights, device, &weights));
    DSA_RETURN_IF_ERROR(upload(in.key_scales, device, &key_scales));
    DSA_RETURN_IF_ERROR(upload(in.ks, device, &ks));
    DSA_RETURN_IF_ERROR(upload(in.ke, device, &ke));
    return upload(in.lengths, device, &lengths);
  }();
  if (!uploaded.ok()) return failed("inputs", uploaded);
  dsa::ExecContext ctx = bench.ctx;
  if (bench.gpu()) {
    const std::size_t bytes = std::max(dsa::mqa_logits_workspace_bytes(ctx),
                                       topk != nullptr ? dsa::topk_workspace_bytes(seq, kv, topk->k, ctx) : 0);
    if (auto s = Buffer::allocate(bytes, device, &workspace); !s.ok()) return failed("allocate workspace", s);
    ctx.workspace = {workspace.data(), workspace.bytes()};
  }
  Bench point_bench = bench;
  point_bench.ctx = ctx;
  // Queries and keys rotate past the L2 cache (the logits are only written).
  Rotation q_sets, key_sets;
  if (auto s = q_sets.create(q, point_bench); !s.ok()) return failed("rotation", s);
  if (auto s = key_sets.create(keys, point_bench); !s.ok()) return failed("rotation", s);
  result.rotation = std::min(q_sets.size(), key_sets.size());

  // The rows' chunks: one call unless the logits exceed the budget.
  std::size_t budget = kLogitsBudget;
  if (bench.gpu()) {
    std::size_t free_bytes = 0, total_bytes = 0;
    if (auto s = device_memory(&free_bytes, &total_bytes); !s.ok()) return failed("device memory", s);
    budget = std::min(budget, free_bytes / 2);
  }
  std::vector<dsa::MqaLogitsChunk> chunks;
  if (auto s = dsa::plan_mqa_logits_chunks(
          dsa::make_view(const_cast<std::int32_t*>(in.ks.data()), dsa::DType::int32, {seq}),
          dsa::make_view(const_cast<std::int32_t*>(in.ke.data()), dsa::DType::int32, {seq}), kv, false,
          dsa::DType::float32, budget, &chunks);
      !s.ok()) {
    return failed(format("no chunk of the logits fits %zu MiB", budget >> 20).c_str(), s);
  }
  std::int64_t rows_per_call = 0;
  for (const dsa::MqaLogitsChunk& chunk : chunks) rows_per_call = std::max(rows_per_call, chunk.end - chunk.begin);
  result.contiguous.calls = static_cast<int>(chunks.size());
  result.contiguous.rows_per_call = rows_per_call;
  const std::size_t logits_bytes =
      static_cast<std::size_t>(rows_per_call) * static_cast<std::size_t>(kv) * sizeof(float);
  if (auto s = Buffer::allocate(logits_bytes, device, &logits); !s.ok()) return failed("allocate logits", s);

  dsa::MqaLogitsOptions options;
  options.clean_logits = true;  // DeepGEMM's default
  const auto run_chunks = [&](int run, const dsa::ExecContext& c) -> dsa::Status {
    auto* q_base = static_cast<std::uint8_t*>(q_sets.at(run).data());
    auto* weight_base = static_cast<float*>(weights.data());
    auto* ks_base = static_cast<std::int32_t*>(ks.data());
    auto* ke_base = static_cast<std::int32_t*>(ke.data());
    for (const dsa::MqaLogitsChunk& chunk : chunks) {
      const std::int64_t rows = chunk.end - chunk.begin;
      DSA_RETURN_IF_ERROR(dsa::mqa_logits(
          dsa::make_view(q_base + chunk.begin * heads * dim, dsa::DType::float8_e4m3, {rows, heads, dim}, device),
          key_sets.at(run).view(dsa::DType::float8_e4m3, {kv, dim}),
          key_scales.view(dsa::DType::float32, {kv}),
          dsa::make_view(weight_base + chunk.begin * heads, dsa::DType::float32, {rows, heads}, device),
          dsa::make_view(ks_base + chunk.begin, dsa::DType::int32, {rows}, device),
          dsa::make_view(ke_base + chunk.begin, dsa::DType::int32, {rows}, device),
          logits.view(dsa::DType::float32, {rows, kv}), options, c));
    }
    return {};
  };
  // One checked pass first: a range the device refuses is an error here, not
  // a fast time of NaN rows. It synchronizes, so its wall clock bounds the
  // runs a slow point gets (see kPointSeconds).
  dsa::ExecContext checked = ctx;
  checked.check_device_errors = bench.gpu();
  const auto checked_start = std::chrono::steady_clock::now();
  if (auto s = run_chunks(0, checked); !s.ok()) return failed("mqa_logits", s);
  const std::chrono::duration<double> checked_time = std::chrono::steady_clock::now() - checked_start;
  const int affordable = static_cast<int>(std::min(kPointSeconds / checked_time.count(), 1e6));
  point_bench.iters = std::min(bench.iters, std::max(kMinRuns, affordable));
  if (point_bench.iters < bench.iters) point_bench.warmup = 1;  // the checked pass warmed it too
  result.contiguous.runs = point_bench.iters;
  if (auto s = point_bench.time([&](int run) { return run_chunks(run, ctx); }, &result.contiguous.seconds,
                                &result.contiguous.host_s);
      !s.ok()) {
    return failed("mqa_logits", s);
  }
  if (bench.gpu()) {
    if (auto s = dsa::read_device_error(ctx); !s.ok()) return failed("device error", s);
  }
  if (topk != nullptr) {
    topk->valid_bytes = 4.0 * result.pairs;
    if (chunks.size() == 1) {
      measure_ragged_topk(bench, in, logits, ks, lengths, ctx, topk);
    } else {
      topk->problems = "the point's logits were split into chunks";
    }
  }
  return result;
}

Json point_json(const PrefillResult& r) {
  Json entry = Json::object();
  entry.set("heads", r.point.heads);
  entry.set("head_dim", kHeadDim);
  entry.set("seq", r.point.seq);
  entry.set("prefix", r.point.prefix);
  entry.set("seq_kv", r.point.kv());
  entry.set("valid_pairs", r.pairs);
  entry.set("flops", r.flops);
  entry.set("logits_bytes", r.logits_bytes);
  entry.set("bytes", r.bytes);
  entry.set("compute_floor_us", r.compute_floor_s * 1e6);
  entry.set("memory_floor_us", r.memory_floor_s * 1e6);
  entry.set("floor_us", r.floor_s() * 1e6);
  entry.set("bound", std::isnan(r.compute_floor_s) ? Json() : Json(r.bound()));
  Json& contiguous = entry.set("contiguous", Json::object());
  contiguous.set("us", r.contiguous.seconds * 1e6);
  contiguous.set("host_us", r.contiguous.host_s * 1e6);
  contiguous.set("tflops", r.flops / r.contiguous.seconds * 1e-12);
  contiguous.set("fraction_of_floor", r.floor_s() / r.contiguous.seconds);
  contiguous.set("calls", r.contiguous.calls);
  contiguous.set("rows_per_call", r.contiguous.rows_per_call);
  contiguous.set("runs", r.contiguous.runs);
  entry.set("rotating_input_sets", r.rotation);
  entry.set("ok", r.problems.empty());
  if (!r.problems.empty()) entry.set("problems", r.problems);
  return entry;
}

std::string calls_label(const FormTimes& form) {
  if (form.calls <= 1) return form.calls == 1 ? "1" : "-";
  return format("%dx%lld", form.calls, static_cast<long long>(form.rows_per_call));
}

std::string tflops(double flops, double seconds) {
  return std::isnan(seconds) ? std::string("n/a") : format("%.1f", flops / seconds * 1e-12);
}

void print_table(std::FILE* out, const std::vector<PrefillResult>& results, bool with_floor) {
  std::fprintf(out, "%3s %6s %6s %6s | %10s %9s %8s %9s %4s | %10s %7s %7s | %s\n", "H", "S", "P", "S_kv", "us",
               "TFLOP/s", "host us", "calls", "runs", "floor us", "floor/t", "bound", "check");
  for (const PrefillResult& r : results) {
    std::fprintf(out, "%3d %6s %6s %6s | %10s %9s %8s %9s %4d | %10s %7s %7s | %s\n", r.point.heads,
                 context_label(r.point.seq).c_str(), context_label(r.point.prefix).c_str(),
                 context_label(r.point.kv()).c_str(), microseconds(r.contiguous.seconds).c_str(),
                 tflops(r.flops, r.contiguous.seconds).c_str(),
                 with_floor ? microseconds(r.contiguous.host_s).c_str() : "-",
                 calls_label(r.contiguous).c_str(), r.contiguous.runs, with_floor ? microseconds(r.floor_s()).c_str() : "-",
                 with_floor ? ratio(r.floor_s(), r.contiguous.seconds).c_str() : "-", with_floor ? r.bound() : "-",
                 r.problems.empty() ? "ok" : r.problems.c_str());
  }
}

void describe_workload(std::FILE* text, Json* document, const Bench& bench, const char* grid, int k) {
  Json& parameters = document->set("parameters", Json::object());
  parameters.set("grid", grid);
  parameters.set("head_dim", kHeadDim);
  parameters.set("form", "contiguous keys (prefix then new tokens), full float32 logits [S, S_kv], clean_logits");
  parameters.set("ranges", "causal: ks = 0, ke = P + i + 1");
  parameters.set("inputs", "random e4m3 queries and keys, signed weights, positive key scales");
  parameters.set("logits_budget_bytes", static_cast<std::int64_t>(kLogitsBudget));
  parameters.set("k", k);
  Json& timing = document->set("timing", Json::object());
  timing.set("method", bench.gpu() ? "CUDA events around the enqueued work of each run, the stream held until the "
                                     "run is enqueued (host time excluded; host_us reports it), median"
                                   : "std::chrono wall clock, median");
  timing.set("warmup", bench.gpu() ? bench.warmup : 0);
  timing.set("iters", bench.iters);
  timing.set("slow_points", format("a point whose call takes over %g s / iters gets max(%d, %g s / its time) runs "
                                   "and one warm-up (each point's contiguous.runs)",
                                   kPointSeconds, kMinRuns, kPointSeconds));
  if (bench.gpu()) timing.set("rotation", "queries and keys copied until they span 4x the L2 cache (2..16 sets)");
  const std::string fewer =
      bench.iters > kMinRuns
          ? format("; a point whose call takes over %.0f s / %d gets fewer runs, at least %d (runs)", kPointSeconds,
                   bench.iters, kMinRuns)
          : std::string();
  std::fprintf(text, "\nprefill grid: S new tokens over a prefix of P (S_kv = P + S contiguous keys, row i scores "
                     "keys [0, P + i + 1)), D=%d; mqa_logits writes full float32 logits [S, S_kv] with "
                     "clean_logits, as DeepGEMM's fp8_mqa_logits test runs it; random e4m3 inputs; "
                     "median of %d run%s%s%s\n",
               kHeadDim, bench.iters, bench.iters == 1 ? "" : "s",
               bench.gpu() ? " (CUDA events around the enqueued work), queries and keys rotated over >= 2 copies"
                           : " (wall clock)",
               fewer.c_str());
  std::fprintf(text, "TFLOP/s counts 2*H*D per valid (row, key) pair; us and TFLOP/s compare with DeepGEMM's test; "
                     "calls = mqa_logits calls per run (NxR: logits over %zu GiB split into N chunks of R rows, "
                     "the time is their sum)\n",
               kLogitsBudget >> 30);
}

}  // namespace

int prefill_grid(const Bench& bench, const Options& options, std::FILE* text, Json* document) {
  describe_workload(text, document, bench, "prefill", options.k);
  const std::vector<PrefillPoint> points = grid_points();
  std::vector<PrefillResult> results;
  RaggedTopk topk;
  topk.point = kTopkPoint;
  topk.k = options.k;
  Json& grid = document->set("grid", Json::array());
  bool all_ok = true;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const PrefillPoint& point = points[i];
    std::fprintf(text, "  [%zu/%zu] H=%d S=%s P=%s ...\n", i + 1, points.size(), point.heads,
                 context_label(point.seq).c_str(), context_label(point.prefix).c_str());
    std::fflush(text);
    const bool topk_here = point.heads == kTopkPoint.heads && point.seq == kTopkPoint.seq &&
                           point.prefix == kTopkPoint.prefix;
    results.push_back(measure_point(bench, point, options.seed + i, topk_here ? &topk : nullptr));
    grid.push(point_json(results.back()));
    all_ok = all_ok && results.back().problems.empty();
  }

  if (!topk.measured && topk.problems.empty()) topk.problems = "not measured (its point failed)";
  all_ok = all_ok && topk.problems.empty();
  Json& line = document->set("ragged_topk", Json::object());
  line.set("heads", topk.point.heads);
  line.set("seq", topk.point.seq);
  line.set("prefix", topk.point.prefix);
  line.set("k", topk.k);
  line.set("candidates", "row i: columns [ks[i], ke[i]) of the full logits (row_starts = ks, lengths = ke - ks)");
  line.set("valid_bytes", topk.valid_bytes);
  line.set("us", topk.seconds * 1e6);
  line.set("host_us", topk.host_s * 1e6);
  line.set("floor_us", topk.floor_s * 1e6);
  line.set("time_over_floor", topk.seconds / topk.floor_s);
  line.set("rotating_input_sets", topk.rotation);
  line.set("ok", topk.problems.empty());
  if (!topk.problems.empty()) line.set("problems", topk.problems);

  if (bench.fp8_peak_rate > 0) {
    std::fprintf(text, "floor = max(FLOPs / fp8 tensor-core rate, bytes / copy bandwidth), bytes = the inputs read "
                       "once + 4*S*S_kv logits written once; floor/t = fraction of the floor reached; bound = the "
                       "larger term\n");
  } else {
    std::fprintf(text, "no fp8 rate floor: the tensor-core rate was not measured on this GPU (see above)\n");
  }
  print_table(text, results, bench.fp8_peak_rate > 0);
  std::fprintf(text, "\nragged top-k of the H=%d S=%s P=%s logits (k=%d, row i's candidates [ks[i], ke[i]) of its "
                     "full row; floor = one read of the valid logits at copy bandwidth):\n",
               topk.point.heads, context_label(topk.point.seq).c_str(), context_label(topk.point.prefix).c_str(),
               topk.k);
  std::fprintf(text, "  %s us, floor %s us, time/floor %s (the target: at most 3), host %s us | %s\n", microseconds(topk.seconds).c_str(),
               microseconds(topk.floor_s).c_str(), ratio(topk.seconds, topk.floor_s).c_str(),
               microseconds(topk.host_s).c_str(), topk.problems.empty() ? "ok" : topk.problems.c_str());
  return all_ok ? 0 : 1;
}

int prefill_cpu_point(const Bench& bench, const Options& options, std::FILE* text, Json* document) {
  describe_workload(text, document, bench, "prefill", options.k);
  const PrefillResult result = measure_point(bench, kCpuPoint, options.seed, nullptr);
  document->set("cpu_point", point_json(result));
  print_table(text, {result}, false);
  return result.problems.empty() ? 0 : 1;
}

}  // namespace dsa_cli
