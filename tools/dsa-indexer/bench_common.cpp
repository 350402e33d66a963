#include "bench_common.hpp"

#include <algorithm>
#include <cmath>

#include "device_timing.hpp"
#include "report.hpp"
#include "timing.hpp"

namespace dsa_cli {
namespace {

// Inputs are rotated until the working set is this many times the L2 cache.
constexpr std::size_t kL2Multiple = 4;
constexpr int kMaxRotation = 16;

}  // namespace

dsa::Status Bench::time(const std::function<dsa::Status(int run)>& launch, double* seconds,
                        double* host_seconds) const {
  RunTimes runs;
  DSA_RETURN_IF_ERROR(time_runs(gpu(), ctx.stream, gpu() ? warmup : 0, iters, launch, &runs));
  *seconds = median(runs.elapsed);
  if (host_seconds != nullptr) *host_seconds = median(runs.host);
  return {};
}

dsa::Status Rotation::create(const Buffer& original, const Bench& bench) {
  sets_ = {&original};
  copies_.clear();
  if (!bench.gpu() || original.bytes() == 0) return {};
  const std::size_t wanted = (kL2Multiple * bench.l2_bytes + original.bytes() - 1) / original.bytes();
  const std::size_t affordable = 1 + bench.rotation_budget / original.bytes();
  const std::size_t count = std::min<std::size_t>({std::max<std::size_t>(wanted, 2), affordable, kMaxRotation});
  copies_.resize(count - 1);
  for (Buffer& copy : copies_) {
    DSA_RETURN_IF_ERROR(Buffer::allocate(original.bytes(), original.device(), &copy));
    DSA_RETURN_IF_ERROR(copy_device_to_device(copy.data(), original.data(), original.bytes(), bench.ctx.stream));
    sets_.push_back(&copy);
  }
  return synchronize_stream(bench.ctx.stream);
}

std::string microseconds(double seconds) {
  return std::isnan(seconds) ? std::string("n/a") : format("%.1f", seconds * 1e6);
}

std::string ratio(double numerator, double denominator) {
  return std::isnan(numerator) || std::isnan(denominator) || denominator <= 0 ? std::string("n/a")
                                                                               : format("%.2f", numerator / denominator);
}

std::string context_label(std::int64_t tokens) {
  return tokens % 1024 == 0 ? format("%lldK", static_cast<long long>(tokens / 1024))
                            : format("%lld", static_cast<long long>(tokens));
}

}  // namespace dsa_cli
