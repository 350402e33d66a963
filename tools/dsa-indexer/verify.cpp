#include "verify.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace dsa_cli {
namespace {

double row_rms(const float* row, std::int64_t length) {
  double sum = 0;
  std::int64_t count = 0;
  for (std::int64_t p = 0; p < length; ++p) {
    if (std::isfinite(row[p])) {
      sum += static_cast<double>(row[p]) * row[p];
      ++count;
    }
  }
  const double rms = count > 0 ? std::sqrt(sum / static_cast<double>(count)) : 0.0;
  return rms > 0 ? rms : 1.0;
}

// Value with NaN as -inf (the top-k order).
double ordered(float value) {
  return std::isnan(value) ? -std::numeric_limits<double>::infinity() : static_cast<double>(value);
}

std::vector<std::int32_t> sorted_row(const std::int32_t* row, int k) {
  std::vector<std::int32_t> values(row, row + k);
  std::sort(values.begin(), values.end());
  return values;
}

}  // namespace

LogitsComparison compare_logits(const float* actual, const float* reference, std::int64_t rows,
                                std::int64_t stride, const std::int32_t* lengths) {
  LogitsComparison result;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* got = actual + r * stride;
    const float* want = reference + r * stride;
    const std::int64_t length = lengths[r];
    const double rms = row_rms(want, length);
    for (std::int64_t p = 0; p < length; ++p) {
      if (!std::isfinite(got[p])) {
        ++result.non_finite;
        continue;
      }
      const double error = std::fabs(static_cast<double>(got[p]) - want[p]) /
                           std::max(std::fabs(static_cast<double>(want[p])), rms);
      if (error > result.max_relative_error) {
        result.max_relative_error = error;
        result.worst_row = r;
        result.worst_position = p;
      }
    }
  }
  return result;
}

ByteComparison compare_bytes(const void* actual, const void* reference, std::int64_t bytes) {
  ByteComparison result;
  const auto* a = static_cast<const unsigned char*>(actual);
  const auto* b = static_cast<const unsigned char*>(reference);
  for (std::int64_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) {
      if (result.mismatches == 0) result.first_mismatch = i;
      ++result.mismatches;
    }
  }
  return result;
}

TopkCheck check_topk(const std::int32_t* indices, const std::int32_t* reference_indices,
                     std::int64_t index_stride, const float* reference_logits,
                     std::int64_t logits_stride, const std::int32_t* lengths, std::int64_t rows, int k,
                     double tolerance) {
  TopkCheck check;
  check.rows = rows;
  check.allowed_violation = 2 * tolerance;
  std::vector<char> selected;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int32_t* row = indices + r * index_stride;
    const std::int64_t length = lengths[r];
    if (length <= k) {
      bool exact = true;
      for (int i = 0; i < k; ++i) exact = exact && row[i] == (i < length ? i : -1);
      check.malformed_rows += exact ? 0 : 1;
      check.identical_rows += exact ? 1 : 0;
      continue;
    }
    selected.assign(static_cast<std::size_t>(length), 0);
    bool well_formed = true;
    for (int i = 0; i < k; ++i) {
      if (row[i] < 0 || row[i] >= length || selected[static_cast<std::size_t>(row[i])]) {
        well_formed = false;
        break;
      }
      selected[static_cast<std::size_t>(row[i])] = 1;
    }
    if (!well_formed) {
      ++check.malformed_rows;
      continue;
    }

    const float* values = reference_logits + r * logits_stride;
    const double rms = row_rms(values, length);
    double min_selected = std::numeric_limits<double>::infinity();
    double max_unselected = -std::numeric_limits<double>::infinity();
    for (std::int64_t p = 0; p < length; ++p) {
      const double value = ordered(values[p]);
      if (selected[static_cast<std::size_t>(p)]) {
        min_selected = std::min(min_selected, value);
      } else {
        max_unselected = std::max(max_unselected, value);
      }
    }
    if (max_unselected > min_selected) {
      check.worst_order_violation = std::max(check.worst_order_violation, (max_unselected - min_selected) / rms);
    }

    const std::int32_t* reference_row = reference_indices + r * index_stride;
    double threshold = std::numeric_limits<double>::infinity();  // the reference's k-th value
    for (int i = 0; i < k; ++i) threshold = std::min(threshold, ordered(values[reference_row[i]]));
    std::int64_t differing = 0;
    for (int i = 0; i < k; ++i) {
      const std::int32_t position = reference_row[i];
      if (position < 0 || position >= length) {
        ++differing;
        ++check.unexplained_swaps;
        continue;
      }
      if (selected[static_cast<std::size_t>(position)]) continue;
      ++differing;
      // The reference picked it and the backend did not: both it and the
      // backend's replacement must sit at the threshold.
      const bool near_tie = std::fabs(ordered(values[position]) - threshold) <= check.allowed_violation * rms;
      (near_tie ? check.near_tie_swaps : check.unexplained_swaps) += 1;
    }
    if (differing > 0) {
      // The backend's replacements: selected positions the reference did not pick.
      for (int i = 0; i < k; ++i) selected[static_cast<std::size_t>(row[i])] = 1;
      for (int i = 0; i < k; ++i) {
        if (reference_row[i] >= 0 && reference_row[i] < length) selected[static_cast<std::size_t>(reference_row[i])] = 0;
      }
      for (int i = 0; i < k; ++i) {
        if (!selected[static_cast<std::size_t>(row[i])]) continue;
        const bool near_tie = std::fabs(ordered(values[row[i]]) - threshold) <= check.allowed_violation * rms;
        if (!near_tie) ++check.unexplained_swaps;
      }
    } else {
      ++check.identical_rows;
    }
  }
  return check;
}

std::int64_t rows_with_different_sets(const std::int32_t* a, const std::int32_t* b,
                                      std::int64_t index_stride, std::int64_t rows, int k) {
  std::int64_t differing = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (sorted_row(a + r * index_stride, k) != sorted_row(b + r * index_stride, k)) ++differing;
  }
  return differing;
}

}  // namespace dsa_cli
