// The launch machinery of the sm_90a scoring kernels that the logits
// (logits_sm90.cu) and the fused index_topk's passes (fused/hopper_passes.cu)
// share: the checks the kernels rely on, tensor maps, kernel parameters and
// the launch of a logits kernel instance, kSelect making it the selection
// kernel (whose selector warps fused/select_pages.cuh defines).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "common/problem.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/hopper/logits_sm90_kernel.cuh"
#include "cuda/launch_utils.hpp"
#include "dsa/context.hpp"
#include "dsa/status.hpp"

namespace dsa::detail::cuda::hopper {

// The checks every Hopper kernel relies on.
Status check_hopper_problem(const LogitsProblem& p);

// The tensor map of p's queries (a box per unit of p.rows_per_unit() draft
// rows) and, when key_map is given, the key cache's.
Status encode_maps(const LogitsProblem& p, CUtensorMap* query_map, CUtensorMap* key_map);

// The kernels' view of p, recording into ctx's error record.
LogitsKernelParams kernel_params(const LogitsProblem& p, const ExecContext& ctx);

// Launches the kernel instance for units of kRows draft rows of kHeads heads
// (kSelect: the selection kernel; kUneven: row tiles of request_offsets;
// kFp4Keys, kFp4Queries: the operands' formats) on ctx.stream, one CTA per
// worker.
template <int kRows, int kHeads, bool kSelect, bool kUneven = false, bool kFp4Keys = false, bool kFp4Queries = false>
Status launch(const LogitsKernelParams& params, const ExecContext& ctx, const CUtensorMap& key_map,
              const CUtensorMap& query_map) {
  using Layout = SharedLayout<kRows, kHeads, kSelect>;
  constexpr int kSharedBytes = Layout::launch_bytes;
  constexpr auto kernel =
      &paged_logits_sm90_kernel<kRows, kHeads, kScoringPassColumns, kSelect, kUneven, kFp4Keys, kFp4Queries>;
  DSA_RETURN_IF_ERROR(allow_shared_bytes<kernel>(kSharedBytes));
  return launch_kernel("paged_logits_sm90_kernel", kernel,
                       {static_cast<unsigned>(params.num_workers), Layout::kThreads, kSharedBytes}, ctx, params,
                       key_map, query_map);
}

// Calls launch(std::integral_constant<int, rows>{}) for the kernels' row counts.
template <typename Launch>
Status for_rows(int rows, Launch&& launch) {
  switch (rows) {
    case 1: return launch(std::integral_constant<int, 1>{});
    case 2: return launch(std::integral_constant<int, 2>{});
    case 3: return launch(std::integral_constant<int, 3>{});
    case 4: return launch(std::integral_constant<int, 4>{});
    case 5: return launch(std::integral_constant<int, 5>{});
    case 6: return launch(std::integral_constant<int, 6>{});
    case 7: return launch(std::integral_constant<int, 7>{});
    case 8: return launch(std::integral_constant<int, 8>{});
    default: break;
  }
  return {ErrorCode::internal, "paged_mqa_logits: no Hopper kernel for " + std::to_string(rows) +
                                   " rows per unit"};
}

// The scoring instance of p's operand formats: fp8 keys and queries, fp4 keys
// with fp8 queries, or fp4 keys and queries (fp4 queries over fp8 keys are
// the generic kernels').
template <int kRows, int kHeads, bool kUneven>
Status launch_formats(const LogitsProblem& p, const LogitsKernelParams& params, const ExecContext& ctx,
                      const CUtensorMap& key_map, const CUtensorMap& query_map) {
  if (!p.fp4_keys()) return launch<kRows, kHeads, false, kUneven>(params, ctx, key_map, query_map);
  if (p.fp4_queries()) return launch<kRows, kHeads, false, kUneven, true, true>(params, ctx, key_map, query_map);
  return launch<kRows, kHeads, false, kUneven, true>(params, ctx, key_map, query_map);
}

// Units of p.rows_per_unit() draft rows: the selection kernel (kSelect, fp8
// only) or the scoring kernel of p's formats.
template <int kHeads, bool kSelect>
Status launch_for_rows(const LogitsProblem& p, const LogitsKernelParams& params, const ExecContext& ctx,
                       const CUtensorMap& key_map, const CUtensorMap& query_map) {
  return for_rows(p.rows_per_unit(), [&](auto rows_constant) {
    constexpr int kRows = decltype(rows_constant)::value;
    if constexpr (kSelect) {
      return launch<kRows, kHeads, true>(params, ctx, key_map, query_map);
    } else {
      return launch_formats<kRows, kHeads, false>(p, params, ctx, key_map, query_map);
    }
  });
}

// The row-tile kernels of requests of uneven row counts: tiles of
// kVarlenRowTile rows on the native path, one row on the per-token path.
template <int kHeads>
Status launch_uneven(const LogitsProblem& p, const LogitsKernelParams& params, const ExecContext& ctx,
                     const CUtensorMap& key_map, const CUtensorMap& query_map) {
  const int rows = p.rows_per_unit();
  if (rows == 1) return launch_formats<1, kHeads, true>(p, params, ctx, key_map, query_map);
  if (rows == kVarlenRowTile) return launch_formats<kVarlenRowTile, kHeads, true>(p, params, ctx, key_map, query_map);
  return {ErrorCode::internal, "paged_mqa_logits: no Hopper kernel for row tiles of " + std::to_string(rows) +
                                   " rows"};
}

// Checks, tensor maps and the launch of either kernel family with `params`
// (kernel_params' and, for the selection kernel, its own fields).
template <bool kSelect>
Status launch_scoring(const LogitsProblem& p, const LogitsKernelParams& params,
                      const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_hopper_problem(p));
  CUtensorMap key_map{};
  CUtensorMap query_map{};
  DSA_RETURN_IF_ERROR(encode_maps(p, &query_map, &key_map));
  if constexpr (!kSelect) {
    if (p.varlen.offsets != nullptr) {
      if (p.heads == 32) return launch_uneven<32>(p, params, ctx, key_map, query_map);
      return launch_uneven<64>(p, params, ctx, key_map, query_map);
    }
  }
  if (p.heads == 32) return launch_for_rows<32, kSelect>(p, params, ctx, key_map, query_map);
  return launch_for_rows<64, kSelect>(p, params, ctx, key_map, query_map);
}

}  // namespace dsa::detail::cuda::hopper
