// The CPU-only build: no device measurements.
#include "device_timing.hpp"

namespace dsa_cli {
namespace {

dsa::Status no_cuda() {
  return {dsa::ErrorCode::unsupported, "dsa-indexer was built without CUDA"};
}

}  // namespace

dsa::Status time_device_runs(void*, int, int, const std::function<dsa::Status(int)>&, RunTimes*) {
  return no_cuda();
}
dsa::Status CapturedGraph::capture(void*, const std::function<dsa::Status()>&, CapturedGraph*) {
  return no_cuda();
}
dsa::Status CapturedGraph::replay(void*) const { return no_cuda(); }
dsa::Status measure_copy_bandwidth(void*, std::size_t, int, double*) { return no_cuda(); }
dsa::Status measure_fp8_matmul_rate(void*, int, int, MatmulRate*) { return no_cuda(); }
dsa::Status measure_fp8_tensor_core_rate(void*, int, TensorCoreRate*) { return no_cuda(); }
dsa::Status device_memory(std::size_t*, std::size_t*) { return no_cuda(); }
dsa::Status copy_device_to_device(void*, const void*, std::size_t, void*) { return no_cuda(); }
dsa::Status synchronize_stream(void*) { return no_cuda(); }
dsa::Status gather_request_keys_on_device(const dsa::KeyCacheLayout&, const std::int32_t*, std::int64_t, const void*,
                                          void*, void*, void*) {
  return no_cuda();
}
dsa::Status fill_random_bf16(void*, std::size_t, std::size_t, std::uint64_t, void*) {
  return no_cuda();
}
dsa::Status fill_logits(float*, std::size_t, LogitsDistribution, std::uint64_t, void*) {
  return no_cuda();
}

}  // namespace dsa_cli
