// Device helpers shared by the key-store and query-quantization kernels: one
// warp quantizes one vector of `head_dim` values exactly as the CPU does
// (common/number_formats.hpp).
#pragma once

#include <cstdint>

#include "common/number_formats.hpp"
#include "cuda/warp_scan.cuh"
#include "dsa/tensor.hpp"

namespace dsa::detail::cuda {

inline constexpr int kWarpSize = 32;

// Element `i` of a float32 or bfloat16 array.
__device__ __forceinline__ float load_float_or_bf16(const void* base, DType dtype, std::int64_t i) {
  return dtype == DType::bfloat16 ? bf16_to_float(static_cast<const std::uint16_t*>(base)[i])
                                  : static_cast<const float*>(base)[i];
}

// The quantization scale of the vector src[0, head_dim), the same in every lane.
__device__ __forceinline__ float warp_vector_scale(const void* src, DType dtype, int head_dim,
                                                   bool power_of_two, int lane) {
  float amax = 0.0f;
  for (int d = lane; d < head_dim; d += kWarpSize) amax = fmaxf(amax, fabsf(load_float_or_bf16(src, dtype, d)));
  // max is exact and order-independent, so the tree reduction matches the CPU's loop.
  return quantization_scale(warp_max(amax), power_of_two);
}

// dst[d] = e4m3(src[d] / scale) for d < head_dim.
__device__ __forceinline__ void warp_quantize_vector(const void* src, DType dtype, int head_dim,
                                                     float scale, std::uint8_t* dst, int lane) {
  for (int d = lane; d < head_dim; d += kWarpSize) {
    dst[d] = float_to_e4m3(load_float_or_bf16(src, dtype, d) / scale);
  }
}

}  // namespace dsa::detail::cuda
