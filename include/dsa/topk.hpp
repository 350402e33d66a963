// Exact, deterministic top-k selection over rows of logits.
#pragma once

#include <cstdint>

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

inline constexpr int kMaxTopk = 2048;

struct TopkOptions {
  // Order each row's selection by value, largest first (ties by position,
  // smallest first); -1 padding stays at the end. Otherwise the order of the
  // selected positions within a row is unspecified (but deterministic).
  bool sorted = false;
  // Optional physical-slot transform: when given (int32 [B, max_blocks], inner
  // dimension contiguous), a selected position p of row r is written as
  // block_table[r / rows_per_request, p / 64] * 64 + p % 64 (the cache slot
  // sparse attention reads). -1 padding is kept.
  TensorView block_table{};
  int rows_per_request = 1;  // next_n when rows are b * next_n + j
};

// Selects the k largest values of each row.
//   logits   float32 or bfloat16 [T, N], T < 2^31, inner dimension contiguous, any row stride
//   lengths  int32 [T]; 0 <= lengths[r] <= N (length_out_of_range)
//   k        1 <= k <= 2048 (k_out_of_range)
//   indices  int32 [T, K] output with K >= k, inner dimension contiguous, row
//            stride >= k; columns [0, k) are written
// Row r: when lengths[r] <= k, positions 0 .. lengths[r] - 1 in increasing
// order (with or without `sorted`), then -1. Otherwise the k positions of the largest values among
// [0, lengths[r]) under this total order: NaN counts as -inf, -0.0 equals
// +0.0, and of equal values the smaller position wins. The output is exact
// (never drops or duplicates a winner) and bitwise identical run to run.
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
