// The lightning indexer: paged MQA logits.
#pragma once

#include <cstdint>

#include "dsa/cache.hpp"
#include "dsa/context.hpp"
#include "dsa/schedule.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

struct LogitsOptions {
  // Fill positions L[b, j] <= p < max_context_len of every row with -inf
  // (otherwise they hold unspecified values).
  bool clean_logits = false;
  LogitsPath path = LogitsPath::automatic;
  // Tokens per cache page: 0 (from the view), 32 or 64; see "Page size" in
  // dsa/cache.hpp.
  int page_size = 0;
  // The cache's key format: see "Key format" in dsa/cache.hpp. The Hopper
  // backend reads fp8 keys with fp8 queries, and fp4 keys with fp8 or fp4
  // queries; automatic runs fp4 queries over fp8 keys on the generic kernels.
  KeyFormat key_format = KeyFormat::automatic;
  // fp4 queries: int32 [B, next_n, H], each the packed ue8m0 block scales of
  // one (row, head) query as a key's scale word is packed (dsa/cache.hpp).
  // When given, q holds packed e2m1 codes (see below). Empty: fp8 queries.
  TensorView q_block_scales{};
  // Requests of uneven row counts ("varlen": adaptive speculation, or a
  // prefill chunk whose new tokens are its rows): int32 [B + 1], contiguous,
  // request_offsets[0] == 0, non-decreasing, request_offsets[B] == T. Row r
  // belongs to the request b with request_offsets[b] <= r <
  // request_offsets[b + 1]; empty requests own no rows. See "Requests of
  // uneven row counts" below for the shapes it changes.
  TensorView request_offsets{};
};

// Scores every cached key position for every query row.
//
//   q               float8_e4m3 [B, next_n, H, D], or with options.q_block_scales
//                   uint8 [B, next_n, H, D / 2] packed e2m1 codes (D == 128,
//                   element 2i in the low nibble of byte i); inner dimension
//                   contiguous, row strides multiples of 16 bytes (those of
//                   dimensions of extent 1 are never used and may be anything).
//                   H in {32, 64} on the Hopper backend (fp8 only), any H >= 1
//                   elsewhere; D == the cache's D.
//   key_cache       uint8 paged cache (see dsa/cache.hpp) of num_pages pages of
//                   P tokens (P from the view or options.page_size)
//   weights         float32 [B * next_n, H], inner dimension contiguous; the
//                   fp8 query scale is already folded in; fp4 queries carry
//                   their scales themselves (see dsa/query.hpp)
//   context_lens    int32 [B, next_n]; 0 <= L[b, j] <= max_context_len
//   block_table     int32 [B, max_blocks], inner dimension contiguous;
//                   ceil(L[b, j] / P) <= max_blocks (length_out_of_range).
//                   Entries [b, i] with i < ceil(max_j L[b, j] / P) must be
//                   page indices in [0, num_pages) (page_out_of_range); later
//                   entries are never read and may hold anything (-1 padding).
//   schedule        int32 [num_workers + 1, 2] from plan_schedule for the same
//                   B and path (see dsa/schedule.hpp)
//   max_context_len >= 0; the number of logits columns that are defined
//   logits          float32 or bfloat16 [B * next_n, N] output with
//                   N >= max_context_len, inner dimension contiguous, any row
//                   stride >= max_context_len
//
// For row r = b * next_n + j and 0 <= p < L[b, j]:
//   logits[r, p] = sum_h weights[r, h] * max(0, sum_d q[b, j, h, d] * key[p, d])
// where key[p] is the dequantized key (dsa/cache.hpp) of slot
// block_table[b, p / P] * P + p % P, and q the fp8 values, or for fp4
// queries e2m1(code[d]) * 2^(e_blk - 127) with e_blk byte d / 32 of the
// (row, head)'s q_block_scales word. Each product is exact; sums are in
// float32 (the CPU reference may use float64, ctx.reference_float64), in an
// order the backend fixes.
// Columns p >= max_context_len are never written. The native and per-token
// paths compute the same function. Results are bitwise identical run to run.
//
// Requests of uneven row counts (options.request_offsets given, B + 1
// entries, T = request_offsets[B] rows):
//   q             float8_e4m3 [T, 1, H, D] or [T, H, D] (same stride rules)
//   weights       float32 [T, H]
//   context_lens  int32 [T] or [T, 1]: L[r], the length of row r
//   block_table   int32 [B, max_blocks]: row b is request b's
//   schedule      from plan_schedule with the same request_offsets
//   logits        [T, N]
// For row r of request b and 0 <= p < L[r]:
//   logits[r, p] = sum_h weights[r, h] * max(0, scale[p] * sum_d q[r, h, d] * key[p, d])
// with key[p], scale[p] at slot block_table[b, p / P] * P + p % P; the
// length and block-table rules above hold per row (entries [b, i] with
// i < ceil(max_r L[r] / P) over b's rows must be pages). The causal
// convention of a prefill chunk is L = prefix_b + t + 1 for the t-th new
// token of request b (causal_context_lens with request_offsets). The native
// path reads a request's keys once per kVarlenRowTile rows (dsa/schedule.hpp).
// The CPU backends check request_offsets on the host (invalid_argument
// naming request_offsets). The CUDA kernels (generic and Hopper) check it on
// the device: entries that are not non-decreasing from 0 to T are recorded
// and every row is filled with NaN over [0, max_context_len); nothing is read
// or written out of bounds.
Status paged_mqa_logits(const TensorView& q, const TensorView& key_cache, const TensorView& weights,
                        const TensorView& context_lens, const TensorView& block_table,
                        const TensorView& schedule, std::int64_t max_context_len,
                        const TensorView& logits, const LogitsOptions& options,
                        const ExecContext& ctx);
std::size_t paged_mqa_logits_workspace_bytes(const ExecContext& ctx);

}  // namespace dsa
