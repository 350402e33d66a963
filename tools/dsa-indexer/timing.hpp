// Repeated timing of an operation: std::chrono on the host, CUDA events on a
// device (see device_timing.hpp).
#pragma once

#include <functional>
#include <vector>

#include "dsa/status.hpp"

namespace dsa_cli {

double median(std::vector<double> values);

// Durations of the timed runs of an operation, in seconds.
struct RunTimes {
  // The operation's own time: on a device, between CUDA events that enclose
  // the work it enqueued (the host's time to enqueue it excluded, see
  // time_device_runs); on the host, wall clock.
  std::vector<double> elapsed;
  // Host wall clock of each call: on a device, the time to validate and
  // enqueue the work, which an engine pays per call unless it replays a
  // CUDA graph.
  std::vector<double> host;
};

// Runs `launch(run)` warmup + iters times and returns the last iters
// durations: wall clock on the host (on_device false), CUDA events on
// `stream` otherwise.
dsa::Status time_runs(bool on_device, void* stream, int warmup, int iters,
                      const std::function<dsa::Status(int run)>& launch, RunTimes* times);

}  // namespace dsa_cli
