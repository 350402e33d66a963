// The generic paged MQA logits kernels: correct on every GPU the toolkit
// supports, for any next_n, head count and head dimension (D % 16 == 0).
//
// A persistent grid of num_workers blocks walks the schedule. For an item
// (request or row, chunk of 256 positions) a block stages one tile of 64
// positions at a time in shared memory (keys decoded to half precision,
// which holds every e4m3 and e2m1 value exactly, and their scales: one per
// token for fp8 keys, one per 32-element block for fp4 keys) and scores it
// for all of the item's rows; fp4 queries are staged in float32 with their
// block scales applied (exact). Lane l of every warp owns positions l and
// l + 32 of the tile; the warps split the heads. A tile is one 64-token page or two 32-token pages:
// gathering two small pages keeps every lane's two positions and the keys
// staged between two barriers the same for either page size, where a tile
// of one 32-token page would leave half of each lane's work idle. Each
// (row, position) is reduced in a fixed order (dot products over d in
// order, heads per warp in order, then the warps in order), so results are
// bitwise repeatable and the native and per-token paths agree bit for bit.
//
// Data-dependent rules are checked on the device: a row whose length is
// negative, beyond max_context_len or beyond the block table is filled with
// NaN over [0, max_context_len); a needed block-table entry outside the cache
// turns that page's positions into NaN. Neither is ever dereferenced, and the
// first violation lands in the error record. With request_offsets, units
// are row tiles of one request (dsa/schedule.hpp); offsets that are not
// non-decreasing from 0 to T are recorded and every row becomes NaN.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend.hpp"
#include "common/cache_format.hpp"
#include "common/logit_rules.hpp"
#include "common/number_formats.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/logits_generic.hpp"
#include "cuda/request_offsets_check.cuh"
#include "cuda/schedule_check.cuh"

namespace dsa::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kHeadsPerWarpPass = 2;                        // heads a warp scores together
constexpr int kHeadGranule = kWarps * kHeadsPerWarpPass;    // head tiles are multiples of this
constexpr int kKeyPadHalves = 8;  // keeps 16-byte key loads of consecutive lanes conflict-free
constexpr int kRowThreads = 256;
constexpr int kTileTokens = 64;  // positions scored together: two per lane
constexpr int kMaxTilePages = kTileTokens / 32;  // pages of the smallest size a tile spans
// A chunk is whole tiles, a tile whole pages of either size.
static_assert(kChunkTokens % kTileTokens == 0 && kTileTokens % 64 == 0);

// Key scales per token: one for fp8 keys, one per 32-value block for fp4 keys.
__host__ __device__ int key_scale_blocks(const LogitsProblem& p) {
  return p.cache.format == KeyFormat::fp4_e2m1 ? p.head_dim / kFp4BlockElements : 1;
}

// Shared memory of the scoring kernel, carved from one dynamic allocation.
struct SharedLayout {
  int head_dim;
  int head_tile;
  int scale_blocks;  // key scales per token: 1 (fp8 keys) or D / 32 (fp4 keys)

  __host__ __device__ int key_stride() const { return head_dim + kKeyPadHalves; }  // in halves
  __host__ __device__ std::size_t q_bytes() const { return std::size_t(head_tile) * head_dim * 4; }
  __host__ __device__ std::size_t weights_bytes() const { return std::size_t(head_tile) * 4; }
  __host__ __device__ std::size_t keys_bytes() const { return std::size_t(kTileTokens) * key_stride() * 2; }
  __host__ __device__ std::size_t scales_bytes() const { return std::size_t(kTileTokens) * scale_blocks * 4; }
  __host__ __device__ std::size_t partial_bytes() const { return std::size_t(kWarps) * kTileTokens * 4; }
  // Every part is a multiple of 16 bytes, so each starts 16-byte aligned.
  __host__ __device__ std::size_t total() const {
    return q_bytes() + weights_bytes() + keys_bytes() + scales_bytes() + partial_bytes();
  }
  static std::size_t fixed_bytes(int head_dim, int scale_blocks) {
    return SharedLayout{head_dim, 0, scale_blocks}.total();
  }
  static std::size_t bytes_per_head(int head_dim) { return std::size_t(head_dim) * 4 + 4; }
};

