// The threaded CPU path's scoring arithmetic: one row's logits for a block of
// consecutive keys of one request, the keys advanced together in SIMD lanes.
#pragma once

namespace dsa::detail::cpu {

// Keys scored together: two vectors of eight float lanes.
inline constexpr int kBlockKeys = 16;

// out[i] = sum_h weights[h] * max(0, scales[i] * sum_d query[h * head_dim + d] * keys[d * kBlockKeys + i])
// for i in [0, kBlockKeys). `keys` holds the block dequantized and
// transposed, [head_dim][kBlockKeys]; padding keys are zero.
//
// Every lane adds its terms in one fixed order (d ascending inside a head,
// heads ascending), with multiply-adds fused where the processor has them,
// whatever the block, row or thread: every caller of this function, the
// logits pass and the fused index_topk, gets bitwise the same value for a
// (row, position). Rounding differs from the reference's plain float loops
// by the fusing.
void score_key_block(int heads, int head_dim, const float* query, const float* weights, const float* keys,
                     const float* scales, float* out);

}  // namespace dsa::detail::cpu
