// Every documented argument rule: the ErrorCode it returns and a message that
// names the operation and the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

using dsa::ErrorCode;

::testing::AssertionResult fails_with(const dsa::Status& s, ErrorCode code, const std::string& operation,
                                      const std::string& argument) {
  if (s.code() != code)
    return ::testing::AssertionFailure() << "expected " << dsa::error_code_name(code) << ", got " << s.to_string();
  if (s.message().find(operation) == std::string::npos || s.message().find(argument) == std::string::npos)
    return ::testing::AssertionFailure() << "message does not name " << operation << " and " << argument << ": "
                                         << s.message();
  return ::testing::AssertionSuccess();
}

dsa::TensorView with_shape(dsa::TensorView v, std::initializer_list<std::int64_t> shape) {
  return dsa::make_view(v.data, v.dtype, shape);
}

dsa::TensorView with_dtype(dsa::TensorView v, dsa::DType dtype) {
  v.dtype = dtype;
  return v;
}

dsa::TensorView with_data(dsa::TensorView v, void* data) {
  v.data = data;
  return v;
}

dsa::TensorView on_cuda(dsa::TensorView v) {
  v.device = dsa::Device{dsa::DeviceType::cuda, 0};
  return v;
}

// A valid scoring problem whose arguments the tests break one at a time.
class ScoringValidation : public ::testing::TestWithParam<dsa::Backend> {
 protected:
  void SetUp() override {
    ctx = cpu_context(GetParam());
    use_workload(spec_with_pages(dsa::kDefaultPageTokens));
  }

  // The valid problem's workload, on pages of `page_tokens` tokens.
  static WorkloadSpec spec_with_pages(int page_tokens) {
    return WorkloadSpec{.batch = 2, .next_n = 2, .min_prefix = 100, .max_prefix = 200, .padding_columns = 3,
                        .page_tokens = page_tokens, .seed = 8};
  }

  // Every argument from `spec`'s workload; a 2-D cache view with the page
  // size stated in the options unless it is the default 64.
  void use_workload(const WorkloadSpec& spec) {
    w = make_workload(spec);
    q = w.q_fp8_view();
    cache = w.cache_view_2d();
    weights = w.weights_view();
    lens = w.context_lens_view();
    table = w.block_table_view();
    ASSERT_TRUE(plan(w.context_lens, w.batch, w.next_n, 3, dsa::LogitsPath::native, ctx, &schedule_storage).ok());
    schedule = schedule_storage.view();
    output = float_matrix(w.rows(), w.max_context_len, w.max_context_len, 0.0f);
    logits = output.view;
    topk_lens = w.causal_lens_view();
    index_output = int32_matrix(w.rows(), 16, 16, 0);
    indices = index_output.view;
    options.path = dsa::LogitsPath::native;
    options.page_size = spec.page_tokens == dsa::kDefaultPageTokens ? 0 : spec.page_tokens;
  }

  dsa::Status call_logits() {
    return dsa::paged_mqa_logits(q, cache, weights, lens, table, schedule, max_context_len(), logits, options, ctx);
  }
  dsa::Status call_index_topk(int k = 16,
                              dsa::IndexTopkStrategy strategy = dsa::IndexTopkStrategy::automatic) {
    dsa::IndexTopkOptions o;
    o.k = k;
    o.path = dsa::LogitsPath::native;
    o.strategy = strategy;
    o.page_size = options.page_size;
    return dsa::index_topk(q, cache, weights, lens, table, schedule, max_context_len(), topk_lens, indices, o, ctx);
  }
  std::int64_t max_context_len() const { return max_context_override >= 0 ? max_context_override : w.max_context_len; }

  dsa::ExecContext ctx;
  Workload w;
  Schedule schedule_storage;
  OwnedView output, index_output;
  dsa::TensorView q, cache, weights, lens, table, schedule, logits, topk_lens, indices;
  dsa::LogitsOptions options;
  std::int64_t max_context_override = -1;
};

TEST_P(ScoringValidation, BaselineIsValid) {
  EXPECT_TRUE(call_logits().ok()) << call_logits().to_string();
  EXPECT_TRUE(call_index_topk().ok()) << call_index_topk().to_string();
}

TEST_P(ScoringValidation, QueryRules) {
  const dsa::TensorView good = q;
  q = with_dtype(good, dsa::DType::float32);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "q"));
  q = with_shape(good, {2, 2, 64 * 128});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "q"));
  q = with_shape(good, {2, 3, 64, 128});  // next_n disagrees with context_lens
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_shape);
  q = with_shape(good, {2, 2, 64, 64});  // D disagrees with the 4-D cache's D + 4
  cache = w.cache_view_4d();
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_shape);
  cache = w.cache_view_2d();
  // Room for the strided views below, so that even a wrong acceptance reads owned memory.
  std::vector<std::uint8_t> roomy(4 * w.q_fp8.size());
  q = dsa::make_view(roomy.data(), good.dtype, {2, 2, 64, 128}, {2 * 64 * 256, 64 * 256, 256, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_stride, "paged_mqa_logits", "q"));
  q = dsa::make_view(roomy.data(), good.dtype, {2, 2, 64, 128}, {2 * 64 * 136, 64 * 136, 136, 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_alignment, "paged_mqa_logits", "q"));
  q = with_data(good, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "q"));
  // Extents whose product wraps int64 (B * next_n would read as 0).
  q = dsa::make_view(good.data, good.dtype, {std::int64_t{1} << 62, 4, 64, 128});
  const dsa::Status wrapped = call_logits();
  EXPECT_EQ(wrapped.code(), ErrorCode::bad_shape) << wrapped.to_string();
  EXPECT_EQ(wrapped.message().rfind("paged_mqa_logits: q: ", 0), 0u) << wrapped.to_string();
}

TEST_P(ScoringValidation, CacheRules) {
  const dsa::TensorView good = cache;
  const std::int64_t pages = w.geometry.num_pages, min_bytes = 64 * 132;
  cache = with_dtype(good, dsa::DType::int32);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "key_cache"));
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages, min_bytes - 16}, {min_bytes, 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages / 2, min_bytes}, {min_bytes + 8, 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_alignment, "paged_mqa_logits", "key_cache"));
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages / 2, min_bytes}, {2 * min_bytes, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_stride, "paged_mqa_logits", "key_cache"));
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages, 48, 1, 132}, {min_bytes, 132, 132, 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages, 64, 1, 100}, {min_bytes, 100, 100, 1});
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_shape);
  cache = dsa::make_view(good.data, dsa::DType::uint8, {pages, 64, 132}, {min_bytes, 132, 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  cache = with_data(good, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "key_cache"));
  cache = w.cache_view_4d();
  EXPECT_TRUE(call_logits().ok());
}

