// index_topk on the CUDA backends: both strategies give exactly what
// paged_mqa_logits followed by topk gives (bitwise with sorted output, as
// sets per row otherwise), including rows split over many workers, workers
// that walk several requests, long rows whose candidate lists are compacted
// many times, ties, logits that overflow, rows no longer than k, and rows
// whose sampled thresholds admit fewer than k positions.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cuda/fused/row_samples.hpp"
#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;
using dsa::LogitsPath;

// Workspace for every strategy and for the reference topk.
std::size_t workspace_for(std::int64_t rows, std::int64_t max_context_len, dsa::IndexTopkOptions options,
                          const dsa::ExecContext& query) {
  std::size_t bytes = dsa::topk_workspace_bytes(rows, max_context_len, options.k, query);
  for (dsa::IndexTopkStrategy strategy : {dsa::IndexTopkStrategy::logits_then_topk, dsa::IndexTopkStrategy::fused}) {
    options.strategy = strategy;
    bytes = std::max(bytes, dsa::index_topk_workspace_bytes(rows, max_context_len, options, query));
  }
  return bytes;
}

// The reference pipeline's first step: paged_mqa_logits with the same
// schedule and path, [rows, max_context_len].
dsa::DeviceBuffer reference_logits(const DeviceWorkload& dw, const dsa::DeviceBuffer& schedule, LogitsPath path,
                                   const dsa::ExecContext& ctx) {
  const Workload& w = *dw.host;
  dsa::LogitsOptions options;
  options.path = path;
  dsa::DeviceBuffer logits = device_filled(4 * w.rows() * w.max_context_len, 0xFF);
  const dsa::Status status = dsa::paged_mqa_logits(
      dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(), dw.block_table_view(), schedule_view(schedule),
      w.max_context_len, device_view(logits, DType::float32, {w.rows(), w.max_context_len}), options, ctx);
  EXPECT_TRUE(status.ok()) << status.to_string();
  return logits;
}

// Its second step: topk over the causal lengths with index_topk's options,
// positions turned into slots of the cache's pages by the reference's rule.
std::vector<std::int32_t> reference_indices(const DeviceWorkload& dw, const dsa::DeviceBuffer& logits, int k,
                                            bool sorted, bool physical, const dsa::ExecContext& ctx) {
  const Workload& w = *dw.host;
  dsa::TopkOptions options;
  options.sorted = sorted;
  const dsa::DeviceBuffer want = device_filled(4 * w.rows() * k, 0xFF);
  const dsa::Status status =
      dsa::topk(device_view(logits, DType::float32, {w.rows(), w.max_context_len}), dw.causal_view(), k,
                device_view(want, DType::int32, {w.rows(), k}), options, ctx);
  EXPECT_TRUE(status.ok()) << status.to_string();
  std::vector<std::int32_t> indices = host_copy<std::int32_t>(want);
  if (physical) {
    for (std::int64_t r = 0; r < w.rows(); ++r) {
      const std::int32_t* table_row = w.block_table.data() + r / w.next_n * w.max_blocks;
      for (std::int64_t i = r * k; i < (r + 1) * k; ++i) {
        if (indices[i] >= 0) indices[i] = static_cast<std::int32_t>(w.geometry.position_slot(table_row, indices[i]));
      }
    }
  }
  return indices;
}

