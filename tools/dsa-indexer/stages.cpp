#include "stages.hpp"

#include <algorithm>
#include <string>
#include <thread>

#include "dsa/dsa.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace dsa_cli {

dsa::Status in_stage(const char* stage, dsa::Status status) {
  if (status.ok()) return status;
  return {status.code(), std::string(stage) + ": " + status.message()};
}

dsa::Status run_stages_checked(const std::vector<Stage>& stages, bool gpu, const dsa::ExecContext& ctx) {
  dsa::ExecContext checked = ctx;
  checked.check_device_errors = gpu;
  for (const Stage& stage : stages) DSA_RETURN_IF_ERROR(in_stage(stage.name, stage.run(checked)));
  return {};
}

dsa::Status time_stages(const std::vector<Stage>& stages, bool gpu, const dsa::ExecContext& ctx, int warmup,
                        int iters, std::FILE* text, Json* document) {
  Json& timing_json = document->set("timing", Json::object());
  timing_json.set("method", gpu ? "CUDA events around the enqueued work (host time excluded, reported apart), median"
                                 : "std::chrono wall clock, median");
  timing_json.set("warmup", warmup);
  timing_json.set("iters", iters);
  Json& stage_list = timing_json.set("stages", Json::array());
  std::fprintf(text, "stage times (median of %d run%s, %s):\n", iters, iters == 1 ? "" : "s",
               gpu ? "CUDA events" : "wall clock");
  for (const Stage& stage : stages) {
    RunTimes times;
    DSA_RETURN_IF_ERROR(in_stage(stage.name, time_runs(gpu, ctx.stream, warmup, iters,
                                                        [&](int) { return stage.run(ctx); }, &times)));
    const std::vector<double>& seconds = times.elapsed;
    const double time = median(seconds);
    Json& entry = stage_list.push(Json::object());
    entry.set("name", stage.name);
    entry.set("median_us", time * 1e6);
    entry.set("min_us", *std::min_element(seconds.begin(), seconds.end()) * 1e6);
    std::string note;
    if (stage.bytes > 0) {
      note = "  effective " + format_bandwidth(stage.bytes / time);
      entry.set("bytes", stage.bytes);
    }
    if (stage.flops > 0) {
      note += ", " + format_flop_rate(stage.flops / time);
      entry.set("flops", stage.flops);
      entry.set("tflops", stage.flops / time * 1e-12);
    }
    if (gpu) {
      const double host = median(times.host);
      entry.set("host_median_us", host * 1e6);
      note += "  (host " + format_time(host) + " per call)";
    }
    std::fprintf(text, "  %-25s %12s%s\n", stage.name, format_time(time).c_str(), note.c_str());
  }
  if (gpu) DSA_RETURN_IF_ERROR(in_stage("timed runs", dsa::read_device_error(ctx)));
  return {};
}

dsa::Status run_in_slices(std::int64_t count,
                          const std::function<dsa::Status(std::int64_t first, std::int64_t end)>& slice) {
  const std::int64_t slices =
      std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1, std::max<std::int64_t>(count, 1));
  std::vector<dsa::Status> results(static_cast<std::size_t>(slices));
  std::vector<std::thread> threads;
  for (std::int64_t s = 0; s < slices; ++s) {
    threads.emplace_back([&, s] {
      const std::int64_t first = count * s / slices;
      const std::int64_t end = count * (s + 1) / slices;
      if (end > first) results[static_cast<std::size_t>(s)] = slice(first, end);
    });
  }
  for (auto& thread : threads) thread.join();
  for (const dsa::Status& status : results) DSA_RETURN_IF_ERROR(status);
  return {};
}

std::string report_backend(const Options& options, const Target& target, Json* document) {
  const std::string device_text = describe_device(target);
  Json& backend_json = document->set("backend", Json::object());
  backend_json.set("requested", backend_choice_name(options.backend));
  backend_json.set("library_backend", dsa::backend_name(target.backend));
  backend_json.set("device", device_text);
  return device_text;
}

void add_topk_checks(CheckList& checks, const TopkCheck& result, std::int64_t differing_from_own) {
  Json& entry = checks.add(
      "topk vs reference", result.passed(),
      format("%lld/%lld rows identical, %lld near-tie swaps, %lld unexplained, %lld malformed rows, "
             "worst order violation %.1e of row rms (allowed %.0e)",
             static_cast<long long>(result.identical_rows), static_cast<long long>(result.rows),
             static_cast<long long>(result.near_tie_swaps), static_cast<long long>(result.unexplained_swaps),
             static_cast<long long>(result.malformed_rows), result.worst_order_violation, result.allowed_violation));
  entry.set("identical_rows", result.identical_rows);
  entry.set("near_tie_swaps", result.near_tie_swaps);
  entry.set("unexplained_swaps", result.unexplained_swaps);
  entry.set("malformed_rows", result.malformed_rows);
  entry.set("worst_order_violation", result.worst_order_violation);
  checks.add("topk of its own logits", differing_from_own == 0,
             differing_from_own == 0
                 ? "exact selection (tie rule included) in every row"
                 : format("%lld rows differ from the exact selection", static_cast<long long>(differing_from_own)));
}

void report_verification(const CheckList& checks, std::FILE* text, Json* document, bool* passed) {
  *passed = checks.all_passed();
  Json& verification = document->set("verification", Json::object());
  verification.set("reference", "cpu_reference, float64 accumulation");
  verification.set("passed", *passed);
  verification.set("checks", checks.json());
  std::fprintf(text, "verification against cpu-reference (float64):\n");
  checks.print(text);
  std::fprintf(text, "result: %s\n", *passed ? "PASS" : "FAIL");
}

int verified_command(const Options& options, const char* command,
                     const std::function<dsa::Status(std::FILE* text, Json* document, bool* passed)>& execute) {
  std::FILE* text = options.json && options.json_file.empty() ? stderr : stdout;
  Json document = Json::object();
  document.set("tool", "dsa-indexer");
  document.set("command", command);
  bool passed = false;
  const dsa::Status status = execute(text, &document, &passed);
  if (!status.ok()) {
    std::fprintf(stderr, "dsa-indexer: error: %s\n", status.to_string().c_str());
    document.set("error", status.to_string());
  }
  if (options.json) {
    std::string error;
    if (!write_json(document, options.json_file, &error)) {
      std::fprintf(stderr, "dsa-indexer: %s\n", error.c_str());
      return 1;
    }
  }
  return status.ok() && passed ? 0 : 1;
}

}  // namespace dsa_cli
