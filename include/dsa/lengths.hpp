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
#pragma once

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

Status causal_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                           const ExecContext& ctx);
Status expanded_context_lens(const TensorView& prefix_lens, int next_n, const TensorView& out,
                             const ExecContext& ctx);
Status legacy_context_lens(const TensorView& lens, int next_n, const TensorView& out,
                           const ExecContext& ctx);

}  // namespace dsa
