#include "common/ragged_topk.hpp"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <random>

#include "common/reference.hpp"

namespace dsa_test {
namespace {

constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();

float draw_value(RaggedValues kind, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  switch (kind) {
    case RaggedValues::normal: return normal(rng);
    case RaggedValues::few_values: return static_cast<float>(rng() % 4);
    case RaggedValues::specials: {
      constexpr float kInf = std::numeric_limits<float>::infinity();
      constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
      static constexpr float specials[] = {kNan, -kNan, -kInf, kInf, -0.0f, 0.0f};
      const std::uint64_t roll = rng() % 10;
      return roll < 6 ? specials[roll] : normal(rng);
    }
  }
  return 0.0f;
}

std::int64_t uniform(std::mt19937_64& rng, std::int64_t low, std::int64_t high) {
  return std::uniform_int_distribution<std::int64_t>(low, high)(rng);
}

// Row r's length: the lengths around k, 0, 1 and the whole width in turn,
// with random ones between.
std::int32_t draw_length(const RaggedTopkSpec& spec, std::int64_t r, std::mt19937_64& rng) {
  const std::int64_t menu[] = {0, 1, spec.k - 1, spec.k, spec.k + 1, spec.cols, -1, -1, 2 * spec.k, -1};
  std::int64_t length = menu[r % std::size(menu)];
  if (length < 0) length = uniform(rng, 0, spec.cols);
  return static_cast<std::int32_t>(std::clamp<std::int64_t>(length, 0, spec.cols));
}

// Row r's start for a row of `length`: 0, the last column the length allows
// (start + length == cols), anywhere, or anywhere but 16-byte aligned.
std::int32_t draw_start(const RaggedTopkSpec& spec, std::int64_t r, std::int32_t length, std::mt19937_64& rng) {
  const std::int64_t last = spec.cols - length;
  // Every other empty row starts past the last column.
  if (length == 0 && (r / 10) % 2 == 0) return static_cast<std::int32_t>(spec.cols);
  std::int64_t start = 0;
  switch ((r / 3) % 4) {
    case 0: start = 0; break;
    case 1: start = last; break;
    case 2: start = uniform(rng, 0, last); break;
    default: {
      start = uniform(rng, 0, last);
      if (start % 4 == 0) start = start + 1 <= last ? start + 1 : std::max<std::int64_t>(start - 1, 0);
      break;
    }
  }
  return static_cast<std::int32_t>(start);
}

// Cuts [0, rows] into uneven requests: random cut points, an empty request
// first, one in the middle and one last.
std::vector<std::int32_t> draw_request_offsets(std::int64_t rows, std::mt19937_64& rng) {
  std::vector<std::int32_t> offsets{0, 0};
  const std::int64_t cuts = uniform(rng, 0, std::max<std::int64_t>(rows / 2, 1));
  for (std::int64_t i = 0; i < cuts; ++i) offsets.push_back(static_cast<std::int32_t>(uniform(rng, 0, rows)));
  offsets.push_back(static_cast<std::int32_t>(rows / 2));
  offsets.push_back(static_cast<std::int32_t>(rows / 2));
  offsets.push_back(static_cast<std::int32_t>(rows));
  offsets.push_back(static_cast<std::int32_t>(rows));
  std::sort(offsets.begin(), offsets.end());
  return offsets;
}

}  // namespace

RaggedTopk make_ragged_topk(const RaggedTopkSpec& spec) {
  RaggedTopk t;
  t.spec = spec;
  t.stride = spec.cols + spec.stride_padding;
  std::mt19937_64 rng(spec.seed);
  t.values.resize(static_cast<std::size_t>(spec.rows * t.stride));
  for (float& v : t.values) v = draw_value(spec.values, rng);
  if (spec.bf16) {
    t.bf16.resize(t.values.size());
    for (std::size_t i = 0; i < t.values.size(); ++i) {
      t.bf16[i] = bf16_encode(t.values[i]);
      t.values[i] = bf16_decode(t.bf16[i]);
    }
  }
  for (std::int64_t r = 0; r < spec.rows; ++r) {
    t.lengths.push_back(draw_length(spec, r, rng));
    if (spec.row_starts) t.row_starts.push_back(draw_start(spec, r, t.lengths.back(), rng));
  }
  if (spec.transform == RaggedTransform::position_offsets) {
    for (std::int64_t r = 0; r < spec.rows; ++r) {
      t.position_offsets.push_back(static_cast<std::int32_t>(uniform(rng, 0, std::int64_t{1} << 30)));
    }
  }
  if (spec.transform == RaggedTransform::block_table) {
    std::int64_t requests = 0;
    if (spec.request_offsets) {
      t.request_offsets = draw_request_offsets(spec.rows, rng);
      requests = static_cast<std::int64_t>(t.request_offsets.size()) - 1;
    } else {
      requests = (spec.rows + spec.rows_per_request - 1) / spec.rows_per_request;
    }
    t.table_rows = requests + 2;
    // One column past the longest row's, holding -1: never read.
    t.max_blocks = (spec.cols + spec.page_size - 1) / spec.page_size + 1;
    t.block_table.resize(static_cast<std::size_t>(t.table_rows * t.max_blocks));
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(t.block_table.size()); ++i) {
      t.block_table[i] = i % t.max_blocks == t.max_blocks - 1
                             ? -1
                             : static_cast<std::int32_t>(uniform(rng, 0, kInt32Max / spec.page_size));
    }
  }
  return t;
}

