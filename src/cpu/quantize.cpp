#include "cpu/quantize.hpp"

#include "cpu/simd_clones.hpp"

namespace dsa::detail::cpu {
namespace {

// quantize_vector for values load(i). Both loops vectorize: the largest
// magnitude is taken on the bit patterns, which order finite and infinite
// magnitudes as their values do (NaN patterns, above infinity's, are
// skipped), and the encoding has no branches.
template <typename Load>
[[gnu::always_inline]] inline float quantize_loaded(Load load, int count, bool power_of_two_scale,
                                                    std::uint8_t* out) {
  constexpr std::uint32_t kInfinityBits = 0x7F800000u;
  std::uint32_t amax_bits = 0;
  for (int i = 0; i < count; ++i) {
    std::uint32_t magnitude = float_bits(load(i)) & 0x7FFFFFFFu;
    magnitude &= mask_if(magnitude <= kInfinityBits);  // NaN: 0
    amax_bits = magnitude > amax_bits ? magnitude : amax_bits;
  }
  const float scale = quantization_scale(bits_float(amax_bits), power_of_two_scale);
  for (int i = 0; i < count; ++i) out[i] = float_to_e4m3(load(i) / scale);
  return scale;
}

// quantize_fp4_vector for values load(i), block by block. The loops
// vectorize as quantize_loaded's do: amax on the bit patterns (NaN left
// out), then branch-free encoding.
template <typename Load>
[[gnu::always_inline]] inline std::uint32_t quantize_fp4_loaded(Load load, int count, std::uint8_t* out) {
  constexpr std::uint32_t kInfinityBits = 0x7F800000u;
  std::uint32_t scale_word = 0;
  for (int block = 0; block * kFp4BlockElements < count; ++block) {
    const int first = block * kFp4BlockElements;
    std::uint32_t amax_bits = 0;
    for (int i = first; i < first + kFp4BlockElements; ++i) {
      std::uint32_t magnitude = float_bits(load(i)) & 0x7FFFFFFFu;
      magnitude &= mask_if(magnitude <= kInfinityBits);  // NaN: 0
      amax_bits = magnitude > amax_bits ? magnitude : amax_bits;
    }
    const std::uint8_t exponent = fp4_block_scale(bits_float(amax_bits));
    const float scale = ue8m0_to_float(exponent);
    std::uint8_t codes[kFp4BlockElements];
    for (int i = 0; i < kFp4BlockElements; ++i) codes[i] = float_to_e2m1(load(first + i) / scale);
    for (int i = 0; i < kFp4BlockElements / 2; ++i) {
      out[first / 2 + i] = static_cast<std::uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
    }
    scale_word |= std::uint32_t{exponent} << (8 * block);
  }
  return scale_word;
}

}  // namespace

DSA_CPU_CLONES std::uint32_t quantize_fp4_vector(const void* source, DType dtype, int count, std::uint8_t* out) {
  if (dtype == DType::bfloat16) {
    const auto* values = static_cast<const std::uint16_t*>(source);
    return quantize_fp4_loaded([values](int i) { return bf16_to_float(values[i]); }, count, out);
  }
  const auto* values = static_cast<const float*>(source);
  return quantize_fp4_loaded([values](int i) { return values[i]; }, count, out);
}

DSA_CPU_CLONES float quantize_vector(const void* source, DType dtype, int count, bool power_of_two_scale,
                                     std::uint8_t* out) {
  if (dtype == DType::bfloat16) {
    const auto* values = static_cast<const std::uint16_t*>(source);
    return quantize_loaded([values](int i) { return bf16_to_float(values[i]); }, count, power_of_two_scale, out);
  }
  const auto* values = static_cast<const float*>(source);
  return quantize_loaded([values](int i) { return values[i]; }, count, power_of_two_scale, out);
}

}  // namespace dsa::detail::cpu
