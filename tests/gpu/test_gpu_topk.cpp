// CUDA top-k against the independent host reference: every value
// distribution that trips radix selection (ties, equal rows, narrow ranges,
// random low bits only, -inf and NaN, rare huge outliers over a dense
// cluster, rows that mislead a sample), short and long rows mixed in one call,
// float32 and bfloat16, sorted and unsorted output, physical slots, device-side
// length validation and bitwise repeatability.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/ragged_topk.hpp"
#include "common/reference.hpp"
#include "dsa/dsa.hpp"
#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

enum class Spread {
  uniform,
  few_values,
  all_equal,
  tiny,
  offset,
  low_bits,
  infinities_and_nans,
  // About 1 in 64 values positive, the rest +0.0, -0.0 (equal to it),
  // negative denormals and negatives: for rows of 64K positions and k = 2048
  // the k-th largest value is zero, which the CUDA scan compares as a float.
  signed_zeros,
  outliers_over_cluster,
  // Uniform values, except positions p with p % 128 < 4, which hold huge
  // (decoys_high) or hugely negative (decoys_low) distinct values: a sample of
  // a row taken at evenly spaced groups of 4 (as the CUDA selection takes it
  // for rows of 64K and 128K positions) sees only decoys and misjudges where
  // the k-th largest value lies, by too high or too low.
  decoys_high,
  decoys_low,
  // Uniform values, except positions p with (p / 4) % 512 == 0, which hold
  // large distinct values: one or two threads of the CUDA scan (as the row's
  // alignment falls) read all of them, far more candidates than their share
  // of the list holds.
  crowded_column,
};

const char* spread_name(Spread s) {
  switch (s) {
    case Spread::uniform: return "uniform";
    case Spread::few_values: return "few_values";
    case Spread::all_equal: return "all_equal";
    case Spread::tiny: return "tiny";
    case Spread::offset: return "offset";
    case Spread::low_bits: return "low_bits";
    case Spread::infinities_and_nans: return "infinities_and_nans";
    case Spread::signed_zeros: return "signed_zeros";
    case Spread::outliers_over_cluster: return "outliers_over_cluster";
    case Spread::decoys_high: return "decoys_high";
    case Spread::decoys_low: return "decoys_low";
    case Spread::crowded_column: return "crowded_column";
  }
  return "?";
}

constexpr Spread kAllSpreads[] = {Spread::uniform,     Spread::few_values,
                                  Spread::all_equal,   Spread::tiny,
                                  Spread::offset,      Spread::low_bits,
                                  Spread::infinities_and_nans, Spread::signed_zeros,
                                  Spread::outliers_over_cluster,
                                  Spread::decoys_high, Spread::decoys_low,
                                  Spread::crowded_column};

constexpr std::int64_t kDecoyPeriod = 128;
constexpr std::int64_t kDecoyRun = 4;

