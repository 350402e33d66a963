// Prefill scoring: MQA logits of query tokens against a contiguous run of
// keys, each row over its own key range (DeepGEMM's fp8_mqa_logits).
//
// The paged form — a prefill chunk's new tokens scored straight from the
// paged key cache, without gathering the keys first — is paged_mqa_logits
// with request_offsets (dsa/logits.hpp): the chunk's T new tokens are the
// rows, row t of request b of length prefix_b + t + 1 (causal_context_lens
// with request_offsets), each request's keys read once per tile of
// kVarlenRowTile rows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

struct MqaLogitsOptions {
  // Fill the columns a row does not score with -inf (see mqa_logits);
  // otherwise they hold unspecified values. (DeepGEMM's default is true.)
  bool clean_logits = false;
  // Compressed output: column c of row i holds key ks[i] + c; only the first
  // max_seqlen_k columns are defined. Otherwise column j holds key j.
  bool compressed = false;
  // The compressed output's columns: >= 0, and ke[i] - ks[i] <= max_seqlen_k
  // for every row. Must be 0 without `compressed`.
  std::int64_t max_seqlen_k = 0;
  // fp4 queries: int32 [S, H], each the packed ue8m0 block scales of one
  // (row, head) query (as dsa/logits.hpp's). When given, q holds packed e2m1
  // codes [S, H, D / 2] (D == 128). Empty: fp8 queries.
  TensorView q_block_scales{};
};

// Scores query rows against a contiguous run of S_kv keys, row i over the keys
// [ks[i], ke[i]).
//
//   q           float8_e4m3 [S, H, D], or with options.q_block_scales uint8
//               [S, H, D / 2] packed e2m1 codes (D == 128); inner dimension
//               contiguous, strides of dimensions 0 and 1 multiples of 16 bytes
//               (those of extent 1 are never used and may be anything),
//               16-byte aligned; H >= 1, D a multiple of 16 up to 256
//   keys        float8_e4m3 [S_kv, D], or fp4 keys: uint8 [S_kv, D / 2] packed
//               e2m1 codes (D == 128); inner dimension contiguous, row stride a
//               multiple of 16 bytes, 16-byte aligned; S_kv < 2^31
//   key_scales  float32 [S_kv] (fp8 keys), or int32 [S_kv] (fp4 keys: each
//               key's packed ue8m0 block scales, as in dsa/cache.hpp); any stride
//   weights     float32 [S, H], inner dimension contiguous; the query scale is
//               already folded in (see dsa/query.hpp)
//   ks, ke      int32 [S], any stride; 0 <= ks[i] <= ke[i] <= S_kv
//               (length_out_of_range, naming ks or ke), and with `compressed`
//               ke[i] - ks[i] <= max_seqlen_k (length_out_of_range, naming ke).
//               Ranges may be empty and need not be monotone in i
//               (context-parallel layouts).
//   logits      float32 or bfloat16 [S, N] output, inner dimension contiguous,
//               row stride >= W, with W = S_kv (N >= S_kv), or W = max_seqlen_k
//               with `compressed` (N >= max_seqlen_k)
//
// For row i and ks[i] <= j < ke[i]:
//   logit(i, j) = sum_h weights[i, h] * max(0, key_scales[j] * sum_d q[i, h, d] * keys[j, d])
// with fp4 queries and keys read as their dequantized values (block scales
// applied, key_scales[j] then 1; see dsa/logits.hpp)
// stored at column j, or at column j - ks[i] with `compressed`. With
// clean_logits every other column c < W of the row holds -inf. Columns
// c >= W are never written. Results are bitwise identical run to run.
//
// Where the rules are checked: shapes, dtypes, devices, strides and options
// always on the host. The ranges on the host by the CPU backends, before
// anything is written; on the device by the CUDA backend: a row that breaks
// a range rule gets NaN over its columns [0, W) (nothing is read or written
// out of bounds) and the first such row is recorded (see
// ExecContext::check_device_errors).
//
// DeepGEMM's fp8_mqa_logits(q, kv = (keys, key_scales), weights,
// cu_seq_len_k_start = ks, cu_seq_len_k_end = ke, clean_logits,
// max_seqlen_k): its max_seqlen_k > 0 is compressed = true with that
// max_seqlen_k; its output [S, S_kv] or [S, max_seqlen_k] is `logits`.
Status mqa_logits(const TensorView& q, const TensorView& keys, const TensorView& key_scales,
                  const TensorView& weights, const TensorView& ks, const TensorView& ke,
                  const TensorView& logits, const MqaLogitsOptions& options, const ExecContext& ctx);
// The error record alone on CUDA; 0 on the CPU.
std::size_t mqa_logits_workspace_bytes(const ExecContext& ctx);

// Consecutive query rows [begin, end) whose logits one mqa_logits call
// computes, and with compressed output the columns it needs.
struct MqaLogitsChunk {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t max_seqlen_k = 0;  // compressed: the widest range of its rows; else 0
};

// Splits rows [0, S) into the fewest consecutive chunks, taken greedily from
// row 0, whose logits each fit `budget_bytes`, as engines split a long
// prefill: a chunk of r rows needs r * W * (4 for float32, 2 for bfloat16)
// bytes, W = num_keys (full output) or, compressed, the widest ke[i] - ks[i]
// of its rows (at least 1).
//   ks, ke        int32 [S] in host memory, with mqa_logits' range rules
//                 against num_keys (length_out_of_range)
//   num_keys      S_kv, in [0, 2^31 - 1]
//   logits_dtype  float32 or bfloat16
// A row whose logits alone exceed the budget is invalid_argument naming
// budget_bytes. `chunks` is replaced (empty for S == 0).
Status plan_mqa_logits_chunks(const TensorView& ks, const TensorView& ke, std::int64_t num_keys,
                              bool compressed, DType logits_dtype, std::size_t budget_bytes,
                              std::vector<MqaLogitsChunk>* chunks);

}  // namespace dsa
