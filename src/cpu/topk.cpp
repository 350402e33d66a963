#include <algorithm>
#include <array>
#include <limits>
#include <vector>

#include "backend.hpp"
#include "common/logit_rules.hpp"
#include "common/number_formats.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "dsa/cache.hpp"
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

// The k-th largest of keys[0, length) (length > k >= 1) as a radix select:
// three passes fix its top 11, next 11 and last 10 bits. After each pass
// only the keys that agree with the bits fixed so far stay candidates
// (copied into `pool`). Returns that key and, in *ties_taken, how many keys
// equal to it belong to the top k (the others are all larger).
std::uint32_t kth_largest(const std::uint32_t* keys, std::int64_t length, int k, std::vector<std::uint32_t>* pool,
                          std::int64_t* ties_taken) {
  struct Digit {
    int shift;
    int bits;
  };
  constexpr Digit kDigits[] = {{21, 11}, {10, 11}, {0, 10}};
  std::array<std::int64_t, std::size_t{1} << 11> counts;
  const std::uint32_t* candidates = keys;
  std::int64_t count = length;
  std::uint32_t kth = 0;
  std::int64_t remaining = k;  // rank wanted among the candidates
  for (const Digit digit : kDigits) {
    const std::uint32_t digit_mask = (1u << digit.bits) - 1u;
    std::fill(counts.begin(), counts.begin() + (std::ptrdiff_t{1} << digit.bits), 0);
    for (std::int64_t i = 0; i < count; ++i) ++counts[(candidates[i] >> digit.shift) & digit_mask];
    std::uint32_t value = digit_mask;
    while (counts[value] < remaining) remaining -= counts[value--];  // from the largest digit down
    kth |= value << digit.shift;
    if (digit.shift == 0) break;
    // Keep the candidates with this digit, branch-free: every key is written
    // at `next`, which advances past kept ones only (one slot spare). In
    // place once the candidates are in the pool (next never passes i), and
    // the pool only shrinks then.
    pool->resize(static_cast<std::size_t>(counts[value]) + 1);
    std::uint32_t* kept = pool->data();
    std::int64_t next = 0;
    for (std::int64_t i = 0; i < count; ++i) {
      kept[next] = candidates[i];
      next += ((candidates[i] >> digit.shift) & digit_mask) == value;
    }
    candidates = kept;
    count = next;
  }
  *ties_taken = remaining;
  return kth;
}

}  // namespace

// The winners are the keys above the k-th largest and, of the keys equal to
// it, the first ones by position (the contract's tie rule).
void select_row(const float* values, std::int64_t length, int k, bool sorted, SelectScratch* scratch,
                std::int32_t* out) {
  if (length <= k) {
    for (int i = 0; i < k; ++i) out[i] = i < length ? i : -1;
    return;
  }
  scratch->keys.resize(static_cast<std::size_t>(length));
  std::uint32_t* keys = scratch->keys.data();
  for (std::int64_t position = 0; position < length; ++position) keys[position] = order_key(values[position]);
  std::int64_t ties_left = 0;
  const std::uint32_t threshold = kth_largest(keys, length, k, &scratch->pool, &ties_left);
  // Branch-free: every position is written at `taken`, which advances for
  // winners only; the slot past the last winner catches the rest.
  scratch->winners.resize(static_cast<std::size_t>(k) + 1);
  std::int32_t* winners = scratch->winners.data();
  std::int64_t taken = 0;
  for (std::int64_t position = 0; position < length; ++position) {
    const bool tie = keys[position] == threshold;
    winners[taken] = static_cast<std::int32_t>(position);
    taken += (keys[position] > threshold) | (tie & (ties_left > 0));
    ties_left -= tie;
  }
  std::copy(winners, winners + k, out);
  if (sorted) {  // larger value first, then smaller position; unsorted output stays in position order
    std::sort(out, out + k, [keys](std::int32_t a, std::int32_t b) {
      return keys[a] != keys[b] ? keys[a] > keys[b] : a < b;
    });
  }
}

namespace {

// Rewrites a row's selected positions (not the -1 padding) as `output` says.
void transform_positions(const TopkRowOutput& output, int k, std::int32_t* out) {
  for (int i = 0; i < k; ++i) {
    if (out[i] >= 0) out[i] = output(out[i]);
  }
}

}  // namespace

void positions_to_slots(const std::int32_t* table_row, int page_size, int k, std::int32_t* out) {
  transform_positions(TopkRowOutput{table_row, 0, page_size}, k, out);
}

Status topk(const TopkProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_topk_data(p));
  struct RowScratch {
    std::vector<float> values;  // a bfloat16 row widened to float
    SelectScratch select;
  };
  std::vector<RowScratch> scratch(static_cast<std::size_t>(parallel ? thread_count(ctx) : 1));
  const auto select = [&](std::int64_t row, int thread) {
    RowScratch& s = scratch[static_cast<std::size_t>(thread)];
    const std::int64_t length = p.lengths[row * p.lengths_stride];
    const std::int64_t first = row * p.logits_stride + topk_row_start(p, row);
    const float* values = nullptr;
    if (p.logits_dtype == DType::bfloat16) {
      const std::uint16_t* source = static_cast<const std::uint16_t*>(p.logits) + first;
      s.values.resize(static_cast<std::size_t>(length));
      for (std::int64_t i = 0; i < length; ++i) s.values[static_cast<std::size_t>(i)] = bf16_to_float(source[i]);
      values = s.values.data();
    } else {
      values = static_cast<const float*>(p.logits) + first;
    }
    std::int32_t* out = p.indices + row * p.indices_stride;
    select_row(values, length, p.k, p.sorted, &s.select, out);
    if (p.block_table != nullptr || p.position_offsets != nullptr) {
      // check_topk_data has found every row in a request.
      const std::int64_t request = p.block_table != nullptr ? topk_request(p, row) : 0;
      transform_positions(topk_row_output(p, row, request), p.k, out);
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
