// Bit-exact conversions between float32 and the narrow formats the library
// stores (fp8 e4m3fn, bfloat16, fp4 e2m1 with ue8m0 block scales), shared by
// the CPU and CUDA backends so that both quantize identically. Rounding is to
// nearest, ties to even, except for e2m1 (see float_to_e2m1).
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

// fp4 e2m1: bit 3 the sign, bits 2..1 the exponent (bias 1), bit 0 the
// mantissa; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; no infinities or NaN.
DSA_HD float e2m1_to_float(std::uint8_t code) {
  const int exponent = (code >> 1) & 0x3;
  const float mantissa = static_cast<float>(code & 0x1) * 0.5f;
  const float magnitude = exponent == 0 ? mantissa : (1.0f + mantissa) * static_cast<float>(1 << (exponent - 1));
  return (code & 0x8) ? -magnitude : magnitude;
}

// The e2m1 code nearest x, saturated at +-6. A value halfway between two
// codes takes the smaller magnitude, and a value that rounds to zero takes
// code 0 whatever its sign (never the negative zero 0x8); NaN gives 0. The
// code of a magnitude is the number of midpoints below it; the sign is
// selected with masks, without branches, so that loops of it vectorize.
DSA_HD std::uint8_t float_to_e2m1(float x) {
  const float magnitude = fabsf(x);
  const std::uint32_t code = static_cast<std::uint32_t>(magnitude > 0.25f) + (magnitude > 0.75f) +
                             (magnitude > 1.25f) + (magnitude > 1.75f) + (magnitude > 2.5f) +
                             (magnitude > 3.5f) + (magnitude > 5.0f);
  const std::uint32_t negative = mask_if(x < 0.0f) & mask_if(code != 0);
  return static_cast<std::uint8_t>(code | (0x8u & negative));
}

// ue8m0: an unsigned byte e standing for 2^(e - 127) (a float's exponent
// field alone; 0 is 2^-127, a subnormal float, and 255 is infinity).
DSA_HD float ue8m0_to_float(std::uint8_t e) {
  return e == 0 ? bits_float(0x00400000u) : bits_float(static_cast<std::uint32_t>(e) << 23);
}

// Elements sharing one ue8m0 scale in the fp4 formats (keys and queries).
inline constexpr int kFp4BlockElements = 32;
// The largest e2m1 magnitude.
inline constexpr float kE2m1Max = 6.0f;

// The ue8m0 scale of an fp4 block whose largest magnitude is `amax`:
// max(amax, 1e-4) / 6 rounded up to a power of two, as its exponent field
// (the quotient of two floats is above a power of two exactly when the real
// quotient is, so rounding the float quotient up is rounding the real one).
DSA_HD std::uint8_t fp4_block_scale(float amax) {
  const float clamped = amax > 1e-4f ? amax : 1e-4f;
  const std::uint32_t bits = float_bits(clamped / kE2m1Max);
  const std::uint32_t exponent = (bits >> 23) & 0xFFu;
  return static_cast<std::uint8_t>(exponent + ((bits & 0x7FFFFFu) != 0 && exponent < 0xFFu));
}

// A packed fp4 vector (cache keys and fp4 queries alike): element 2i in the
// low nibble of byte i, element 2i + 1 in its high nibble; block b's ue8m0
// scale in byte b of a 32-bit word (block 0 in the lowest byte). Element d
// is e2m1(code) * 2^(e_b - 127), exact in float32 (two significant bits).
DSA_HD std::uint8_t fp4_code(const std::uint8_t* codes, int d) {
  return static_cast<std::uint8_t>((codes[d / 2] >> (4 * (d % 2))) & 0xF);
}
DSA_HD float fp4_block_scale_value(std::uint32_t scale_word, int block) {
  return ue8m0_to_float(static_cast<std::uint8_t>(scale_word >> (8 * block)));
}
// The bf16 bits of every e2m1 code's value times 2^(exponent - 127), table[code]:
// exact, since a value has two significant bits. Where every product is a
// normal bf16 (exponents 2..252) the scale-1 bits with the exponent field
// moved; elsewhere the float product, truncated (exact as well).
inline void e2m1_bf16_table(std::uint8_t exponent, std::uint16_t (&table)[16]) {
  // Scale 1: 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the same negated (code 8 is -0).
  constexpr std::uint16_t kScaleOne[16] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0,
                                           0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};
  if (exponent >= 2 && exponent <= 252) {
    const auto shift = static_cast<std::uint16_t>((exponent - 127) * 128);  // modulo 2^16
    for (int code = 0; code < 16; ++code) {
      table[code] = static_cast<std::uint16_t>(kScaleOne[code] + ((code & 0x7) != 0 ? shift : 0));
    }
    return;
  }
  const float scale = ue8m0_to_float(exponent);
  for (int code = 0; code < 16; ++code) {
    table[code] = static_cast<std::uint16_t>(float_bits(e2m1_to_float(static_cast<std::uint8_t>(code)) * scale) >> 16);
  }
}
DSA_HD float fp4_element(const std::uint8_t* codes, std::uint32_t scale_word, int d) {
  return e2m1_to_float(fp4_code(codes, d)) * fp4_block_scale_value(scale_word, d / kFp4BlockElements);
}

