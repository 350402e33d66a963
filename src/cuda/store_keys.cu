// store_index_keys on CUDA: one warp quantizes one token into its cache slot
// (fp8, or fp4 for the 128-value keys that format serves).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.hpp"
#include "common/cache_format.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/quantization.cuh"

namespace dsa::detail::cuda {

namespace {

constexpr int kStoreThreads = 256;
constexpr int kTokensPerBlock = kStoreThreads / kWarpSize;

__global__ void __launch_bounds__(kStoreThreads) store_keys_kernel(StoreKeysProblem p,
                                                                   DeviceErrorRecord* record) {
  enter_dependent_grid();
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t num_slots = cache_slots(p.cache);
  for (std::int64_t token = blockIdx.x * std::int64_t{kTokensPerBlock} + threadIdx.x / kWarpSize;
       token < p.num_tokens; token += std::int64_t{gridDim.x} * kTokensPerBlock) {
    const std::int64_t slot =
        p.slots_dtype == DType::int32
            ? std::int64_t{static_cast<const std::int32_t*>(p.slots)[token * p.slots_stride]}
            : static_cast<const std::int64_t*>(p.slots)[token * p.slots_stride];
    if (slot < 0) continue;  // padding token
    if (slot >= num_slots) {
      if (lane == 0) report_device_error(record, kSlotOutOfRange, token, slot, num_slots);
      continue;
    }
    const std::size_t element = p.keys_dtype == DType::bfloat16 ? 2 : 4;
    const void* key = static_cast<const unsigned char*>(p.keys) + token * p.keys_stride * element;
    const CacheRow at = slot_row(p.cache, slot);
    std::uint8_t* page = cache_page(p.cache, at.page);
    if (p.cache.format == KeyFormat::fp4_e2m1) {
      const std::uint32_t scales = warp_quantize_fp4_vector(key, p.keys_dtype, page_keys(p.cache, page, at.row), lane);
      if (lane == 0) page_scale_words(p.cache, page)[at.row] = scales;
      continue;
    }
    const float scale = warp_vector_scale(key, p.keys_dtype, p.head_dim, p.power_of_two_scales, lane);
    warp_quantize_vector(key, p.keys_dtype, p.head_dim, scale, page_keys(p.cache, page, at.row), lane);
    if (lane == 0) page_scales(p.cache, page)[at.row] = scale;
  }
}

}  // namespace

Status store_index_keys(const StoreKeysProblem& p, const ExecContext& ctx) {
  if (p.num_tokens == 0) return Status::success();
  return launch_kernel("store_keys_kernel", store_keys_kernel, {grid_for(p.num_tokens, kTokensPerBlock), kStoreThreads},
                       ctx, p, error_record(ctx));
}

}  // namespace dsa::detail::cuda
