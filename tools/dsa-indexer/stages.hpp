// What the verified commands (the default run, prefill) share: their stages,
// each one library call run once with device errors checked and then timed,
// and the frame that reports a command's result and JSON.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "json.hpp"
#include "options.hpp"
#include "report.hpp"
#include "run.hpp"
#include "verify.hpp"

namespace dsa_cli {

// Warm-up runs before the timed ones on a GPU.
inline constexpr int kGpuWarmup = 3;
// Logits error budget, relative to max(|reference|, row RMS): float32
// accumulation on the CPU. On a GPU the fp8 tensor cores accumulate with about
// 13 mantissa bits, giving errors up to ~1e-3 of sum_h |w| * |scale q.k|,
// which is several times the row RMS once the signed head weights cancel.
inline constexpr double kCpuTolerance = 1e-4;
inline constexpr double kGpuTolerance = 1e-2;

struct Stage {
  const char* name;
  std::function<dsa::Status(const dsa::ExecContext&)> run;
  double bytes = 0;  // what the call must move, for its effective bandwidth (0: not reported)
  double flops = 0;  // its arithmetic, for its FLOP rate (0: not reported)
};

// `status` with the stage's name in front of its message.
dsa::Status in_stage(const char* stage, dsa::Status status);

template <typename T>
dsa::Status download(const Buffer& buffer, std::vector<T>* out) {
  out->resize(buffer.bytes() / sizeof(T));
  return buffer.download(out->data(), out->size() * sizeof(T));
}

// Runs every stage once, in order, with device errors checked on a GPU.
dsa::Status run_stages_checked(const std::vector<Stage>& stages, bool gpu, const dsa::ExecContext& ctx);

// Times every stage (warmup + iters runs each, on the outputs of the
// previous ones), prints a line per stage and records them under
// document["timing"].
dsa::Status time_stages(const std::vector<Stage>& stages, bool gpu, const dsa::ExecContext& ctx, int warmup,
                        int iters, std::FILE* text, Json* document);

// Runs slice(first, end) over [0, count) split into one slice per hardware
// thread, at once, and returns the first error: the float64 references' rows
// are independent, so slicing them changes nothing but the wall time.
dsa::Status run_in_slices(std::int64_t count,
                          const std::function<dsa::Status(std::int64_t first, std::int64_t end)>& slice);

// Records the requested and the resolved backend and the device under
// document["backend"]; returns the device's description.
std::string report_backend(const Options& options, const Target& target, Json* document);

// The top-k checks of both commands: the selection against the reference's
// (near ties allowed), and against the exact selection of the backend's own
// logits (`differing_from_own` rows differ).
void add_topk_checks(CheckList& checks, const TopkCheck& against_reference, std::int64_t differing_from_own);

// Records the checks under document["verification"], prints them and the
// result, and sets *passed.
void report_verification(const CheckList& checks, std::FILE* text, Json* document, bool* passed);

// A verified command's frame: runs `execute` (which reports to `text` and
// `document` and sets `passed`), prints an error it returns, writes the JSON
// with --json, and returns the exit code (0 verified, 1 failed or errored).
int verified_command(const Options& options, const char* command,
                     const std::function<dsa::Status(std::FILE* text, Json* document, bool* passed)>& execute);

}  // namespace dsa_cli
