// What the two strategies of index_topk share (index_topk.cu stages the
// logits, fused/ lists candidates): the length each row selects among and
// the top-k problem of the selection step.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/logit_rules.hpp"
#include "common/problem.hpp"
#include "cuda/device_error.cuh"

namespace dsa::detail::cuda {

// The length row `row` selects among: topk_lens[row] (or the context
// length), limited to the positions the scoring defined. Rows whose context
// length breaks a rule select nothing (their logits are NaN and the violation
// is recorded by the scoring); a top-k length beyond the context or negative
// is recorded here.
__device__ inline std::int32_t selection_length(const LogitsProblem& p, const std::int32_t* topk_lens,
                                                std::int64_t topk_lens_stride, std::int64_t row,
                                                DeviceErrorRecord* record) {
  const std::int64_t b = row / p.next_n;
  const std::int64_t j = row % p.next_n;
  const std::int64_t context = usable_length(p, b, j);
  std::int64_t length = context;
  if (topk_lens != nullptr) {
    length = topk_lens[row * topk_lens_stride];
    const std::int64_t stated_context = row_length(p.lens, b, j);
    const std::int32_t violation = topk_lens_violation(length, stated_context);
    if (violation != kNoDeviceError) {
      report_device_error(record, violation, row, length, violation == kNegativeLength ? 0 : stated_context);
    }
    length = std::max<std::int64_t>(std::min(length, context), 0);
  }
  return static_cast<std::int32_t>(length);
}

// The top-k problem of the selection step: the rows' lengths and the output.
inline TopkProblem selection_problem(const IndexTopkProblem& p, const std::int32_t* lengths,
                                     const void* logits, std::int64_t logits_stride) {
  TopkProblem select;
  select.device = p.logits.device;
  select.rows = p.logits.rows();
  select.cols = p.logits.max_context_len;
  select.logits = logits;
  select.logits_dtype = DType::float32;
  select.logits_stride = logits_stride;
  select.lengths = lengths;
  select.lengths_stride = 1;
  select.k = p.k;
  select.indices = p.indices;
  select.indices_stride = p.indices_stride;
  select.sorted = p.sorted;
  if (p.physical_slots) {
    select.block_table = p.logits.block_table;
    select.block_table_stride = p.logits.block_table_stride;
    select.max_blocks = p.logits.max_blocks;
    select.rows_per_request = static_cast<int>(p.logits.next_n);
    select.request_offsets = p.logits.varlen.offsets;
    select.requests = p.logits.varlen.requests;
    select.page_size = p.logits.cache.page_tokens;
  }
  return select;
}

}  // namespace dsa::detail::cuda
