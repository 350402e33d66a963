// Per-vector fp8 and fp4 quantization shared by key storing and query quantization.
#pragma once

#include <cstdint>

#include "common/number_formats.hpp"
#include "dsa/tensor.hpp"

namespace dsa::detail::cpu {

inline float load_element(const void* base, DType dtype, std::int64_t index) {
  return dtype == DType::bfloat16 ? bf16_to_float(static_cast<const std::uint16_t*>(base)[index])
                                  : static_cast<const float*>(base)[index];
}

// Quantizes `count` values of a bfloat16 or float32 vector to e4m3 with
// scale = max(amax, 1e-4) / 448 and returns that scale (NaN values are left
// out of amax).
float quantize_vector(const void* source, DType dtype, int count, bool power_of_two_scale, std::uint8_t* out);

// Quantizes `count` values (a multiple of 32, at most 128) of a bfloat16 or
// float32 vector to packed e2m1 codes, out[count / 2], block by block
// (fp4_block_scale, float_to_e2m1; NaN values are left out of amax) and
// returns the packed ue8m0 block scales (block b in byte b).
std::uint32_t quantize_fp4_vector(const void* source, DType dtype, int count, std::uint8_t* out);

// Address of element `index` of a bfloat16 or float32 array.
inline const void* element_address(const void* base, DType dtype, std::int64_t index) {
  return static_cast<const unsigned char*>(base) + index * static_cast<std::int64_t>(dtype_size(dtype));
}

}  // namespace dsa::detail::cpu
