// index_topk's fused strategy on CUDA (Hopper): a sampling pass scores a
// few tokens of every page (row_samples.hpp; calls whose rows reach
// kSampledContext positions), and each row's sample gives it a threshold.
// The selection kernel then scores like the logits kernel but leaves, per
// row, candidate lists (candidate_lists.hpp) of the values at or above the
// threshold instead of logits; one CTA per row selects from its lists. A
// row whose lists hold fewer than k ranks raises a flag, on which the
// selection kernel and the list selection run again without thresholds
// (each CTA returns at once when the flag is down). Workspace: [error
// record][top-k lengths][list counts, flag][lists][samples][sample maps]
// [floors]; only the lists of calls without a sample grow with the context
// length (candidate_lists.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend.hpp"

namespace dsa::detail::cuda {

// Enqueues the fused index_topk on ctx.stream. The caller checked that the
// Hopper kernels serve p and that the workspace holds
// fused_index_topk_workspace_bytes for p's rows, context, workers and units.
Status fused_index_topk(const IndexTopkProblem& p, const ExecContext& ctx);

// Workspace for every fused call of up to `rows` rows of up to
// max_context_len positions, scheduled on `workers` workers in units of
// `rows_per_unit` rows.
std::size_t fused_index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len,
                                             int workers, int rows_per_unit);

}  // namespace dsa::detail::cuda