// index_topk is exactly topk(paged_mqa_logits(...)) with the same options.
TEST(GpuIndexTopk, EqualsLogitsThenTopk) {
  DSA_REQUIRE_GPU();
  for (Backend backend : {Backend::cuda_generic, Backend::automatic}) {
    for (const auto& [physical, page_tokens] : {std::pair{false, 64}, std::pair{true, 64}, std::pair{false, 32},
                                                 std::pair{true, 32}}) {
      WorkloadSpec spec;
      spec.batch = 3;
      spec.next_n = 3;
      spec.convention = LengthConvention::expanded;  // top-k lengths then differ from the context lengths
      spec.min_prefix = 0;
      spec.max_prefix = 1500;
      spec.page_tokens = page_tokens;
      spec.seed = 41 + physical;
      const Workload w = make_workload(spec);
      const DeviceWorkload dw(w);
      const int k = 256;
      const std::int64_t rows = w.rows();
      dsa::IndexTopkOptions options;
      options.k = k;
      options.sorted = true;
      options.physical_slots = physical;
      options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
      dsa::ExecContext query;
      query.backend = backend;
      const std::size_t workspace = workspace_for(rows, w.max_context_len, options, query);
      GpuContext gpu(backend, workspace);
      gpu.ctx.check_device_errors = true;
      options.path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, gpu.ctx);
      const dsa::DeviceBuffer schedule = plan_on_device(dw, workers_for(gpu.ctx), options.path, gpu.ctx);

      const dsa::DeviceBuffer logits = reference_logits(dw, schedule, options.path, gpu.ctx);
      const std::vector<std::int32_t> expected = reference_indices(dw, logits, k, true, physical, gpu.ctx);

      for (dsa::IndexTopkStrategy strategy : {dsa::IndexTopkStrategy::logits_then_topk, dsa::IndexTopkStrategy::automatic,
                                              dsa::IndexTopkStrategy::fused}) {
        options.strategy = strategy;
        const dsa::DeviceBuffer got = device_filled(4 * rows * k, 0xFF);
        const dsa::Status status = dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(),
                                                   dw.block_table_view(), schedule_view(schedule), w.max_context_len,
                                                   dw.causal_view(), device_view(got, DType::int32, {rows, k}),
                                                   options, gpu.ctx);
        // The fused strategy needs the Hopper kernels.
        if (strategy == dsa::IndexTopkStrategy::fused && (backend == Backend::cuda_generic || !device_is_sm90())) {
          EXPECT_EQ(status.code(), dsa::ErrorCode::unsupported) << status.to_string();
          continue;
        }
        DSA_GPU_ASSERT_OK(status);
        EXPECT_EQ(host_copy<std::int32_t>(got), expected)
            << backend_tag(backend) << (physical ? " physical slots" : " positions") << " pages of "
            << page_tokens << " strategy " << static_cast<int>(strategy);
      }
    }
  }
}

TEST(GpuIndexTopk, TopkLengthBeyondContextIsRecorded) {
  DSA_REQUIRE_GPU();
  WorkloadSpec spec;
  spec.batch = 2;
  spec.next_n = 2;
  spec.min_prefix = 100;
  spec.max_prefix = 200;
  const Workload w = make_workload(spec);
  const DeviceWorkload dw(w);
  std::vector<std::int32_t> topk_lens = w.causal_lens;
  topk_lens[1] += 5;
  const dsa::DeviceBuffer topk_lens_device = device_copy(topk_lens);
  dsa::IndexTopkOptions options;
  options.k = 64;
  options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
  dsa::ExecContext query;
  query.backend = Backend::cuda_generic;
  GpuContext gpu(Backend::cuda_generic, dsa::index_topk_workspace_bytes(w.rows(), w.max_context_len, options, query));
  gpu.ctx.check_device_errors = true;
  options.path = dsa::LogitsPath::native;
  const dsa::DeviceBuffer schedule = plan_on_device(dw, 5, options.path, gpu.ctx);
  const dsa::DeviceBuffer indices = device_filled(4 * w.rows() * 64, 0xFF);
  const dsa::Status status = dsa::index_topk(
      dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(), dw.block_table_view(), schedule_view(schedule),
      w.max_context_len, device_view(topk_lens_device, DType::int32, {w.rows()}),
      device_view(indices, DType::int32, {w.rows(), 64}), options, gpu.ctx);
  EXPECT_EQ(status.code(), dsa::ErrorCode::length_out_of_range) << status.to_string();
}


