// The one comparison of library logits with the float64 reference, shared by
// the CPU and GPU suites (which differ only in how they read an output element,
// how wide the rounding bound is and how an untouched column looks).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/random_inputs.hpp"
#include "common/reference.hpp"

namespace dsa_test {

// Checks every column of every row of logits with row stride `stride`:
// positions below the row's length within bound(want, magnitude) of the
// reference, -inf between the length and max_context_len when `clean`, and
// columns at or past max_context_len untouched(row, column).
template <typename Read, typename Bound, typename Untouched>
::testing::AssertionResult check_logits(const Workload& w, const ReferenceLogits& ref, std::int64_t stride,
                                        bool clean, Read&& read, Bound&& bound, Untouched&& untouched) {
  int reported = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  auto fail = [&](std::int64_t r, std::int64_t p, const std::string& what) {
    if (reported++ == 0) result = ::testing::AssertionFailure();
    if (reported <= 5) result << "row " << r << " col " << p << ": " << what << "\n";
  };
  for (std::int64_t r = 0; r < w.rows(); ++r) {
    const std::int64_t length = w.context_lens[r];
    for (std::int64_t p = 0; p < stride; ++p) {
      const float got = read(r, p);
      if (p < length) {
        const double want = ref.value[r * ref.cols + p];
        const double allowed = bound(want, ref.magnitude[r * ref.cols + p]);
        if (!(std::fabs(got - want) <= allowed + 1e-30)) {
          fail(r, p, "got " + std::to_string(got) + ", want " + std::to_string(want) + " (bound " +
                         std::to_string(allowed) + ")");
        }
      } else if (p < w.max_context_len) {
        if (clean && !(std::isinf(got) && got < 0)) fail(r, p, "expected -inf, got " + std::to_string(got));
      } else if (!untouched(r, p)) {
        fail(r, p, "column past max_context_len was written: " + std::to_string(got));
      }
    }
  }
  if (reported > 5) result << "... " << reported << " mismatches in all";
  return result;
}

}  // namespace dsa_test
