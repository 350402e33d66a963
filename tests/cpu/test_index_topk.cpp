// index_topk on the CPU backends: exactly topk(paged_mqa_logits(...)), and a
// selection that the float64 reference agrees with.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

struct IndexTopkCase {
  std::string name;
  WorkloadSpec spec;
  int k = 2048;
  bool sorted = false;
  bool physical_slots = false;
  bool pass_topk_lens = true;  // false: empty view (the causal lengths are the context lengths)
  dsa::LogitsPath path = dsa::LogitsPath::automatic;
};

struct IndexProblem {
  Workload w;
  Schedule schedule;
};

dsa::Status make_setup(const IndexTopkCase& c, const dsa::ExecContext& ctx, IndexProblem* s) {
  s->w = make_workload(c.spec);
  return plan(s->w.context_lens, s->w.batch, s->w.next_n, dsa::default_num_workers(dsa::Device{}, ctx),
              resolved_path(c.path, s->w.next_n, s->w.heads, ctx), ctx, &s->schedule);
}

// The page_size option the 2-D cache view needs: 0 for the default 64.
int page_size_option(const IndexTopkCase& c) {
  return c.spec.page_tokens == dsa::kDefaultPageTokens ? 0 : c.spec.page_tokens;
}

dsa::IndexTopkOptions options_for(const IndexTopkCase& c, dsa::IndexTopkStrategy strategy) {
  dsa::IndexTopkOptions options;
  options.k = c.k;
  options.sorted = c.sorted;
  options.physical_slots = c.physical_slots;
  options.path = c.path;
  options.strategy = strategy;
  options.page_size = page_size_option(c);
  return options;
}

// Runs index_topk with a workspace of the size the library asks for.
dsa::Status run_index_topk(IndexProblem& s, const IndexTopkCase& c, dsa::IndexTopkStrategy strategy,
                           const dsa::ExecContext& ctx, OwnedView* indices) {
  Workload& w = s.w;
  *indices = int32_matrix(w.rows(), c.k, c.k, -77);
  HostWorkspace scratch(dsa::index_topk_workspace_bytes(w.rows(), w.max_context_len, options_for(c, strategy), ctx));
  dsa::ExecContext with_workspace = ctx;
  with_workspace.workspace = scratch.workspace;
  return dsa::index_topk(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(), w.context_lens_view(),
                         w.block_table_view(), s.schedule.view(), w.max_context_len,
                         c.pass_topk_lens ? w.causal_lens_view() : dsa::TensorView{}, indices->view,
                         options_for(c, strategy), with_workspace);
}


// The two-step composition the fused operation must equal: positions from
// topk, turned into slots of the cache's pages by the reference's rule.
dsa::Status run_logits_then_topk(IndexProblem& s, const IndexTopkCase& c, const dsa::ExecContext& ctx,
                                 OwnedView* indices) {
  Workload& w = s.w;
  OwnedView logits = float_matrix(w.rows(), w.max_context_len, std::max<std::int64_t>(w.max_context_len, 1), 0.0f);
  dsa::LogitsOptions logits_options;
  logits_options.path = c.path;
  logits_options.page_size = page_size_option(c);
  DSA_RETURN_IF_ERROR(dsa::paged_mqa_logits(w.q_fp8_view(), w.cache_view_2d(), w.weights_view(),
                                            w.context_lens_view(), w.block_table_view(), s.schedule.view(),
                                            w.max_context_len, logits.view, logits_options, ctx));
  *indices = int32_matrix(w.rows(), c.k, c.k, -77);
  dsa::TopkOptions options;
  options.sorted = c.sorted;
  DSA_RETURN_IF_ERROR(dsa::topk(logits.view, w.causal_lens_view(), c.k, indices->view, options, ctx));
  if (c.physical_slots) {
    auto* out = reinterpret_cast<std::int32_t*>(indices->bytes.data());
    for (std::int64_t r = 0; r < w.rows(); ++r) {
      const std::int32_t* table_row = w.block_table.data() + r / w.next_n * w.max_blocks;
      for (std::int32_t& index : std::span(out + r * c.k, static_cast<std::size_t>(c.k))) {
        if (index >= 0) index = static_cast<std::int32_t>(w.geometry.position_slot(table_row, index));
      }
    }
  }
  return {};
}

const std::int32_t* indices_row(const OwnedView& indices, std::int64_t r, int k) {
  return reinterpret_cast<const std::int32_t*>(indices.bytes.data()) + r * k;
}