struct FusedCase {
  std::string name;
  WorkloadSpec spec;
  int k = dsa::kMaxTopk;
  int workers = 0;  // 0: one per multiprocessor
  LogitsPath path = LogitsPath::native;
  bool zero_weights = false;  // every logit 0: the winners are the first positions
  float weight_scale = 1.0f;  // large: logits overflow
  float first_request_scale = 1.0f;  // request 0's weights only
  // The cached scale of every token the fused sampling pass scores, times
  // this: samples far above the rest of their rows, whose thresholds then
  // admit fewer than k positions (the rows are selected again without them).
  float sampled_scale = 1.0f;
};

namespace sampling = dsa::detail::cuda;

// Each request's sampled tokens (row_samples.hpp) with their cached scale times `factor`.
void scale_sampled_tokens(Workload& w, float factor) {
  for (std::int64_t b = 0; b < w.batch; ++b) {
    const sampling::SampleMap map = sampling::sample_map(w.needed_pages(b));
    for (std::int32_t u = 0; u < map.count; ++u) {
      const std::int64_t position = sampling::sample_position(map, u);
      const std::int64_t slot = w.geometry.position_slot(w.block_table.data() + b * w.max_blocks, position);
      float scale = 0.0f;
      std::uint8_t* at = w.cache.data() + w.geometry.scale_byte(slot);
      std::memcpy(&scale, at, sizeof scale);
      scale *= factor;
      std::memcpy(at, &scale, sizeof scale);
    }
  }
}

// Rows whose sampled threshold (row_samples.hpp, on the reference logits)
// admits fewer than k of their positions.
int rows_short_of_k(const Workload& w, const std::vector<float>& logits, int k) {
  int short_rows = 0;
  for (std::int64_t row = 0; row < w.rows(); ++row) {
    const std::int64_t length = w.causal_lens[row];
    const sampling::SampleMap map = sampling::sample_map(w.needed_pages(row / w.next_n));
    const std::int32_t samples = sampling::samples_below(map, length);
    const std::int32_t r = sampling::threshold_rank(samples, length, k);
    if (r == 0) continue;
    const float* values = logits.data() + row * w.max_context_len;
    std::vector<float> sampled;
    for (std::int32_t u = 0; u < samples; ++u) sampled.push_back(values[sampling::sample_position(map, u)]);
    std::nth_element(sampled.begin(), sampled.begin() + (r - 1), sampled.end(), std::greater<float>());
    const float threshold = sampled[r - 1];
    if (std::count_if(values, values + length, [&](float v) { return v >= threshold; }) < k) ++short_rows;
  }
  return short_rows;
}

// Each row's k entries in increasing order: unsorted output is a set.
std::vector<std::int32_t> sorted_rows(std::vector<std::int32_t> indices, int k) {
  for (std::size_t row = 0; row + static_cast<std::size_t>(k) <= indices.size(); row += static_cast<std::size_t>(k)) {
    std::sort(indices.begin() + static_cast<std::ptrdiff_t>(row),
              indices.begin() + static_cast<std::ptrdiff_t>(row) + k);
  }
  return indices;
}

void PrintTo(const FusedCase& c, std::ostream* out) { *out << c.name; }

