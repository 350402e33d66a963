// index_topk on the CPU. The fused strategy scores rows into per-thread
// buffers of topk_lens[r] floats and selects from them, so no logits matrix
// exists: the threaded path scores a unit's rows together (each block of
// keys decoded once for all of them), the longest units first; the
// reference scores one row at a time. logits_then_topk runs the logits pass
// into a buffer of its own, then selects from its rows; so does the
// threaded fused strategy when there are fewer than two units per thread,
// which would leave threads idle (the buffer then holds no more rows than
// two units per thread, twice the fused pass's own buffers at most).
// Units are those of the schedule (a request's rows, a row tile of uneven
// requests, or a row). Both use the arithmetic of paged_mqa_logits and the selection of topk, so
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
  // The threaded fused pass scores each unit's rows together (as the
  // logits pass does, so that the values agree), the reference one row at a time.
  std::vector<UnitSpan> units;
  const UnitLayout layout = unit_layout(scoring);
  for (std::int64_t unit = 0; unit < layout.units;) {
    units.push_back(unit_containing(layout, unit));
    unit = units.back().next;
  }
  const bool staged = !p.fused || (parallel && static_cast<std::int64_t>(units.size()) < 2 * threads);
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
  const bool grouped = !staged && parallel;
  if (!grouped) {
    units.clear();
    for (std::int64_t row = 0; row < scoring.rows(); ++row) {
      units.push_back(UnitSpan{row, row + 1, table_row_of(scoring, row), row, 1});
    }
  }
  std::vector<GroupScratch> scratch(static_cast<std::size_t>(threads));
  const auto select_group = [&](std::int64_t group_index, int thread) {
    GroupScratch& s = scratch[static_cast<std::size_t>(thread)];
    const UnitSpan& unit = units[static_cast<std::size_t>(group_index)];
    const std::int64_t first_row = unit.first_row, group_rows = unit.rows;
    s.values.resize(static_cast<std::size_t>(group_rows));
    // Rows no longer than k select every position without scores.
    const auto needs_scores = [&](std::int64_t length) { return length > p.k; };
    if (grouped) {
      s.group.load(scorer, unit.request, first_row, group_rows);
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
          score_row(scorer, row, unit.request, length, mode, &s.reference, buffer.data());
        }
        values = buffer.data();
      }
      std::int32_t* out = p.indices + row * p.indices_stride;
      select_row(values, length, p.k, p.sorted, &s.select, out);
      if (p.physical_slots) {
        positions_to_slots(scoring.block_table + unit.request * scoring.block_table_stride,
                           scoring.cache.page_tokens, p.k, out);
      }
    }
  };
  const auto groups = static_cast<std::int64_t>(units.size());
  if (parallel) {
    // Longest groups first, so that the last ones to start are short and
    // the threads finish together.
    std::vector<std::int64_t> order(static_cast<std::size_t>(groups));
    std::vector<std::int64_t> longest(static_cast<std::size_t>(groups), 0);
    for (std::int64_t group = 0; group < groups; ++group) {
      const UnitSpan& unit = units[static_cast<std::size_t>(group)];
      for (std::int64_t row = unit.first_row; row < unit.first_row + unit.rows; ++row) {
        longest[static_cast<std::size_t>(group)] = std::max(longest[static_cast<std::size_t>(group)], topk_length(p, row));
      }
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
