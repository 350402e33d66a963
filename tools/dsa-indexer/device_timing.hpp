// GPU measurements the tool needs beyond the library: event timing, the
// device copy bandwidth, the fp8 matrix rate, device-side fills and copies,
// and the gather of a request's keys out of a paged cache.
// Plain C++ so that only bench_cuda.cu sees CUDA headers; in a build without
// CUDA every function returns `unsupported`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dsa/cache.hpp"
#include "dsa/status.hpp"
#include "timing.hpp"

namespace dsa_cli {

// Enqueues `launch(run)` on `stream` (a cudaStream_t) warmup + iters times,
// each bracketed by CUDA events, and returns the last `iters` durations: the
// time between the events, and the host time of each `launch` call. Before
// each run the stream is held by a device-side wait that the host releases
// once the run is enqueued (or after a few milliseconds, should `launch`
// itself wait for the stream), so the events time the device work and not
// the host's time to enqueue it, as when a call is one of many in flight.
// `run` counts from 0 over all launches so callers can rotate inputs.
dsa::Status time_device_runs(void* stream, int warmup, int iters,
                             const std::function<dsa::Status(int run)>& launch, RunTimes* times);

// The work one call of `enqueue` issues on `stream`, captured once into a
// CUDA graph and replayed as engines replay a decode step. Moves only.
class CapturedGraph {
 public:
  static dsa::Status capture(void* stream, const std::function<dsa::Status()>& enqueue, CapturedGraph* out);
  // Enqueues one replay on `stream`.
  dsa::Status replay(void* stream) const;

 private:
  std::shared_ptr<void> exec_;  // the instantiated graph (cudaGraphExec_t)
};

// Median bandwidth of device-to-device cudaMemcpyAsync of `buffer_bytes`
// bytes, counting bytes read plus bytes written.
dsa::Status measure_copy_bandwidth(void* stream, std::size_t buffer_bytes, int iters,
                                   double* bytes_per_second);

struct MatmulRate {
  double flops_per_second = 0;
  int size = 0;             // M = N = K
  std::string output_type;  // "float32" or "bfloat16"
};
// Median rate of a cuBLASLt fp8 e4m3 x e4m3 size^3 matrix product with fp32
// accumulation (fp32 output where cuBLASLt offers it, else bf16).
dsa::Status measure_fp8_matmul_rate(void* stream, int size, int iters, MatmulRate* rate);

// The dense fp8 tensor-core rate of an sm_90a GPU: every warpgroup issues
// back-to-back wgmma m64nNk32 e4m3 x e4m3 -> float32 products whose operands
// stay in shared memory (no global memory traffic in the loop), several
// warpgroups per multiprocessor, as many CTAs as fit on the GPU; the median
// over `iters` launches, for N = 128 and 256, the faster N kept.
struct TensorCoreRate {
  double flops_per_second = 0;
  int n = 0;                  // the N of the faster product
  int ctas = 0;               // CTAs launched
  int warpgroups_per_sm = 0;  // resident at once
  std::vector<std::pair<int, double>> by_n;  // (N, FLOP/s) of each product measured
};
// `unsupported` (with the reason) on a GPU that is not sm_90, or when the
// tool was built without sm_90a code: there is then no fp8 rate floor.
dsa::Status measure_fp8_tensor_core_rate(void* stream, int iters, TensorCoreRate* rate);

// Free and total memory of the current device (cudaMemGetInfo).
dsa::Status device_memory(std::size_t* free_bytes, std::size_t* total_bytes);

// Asynchronous device-to-device copy on `stream`.
dsa::Status copy_device_to_device(void* dst, const void* src, std::size_t bytes, void* stream);
dsa::Status synchronize_stream(void* stream);

// gather_request_keys (workload.hpp) on `stream`, in device memory: one
// block per page of the request, 16-byte copies. The cache's pages are
// layout.min_page_bytes() apart; cache, codes and scales 16-byte aligned and
// layout.code_bytes() a multiple of 16 (invalid_argument otherwise). The
// block-table row must hold ceil(tokens / P) pages of the cache.
dsa::Status gather_request_keys_on_device(const dsa::KeyCacheLayout& layout, const std::int32_t* table_row,
                                          std::int64_t tokens, const void* cache, void* codes, void* scales,
                                          void* stream);

// Fills `count` bf16 values with roughly normal numbers from `seed`, each
// row of `row_length` values scaled by its own gain in [0.25, 4].
dsa::Status fill_random_bf16(void* dst, std::size_t count, std::size_t row_length,
                             std::uint64_t seed, void* stream);

// Value distributions for top-k measurements.
enum class LogitsDistribution {
  uniform,       // uniform in [-1, 1)
  concentrated,  // 1 + u * 2^-16: every value shares sign, exponent and top mantissa bits
  tied,          // 8 distinct values: thousands of ties at the threshold
  constant,      // every value equal
};
const char* distribution_name(LogitsDistribution distribution) noexcept;
dsa::Status fill_logits(float* dst, std::size_t count, LogitsDistribution distribution,
                        std::uint64_t seed, void* stream);

}  // namespace dsa_cli