TEST_P(ScoringValidation, WeightsAndLengthsRules) {
  const dsa::TensorView good_weights = weights, good_lens = lens;
  weights = with_dtype(good_weights, dsa::DType::bfloat16);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "weights"));
  weights = with_shape(good_weights, {w.rows(), 63});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "weights"));
  weights = with_shape(good_weights, {w.rows() - 1, 64});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "weights"));
  std::vector<float> roomy(2 * w.weights.size());
  weights = dsa::make_view(roomy.data(), dsa::DType::float32, {w.rows(), 64}, {128, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_stride, "paged_mqa_logits", "weights"));
  weights = with_data(good_weights, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "weights"));
  weights = good_weights;

  lens = with_dtype(good_lens, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "context_lens"));
  lens = with_shape(good_lens, {w.batch * w.next_n});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "context_lens"));
  lens = with_data(good_lens, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "context_lens"));
}

TEST_P(ScoringValidation, LengthBeyondMaxContextLen) {
  max_context_override = *std::max_element(w.context_lens.begin(), w.context_lens.end()) - 1;
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::length_out_of_range, "paged_mqa_logits", "context_lens"));
  max_context_override = -1;
  // Valid pages everywhere, so that the length is the only rule broken.
  for (auto& entry : w.block_table) entry = entry < 0 ? 0 : entry;
  w.context_lens[1] = static_cast<std::int32_t>(w.max_context_len + 1);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::length_out_of_range, "paged_mqa_logits", "context_lens"));
  w.context_lens[1] = -3;
  EXPECT_FALSE(call_logits().ok());
}

// A row of L positions reads ceil(L / P) block-table columns.
TEST_P(ScoringValidation, LengthBeyondTheBlockTable) {
  for (const int page_tokens : {64, 32}) {
    SCOPED_TRACE("pages of " + std::to_string(page_tokens));
    use_workload(spec_with_pages(page_tokens));
    // A view of the table narrower than the longest request needs.
    std::int64_t longest = 0;
    for (std::int64_t b = 0; b < w.batch; ++b) longest = std::max(longest, w.needed_pages(b));
    table = dsa::make_view(w.block_table.data(), dsa::DType::int32, {w.batch, longest - 1}, {w.max_blocks, 1});
    const dsa::Status narrow = call_logits();
    EXPECT_TRUE(fails_with(narrow, ErrorCode::length_out_of_range, "paged_mqa_logits", "block_table"));
    EXPECT_NE(narrow.message().find("pages of " + std::to_string(page_tokens) + " tokens"), std::string::npos)
        << narrow.message();
    EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::length_out_of_range, "index_topk", "block_table"));
    table = dsa::make_view(w.block_table.data(), dsa::DType::int32, {w.batch, longest}, {w.max_blocks, 1});
    EXPECT_TRUE(call_logits().ok());
    EXPECT_TRUE(call_index_topk().ok());
  }
}

// The needed entries are checked, and only those: the ones past ceil(L / P)
// may hold anything.
TEST_P(ScoringValidation, PageIndexOutOfRange) {
  for (const int page_tokens : {64, 32}) {
    SCOPED_TRACE("pages of " + std::to_string(page_tokens));
    use_workload(spec_with_pages(page_tokens));
    const std::int64_t last_needed = w.needed_pages(1) - 1;
    std::int32_t& entry = w.block_table[1 * w.max_blocks + last_needed];
    const std::int32_t saved = entry;
    for (const std::int32_t bad : {static_cast<std::int32_t>(w.geometry.num_pages), -1, INT_MIN}) {
      entry = bad;
      EXPECT_TRUE(fails_with(call_logits(), ErrorCode::page_out_of_range, "paged_mqa_logits", "block_table")) << bad;
      EXPECT_EQ(call_index_topk().code(), ErrorCode::page_out_of_range) << bad;
    }
    entry = saved;
    // Entries past the needed pages are never read, whatever they hold.
    for (const std::int32_t padding : {-1, INT_MAX, INT_MIN}) {
      for (std::int64_t b = 0; b < w.batch; ++b)
        for (std::int64_t i = w.needed_pages(b); i < w.max_blocks; ++i) w.block_table[b * w.max_blocks + i] = padding;
      EXPECT_TRUE(call_logits().ok()) << padding;
      EXPECT_TRUE(call_index_topk().ok()) << padding;
    }
  }
}