// Value at column `column` of a row.
float draw(Spread spread, std::int64_t column, std::mt19937& rng) {
  std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
  switch (spread) {
    case Spread::uniform: return 10.0f * unit(rng);
    case Spread::few_values: return static_cast<float>(rng() % 4);  // heavy ties
    case Spread::all_equal: return 0.25f;
    case Spread::tiny: return 1e-8f * unit(rng);
    case Spread::offset: return 100.0f + unit(rng);
    case Spread::low_bits: {  // 1.0 with only the lowest 8 mantissa bits random
      const std::uint32_t bits = 0x3f800000u | (rng() & 0xffu);
      float value;
      std::memcpy(&value, &bits, sizeof value);
      return value;
    }
    case Spread::infinities_and_nans: {
      switch (rng() % 8) {
        case 0: return -std::numeric_limits<float>::infinity();
        case 1: return std::numeric_limits<float>::quiet_NaN();
        case 2: return -std::numeric_limits<float>::quiet_NaN();
        case 3: return -0.0f;
        case 4: return 0.0f;
        case 5: return std::numeric_limits<float>::infinity();
        default: return static_cast<float>(static_cast<int>(rng() % 3) - 1);
      }
    }
    case Spread::signed_zeros: {
      if (rng() % 64 == 0) return 2.0f + unit(rng);
      switch (rng() % 4) {
        case 0: return -0.0f;
        case 1: return 0.0f;
        case 2: return -std::numeric_limits<float>::denorm_min() * static_cast<float>(1 + rng() % 4);
        default: return unit(rng) - 1.5f;
      }
    }
    case Spread::outliers_over_cluster: {
      // 1 in 40 values spread over 1e10 .. 1e30, the rest within 65536 ulps of 1.
      if (rng() % 40 == 0) return std::pow(10.0f, 10.0f + 10.0f * (unit(rng) + 1.0f));
      const std::uint32_t bits = 0x3f800000u | (rng() & 0xffffu);
      float value;
      std::memcpy(&value, &bits, sizeof value);
      return value;
    }
    case Spread::decoys_high:
    case Spread::decoys_low: {
      const float value = unit(rng);
      if (column % kDecoyPeriod >= kDecoyRun) return value;
      return (spread == Spread::decoys_high ? 1e30f : -1e30f) * (2.0f + value);
    }
    case Spread::crowded_column: {
      const float value = unit(rng);
      return (column / 4) % 512 == 0 ? 1000.0f * (2.0f + value) : value;
    }
  }
  return 0.0f;
}

// The order the selection is defined under, as a comparable value.
float ordered(float value) {
  return std::isnan(value) ? -std::numeric_limits<float>::infinity() : value;
}

struct TopkCase {
  std::int64_t cols = 0;
  std::vector<std::int32_t> lengths;
  int k = 1;
  dsa::DType dtype = dsa::DType::float32;
  bool sorted = false;
  bool physical_slots = false;
  Spread spread = Spread::uniform;
  std::uint32_t seed = 1;
};

constexpr int kRowsPerRequest = 2;
constexpr int kExtraColumns = 3;  // output columns past k that must stay untouched
constexpr std::int32_t kPoison = 0x7b7b7b7b;

// Host logits ([rows, cols], row stride `stride`; float32 values or
// bfloat16 bits) and lengths of one device call.
struct HostLogits {
  const void* data;
  dsa::DType dtype;
  std::int64_t rows, cols, stride;
  std::size_t bytes;
};

// Runs topk on device copies of the logits and lengths into a poisoned
// [rows, k + kExtraColumns] output, which it returns; options_of makes the
// options from device copies of int32 host arrays.
std::vector<std::int32_t> run_on_device(const HostLogits& host, const std::vector<std::int32_t>& lengths, int k,
                                        const std::function<dsa::TopkOptions(const Int32ViewOf&)>& options_of,
                                        dsa::Status* status, bool check_device_errors) {
  std::deque<dsa::DeviceBuffer> arrays;  // the options' tensors, alive until the call has run
  const Int32ViewOf device_array = [&arrays](const std::vector<std::int32_t>& array, std::int64_t rows,
                                             std::int64_t cols) {
    arrays.push_back(device_copy(array));
    return cols == 0 ? device_view(arrays.back(), dsa::DType::int32, {rows})
                     : device_view(arrays.back(), dsa::DType::int32, {rows, cols});
  };
  dsa::DeviceBuffer logits = device_copy(host.data, host.bytes);
  const std::int64_t out_cols = k + kExtraColumns;
  dsa::DeviceBuffer indices =
      device_filled(static_cast<std::size_t>(host.rows * out_cols) * sizeof(std::int32_t), 0x7b);
  dsa::ExecContext probe;
  probe.backend = dsa::Backend::automatic;
  GpuContext gpu(dsa::Backend::automatic, dsa::topk_workspace_bytes(host.rows, host.cols, k, probe));
  gpu.ctx.check_device_errors = check_device_errors;
  const dsa::TopkOptions options = options_of(device_array);
  *status = dsa::topk(device_view(logits, host.dtype, {host.rows, host.cols}, {host.stride, 1}),
                      device_array(lengths, host.rows, 0), k,
                      device_view(indices, dsa::DType::int32, {host.rows, out_cols}), options, gpu.ctx);
  const dsa::Status synced = gpu.sync();
  EXPECT_TRUE(synced.ok()) << synced.to_string();
  return host_copy<std::int32_t>(indices);
}

