// The sampling pass of the fused index_topk on sm_90a (see row_samples.hpp):
// scores the sampled key positions of every unit with the logits kernel's own
// products and epilogue, so that a sample value is bit for bit the logit the
// selection pass computes for its position.
//
// Grid: (units, tile groups), one wave. A CTA is one warpgroup; it loads its
// unit's queries once (tensor copy) and scores tiles of 64 sampled tokens,
// each gathered from 64 / per_page pages by asynchronous copies (16 bytes
// of a key row, or a scale, each) placed with the 128-byte swizzle the
// products' descriptors expect. The gathers of the next kSampleStages - 1
// tiles are in flight while one is scored, and the block-table entries of
// the tile after them are loaded then too: a gather waits for scattered
// rows of the cache, far longer than a tile's products.
#pragma once

#include <cstdint>

#include "cuda/fused/hopper_passes.hpp"
#include "cuda/fused/row_samples.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/hopper/logits_sm90_kernel.cuh"

namespace dsa::detail::cuda::hopper {

inline constexpr int kSampleTileTokens = 64;
inline constexpr int kSampleThreads = kWarpgroupThreads;
inline constexpr int kSampleStages = 3;  // tiles gathered or being gathered at once

template <int kRows, int kHeads>
struct SampleLayout {
  static constexpr int kQueryBytes = kRows * kHeads * kHeadDim;
  static constexpr int keys = 0;  // kSampleStages tiles, 1024-byte aligned
  static constexpr int queries = keys + kSampleStages * kStageKeyBytes;
  static constexpr int scales = queries + kQueryBytes;  // kSampleStages tiles' [64]
  static constexpr int weights = scales + kSampleStages * kStageScaleBytes;
  static constexpr int tile_logits = weights + kRows * kHeads * 4;
  static constexpr int barrier = tile_logits + kRows * kSampleTileTokens * 4;
  static constexpr int bytes = barrier + 8;
  static constexpr int launch_bytes = bytes + 1024;  // alignment slack
  static_assert(launch_bytes <= kMaxSharedBytes, "sampling layout too large");
};

// A thread's share of a tile's gather: thread q of every 8 copies 16 bytes
// of one token (the first of them its scale too), kGatherPieces tokens.
inline constexpr int kGatherPieces = kStageKeyBytes / 16 / kSampleThreads;
__device__ __forceinline__ int gather_row(int i) {
  return (static_cast<int>(threadIdx.x) + kSampleThreads * i) / 8;
}

// The cache pages of this thread's tokens of tile `tile` (-1: none, past the
// map). Loaded a step before the gather that uses them: every load is in
// flight at once, and none stalls the warp while it scores a tile.
__device__ __forceinline__ void load_sample_pages(const LogitsKernelParams& p, const SampleMap& map,
                                                  std::int64_t request, int tile,
                                                  std::int32_t (&pages)[kGatherPieces]) {
  const std::int32_t* table = p.block_table + request * p.block_table_stride;
#pragma unroll
  for (int i = 0; i < kGatherPieces; ++i) {
    const std::int32_t u = tile * kSampleTileTokens + gather_row(i);
    pages[i] = u < map.count ? __ldg(table + sample_position(map, u) / p.page_tokens) : -1;
  }
}

// Starts the gather of tile `tile` of the unit's samples, whose pages
// load_sample_pages gave, into `keys` (swizzled rows) and `scales`. A sample
// past the map or on a page outside the cache scores 0 (zero keys, zero
// scale). The caller commits.
__device__ __forceinline__ void gather_sample_tile(const LogitsKernelParams& p, const SampleMap& map,
                                                   int tile, const std::int32_t (&pages)[kGatherPieces],
                                                   unsigned char* keys, float* scales) {
  const int chunk = static_cast<int>(threadIdx.x) % 8;
#pragma unroll
  for (int i = 0; i < kGatherPieces; ++i) {
    const int row = gather_row(i);
    unsigned char* destination = keys + row * kHeadDim + ((chunk ^ (row & 7)) * 16);
    if (pages[i] >= 0 && pages[i] < p.num_pages) {
      const unsigned char* page_base = p.cache_base + pages[i] * p.page_stride;
      const int token = static_cast<int>(sample_position(map, tile * kSampleTileTokens + row) % p.page_tokens);
      ptx::cp_async<16>(destination, page_base + token * kHeadDim + chunk * 16);
      if (chunk == 0) {
        const auto* page_scales = reinterpret_cast<const float*>(page_base + p.page_tokens * kHeadDim);
        ptx::cp_async<4>(scales + row, page_scales + token);
      }
    } else {
      *reinterpret_cast<uint4*>(destination) = make_uint4(0, 0, 0, 0);
      if (chunk == 0) scales[row] = 0.0f;
    }
  }
}

template <int kRows, int kHeads>
__global__ void __launch_bounds__(kSampleThreads)
    sample_scores_kernel(const LogitsKernelParams p, const RowSamples out, int tiles_per_cta,
                         const __grid_constant__ CUtensorMap query_map) {
#if DSA_SM90A_ENABLED
  using Layout = SampleLayout<kRows, kHeads>;
  extern __shared__ unsigned char shared_raw[];
  unsigned char* smem = shared_raw + ((1024 - (ptx::smem_address(shared_raw) & 1023)) & 1023);
  auto* query_full = reinterpret_cast<std::uint64_t*>(smem + Layout::barrier);
  auto* weights = reinterpret_cast<float*>(smem + Layout::weights);
  auto* tile_logits = reinterpret_cast<float*>(smem + Layout::tile_logits);
  const int thread = static_cast<int>(threadIdx.x);
  enter_dependent_grid();

  const UnitRows rows = unit_rows<kRows, false>(p, blockIdx.x);  // the fused pass takes fixed layouts only
  const std::int64_t first_row = rows.first_row;
  const SampleMap map =
      sample_map(pages_for_length(read_length<kRows>(p, rows), kStageTokens));
  if (blockIdx.y == 0 && thread < kRows) out.maps[first_row + thread] = map;
  const int tiles = (map.count + kSampleTileTokens - 1) / kSampleTileTokens;
  const int first_tile = static_cast<int>(blockIdx.y) * tiles_per_cta;
  const int end_tile = min(tiles, first_tile + tiles_per_cta);
  if (first_tile >= end_tile) return;

  if (thread == 0) {
    ptx::mbarrier_init(query_full, 1);
    ptx::fence_barrier_init();
    ptx::mbarrier_arrive_expect_tx(query_full, Layout::kQueryBytes);
    const QueryCoordinates at = query_coordinates<false>(p, rows);
    ptx::tensor_copy_4d(smem + Layout::queries, &query_map, 0, 0, at.c2, at.c3, query_full);
  }
  for (int i = thread; i < kRows * kHeads; i += kSampleThreads) {
    weights[i] = __ldg(p.weights + (first_row + i / kHeads) * p.weights_stride_row + i % kHeads);
  }
  // Tile t lives in stage (t - first_tile) % kSampleStages. Every step
  // commits one group of copies (empty past the last tile), so that waiting
  // for all but the newest kSampleStages - 1 groups means the tile's own.
  auto keys_of = [&](int tile) {
    return smem + Layout::keys + (tile - first_tile) % kSampleStages * kStageKeyBytes;
  };
  auto scales_of = [&](int tile) {
    return reinterpret_cast<float*>(smem + Layout::scales +
                                    (tile - first_tile) % kSampleStages * kStageScaleBytes);
  };
  // The pages of the next tile to gather, loaded one step ahead.
  std::int32_t next_pages[kGatherPieces];
  auto start_gather = [&](int tile) {
    if (tile < end_tile) gather_sample_tile(p, map, tile, next_pages, keys_of(tile), scales_of(tile));
    ptx::cp_async_commit();
    if (tile + 1 < end_tile) load_sample_pages(p, map, rows.request, tile + 1, next_pages);
  };
  load_sample_pages(p, map, rows.request, first_tile, next_pages);
  for (int ahead = 0; ahead < kSampleStages - 1; ++ahead) start_gather(first_tile + ahead);
  __syncthreads();  // the barrier is initialized before anyone waits on it
  ptx::mbarrier_wait(query_full, 0);

  const int warp = thread / 32;
  const int lane = thread % 32;
  for (int tile = first_tile; tile < end_tile; ++tile) {
    // The stage it refills held tile - 1, which every thread is done with.
    start_gather(tile + kSampleStages - 1);
    ptx::cp_async_wait<kSampleStages - 1>();
    // Every thread's copies of this tile (and its zero stores) are done and
    // ordered before the products read them.
    ptx::fence_proxy_async_shared();
    __syncthreads();
    const float* scales = scales_of(tile);
    PageContext page;
    page.keys = keys_of(tile);
    page.queries = smem + Layout::queries;
    page.weights = weights;
    page.lengths = nullptr;
    page.first_row = first_row;
    page.first_position = 0;
    page.refused_begin = page.refused_end = 0;
    page.scale_upper = scales[16 * warp + lane / 4];
    page.scale_lower = scales[16 * warp + lane / 4 + 8];
    page.warp = warp;
    page.lane = lane;
    page.page_logits = tile_logits;
    score_passes<kRows, kHeads, kScoringPassColumns, 0>(page, [] {}, [&](auto first_row, auto rows, const auto& acc) {
      finish_pass<kHeads, decltype(first_row)::value, decltype(rows)::value, true>(p, page, acc);
    });
    __syncthreads();  // the tile's logits are complete; its keys are read
    for (int i = thread; i < kRows * kSampleTileTokens; i += kSampleThreads) {
      const int j = i / kSampleTileTokens;
      const std::int32_t u = tile * kSampleTileTokens + i % kSampleTileTokens;
      if (u < map.count) out.values[(first_row + j) * kSampleCapacity + u] = tile_logits[i];
    }
    __syncthreads();  // the tile's logits are stored before the next tile's are written
  }
#else
  (void)p;
  (void)out;
  (void)tiles_per_cta;
  (void)query_map;
#endif
}

}  // namespace dsa::detail::cuda::hopper
