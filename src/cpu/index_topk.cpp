// index_topk on the CPU. The fused strategy scores one row at a time into a
// per-thread buffer of topk_lens[r] floats and selects from it, so no logits
// matrix exists. logits_then_topk runs the logits pass into a buffer of its
// own, then selects from its rows.
// Both use the arithmetic of paged_mqa_logits and the selection of topk, so
// the result is exactly topk(paged_mqa_logits(...)).
#include <algorithm>
#include <vector>

#include "backend.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "schedule_walk.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

std::int64_t topk_length(const IndexTopkProblem& p, std::int64_t row) {
  if (p.topk_lens != nullptr) return p.topk_lens[row * p.topk_lens_stride];
  return row_length(p.logits.lens, row / p.logits.next_n, row % p.logits.next_n);
}

struct RowScratch {
  std::vector<float> values;
  RowScoreScratch scoring;
  SelectScratch select;
};

}  // namespace

Status index_topk(const IndexTopkProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_index_topk_data(p));
  LogitsProblem scoring = p.logits;
  const bool staged = !p.fused;
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
  const ScoreMode mode = parallel                   ? ScoreMode::blocked
                         : ctx.reference_float64 ? ScoreMode::plain_float64
                                                 : ScoreMode::plain_float;
  std::vector<RowScratch> scratch(static_cast<std::size_t>(parallel ? thread_count(ctx) : 1));
  const auto select = [&](std::int64_t row, int thread) {
    RowScratch& s = scratch[static_cast<std::size_t>(thread)];
    const std::int64_t length = topk_length(p, row);
    std::int32_t* out = p.indices + row * p.indices_stride;
    const float* values = nullptr;
    if (staged) {
      values = static_cast<const float*>(scoring.logits) + row * scoring.logits_stride;
    } else if (length > p.k) {  // shorter rows select every position without scores
      s.values.resize(static_cast<std::size_t>(length));
      score_row(scorer, row / scoring.next_n, row % scoring.next_n, length, mode, &s.scoring,
                s.values.data());
      values = s.values.data();
    }
    select_row(values, length, p.k, p.sorted, &s.select, out);
    if (p.physical_slots) {
      positions_to_slots(scoring.block_table + (row / scoring.next_n) * scoring.block_table_stride, p.k, out);
    }
  };
  if (parallel) {
    parallel_for_items(scoring.rows(), ctx, select);
  } else {
    for (std::int64_t row = 0; row < scoring.rows(); ++row) select(row, 0);
  }
  return Status::success();
}

}  // namespace dsa::detail::cpu
