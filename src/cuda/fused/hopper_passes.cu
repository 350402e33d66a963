// Host side of the fused index_topk's passes on sm_90a (hopper_passes.hpp):
// the sampling kernel's grid, and the selection kernel launched through the
// logits kernel's machinery (hopper/scoring_launch.cuh).
#include "cuda/fused/hopper_passes.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_check.hpp"
#include "cuda/fused/sample_scores_kernel.cuh"
#include "cuda/fused/select_pages.cuh"
#include "cuda/hopper/scoring_launch.cuh"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda::hopper {

namespace {

// The most tiles of sampled tokens a unit has.
int most_sample_tiles(std::int64_t max_context_len) {
  const std::int64_t samples = most_samples(pages_for_length(max_context_len, kStageTokens));
  return static_cast<int>((samples + kSampleTileTokens - 1) / kSampleTileTokens);
}

// Tiles one sampling CTA scores: as many as puts every CTA in the first
// wave (`resident` CTAs at once, 0 when unknown), so that each pays its
// queries' load and its first gathers' latency once and no second wave
// starts late.
int sample_tiles_per_cta(std::int64_t units, int tiles, std::int64_t resident) {
  const std::int64_t ctas = std::max<std::int64_t>(resident, 1);
  return static_cast<int>(std::max<std::int64_t>((units * tiles + ctas - 1) / ctas, 1));
}

template <int kRows, int kHeads>
Status launch_samples(const LogitsKernelParams& params, int device, const RowSamples& samples,
                      const ExecContext& ctx, const CUtensorMap& query_map) {
  using Layout = SampleLayout<kRows, kHeads>;
  constexpr auto kernel = &sample_scores_kernel<kRows, kHeads>;
  DSA_RETURN_IF_ERROR(allow_shared_bytes<kernel>(Layout::launch_bytes));
  const std::int64_t units = schedule_units(params.batch, params.next_n, params.path);
  const int tiles = most_sample_tiles(params.max_context_len);
  const int tiles_per_cta = sample_tiles_per_cta(
      units, tiles, resident_blocks<kernel>(kSampleThreads, Layout::launch_bytes, device));
  const dim3 grid(static_cast<unsigned>(units),
                  static_cast<unsigned>(std::max(1, (tiles + tiles_per_cta - 1) / tiles_per_cta)));
  return launch_kernel("sample_scores_kernel", kernel, {grid, kSampleThreads, Layout::launch_bytes}, ctx, params,
                       samples, tiles_per_cta, query_map);
}

}  // namespace

Status paged_mqa_samples(const LogitsProblem& p, const RowSamples& samples, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_hopper_problem(p));
  const std::int64_t units = schedule_units(p.batch, p.next_n, p.path);
  if (units == 0) return Status::success();
  const int rows = p.rows_per_unit();
  CUtensorMap query_map{};
  DSA_RETURN_IF_ERROR(encode_maps(p, &query_map, nullptr));
  const LogitsKernelParams params = kernel_params(p, ctx);
  return for_rows(rows, [&](auto rows_constant) {
    constexpr int kRows = decltype(rows_constant)::value;
    if (p.heads == 32) return launch_samples<kRows, 32>(params, p.device.index, samples, ctx, query_map);
    return launch_samples<kRows, 64>(params, p.device.index, samples, ctx, query_map);
  });
}

Status paged_mqa_candidates(const LogitsProblem& p, const CandidateSelection& selection,
                            const ExecContext& ctx) {
  LogitsKernelParams params = kernel_params(p, ctx);
  params.logits = nullptr;
  params.clean_logits = false;
  params.select_lengths = selection.lengths;
  params.select_k = selection.k;
  // Compacting close to k leaves most of a list free, so compactions are rare.
  params.keep_limit = selection.k + (selection.lists.capacity - selection.k) / 16;
  params.lists = selection.lists;
  params.select_floors = selection.floors;
  params.run_if = selection.run_if;
  return launch_scoring<true>(p, params, ctx);
}

}  // namespace dsa::detail::cuda::hopper
