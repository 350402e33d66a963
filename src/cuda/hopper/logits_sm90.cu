// Host side of the sm_90a logits kernel: argument checks the kernel relies
// on, tensor-map encoding, the kernel's parameters (the launch machinery the
// fused index_topk shares is in scoring_launch.cuh) and the logits launch.
#include "cuda/hopper/logits_sm90.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.hpp"
#include "cuda/hopper/scoring_launch.cuh"
#include "cuda/hopper/tensor_map.hpp"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda::hopper {

namespace {

// The key bytes of every page as [num_pages][P rows][128 bytes], copied one
// page at a time (a 32-row copy is a whole number of 1024-byte swizzle
// atoms, so two of them side by side read as one 64-row page).
Status encode_key_map(const CacheRef& cache, CUtensorMap* map) {
  // A cache without pages still needs a well-formed map; no page is read then.
  const std::int64_t pages = cache.num_pages > 0 ? cache.num_pages : 1;
  const auto rows = static_cast<std::uint32_t>(cache.page_tokens);
  // fp4 rows (D / 2 code bytes) land packed, for the consumers to turn.
  const bool fp4 = cache.format == KeyFormat::fp4_e2m1;
  const std::uint32_t row_bytes = fp4 ? kKeyRowBytes<true> : kKeyRowBytes<false>;
  const std::uint64_t dims[3] = {row_bytes, rows, static_cast<std::uint64_t>(pages)};
  const std::uint64_t strides[2] = {row_bytes, static_cast<std::uint64_t>(cache.page_stride)};
  const std::uint32_t box[3] = {row_bytes, rows, 1};
  if (fp4) return encode_plain_map("paged_mqa_logits", "key cache", cache.base, 3, dims, strides, box, map);
  return encode_swizzled_map("paged_mqa_logits", "key cache", cache.base, 3, dims, strides, box, map);
}

// Queries as [B][next_n][H][128 bytes], or [1][T][H][128 bytes] for requests
// of uneven row counts (query_coordinates in the kernel); a box is the `rows`
// rows of one unit, landing as (rows * H) swizzled 128-byte rows (rows past
// the unit's are loaded, or zero past the last, and never stored). fp4
// queries land as packed 64-byte rows, for producer 0 to turn.
Status encode_query_map(const LogitsProblem& p, int rows, CUtensorMap* map) {
  const bool uneven = p.varlen.offsets != nullptr;
  const std::int64_t batch = p.batch > 0 ? p.batch : 1;
  const std::uint64_t row_bytes = p.fp4_queries() ? kHeadDim / 2 : kHeadDim;
  const std::uint64_t dims[4] = {row_bytes, static_cast<std::uint64_t>(p.heads),
                                 static_cast<std::uint64_t>(uneven ? batch : p.next_n),
                                 static_cast<std::uint64_t>(uneven ? 1 : batch)};
  // Validation gives dimensions of extent 1 their packed strides, which satisfy
  // the encoder's range rules.
  const std::uint64_t strides[3] = {
      static_cast<std::uint64_t>(p.q_stride_h),
      static_cast<std::uint64_t>(uneven ? p.q_stride_b : p.q_stride_n),
      static_cast<std::uint64_t>(uneven ? p.q_stride_b * batch : p.q_stride_b)};
  const std::uint32_t box[4] = {static_cast<std::uint32_t>(row_bytes), static_cast<std::uint32_t>(p.heads),
                                static_cast<std::uint32_t>(rows), 1};
  if (p.fp4_queries()) return encode_plain_map("paged_mqa_logits", "query", p.q, 4, dims, strides, box, map);
  return encode_swizzled_map("paged_mqa_logits", "query", p.q, 4, dims, strides, box, map);
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

LogitsKernelParams kernel_params(const LogitsProblem& p, const ExecContext& ctx) {
  LogitsKernelParams k;
  k.cache_base = p.cache.base;
  k.page_stride = p.cache.page_stride;
  k.num_pages = p.cache.num_pages;
  k.page_tokens = p.cache.page_tokens;
  k.weights = p.weights;
  k.weights_stride_row = p.weights_stride_row;
  if (p.fp4_queries()) {
    k.q_codes = p.q;
    k.q_stride_b = p.q_stride_b;
    k.q_stride_n = p.q_stride_n;
    k.q_stride_h = p.q_stride_h;
    k.q_scales = p.q_scales;
    k.q_scales_stride_b = p.q_scales_stride_b;
    k.q_scales_stride_n = p.q_scales_stride_n;
    k.q_scales_stride_h = p.q_scales_stride_h;
  }
  k.lens = p.lens;
  k.varlen = p.varlen;
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

bool supports_native(int next_n, int heads, int head_dim) {
  return next_n >= 1 && next_n <= kMaxNativeRows && (heads == 32 || heads == 64) &&
         head_dim == kHeadDim;
}

Status check_hopper_problem(const LogitsProblem& p) {
  if (!supports_native(p.rows_per_unit(), static_cast<int>(p.heads), p.head_dim)) {
    return {ErrorCode::unsupported,
            "paged_mqa_logits: the Hopper kernels serve H in {32, 64}, D == 128 and, on the "
            "native path, next_n 1..8; got next_n " +
                std::to_string(p.next_n) + ", H " + std::to_string(p.heads) + ", D " +
                std::to_string(p.head_dim)};
  }
  if (kStageTokens % p.cache.page_tokens != 0) {
    return {ErrorCode::unsupported, "paged_mqa_logits: the Hopper kernels read pages of 32 or 64 tokens, got " +
                                        std::to_string(p.cache.page_tokens) + "-token pages"};
  }
  if (!aligned16(p.cache.base) || !aligned16(p.q)) {
    return {ErrorCode::bad_alignment,
            "paged_mqa_logits: the Hopper kernels need key_cache and q to start on a 16-byte "
            "boundary"};
  }
  return Status::success();
}

Status encode_maps(const LogitsProblem& p, CUtensorMap* query_map, CUtensorMap* key_map) {
  if (key_map != nullptr) DSA_RETURN_IF_ERROR(encode_key_map(p.cache, key_map));
  return encode_query_map(p, p.rows_per_unit(), query_map);
}

Status paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx) {
  return launch_scoring<false>(p, kernel_params(p, ctx), ctx);
}

}  // namespace dsa::detail::cuda::hopper
