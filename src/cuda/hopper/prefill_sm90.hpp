// mqa_logits on sm_90a (prefill_sm90_kernel.cuh): FP8 wgmma over tiles of
// query rows and 64-key tiles of a contiguous key run.
#pragma once

#include "common/problem.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"

namespace dsa::detail::cuda::hopper {

// True when the kernel serves p: fp8 queries with fp8 or fp4 keys, or fp4
// queries with fp4 keys, H in {32, 64}, D == 128, at least one key, the
// queries' and keys' starts on 16-byte boundaries.
bool supports_mqa_logits(const MqaLogitsProblem& p);

// Enqueues p on ctx.stream; the caller checked supports_mqa_logits and has
// cleared the error record.
Status mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx);

}  // namespace dsa::detail::cuda::hopper