TEST_P(ScoringValidation, PageSizeRules) {
  const std::int64_t pages = w.geometry.num_pages, min_bytes = 64 * 132;
  // The option is 0, 32 or 64.
  for (const int bad : {-1, 1, 16, 48, 65, 128}) {
    options.page_size = bad;
    EXPECT_TRUE(fails_with(call_logits(), ErrorCode::invalid_argument, "paged_mqa_logits", "options.page_size")) << bad;
    EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::invalid_argument, "index_topk", "options.page_size")) << bad;
  }
  // A 4-D view of pages of neither 32 nor 64 tokens.
  options.page_size = 0;
  const std::vector<std::int64_t> unsupported_tokens{16, 48, 128, (std::int64_t{1} << 32) + 64};
  for (const std::int64_t tokens : unsupported_tokens) {
    cache = dsa::make_view(w.cache.data(), dsa::DType::uint8, {pages / 4, tokens, 1, 132}, {min_bytes, 132, 132, 1});
    EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "key_cache")) << tokens;
  }
  // The option disagrees with the 4-D view: the view's 64 tokens a page against 32, and 32 against 64.
  cache = w.cache_view_4d();
  options.page_size = 32;
  dsa::Status status = call_logits();
  EXPECT_TRUE(fails_with(status, ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  EXPECT_NE(status.message().find("options.page_size is 32"), std::string::npos) << status.message();
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_shape, "index_topk", "options.page_size"));
  cache = dsa::make_view(w.cache.data(), dsa::DType::uint8, {pages, 32, 1, 132}, {min_bytes, 132, 132, 1});
  options.page_size = 64;
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  // The option agreeing with the view, or left to it.
  cache = w.cache_view_4d();
  for (const int agreeing : {0, 64}) {
    options.page_size = agreeing;
    EXPECT_TRUE(call_logits().ok()) << agreeing;
    EXPECT_TRUE(call_index_topk().ok()) << agreeing;
  }
  // A 2-D view whose pages hold 32 tokens, read as 64-token pages: too small.
  cache = dsa::make_view(w.cache.data(), dsa::DType::uint8, {pages, 32 * 132}, {min_bytes, 1});
  options.page_size = 0;
  status = call_logits();
  EXPECT_TRUE(fails_with(status, ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  EXPECT_NE(status.message().find("P * (D + 4) = 64 * 132"), std::string::npos) << status.message();
}

// A 2-D view of 32-token pages with the option, or the 4-D view that tells it.
TEST_P(ScoringValidation, Page32CacheViews) {
  use_workload(spec_with_pages(32));
  ASSERT_EQ(options.page_size, 32);
  EXPECT_TRUE(call_logits().ok()) << call_logits().to_string();
  EXPECT_TRUE(call_index_topk().ok()) << call_index_topk().to_string();
  cache = dsa::make_view(w.cache.data(), dsa::DType::uint8, {w.geometry.num_pages, 32 * 132 - 16},
                         {w.geometry.page_stride, 1});
  const dsa::Status small = call_logits();
  EXPECT_TRUE(fails_with(small, ErrorCode::bad_shape, "paged_mqa_logits", "key_cache"));
  EXPECT_NE(small.message().find("P * (D + 4) = 32 * 132"), std::string::npos) << small.message();
  cache = w.cache_view_4d();
  options.page_size = 0;
  EXPECT_TRUE(call_logits().ok());
  EXPECT_TRUE(call_index_topk().ok());
}

TEST_P(ScoringValidation, BlockTableRules) {
  const dsa::TensorView good = table;
  table = with_dtype(good, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "block_table"));
  table = with_shape(good, {w.batch - 1, w.max_blocks});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "block_table"));
  table = dsa::make_view(good.data, dsa::DType::int32, {w.batch, w.max_blocks / 2}, {w.max_blocks, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_stride, "paged_mqa_logits", "block_table"));
  table = with_data(good, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "block_table"));
}

TEST_P(ScoringValidation, LogitsRules) {
  const dsa::TensorView good = logits;
  const std::int64_t n = w.max_context_len;
  logits = with_dtype(good, dsa::DType::int32);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "logits"));
  logits = with_shape(good, {w.rows(), n - 1});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "logits"));
  logits = with_shape(good, {w.rows() + 1, n - 1});
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_shape);
  logits = with_shape(good, {w.rows() - 1, n});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "logits"));
  OwnedView roomy = float_matrix(w.rows(), 2 * n, 2 * n, 0.0f);
  logits = dsa::make_view(roomy.view.data, dsa::DType::float32, {w.rows(), n}, {2 * n, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_stride, "paged_mqa_logits", "logits"));
  logits = dsa::make_view(roomy.view.data, dsa::DType::float32, {w.rows(), n}, {n - 1, 1});  // rows overlap
  const dsa::Status overlapping = call_logits();
  EXPECT_FALSE(overlapping.ok());
  EXPECT_NE(overlapping.message().find("logits"), std::string::npos) << overlapping.to_string();
  logits = with_data(good, nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "logits"));
  logits = good;
  max_context_override = n + 1;  // wider than the logits
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_shape);
}

TEST_P(ScoringValidation, ScheduleRules) {
  Schedule other_batch, per_token, shallow;
  ASSERT_TRUE(plan(std::vector<std::int32_t>(6, 50), 3, 2, 3, dsa::LogitsPath::native, ctx, &other_batch).ok());
  schedule = other_batch.view();
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::schedule_mismatch, "paged_mqa_logits", "schedule"));
  EXPECT_EQ(call_index_topk().code(), ErrorCode::schedule_mismatch);

  ASSERT_TRUE(plan(w.context_lens, w.batch, w.next_n, 3, dsa::LogitsPath::per_token, ctx, &per_token).ok());
  schedule = per_token.view();
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::schedule_mismatch, "paged_mqa_logits", "schedule"));
  options.path = dsa::LogitsPath::per_token;
  EXPECT_TRUE(call_logits().ok());
  options.path = dsa::LogitsPath::native;

  // Another chunk size in the trailer.
  std::vector<std::int32_t> edited = schedule_storage.entries;
  edited.back() = 128;
  schedule = view_of(edited, {4, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::schedule_mismatch, "paged_mqa_logits", "schedule"));

  // Starts that go backwards.
  edited = schedule_storage.entries;
  edited[2] = 1;
  edited[3] = 0;
  edited[4] = 0;
  edited[5] = 0;
  schedule = view_of(edited, {4, 2});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::schedule_mismatch, "paged_mqa_logits", "schedule"));

  // Wrong shapes: rows of three, a flat vector, another dtype, no data.
  schedule = dsa::make_view(schedule_storage.entries.data(), dsa::DType::int32, {2, 3});
  const dsa::Status three_columns = call_logits();
  EXPECT_TRUE(three_columns.code() == ErrorCode::bad_shape || three_columns.code() == ErrorCode::schedule_mismatch)
      << three_columns.to_string();
  schedule = dsa::make_view(schedule_storage.entries.data(), dsa::DType::int32, {8});
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_shape, "paged_mqa_logits", "schedule"));
  schedule = with_dtype(schedule_storage.view(), dsa::DType::int64);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::bad_dtype, "paged_mqa_logits", "schedule"));
  schedule = with_data(schedule_storage.view(), nullptr);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::null_pointer, "paged_mqa_logits", "schedule"));
}

TEST_P(ScoringValidation, IndexTopkRules) {
  EXPECT_TRUE(fails_with(call_index_topk(0), ErrorCode::k_out_of_range, "index_topk", "k"));
  EXPECT_EQ(call_index_topk(2049).code(), ErrorCode::k_out_of_range);
  EXPECT_EQ(call_index_topk(17).code(), ErrorCode::k_out_of_range);  // wider than indices
  const dsa::TensorView good_lens = topk_lens;
  w.causal_lens[2] = w.context_lens[2] + 1;
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::length_out_of_range, "index_topk", "topk_lens"));
  w.causal_lens[2] = w.context_lens[2];
  topk_lens = with_shape(good_lens, {w.rows() - 1});
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_shape, "index_topk", "topk_lens"));
  topk_lens = with_dtype(good_lens, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_dtype, "index_topk", "topk_lens"));
  topk_lens = good_lens;
  const dsa::TensorView good_indices = indices;
  indices = with_shape(good_indices, {w.rows() - 1, 16});
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_shape, "index_topk", "indices"));
  indices = with_dtype(good_indices, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_dtype, "index_topk", "indices"));
  indices = with_data(good_indices, nullptr);
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::null_pointer, "index_topk", "indices"));
  indices = dsa::make_view(good_indices.data, dsa::DType::int32, {w.rows(), 16}, {8, 1});  // rows overlap
  EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::bad_stride, "index_topk", "indices"));
  indices = good_indices;
  topk_lens = dsa::TensorView{};
  EXPECT_TRUE(call_index_topk().ok());
}

