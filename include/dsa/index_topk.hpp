// Fused scoring and selection: the top-k indices without the logits matrix.
#pragma once

#include <cstdint>

#include "dsa/context.hpp"
#include "dsa/logits.hpp"
#include "dsa/schedule.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"
#include "dsa/topk.hpp"

namespace dsa {

enum class IndexTopkStrategy {
  automatic,         // the faster of the two on the backend as measured
                     // (docs/performance.md): fused on the CPU, logits_then_topk on CUDA
  fused,             // selection inside the scoring pass, logits never written in full
                     // (CPU, and CUDA on the Hopper kernels, which read fp8 keys;
                     // the generic CUDA kernels return `unsupported`)
  logits_then_topk,  // paged_mqa_logits into staging memory (the workspace on CUDA), then topk
};

const char* index_topk_strategy_name(IndexTopkStrategy strategy) noexcept;

struct IndexTopkOptions {
  int k = kMaxTopk;
  bool sorted = false;          // as TopkOptions::sorted
  // Write cache slots instead of positions: position p of request b becomes
  // block_table[b, p / P] * P + p % P, with the cache's page size P.
  bool physical_slots = false;
  LogitsPath path = LogitsPath::automatic;
  IndexTopkStrategy strategy = IndexTopkStrategy::automatic;
  // Tokens per cache page, as LogitsOptions::page_size.
  int page_size = 0;
  // As LogitsOptions::key_format and LogitsOptions::q_block_scales.
  KeyFormat key_format = KeyFormat::automatic;
  TensorView q_block_scales{};
  // Requests of uneven row counts, as LogitsOptions::request_offsets: the
  // inputs take paged_mqa_logits' varlen shapes, topk_lens is int32 [T] and
  // indices [T, K]; physical slots use request b's block-table row for the
  // rows of b. CUDA runs logits_then_topk for it (`fused` is `unsupported`).
  TensorView request_offsets{};
};

// Same inputs as paged_mqa_logits (q, key_cache, weights, context_lens,
// block_table, schedule, max_context_len), plus
//   topk_lens  int32 [B * next_n]: row r selects among positions
//              [0, topk_lens[r]), with topk_lens[r] <= L[b, j]; an empty view
//              means topk_lens[r] = context_lens[b, j] (the causal convention);
//              with expanded lengths pass the causal ones here
//   indices    int32 [B * next_n, K] output, K >= options.k, inner dimension
//              contiguous, row stride >= options.k
// The result is exactly topk(paged_mqa_logits(...), topk_lens, k) with the
// same options: same contract, same tie rule, bitwise deterministic.
Status index_topk(const TensorView& q, const TensorView& key_cache, const TensorView& weights,
                  const TensorView& context_lens, const TensorView& block_table,
                  const TensorView& schedule, std::int64_t max_context_len,
                  const TensorView& topk_lens, const TensorView& indices,
                  const IndexTopkOptions& options, const ExecContext& ctx);
// Workspace for `rows` rows (B * next_n) of up to max_context_len positions:
// it serves every call of that many rows or fewer and no longer rows.
// With the fused strategy on CUDA the workspace grows with the context only
// up to 16K positions, then stays: it holds candidate lists for every row
// and every (worker, draft row). From 16K, where sampled thresholds keep
// them short, four of 32 KiB at next_n 1 (each row's pages are split
// between them), two of 48 KiB at next_n 2 and one of 48 KiB from next_n 3,
// and 16 KiB per row of sampled scores; below, lists that hold every
// position (about 8 bytes a position, at least 32 KiB a list). Sized here
// for the worst next_n and for schedules of at most one worker per
// multiprocessor of device 0 (a schedule with more workers needs more; the
// call says how much).
std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len,
                                       const IndexTopkOptions& options, const ExecContext& ctx);

}  // namespace dsa
