// `dsa-indexer bench`: the measured floor (copy bandwidth and fp8 matrix
// rate of this GPU) and the reference grid timed against it.
#pragma once

#include "options.hpp"

namespace dsa_cli {

// Returns the process exit code: 0 when every measurement ran.
int bench_command(const Options& options);

}  // namespace dsa_cli
