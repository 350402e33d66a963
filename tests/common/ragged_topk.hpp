// Random top-k problems with the ragged options of dsa::TopkOptions (row
// starts, position offsets, block tables of every page size, rows mapped to
// requests by rows_per_request or request_offsets), and the expected output
// of each row, computed from the documented semantics with reference_topk
// and plain loops (no library code). Host-only, for the CPU and GPU suites.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dsa/topk.hpp"

namespace dsa_test {

enum class RaggedValues {
  normal,
  few_values,  // four distinct values: heavy ties everywhere
  specials,    // NaN, +-inf and +-0.0 among normal values
};

enum class RaggedTransform { none, position_offsets, block_table };

struct RaggedTopkSpec {
  std::int64_t rows = 16;
  std::int64_t cols = 3000;
  std::int64_t stride_padding = 3;  // row stride = cols + this: rows start at every alignment
  int k = 64;
  bool bf16 = false;
  bool sorted = false;
  RaggedValues values = RaggedValues::normal;
  bool row_starts = true;
  RaggedTransform transform = RaggedTransform::none;
  int page_size = 64;
  // With a block table: request_offsets when true, else rows_per_request.
  bool request_offsets = false;
  int rows_per_request = 1;
  std::uint64_t seed = 1;
};

// One problem: inputs as host arrays (empty when the option is not given)
// and what each row must hold.
struct RaggedTopk {
  RaggedTopkSpec spec;
  std::int64_t stride = 0;
  std::vector<float> values;           // [rows, stride]: what the library sees (bf16 decoded)
  std::vector<std::uint16_t> bf16;     // the bfloat16 logits when spec.bf16
  std::vector<std::int32_t> lengths;   // [rows]
  std::vector<std::int32_t> row_starts;        // [rows]
  std::vector<std::int32_t> position_offsets;  // [rows]
  std::vector<std::int32_t> block_table;       // [table_rows, max_blocks]
  std::int64_t table_rows = 0, max_blocks = 0;
  std::vector<std::int32_t> request_offsets;   // [requests + 1]

  // The expected k indices of row r: -1 for a row that breaks a rule
  // (start or length outside the columns, no request covering it).
  std::vector<std::int32_t> expected_row(std::int64_t r) const;
  // Compares the output (row stride out_stride >= k) with expected_row:
  // exactly for sorted output and rows of at most k, as multisets
  // otherwise; the columns from k to the stride must still hold
  // `untouched`. Empty when all rows match, else the first difference.
  std::string mismatch(const std::int32_t* out, std::int64_t out_stride, std::int32_t untouched) const;
};

// Row lengths from 0 to cols (around k included) and starts spread over
// the columns: 0, misaligned, at the last column a length allows (start +
// length == cols), zero-length rows anywhere. request_offsets cut the rows
// into uneven requests, empty ones included; the block table holds random
// entries of a few rows more than the requests.
RaggedTopk make_ragged_topk(const RaggedTopkSpec& spec);

// The suites' problem of short rows: 24 rows over 3k + 700 columns.
RaggedTopkSpec short_rows_spec(int k, RaggedValues values, bool bf16, bool sorted, std::uint64_t seed);

// A combination of the options, as the suites run them.
struct RaggedOptionSet {
  const char* name;
  bool row_starts;
  RaggedTransform transform;
  int page_size;
  bool request_offsets;
  int rows_per_request;

  // spec with these options set.
  RaggedTopkSpec applied_to(RaggedTopkSpec spec) const;
};

// Row starts alone and with position offsets, position offsets alone, block
// tables of pages of 64, 32 (three rows per request) and 1 tokens, with
// request_offsets at every page size.
const std::vector<RaggedOptionSet>& ragged_option_sets();
const char* ragged_values_name(RaggedValues values);

// A view of an int32 array of the problem where the library is to read it
// (the host array itself, or a device copy): [rows] when cols == 0, else
// [rows, cols].
using Int32ViewOf =
    std::function<dsa::TensorView(const std::vector<std::int32_t>& array, std::int64_t rows, std::int64_t cols)>;

// t's TopkOptions (sorted and every option t holds), its tensors from view_of.
dsa::TopkOptions ragged_options(const RaggedTopk& t, const Int32ViewOf& view_of);

}  // namespace dsa_test
