// Host side of the sm_90a mqa_logits kernel: its tensor maps, grid and launch.
#include "cuda/hopper/prefill_sm90.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/cuda_check.hpp"
#include "cuda/hopper/prefill_sm90_kernel.cuh"
#include "cuda/hopper/tensor_map.hpp"
#include "cuda/launch_utils.hpp"

namespace dsa::detail::cuda::hopper {

namespace {

constexpr const char* kOp = "mqa_logits";

// Keys as [S_kv][128 bytes], a box of 64 of them (one stage); fp4 keys as
// [S_kv][64 bytes] of packed codes, landing as they are for the consumers to turn.
Status encode_key_map(const MqaLogitsProblem& p, CUtensorMap* map) {
  const std::uint32_t row_bytes = p.fp4_keys() ? kKeyRowBytes<true> : kKeyRowBytes<false>;
  const std::uint64_t dims[2] = {row_bytes, static_cast<std::uint64_t>(p.num_keys)};
  const std::uint64_t strides[1] = {static_cast<std::uint64_t>(p.keys_stride)};
  const std::uint32_t box[2] = {row_bytes, kStageTokens};
  if (p.fp4_keys()) return encode_plain_map(kOp, "key", p.keys, 2, dims, strides, box, map);
  return encode_swizzled_map(kOp, "key", p.keys, 2, dims, strides, box, map);
}

// Queries as [S][H][128 bytes], a box of `rows` rows (a CTA's tile; rows
// past S read as zero); fp4 queries as [S][H][64 bytes] of packed codes,
// landing as they are for the producer to turn.
Status encode_query_map(const MqaLogitsProblem& p, int rows, CUtensorMap* map) {
  // A dimension of extent 1 may carry any stride: give it the packed one.
  const std::int64_t stride_row = p.rows > 1 ? p.q_stride_row : p.heads * p.q_stride_h;
  const std::uint32_t row_bytes = p.fp4_queries() ? kHeadDim / 2 : kHeadDim;
  const std::uint64_t dims[3] = {row_bytes, static_cast<std::uint64_t>(p.heads), static_cast<std::uint64_t>(p.rows)};
  const std::uint64_t strides[2] = {static_cast<std::uint64_t>(p.q_stride_h), static_cast<std::uint64_t>(stride_row)};
  const std::uint32_t box[3] = {row_bytes, static_cast<std::uint32_t>(p.heads), static_cast<std::uint32_t>(rows)};
  if (p.fp4_queries()) return encode_plain_map(kOp, "query", p.q, 3, dims, strides, box, map);
  return encode_swizzled_map(kOp, "query", p.q, 3, dims, strides, box, map);
}

template <int kHeads, bool kFp4Keys, bool kFp4Queries>
Status launch(const MqaLogitsProblem& p, const ExecContext& ctx) {
  using Layout = PrefillLayout<kHeads>;
  CUtensorMap key_map{};
  CUtensorMap query_map{};
  DSA_RETURN_IF_ERROR(encode_key_map(p, &key_map));
  DSA_RETURN_IF_ERROR(encode_query_map(p, Layout::kRows, &query_map));
  // Chunks cover the keys (what is scored) and the output columns (what the
  // fill warps write), whichever reach further.
  const std::int64_t span = std::max(p.num_keys, p.width());
  const std::int64_t chunks = std::max<std::int64_t>(1, (span + kPrefillChunkKeys - 1) / kPrefillChunkKeys);
  const std::int64_t row_tiles = (p.rows + Layout::kRows - 1) / Layout::kRows;
  const std::int64_t blocks = row_tiles * chunks;
  if (blocks > std::int64_t{0x7fffffff}) {
    return {ErrorCode::unsupported, "mqa_logits: the Hopper kernel's grid would exceed 2^31 - 1 blocks (" +
                                        std::to_string(row_tiles) + " row tiles x " + std::to_string(chunks) +
                                        " key chunks); split the rows (plan_mqa_logits_chunks)"};
  }
  constexpr auto kernel = &mqa_logits_sm90_kernel<kHeads, kFp4Keys, kFp4Queries>;
  DSA_RETURN_IF_ERROR(allow_shared_bytes<kernel>(Layout::launch_bytes));
  return launch_kernel("mqa_logits_sm90_kernel", kernel,
                       {static_cast<unsigned>(blocks), Layout::kThreads, Layout::launch_bytes}, ctx, p, chunks,
                       error_record(ctx), key_map, query_map);
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

}  // namespace

bool supports_mqa_logits(const MqaLogitsProblem& p) {
  return (!p.fp4_queries() || p.fp4_keys()) && (p.heads == 32 || p.heads == 64) && p.head_dim == kHeadDim &&
         p.num_keys > 0 && aligned16(p.q) && aligned16(p.keys);
}

// The instance of p's heads and formats (fp4 queries come with fp4 keys).
template <int kHeads>
Status launch_formats(const MqaLogitsProblem& p, const ExecContext& ctx) {
  if (!p.fp4_keys()) return launch<kHeads, false, false>(p, ctx);
  if (p.fp4_queries()) return launch<kHeads, true, true>(p, ctx);
  return launch<kHeads, true, false>(p, ctx);
}

Status mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx) {
  if (p.rows == 0) return Status::success();
  return p.heads == 32 ? launch_formats<32>(p, ctx) : launch_formats<64>(p, ctx);
}

}  // namespace dsa::detail::cuda::hopper