// Host inputs and the device call for one case.
class TopkRun {
 public:
  explicit TopkRun(const TopkCase& c) : c_(c) {
    rows_ = static_cast<std::int64_t>(c.lengths.size());
    stride_ = c.cols + 3;  // rows start at every alignment
    std::mt19937 rng(c.seed);
    values_.assign(static_cast<std::size_t>(rows_ * stride_), 0.0f);
    for (std::size_t i = 0; i < values_.size(); ++i) {
      values_[i] = draw(c.spread, static_cast<std::int64_t>(i) % stride_, rng);
    }
    if (c.dtype == dsa::DType::bfloat16) {
      bf16_.resize(values_.size());
      for (std::size_t i = 0; i < values_.size(); ++i) {
        bf16_[i] = bf16_encode(values_[i]);
        values_[i] = bf16_decode(bf16_[i]);
      }
    }
    max_blocks_ = std::max<std::int64_t>((c.cols + 63) / 64, 1);
    const std::int64_t requests = (rows_ + kRowsPerRequest - 1) / kRowsPerRequest;
    block_table_.resize(static_cast<std::size_t>(requests * max_blocks_));
    for (auto& entry : block_table_) entry = static_cast<std::int32_t>(rng() % 100000);
  }

  // Runs the operation on a poisoned output; returns [rows, k + kExtraColumns].
  std::vector<std::int32_t> run(dsa::Status* status, bool check_device_errors = false) const {
    const bool bf16 = c_.dtype == dsa::DType::bfloat16;
    const HostLogits logits{bf16 ? static_cast<const void*>(bf16_.data()) : values_.data(), c_.dtype, rows_,
                            c_.cols, stride_,
                            bf16 ? bf16_.size() * sizeof(std::uint16_t) : values_.size() * sizeof(float)};
    const auto options_of = [&](const Int32ViewOf& device_array) {
      dsa::TopkOptions options;
      options.sorted = c_.sorted;
      if (c_.physical_slots) {
        const std::int64_t requests = (rows_ + kRowsPerRequest - 1) / kRowsPerRequest;
        options.block_table = device_array(block_table_, requests, max_blocks_);
        options.rows_per_request = kRowsPerRequest;
      }
      return options;
    };
    return run_on_device(logits, c_.lengths, c_.k, options_of, status, check_device_errors);
  }