struct SharedViews {
  float* q;        // [head_tile][D]
  float* weights;  // [head_tile]
  __half* keys;    // [kTileTokens][D + kKeyPadHalves]
  float* scales;   // [kTileTokens][scale_blocks]
  float* partial;  // [kWarps][kTileTokens]
};

__device__ SharedViews carve_shared(unsigned char* base, const SharedLayout& layout) {
  SharedViews v;
  v.q = reinterpret_cast<float*>(base);
  base += layout.q_bytes();
  v.weights = reinterpret_cast<float*>(base);
  base += layout.weights_bytes();
  v.keys = reinterpret_cast<__half*>(base);
  base += layout.keys_bytes();
  v.scales = reinterpret_cast<float*>(base);
  base += layout.scales_bytes();
  v.partial = reinterpret_cast<float*>(base);
  return v;
}


// Per row: record a broken length rule and NaN-fill the row over
// [0, max_context_len), or (clean_logits) fill [L, max_context_len) with -inf.
__global__ void __launch_bounds__(kRowThreads) logits_rows_kernel(LogitsProblem p,
                                                                  DeviceErrorRecord* record) {
  enter_dependent_grid();
  const std::int64_t rows = p.batch * p.next_n;
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t b = row / p.next_n;
    const std::int64_t j = row % p.next_n;
    const std::int64_t length = row_length(p.lens, b, j);
    const std::int32_t violation =
        scoring_length_violation(length, p.max_context_len, p.max_blocks, p.cache.page_tokens);
    const bool usable = violation == kNoDeviceError;
    if (!usable && threadIdx.x == 0) {
      report_device_error(record, violation, row, length,
                          scoring_length_limit(violation, p.max_context_len, p.max_blocks));
    }
    if (usable && !p.clean_logits) continue;
    const std::int64_t first = usable ? length : 0;
    const float fill = usable ? masked_logit() : invalid_logit();
    for (std::int64_t pos = first + threadIdx.x; pos < p.max_context_len; pos += blockDim.x) {
      store_logit(p, row, pos, fill);
    }
  }
}

// The pages of one tile: page[i] holds the tile's positions [i * P, i * P + P)
// (i < 64 / P), or is nullptr where the tile reads no page (past the item's
// positions, or an entry the block table refuses).
struct TilePages {
  std::uint8_t* page[kMaxTilePages];
  int page_tokens;
  bool any;  // some page is read
};

// The page holding tile position t.
__device__ __forceinline__ std::uint8_t* tile_page(const TilePages& t, int token) {
  std::uint8_t* page = t.page[0];
#pragma unroll
  for (int i = 1; i < kMaxTilePages; ++i) {
    if (token >= i * t.page_tokens) page = t.page[i];
  }
  return page;
}

