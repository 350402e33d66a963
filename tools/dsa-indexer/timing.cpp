#include "timing.hpp"

#include <algorithm>
#include <chrono>

#include "device_timing.hpp"

namespace dsa_cli {

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

dsa::Status time_runs(bool on_device, void* stream, int warmup, int iters,
                      const std::function<dsa::Status(int run)>& launch, RunTimes* times) {
  if (on_device) return time_device_runs(stream, warmup, iters, launch, times);
  times->elapsed.clear();
  for (int run = 0; run < warmup + iters; ++run) {
    const auto start = std::chrono::steady_clock::now();
    DSA_RETURN_IF_ERROR(launch(run));
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (run >= warmup) times->elapsed.push_back(elapsed.count());
  }
  times->host = times->elapsed;
  return {};
}

}  // namespace dsa_cli
