// Query quantization and the folding of its scale into the head weights.
#pragma once

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

struct QuantizeQueriesOptions {
  bool power_of_two_scales = false;  // round q scales up to powers of two
  // Multiplier folded into every weight; 0 means the model's default
  // H^-0.5 * D^-0.5 (indexer head count and head dimension).
  float weight_scale = 0.0f;
};

// Quantizes queries per (row, head) and folds the scales into the weights.
//   q          bfloat16 or float32 [B, next_n, H, D], inner dimension contiguous
//   head_gate  bfloat16 or float32 [B * next_n, H] (the raw weights_proj output)
//   q_fp8      float8_e4m3 [B, next_n, H, D] output, inner dimension contiguous
//   weights    float32 [B * next_n, H] output, inner dimension contiguous, row stride >= H
// For row r = b * next_n + j and head h: amax = max(max_d |q[b,j,h,d]|, 1e-4),
// q_scale = amax / 448 (power of two if asked), q_fp8 = e4m3(q / q_scale),
// weights[r, h] = head_gate[r, h] * q_scale * weight_scale.
Status quantize_queries(const TensorView& q, const TensorView& head_gate, const TensorView& q_fp8,
                        const TensorView& weights, const QuantizeQueriesOptions& options,
                        const ExecContext& ctx);
std::size_t quantize_queries_workspace_bytes(const ExecContext& ctx);

// Quantizes queries to fp4 (e2m1 codes, one ue8m0 scale per 32 elements),
// the query format of DeepSeek-V4.1's indexer, byte-compatible with
// DeepGEMM's fp8_fp4_paged_mqa_logits.
//   q               bfloat16 or float32 [B, next_n, H, 128], inner dimension contiguous
//   head_gate       bfloat16 or float32 [B * next_n, H]
//   q_codes         uint8 [B, next_n, H, 64] output, inner dimension contiguous:
//                   element 2i in the low nibble of byte i, 2i + 1 in the high one
//   q_block_scales  int32 [B, next_n, H] output: block b's ue8m0 scale in byte b
//   weights         float32 [B * next_n, H] output, inner dimension contiguous, row stride >= H
// Each 32-element block is quantized as an fp4 key block is (dsa/cache.hpp);
// weights[r, h] = head_gate[r, h] * weight_scale (the block scales stay with
// the codes). options.power_of_two_scales has no effect. Its workspace is
// quantize_queries_workspace_bytes(ctx).
Status quantize_queries_fp4(const TensorView& q, const TensorView& head_gate, const TensorView& q_codes,
                            const TensorView& q_block_scales, const TensorView& weights,
                            const QuantizeQueriesOptions& options, const ExecContext& ctx);

}  // namespace dsa