// Stores 8 values as halves (exact for e4m3 and e2m1 values) at dst.
__device__ __forceinline__ void store_halves(const float (&values)[8], __half* dst) {
  __align__(16) __half converted[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) converted[e] = __float2half_rn(values[e]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(converted);
}

// Decodes the keys and scales of the tile's pages into shared memory, tile
// position t at key row t: fp8 codes as they are with the token's scale,
// fp4 codes as e2m1 values with their D / 32 block scales.
__device__ void stage_tile(const CacheRef& cache, const TilePages& t, const SharedViews& s, int key_stride,
                           int scale_blocks) {
  const bool fp4 = cache.format == KeyFormat::fp4_e2m1;
  const int code_bytes = static_cast<int>(page_layout(cache).code_bytes());
  const int values_per_vector = fp4 ? 32 : 16;  // in 16 code bytes
  const int vectors = kTileTokens * code_bytes / 16;
  for (int i = threadIdx.x; i < vectors; i += kThreads) {
    const int token = i * 16 / code_bytes;
    const int d = i * 16 % code_bytes * (fp4 ? 2 : 1);
    std::uint8_t* page = tile_page(t, token);
    if (page == nullptr) continue;
    const uint4 raw =
        *reinterpret_cast<const uint4*>(page_keys(cache, page, token % t.page_tokens) + (fp4 ? d / 2 : d));
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    __half* dst = s.keys + token * key_stride + d;
    for (int part = 0; part < values_per_vector / 8; ++part) {
      float values[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int v = part * 8 + e;  // value v of the vector
        values[e] = fp4 ? e2m1_to_float(static_cast<std::uint8_t>((words[v / 8] >> (4 * (v % 8))) & 0xF))
                        : e4m3_to_float(static_cast<std::uint8_t>(words[v / 4] >> (8 * (v % 4))));
      }
      store_halves(values, dst + part * 8);
    }
  }
  for (int i = threadIdx.x; i < kTileTokens * scale_blocks; i += kThreads) {
    const int token = i / scale_blocks;
    std::uint8_t* page = tile_page(t, token);
    if (page == nullptr) continue;
    const int row = token % t.page_tokens;
    s.scales[i] = fp4 ? fp4_block_scale_value(page_scale_words(cache, page)[row], i % scale_blocks)
                      : page_scales(cache, page)[row];
  }
}

// Dequantizes heads [h0, h0 + count) of one query row and their weights
// (fp4 queries with their block scales applied); a pair's missing partner
// head is zero.
__device__ void stage_queries(const LogitsProblem& p, std::int64_t b, std::int64_t j, std::int64_t h0,
                              int count, const SharedViews& s) {
  const int head_dim = p.head_dim;
  const bool fp4 = p.fp4_queries();
  const int values_per_vector = fp4 ? 32 : 16;  // in 16 code bytes: one fp4 block
  const int vectors_per_head = head_dim / values_per_vector;
  const int padded = (count + kHeadsPerWarpPass - 1) / kHeadsPerWarpPass * kHeadsPerWarpPass;
  for (int i = threadIdx.x; i < padded * vectors_per_head; i += kThreads) {
    const int h = i / vectors_per_head;
    const int vector = i % vectors_per_head;
    const int d = vector * values_per_vector;
    float4* dst = reinterpret_cast<float4*>(s.q + h * head_dim + d);
    if (h >= count) {
      for (int e = 0; e < values_per_vector / 4; ++e) dst[e] = make_float4(0.f, 0.f, 0.f, 0.f);
      continue;
    }
    const std::int64_t offset = b * p.q_stride_b + j * p.q_stride_n + (h0 + h) * p.q_stride_h;
    const uint4 raw = *reinterpret_cast<const uint4*>(p.q + offset + vector * 16);
    const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
    if (fp4) {
      const float scale = fp4_block_scale_value(
          p.q_scales[b * p.q_scales_stride_b + j * p.q_scales_stride_n + (h0 + h) * p.q_scales_stride_h], vector);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int n = 4 * e + k;  // nibble n of the vector
          v[k] = e2m1_to_float(static_cast<std::uint8_t>((words[n / 8] >> (4 * (n % 8))) & 0xF)) * scale;
        }
        dst[e] = make_float4(v[0], v[1], v[2], v[3]);
      }
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dst[e] = make_float4(e4m3_to_float(static_cast<std::uint8_t>(words[e])),
                           e4m3_to_float(static_cast<std::uint8_t>(words[e] >> 8)),
                           e4m3_to_float(static_cast<std::uint8_t>(words[e] >> 16)),
                           e4m3_to_float(static_cast<std::uint8_t>(words[e] >> 24)));
    }
  }
  const std::int64_t row = b * p.next_n + j;
  for (int h = threadIdx.x; h < count; h += kThreads) {
    s.weights[h] = p.weights[row * p.weights_stride_row + h0 + h];
  }
}