// ---- fp4 codes as fp8 tensor-core operands (the Hopper fp4 kernels) ----------
//
// The fp8 products take e5m2 operands. An e2m1 magnitude has one mantissa bit, so
// code * 2^shift is exact in e5m2 for every shift in [kE5m2ExactShiftMin, 0]:
// a block's codes scaled by 2^(its exponent - the token's largest) lose nothing
// when the exponents of one token (or query head) span at most 15.
inline constexpr int kE5m2ExactShiftMin = -15;

// The block exponents of an fp4 row (a key token or a query head) whose
// blocks in `used` (bit b: block b) hold a nonzero code: blocks of zero codes
// add nothing at any scale and take no part.
struct Fp4RowExponents {
  int top = 0;       // the largest used exponent (0: none used)
  int bottom = 255;  // the smallest
};
DSA_HD Fp4RowExponents fp4_row_exponents(std::uint32_t scale_word, unsigned used) {
  Fp4RowExponents e;
  for (int b = 0; b < 4; ++b) {
    if ((used >> b & 1u) == 0) continue;
    const int exponent = static_cast<int>((scale_word >> (8 * b)) & 0xFFu);
    e.top = exponent > e.top ? exponent : e.top;
    e.bottom = exponent < e.bottom ? exponent : e.bottom;
  }
  return e;
}
// Whether e5m2 operands hold the row exactly as code * 2^(exponent - top),
// with 2^(top - 127) a normal float scale: the used exponents span at most
// -kE5m2ExactShiftMin and none is 0 or 255. A row without used blocks is
// zero, held at any scale.
DSA_HD bool e5m2_holds_fp4_row(const Fp4RowExponents& e, unsigned used) {
  return used == 0 || (e.bottom >= 1 && e.top <= 254 && e.top - e.bottom <= -kE5m2ExactShiftMin);
}

// The eight e5m2 bytes of the e2m1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 times
// 2^shift (shift in [kE5m2ExactShiftMin, 0]), as a byte-permutation table:
// magnitude m's byte is byte m of the pair (low word bytes 0-3, high word 4-7).
struct E5m2Table {
  std::uint32_t low, high;
};
DSA_HD E5m2Table e5m2_table(int shift) {
  // Normal results: each nonzero byte's exponent field (bits 2-6) drops by
  // -shift; below 2^-14 the results are e5m2 subnormals (steps of 2^-16).
  if (shift == -14) return {0x06040200u, 0x0E0C0A08u};
  if (shift == -15) return {0x03020100u, 0x0A080604u};
  const auto k = static_cast<std::uint32_t>(-shift);
  return {0x3E3C3800u - k * 0x04040400u, 0x46444240u - k * 0x04040404u};
}

// The bytes of table `t` selected by the low 3 bits of each of the four low
// nibbles of `selectors` (the device's byte permutation).
DSA_HD std::uint32_t select_bytes(const E5m2Table& t, std::uint32_t selectors) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(t.low, t.high, selectors & 0x7777u);
#else
  const std::uint64_t bytes = (static_cast<std::uint64_t>(t.high) << 32) | t.low;
  std::uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const unsigned index = (selectors >> (4 * i)) & 0x7u;
    out |= static_cast<std::uint32_t>((bytes >> (8 * index)) & 0xFFu) << (8 * i);
  }
  return out;
#endif
}

// Eight packed e2m1 codes (element i in nibble i) as eight e5m2 bytes (element
// i in byte i of out[i / 4]) of code * 2^shift, `t` = e5m2_table(shift). The
// sign of each code is kept, so a negative zero code gives e5m2 negative zero
// (no product changes).
DSA_HD void e2m1x8_to_e5m2(std::uint32_t codes, const E5m2Table& t, std::uint32_t (&out)[2]) {
  // Sign bit 3 of nibble i to bit 7 of byte i: a 0 / 1 nibble picks byte 0
  // (0x00) or byte 1 (0x80) of a two-byte table.
  const std::uint32_t signs = (codes >> 3) & 0x11111111u;
  const E5m2Table sign_table{0x8000u, 0u};
  out[0] = select_bytes(t, codes) | select_bytes(sign_table, signs);
  out[1] = select_bytes(t, codes >> 16) | select_bytes(sign_table, signs >> 16);
}

}  // namespace dsa::detail
