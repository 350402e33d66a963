// Random mqa_logits (prefill) instances for the CPU and GPU suites, built
// with the naive reference (reference.hpp), and the one comparison of an
// output with the float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <cstdint>
#include <string>
#include <vector>

#include "common/random_inputs.hpp"
#include "common/reference.hpp"
#include "dsa/prefill.hpp"
#include "dsa/tensor.hpp"

namespace dsa_test {

enum class RangeShape {
  causal,            // ks = 0, ke = S_kv - S + i + 1 (new tokens after a prefix)
  random,            // 0 <= ks <= ke <= S_kv drawn at random, some empty
  context_parallel,  // first half of the rows within [0, S_kv / 2), second half within [S_kv / 2, S_kv)
  given,             // spec.ks and spec.ke
};

struct MqaSpec {
  std::int64_t rows = 17;  // S
  int heads = 64;
  int head_dim = 128;
  std::int64_t num_keys = 300;  // S_kv
  RangeShape ranges = RangeShape::causal;
  std::vector<std::int32_t> ks{}, ke{};  // with RangeShape::given
  std::uint64_t seed = 1;
};

struct MqaWorkload {
  std::int64_t rows = 0, num_keys = 0;
  int heads = 0, head_dim = 0;
  std::vector<std::uint8_t> q_fp8;   // [S, H, D]
  std::vector<float> weights;        // [S, H]
  std::vector<std::uint8_t> keys;    // [S_kv, D]
  std::vector<float> key_scales;     // [S_kv]
  std::vector<std::int32_t> ks, ke;  // [S]

  // The longest range, ke - ks (the least max_seqlen_k of the compressed form).
  std::int64_t longest_range() const;
  MqaInputs inputs() const;
  ReferenceLogits reference() const { return reference_mqa_logits(inputs()); }

  // q_fp8 with `pad_bytes` more bytes after every head vector, holding NaN
  // codes (so that reading them would show): [S, H, D + pad_bytes] bytes.
  std::vector<std::uint8_t> padded_q(std::int64_t pad_bytes) const;

  // Contiguous host views.
  dsa::TensorView q_view();
  dsa::TensorView weights_view();
  dsa::TensorView keys_view();
  dsa::TensorView key_scales_view();
  dsa::TensorView ks_view();
  dsa::TensorView ke_view();
};

MqaWorkload make_mqa_workload(const MqaSpec& spec);

// One mqa_logits call of the CPU and GPU suites' case lists.
struct PrefillCase {
  std::string name;
  MqaSpec spec;
  bool compressed = false;
  bool clean = true;
  bool bf16_out = false;
  bool float64 = false;
  std::int64_t extra_width = 0;   // compressed: max_seqlen_k = longest range + this
  std::int64_t extra_columns = 0;  // N = width + this
  std::int64_t extra_stride = 0;   // row stride = N + this
  std::int64_t q_pad_bytes = 0;    // extra bytes after every q head vector
};

// The output of a case on a workload: `width` defined columns (S_kv, or
// max_seqlen_k), `cols` columns, rows `stride` elements apart; the options.
struct PrefillLayout {
  std::int64_t width = 0, cols = 0, stride = 0;
  dsa::MqaLogitsOptions options;
};
PrefillLayout prefill_layout(const PrefillCase& c, const MqaWorkload& w);

inline void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

// Head counts 1, 32, 64 and dims 32, 128 in both forms, fp32 and bf16, clean
// or not; random, context-parallel, empty, non-monotone ranges and ranges
// ending at S_kv; one row, no rows, no keys; sizes fitting no tile; strided
// q and logits.
std::vector<PrefillCase> prefill_cases();

// Checks every column [0, stride) of every row of an output of `width`
// defined columns: scored columns within bound(want, magnitude) of the
// reference; with `clean` the other columns below width -inf; columns at or
// past width untouched(row, column). Unclean unscored columns are not checked
// (unspecified).
template <typename Read, typename Bound, typename Untouched>
::testing::AssertionResult check_mqa_logits(const MqaWorkload& w, const ReferenceLogits& ref, bool compressed,
                                            std::int64_t width, std::int64_t stride, bool clean, Read&& read,
                                            Bound&& bound, Untouched&& untouched) {
  int reported = 0;
  ::testing::AssertionResult result = ::testing::AssertionSuccess();
  auto fail = [&](std::int64_t r, std::int64_t c, const std::string& what) {
    if (reported++ == 0) result = ::testing::AssertionFailure();
    if (reported <= 5) result << "row " << r << " col " << c << ": " << what << "\n";
  };
  for (std::int64_t r = 0; r < w.rows; ++r) {
    const std::int64_t offset = compressed ? w.ks[r] : 0;  // column c holds key offset + c
    for (std::int64_t c = 0; c < stride; ++c) {
      const std::int64_t key = offset + c;
      const bool scored = c < width && key >= w.ks[r] && key < w.ke[r];
      if (scored) {
        const float got = read(r, c);
        const double want = ref.value[r * ref.cols + key];
        const double allowed = bound(want, ref.magnitude[r * ref.cols + key]);
        if (!(std::fabs(got - want) <= allowed + 1e-30)) {
          fail(r, c, "key " + std::to_string(key) + ": got " + std::to_string(got) + ", want " +
                         std::to_string(want) + " (bound " + std::to_string(allowed) + ")");
        }
      } else if (c < width) {
        const float got = read(r, c);
        if (clean && !(std::isinf(got) && got < 0)) fail(r, c, "expected -inf, got " + std::to_string(got));
      } else if (!untouched(r, c)) {
        fail(r, c, "column past the defined width " + std::to_string(width) + " was written");
      }
    }
  }
  if (reported > 5) result << "... " << reported << " mismatches in all";
  return result;
}

}  // namespace dsa_test