TEST_P(ScoringValidation, DevicesTheBackendCannotUse) {
  q = on_cuda(q);  // one tensor on another device
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_device);
  ctx.backend = dsa::Backend::automatic;
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_device);
  ctx.backend = GetParam();
  q = w.q_fp8_view();
  cache = on_cuda(cache);
  weights = on_cuda(weights);
  lens = on_cuda(lens);
  table = on_cuda(table);
  schedule = on_cuda(schedule);
  logits = on_cuda(logits);
  q = on_cuda(q);
  EXPECT_EQ(call_logits().code(), ErrorCode::bad_device);  // CPU backend, CUDA tensors
}

// Enum arguments: a C++ caller can cast any integer into one.
TEST_P(ScoringValidation, EnumValuesOutsideTheirTypes) {
  options.path = static_cast<dsa::LogitsPath>(7);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::invalid_argument, "paged_mqa_logits", "options.path"));
  options.path = dsa::LogitsPath::native;
  dsa::IndexTopkOptions o;
  o.k = 16;
  o.strategy = static_cast<dsa::IndexTopkStrategy>(9);
  EXPECT_TRUE(fails_with(dsa::index_topk(q, cache, weights, lens, table, schedule, max_context_len(), topk_lens,
                                         indices, o, ctx),
                         ErrorCode::invalid_argument, "index_topk", "options.strategy"));
  o.strategy = dsa::IndexTopkStrategy::automatic;
  o.path = static_cast<dsa::LogitsPath>(-1);
  EXPECT_TRUE(fails_with(dsa::index_topk(q, cache, weights, lens, table, schedule, max_context_len(), topk_lens,
                                         indices, o, ctx),
                         ErrorCode::invalid_argument, "index_topk", "options.path"));
  EXPECT_TRUE(fails_with(dsa::plan_schedule(lens, 3, static_cast<dsa::LogitsPath>(5), schedule, ctx),
                         ErrorCode::invalid_argument, "plan_schedule", "path"));
  ctx.backend = static_cast<dsa::Backend>(42);
  EXPECT_TRUE(fails_with(call_logits(), ErrorCode::invalid_argument, "paged_mqa_logits", "ctx.backend"));
}

TEST_P(ScoringValidation, ThreadCountRules) {
  for (int threads : {-1, dsa::kMaxCpuThreads + 1}) {
    ctx.num_threads = threads;
    EXPECT_TRUE(fails_with(call_logits(), ErrorCode::invalid_argument, "paged_mqa_logits", "ctx.num_threads"))
        << threads;
    EXPECT_TRUE(fails_with(call_index_topk(), ErrorCode::invalid_argument, "index_topk", "ctx.num_threads"))
        << threads;
  }
  // The largest count is accepted, and the logits do not depend on it.
  ctx.num_threads = 1;
  ASSERT_TRUE(call_logits().ok());
  const std::vector<std::uint8_t> one_thread = output.bytes;
  ctx.num_threads = dsa::kMaxCpuThreads;
  ASSERT_TRUE(call_logits().ok());
  EXPECT_EQ(output.bytes, one_thread);  // bit for bit
}

#if defined(__linux__)
// Lowers the process's address-space limit for its lifetime.
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(std::uint64_t bytes) {
    if (getrlimit(RLIMIT_AS, &saved_) != 0) return;
    rlimit lowered = saved_;
    lowered.rlim_cur = saved_.rlim_cur == RLIM_INFINITY ? bytes : std::min<rlim_t>(saved_.rlim_cur, bytes);
    active_ = setrlimit(RLIMIT_AS, &lowered) == 0;
  }
  ~AddressSpaceLimit() {
    if (active_) setrlimit(RLIMIT_AS, &saved_);
  }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;
  bool active() const { return active_; }

 private:
  rlimit saved_{};
  bool active_ = false;
};

// The bytes of address space the process maps now.
std::uint64_t mapped_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

// The CPU index_topk's logits_then_topk stages rows x max_context_len float
// logits (here 4 rows of 2^31 - 1 positions, 32 GiB): beyond what the
// process may map, the call returns out_of_memory instead of throwing
// through the API.
TEST_P(ScoringValidation, HostMemoryExhaustionIsReported) {
  max_context_override = INT_MAX;
  const AddressSpaceLimit limit(mapped_bytes() + (std::uint64_t{4} << 30));
  ASSERT_TRUE(limit.active());
  EXPECT_TRUE(fails_with(call_index_topk(16, dsa::IndexTopkStrategy::logits_then_topk), ErrorCode::out_of_memory,
                         "index_topk", "host memory"));
}
#endif

INSTANTIATE_TEST_SUITE_P(Backends, ScoringValidation, ::testing::ValuesIn(cpu_backends()), backend_label);

// CUDA backends asked for host tensors: an error (bad_device or unsupported), never a crash.
TEST(DeviceValidation, CudaBackendsWithHostTensorsFail) {
  Workload w = make_workload(WorkloadSpec{.batch = 2, .next_n = 1, .seed = 4});
  Schedule schedule;
  ASSERT_TRUE(plan(w.context_lens, w.batch, 1, 2, dsa::LogitsPath::native, cpu_context(dsa::Backend::cpu), &schedule)
                  .ok());
  OwnedView logits = float_matrix(w.rows(), w.max_context_len, w.max_context_len, 0.0f);
  OwnedView indices = int32_matrix(w.rows(), 8, 8, 0);
  std::vector<std::int32_t> prefix{3, 4}, out(2);
  for (const dsa::Backend backend : {dsa::Backend::cuda_generic, dsa::Backend::cuda_hopper}) {
    dsa::ExecContext ctx;
    ctx.backend = backend;
    const dsa::Status scored = dsa::paged_mqa_logits(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(),
                                                     w.context_lens_view(), w.block_table_view(), schedule.view(),
                                                     w.max_context_len, logits.view, dsa::LogitsOptions{}, ctx);
    EXPECT_FALSE(scored.ok());
    EXPECT_TRUE(scored.code() == ErrorCode::bad_device || scored.code() == ErrorCode::unsupported) << scored.to_string();
    EXPECT_FALSE(dsa::topk(logits.view, w.causal_lens_view(), 8, indices.view, dsa::TopkOptions{}, ctx).ok());
    EXPECT_FALSE(dsa::causal_context_lens(view_of(prefix, {2}), 1, view_of(out, {2, 1}), ctx).ok());
    EXPECT_FALSE(dsa::plan_schedule(w.context_lens_view(), 2, dsa::LogitsPath::native, schedule.view(), ctx).ok());
  }
}

