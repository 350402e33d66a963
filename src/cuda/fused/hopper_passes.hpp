// The passes of the fused index_topk that run on the sm_90a scoring machinery
// (hopper/scoring_launch.cuh): the sampling pass (sample_scores_kernel.cuh)
// and the selection kernel, the logits kernel with selector warps
// (select_pages.cuh) that leaves candidate lists instead of logits.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "cuda/fused/candidate_lists.hpp"
#include "cuda/fused/row_samples.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"

namespace dsa::detail::cuda::hopper {

// Where the sampling pass leaves its results (row_samples.hpp). A row's
// samples below a length are the first samples_below(map, length) values.
struct RowSamples {
  float* values = nullptr;    // [rows][kSampleCapacity]: sample u of row r at r * kSampleCapacity + u
  SampleMap* maps = nullptr;  // [rows] the map of the row's unit
};

// Scores the sampled positions of every row (row_samples.hpp) into `samples`:
// each value is the logit paged_mqa_logits computes for its position.
Status paged_mqa_samples(const LogitsProblem& p, const RowSamples& samples, const ExecContext& ctx);

// What the selection kernel needs beyond the scoring inputs.
struct CandidateSelection {
  const std::int32_t* lengths = nullptr;  // [rows] positions [0, length) of each row compete
  int k = 0;
  CandidateLists lists;  // counters cleared by the caller
  // Per row, the lowest rank its lists take (0: any); nullptr: none.
  const unsigned long long* floors = nullptr;
  // When set, the kernel does nothing unless *run_if != 0 (a flag an earlier
  // kernel of the stream raised).
  const std::int32_t* run_if = nullptr;
};

// The same scoring as paged_mqa_logits (p.logits unused), but instead of the
// logits each worker leaves, per row it scores, a candidate list holding the
// top-k of the positions it scored (candidate_lists.hpp).
Status paged_mqa_candidates(const LogitsProblem& p, const CandidateSelection& selection,
                            const ExecContext& ctx);

}  // namespace dsa::detail::cuda::hopper
