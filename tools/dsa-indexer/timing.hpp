// Repeated timing of an operation: std::chrono on the host, CUDA events on a
// device (see device_timing.hpp).
#pragma once

#include <functional>
#include <vector>

#include "dsa/status.hpp"

namespace dsa_cli {

double median(std::vector<double> values);

// Runs `launch(run)` warmup + iters times and returns the last iters
// durations in seconds: wall-clock on the host (stream == nullptr and
// on_device false), CUDA events on `stream` otherwise.
dsa::Status time_runs(bool on_device, void* stream, int warmup, int iters,
                      const std::function<dsa::Status(int run)>& launch,
                      std::vector<double>* seconds);

}  // namespace dsa_cli
