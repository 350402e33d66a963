// Comparisons of a backend's outputs with the float64 CPU reference.
#pragma once

#include <cstdint>
#include <string>

namespace dsa_cli {

// Error of one logits element: |actual - reference| / max(|reference|, rms),
// where rms is the root mean square of the reference row's valid values, so
// that values near zero (the weighted sum over heads cancels) are judged
// against the row's scale rather than against themselves.
struct LogitsComparison {
  double max_relative_error = 0;
  std::int64_t worst_row = -1;
  std::int64_t worst_position = -1;
  std::int64_t non_finite = 0;  // NaN or infinity inside a row's valid range
  bool passed(double tolerance) const { return non_finite == 0 && max_relative_error <= tolerance; }
};

// Rows of `stride` floats; row r is valid in [0, lengths[r]).
LogitsComparison compare_logits(const float* actual, const float* reference, std::int64_t rows,
                                std::int64_t stride, const std::int32_t* lengths);

struct ByteComparison {
  std::int64_t mismatches = 0;
  std::int64_t first_mismatch = -1;
  bool passed() const { return mismatches == 0; }
};
ByteComparison compare_bytes(const void* actual, const void* reference, std::int64_t bytes);

// Top-k rows (k columns used of `index_stride`) checked against the
// reference selection and the reference logits:
//   - a row of length <= k must be 0 .. length - 1 then -1;
//   - otherwise k distinct positions in [0, length);
//   - value check: no unselected value exceeds a selected one by more than
//     2 * tolerance * row rms (the logits may differ by tolerance each);
//   - set check: positions that differ from the reference selection must be
//     near-ties, i.e. within 2 * tolerance * row rms of the reference k-th value.
struct TopkCheck {
  std::int64_t rows = 0;
  std::int64_t identical_rows = 0;       // same set as the reference
  std::int64_t near_tie_swaps = 0;       // differing positions that are near-ties
  std::int64_t unexplained_swaps = 0;    // differing positions that are not
  std::int64_t malformed_rows = 0;       // duplicates, out-of-range positions, wrong padding
  double worst_order_violation = 0;      // max(unselected - selected) / row rms, >= 0
  double allowed_violation = 0;          // 2 * tolerance
  bool passed() const {
    return malformed_rows == 0 && unexplained_swaps == 0 && worst_order_violation <= allowed_violation;
  }
};

TopkCheck check_topk(const std::int32_t* indices, const std::int32_t* reference_indices,
                     std::int64_t index_stride, const float* reference_logits,
                     std::int64_t logits_stride, const std::int32_t* lengths, std::int64_t rows, int k,
                     double tolerance);

// Number of rows whose first k indices differ as sets.
std::int64_t rows_with_different_sets(const std::int32_t* a, const std::int32_t* b,
                                      std::int64_t index_stride, std::int64_t rows, int k);

}  // namespace dsa_cli
