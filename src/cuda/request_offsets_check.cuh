// The device-side rule of request_offsets (requests of uneven row counts),
// shared by the scoring kernels: every CTA checks the whole array before it
// scores, so all CTAs agree, and a CTA that finds it broken fills its share
// of the rows with NaN instead.
#pragma once

#include <cstdint>

#include "common/logit_rules.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"

namespace dsa::detail::cuda {

// Whether p.varlen's offsets run non-decreasing from 0 to the `rows` rows
// (request_offsets_violation), checked by the whole block; the violations
// found are recorded.
__device__ inline bool request_offsets_hold(const RequestRows& varlen, std::int64_t rows,
                                            DeviceErrorRecord* record) {
  int broken = 0;
  for (std::int64_t q = threadIdx.x; q <= varlen.requests; q += blockDim.x) {
    if (request_offsets_violation(varlen, q, rows) != OffsetsViolation::none) {
      report_device_error(record, kBadRequestOffsets, q, varlen.offsets[q], rows);
      broken = 1;
    }
  }
  return __syncthreads_or(broken) == 0;
}

// The block's share of the rows (every num_workers-th) filled with NaN over
// [0, max_context_len): what no row of broken request_offsets is scored into.
template <typename Problem>
__device__ void fill_share_with_nan(const Problem& p, std::int64_t rows) {
  for (std::int64_t row = blockIdx.x; row < rows; row += p.num_workers) {
    for (std::int64_t pos = threadIdx.x; pos < p.max_context_len; pos += blockDim.x) {
      store_logit(p, row, pos, invalid_logit());
    }
  }
}

}  // namespace dsa::detail::cuda