std::vector<FusedCase> fused_cases() {
  std::vector<FusedCase> cases;
  auto add = [&](std::string name, std::int64_t batch, int next_n, std::vector<std::int32_t> prefixes) {
    FusedCase c;
    c.name = std::move(name);
    c.spec.batch = batch;
    c.spec.next_n = next_n;
    c.spec.prefix_lens = std::move(prefixes);
    c.spec.seed = 1000 + cases.size();
    cases.push_back(c);
    return &cases.back();
  };
  add("n4_long_three_workers", 3, 4, {30000, 9000, 41000})->workers = 3;
  add("n4_long_every_worker", 3, 4, {30000, 9000, 41000});
  add("n1_long", 2, 1, {60000, 5000});
  add("n2_per_token", 2, 2, {20000, 30000})->path = LogitsPath::per_token;
  {
    FusedCase* c = add("n8_h32", 2, 8, {12000, 25000});
    c->spec.heads = 32;
    c->workers = 16;
  }
  {
    FusedCase* c = add("ties_n2", 2, 2, {15000, 9000});
    c->zero_weights = true;
    c->workers = 5;
  }
  {
    FusedCase* c = add("small_k_n3", 3, 3, {8000, 100, 20000});
    c->k = 17;
    c->workers = 11;
  }
  add("rows_about_k_n2", 3, 2, {500, 2100, 0})->workers = 2;
  // Every row spread over many workers, each a page or two: short enough for
  // the sanitizers.
  add("short_every_worker_n2", 4, 2, {3000, 1500, 2500, 4000});
  {
    // Logits at and past the float range (+inf, and NaN where +inf and -inf
    // meet): compactions among the top ranks.
    FusedCase* c = add("overflowing_logits_n1", 1, 1, {20000});
    c->weight_scale = 1e37f;
    c->workers = 2;
  }
  {
    // Long rows mostly scored by one worker each: one list takes most of a
    // row's admissions.
    FusedCase* c = add("n3_many_long_requests", 24, 3, {});
    c->spec.min_prefix = 40000;
    c->spec.max_prefix = 80000;
  }
  {
    FusedCase* c = add("n4_many_requests", 160, 4, {});
    c->spec.min_prefix = 5000;
    c->spec.max_prefix = 12000;
  }
  // One worker walks more than 4096 pages of a request: its queries are
  // loaded again halfway, and its lists carry on across the two loads.
  add("one_worker_reloads_queries_n2", 1, 2, {4300 * 64})->workers = 1;
  {
    // One worker walks three requests, so the third's queries land in the
    // query slot the first used, whose lists held logits far above the
    // third's: nothing of the first request may shape the third's selection.
    FusedCase* c = add("one_worker_three_requests_n2", 3, 2, {20000, 20000, 20000});
    c->workers = 1;
    c->first_request_scale = 1000.0f;
  }
  {
    // Six draft rows: two selector warps keep two lists each, over long
    // ranges of four workers.
    FusedCase* c = add("n6_two_lists_per_selector", 2, 6, {40000, 30000});
    c->workers = 4;
  }
  // One request over every worker: at next_n = 1 its row has four lists per
  // worker, over 512 from 128 workers on (528 with 132), so the selection
  // reads them in windows of 512 lists.
  add("n1_one_request_every_worker", 1, 1, {100000});
  // Rows long enough for the sampling pass, spread over every worker (a
  // page or two each): short enough for the sanitizers.
  add("sampled_every_worker_n2", 2, 2, {17000, 3000});
  {
    // Every logit 0 past the sampling threshold: the threshold admits every
    // position, and the lists compact as without one.
    FusedCase* c = add("ties_sampled_n1", 1, 1, {20000});
    c->zero_weights = true;
    c->workers = 3;
  }
  {
    // The same where a row has one part (n3) and a selector warp two rows'
    // lists (n6): each worker's lists take every position and compact.
    FusedCase* c = add("ties_sampled_n3", 1, 3, {20000});
    c->zero_weights = true;
    c->workers = 2;
  }
  {
    FusedCase* c = add("ties_sampled_n6", 2, 6, {20000, 17000});
    c->zero_weights = true;
    c->workers = 3;
  }
  {
    // Sampled tokens scoring far above the others: rows selected again.
    FusedCase* c = add("misleading_samples_n2", 3, 2, {30000, 50000, 12000});
    c->sampled_scale = 64.0f;
    c->workers = 7;
  }
  return cases;
}

class GpuFusedIndexTopk : public ::testing::TestWithParam<FusedCase> {};

