// index_topk on the CPU. The fused strategy scores rows into per-thread
// buffers of topk_lens[r] floats and selects from them, so no logits matrix
// exists: the threaded path scores a unit's rows together (each block of
// keys decoded once for all of them), the longest units first; the
// reference scores one row at a time. logits_then_topk runs the logits pass
// into a buffer of its own, then selects from its rows; so does the
// threaded fused strategy when there are fewer than two units per thread,
// which would leave threads idle (the buffer then holds no more rows than
// two units per thread, twice the fused pass's own buffers at most).
// Both use the arithmetic of paged_mqa_logits and the selection of topk, so
// the result is exactly topk(paged_mqa_logits(...)).
#include <algorithm>
#include <numeric>
#include <vector>

#include "backend.hpp"
#include "common/cache_format.hpp"
#include "common/schedule_walk.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

std::int64_t topk_length(const IndexTopkProblem& p, std::int64_t row) {
  if (p.topk_lens != nullptr) return p.topk_lens[row * p.topk_lens_stride];
  return row_length(p.logits.lens, row / p.logits.next_n, row % p.logits.next_n);
}

struct GroupScratch {
  std::vector<std::vector<float>> values;  // one buffer per row of the group
  RowGroup group;
  RowScoreScratch reference;
  SelectScratch select;
};

}  // namespace

Status index_topk(const IndexTopkProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_index_topk_data(p));
  LogitsProblem scoring = p.logits;
  const int threads = parallel ? thread_count(ctx) : 1;
  const std::int64_t units = scoring.rows() / scoring.rows_per_unit();
  const bool staged = !p.fused || (parallel && units < 2 * threads);
  std::vector<float> staged_logits;
  if (staged) {
    scoring.logits_dtype = DType::float32;
    scoring.logits_stride = std::max<std::int64_t>(scoring.max_context_len, 1);
    staged_logits.resize(static_cast<std::size_t>(scoring.rows() * scoring.logits_stride));
    scoring.logits = staged_logits.data();
    scoring.clean_logits = false;
    compute_logits(scoring, parallel, ctx);
  }
  const Scorer scorer(scoring);
  // The fused pass scores a unit's rows together when threaded, one row at
  // a time in the reference.
  const bool grouped = !staged && parallel;
  const std::int64_t group_rows = grouped ? scoring.rows_per_unit() : 1;
  std::vector<GroupScratch> scratch(static_cast<std::size_t>(threads));
  const auto select_group = [&](std::int64_t group_index, int thread) {
    GroupScratch& s = scratch[static_cast<std::size_t>(thread)];
    const std::int64_t first_row = group_index * group_rows;
    s.values.resize(static_cast<std::size_t>(group_rows));
    // Rows no longer than k select every position without scores.
    const auto needs_scores = [&](std::int64_t length) { return length > p.k; };
    if (grouped) {
      s.group.load(scorer, first_row / scoring.next_n, first_row % scoring.next_n, group_rows);
      std::int64_t longest = 0;
      for (std::int64_t i = 0; i < group_rows; ++i) {
        const std::int64_t length = topk_length(p, first_row + i);
        const std::int64_t scored = needs_scores(length) ? length : 0;
        s.group.lengths[static_cast<std::size_t>(i)] = scored;
        s.values[static_cast<std::size_t>(i)].resize(static_cast<std::size_t>(scored));
        longest = std::max(longest, scored);
      }
      score_group(scorer, 0, longest, &s.group,
                  [&](std::int64_t i, std::int64_t first, const float* values, std::int64_t count) {
                    std::copy(values, values + count, s.values[static_cast<std::size_t>(i)].data() + first);
                  });
    }
    for (std::int64_t i = 0; i < group_rows; ++i) {
      const std::int64_t row = first_row + i;
      const std::int64_t length = topk_length(p, row);
      const float* values = nullptr;
      if (staged) {
        values = static_cast<const float*>(scoring.logits) + row * scoring.logits_stride;
      } else if (needs_scores(length)) {
        std::vector<float>& buffer = s.values[static_cast<std::size_t>(i)];
        if (!grouped) {
          buffer.resize(static_cast<std::size_t>(length));
          const ScoreMode mode = ctx.reference_float64 ? ScoreMode::plain_float64 : ScoreMode::plain_float;
          score_row(scorer, row / scoring.next_n, row % scoring.next_n, length, mode, &s.reference, buffer.data());
        }
        values = buffer.data();
      }
      std::int32_t* out = p.indices + row * p.indices_stride;
      select_row(values, length, p.k, p.sorted, &s.select, out);
      if (p.physical_slots) {
        positions_to_slots(scoring.block_table + row / scoring.next_n * scoring.block_table_stride,
                           scoring.cache.page_tokens, p.k, out);
      }
    }
  };
  const std::int64_t groups = scoring.rows() / group_rows;
  if (parallel) {
    // Longest groups first, so that the last ones to start are short and
    // the threads finish together.
    std::vector<std::int64_t> order(static_cast<std::size_t>(groups));
    std::vector<std::int64_t> longest(static_cast<std::size_t>(groups), 0);
    for (std::int64_t row = 0; row < scoring.rows(); ++row) {
      std::int64_t& group_longest = longest[static_cast<std::size_t>(row / group_rows)];
      group_longest = std::max(group_longest, topk_length(p, row));
    }
    std::iota(order.begin(), order.end(), std::int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
      return longest[static_cast<std::size_t>(a)] > longest[static_cast<std::size_t>(b)];
    });
    parallel_for_items(groups, ctx, [&](std::int64_t i, int thread) {
      select_group(order[static_cast<std::size_t>(i)], thread);
    });
  } else {
    for (std::int64_t group = 0; group < groups; ++group) select_group(group, 0);
  }
  return Status::success();
}

}  // namespace dsa::detail::cpu
