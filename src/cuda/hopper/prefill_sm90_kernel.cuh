// mqa_logits on sm_90a: the decode kernel's products and epilogue
// (logits_sm90_kernel.cuh) over a tile of query rows instead of a request's
// draft rows, and a contiguous run of keys instead of cache pages.
//
// Keys are fp8 (a tile is 64 rows of 128 bytes) or, with kFp4Keys, fp4: the
// producer copies a tile's packed codes into the upper half of its stage and
// each consumer turns them into e5m2 rows (turn_fp4_stage) with the keys'
// scale words, as the paged kernels do. With kFp4Queries (fp4 keys only) the
// producer warp turns the CTA's fp4 queries once (turn_fp4_queries).
//
// A CTA scores kPrefillRows(H) consecutive rows (512 query columns: 8 rows of
// 64 heads, 16 of 32) against the keys of one chunk of kPrefillChunkKeys
// positions: the 64-key tiles between the lowest start and the highest end
// of its rows' ranges inside the chunk. One producer warp loads the rows'
// queries once and streams the tiles by tensor copy through a ring of
// stages; four consumer warpgroups take the tiles in turn and score each in
// passes of 128 columns, so that one's epilogue overlaps the others'
// products. Every scored (row, key) is stored by the thread whose
// accumulators hold it; the fill warps write what no key scores: -inf over
// the chunk's columns outside a row's scored columns (with clean_logits),
// NaN over a row whose range breaks a rule (the chunk-0 CTA of the row).
#pragma once

#include <cstdint>

#include "common/logit_rules.hpp"
#include "common/problem.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/hopper/logits_sm90_kernel.cuh"
#include "cuda/hopper/ptx.cuh"