class TopkValidation : public ::testing::TestWithParam<dsa::Backend> {
 protected:
  void SetUp() override {
    ctx = cpu_context(GetParam());
    values = float_matrix(4, 300, 300, 1.0f);
    logits = values.view;
    lengths_storage = {300, 0, 17, 299};
    lengths = view_of(lengths_storage, {4});
    output = int32_matrix(4, 32, 32, 0);
    indices = output.view;
  }
  dsa::Status call(int k = 32) { return dsa::topk(logits, lengths, k, indices, options, ctx); }

  // The rules every optional int32 vector of TopkOptions shares (int32, rank
  // 1, contiguous, on the logits' device), broken one at a time in *option,
  // which holds a valid view of 4 entries and does so again at the end.
  void expect_vector_rules(dsa::TensorView* option, const char* name) {
    const dsa::TensorView good = *option;
    *option = with_dtype(good, dsa::DType::int64);
    EXPECT_TRUE(fails_with(call(), ErrorCode::bad_dtype, "topk", name));
    *option = with_shape(good, {2, 2});
    EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", name));
    std::vector<std::int32_t> spaced(8, 0);
    *option = dsa::make_view(spaced.data(), dsa::DType::int32, {4}, {2});
    EXPECT_TRUE(fails_with(call(), ErrorCode::bad_stride, "topk", name));
    *option = on_cuda(good);
    EXPECT_TRUE(fails_with(call(), ErrorCode::bad_device, "topk", name));
    *option = good;
  }

  dsa::ExecContext ctx;
  OwnedView values, output;
  std::vector<std::int32_t> lengths_storage;
  dsa::TensorView logits, lengths, indices;
  dsa::TopkOptions options;
};

TEST_P(TopkValidation, KOutOfRange) {
  EXPECT_TRUE(call().ok());
  EXPECT_TRUE(fails_with(call(0), ErrorCode::k_out_of_range, "topk", "k"));
  EXPECT_EQ(call(-1).code(), ErrorCode::k_out_of_range);
  EXPECT_EQ(call(33).code(), ErrorCode::k_out_of_range);
  OwnedView wide = int32_matrix(4, 2100, 2100, 0);
  indices = wide.view;
  EXPECT_TRUE(call(2048).ok());
  EXPECT_TRUE(fails_with(call(2049), ErrorCode::k_out_of_range, "topk", "k"));
}

TEST_P(TopkValidation, LengthsBeyondTheRow) {
  lengths_storage[2] = 301;
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "lengths"));
  lengths_storage[2] = -1;
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "lengths"));
}

TEST_P(TopkValidation, ShapeDtypeStrideAndNullRules) {
  const dsa::TensorView good_logits = logits, good_lengths = lengths, good_indices = indices;
  logits = with_dtype(good_logits, dsa::DType::int32);
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_dtype, "topk", "logits"));
  logits = dsa::make_view(good_logits.data, dsa::DType::float32, {4, 150}, {300, 2});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_stride, "topk", "logits"));
  logits = with_shape(good_logits, {1200});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "logits"));
  logits = with_data(good_logits, nullptr);
  EXPECT_TRUE(fails_with(call(), ErrorCode::null_pointer, "topk", "logits"));
  logits = good_logits;

  lengths = with_dtype(good_lengths, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_dtype, "topk", "lengths"));
  lengths = with_shape(good_lengths, {3});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "lengths"));
  lengths = with_data(good_lengths, nullptr);
  EXPECT_TRUE(fails_with(call(), ErrorCode::null_pointer, "topk", "lengths"));
  lengths = good_lengths;

  indices = with_dtype(good_indices, dsa::DType::int64);
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_dtype, "topk", "indices"));
  indices = with_shape(good_indices, {3, 32});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "indices"));
  indices = dsa::make_view(good_indices.data, dsa::DType::int32, {4, 16}, {32, 2});
  EXPECT_TRUE(fails_with(call(16), ErrorCode::bad_stride, "topk", "indices"));
  indices = dsa::make_view(good_indices.data, dsa::DType::int32, {4, 32}, {16, 1});  // rows overlap
  EXPECT_TRUE(fails_with(call(32), ErrorCode::bad_stride, "topk", "indices"));
  EXPECT_TRUE(call(16).ok());  // rows of k = 16 written columns do not overlap
  indices = with_data(good_indices, nullptr);
  EXPECT_TRUE(fails_with(call(), ErrorCode::null_pointer, "topk", "indices"));
}

// The CUDA kernels give every row its own thread block: rows beyond int32 are refused
// rather than wrapped. Every view repeats one row (stride 0), so nothing large is allocated.
TEST_P(TopkValidation, RowsBeyondInt32) {
  const std::int64_t rows = std::int64_t{1} << 31;
  logits = dsa::make_view(values.view.data, dsa::DType::float32, {rows, 300}, {0, 1});
  lengths = dsa::make_view(lengths_storage.data(), dsa::DType::int32, {rows}, {0});
  indices = dsa::make_view(output.view.data, dsa::DType::int32, {rows, 32}, {0, 1});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "logits"));
}

TEST_P(TopkValidation, BlockTableTransformRules) {
  std::vector<std::int32_t> table(2 * 5, 7);
  options.block_table = view_of(table, {2, 5});
  options.rows_per_request = 2;
  EXPECT_TRUE(call().ok());
  options.rows_per_request = 0;
  EXPECT_FALSE(call().ok());
  options.rows_per_request = 1;  // 4 rows need 4 requests, the table has 2
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "block_table"));
  options.rows_per_request = 2;
  options.block_table = view_of(table, {2, 4});  // a length of 300 needs 5 pages
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "block_table"));
  options.block_table = with_dtype(view_of(table, {2, 5}), dsa::DType::int64);
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_dtype, "topk", "block_table"));
}

