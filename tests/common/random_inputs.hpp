// Random, fully host-side problem instances for the test suites: every input
// of the scoring and selection operations, built with the naive reference
// (reference.hpp) rather than the library, plus TensorViews of them.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "common/reference.hpp"
#include "dsa/tensor.hpp"

namespace dsa_test {

enum class LengthConvention { causal, expanded, legacy };

struct WorkloadSpec {
  std::int64_t batch = 2;
  int next_n = 1;
  int heads = 64;
  int head_dim = 128;
  LengthConvention convention = LengthConvention::causal;
  // Committed prefix of each request, drawn uniformly from [min_prefix,
  // max_prefix] unless `prefix_lens` gives them (size batch). With the legacy
  // convention these are the 1-D lengths.
  std::vector<std::int32_t> prefix_lens{};
  std::int32_t min_prefix = 0;
  std::int32_t max_prefix = 300;
  // When given (size batch * next_n), the 2-D context lengths as they are,
  // whatever the convention; they also serve as the top-k lengths.
  std::vector<std::int32_t> context_lens{};
  // max_context_len = longest context length + this.
  std::int64_t extra_context = 5;
  // Later requests share their first pages with the request before them.
  bool share_pages = false;
  // Pages no request uses (filled with random bytes).
  std::int64_t extra_pages = 3;
  // Block-table columns past the longest request's pages; every entry past a
  // request's needed pages holds `block_table_padding`.
  std::int64_t padding_columns = 2;
  std::int32_t block_table_padding = -1;
  // Tokens per cache page P (32 or 64).
  int page_tokens = 64;
  // Bytes between pages beyond the minimum P * (D + 4); a multiple of 16.
  std::int64_t page_padding_bytes = 0;
  bool power_of_two_scales = false;
  // Every third token's cached scale negated, as in a cache the library did
  // not write: max(0, scale * dot) then keeps the negative dot products.
  bool negative_scales = false;
  // Every key and query element quantizes to the largest fp8 magnitude
  // (448): keys positive, each query head of one sign (alternating by
  // head), so every dot product is +-128 * 448^2, the largest the format
  // allows, and every position of a row scores alike.
  bool extreme_products = false;
  std::uint64_t seed = 1;
};

// A contiguous host buffer with a view of it; move-only so the view never dangles.
struct OwnedView {
  std::vector<std::uint8_t> bytes;
  dsa::TensorView view;

  OwnedView() = default;
  OwnedView(OwnedView&&) = default;
  OwnedView& operator=(OwnedView&&) = default;
  OwnedView(const OwnedView&) = delete;
  OwnedView& operator=(const OwnedView&) = delete;
};

struct Workload {
  std::int64_t batch = 0;
  int next_n = 1, heads = 0, head_dim = 0;
  LengthConvention convention = LengthConvention::causal;

  std::vector<std::int32_t> prefix_lens;   // [B] (the 1-D lengths for legacy)
  std::vector<std::int32_t> context_lens;  // [B * next_n] in the chosen convention
  std::vector<std::int32_t> causal_lens;   // [B * next_n] causal lengths (top-k lengths)
  std::int64_t max_context_len = 0;

  std::int64_t max_blocks = 0;
  std::vector<std::int32_t> block_table;  // [B, max_blocks]

  CacheGeometry geometry;
  std::vector<std::uint8_t> cache;  // geometry.bytes()

  std::vector<float> q;                // [B, next_n, H, D] before quantization
  std::vector<float> head_gate;        // [B * next_n, H]
  std::vector<std::uint8_t> q_fp8;     // [B, next_n, H, D]
  std::vector<float> weights;          // [B * next_n, H]

  std::int64_t rows() const { return batch * next_n; }
  // Pages request b needs: ceil(max_j L[b, j] / P).
  std::int64_t needed_pages(std::int64_t b) const;
  LogitsInputs logits_inputs() const;
  ReferenceLogits reference() const { return reference_logits(logits_inputs(), max_context_len); }

  // Views of the members (host memory, contiguous unless stated).
  dsa::TensorView q_fp8_view();
  dsa::TensorView weights_view();
  dsa::TensorView context_lens_view();  // [B, next_n]
  dsa::TensorView causal_lens_view();   // [B * next_n]
  dsa::TensorView block_table_view();
  // [num_pages, P * (D + 4)] with strides [page_stride, 1] (the page size
  // is the calls' page_size option).
  dsa::TensorView cache_view_2d();
  // [num_pages, P, 1, D + 4] with strides [page_stride, D + 4, D + 4, 1].
  dsa::TensorView cache_view_4d();

  // q_fp8 copied with `pad_bytes` extra bytes after every head vector.
  OwnedView strided_q_fp8(std::int64_t pad_bytes) const;
};

Workload make_workload(const WorkloadSpec& spec);

// Requests of uneven row counts (request_offsets): request b owns
// rows_per_request[b] consecutive rows (0 for an empty request).
struct VarlenSpec {
  std::vector<int> rows_per_request;
  int heads = 16;
  int head_dim = 128;
  // Causal lengths prefix_b + t + 1 (prefix_b in [0, max_prefix]); otherwise
  // every row's length is drawn from [0, max_prefix] in any order, and the
  // request's last row is the longest.
  bool causal = true;
  std::int32_t max_prefix = 300;
  int page_tokens = 64;
  std::uint64_t seed = 1;
};

// The rows as a Workload of T requests of one row (queries, weights, lengths,
// cache), plus the request structure: request b reads block-table row b of
// `table`, the row make_workload built for its longest row.
struct VarlenWorkload {
  Workload rows;
  std::int64_t requests = 0;
  std::vector<std::int32_t> request_offsets;  // [B + 1]
  std::vector<std::int32_t> row_request;      // [T]: the request of each row
  std::vector<std::int32_t> table;            // [B, rows.max_blocks]

  std::int64_t total_rows() const { return rows.batch; }
  dsa::TensorView request_offsets_view();
  dsa::TensorView table_view();
  dsa::TensorView q_view_3d();          // [T, H, D]
  dsa::TensorView row_lengths_view();   // [T]
  ReferenceLogits reference() const;
};

VarlenWorkload make_varlen_workload(const VarlenSpec& spec);

// Appends every case of `cases` again on 32-token pages, named "p32_" and
// its own name, with another seed. A case has a `name` and a WorkloadSpec `spec`.
template <typename Case>
void repeat_on_32_token_pages(std::vector<Case>& cases) {
  const std::size_t count = cases.size();
  for (std::size_t i = 0; i < count; ++i) {
    Case c = cases[i];
    c.name = "p32_" + c.name;
    c.spec.page_tokens = 32;
    c.spec.seed += 1000;
    cases.push_back(c);
  }
}

// ---- Smaller random helpers ------------------------------------------------

using Rng = std::mt19937_64;

// A key or query vector: normal values times a random magnitude in
// [1e-3, 1e2] (log-uniform), with occasional exact zeros and outliers.
void random_vector(Rng& rng, float* out, int n);

// [rows, cols] buffers with the given row stride, every element (padding
// included) set to `fill`.
OwnedView float_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride, float fill);
OwnedView bf16_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                      std::uint16_t fill);
OwnedView int32_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                       std::int32_t fill);

// Contiguous views of host vectors (no copy).
dsa::TensorView view_of(std::vector<std::int32_t>& v, std::initializer_list<std::int64_t> shape);
dsa::TensorView view_of(std::vector<float>& v, std::initializer_list<std::int64_t> shape);

}  // namespace dsa_test
