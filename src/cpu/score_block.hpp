// The threaded CPU path's scoring arithmetic: one row's logits for a block of
// consecutive keys of one request, the keys advanced together in SIMD lanes.
#pragma once

#include <cstdint>

#include "common/number_formats.hpp"

namespace dsa::detail::cpu {

// Keys scored together: two AVX-512 vectors of 16 float lanes, or four
// vectors of eight.
inline constexpr int kBlockKeys = 32;

// Vectors of e4m3 values (or e2m1 values times power-of-two block scales) as
// bf16 pairs: word w holds elements 2w (low half) and 2w + 1 (high half).
// Every such value is exact in bf16, and the product of two is exact in float32.
inline std::uint32_t bf16_pair(float even, float odd) {
  return (float_bits(even) >> 16) | (float_bits(odd) & 0xFFFF0000u);
}

// The inputs of one block and row:
//   query        float32 [heads][head_dim]
//   query_pairs  the same values as bf16 pairs, [heads][head_dim / 2]
//   weights      float32 [heads]
//   key_pairs    the block's keys as bf16 pairs, transposed: word w of key i
//                at [w * kBlockKeys + i]; padding keys are zero
//   scales       float32 [kBlockKeys]
struct BlockInputs {
  int heads;
  int head_dim;
  const float* query;
  const std::uint32_t* query_pairs;
  const float* weights;
  const std::uint32_t* key_pairs;
  const float* scales;
};

// out[i] = sum_h weights[h] * max(0, scales[i] * sum_d query[h][d] * key_i[d])
// for i in [0, kBlockKeys), in float32, with multiply-adds fused where the
// processor has them. Where it has AVX-512 BF16, score_key_block_bf16_dot,
// else score_key_block_fma. Each adds every lane's terms in one fixed order,
// whatever the block, row or thread, so every caller (the logits pass and
// the fused index_topk) gets bitwise the same value for a (row, position)
// on a given processor. Rounding differs from the reference's plain float
// loops by the fusing and, with BF16 dot products, the order of each pair
// of terms.
void score_key_block(const BlockInputs& in, float* out);

// d ascending inside a head, heads ascending; AVX2 and FMA where present.
void score_key_block_fma(const BlockInputs& in, float* out);

// Whether score_key_block_bf16_dot runs on this processor.
bool bf16_dot_available();
// Each pair of terms added by one instruction, pairs ascending inside a head,
// heads ascending. Where bf16_dot_available() is false, score_key_block_fma.
void score_key_block_bf16_dot(const BlockInputs& in, float* out);

}  // namespace dsa::detail::cpu