TEST_P(TopkValidation, RowStartRules) {
  // lengths {300, 0, 17, 299} over 300 columns.
  std::vector<std::int32_t> starts{0, 300, 283, 1};
  options.row_starts = view_of(starts, {4});
  EXPECT_TRUE(call().ok());  // start + length == 300, and a row of length 0 starting at 300
  starts[3] = 2;
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "row_starts[3] = 2"));
  starts[3] = 1;
  starts[2] = -1;
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "row_starts[2] = -1"));
  starts[2] = 283;
  starts[1] = 301;
  EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "row_starts[1] = 301"));
  starts[1] = 300;
  options.row_starts = view_of(starts, {3});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "row_starts"));
  options.row_starts = view_of(starts, {4});
  expect_vector_rules(&options.row_starts, "row_starts");
  EXPECT_TRUE(call().ok());
}

TEST_P(TopkValidation, PositionOffsetRules) {
  std::vector<std::int32_t> offsets{10, 20, 30, 40};
  options.position_offsets = view_of(offsets, {4});
  EXPECT_TRUE(call().ok());
  std::vector<std::int32_t> table(4 * 5, 7);
  options.block_table = view_of(table, {4, 5});
  const dsa::Status both = call();
  EXPECT_TRUE(fails_with(both, ErrorCode::invalid_argument, "topk", "position_offsets"));
  EXPECT_NE(both.message().find("block_table"), std::string::npos) << both.message();
  options.block_table = {};
  options.position_offsets = view_of(offsets, {2});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "position_offsets"));
  options.position_offsets = view_of(offsets, {4});
  expect_vector_rules(&options.position_offsets, "position_offsets");
}

TEST_P(TopkValidation, PageSizeRules) {
  // The longest row (300) needs 300 / 1, 10 / 32 or 5 / 64 columns.
  std::vector<std::int32_t> table(4 * 300, 7);
  for (const int page_size : {0, -64, 16, 63, 128}) {
    options.page_size = page_size;
    EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "page_size")) << page_size;
  }
  for (const int page_size : {1, 32, 64}) {
    options.page_size = page_size;
    options.block_table = view_of(table, {4, 300 / page_size + (300 % page_size != 0)});
    EXPECT_TRUE(call().ok()) << page_size;
    options.block_table = view_of(table, {4, 300 / page_size + (300 % page_size != 0) - 1});
    EXPECT_TRUE(fails_with(call(), ErrorCode::length_out_of_range, "topk", "block_table")) << page_size;
  }
  // Entries must give int32 slots at the page size.
  options.page_size = 32;
  options.block_table = view_of(table, {4, 10});
  table[9] = std::numeric_limits<std::int32_t>::max() / 32 + 1;
  EXPECT_TRUE(fails_with(call(), ErrorCode::page_out_of_range, "topk", "block_table[0, 9]"));
  options.page_size = 1;
  options.block_table = view_of(table, {4, 300});
  EXPECT_TRUE(call().ok());
  table[299] = -1;  // row 0 has length 300: entry 299 is needed
  EXPECT_TRUE(fails_with(call(), ErrorCode::page_out_of_range, "topk", "block_table[0, 299]"));
}

TEST_P(TopkValidation, RequestOffsetRules) {
  std::vector<std::int32_t> table(3 * 5, 7);
  std::vector<std::int32_t> offsets{0, 1, 1, 4};  // three requests, the second empty
  options.block_table = view_of(table, {3, 5});
  options.request_offsets = view_of(offsets, {4});
  EXPECT_TRUE(call().ok());

  options.block_table = {};
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets"));
  options.block_table = view_of(table, {3, 5});
  options.rows_per_request = 2;
  const dsa::Status both = call();
  EXPECT_TRUE(fails_with(both, ErrorCode::invalid_argument, "topk", "request_offsets"));
  EXPECT_NE(both.message().find("rows_per_request"), std::string::npos) << both.message();
  options.rows_per_request = 1;
  options.block_table = view_of(table, {2, 5});  // fewer rows than requests
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "block_table"));
  options.block_table = view_of(table, {3, 5});

  expect_vector_rules(&options.request_offsets, "request_offsets");
  options.request_offsets = view_of(offsets, {0});
  EXPECT_TRUE(fails_with(call(), ErrorCode::bad_shape, "topk", "request_offsets"));

  // Data rules (host memory): from 0, non-decreasing, to the number of rows.
  options.request_offsets = view_of(offsets, {4});
  offsets = {1, 1, 1, 4};
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets[0] = 1"));
  offsets = {0, 3, 2, 4};
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets[2] = 2"));
  offsets = {0, 1, 1, 3};
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets[3] = 3"));
  offsets = {0, 1, 1, 5};
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets[3] = 5"));
  // No rows, no requests: one entry, 0.
  offsets = {0, 1, 1, 4};
  std::vector<std::int32_t> only_zero{0};
  options.request_offsets = view_of(only_zero, {1});
  const OwnedView no_rows_out = int32_matrix(0, 32, 32, 0);
  EXPECT_TRUE(dsa::topk(dsa::make_view(values.view.data, dsa::DType::float32, {0, 300}), view_of(lengths_storage, {0}),
                        32, no_rows_out.view, options, ctx)
                  .ok());
  EXPECT_TRUE(fails_with(call(), ErrorCode::invalid_argument, "topk", "request_offsets[0] = 0"));
}

INSTANTIATE_TEST_SUITE_P(Backends, TopkValidation, ::testing::ValuesIn(cpu_backends()), backend_label);

class OtherOpsValidation : public ::testing::TestWithParam<dsa::Backend> {
 protected:
  dsa::ExecContext ctx = cpu_context(GetParam());
};

