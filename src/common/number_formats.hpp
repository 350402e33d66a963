// Bit-exact conversions between float32 and the narrow formats the library
// stores (fp8 e4m3fn, bfloat16), shared by the CPU and CUDA backends so that
// both quantize identically. Rounding is to nearest, ties to even.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/hostdevice.hpp"

namespace dsa::detail {

DSA_HD std::uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

DSA_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

// e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
// 0x7F / 0xFF are NaN; the largest finite magnitude is 448 (0x7E).
DSA_HD float e4m3_to_float(std::uint8_t v) {
  const float sign = (v & 0x80) ? -1.0f : 1.0f;
  const int exponent = (v >> 3) & 0xF;
  const int mantissa = v & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return bits_float(0x7FC00000u);
  if (exponent == 0) return sign * static_cast<float>(mantissa) * 0x1p-9f;
  return sign * (1.0f + static_cast<float>(mantissa) * 0.125f) * ldexpf(1.0f, exponent - 7);
}

// All ones where `condition` holds, else 0: a select by bit masks, which
// loops vectorize where the compiler would turn ?: back into a branch.
DSA_HD std::uint32_t mask_if(bool condition) { return 0u - static_cast<std::uint32_t>(condition); }

// Saturating conversion: magnitudes >= 448 become 448, NaN stays NaN.
// Every case's code is computed and the right one kept with bit masks, not
// branches or selects, so that loops of it vectorize. A normal code
// (|x| >= 2^-6) is the float's exponent rebiased from 127 to 7, then its top
// 3 mantissa bits, rounded to nearest even on the whole pattern so that a
// carry moves into the exponent, as it should. A subnormal code counts
// steps of 2^-9: adding 2^23 to |x| * 512 (exact) rounds it to an integer,
// which the sum's low mantissa bits hold; rounding up to 8 gives the
// smallest normal, whose code is exactly 8.
DSA_HD std::uint8_t float_to_e4m3(float x) {
  const std::uint32_t bits = float_bits(x);
  const std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  const std::uint32_t normal = ((magnitude + 0x7FFFFu + ((magnitude >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  const std::uint32_t subnormal = float_bits(bits_float(magnitude) * 512.0f + 0x1p23f) - 0x4B000000u;
  const std::uint32_t below_normal = mask_if(magnitude < 0x3C800000u);  // < 2^-6
  const std::uint32_t saturated = mask_if(magnitude >= 0x43E00000u);   // >= 448, inf, NaN
  const std::uint32_t nan = mask_if(magnitude > 0x7F800000u);
  std::uint32_t code = (subnormal & below_normal) | (normal & ~below_normal);
  code = (code & ~saturated) | (0x7Eu & saturated) | (0x7Fu & nan);
  return static_cast<std::uint8_t>(((bits >> 24) & 0x80u) | code);
}

DSA_HD float bf16_to_float(std::uint16_t v) { return bits_float(static_cast<std::uint32_t>(v) << 16); }

DSA_HD std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = float_bits(x);
  if (x != x) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

// The per-token (keys) or per-(row, head) (queries) quantization scale:
// max(amax, 1e-4) / 448, optionally rounded up to a power of two.
DSA_HD float quantization_scale(float amax, bool power_of_two) {
  const float clamped = amax > 1e-4f ? amax : 1e-4f;
  float scale = clamped / 448.0f;
  if (power_of_two) {
    int e;
    const float fraction = frexpf(scale, &e);  // scale = fraction * 2^e
    scale = fraction == 0.5f ? scale : ldexpf(1.0f, e);
  }
  return scale;
}

}  // namespace dsa::detail
