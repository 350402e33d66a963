// Paged MQA logits on sm_90a: FP8 wgmma with the cache page as the A operand,
// tensor-copied pages in a multi-stage pipeline, three producer warps and three
// or four consumer warpgroups, persistent grid walking the schedule. The native path
// reads each request's keys once for all of its next_n draft rows.
#pragma once

#include "common/problem.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"

namespace dsa::detail::cuda::hopper {

// True when the native path has a kernel for this shape: next_n 1..8,
// H in {32, 64}, D == 128.
bool supports_native(int next_n, int heads, int head_dim);

// Enqueues the logits computation on ctx.stream (native or per-token path as
// p.path says). The per-token path serves any next_n for the heads and head
// dimension supports_native accepts. The caller has cleared the error record.
Status paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx);

}  // namespace dsa::detail::cuda::hopper
