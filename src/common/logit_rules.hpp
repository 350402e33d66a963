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

// Block-table columns a row of `length` positions reads from pages of
// `page_tokens` tokens (1, 32 or 64): ceil(length / P).
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

// The helpers below serve the host validation, the CPU backend and the CUDA
// kernels alike: `Topk` is TopkProblem or the kernels' TopkArgs, which name
// the top-k fields the same.

// Column of the logits where row `row`'s candidates start.
template <typename Topk>
DSA_HD std::int32_t topk_row_start(const Topk& t, std::int64_t row) {
  return t.row_starts != nullptr ? t.row_starts[row] : 0;
}

// A rule a row breaks (a top-k row, a key range of mqa_logits), with what
// the error record holds for it: (row, value, bound).
struct RowViolation {
  std::int32_t kind = kNoDeviceError;
  std::int64_t value = 0;
  std::int64_t bound = 0;
};

// The rule row (length, start) breaks, if any: 0 <= length <= cols, then
// 0 <= start <= cols - length, then, with a block table, its
// ceil(length / page_size) columns within the table's max_blocks.
template <typename Topk>
DSA_HD RowViolation topk_row_violation(const Topk& t, std::int64_t length, std::int64_t start) {
  if (length < 0) return {kNegativeLength, length, 0};
  if (length > t.cols) return {kLengthBeyondLogits, length, t.cols};
  if (start < 0 || start > t.cols - length) return {kRowStartOutOfRange, start, t.cols - length};
  if (t.block_table != nullptr && pages_for_length(length, t.page_size) > t.max_blocks) {
    return {kLengthBeyondBlockTable, length, t.max_blocks};
  }
  return {};
}

// The request q that row `row` belongs to: with request_offsets,
// request_of_row (common/schedule_walk.hpp), -1 where no request covers it;
// otherwise row / rows_per_request.
template <typename Topk>
DSA_HD std::int64_t topk_request(const Topk& t, std::int64_t row) {
  if (t.request_offsets == nullptr) return row / t.rows_per_request;
  return request_of_row(t.request_offsets, t.requests, row);
}

// How the selected positions of a row are written: a selected position i
// (relative to the row's start) becomes
//   table_row[i / page_size] * page_size + i % page_size  with a block table,
//   i + offset                                            otherwise
// (offset: position_offsets[r], or 0). -1 padding is never transformed.
struct TopkRowOutput {
  const std::int32_t* table_row = nullptr;
  std::int32_t offset = 0;
  int page_size = 64;

  DSA_HD std::int32_t operator()(std::int32_t position) const {
    if (table_row != nullptr) {
      return static_cast<std::int32_t>(std::int64_t{table_row[position / page_size]} * page_size +
                                       position % page_size);
    }
    // Modulo 2^32, as documented for offsets that leave the int32 range.
    return static_cast<std::int32_t>(static_cast<std::uint32_t>(position) + static_cast<std::uint32_t>(offset));
  }
};

// Row `row`'s output transform; `request` (topk_request) is read only with
// a block table.
template <typename Topk>
DSA_HD TopkRowOutput topk_row_output(const Topk& t, std::int64_t row, std::int64_t request) {
  if (t.block_table != nullptr) return {t.block_table + request * t.block_table_stride, 0, t.page_size};
  return {nullptr, t.position_offsets != nullptr ? t.position_offsets[row] : 0, t.page_size};
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

// ---- mqa_logits (dsa/prefill.hpp) -------------------------------------------

// Row `row`'s key range [ks, ke) as the caller gave it.
struct KeyRange {
  std::int64_t start = 0, end = 0;
};

DSA_HD KeyRange mqa_key_range(const MqaLogitsProblem& p, std::int64_t row) {
  return {p.ks[row * p.ks_stride], p.ke[row * p.ke_stride]};
}

// The rule a key range breaks, with the error record's (row, value, bound):
// 0 <= ks <= ke, then ke <= S_kv, then (compressed) ke - ks <= max_seqlen_k.
DSA_HD RowViolation key_range_violation(const MqaLogitsProblem& p, const KeyRange& r) {
  if (r.start < 0 || r.start > r.end) return {kKeyRangeStartOutOfRange, r.start, r.end};
  if (r.end > p.num_keys) return {kKeyRangeEndBeyondKeys, r.end, p.num_keys};
  if (p.compressed && r.end - r.start > p.max_seqlen_k) {
    return {kKeyRangeBeyondColumns, r.end - r.start, p.max_seqlen_k};
  }
  return {};
}

// The key column c of a row with range r holds: c itself, or r.start + c
// when compressed.
DSA_HD std::int64_t mqa_column_key(const MqaLogitsProblem& p, const KeyRange& r, std::int64_t column) {
  return p.compressed ? r.start + column : column;
}

// The columns [first, end) of a valid row that hold scored keys.
DSA_HD KeyRange mqa_scored_columns(const MqaLogitsProblem& p, const KeyRange& r) {
  return p.compressed ? KeyRange{0, r.end - r.start} : r;
}

// Stores the logit of (row, column) of p's output.
DSA_HD void store_mqa_logit(const MqaLogitsProblem& p, std::int64_t row, std::int64_t column, float value) {
  store_logit_at(p.logits, p.logits_dtype == DType::bfloat16, row * p.logits_stride + column, value);
}

// Stores the logit of (row, position) of p's output.
DSA_HD void store_logit(const LogitsProblem& p, std::int64_t row, std::int64_t position, float value) {
  store_logit_at(p.logits, p.logits_dtype == DType::bfloat16, row * p.logits_stride + position, value);
}

}  // namespace dsa::detail
