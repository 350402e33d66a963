// Builders of the 2-D context lengths every scoring operation takes.
//
// context_lens is int32 [B, next_n]: row j of request b scores key positions
// 0 <= p < context_lens[b, j]. Three conventions produce it:
//   causal (canonical)  L[b, j] = prefix[b] + j + 1   (the drafts' keys are
//                       already in the cache; prefix = committed length)
//   expanded            L[b, j] = prefix[b] + next_n  (every row sees all drafts;
//                       causality is left to the top-k lengths)
//   legacy 1-D          L[b, j] = max(0, lens[b] - next_n + j + 1)
// Inputs are int32 [B] (contiguous or strided); out is int32 [B, next_n] on the
// same device; next_n >= 1. A negative input length is invalid_argument on the
// CPU; on CUDA it is clamped to 0 and recorded as a device error.
//
// Requests of uneven row counts (causal only): with request_offsets (int32
// [B + 1], contiguous, same device; the rules of LogitsOptions::request_offsets
// with T = the rows of out), out is int32 [T] or [T, 1], next_n is 1, and row
// request_offsets[b] + t (the t-th new token of request b, a prefill chunk or
// uneven drafts) gets prefix_lens[b] + t + 1. The CPU checks request_offsets
// (invalid_argument naming it); on CUDA a row that no request covers is
// recorded and set to 0, and offsets that are not non-decreasing are not
// detected beyond that.
#pragma once

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

// The three conventions above, for the operations that name one
// (context_lens_and_schedule, dsa/schedule.hpp).
enum class LengthConvention { causal, expanded, legacy };

Status causal_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                           const ExecContext& ctx);
// The varlen form (request_offsets, above).
Status causal_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                           const ExecContext& ctx, const TensorView& request_offsets);
Status expanded_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                             const ExecContext& ctx);
Status legacy_context_lens(const TensorView& lens, int next_n, const TensorView& out,
                           const ExecContext& ctx);

}  // namespace dsa
