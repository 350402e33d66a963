// Host side of the sm_90a logits kernel: argument checks the kernel relies
// on, tensor-map encoding and the choice of kernel instance.
#include "cuda/hopper/logits_sm90.hpp"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "cuda/cuda_check.hpp"
#include "cuda/hopper/logits_sm90_kernel.cuh"
#include "cuda/hopper/sample_scores_kernel.cuh"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda::hopper {

namespace {

Status encode_failure(const char* what, CUresult result) {
  return {ErrorCode::cuda_error, std::string("paged_mqa_logits: encoding the ") + what +
                                     " tensor map failed (CUresult " +
                                     std::to_string(static_cast<int>(result)) + ")"};
}

Status tensor_map_encoder(PFN_cuTensorMapEncodeTiled_v12000* encode) {
  void* function = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  DSA_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                                  cudaEnableDefault, &found));
  if (found != cudaDriverEntryPointSuccess || function == nullptr) {
    return {ErrorCode::cuda_error,
            "paged_mqa_logits: the driver does not provide cuTensorMapEncodeTiled"};
  }
  *encode = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function);
  return Status::success();
}

// The key bytes of every page as [num_pages][64 rows][128 bytes], copied one
// page at a time with the 128-byte swizzle the wgmma descriptors expect.
Status encode_key_map(PFN_cuTensorMapEncodeTiled_v12000 encode, const CacheRef& cache,
                      CUtensorMap* map) {
  // A cache without pages still needs a well-formed map; no page is read then.
  const std::int64_t pages = cache.num_pages > 0 ? cache.num_pages : 1;
  const cuuint64_t dims[3] = {kHeadDim, kHopperPageTokens, static_cast<cuuint64_t>(pages)};
  const cuuint64_t strides[2] = {kHeadDim, static_cast<cuuint64_t>(cache.page_stride)};
  const cuuint32_t box[3] = {kHeadDim, kHopperPageTokens, 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult result =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, cache.base, dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? Status::success() : encode_failure("key cache", result);
}

// Queries as [B][next_n][H][128 bytes]; a box is the `rows` draft rows of one
// request, landing as (rows * H) swizzled 128-byte rows.
Status encode_query_map(PFN_cuTensorMapEncodeTiled_v12000 encode, const LogitsProblem& p, int rows,
                        CUtensorMap* map) {
  const std::int64_t batch = p.batch > 0 ? p.batch : 1;
  const cuuint64_t dims[4] = {kHeadDim, static_cast<cuuint64_t>(p.heads),
                              static_cast<cuuint64_t>(p.next_n), static_cast<cuuint64_t>(batch)};
  // Validation gives dimensions of extent 1 their packed strides, which satisfy
  // the encoder's range rules.
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.q_stride_h),
                                 static_cast<cuuint64_t>(p.q_stride_n),
                                 static_cast<cuuint64_t>(p.q_stride_b)};
  const cuuint32_t box[4] = {kHeadDim, static_cast<cuuint32_t>(p.heads),
                             static_cast<cuuint32_t>(rows), 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 4, const_cast<std::uint8_t*>(p.q),
                                 dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return result == CUDA_SUCCESS ? Status::success() : encode_failure("query", result);
}

LogitsKernelParams kernel_params(const LogitsProblem& p, const ExecContext& ctx) {
  LogitsKernelParams k;
  k.cache_base = p.cache.base;
  k.page_stride = p.cache.page_stride;
  k.num_pages = p.cache.num_pages;
  k.weights = p.weights;
  k.weights_stride_row = p.weights_stride_row;
  k.lens = p.lens;
  k.block_table = p.block_table;
  k.block_table_stride = p.block_table_stride;
  k.max_blocks = p.max_blocks;
  k.schedule = p.schedule;
  k.num_workers = p.num_workers;
  k.batch = p.batch;
  k.next_n = p.next_n;
  k.path = p.path;
  k.max_context_len = p.max_context_len;
  k.logits = p.logits;
  k.bf16_output = p.logits_dtype == DType::bfloat16;
  k.logits_stride = p.logits_stride;
  k.clean_logits = p.clean_logits;
  k.error = error_record(ctx);
  return k;
}

