// The data-dependent rules of a logits row, written once for the host
// validation and every backend: which lengths a row may have, what a
// position that is not scored holds, and how one logit is stored.
#pragma once

#include <cstdint>
#include <limits>

#include "common/device_error.hpp"
#include "common/hostdevice.hpp"
#include "common/number_formats.hpp"
#include "common/problem.hpp"
#include "common/schedule_walk.hpp"
#include "dsa/cache.hpp"
#include "dsa/tensor.hpp"

namespace dsa::detail {

// Block-table columns a row of `length` key positions reads from pages of
// `page_tokens` tokens: ceil(length / P).
DSA_HD std::int64_t pages_for_length(std::int64_t length, int page_tokens) {
  return (length + page_tokens - 1) / page_tokens;
}

// The rule a scoring row's context length breaks, or kNoDeviceError:
// 0 <= L <= max_context_len, and its pages of `page_tokens` tokens within
// the block table's max_blocks columns.
DSA_HD std::int32_t scoring_length_violation(std::int64_t length, std::int64_t max_context_len,
                                             std::int64_t max_blocks, int page_tokens) {
  if (length < 0) return kNegativeLength;
  if (length > max_context_len) return kLengthBeyondMaxContext;
  if (pages_for_length(length, page_tokens) > max_blocks) return kLengthBeyondBlockTable;
  return kNoDeviceError;
}

// The bound a scoring length violation names (the error record's third argument).
DSA_HD std::int64_t scoring_length_limit(std::int32_t violation, std::int64_t max_context_len,
                                         std::int64_t max_blocks) {
  return violation == kLengthBeyondMaxContext ? max_context_len
         : violation == kLengthBeyondBlockTable ? max_blocks
                                                : 0;
}

// The rule a top-k row length breaks, or kNoDeviceError: 0 <= L <= cols
// and, when a block table turns positions into slots, its pages within the
// table's max_blocks columns (the top-k's slot transform reads pages of
// kDefaultPageTokens: TopkOptions has no page size).
DSA_HD std::int32_t topk_length_violation(std::int64_t length, std::int64_t cols, bool block_table,
                                          std::int64_t max_blocks) {
  if (length < 0) return kNegativeLength;
  if (length > cols) return kLengthBeyondLogits;
  if (block_table && pages_for_length(length, kDefaultPageTokens) > max_blocks) return kLengthBeyondBlockTable;
  return kNoDeviceError;
}

// The bound a top-k length violation names (the error record's third argument).
DSA_HD std::int64_t topk_length_limit(std::int32_t violation, std::int64_t cols, std::int64_t max_blocks) {
  return violation == kLengthBeyondLogits ? cols : violation == kLengthBeyondBlockTable ? max_blocks : 0;
}

// The rule a row's top-k length (index_topk's topk_lens) breaks against its
// context length, or kNoDeviceError: 0 <= topk length <= context length.
DSA_HD std::int32_t topk_lens_violation(std::int64_t topk_length, std::int64_t context_length) {
  if (topk_length < 0) return kNegativeLength;
  if (topk_length > context_length) return kTopkLengthBeyondContext;
  return kNoDeviceError;
}

// Row (b, j)'s context length when it obeys the scoring rules, else 0: such
// rows are never scored (they hold invalid_logit()).
DSA_HD std::int64_t usable_length(const LogitsProblem& p, std::int64_t b, std::int64_t j) {
  const std::int64_t length = row_length(p.lens, b, j);
  return scoring_length_violation(length, p.max_context_len, p.max_blocks, p.cache.page_tokens) ==
                 kNoDeviceError
             ? length
             : 0;
}

// What a logits position holds when no score is computed for it: NaN over a
// row whose length breaks a rule and inside a page the block table refuses;
// -inf past a valid row's length when the caller asks for clean logits.
// Selection orders NaN as -inf, so neither is ever chosen over a score.
DSA_HD constexpr float invalid_logit() { return std::numeric_limits<float>::quiet_NaN(); }
DSA_HD constexpr float masked_logit() { return -std::numeric_limits<float>::infinity(); }

// Stores one logit at `index` (elements) of a float32 or bfloat16 matrix.
DSA_HD void store_logit_at(void* logits, bool bf16, std::int64_t index, float value) {
  if (bf16) {
    static_cast<std::uint16_t*>(logits)[index] = float_to_bf16(value);
  } else {
    static_cast<float*>(logits)[index] = value;
  }
}

// Stores the logit of (row, position) of p's output.
DSA_HD void store_logit(const LogitsProblem& p, std::int64_t row, std::int64_t position, float value) {
  store_logit_at(p.logits, p.logits_dtype == DType::bfloat16, row * p.logits_stride + position, value);
}

}  // namespace dsa::detail
