// Entry points of the CUDA kernels that other CUDA translation units
// call without the per-operation bookkeeping (clearing the error record,
// honouring check_device_errors): the caller has already done it.
#pragma once

#include "backend.hpp"

namespace dsa::detail::cuda {

// Enqueues the per-row part of paged_mqa_logits that any scoring kernel can
// share: rows breaking a length rule (negative, beyond max_context_len, beyond
// the block table) are recorded and filled with NaN over [0, max_context_len);
// with clean_logits, [L, max_context_len) of the other rows is set to -inf.
// Scoring kernels then score only rows obeying the rules (usable_length in
// common/logit_rules.hpp) and positions below their lengths.
Status launch_logits_row_rules(const LogitsProblem& p, const ExecContext& ctx);

// Enqueues the generic paged MQA logits kernels (row rules included) on ctx.stream.
Status launch_generic_logits(const LogitsProblem& p, const ExecContext& ctx);

// Enqueues the Hopper or the generic logits kernels.
Status launch_paged_mqa_logits(const LogitsProblem& p, bool hopper, const ExecContext& ctx);

// Enqueues the top-k kernels. A row breaking a length rule is recorded in
// ctx's error record unless a violation is already there.
Status launch_topk(const TopkProblem& p, const ExecContext& ctx);

}  // namespace dsa::detail::cuda