template <int kRows, int kHeads, bool kSelect>
Status launch(const LogitsKernelParams& params, const ExecContext& ctx, const CUtensorMap& key_map,
              const CUtensorMap& query_map) {
  using Layout = SharedLayout<kRows, kHeads, kSelect>;
  constexpr int kSharedBytes = Layout::launch_bytes;
  auto* kernel = &paged_logits_sm90_kernel<kRows, kHeads, kScoringPassColumns, kSelect>;
  DSA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  kernel<<<static_cast<unsigned>(params.num_workers), Layout::kThreads, kSharedBytes,
           stream_of(ctx)>>>(
      params, key_map, query_map);
  DSA_CUDA_CHECK_LAUNCH("paged_logits_sm90_kernel");
  return Status::success();
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

template <int kHeads, bool kSelect>
Status launch_for_rows(int rows, const LogitsKernelParams& params, const ExecContext& ctx,
                       const CUtensorMap& key_map, const CUtensorMap& query_map) {
  return for_rows(rows, [&](auto rows_constant) {
    return launch<decltype(rows_constant)::value, kHeads, kSelect>(params, ctx, key_map, query_map);
  });
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool supports_native(int next_n, int heads, int head_dim) {
  return next_n >= 1 && next_n <= kMaxNativeRows && (heads == 32 || heads == 64) &&
         head_dim == kHeadDim;
}

namespace {

// The checks every Hopper kernel of this file relies on.
Status check_hopper_problem(const LogitsProblem& p) {
  if (!supports_native(p.rows_per_unit(), static_cast<int>(p.heads), p.head_dim)) {
    return {ErrorCode::unsupported,
            "paged_mqa_logits: the Hopper kernels serve H in {32, 64}, D == 128 and, on the "
            "native path, next_n 1..8; got next_n " +
                std::to_string(p.next_n) + ", H " + std::to_string(p.heads) + ", D " +
                std::to_string(p.head_dim)};
  }
  if (!aligned16(p.cache.base) || !aligned16(p.q)) {
    return {ErrorCode::bad_alignment,
            "paged_mqa_logits: the Hopper kernels need key_cache and q to start on a 16-byte "
            "boundary"};
  }
  return Status::success();
}

// The tensor map of p's queries (a box per unit of p.rows_per_unit() draft
// rows) and, when key_map is given, the key cache's.
Status encode_maps(const LogitsProblem& p, CUtensorMap* query_map, CUtensorMap* key_map) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  DSA_RETURN_IF_ERROR(tensor_map_encoder(&encode));
  if (key_map != nullptr) DSA_RETURN_IF_ERROR(encode_key_map(encode, p.cache, key_map));
  return encode_query_map(encode, p, p.rows_per_unit(), query_map);
}

// Checks, tensor maps and the launch of either kernel family; `selection`
// (nullptr for logits) makes it the selection kernel.
Status launch_scoring(const LogitsProblem& p, const CandidateSelection* selection,
                      const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_hopper_problem(p));
  const int rows = p.rows_per_unit();
  CUtensorMap key_map{};
  CUtensorMap query_map{};
  DSA_RETURN_IF_ERROR(encode_maps(p, &query_map, &key_map));
  LogitsKernelParams params = kernel_params(p, ctx);
  if (selection == nullptr) {
    if (p.heads == 32) return launch_for_rows<32, false>(rows, params, ctx, key_map, query_map);
    return launch_for_rows<64, false>(rows, params, ctx, key_map, query_map);
  }
  params.logits = nullptr;
  params.clean_logits = false;
  params.select_lengths = selection->lengths;
  params.select_k = selection->k;
  // Compacting close to k leaves most of a list free, so compactions are rare.
  params.keep_limit = selection->k + (selection->lists.capacity - selection->k) / 16;
  params.lists = selection->lists;
  params.select_floors = selection->floors;
  params.run_if = selection->run_if;
  if (p.heads == 32) return launch_for_rows<32, true>(rows, params, ctx, key_map, query_map);
  return launch_for_rows<64, true>(rows, params, ctx, key_map, query_map);
}

}  // namespace

Status paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx) {
  return launch_scoring(p, nullptr, ctx);
}

namespace {

// The most tiles of sampled tokens a unit has.
int most_sample_tiles(std::int64_t max_context_len) {
  const std::int64_t samples = most_samples(pages_for_length(max_context_len, kHopperPageTokens));
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
  auto* kernel = &sample_scores_kernel<kRows, kHeads>;
  DSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Layout::launch_bytes));
  const std::int64_t units = schedule_units(params.batch, params.next_n, params.path);
  const int tiles = most_sample_tiles(params.max_context_len);
  const int tiles_per_cta = sample_tiles_per_cta(
      units, tiles, resident_blocks(kernel, kSampleThreads, Layout::launch_bytes, device));
  const dim3 grid(static_cast<unsigned>(units),
                  static_cast<unsigned>(std::max(1, (tiles + tiles_per_cta - 1) / tiles_per_cta)));
  kernel<<<grid, kSampleThreads, Layout::launch_bytes, stream_of(ctx)>>>(params, samples,
                                                                         tiles_per_cta, query_map);
  DSA_CUDA_CHECK_LAUNCH("sample_scores_kernel");
  return Status::success();
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
  return launch_scoring(p, &selection, ctx);
}

}  // namespace dsa::detail::cuda::hopper
