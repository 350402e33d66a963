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

// Packed fp4 codes of the 128-value vector src into dst[64], the same in
// every respect as the CPU's quantize_fp4_vector; returns the ue8m0 block
// scales as one word (block b in byte b), the same in every lane. Lane l
// holds elements [4 l, 4 l + 4), so the eight lanes of a 32-element block
// reduce its amax among themselves (max is exact and order-independent).
__device__ __forceinline__ std::uint32_t warp_quantize_fp4_vector(const void* src, DType dtype, std::uint8_t* dst,
                                                                  int lane) {
  static_assert(kWarpSize * 4 == 128 && kFp4BlockElements == 32);
  float x[4];
  float amax = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    x[e] = load_float_or_bf16(src, dtype, 4 * lane + e);
    amax = fmaxf(amax, fabsf(x[e]));  // fmaxf drops NaN, as the CPU's compare does
  }
#pragma unroll
  for (int offset = 1; offset < 8; offset *= 2) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
  const std::uint8_t exponent = fp4_block_scale(amax);
  const float scale = ue8m0_to_float(exponent);
  const auto low = static_cast<std::uint32_t>(float_to_e2m1(x[0] / scale) | (float_to_e2m1(x[1] / scale) << 4));
  const auto high = static_cast<std::uint32_t>(float_to_e2m1(x[2] / scale) | (float_to_e2m1(x[3] / scale) << 4));
  dst[2 * lane] = static_cast<std::uint8_t>(low);  // byte stores: q_codes rows need no alignment
  dst[2 * lane + 1] = static_cast<std::uint8_t>(high);
  std::uint32_t word = 0;
#pragma unroll
  for (int block = 0; block < 4; ++block) {
    word |= static_cast<std::uint32_t>(__shfl_sync(0xFFFFFFFFu, exponent, block * 8)) << (8 * block);
  }
  return word;
}

}  // namespace dsa::detail::cuda
