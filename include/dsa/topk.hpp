// Exact, deterministic top-k selection over rows of logits.
#pragma once

#include <cstdint>

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

inline constexpr int kMaxTopk = 2048;

// Every option is optional and they compose, except the two output
// transforms (position_offsets and block_table), of which at most one is
// given. Every tensor lives on the device of the logits.
struct TopkOptions {
  // Order each row's selection by value, largest first (ties by position,
  // smallest first); -1 padding stays at the end. Otherwise the order of the
  // selected positions within a row is unspecified (but deterministic).
  bool sorted = false;
  // Physical-slot transform: when given (int32 [R, max_blocks], inner
  // dimension contiguous), a selected position i of row r, which belongs to
  // request q (rows_per_request or request_offsets), is written as
  //   block_table[q, i / page_size] * page_size + i % page_size,
  // the cache slot sparse attention reads. -1 padding is kept.
  TensorView block_table{};
  // Row r belongs to request r / rows_per_request (next_n when rows are
  // b * next_n + j); >= 1, and R >= ceil(T / rows_per_request).
  int rows_per_request = 1;
  // Tokens per block_table entry: 64 or 32 (pages of the key cache), or 1
  // (a token-level table: slot = block_table[q, i]). Must be one of these
  // even without a block table.
  int page_size = 64;
  // Requests of uneven row counts (the cumulative query lengths of a ragged
  // batch, cu_seqlens_q): int32 [R + 1], contiguous, non-decreasing,
  // request_offsets[0] == 0 and request_offsets[R] == T. Row r belongs to the
  // request q with request_offsets[q] <= r < request_offsets[q + 1] (empty
  // requests own no row). Needs block_table (with at least R rows) and
  // excludes rows_per_request != 1.
  TensorView request_offsets{};
  // Ragged rows: int32 [T], contiguous. Row r's candidates are the columns
  // row_starts[r] .. row_starts[r] + lengths[r] - 1 of the logits; without
  // it every row starts at column 0.
  TensorView row_starts{};
  // Ragged output: int32 [T], contiguous. A selected position i of row r is
  // written as i + position_offsets[r] (computed modulo 2^32 should it leave
  // the int32 range); -1 padding is kept. Excludes block_table.
  TensorView position_offsets{};
};

// Selects the k largest values of each row.
//   logits   float32 or bfloat16 [T, N], T < 2^31, inner dimension contiguous, any row stride
//   lengths  int32 [T]; 0 <= lengths[r] <= N (length_out_of_range)
//   k        1 <= k <= 2048 (k_out_of_range)
//   indices  int32 [T, K] output with K >= k, inner dimension contiguous, row
//            stride >= k; columns [0, k) are written
// Row r has L = lengths[r] candidates, v[i] = logits[r, s + i] for
// 0 <= i < L, where s = row_starts[r] (0 without row_starts); the row rule
// is 0 <= s and s + L <= N (length_out_of_range, naming row_starts). What the
// row selects are relative positions i. When L <= k: 0 .. L - 1 in
// increasing order (with or without `sorted`), then -1. Otherwise the k
// positions of the largest v[i] under this total order: NaN counts as -inf,
// -0.0 equals +0.0, and of equal values the smaller position wins. The
// output is exact (never drops or duplicates a winner) and bitwise identical
// run to run. Each selected i is written transformed: i + position_offsets[r]
// or a cache slot through block_table (see TopkOptions), else i itself.
//
// With a block table, a row of length L reads the entries [q, i] for
// i < ceil(L / page_size): ceil(L / page_size) <= max_blocks
// (length_out_of_range), and on the CPU backend those entries must be in
// [0, (2^31 - 1) / page_size] (page_out_of_range); later entries are never
// read.
//
// Where the rules are checked: shapes, dtypes, devices, strides and the
// choice of options always on the host. The data-dependent ones (lengths,
// starts, needed block-table entries, request_offsets non-decreasing from 0
// to T) on the host by the CPU backend, before anything is written. The CUDA
// backend checks lengths, starts and the rows' requests on the device: a row
// that breaks a rule, or that no request of request_offsets covers, is
// recorded (see ExecContext::check_device_errors) and its output is all -1;
// nothing is read out of bounds. It does not check that request_offsets is
// non-decreasing beyond that, nor the block-table entries (a negative entry
// gives a negative slot).
Status topk(const TensorView& logits, const TensorView& lengths, int k, const TensorView& indices,
            const TopkOptions& options, const ExecContext& ctx);
// Workspace for `rows` rows of up to max_length positions and this k. The
// size currently depends on none of them: the selection keeps its scratch
// in shared memory, so CUDA needs the error record alone (0 on the CPU). The
// arguments stay so that a selection that needs more can size it without a
// change of signature.
std::size_t topk_workspace_bytes(std::int64_t rows, std::int64_t max_length, int k,
                                 const ExecContext& ctx);

}  // namespace dsa
