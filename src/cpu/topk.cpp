#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "dsa/cache.hpp"
#include "number_formats.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

// Maps a float to an unsigned key whose order is the contract's total order:
// NaN as -inf, -0.0 equal to +0.0.
std::uint32_t order_key(float value) {
  if (value != value) value = -std::numeric_limits<float>::infinity();
  if (value == 0.0f) value = 0.0f;
  const std::uint32_t bits = float_bits(value);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Larger value first, then smaller position: one 64-bit key, larger is better.
std::uint64_t rank_key(float value, std::int64_t position) {
  return (std::uint64_t{order_key(value)} << 32) | (0xFFFFFFFFu - static_cast<std::uint32_t>(position));
}

std::int32_t key_position(std::uint64_t key) {
  return static_cast<std::int32_t>(0xFFFFFFFFu - static_cast<std::uint32_t>(key & 0xFFFFFFFFu));
}

}  // namespace

void select_row(const float* values, std::int64_t length, int k, bool sorted,
                std::vector<std::uint64_t>* scratch, std::int32_t* out) {
  if (length <= k) {
    for (int i = 0; i < k; ++i) out[i] = i < length ? i : -1;
    return;
  }
  scratch->resize(static_cast<std::size_t>(length));
  for (std::int64_t position = 0; position < length; ++position) {
    (*scratch)[static_cast<std::size_t>(position)] = rank_key(values[position], position);
  }
  const auto winners_end = scratch->begin() + k;
  std::nth_element(scratch->begin(), winners_end - 1, scratch->end(), std::greater<>());
  if (sorted) {
    std::sort(scratch->begin(), winners_end, std::greater<>());
    for (int i = 0; i < k; ++i) out[i] = key_position((*scratch)[static_cast<std::size_t>(i)]);
  } else {
    // Unsorted output is still deterministic: ascending positions.
    for (int i = 0; i < k; ++i) out[i] = key_position((*scratch)[static_cast<std::size_t>(i)]);
    std::sort(out, out + k);
  }
}

void positions_to_slots(const std::int32_t* table_row, int k, std::int32_t* out) {
  for (int i = 0; i < k; ++i) {
    if (out[i] < 0) continue;
    out[i] = table_row[out[i] / kPageTokens] * kPageTokens + out[i] % kPageTokens;
  }
}

Status topk(const TopkProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_topk_data(p));
  struct RowScratch {
    std::vector<float> values;  // a bfloat16 row widened to float
    std::vector<std::uint64_t> keys;
  };
  std::vector<RowScratch> scratch(static_cast<std::size_t>(parallel ? thread_count(ctx) : 1));
  const auto select = [&](std::int64_t row, int thread) {
    RowScratch& s = scratch[static_cast<std::size_t>(thread)];
    const std::int64_t length = p.lengths[row * p.lengths_stride];
    const float* values = nullptr;
    if (p.logits_dtype == DType::bfloat16) {
      const std::uint16_t* source = static_cast<const std::uint16_t*>(p.logits) + row * p.logits_stride;
      s.values.resize(static_cast<std::size_t>(length));
      for (std::int64_t i = 0; i < length; ++i) s.values[static_cast<std::size_t>(i)] = bf16_to_float(source[i]);
      values = s.values.data();
    } else {
      values = static_cast<const float*>(p.logits) + row * p.logits_stride;
    }
    std::int32_t* out = p.indices + row * p.indices_stride;
    select_row(values, length, p.k, p.sorted, &s.keys, out);
    if (p.block_table != nullptr) {
      positions_to_slots(p.block_table + (row / p.rows_per_request) * p.block_table_stride, p.k, out);
    }
  };
  if (parallel) {
    parallel_for_items(p.rows, ctx, select);
  } else {
    for (std::int64_t row = 0; row < p.rows; ++row) select(row, 0);
  }
  return Status::success();
}

}  // namespace dsa::detail::cpu