__device__ __forceinline__ void unpack_halves(const uint4& raw, float (&out)[8]) {
  const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    __half2 pair;
    *reinterpret_cast<std::uint32_t*>(&pair) = words[e];
    const float2 f = __half22float2(pair);
    out[2 * e] = f.x;
    out[2 * e + 1] = f.y;
  }
}

// Scores the staged tile for row j of request b: logits at tile + t for
// t < min(64, length - tile) whose page was read.
__device__ void score_tile_row(const LogitsProblem& p, const SharedLayout& layout, const SharedViews& s,
                               const TilePages& pages, std::int64_t b, std::int64_t j, std::int64_t tile,
                               std::int64_t length) {
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int head_dim = p.head_dim;
  const __half* key0 = s.keys + lane * layout.key_stride();
  const __half* key1 = s.keys + (lane + 32) * layout.key_stride();
  // The key scales of the lane's positions, per block of D / scale_blocks values.
  const int blocks = layout.scale_blocks;
  const int block_values = head_dim / blocks;
  const float* scales0 = s.scales + lane * blocks;
  const float* scales1 = s.scales + (lane + 32) * blocks;
  float sum0 = 0.0f, sum1 = 0.0f;  // positions tile + lane, tile + lane + 32

  for (std::int64_t h0 = 0; h0 < p.heads; h0 += layout.head_tile) {
    const int count = static_cast<int>(p.heads - h0 < layout.head_tile ? p.heads - h0 : layout.head_tile);
    __syncthreads();  // the previous head tile (or row) is no longer read
    stage_queries(p, b, j, h0, count, s);
    __syncthreads();
    for (int h = warp * kHeadsPerWarpPass; h < count; h += kHeadGranule) {
      const float* qa = s.q + h * head_dim;
      const float* qb = qa + head_dim;
      // Each block's dot product times its scale, the blocks in order.
      float scaled_a0 = 0.0f, scaled_a1 = 0.0f, scaled_b0 = 0.0f, scaled_b1 = 0.0f;
      for (int block = 0; block < blocks; ++block) {
        float dot_a0 = 0.0f, dot_a1 = 0.0f, dot_b0 = 0.0f, dot_b1 = 0.0f;
        for (int d = block * block_values; d < (block + 1) * block_values; d += 8) {
          float k0[8], k1[8];
          unpack_halves(*reinterpret_cast<const uint4*>(key0 + d), k0);
          unpack_halves(*reinterpret_cast<const uint4*>(key1 + d), k1);
          const float4 a_lo = *reinterpret_cast<const float4*>(qa + d);
          const float4 a_hi = *reinterpret_cast<const float4*>(qa + d + 4);
          const float4 b_lo = *reinterpret_cast<const float4*>(qb + d);
          const float4 b_hi = *reinterpret_cast<const float4*>(qb + d + 4);
          const float a[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
          const float c[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            dot_a0 = fmaf(a[e], k0[e], dot_a0);
            dot_a1 = fmaf(a[e], k1[e], dot_a1);
            dot_b0 = fmaf(c[e], k0[e], dot_b0);
            dot_b1 = fmaf(c[e], k1[e], dot_b1);
          }
        }
        scaled_a0 = fmaf(scales0[block], dot_a0, scaled_a0);
        scaled_a1 = fmaf(scales1[block], dot_a1, scaled_a1);
        scaled_b0 = fmaf(scales0[block], dot_b0, scaled_b0);
        scaled_b1 = fmaf(scales1[block], dot_b1, scaled_b1);
      }
      sum0 = fmaf(s.weights[h], fmaxf(scaled_a0, 0.0f), sum0);
      sum1 = fmaf(s.weights[h], fmaxf(scaled_a1, 0.0f), sum1);
      if (h + 1 < count) {
        sum0 = fmaf(s.weights[h + 1], fmaxf(scaled_b0, 0.0f), sum0);
        sum1 = fmaf(s.weights[h + 1], fmaxf(scaled_b1, 0.0f), sum1);
      }
    }
  }
  s.partial[warp * kTileTokens + lane] = sum0;
  s.partial[warp * kTileTokens + lane + 32] = sum1;
  __syncthreads();
  if (threadIdx.x < kTileTokens) {
    float total = s.partial[threadIdx.x];
    for (int w = 1; w < kWarps; ++w) total += s.partial[w * kTileTokens + threadIdx.x];
    const std::int64_t position = tile + threadIdx.x;
    if (position < length && tile_page(pages, threadIdx.x) != nullptr) {
      store_logit(p, b * p.next_n + j, position, total);
    }
  }
}

// The length of flat row `row` (b * next_n + j) when it obeys the scoring rules, else 0.
__device__ std::int64_t usable_row_length(const LogitsProblem& p, std::int64_t row) {
  return usable_length(p, row / p.next_n, row % p.next_n);
}

// One work item: the unit's rows, positions of `chunk`. Every branch
// depends only on block-uniform values.
__device__ void score_item(const LogitsProblem& p, const SharedLayout& layout, const SharedViews& s,
                           const UnitSpan& unit, std::int64_t chunk, DeviceErrorRecord* record) {
  const std::int64_t row_end = unit.first_row + unit.rows;
  std::int64_t span = 0;
  for (std::int64_t row = unit.first_row; row < row_end; ++row) {
    const std::int64_t length = usable_row_length(p, row);
    span = length > span ? length : span;
  }
  const std::int64_t begin = chunk * kChunkTokens;
  const std::int64_t end = begin + kChunkTokens < span ? begin + kChunkTokens : span;
  const int page_tokens = p.cache.page_tokens;
  // A chunk is a whole number of tiles and a tile of pages. A page is looked
  // up only when its first position is below end <= span <= P * max_blocks,
  // so every block-table column read below exists.
  for (std::int64_t tile = begin; tile < end; tile += kTileTokens) {
    TilePages pages{{}, page_tokens, false};
#pragma unroll
    for (int i = 0; i < kMaxTilePages; ++i) {
      const std::int64_t first = tile + std::int64_t{i} * page_tokens;
      if (i * page_tokens >= kTileTokens || first >= end) continue;
      const std::int64_t column = first / page_tokens;
      const std::int32_t page = p.block_table[unit.request * p.block_table_stride + column];
      if (page >= 0 && page < p.cache.num_pages) {
        pages.page[i] = cache_page(p.cache, page);
        pages.any = true;
        continue;
      }
      if (threadIdx.x == 0) report_device_error(record, kPageOutOfRange, unit.request, column, page);
      for (std::int64_t row = unit.first_row; row < row_end; ++row) {
        const std::int64_t length = usable_row_length(p, row);
        for (std::int64_t pos = first + threadIdx.x; pos < first + page_tokens && pos < length; pos += kThreads) {
          store_logit(p, row, pos, invalid_logit());
        }
      }
    }
    if (!pages.any) continue;
    __syncthreads();  // the previous tile is no longer read
    stage_tile(p.cache, pages, s, layout.key_stride(), layout.scale_blocks);
    __syncthreads();
    for (std::int64_t row = unit.first_row; row < row_end; ++row) {
      const std::int64_t length = usable_row_length(p, row);
      if (length > tile) score_tile_row(p, layout, s, pages, row / p.next_n, row % p.next_n, tile, length);
    }
  }
}

__global__ void __launch_bounds__(kThreads) generic_logits_kernel(LogitsProblem p, int head_tile,
                                                                  DeviceErrorRecord* record) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  const SharedLayout layout{p.head_dim, head_tile, key_scale_blocks(p)};
  const SharedViews s = carve_shared(shared_bytes, layout);
  const UnitLayout units = unit_layout(p);
  enter_dependent_grid();
  if (threadIdx.x == 0) {
    check_schedule_share(p.schedule, static_cast<int>(blockIdx.x), p.num_workers, units.units, record);
  }
  if (p.varlen.offsets != nullptr && !request_offsets_hold(p.varlen, p.rows(), record)) {
    fill_share_with_nan(p, p.rows());
    return;
  }
  for_each_unit_item(p.schedule, static_cast<int>(blockIdx.x), p.num_workers, units,
                     [&](const UnitSpan& unit, std::int64_t chunk, std::int64_t) {
                       score_item(p, layout, s, unit, chunk, record);
                     });
}