  // Checks every row against the reference (rows whose length is out of
  // range must be all -1).
  ::testing::AssertionResult check(const std::vector<std::int32_t>& got) const {
    const std::int64_t out_cols = c_.k + kExtraColumns;
    for (std::int64_t r = 0; r < rows_; ++r) {
      const std::int32_t* row_out = got.data() + r * out_cols;
      const std::int32_t length = c_.lengths[static_cast<std::size_t>(r)];
      std::string where = std::string(spread_name(c_.spread)) + " row " + std::to_string(r) +
                          " length " + std::to_string(length) + " k " + std::to_string(c_.k) +
                          (c_.dtype == dsa::DType::bfloat16 ? " bf16" : " fp32") +
                          (c_.sorted ? " sorted" : " unsorted");
      for (int i = c_.k; i < out_cols; ++i) {
        if (row_out[i] != kPoison) {
          return ::testing::AssertionFailure() << where << ": column " << i << " past k written";
        }
      }
      std::vector<std::int32_t> positions(row_out, row_out + c_.k);
      if (length < 0 || length > c_.cols) {
        if (std::any_of(positions.begin(), positions.end(), [](std::int32_t v) { return v != -1; })) {
          return ::testing::AssertionFailure() << where << ": invalid row not filled with -1";
        }
        continue;
      }
      const float* row_values = values_.data() + r * stride_;
      std::vector<std::int32_t> want = reference_topk(row_values, length, c_.k);
      if (c_.physical_slots) {
        // Undo the transform: slots of this row's request map back to positions.
        const std::int32_t* table = block_table_.data() + (r / kRowsPerRequest) * max_blocks_;
        for (auto& w : want) {
          if (w >= 0) w = table[w / 64] * 64 + w % 64;
        }
      }
      const bool exact_order = c_.sorted || length <= c_.k;
      if (!exact_order) {
        std::sort(positions.begin(), positions.end());
        std::sort(want.begin(), want.end());
      }
      if (positions != want) {
        std::size_t first = 0;
        while (first < want.size() && positions[first] == want[first]) ++first;
        return ::testing::AssertionFailure()
               << where << ": index " << first << " is " << positions[first] << ", want "
               << want[first];
      }
      if (!c_.physical_slots && length > c_.k) {
        // Every selected value ranks at least as high as every other one.
        std::vector<bool> chosen(static_cast<std::size_t>(length), false);
        float lowest_chosen = std::numeric_limits<float>::infinity();
        for (std::int32_t p : positions) {
          chosen[static_cast<std::size_t>(p)] = true;
          lowest_chosen = std::min(lowest_chosen, ordered(row_values[p]));
        }
        for (std::int32_t p = 0; p < length; ++p) {
          if (!chosen[static_cast<std::size_t>(p)] && ordered(row_values[p]) > lowest_chosen) {
            return ::testing::AssertionFailure()
                   << where << ": unselected position " << p << " beats a selected one";
          }
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  TopkCase c_;
  std::int64_t rows_ = 0, stride_ = 0, max_blocks_ = 0;
  std::vector<float> values_;
  std::vector<std::uint16_t> bf16_;
  std::vector<std::int32_t> block_table_;
};

void expect_matches_reference(const TopkCase& c) {
  const TopkRun run(c);
  dsa::Status status;
  const std::vector<std::int32_t> got = run.run(&status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(run.check(got));
}

// Lengths around k and long rows, all in one call.
std::vector<std::int32_t> edge_lengths(int k, std::int32_t longest) {
  std::vector<std::int32_t> lengths = {0, 1, k - 1, k, k + 1};
  for (std::int32_t length : {65536, 131072, 262144}) {
    if (length <= longest) lengths.push_back(length);
  }
  return lengths;
}

TEST(GpuTopk, EveryDistributionAndEdgeLengthFloat32) {
  DSA_REQUIRE_GPU();
  std::uint32_t seed = 1;
  for (int k : {1, 100, 2048}) {
    for (Spread spread : kAllSpreads) {
      for (bool sorted : {false, true}) {
        TopkCase c;
        c.cols = 262144;
        c.lengths = edge_lengths(k, 262144);
        c.k = k;
        c.sorted = sorted;
        c.spread = spread;
        c.seed = seed++;
        SCOPED_TRACE(std::string(spread_name(spread)) + " k=" + std::to_string(k));
        expect_matches_reference(c);
      }
    }
  }
}

TEST(GpuTopk, EveryDistributionBfloat16) {
  DSA_REQUIRE_GPU();
  std::uint32_t seed = 100;
  for (int k : {1, 100, 2048}) {
    for (Spread spread : kAllSpreads) {
      for (bool sorted : {false, true}) {
        TopkCase c;
        c.cols = 70000;
        c.lengths = edge_lengths(k, 70000);
        c.lengths.push_back(70000);
        c.k = k;
        c.dtype = dsa::DType::bfloat16;
        c.sorted = sorted;
        c.spread = spread;
        c.seed = seed++;
        SCOPED_TRACE(std::string(spread_name(spread)) + " k=" + std::to_string(k));
        expect_matches_reference(c);
      }
    }
  }
}

// Long rows beyond one wave of CTAs are taken longest first: 1000 rows up to
// 54K long (many of equal length, ordered in two passes); more rows than that
// order covers (5000) included.
TEST(GpuTopk, ManyRowsOfVaryingLength) {
  DSA_REQUIRE_GPU();
  std::mt19937 rng(5);
  for (std::int64_t rows : {1, 7, 512, 1000, 4096, 5000}) {
    const std::int64_t cols = rows >= 4096 ? 3000 : rows == 1000 ? 54000 : 24000;
    TopkCase c;
    c.cols = cols;
    std::uniform_int_distribution<std::int32_t> length(0, static_cast<std::int32_t>(cols));
    for (std::int64_t r = 0; r < rows; ++r) {
      c.lengths.push_back(rows == 1000 ? length(rng) / 6000 * 6000 : length(rng));
    }
    c.k = 2048;
    c.spread = rows == 512 ? Spread::few_values : Spread::uniform;
    c.dtype = rows == 4096 ? dsa::DType::bfloat16 : dsa::DType::float32;
    c.seed = static_cast<std::uint32_t>(rows);
    SCOPED_TRACE("rows=" + std::to_string(rows));
    expect_matches_reference(c);
  }
}

// Runs the case `repeats` more times and expects the output of the first run
// every time, bit for bit.
void expect_bitwise_repeatable(const TopkCase& c, int repeats) {
  const TopkRun run(c);
  dsa::Status status;
  const std::vector<std::int32_t> first = run.run(&status);
  ASSERT_TRUE(status.ok()) << status.to_string();
  for (int repeat = 0; repeat < repeats; ++repeat) {
    const std::vector<std::int32_t> again = run.run(&status);
    ASSERT_TRUE(status.ok()) << status.to_string();
    EXPECT_EQ(first, again) << "run " << repeat + 1;
  }
}

// Enough rows for one CTA per row: threads whose share of the row holds many
// winners, on the path where a CTA's own list order is the output order.
TEST(GpuTopk, CrowdedThreadStaysExactAndRepeatable) {
  DSA_REQUIRE_GPU();
  TopkCase c;
  c.cols = 65536;
  std::mt19937 rng(31);
  std::uniform_int_distribution<std::int32_t> length(40000, 65536);
  for (int r = 0; r < 600; ++r) c.lengths.push_back(length(rng));
  c.k = 2048;
  c.spread = Spread::crowded_column;
  c.seed = 32;
  expect_matches_reference(c);
  expect_bitwise_repeatable(c, 2);
}

TEST(GpuTopk, PhysicalSlots) {
  DSA_REQUIRE_GPU();
  for (bool sorted : {false, true}) {
    for (Spread spread : {Spread::uniform, Spread::few_values}) {
      TopkCase c;
      c.cols = 70000;
      c.lengths = {70000, 3000, 2048, 10, 65536};
      c.k = 2048;
      c.sorted = sorted;
      c.physical_slots = true;
      c.spread = spread;
      c.seed = sorted ? 7 : 8;
      expect_matches_reference(c);
    }
  }
}

// Rows far longer than the shared memory of one thread block cluster.
TEST(GpuTopk, VeryWideLogits) {
  DSA_REQUIRE_GPU();
  for (Spread spread : {Spread::uniform, Spread::few_values, Spread::infinities_and_nans}) {
    TopkCase c;
    c.cols = 600000;
    c.lengths = {600000, 300001, 2000};
    c.k = 2048;
    c.sorted = spread == Spread::few_values;
    c.spread = spread;
    c.seed = 11;
    expect_matches_reference(c);
  }
}

// Rows that mislead the sample the selection takes (too few candidates, or
// too many to hold) are finished by the slower exact path; rows of one call
// take both the one-CTA-per-row kernel (many rows) and the cluster kernel
// (few rows).
TEST(GpuTopk, RowsThatMisleadTheSampleStayExact) {
  DSA_REQUIRE_GPU();
  std::uint32_t seed = 200;
  for (Spread spread : {Spread::decoys_high, Spread::decoys_low}) {
    for (const std::int64_t rows : {2, 300}) {
      for (int k : {100, 2048}) {
        TopkCase c;
        c.cols = rows == 2 ? 131072 : 65536;
        c.lengths.assign(static_cast<std::size_t>(rows), static_cast<std::int32_t>(c.cols));
        c.lengths[1] = 70000 < c.cols ? 70000 : c.lengths[1];
        c.k = k;
        c.sorted = k == 100;
        c.spread = spread;
        c.seed = seed++;
        SCOPED_TRACE(std::string(spread_name(spread)) + " rows=" + std::to_string(rows) +
                     " k=" + std::to_string(k));
        expect_matches_reference(c);
      }
    }
  }
}

TEST(GpuTopk, UnsortedOutputIsBitwiseRepeatable) {
  DSA_REQUIRE_GPU();
  for (Spread spread : {Spread::uniform, Spread::few_values, Spread::all_equal,
                        Spread::outliers_over_cluster, Spread::decoys_low,
                        Spread::crowded_column}) {
    TopkCase c;
    c.cols = 131072;
    c.lengths = {131072, 100000, 65536, 4097};
    c.k = 2048;
    c.spread = spread;
    c.seed = 21;
    SCOPED_TRACE(spread_name(spread));
    expect_bitwise_repeatable(c, 3);
  }
}

// Device lengths cannot be validated on the host: a length beyond the logits
// is recorded on the device, its row becomes -1, the others are still exact.
TEST(GpuTopk, LengthBeyondLogitsIsReportedFromTheDevice) {
  DSA_REQUIRE_GPU();
  TopkCase c;
  c.cols = 5000;
  c.lengths = {5000, 5001, 4000};
  c.k = 100;
  c.seed = 31;
  const TopkRun run(c);
  dsa::Status status;
  const std::vector<std::int32_t> got = run.run(&status, /*check_device_errors=*/true);
  EXPECT_EQ(status.code(), dsa::ErrorCode::length_out_of_range) << status.to_string();
  EXPECT_TRUE(run.check(got));
}

// ---- Ragged rows and output transforms (TopkOptions) ----------------------
//
// Few rows over wide logits (kClusterColumns, kClusterRows) take the cluster
// kernel on sm_90 (split_pays in topk.cu: columns beyond one CTA's candidate
// list); many rows or narrow logits take one CTA per row.

constexpr std::int64_t kClusterColumns = 200000;
constexpr std::int64_t kClusterRows = 10;

std::vector<std::int32_t> run_ragged(const RaggedTopk& t, dsa::Status* status, bool check_device_errors = false) {
  const bool bf16 = t.spec.bf16;
  const HostLogits logits{bf16 ? static_cast<const void*>(t.bf16.data()) : t.values.data(),
                          bf16 ? dsa::DType::bfloat16 : dsa::DType::float32, t.spec.rows, t.spec.cols, t.stride,
                          bf16 ? t.bf16.size() * sizeof(std::uint16_t) : t.values.size() * sizeof(float)};
  return run_on_device(logits, t.lengths, t.spec.k,
                       [&t](const Int32ViewOf& device_array) { return ragged_options(t, device_array); }, status,
                       check_device_errors);
}

// The output matches the reference, and the columns past k are untouched.
::testing::AssertionResult ragged_matches(const RaggedTopk& t, const std::vector<std::int32_t>& got) {
  const std::string mismatch = t.mismatch(got.data(), t.spec.k + kExtraColumns, kPoison);
  if (mismatch.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << mismatch;
}

void expect_ragged_matches(const RaggedTopkSpec& spec) {
  const RaggedTopk t = make_ragged_topk(spec);
  dsa::Status status;
  const std::vector<std::int32_t> got = run_ragged(t, &status, /*check_device_errors=*/true);
  ASSERT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(ragged_matches(t, got));
}

std::string ragged_trace(const RaggedOptionSet& o, const RaggedTopkSpec& spec) {
  return std::string(o.name) + " " + ragged_values_name(spec.values) + " k=" + std::to_string(spec.k) +
         (spec.bf16 ? " bf16" : " fp32") + (spec.sorted ? " sorted" : " unsorted");
}

// Every option combination, value distribution, k, dtype and order; rows
// of up to a few thousand positions, one CTA each.
TEST(GpuTopkRagged, EveryOptionOneCtaPerRow) {
  DSA_REQUIRE_GPU();
  std::uint64_t seed = 1000;
  for (const RaggedOptionSet& o : ragged_option_sets()) {
    for (RaggedValues values : {RaggedValues::normal, RaggedValues::few_values, RaggedValues::specials}) {
      for (int k : {1, 7, 2048}) {
        for (bool bf16 : {false, true}) {
          for (bool sorted : {false, true}) {
            const RaggedTopkSpec spec = short_rows_spec(k, values, bf16, sorted, seed++);
            SCOPED_TRACE(ragged_trace(o, spec));
            expect_ragged_matches(o.applied_to(spec));
          }
        }
      }
    }
  }
}

// Long rows at misaligned starts, more rows than one wave of CTAs (the
// second wave takes them longest first).
TEST(GpuTopkRagged, LongRowsOneCtaPerRow) {
  DSA_REQUIRE_GPU();
  const std::vector<RaggedOptionSet>& sets = ragged_option_sets();
  for (const RaggedOptionSet& o : {sets[1], sets[5], sets[7]}) {
    RaggedTopkSpec spec;
    spec.rows = 300;
    spec.cols = 60000;
    spec.k = 2048;
    spec.values = RaggedValues::few_values;
    spec.bf16 = o.page_size == 1;
    spec.seed = 77;
    SCOPED_TRACE(ragged_trace(o, spec));
    expect_ragged_matches(o.applied_to(spec));
  }
}

// Every option combination on rows split over a cluster of CTAs.
TEST(GpuTopkRagged, EveryOptionOnClusters) {
  DSA_REQUIRE_GPU();
  std::uint64_t seed = 2000;
  for (const RaggedOptionSet& o : ragged_option_sets()) {
    for (int variant = 0; variant < 3; ++variant) {
      RaggedTopkSpec spec;
      spec.rows = kClusterRows;
      spec.cols = kClusterColumns;
      spec.values = variant == 0 ? RaggedValues::normal : variant == 1 ? RaggedValues::few_values
                                                                       : RaggedValues::specials;
      spec.k = variant == 1 ? 7 : 2048;
      spec.bf16 = variant == 1;
      spec.sorted = variant != 0;
      spec.seed = seed++;
      SCOPED_TRACE(ragged_trace(o, spec));
      expect_ragged_matches(o.applied_to(spec));
    }
  }
}

// A ragged problem on either kernel: narrow logits over many rows, or wide
// ones over a few.
RaggedTopkSpec ragged_spec(bool clusters, const RaggedOptionSet& o, std::uint64_t seed) {
  RaggedTopkSpec spec;
  spec.rows = clusters ? kClusterRows : 24;
  spec.cols = clusters ? kClusterColumns : 5000;
  spec.k = 100;
  spec.seed = seed;
  return o.applied_to(spec);
}

// Runs t, some of whose rows break a rule only the device can check, and
// expects the violation's status (naming `argument`), those rows -1 and the
// others exact.
void expect_reported_from_the_device(const RaggedTopk& t, dsa::ErrorCode code, const char* argument) {
  dsa::Status status;
  const std::vector<std::int32_t> got = run_ragged(t, &status, /*check_device_errors=*/true);
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_NE(status.message().find(argument), std::string::npos) << status.to_string();
  EXPECT_TRUE(ragged_matches(t, got));
}

// A start past the columns its length leaves, or a negative one.
TEST(GpuTopkRagged, StartOutsideTheColumnsIsReportedFromTheDevice) {
  DSA_REQUIRE_GPU();
  for (bool clusters : {false, true}) {
    SCOPED_TRACE(clusters ? "clusters" : "one CTA per row");
    RaggedTopk t = make_ragged_topk(ragged_spec(clusters, ragged_option_sets()[1], 41));
    t.row_starts[2] = static_cast<std::int32_t>(t.spec.cols - t.lengths[2] + 1);
    t.row_starts[6] = -1;
    expect_reported_from_the_device(t, dsa::ErrorCode::length_out_of_range, "row_starts");
  }
}

// request_offsets that leave rows outside every request (the first and the
// last two).
TEST(GpuTopkRagged, RowWithoutRequestIsReportedFromTheDevice) {
  DSA_REQUIRE_GPU();
  for (bool clusters : {false, true}) {
    SCOPED_TRACE(clusters ? "clusters" : "one CTA per row");
    RaggedTopk t = make_ragged_topk(ragged_spec(clusters, ragged_option_sets()[6], 43));
    const auto last = static_cast<std::int32_t>(t.spec.rows - 2);
    for (std::int32_t& entry : t.request_offsets) entry = std::clamp(entry, 1, last);
    expect_reported_from_the_device(t, dsa::ErrorCode::invalid_argument, "request_offsets");
  }
}

// A block table too narrow for the longer rows at their page size (32, then
// 1 with request_offsets): those rows are recorded and -1.
TEST(GpuTopkRagged, TableTooNarrowForThePageSizeIsReportedFromTheDevice) {
  DSA_REQUIRE_GPU();
  for (bool clusters : {false, true}) {
    for (const RaggedOptionSet& o : {ragged_option_sets()[4], ragged_option_sets()[5]}) {
      SCOPED_TRACE(std::string(o.name) + (clusters ? " clusters" : " one CTA per row"));
      RaggedTopk t = make_ragged_topk(ragged_spec(clusters, o, 45));
      const std::int64_t columns = (t.spec.cols / 2) / o.page_size;  // rows beyond half the width need more
      std::vector<std::int32_t> narrow;
      for (std::int64_t q = 0; q < t.table_rows; ++q) {
        const auto row = t.block_table.begin() + q * t.max_blocks;
        narrow.insert(narrow.end(), row, row + columns);
      }
      t.block_table = narrow;
      t.max_blocks = columns;
      expect_reported_from_the_device(t, dsa::ErrorCode::length_out_of_range, "block_table");
    }
  }
}

TEST(GpuTopkRagged, BitwiseRepeatable) {
  DSA_REQUIRE_GPU();
  for (bool clusters : {false, true}) {
    for (const RaggedOptionSet& o : {ragged_option_sets()[1], ragged_option_sets()[5]}) {
      RaggedTopkSpec spec = ragged_spec(clusters, o, 47);
      spec.k = 2048;
      spec.values = RaggedValues::few_values;
      SCOPED_TRACE(ragged_trace(o, spec) + (clusters ? " clusters" : ""));
      const RaggedTopk t = make_ragged_topk(spec);
      dsa::Status status;
      const std::vector<std::int32_t> first = run_ragged(t, &status);
      ASSERT_TRUE(status.ok()) << status.to_string();
      EXPECT_TRUE(ragged_matches(t, first));
      for (int repeat = 0; repeat < 2; ++repeat) {
        EXPECT_EQ(first, run_ragged(t, &status)) << "run " << repeat + 1;
      }
    }
  }
}

}  // namespace
}  // namespace dsa_test::gpu
