// The data-dependent length rules of the scoring operations, as the CUDA
// kernels apply them (the host-side counterpart is check_scoring_data).
#pragma once

#include <cstdint>

#include "dsa/cache.hpp"
#include "common/problem.hpp"
#include "common/schedule_walk.hpp"

namespace dsa::detail::cuda {

__device__ __forceinline__ std::int64_t pages_for_length(std::int64_t length) {
  return (length + kPageTokens - 1) / kPageTokens;
}

// Row (b, j)'s length when it obeys 0 <= L <= max_context_len and
// ceil(L / 64) <= max_blocks, else 0: such rows are never scored.
__device__ __forceinline__ std::int64_t usable_length(const LogitsProblem& p, std::int64_t b,
                                                      std::int64_t j) {
  const std::int64_t length = row_length(p.lens, b, j);
  const bool usable =
      length >= 0 && length <= p.max_context_len && pages_for_length(length) <= p.max_blocks;
  return usable ? length : 0;
}

}  // namespace dsa::detail::cuda
