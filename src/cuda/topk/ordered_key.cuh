// Order-preserving integer keys for top-k selection.
//
// Each logit is mapped to an unsigned 32-bit key whose integer order is the
// total order top-k selects under: NaN ranks with -inf, -0.0 equals +0.0
// (bfloat16 keys fill the upper 16 bits). A key and its position combine into
// one 64-bit rank, unique within a row, whose order is the selection order
// including the tie break: larger key first, then smaller position.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hostdevice.hpp"

namespace dsa::detail::cuda::topk_impl {

using Rank = unsigned long long;

template <typename Bits>
struct OrderedKey;

// float32, read as its bit pattern.
template <>
struct OrderedKey<std::uint32_t> {
  DSA_HD static std::uint32_t from_bits(std::uint32_t bits) {
    if ((bits & 0x7fffffffu) > 0x7f800000u) bits = 0xff800000u;  // NaN -> -inf
    if (bits == 0x80000000u) bits = 0u;                            // -0.0 -> +0.0
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  }
};

// bfloat16, read as its bit pattern.
template <>
struct OrderedKey<std::uint16_t> {
  DSA_HD static std::uint32_t from_bits(std::uint16_t bits) {
    std::uint32_t b = bits;
    if ((b & 0x7fffu) > 0x7f80u) b = 0xff80u;  // NaN -> -inf
    if (b == 0x8000u) b = 0u;                  // -0.0 -> +0.0
    return ((b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u)) << 16;
  }
};

// The float32 whose key is `key`, for keys of -inf and above (NaN keys to -inf).
DSA_HD float float_of_key(std::uint32_t key) {
  constexpr std::uint32_t kMinusInfinity = 0x007fffffu;  // OrderedKey of -inf
  if (key < kMinusInfinity) key = kMinusInfinity;
  const std::uint32_t bits = (key & 0x80000000u) ? (key & 0x7fffffffu) : ~key;
  float value;
  memcpy(&value, &bits, sizeof value);
  return value;
}

DSA_HD Rank rank_of(std::uint32_t key, std::uint32_t position) {
  return (static_cast<Rank>(key) << 32) | (0xffffffffu - position);
}
DSA_HD std::uint32_t position_of(Rank rank) {
  return 0xffffffffu - static_cast<std::uint32_t>(rank);
}
DSA_HD std::uint32_t key_of(Rank rank) { return static_cast<std::uint32_t>(rank >> 32); }

}  // namespace dsa::detail::cuda::topk_impl