TEST_P(OtherOpsValidation, StoreKeysRules) {
  constexpr std::int64_t kPages = 3, kBytes = 64 * 132;
  std::vector<std::uint8_t> cache_bytes(kPages * kBytes);
  std::vector<float> keys(4 * 256, 0.5f);
  std::vector<std::int32_t> slots{0, 5, -1, kPages * 64 - 1};
  const dsa::TensorView cache = dsa::make_view(cache_bytes.data(), dsa::DType::uint8, {kPages, kBytes});
  const dsa::TensorView good_keys = view_of(keys, {4, 128});
  const dsa::TensorView good_slots = view_of(slots, {4});
  auto store = [&](const dsa::TensorView& k, const dsa::TensorView& s, const dsa::TensorView& c) {
    return dsa::store_index_keys(k, s, c, dsa::StoreKeysOptions{}, ctx);
  };
  EXPECT_TRUE(store(good_keys, good_slots, cache).ok());
  slots[1] = kPages * 64;
  EXPECT_TRUE(fails_with(store(good_keys, good_slots, cache), ErrorCode::page_out_of_range, "store_index_keys",
                         "slot_mapping"));
  slots[1] = 5;
  EXPECT_TRUE(fails_with(store(with_dtype(good_keys, dsa::DType::int32), good_slots, cache), ErrorCode::bad_dtype,
                         "store_index_keys", "keys"));
  EXPECT_TRUE(fails_with(store(with_shape(good_keys, {4, 120}), good_slots, cache), ErrorCode::bad_shape,
                         "store_index_keys", "keys"));
  std::vector<std::uint8_t> wide_cache(kPages * 64 * 276);
  EXPECT_TRUE(fails_with(store(with_shape(good_keys, {2, 272}), with_shape(good_slots, {2}),
                               dsa::make_view(wide_cache.data(), dsa::DType::uint8, {kPages, 64 * 276})),
                         ErrorCode::bad_shape, "store_index_keys", "keys"));
  EXPECT_TRUE(fails_with(store(dsa::make_view(keys.data(), dsa::DType::float32, {4, 128}, {256, 2}), good_slots, cache),
                         ErrorCode::bad_stride, "store_index_keys", "keys"));
  EXPECT_TRUE(fails_with(store(good_keys, with_dtype(good_slots, dsa::DType::float32), cache), ErrorCode::bad_dtype,
                         "store_index_keys", "slot_mapping"));
  EXPECT_TRUE(fails_with(store(good_keys, with_shape(good_slots, {3}), cache), ErrorCode::bad_shape,
                         "store_index_keys", "slot_mapping"));
  EXPECT_TRUE(fails_with(store(good_keys, good_slots,
                               dsa::make_view(cache_bytes.data(), dsa::DType::uint8, {kPages, 64, 1, 100})),
                         ErrorCode::bad_shape, "store_index_keys", "cache"));
  EXPECT_TRUE(fails_with(store(good_keys, good_slots,
                               dsa::make_view(cache_bytes.data(), dsa::DType::uint8, {kPages - 1, kBytes}, {kBytes + 4, 1})),
                         ErrorCode::bad_alignment, "store_index_keys", "cache"));
  EXPECT_TRUE(fails_with(store(with_data(good_keys, nullptr), good_slots, cache), ErrorCode::null_pointer,
                         "store_index_keys", "keys"));
  EXPECT_TRUE(fails_with(store(good_keys, good_slots, with_data(cache, nullptr)), ErrorCode::null_pointer,
                         "store_index_keys", "cache"));
  EXPECT_EQ(store(good_keys, good_slots, on_cuda(cache)).code(), ErrorCode::bad_device);

  // The same bytes as 2 * kPages pages of 32 tokens: the 2-D view with the
  // option, or the 4-D view, which tells it (dsa/cache.hpp).
  const std::int64_t pages_32 = 2 * kPages, bytes_32 = 32 * 132;
  const dsa::TensorView cache_32 = dsa::make_view(cache_bytes.data(), dsa::DType::uint8, {pages_32, bytes_32});
  const dsa::TensorView cache_32_4d =
      dsa::make_view(cache_bytes.data(), dsa::DType::uint8, {pages_32, 32, 1, 132}, {bytes_32, 132, 132, 1});
  auto store_pages = [&](const dsa::TensorView& c, int page_size) {
    dsa::StoreKeysOptions options;
    options.page_size = page_size;
    return dsa::store_index_keys(good_keys, good_slots, c, options, ctx);
  };
  EXPECT_TRUE(store_pages(cache_32, 32).ok());
  EXPECT_TRUE(store_pages(cache_32_4d, 0).ok());
  EXPECT_TRUE(store_pages(cache_32_4d, 32).ok());
  // Read as 64-token pages, the 2-D view's pages are too small.
  EXPECT_TRUE(fails_with(store_pages(cache_32, 0), ErrorCode::bad_shape, "store_index_keys", "cache"));
  EXPECT_TRUE(fails_with(store_pages(cache_32_4d, 64), ErrorCode::bad_shape, "store_index_keys", "cache"));
  EXPECT_TRUE(fails_with(store_pages(cache_32, 48), ErrorCode::invalid_argument, "store_index_keys",
                         "options.page_size"));
  slots[3] = static_cast<std::int32_t>(pages_32 * 32 - 1);
  EXPECT_TRUE(store_pages(cache_32, 32).ok());
  slots[3] = static_cast<std::int32_t>(pages_32 * 32);
  const dsa::Status beyond = store_pages(cache_32, 32);
  EXPECT_TRUE(fails_with(beyond, ErrorCode::page_out_of_range, "store_index_keys", "slot_mapping"));
  EXPECT_NE(beyond.message().find("6 pages of 32"), std::string::npos) << beyond.message();
}