std::vector<std::int32_t> RaggedTopk::expected_row(std::int64_t r) const {
  const std::vector<std::int32_t> refused(static_cast<std::size_t>(spec.k), -1);
  const std::int64_t length = lengths[r];
  const std::int64_t start = row_starts.empty() ? 0 : row_starts[r];
  if (length < 0 || start < 0 || start + length > spec.cols) return refused;
  std::vector<std::int32_t> out = reference_topk(values.data() + r * stride + start, length, spec.k);
  if (!position_offsets.empty()) {
    for (std::int32_t& p : out) {
      if (p >= 0) p += position_offsets[r];
    }
  }
  if (!block_table.empty()) {
    std::int64_t request = -1;
    if (request_offsets.empty()) {
      request = r / spec.rows_per_request;
    } else {
      for (std::size_t q = 0; q + 1 < request_offsets.size(); ++q) {
        if (request_offsets[q] <= r && r < request_offsets[q + 1]) request = static_cast<std::int64_t>(q);
      }
    }
    const std::int64_t page = spec.page_size;
    if (request < 0 || (length + page - 1) / page > max_blocks) return refused;
    const std::int32_t* table = block_table.data() + request * max_blocks;
    for (std::int32_t& p : out) {
      if (p >= 0) p = static_cast<std::int32_t>(table[p / page] * page + p % page);
    }
  }
  return out;
}

std::string RaggedTopk::mismatch(const std::int32_t* out, std::int64_t out_stride, std::int32_t untouched) const {
  for (std::int64_t r = 0; r < spec.rows; ++r) {
    for (std::int64_t c = spec.k; c < out_stride; ++c) {
      if (out[r * out_stride + c] != untouched) {
        return "row " + std::to_string(r) + ": column " + std::to_string(c) + " >= k was written";
      }
    }
    std::vector<std::int32_t> want = expected_row(r);
    std::vector<std::int32_t> got(out + r * out_stride, out + r * out_stride + spec.k);
    const bool refused = std::all_of(want.begin(), want.end(), [](std::int32_t v) { return v == -1; });
    if (!spec.sorted && lengths[r] > spec.k && !refused) {
      std::sort(want.begin(), want.end());
      std::sort(got.begin(), got.end());
    }
    if (got == want) continue;
    std::size_t first = 0;
    while (got[first] == want[first]) ++first;
    return "row " + std::to_string(r) + " (length " + std::to_string(lengths[r]) + ", start " +
           std::to_string(row_starts.empty() ? 0 : row_starts[r]) + ", k " + std::to_string(spec.k) +
           (spec.sorted ? ", sorted" : ", unsorted, compared as sets") + "): index " + std::to_string(first) +
           " is " + std::to_string(got[first]) + ", want " + std::to_string(want[first]);
  }
  return {};
}

RaggedTopkSpec short_rows_spec(int k, RaggedValues values, bool bf16, bool sorted, std::uint64_t seed) {
  return RaggedTopkSpec{
      .rows = 24, .cols = 3 * std::int64_t{k} + 700, .k = k, .bf16 = bf16, .sorted = sorted, .values = values, .seed = seed};
}

RaggedTopkSpec RaggedOptionSet::applied_to(RaggedTopkSpec spec) const {
  spec.row_starts = row_starts;
  spec.transform = transform;
  spec.page_size = page_size;
  spec.request_offsets = request_offsets;
  spec.rows_per_request = rows_per_request;
  return spec;
}

const std::vector<RaggedOptionSet>& ragged_option_sets() {
  static const std::vector<RaggedOptionSet> sets{
      {"starts", true, RaggedTransform::none, 64, false, 1},
      {"starts_offsets", true, RaggedTransform::position_offsets, 64, false, 1},
      {"offsets", false, RaggedTransform::position_offsets, 64, false, 1},
      {"starts_page64", true, RaggedTransform::block_table, 64, false, 1},
      {"starts_page32_three_rows_per_request", true, RaggedTransform::block_table, 32, false, 3},
      {"starts_page1_request_offsets", true, RaggedTransform::block_table, 1, true, 1},
      {"starts_page64_request_offsets", true, RaggedTransform::block_table, 64, true, 1},
      {"page32_request_offsets", false, RaggedTransform::block_table, 32, true, 1},
  };
  return sets;
}

const char* ragged_values_name(RaggedValues values) {
  static constexpr const char* kNames[] = {"normal", "few_values", "specials"};  // in RaggedValues order
  return kNames[static_cast<int>(values)];
}

dsa::TopkOptions ragged_options(const RaggedTopk& t, const Int32ViewOf& view_of) {
  dsa::TopkOptions options;
  options.sorted = t.spec.sorted;
  options.page_size = t.spec.page_size;
  const std::int64_t rows = t.spec.rows;
  if (!t.row_starts.empty()) options.row_starts = view_of(t.row_starts, rows, 0);
  if (!t.position_offsets.empty()) options.position_offsets = view_of(t.position_offsets, rows, 0);
  if (!t.block_table.empty()) options.block_table = view_of(t.block_table, t.table_rows, t.max_blocks);
  if (!t.request_offsets.empty()) {
    options.request_offsets = view_of(t.request_offsets, static_cast<std::int64_t>(t.request_offsets.size()), 0);
  } else if (!t.block_table.empty()) {
    options.rows_per_request = t.spec.rows_per_request;
  }
  return options;
}

}  // namespace dsa_test
