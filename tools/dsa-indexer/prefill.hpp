// The prefill command: score a causal prefill workload with mqa_logits, take
// the ragged top-k, verify both against the float64 CPU reference and time them.
#pragma once

#include "options.hpp"

namespace dsa_cli {

// Returns the process exit code: 0 verified, 1 failed or errored.
int prefill_command(const Options& options);

}  // namespace dsa_cli
