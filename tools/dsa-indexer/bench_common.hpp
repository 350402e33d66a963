// What the bench's grids share: the measurement environment (stream, timing
// repetitions, measured rates), the rotation of inputs past the L2 cache and
// the table formatting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "buffer.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "run.hpp"

namespace dsa_cli {

inline constexpr double kNotMeasured = std::numeric_limits<double>::quiet_NaN();

// A device measurement environment, or the host's when target is a CPU.
struct Bench {
  Target target;
  dsa::ExecContext ctx;  // backend, stream, workspace set per point
  int iters = 50;
  int warmup = 3;
  std::size_t l2_bytes = 0;
  std::size_t rotation_budget = 0;  // bytes the rotated copies may take
  double copy_bandwidth = 0;        // bytes / s, read + written
  double fp8_rate = 0;              // FLOP / s of a cuBLASLt fp8 matrix product
  double fp8_peak_rate = 0;         // FLOP / s of back-to-back wgmma; 0: not measured

  bool gpu() const { return target.on_gpu(); }

  // Medians of the operation's time and of the host's time per call.
  dsa::Status time(const std::function<dsa::Status(int run)>& launch, double* seconds,
                   double* host_seconds = nullptr) const;
};

// The original buffer plus device copies to cycle through, so that repeated
// runs do not find their inputs in the L2 cache.
class Rotation {
 public:
  dsa::Status create(const Buffer& original, const Bench& bench);
  const Buffer& at(int run) const { return *sets_[static_cast<std::size_t>(run) % sets_.size()]; }
  int size() const { return static_cast<int>(sets_.size()); }

 private:
  std::vector<Buffer> copies_;
  std::vector<const Buffer*> sets_;
};

// Table cells: "12.3" microseconds, a ratio "0.87", "n/a" when unmeasured.
std::string microseconds(double seconds);
std::string ratio(double numerator, double denominator);
// "32K" for multiples of 1024 tokens, else the number.
std::string context_label(std::int64_t tokens);

}  // namespace dsa_cli
