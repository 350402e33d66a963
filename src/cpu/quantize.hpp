// Per-vector fp8 quantization shared by key storing and query quantization.
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

// Address of element `index` of a bfloat16 or float32 array.
inline const void* element_address(const void* base, DType dtype, std::int64_t index) {
  return static_cast<const unsigned char*>(base) + index * static_cast<std::int64_t>(dtype_size(dtype));
}

}  // namespace dsa::detail::cpu
