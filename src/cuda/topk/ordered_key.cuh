// Order-preserving integer keys for top-k selection.
//
// Each logit is mapped to an unsigned key whose integer order is the total
// order top-k selects under: NaN ranks with -inf, -0.0 equals +0.0. Radix
// selection then works on the key's bits, most significant digit first.
#pragma once

#include <cstdint>

#include "hostdevice.hpp"

namespace dsa::detail::cuda::topk_impl {

// Digit width of one radix-selection pass (2048 histogram bins).
inline constexpr int kDigitBits = 11;
inline constexpr int kMaxBins = 1 << kDigitBits;

template <typename Bits>
struct OrderedKey;

// float32, read as its bit pattern.
template <>
struct OrderedKey<std::uint32_t> {
  using Key = std::uint32_t;
  static constexpr int kBits = 32;
  DSA_HD static Key from_bits(std::uint32_t bits) {
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits = 0xff800000u;  // NaN -> -inf
    if (bits == 0x80000000u) bits = 0u;                            // -0.0 -> +0.0
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
};

// bfloat16, read as its bit pattern.
template <>
struct OrderedKey<std::uint16_t> {
  using Key = std::uint16_t;
  static constexpr int kBits = 16;
  DSA_HD static Key from_bits(std::uint16_t bits) {
    if ((bits & 0x7fffu) > 0x7f80u) bits = 0xff80u;  // NaN -> -inf
    if (bits == 0x8000u) bits = 0u;                  // -0.0 -> +0.0
    return static_cast<Key>((bits & 0x8000u) ? ~bits : (bits | 0x8000u));
  }
};

// Bits of the key below the digit of radix pass `pass` (0 for the last pass).
DSA_HD int digit_shift_after_pass(int key_bits, int pass) {
  const int shift = key_bits - kDigitBits * (pass + 1);
  return shift > 0 ? shift : 0;
}

}  // namespace dsa::detail::cuda::topk_impl
