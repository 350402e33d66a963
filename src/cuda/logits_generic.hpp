// The generic CUDA logits kernels (logits_generic.cu, prefill_generic.cu):
// correct on every GPU the toolkit supports, and the cross-check of the
// Hopper kernels.
#pragma once

#include "backend.hpp"

namespace dsa::detail::cuda::generic {

// Enqueues paged_mqa_logits on ctx.stream for any next_n, head count and
// head dimension (D % 16 == 0), native or per-token path as p.path says.
Status paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx);

// Enqueues mqa_logits on ctx.stream for any head count and head dimension
// (prefill_generic.cu).
Status mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx);

}  // namespace dsa::detail::cuda::generic