TEST_P(GpuFusedIndexTopk, EqualsLogitsThenTopk) {
  DSA_REQUIRE_HOPPER();
  const FusedCase& c = GetParam();
  Workload w = make_workload(c.spec);
  if (c.zero_weights) std::fill(w.weights.begin(), w.weights.end(), 0.0f);
  for (float& weight : w.weights) weight *= c.weight_scale;
  for (std::int64_t i = 0; i < std::int64_t{w.next_n} * w.heads; ++i) w.weights[i] *= c.first_request_scale;
  if (c.sampled_scale != 1.0f) scale_sampled_tokens(w, c.sampled_scale);
  const DeviceWorkload dw(w);
  const std::int64_t rows = w.rows();
  const int k = c.k;
  dsa::ExecContext query;
  dsa::IndexTopkOptions options;
  options.k = k;
  options.path = c.path;
  GpuContext gpu(Backend::automatic, workspace_for(rows, w.max_context_len, options, query));
  gpu.ctx.check_device_errors = true;
  const int workers = c.workers > 0 ? c.workers : workers_for(gpu.ctx);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, workers, c.path, gpu.ctx);

  const dsa::DeviceBuffer logits = reference_logits(dw, schedule, c.path, gpu.ctx);
  if (c.sampled_scale != 1.0f) {
    // The case is only worth its name if some threshold does fall short.
    EXPECT_GT(rows_short_of_k(w, host_copy<float>(logits), k), 0) << c.name;
  }
  for (bool sorted : {true, false}) {
    for (bool physical : {false, true}) {
      const std::vector<std::int32_t> expected = reference_indices(dw, logits, k, sorted, physical, gpu.ctx);
      options.sorted = sorted;
      options.physical_slots = physical;
      options.strategy = dsa::IndexTopkStrategy::fused;
      for (int repeat = 0; repeat < 2; ++repeat) {
        const dsa::DeviceBuffer got = device_filled(4 * rows * k, 0xFF);
        DSA_GPU_ASSERT_OK(dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(),
                                          dw.block_table_view(), schedule_view(schedule), w.max_context_len,
                                          dw.causal_view(), device_view(got, DType::int32, {rows, k}), options,
                                          gpu.ctx));
        const std::vector<std::int32_t> indices = host_copy<std::int32_t>(got);
        EXPECT_EQ(sorted ? indices : sorted_rows(indices, k), sorted ? expected : sorted_rows(expected, k))
            << c.name << (sorted ? " sorted" : " unsorted") << (physical ? " physical slots" : "")
            << " run " << repeat;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuFusedIndexTopk, ::testing::ValuesIn(fused_cases()),
                         [](const ::testing::TestParamInfo<FusedCase>& info) { return info.param.name; });

dsa::IndexTopkOptions native_fused_options() {
  dsa::IndexTopkOptions options;
  options.strategy = dsa::IndexTopkStrategy::fused;
  options.path = LogitsPath::native;
  return options;
}

// index_topk, fused on the native path, into a poisoned output; top-k
// lengths `topk_lens`, or the causal lengths.
dsa::Status run_native_fused(const DeviceWorkload& dw, const dsa::TensorView& schedule, const dsa::ExecContext& ctx,
                             const std::vector<std::int32_t>* topk_lens = nullptr) {
  const Workload& w = *dw.host;
  const dsa::IndexTopkOptions options = native_fused_options();
  const dsa::DeviceBuffer indices = device_filled(4 * w.rows() * options.k, 0xFF);
  const dsa::DeviceBuffer topk_lens_device = device_copy(topk_lens != nullptr ? *topk_lens : w.causal_lens);
  return dsa::index_topk(dw.q_view(), dw.cache_view(), dw.weights_view(), dw.lens_view(), dw.block_table_view(),
                         schedule, w.max_context_len, device_view(topk_lens_device, DType::int32, {w.rows()}),
                         device_view(indices, DType::int32, {w.rows(), options.k}), options, ctx);
}

// Two requests of two draft rows, of the given prefix lengths.
Workload two_requests_n2(std::vector<std::int32_t> prefixes) {
  WorkloadSpec spec;
  spec.batch = 2;
  spec.next_n = 2;
  spec.prefix_lens = std::move(prefixes);
  return make_workload(spec);
}

// A context with the workspace the query gives for the fused strategy.
GpuContext fused_context(const Workload& w) {
  dsa::ExecContext query;
  return GpuContext(Backend::automatic,
                    dsa::index_topk_workspace_bytes(w.rows(), w.max_context_len, native_fused_options(), query));
}

// Worker ranges that overlap (a schedule out of order) are reported, and the
// selection neither hangs nor reads past its lists on the positions listed twice.
TEST(GpuIndexTopk, FusedReportsOverlappingSchedule) {
  DSA_REQUIRE_HOPPER();
  WorkloadSpec spec;
  spec.batch = 1;
  spec.next_n = 1;
  spec.prefix_lens = {12000};
  const Workload w = make_workload(spec);
  const DeviceWorkload dw(w);
  GpuContext gpu = fused_context(w);
  gpu.ctx.check_device_errors = true;
  // Workers start at chunks 0, 20 and 10 of the one request: 10..19 twice.
  const dsa::DeviceBuffer schedule = device_copy(std::vector<std::int32_t>{0, 0, 0, 20, 0, 10, 1, 256});
  const dsa::Status status = run_native_fused(dw, device_view(schedule, DType::int32, {4, 2}), gpu.ctx);
  EXPECT_EQ(status.code(), dsa::ErrorCode::schedule_mismatch) << status.to_string();
}

// On rows long enough for the sampling pass, the pass applies the top-k
// length rules (it finds each row's selection length): a top-k length past
// the row's context and a negative one are reported as the unfused call
// reports them.
TEST(GpuIndexTopk, FusedSampledRowsReportTopkLengthRules) {
  DSA_REQUIRE_HOPPER();
  const Workload w = two_requests_n2({17000, 20000});
  const DeviceWorkload dw(w);
  GpuContext gpu = fused_context(w);
  gpu.ctx.check_device_errors = true;
  const dsa::DeviceBuffer schedule = plan_on_device(dw, workers_for(gpu.ctx), LogitsPath::native, gpu.ctx);
  std::vector<std::int32_t> beyond = w.causal_lens;
  beyond[3] += 5;
  const dsa::Status beyond_status = run_native_fused(dw, schedule_view(schedule), gpu.ctx, &beyond);
  EXPECT_EQ(beyond_status.code(), dsa::ErrorCode::length_out_of_range) << beyond_status.to_string();
  std::vector<std::int32_t> negative = w.causal_lens;
  negative[2] = -3;
  const dsa::Status negative_status = run_native_fused(dw, schedule_view(schedule), gpu.ctx, &negative);
  EXPECT_EQ(negative_status.code(), dsa::ErrorCode::invalid_argument) << negative_status.to_string();
  // The same workspace serves a valid call next: no violation stays behind.
  const dsa::Status valid_status = run_native_fused(dw, schedule_view(schedule), gpu.ctx);
  EXPECT_TRUE(valid_status.ok()) << valid_status.to_string();
}

// A schedule with more workers than the workspace query planned for needs a
// larger workspace, and the call says so rather than overrun it.
TEST(GpuIndexTopk, FusedWorkspaceFollowsTheSchedule) {
  DSA_REQUIRE_HOPPER();
  const Workload w = two_requests_n2({3000, 4000});
  const DeviceWorkload dw(w);
  GpuContext gpu = fused_context(w);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, 4 * workers_for(gpu.ctx), LogitsPath::native, gpu.ctx);
  const dsa::Status status = run_native_fused(dw, schedule_view(schedule), gpu.ctx);
  EXPECT_EQ(status.code(), dsa::ErrorCode::workspace_too_small) << status.to_string();
}

}  // namespace
}  // namespace dsa_test::gpu