bool aligned16(const void* pointer) { return reinterpret_cast<std::uintptr_t>(pointer) % 16 == 0; }

// Enqueues the per-row part of paged_mqa_logits: rows breaking a length rule
// (negative, beyond max_context_len, beyond the block table) are recorded and
// filled with NaN over [0, max_context_len); with clean_logits,
// [L, max_context_len) of the other rows is set to -inf. The scoring kernel
// then scores only rows obeying the rules (usable_length in
// common/logit_rules.hpp) and positions below their lengths.
Status launch_logits_row_rules(const LogitsProblem& p, const ExecContext& ctx) {
  const std::int64_t rows = p.rows();
  if (rows == 0) return Status::success();
  return launch_kernel("logits_rows_kernel", logits_rows_kernel, {grid_for(rows, 1, 1u << 16), kRowThreads}, ctx,
                       p, error_record(ctx));
}

}  // namespace

Status generic::paged_mqa_logits(const LogitsProblem& p, const ExecContext& ctx) {
  const char* op = "paged_mqa_logits";
  if (p.head_dim <= 0 || p.head_dim % 16 != 0) {
    return {ErrorCode::unsupported, std::string(op) + ": the generic CUDA kernel needs head_dim % 16 == 0"};
  }
  // The kernel reads keys and queries in 16-byte vectors.
  if (!aligned16(p.cache.base) || p.cache.page_stride % 16 != 0 || !aligned16(p.q) ||
      p.q_stride_b % 16 != 0 || p.q_stride_n % 16 != 0 || p.q_stride_h % 16 != 0) {
    return {ErrorCode::bad_alignment,
            std::string(op) + ": key_cache and q must be 16-byte aligned with strides of multiples of 16 bytes"};
  }
  DSA_RETURN_IF_ERROR(launch_logits_row_rules(p, ctx));
  if (p.num_workers <= 0) return Status::success();

  int shared_limit = 0;
  DSA_CUDA_CHECK(cudaDeviceGetAttribute(&shared_limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                        p.device.index));
  const std::size_t fixed = SharedLayout::fixed_bytes(p.head_dim, key_scale_blocks(p));
  const std::size_t per_head = SharedLayout::bytes_per_head(p.head_dim);
  const std::size_t limit = static_cast<std::size_t>(shared_limit);
  const std::int64_t fitting = limit > fixed ? static_cast<std::int64_t>((limit - fixed) / per_head) : 0;
  const std::int64_t wanted = (p.heads + kHeadGranule - 1) / kHeadGranule * kHeadGranule;
  std::int64_t head_tile = fitting / kHeadGranule * kHeadGranule;
  head_tile = head_tile < wanted ? head_tile : wanted;
  if (head_tile < kHeadGranule) {
    return {ErrorCode::unsupported, std::string(op) + ": head_dim " + std::to_string(p.head_dim) +
                                        " needs more shared memory than this device offers"};
  }
  const SharedLayout layout{p.head_dim, static_cast<int>(head_tile), key_scale_blocks(p)};
  const std::size_t shared_bytes = layout.total();
  // The device's limit (the same at every call), which covers this call's bytes.
  DSA_RETURN_IF_ERROR(allow_shared_bytes<&generic_logits_kernel>(limit));
  return launch_kernel("generic_logits_kernel", generic_logits_kernel,
                       {static_cast<unsigned>(p.num_workers), kThreads, shared_bytes}, ctx, p, layout.head_tile,
                       error_record(ctx));
}

}  // namespace dsa::detail::cuda
