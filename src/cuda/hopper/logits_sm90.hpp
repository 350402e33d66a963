// Paged MQA logits on sm_90a: FP8 wgmma with the cache page as the A operand,
// tensor-copied pages in a multi-stage pipeline, three producer warps and three
// or four consumer warpgroups, persistent grid walking the schedule. The native path
// reads each request's keys once for all of its next_n draft rows.
#pragma once

#include <cstdint>

#include "cuda/candidate_lists.hpp"
#include "cuda/row_samples.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "common/problem.hpp"

namespace dsa::detail::cuda::hopper {

// True when the native path has a kernel for this shape: next_n 1..8,
// H in {32, 64}, D == 128.
bool supports_native(int next_n, int heads, int head_dim);

// Enqueues the logits computation on ctx.stream (native or per-token path as
// p.path says). The per-token path serves any next_n for the heads and head
// dimension supports_native accepts. The caller has cleared the error record.
Status paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx);

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
