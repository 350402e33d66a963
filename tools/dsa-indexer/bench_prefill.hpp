// `dsa-indexer bench --grid prefill`: mqa_logits over causal prefill chunks
// (DeepGEMM's fp8_mqa_logits as its own test runs it) against the floor of
// the measured fp8 tensor-core rate and copy bandwidth; beside it the same
// rows scored from a paged cache (paged_mqa_logits with request_offsets) and
// the keys gathered out of the pages then scored contiguously; and the
// ragged top-k of one chunk's logits against one read of them.
#pragma once

#include <cstdio>

#include "bench_common.hpp"
#include "json.hpp"
#include "options.hpp"

namespace dsa_cli {

// On a GPU, with bench's rates measured (copy_bandwidth, fp8_peak_rate; a
// zero peak rate leaves the points without a floor). Returns the exit code:
// 0 when every point was measured and every check held.
int prefill_grid(const Bench& bench, const Options& options, std::FILE* text, Json* document);

// Without a GPU: one small point on the bench's CPU backend, without a floor.
// Returns 0 when it ran.
int prefill_cpu_point(const Bench& bench, const Options& options, std::FILE* text, Json* document);

}  // namespace dsa_cli