namespace dsa::detail::cuda::hopper {

inline constexpr int kPrefillQueryColumns = 512;  // rows x heads one CTA holds
inline constexpr std::int64_t kPrefillChunkKeys = 4096;
inline constexpr int kPrefillConsumers = 4;
// A multiple of the consumer count, so that each consumer always meets the
// same stage slots.
inline constexpr int kPrefillStages = 16;
static_assert(kPrefillStages % kPrefillConsumers == 0);
static_assert(kPrefillChunkKeys % kStageTokens == 0, "tiles never straddle chunks");

constexpr int prefill_rows(int heads) { return kPrefillQueryColumns / heads; }

// A row of the CTA's tile as the consumers and fill warps use it: its key
// range, or start = -1 when the range breaks a rule (and end = -1 past the
// last row).
struct PrefillRow {
  std::int64_t start, end;
};

template <int kHeads>
struct PrefillLayout {
  static constexpr int kRows = prefill_rows(kHeads);
  static constexpr int kThreads = kWarpgroupThreads * (1 + kPrefillConsumers);
  static constexpr int kQueryBytes = kRows * kHeads * kHeadDim;
  static constexpr int queries = 0;
  static constexpr int keys = queries + kQueryBytes;  // 1024-byte aligned: a swizzle atom
  static constexpr int weights = keys + kPrefillStages * kStageKeyBytes;
  // fp4 keys: each stage's scale words, then the float scales of its turned rows.
  static constexpr int stage_scales = weights + kRows * kHeads * 4;
  static constexpr int rows = stage_scales + kPrefillStages * kStageScaleBytes;
  static constexpr int barriers = rows + kRows * static_cast<int>(sizeof(PrefillRow));
  // stage full, stage empty, the queries' copy, the queries turned (fp4)
  static constexpr int exact_only = barriers + (2 * kPrefillStages + 2) * 8;  // fp4 queries: see turn_fp4_queries
  static constexpr int bytes = exact_only + 8;
  static constexpr int launch_bytes = bytes + 1024;  // alignment slack
  static_assert(kQueryBytes % 1024 == 0 && barriers % 8 == 0);
  static_assert(launch_bytes <= kMaxSharedBytes, "prefill layout too large");
};

// The CTA's share of the grid: a tile of rows and a chunk of keys (and of
// output columns, for the fill).
struct PrefillBlock {
  std::int64_t first_row;
  std::int64_t chunk_begin;  // key (and column) position of the chunk's start
};
__device__ __forceinline__ PrefillBlock prefill_block(std::int64_t chunks, int rows) {
  const std::int64_t block = blockIdx.x;
  return {block / chunks * rows, block % chunks * kPrefillChunkKeys};
}

// The 64-key tiles [first, end) the CTA scores: those holding a key of the
// chunk inside some valid row's range.
struct TileSpan {
  std::int64_t first = 0, end = 0;
};
template <int kRows>
__device__ __forceinline__ TileSpan prefill_tiles(const PrefillRow* rows, std::int64_t chunk_begin) {
  const std::int64_t chunk_end = chunk_begin + kPrefillChunkKeys;
  std::int64_t low = chunk_end, high = chunk_begin;
  for (int j = 0; j < kRows; ++j) {
    if (rows[j].start < 0) continue;
    const std::int64_t a = rows[j].start > chunk_begin ? rows[j].start : chunk_begin;
    const std::int64_t b = rows[j].end < chunk_end ? rows[j].end : chunk_end;
    if (a < b) {
      low = a < low ? a : low;
      high = b > high ? b : high;
    }
  }
  if (low >= high) return {};
  return {low / kStageTokens, (high + kStageTokens - 1) / kStageTokens};
}

template <int kHeads, bool kFp4Keys, bool kFp4Queries>
__global__ void __launch_bounds__(PrefillLayout<kHeads>::kThreads, 1)
    mqa_logits_sm90_kernel(const MqaLogitsProblem p, std::int64_t chunks, DeviceErrorRecord* error,
                           const __grid_constant__ CUtensorMap key_map,
                           const __grid_constant__ CUtensorMap query_map) {
#if DSA_SM90A_ENABLED
  using Layout = PrefillLayout<kHeads>;
  constexpr int kRows = Layout::kRows;
  extern __shared__ unsigned char shared_raw[];
  // Swizzled tensor copies and wgmma descriptors need 1024-byte alignment.
  unsigned char* smem = shared_raw + ((1024 - (ptx::smem_address(shared_raw) & 1023)) & 1023);
  auto* weights = reinterpret_cast<float*>(smem + Layout::weights);
  auto* rows = reinterpret_cast<PrefillRow*>(smem + Layout::rows);
  auto* stage_full = reinterpret_cast<std::uint64_t*>(smem + Layout::barriers);
  std::uint64_t* stage_empty = stage_full + kPrefillStages;
  std::uint64_t* query_full = stage_full + 2 * kPrefillStages;
  std::uint64_t* query_ready = query_full + 1;  // fp4 queries: turned
  auto* exact_only_flag = reinterpret_cast<std::int32_t*>(smem + Layout::exact_only);
  const int thread = static_cast<int>(threadIdx.x);
  const PrefillBlock block = prefill_block(chunks, kRows);
  enter_dependent_grid();

  if (thread < kRows) {
    const std::int64_t row = block.first_row + thread;
    PrefillRow info{-1, -1};
    if (row < p.rows) {
      const KeyRange range = mqa_key_range(p, row);
      const bool usable = key_range_violation(p, range).kind == kNoDeviceError;
      info = usable ? PrefillRow{range.start, range.end} : PrefillRow{-1, 0};
    }
    rows[thread] = info;
  }
  for (int i = thread; i < kRows * kHeads; i += Layout::kThreads) {
    const std::int64_t row = block.first_row + i / kHeads;
    weights[i] = row < p.rows ? __ldg(p.weights + row * p.weights_stride_row + i % kHeads) : 0.0f;
  }
  if (thread == 0) {
    for (int s = 0; s < kPrefillStages; ++s) {
      ptx::mbarrier_init(&stage_full[s], 1);
      ptx::mbarrier_init(&stage_empty[s], kWarpgroupThreads);
    }
    ptx::mbarrier_init(query_full, 1);
    ptx::mbarrier_init(query_ready, 32);  // the producer warp's lanes
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const TileSpan tiles = prefill_tiles<kRows>(rows, block.chunk_begin);

  const int warpgroup = __shfl_sync(0xffffffffu, thread / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    ptx::lower_register_limit<kProducerRegisters>();
    if (thread < 32) {
      // The producer: the queries once, then the tiles through the ring.
      const bool leader = ptx::elect_one();
      if (tiles.first < tiles.end && leader) {
        ptx::prefetch_tensor_map(&key_map);
        // fp4 queries land packed in the upper half, for this warp to turn.
        constexpr int kQueryCopyBytes = kFp4Queries ? Layout::kQueryBytes / 2 : Layout::kQueryBytes;
        ptx::mbarrier_arrive_expect_tx(query_full, kQueryCopyBytes);
        ptx::tensor_copy_3d(smem + Layout::queries + Layout::kQueryBytes - kQueryCopyBytes, &query_map, 0, 0,
                            static_cast<int>(block.first_row), query_full);
      }
      if constexpr (kFp4Queries) {
        if (tiles.first < tiles.end) {
          ptx::mbarrier_wait(query_full, 0);
          const auto input = [&](int j, int head) {
            const std::int64_t row = block.first_row + j;
            if (row >= p.rows) return Fp4QueryInput{false, 0u, 0.0f};
            return Fp4QueryInput{true, __ldg(p.q_scales + row * p.q_scales_stride_row + head * p.q_scales_stride_h),
                                 weights[j * kHeads + head]};
          };
          const bool exact_only = turn_fp4_queries<kRows, kHeads>(smem + Layout::queries, input, weights, thread);
          if (thread == 0) *exact_only_flag = exact_only;
          ptx::mbarrier_arrive(query_ready);  // releases this lane's rows and weights (lane 0: the flag)
        }
      }
      if (tiles.first < tiles.end && leader) {
        for (std::int64_t t = tiles.first; t < tiles.end; ++t) {
          const int k = static_cast<int>(t - tiles.first);
          const int slot = k % kPrefillStages;
          ptx::mbarrier_wait(&stage_empty[slot], ((k / kPrefillStages) & 1) ^ 1);
          ptx::mbarrier_arrive_expect_tx(&stage_full[slot], kStageTokens * kKeyRowBytes<kFp4Keys>);
          ptx::tensor_copy_2d(smem + Layout::keys + slot * kStageKeyBytes + kStageCodesOffset<kFp4Keys>, &key_map, 0,
                              static_cast<int>(t * kStageTokens), &stage_full[slot]);
        }
      }
    } else {
      // The fill warps: what no key scores.
      const int filler = thread - 32;
      constexpr int kFillers = kWarpgroupThreads - 32;
      const std::int64_t width = p.width();
      const std::int64_t column_end =
          block.chunk_begin + kPrefillChunkKeys < width ? block.chunk_begin + kPrefillChunkKeys : width;
      for (int j = 0; j < kRows; ++j) {
        const std::int64_t row = block.first_row + j;
        const PrefillRow info = rows[j];
        if (info.end < 0) break;  // past the last row
        if (info.start < 0) {
          // A row that breaks a range rule: NaN everywhere, written and
          // recorded by the CTA of its first chunk.
          if (block.chunk_begin != 0) continue;
          if (filler == 0) {
            const RowViolation violation = key_range_violation(p, mqa_key_range(p, row));
            report_device_error(error, violation.kind, row, violation.value, violation.bound);
          }
          for (std::int64_t c = filler; c < width; c += kFillers) store_mqa_logit(p, row, c, invalid_logit());
          continue;
        }
        if (!p.clean_logits) continue;
        const KeyRange scored = mqa_scored_columns(p, KeyRange{info.start, info.end});
        for (std::int64_t c = block.chunk_begin + filler; c < column_end; c += kFillers) {
          if (c < scored.start || c >= scored.end) store_mqa_logit(p, row, c, masked_logit());
        }
      }
    }
  } else {
    ptx::raise_register_limit<consumer_registers(kPrefillConsumers, false)>();
    const int consumer = warpgroup - 1;
    const int consumer_thread = thread % kWarpgroupThreads;
    const int warp = consumer_thread / 32;
    const int lane = consumer_thread % 32;
    if (tiles.first + consumer < tiles.end) ptx::mbarrier_wait(kFp4Queries ? query_ready : query_full, 0);
    // A head the products cannot hold exactly: every tile value by value.
    const bool exact_only = kFp4Queries && tiles.first + consumer < tiles.end && *exact_only_flag != 0;
    for (std::int64_t t = tiles.first + consumer; t < tiles.end; t += kPrefillConsumers) {
      const int k = static_cast<int>(t - tiles.first);
      const int slot = k % kPrefillStages;
      // This thread's two key rows' scales (fp4: its turned row's scale word)
      // travel while the tile lands.
      const std::int64_t first_key = t * kStageTokens;
      const std::int64_t upper_key = first_key + 16 * warp + lane / 4;
      const std::int64_t turned_key = first_key + turned_row(consumer_thread);
      float scale_upper = 0.0f, scale_lower = 0.0f;
      std::uint32_t word = 0;
      if constexpr (kFp4Keys) {
        word = turned_key < p.num_keys ? __ldg(p.key_scale_words + turned_key * p.key_scales_stride) : 0u;
      } else {
        scale_upper = upper_key < p.num_keys ? __ldg(p.key_scales + upper_key * p.key_scales_stride) : 0.0f;
        scale_lower = upper_key + 8 < p.num_keys ? __ldg(p.key_scales + (upper_key + 8) * p.key_scales_stride) : 0.0f;
      }
      ptx::mbarrier_wait(&stage_full[slot], (k / kPrefillStages) & 1);
      PageContext page{};
      page.keys = smem + Layout::keys + slot * kStageKeyBytes;
      page.queries = smem + Layout::queries;
      page.weights = weights;
      page.warp = warp;
      page.lane = lane;
      bool turned = true;
      float* scales = reinterpret_cast<float*>(smem + Layout::stage_scales + slot * kStageScaleBytes);
      if constexpr (kFp4Keys) {
        // The words stay for the exact path when the tile is not turned.
        if (consumer_thread % 2 == 0) reinterpret_cast<std::uint32_t*>(scales)[turned_row(consumer_thread)] = word;
        turned = turn_fp4_stage(smem + Layout::keys + slot * kStageKeyBytes, word, turned_key < p.num_keys,
                                exact_only, scales, consumer_thread, 1 + consumer);
        scale_upper = scales[16 * warp + lane / 4];
        scale_lower = scales[16 * warp + lane / 4 + 8];
      }
      page.scale_upper = scale_upper;
      page.scale_lower = scale_lower;
      const auto store = [&](int j, int stage_row, float value) {
        const PrefillRow info = rows[j];
        const std::int64_t key = first_key + stage_row;
        // A refused row's range [-1, 0) and a missing row's [-1, -1) hold no key.
        if (key >= info.start && key < info.end) {
          store_mqa_logit(p, block.first_row + j, p.compressed ? key - info.start : key, value);
        }
      };
      const auto release = [&] { ptx::mbarrier_arrive(&stage_empty[slot]); };
      constexpr ptx::Fp8Type kKeys = kFp4Keys ? ptx::Fp8Type::e5m2 : ptx::Fp8Type::e4m3;
      constexpr ptx::Fp8Type kQueries = kFp4Queries ? ptx::Fp8Type::e5m2 : ptx::Fp8Type::e4m3;
      if (turned) {
        score_passes<kRows, kHeads, kScoringPassColumns, 0, kKeys, kQueries>(
            page, release, [&](auto first_row, auto pass_rows, const auto& acc) {
              pass_logits<kHeads, decltype(first_row)::value, decltype(pass_rows)::value>(page, acc, store);
            });
      } else if constexpr (kFp4Keys) {
        const std::int64_t keys_left = p.num_keys - first_key;
        score_fp4_stage_exactly<kRows, kHeads, kFp4Queries>(
            page, reinterpret_cast<const std::uint32_t*>(scales),
            static_cast<int>(keys_left < kStageTokens ? keys_left : kStageTokens), consumer_thread,
            [&](int j) { return block.first_row + j < p.rows; },
            [&](int j, int head) {
              const std::int64_t row = block.first_row + j;
              return Fp4QueryRef{p.q + row * p.q_stride_row + head * p.q_stride_h,
                                 __ldg(p.q_scales + row * p.q_scales_stride_row + head * p.q_scales_stride_h),
                                 __ldg(p.weights + row * p.weights_stride_row + head)};
            },
            store);
        release();
      }
    }
  }
#else
  (void)p;
  (void)chunks;
  (void)error;
  (void)key_map;
  (void)query_map;
#endif
}

}  // namespace dsa::detail::cuda::hopper