// Independent check of the selection: the right count of distinct positions,
// and no unselected position whose reference value beats a selected one by
// more than the rounding bound.
::testing::AssertionResult selection_agrees_with_reference(const Workload& w, const ReferenceLogits& ref,
                                                           const OwnedView& indices, int k, bool physical) {
  for (std::int64_t r = 0; r < w.rows(); ++r) {
    const std::int64_t b = r / w.next_n;
    const std::int64_t length = w.causal_lens[r];
    std::vector<std::int32_t> positions;
    const std::int32_t* row = indices_row(indices, r, k);
    std::int64_t padding = 0;
    for (int i = 0; i < k; ++i) {
      if (row[i] == -1) {
        ++padding;
        continue;
      }
      if (padding > 0) return ::testing::AssertionFailure() << "row " << r << ": index after -1 padding";
      std::int32_t p = row[i];
      if (physical) {
        // Undo the slot transform: find the block whose page holds the slot.
        const std::int64_t page_tokens = w.geometry.page_tokens;
        std::int32_t found = -1;
        for (std::int64_t blk = 0; blk * page_tokens < length; ++blk) {
          if (w.block_table[b * w.max_blocks + blk] == row[i] / page_tokens) {
            found = static_cast<std::int32_t>(blk * page_tokens + row[i] % page_tokens);
          }
        }
        p = found;
      }
      positions.push_back(p);
    }
    const std::int64_t expected_count = std::min<std::int64_t>(length, k);
    if (static_cast<std::int64_t>(positions.size()) != expected_count)
      return ::testing::AssertionFailure() << "row " << r << ": " << positions.size() << " indices, want "
                                           << expected_count;
    std::set<std::int32_t> chosen(positions.begin(), positions.end());
    if (static_cast<std::int64_t>(chosen.size()) != expected_count ||
        (expected_count > 0 && (*chosen.begin() < 0 || *chosen.rbegin() >= length)))
      return ::testing::AssertionFailure() << "row " << r << ": duplicate or out-of-range indices";
    if (length <= k) continue;
    double weakest = INFINITY, weakest_magnitude = 0.0;
    for (const std::int32_t p : chosen) {
      if (ref.value[r * ref.cols + p] < weakest) {
        weakest = ref.value[r * ref.cols + p];
        weakest_magnitude = ref.magnitude[r * ref.cols + p];
      }
    }
    for (std::int64_t p = 0; p < length; ++p) {
      if (chosen.count(static_cast<std::int32_t>(p))) continue;
      const double bound = 4e-5 * (weakest_magnitude + ref.magnitude[r * ref.cols + p]) + 1e-30;
      if (ref.value[r * ref.cols + p] > weakest + bound)
        return ::testing::AssertionFailure() << "row " << r << ": position " << p << " (" << ref.value[r * ref.cols + p]
                                             << ") left out while a selected one has " << weakest;
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<IndexTopkCase> index_topk_cases() {
  std::vector<IndexTopkCase> cases;
  auto add = [&](std::string name, WorkloadSpec spec, int k) -> IndexTopkCase& {
    spec.seed = cases.size() + 301;
    cases.push_back(IndexTopkCase{std::move(name), std::move(spec), k});
    return cases.back();
  };
  add("decode_k2048", WorkloadSpec{.batch = 3, .next_n = 1, .min_prefix = 1500, .max_prefix = 3000}, 2048);
  add("decode_k2048_sorted", WorkloadSpec{.batch = 2, .next_n = 1, .min_prefix = 1900, .max_prefix = 2600}, 2048)
      .sorted = true;
  for (int n = 2; n <= 8; n += 3)
    add("causal_next_n" + std::to_string(n), WorkloadSpec{.batch = 2, .next_n = n, .max_prefix = 500}, 64);
  add("expanded_next_n3", WorkloadSpec{.batch = 3, .next_n = 3, .convention = LengthConvention::expanded}, 50);
  add("legacy_next_n2", WorkloadSpec{.batch = 3, .next_n = 2, .convention = LengthConvention::legacy}, 32)
      .pass_topk_lens = false;
  add("causal_empty_topk_lens", WorkloadSpec{.batch = 2, .next_n = 3}, 40).pass_topk_lens = false;
  add("k1", WorkloadSpec{.batch = 3, .next_n = 2}, 1);
  add("k2_sorted", WorkloadSpec{.batch = 3, .next_n = 2}, 2).sorted = true;
  add("length_exactly_k", WorkloadSpec{.batch = 2, .next_n = 2, .context_lens = {64, 65, 63, 64}}, 64);
  add("edge_lengths", WorkloadSpec{.batch = 6, .next_n = 1, .context_lens = {0, 1, 255, 256, 257, 600}}, 256);
  add("physical_slots", WorkloadSpec{.batch = 3, .next_n = 3, .max_prefix = 400, .share_pages = true}, 100)
      .physical_slots = true;
  {
    IndexTopkCase& c = add("physical_slots_sorted_per_token", WorkloadSpec{.batch = 2, .next_n = 2}, 70);
    c.physical_slots = true;
    c.sorted = true;
    c.path = dsa::LogitsPath::per_token;
  }
  add("native_next_n4", WorkloadSpec{.batch = 2, .next_n = 4, .max_prefix = 700}, 128).path = dsa::LogitsPath::native;
  add("h32", WorkloadSpec{.batch = 2, .next_n = 2, .heads = 32}, 100);
  // 32-token pages: slots of the cache's pages, sorted or not, on either path.
  add("p32_physical_slots",
      WorkloadSpec{.batch = 3, .next_n = 3, .max_prefix = 400, .share_pages = true, .page_tokens = 32}, 100)
      .physical_slots = true;
  {
    IndexTopkCase& c = add("p32_physical_slots_sorted_per_token",
                           WorkloadSpec{.batch = 2, .next_n = 2, .block_table_padding = INT_MAX, .page_tokens = 32},
                           70);
    c.physical_slots = true;
    c.sorted = true;
    c.path = dsa::LogitsPath::per_token;
  }
  add("p32_physical_slots_decode_k2048",
      WorkloadSpec{.batch = 3, .next_n = 1, .min_prefix = 1500, .max_prefix = 3000, .page_tokens = 32}, 2048)
      .physical_slots = true;
  add("p32_edge_lengths",
      WorkloadSpec{.batch = 8, .next_n = 1, .context_lens = {0, 1, 31, 32, 33, 64, 65, 600}, .page_tokens = 32}, 32)
      .physical_slots = true;
  add("p32_causal_next_n5", WorkloadSpec{.batch = 2, .next_n = 5, .max_prefix = 500, .page_tokens = 32}, 64);
  add("empty_batch", WorkloadSpec{.batch = 0, .next_n = 2}, 16);
  // Enough requests for the threaded fused pass to score each request's rows
  // together, with rows of one request at, below and above k.
  add("requests_scored_together",
      WorkloadSpec{.batch = 5, .next_n = 3,
                   .context_lens = {10, 70, 500, 64, 65, 66, 300, 301, 0, 1000, 1001, 1002, 63, 700, 2}},
      64);
  return cases;
}

using Strategy = dsa::IndexTopkStrategy;

void PrintTo(const IndexTopkCase& c, std::ostream* os) { *os << c.name; }

class IndexTopkTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, IndexTopkCase>> {};

TEST_P(IndexTopkTest, EqualsLogitsThenTopkForEveryStrategy) {
  const auto& [backend, c] = GetParam();
  const dsa::ExecContext ctx = cpu_context(backend);
  IndexProblem s;
  DSA_ASSERT_OK(make_setup(c, ctx, &s));
  OwnedView composed;
  DSA_ASSERT_OK(run_logits_then_topk(s, c, ctx, &composed));
  const ReferenceLogits ref = s.w.reference();
  EXPECT_TRUE(selection_agrees_with_reference(s.w, ref, composed, c.k, c.physical_slots));
  for (const Strategy strategy : {Strategy::automatic, Strategy::fused, Strategy::logits_then_topk}) {
    SCOPED_TRACE("strategy " + std::to_string(static_cast<int>(strategy)));
    OwnedView fused;
    DSA_ASSERT_OK(run_index_topk(s, c, strategy, ctx, &fused));
    EXPECT_TRUE(fused.bytes == composed.bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, IndexTopkTest,
    ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(index_topk_cases())),
    [](const ::testing::TestParamInfo<IndexTopkTest::ParamType>& info) {
      return std::get<1>(info.param).name + "_" + backend_label({std::get<0>(info.param), info.index});
    });

class IndexTopkPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

TEST_P(IndexTopkPropertyTest, DeterministicRunToRun) {
  const dsa::ExecContext ctx = cpu_context(GetParam(), 3);
  const IndexTopkCase c{"determinism", WorkloadSpec{.batch = 3, .next_n = 2, .min_prefix = 2100, .max_prefix = 2500}, 2048};
  IndexProblem s;
  DSA_ASSERT_OK(make_setup(c, ctx, &s));
  for (const Strategy strategy : {Strategy::fused, Strategy::logits_then_topk}) {
    OwnedView first, second;
    DSA_ASSERT_OK(run_index_topk(s, c, strategy, ctx, &first));
    DSA_ASSERT_OK(run_index_topk(s, c, strategy, ctx, &second));
    EXPECT_TRUE(first.bytes == second.bytes);
  }
}

TEST_P(IndexTopkPropertyTest, NativeAndPerTokenSelectTheSame) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  IndexTopkCase native{"native", WorkloadSpec{.batch = 2, .next_n = 3, .max_prefix = 900, .seed = 4}, 200};
  native.path = dsa::LogitsPath::native;
  IndexTopkCase per_token = native;
  per_token.path = dsa::LogitsPath::per_token;
  IndexProblem a, b;
  DSA_ASSERT_OK(make_setup(native, ctx, &a));
  DSA_ASSERT_OK(make_setup(per_token, ctx, &b));
  OwnedView from_native, from_per_token;
  DSA_ASSERT_OK(run_index_topk(a, native, Strategy::fused, ctx, &from_native));
  DSA_ASSERT_OK(run_index_topk(b, per_token, Strategy::fused, ctx, &from_per_token));
  EXPECT_TRUE(from_native.bytes == from_per_token.bytes);
}

// CPU operations accept an empty workspace (dsa/context.hpp), whatever the strategy.
TEST_P(IndexTopkPropertyTest, CpuNeedsNoWorkspace) {
  const dsa::ExecContext ctx = cpu_context(GetParam());
  const IndexTopkCase c{"no_workspace", WorkloadSpec{.batch = 2, .next_n = 2, .seed = 6}, 32};
  IndexProblem s;
  DSA_ASSERT_OK(make_setup(c, ctx, &s));
  OwnedView reference_run;
  DSA_ASSERT_OK(run_index_topk(s, c, Strategy::fused, ctx, &reference_run));
  for (const Strategy strategy : {Strategy::automatic, Strategy::fused, Strategy::logits_then_topk}) {
    OwnedView indices = int32_matrix(s.w.rows(), c.k, c.k, -77);
    const dsa::Status status = dsa::index_topk(
        s.w.q_fp8_view(), s.w.cache_view_2d(), s.w.weights_view(), s.w.context_lens_view(), s.w.block_table_view(),
        s.schedule.view(), s.w.max_context_len, s.w.causal_lens_view(), indices.view, options_for(c, strategy), ctx);
    EXPECT_TRUE(status.ok()) << "strategy " << static_cast<int>(strategy) << ": " << status.to_string();
    EXPECT_TRUE(!status.ok() || indices.bytes == reference_run.bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, IndexTopkPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// A workspace sized for a number of rows and a context length serves every
// call of fewer rows or a shorter context, whatever the backend and strategy
// (the CUDA queries need no device; a build without CUDA answers 0).
TEST(IndexTopkWorkspace, SizedForACallServesEverySmallerOne) {
  std::vector<std::int64_t> lengths;
  for (std::int64_t length = 1; length <= 40000; length += 37) lengths.push_back(length);
  for (std::int64_t length = 16000; length <= 16500; ++length) lengths.push_back(length);
  for (std::int64_t length = 40000; length <= 1 << 20; length *= 2) lengths.push_back(length);
  std::sort(lengths.begin(), lengths.end());
  const std::vector<std::int64_t> row_counts = {1, 2, 3, 8, 64, 512};
  for (const dsa::Backend backend : {dsa::Backend::cpu, dsa::Backend::cuda_generic, dsa::Backend::cuda_hopper}) {
    dsa::ExecContext ctx;
    ctx.backend = backend;
    for (const Strategy strategy : {Strategy::automatic, Strategy::fused, Strategy::logits_then_topk}) {
      dsa::IndexTopkOptions options;
      options.strategy = strategy;
      std::vector<std::size_t> fewer_rows(lengths.size(), 0);
      for (const std::int64_t rows : row_counts) {
        std::size_t shorter = 0;
        for (std::size_t i = 0; i < lengths.size(); ++i) {
          const std::size_t bytes = dsa::index_topk_workspace_bytes(rows, lengths[i], options, ctx);
          const std::string where = "backend " + std::to_string(static_cast<int>(backend)) + ", strategy " +
                                    std::to_string(static_cast<int>(strategy)) + ", " + std::to_string(rows) +
                                    " rows, length " + std::to_string(lengths[i]);
          ASSERT_GE(bytes, shorter) << where;
          ASSERT_GE(bytes, fewer_rows[i]) << where;
          shorter = bytes;
          fewer_rows[i] = bytes;
        }
      }
    }
  }
}

}  // namespace
}  // namespace dsa_test