TEST_P(OtherOpsValidation, QuantizeQueriesRules) {
  std::vector<float> q(2 * 1 * 4 * 128, 1.0f), gate(2 * 4, 1.0f), weights(2 * 4);
  std::vector<std::uint8_t> q_fp8(q.size());
  const dsa::TensorView good_q = dsa::make_view(q.data(), dsa::DType::float32, {2, 1, 4, 128});
  const dsa::TensorView good_gate = view_of(gate, {2, 4});
  const dsa::TensorView good_out = dsa::make_view(q_fp8.data(), dsa::DType::float8_e4m3, {2, 1, 4, 128});
  const dsa::TensorView good_weights = view_of(weights, {2, 4});
  auto quantize = [&](const dsa::TensorView& a, const dsa::TensorView& b, const dsa::TensorView& c,
                      const dsa::TensorView& d) {
    return dsa::quantize_queries(a, b, c, d, dsa::QuantizeQueriesOptions{}, ctx);
  };
  EXPECT_TRUE(quantize(good_q, good_gate, good_out, good_weights).ok());
  EXPECT_TRUE(fails_with(quantize(with_dtype(good_q, dsa::DType::int32), good_gate, good_out, good_weights),
                         ErrorCode::bad_dtype, "quantize_queries", "q"));
  EXPECT_TRUE(fails_with(quantize(good_q, with_dtype(good_gate, dsa::DType::int32), good_out, good_weights),
                         ErrorCode::bad_dtype, "quantize_queries", "head_gate"));
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate, with_dtype(good_out, dsa::DType::uint8), good_weights),
                         ErrorCode::bad_dtype, "quantize_queries", "q_fp8"));
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate, good_out, with_shape(good_weights, {2, 3})),
                         ErrorCode::bad_shape, "quantize_queries", "weights"));
  EXPECT_TRUE(fails_with(quantize(good_q, with_shape(good_gate, {1, 4}), good_out, good_weights),
                         ErrorCode::bad_shape, "quantize_queries", "head_gate"));
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate, with_shape(good_out, {2, 1, 4, 64}), good_weights),
                         ErrorCode::bad_shape, "quantize_queries", "q_fp8"));
  EXPECT_TRUE(fails_with(quantize(dsa::make_view(q.data(), dsa::DType::float32, {2, 1, 4, 64}, {512, 512, 128, 2}),
                                  good_gate, with_shape(good_out, {2, 1, 4, 64}), good_weights),
                         ErrorCode::bad_stride, "quantize_queries", "q"));
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate, good_out, with_data(good_weights, nullptr)),
                         ErrorCode::null_pointer, "quantize_queries", "weights"));
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate, good_out, dsa::make_view(weights.data(), dsa::DType::float32,
                                                                              {2, 4}, {2, 1})),  // rows overlap
                         ErrorCode::bad_stride, "quantize_queries", "weights"));
  // Heads written over each other (head stride 64 below the 128 bytes a head spans).
  EXPECT_TRUE(fails_with(quantize(good_q, good_gate,
                                  dsa::make_view(q_fp8.data(), dsa::DType::float8_e4m3, {2, 1, 4, 128},
                                                 {512, 512, 64, 1}),
                                  good_weights),
                         ErrorCode::bad_stride, "quantize_queries", "q_fp8"));
  // Extents whose product wraps int64 (B * next_n * H would read as 0).
  const std::int64_t huge = std::int64_t{1} << 40;
  EXPECT_TRUE(fails_with(quantize(dsa::make_view(q.data(), dsa::DType::float32, {huge, huge, 1, 16}),
                                  with_shape(good_gate, {0, 1}),
                                  dsa::make_view(q_fp8.data(), dsa::DType::float8_e4m3, {huge, huge, 1, 16}),
                                  with_shape(good_weights, {0, 1})),
                         ErrorCode::bad_shape, "quantize_queries", "q"));
}

TEST_P(OtherOpsValidation, LengthsRules) {
  std::vector<std::int32_t> prefix{1, 2, 3}, out(3 * 4);
  EXPECT_TRUE(dsa::causal_context_lens(view_of(prefix, {3}), 4, view_of(out, {3, 4}), ctx).ok());
  EXPECT_TRUE(fails_with(dsa::causal_context_lens(view_of(prefix, {3}), 0, view_of(out, {3, 0}), ctx),
                         ErrorCode::invalid_argument, "causal_context_lens", "next_n"));
  EXPECT_TRUE(fails_with(dsa::expanded_context_lens(view_of(prefix, {3}), 4, view_of(out, {3, 3}), ctx),
                         ErrorCode::bad_shape, "expanded_context_lens", "out"));
  EXPECT_TRUE(fails_with(dsa::legacy_context_lens(view_of(prefix, {3}), 4, view_of(out, {2, 4}), ctx),
                         ErrorCode::bad_shape, "legacy_context_lens", "out"));
  EXPECT_TRUE(fails_with(dsa::legacy_context_lens(with_dtype(view_of(prefix, {3}), dsa::DType::int64), 4,
                                                  view_of(out, {3, 4}), ctx),
                         ErrorCode::bad_dtype, "legacy_context_lens", "lens"));
  EXPECT_TRUE(fails_with(dsa::causal_context_lens(view_of(prefix, {3}), 4, with_data(view_of(out, {3, 4}), nullptr), ctx),
                         ErrorCode::null_pointer, "causal_context_lens", "out"));
  // Draft rows written over each other, or two requests on one row; a
  // transposed view is fine.
  EXPECT_TRUE(fails_with(dsa::causal_context_lens(view_of(prefix, {3}), 4,
                                                  dsa::make_view(out.data(), dsa::DType::int32, {3, 4}, {1, 1}), ctx),
                         ErrorCode::bad_stride, "causal_context_lens", "out"));
  EXPECT_TRUE(fails_with(dsa::causal_context_lens(view_of(prefix, {3}), 4,
                                                  dsa::make_view(out.data(), dsa::DType::int32, {3, 4}, {0, 1}), ctx),
                         ErrorCode::bad_stride, "causal_context_lens", "out"));
  EXPECT_TRUE(dsa::causal_context_lens(view_of(prefix, {3}), 4,
                                       dsa::make_view(out.data(), dsa::DType::int32, {3, 4}, {1, 3}), ctx)
                  .ok());
  for (std::int64_t b = 0; b < 3; ++b) {
    for (int j = 0; j < 4; ++j) EXPECT_EQ(out[b + 3 * j], prefix[b] + j + 1) << b << ", " << j;
  }
}

TEST_P(OtherOpsValidation, PlanScheduleRules) {
  std::vector<std::int32_t> lens{100, 200, 300, 400}, schedule(2 * 5);
  const dsa::TensorView lens_view = view_of(lens, {2, 2});
  EXPECT_TRUE(dsa::plan_schedule(lens_view, 4, dsa::LogitsPath::native, view_of(schedule, {5, 2}), ctx).ok());
  EXPECT_TRUE(fails_with(dsa::plan_schedule(lens_view, 0, dsa::LogitsPath::native, view_of(schedule, {1, 2}), ctx),
                         ErrorCode::invalid_argument, "plan_schedule", "num_workers"));
  EXPECT_TRUE(fails_with(dsa::plan_schedule(lens_view, 4, dsa::LogitsPath::native, view_of(schedule, {4, 2}), ctx),
                         ErrorCode::bad_shape, "plan_schedule", "schedule"));
  EXPECT_TRUE(fails_with(dsa::plan_schedule(with_dtype(lens_view, dsa::DType::float32), 4, dsa::LogitsPath::native,
                                            view_of(schedule, {5, 2}), ctx),
                         ErrorCode::bad_dtype, "plan_schedule", "context_lens"));
  EXPECT_TRUE(fails_with(dsa::plan_schedule(lens_view, 4, dsa::LogitsPath::native,
                                            with_data(view_of(schedule, {5, 2}), nullptr), ctx),
                         ErrorCode::null_pointer, "plan_schedule", "schedule"));
}

INSTANTIATE_TEST_SUITE_P(Backends, OtherOpsValidation, ::testing::ValuesIn(cpu_backends()), backend_label);

}  // namespace
}  // namespace dsa_test
