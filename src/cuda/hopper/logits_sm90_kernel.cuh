// The sm_90a paged MQA logits kernel (see logits_sm90.hpp for the contract).
//
// One CTA per worker walks its schedule range (common/schedule_walk.hpp). Warpgroup 0
// lowers its register budget: its first warps produce (block-table lookups,
// tensor copies of pages and queries into a ring of shared-memory stages),
// taking the chunks of the walk in turn because issuing a page costs one warp
// more time than the copy engine needs to deliver it; the last warp fills the
// columns no page covers (-inf past the lengths, NaN for rows whose length
// breaks a rule) and reports those rows. The consumer
// warpgroups take pages in turn: a consumer spends most of a page waiting (for
// its matrix products, its shuffles, its stores), so several pages in flight
// per multiprocessor keep both the tensor cores and the copy engine busy while
// each consumer runs its epilogue.
//
// Per page, the 64 keys (fp8, 128-byte rows, 128-byte swizzle) are the A
// operand of m64nNk32 wgmma and the unit's queries the B operand, N = draft
// rows x heads per pass; the passes of a page run one after another, so a
// consumer holds one accumulator set. Accumulator row = token, so the weighted
// ReLU sum over heads is in-thread plus a reduce-scatter over the 4 threads
// that share a token row.
//
// The selection kernel (kSelect, the fused index_topk) is the same machine
// with a different end: the consumers leave each page's logits in shared
// memory, and a warpgroup of selector warps (candidate_select.cuh), one per
// draft row (modulo four; with fewer rows than warps, the warps split each
// row's pages), turns them into candidate lists; a stage returns to the
// producers once the selectors have read it too.
#pragma once

#include <cuda.h>

#include <cfloat>
#include <cstdint>
#include <type_traits>

#include "common/cache_format.hpp"
#include "common/logit_rules.hpp"
#include "common/number_formats.hpp"
#include "common/problem.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"
#include "cuda/fused/candidate_lists.hpp"
#include "cuda/fused/candidate_select.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/hopper/ptx.cuh"
#include "cuda/request_offsets_check.cuh"
#include "cuda/schedule_check.cuh"
#include "cuda/warp_scan.cuh"

namespace dsa::detail::cuda::hopper {

inline constexpr int kHeadDim = 128;
// A stage holds the keys of kStageTokens positions, then their scales, as
// one 64-token page would: a 32-token page fills half of each.
inline constexpr int kStageKeyBytes = kStageTokens * kHeadDim;
// A cache row's key bytes: fp8 codes, or fp4 codes two a byte.
template <bool kFp4Keys>
inline constexpr int kKeyRowBytes = kFp4Keys ? kHeadDim / 2 : kHeadDim;
// Where a stage's copied key bytes start in its key area.
template <bool kFp4Keys>
inline constexpr int kStageCodesOffset = kFp4Keys ? kStageKeyBytes / 2 : 0;
inline constexpr int kStageScaleBytes = kStageTokens * 4;
inline constexpr int kStagesPerChunk = kChunkTokens / kStageTokens;
inline constexpr int kMaxPagesPerStage = kStageTokens / 32;
inline constexpr int kWarpgroupThreads = 128;
// Consumer warpgroups per CTA. A consumer spends most of a page waiting (for
// its products, its shuffles, its stores), so the scoring kernel keeps four
// pages in flight per multiprocessor, whatever the columns of a unit: faster
// than three at next_n 2-4 and at the smallest shapes, no slower elsewhere
// (docs/performance.md). Four fit the 104 registers a 640-thread CTA leaves
// them without spills. The selection kernel keeps three, and a fifth
// warpgroup of selector warps.
constexpr int consumer_warpgroups(bool select) { return select ? 3 : 4; }
inline constexpr int kProducerWarps = 3;
inline constexpr int kFillThreads = kWarpgroupThreads - 32 * kProducerWarps;
// Columns of one wgmma pass (draft rows x heads); 128 keeps a consumer's
// accumulator set within its register budget.
inline constexpr int kScoringPassColumns = 128;
// setmaxnreg budgets. A CTA of T threads is launched with 64K / T registers
// per thread (rounded down to 8), and setmaxnreg.inc draws only on what the
// CTA's own warps gave back with setmaxnreg.dec: a limit above that share
// waits forever. Both kernels launch 640 threads (96 registers each); the
// producers keep 56, the selectors take 112 (their lists' state and the
// compactions' loads in flight), and the consumers get the rest: 104 each,
// of four or of three beside the selectors. Beside four consumers alone the
// consumers' share rounds down to 104 whether the producers keep 56 or 64,
// so the scoring kernel's producers keep 64 (producer 0 turns fp4 queries).
inline constexpr int kProducerRegisters = 56;
inline constexpr int kScoringProducerRegisters = 64;
inline constexpr int kSelectorRegisters = 112;
constexpr int launch_registers(int warpgroups) {
  return 64 * 1024 / (kWarpgroupThreads * warpgroups) / 8 * 8;
}
constexpr int consumer_registers(int consumers, bool selectors, int producer_registers = kProducerRegisters) {
  const int warpgroups = 1 + consumers + (selectors ? 1 : 0);
  const int kept = producer_registers + (selectors ? kSelectorRegisters : 0);
  return (launch_registers(warpgroups) * warpgroups - kept) / consumers / 8 * 8;
}
static_assert(consumer_registers(4, false) == 104 && consumer_registers(3, true) == 104 &&
              consumer_registers(4, false, kScoringProducerRegisters) == 104);
// The selection kernel's five warpgroups launch with fewer: the selectors raise theirs.
static_assert(kSelectorRegisters > launch_registers(5));
inline constexpr int kMaxSharedBytes = 227 * 1024;
inline constexpr int kMaxStages = 32;
// Every thread that touched shared data arrives on the barrier that hands it
// over: an mbarrier arrive releases only the arriving thread's own accesses.
//
// A query slot is free again once every consumer thread has finished every
// page scored against it. The count of those pages is known only when the unit
// ends, so the slot's barrier expects the largest arrival count; the consumer
// warpgroup's threads arrive once per page and the producer adds the remainder
// when it closes the unit. A unit longer than kMaxGenerationPages gets its
// queries loaded again, which keeps the remainder positive.
inline constexpr std::uint32_t kQueryReleaseArrivals = (1u << 20) - 1;
inline constexpr int kMaxGenerationPages = 1 << 12;
static_assert(kWarpgroupThreads * kMaxGenerationPages < static_cast<int>(kQueryReleaseArrivals));
// Query loads start on chunk boundaries only.
static_assert(kMaxGenerationPages % kStagesPerChunk == 0);

struct LogitsKernelParams {
  const std::uint8_t* cache_base = nullptr;
  std::int64_t page_stride = 0;
  std::int64_t num_pages = 0;
  int page_tokens = kStageTokens;  // P: 64, or 32 (two pages a stage)
  const float* weights = nullptr;
  std::int64_t weights_stride_row = 0;
  // fp4 queries (kernels with kFp4Queries): the packed codes [B, next_n, H, D / 2]
  // and block-scale words [B, next_n, H], strides in elements.
  const std::uint8_t* q_codes = nullptr;
  std::int64_t q_stride_b = 0, q_stride_n = 0, q_stride_h = 0;
  const std::uint32_t* q_scales = nullptr;
  std::int64_t q_scales_stride_b = 0, q_scales_stride_n = 0, q_scales_stride_h = 0;
  LengthsRef lens;
  RequestRows varlen;  // requests of uneven row counts (batch = T, next_n = 1), or none
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0;
  std::int64_t max_blocks = 0;
  const std::int32_t* schedule = nullptr;
  int num_workers = 0;
  std::int64_t batch = 0;
  std::int64_t next_n = 1;
  LogitsPath path = LogitsPath::native;
  std::int64_t max_context_len = 0;
  void* logits = nullptr;
  bool bf16_output = false;
  std::int64_t logits_stride = 0;
  bool clean_logits = false;
  DeviceErrorRecord* error = nullptr;
  // Selection kernels only (candidate_select.cuh): per-row selection
  // lengths, k, the list size a compaction aims for, and the lists.
  const std::int32_t* select_lengths = nullptr;
  int select_k = 0;
  int keep_limit = 0;
  CandidateLists lists;
  const Rank* select_floors = nullptr;  // [rows] lowest rank a list takes; nullptr: none
  const std::int32_t* run_if = nullptr;  // nothing to do unless *run_if != 0 (nullptr: run)
};

// What the producer tells the consumer about one stage.
enum StageKind : std::int32_t { kStagePage = 0, kStageMissingPage = 1, kStageEnd = 2 };
struct StageInfo {
  std::int64_t first_row;       // logits row of the unit's draft row 0
  std::int32_t first_position;  // key position of the stage's row 0
  std::int32_t generation;      // which query load the stage is scored against
  std::int32_t kind;
  // Rows [refused_begin, refused_end) of a kStagePage stage belong to a page
  // the block table points outside the cache (a 32-token page beside one
  // that is read): they score NaN. Empty when every page was read.
  std::int32_t refused_begin, refused_end;
  std::int32_t loaded_rows;  // rows [0, loaded_rows) hold this stage's pages (the rest: stale)
};

// One unit's queries travel by tensor copy; this is the rest of what the
// consumers need about them, written by the producer warp.
template <int kRows, int kHeads>
struct QueryInfo {
  float weights[kRows * kHeads];
  std::int64_t first_row;  // logits row of draft row 0 of the unit
  // Length of each row, or -1 when the row breaks a length rule (the fill
  // warps own such rows) or lies past the unit's rows (a short row tile).
  std::int32_t lengths[kRows];
  std::int32_t rows_in_use;  // rows up to the last with a length: later passes score nothing
  // fp4 queries: a head the e5m2 products cannot hold exactly (turn_fp4_queries),
  // so every stage of this load is scored value by value.
  std::int32_t exact_only;
};

// kSelect: the selection kernel, whose consumers leave each page's logits
// ([kRows][64] floats per stage) to the selector warps, which hand the
// stage back.
template <int kRows, int kHeads, bool kSelect>
struct SharedLayout {
  static constexpr int kConsumers = consumer_warpgroups(kSelect);
  static constexpr int kThreads = kWarpgroupThreads * (1 + kConsumers + (kSelect ? 1 : 0));
  static constexpr int kHistogramBytes = kSelect ? kSelectorWarps * kSelectBins * 4 : 0;
  static constexpr int kQueryBytes = kRows * kHeads * kHeadDim;
  static constexpr int kPageLogitsBytes = kSelect ? kRows * kStageTokens * 4 : 0;
  static constexpr int kFixedBytes = 1024 /* alignment slack */ + 2 * kQueryBytes +
                                     2 * static_cast<int>(sizeof(QueryInfo<kRows, kHeads>)) +
                                     6 * 8 /* query barriers */ + 2 * 8 /* issued generation, padding */ +
                                     kMaxStages * 4 /* pushed rounds */ + kHistogramBytes;
  static constexpr int kStageBytes = kStageKeyBytes + kStageScaleBytes + kPageLogitsBytes +
                                     static_cast<int>(sizeof(StageInfo)) + (kSelect ? 3 : 2) * 8;
  static constexpr int kStagesThatFit = (kMaxSharedBytes - kFixedBytes) / kStageBytes;
  // A multiple of the consumer count, so each consumer warpgroup always meets
  // the same stage slots.
  static constexpr int kStages = (kStagesThatFit < kMaxStages ? kStagesThatFit : kMaxStages) /
                                 kConsumers * kConsumers;
  static_assert(kStages >= kConsumers, "shared memory too small for a stage per consumer");

  static constexpr int keys = 0;
  static constexpr int queries = keys + kStages * kStageKeyBytes;
  static constexpr int scales = queries + 2 * kQueryBytes;
  static constexpr int page_logits = scales + kStages * kStageScaleBytes;
  static constexpr int query_info = page_logits + kStages * kPageLogitsBytes;
  static constexpr int stage_info = query_info + 2 * static_cast<int>(sizeof(QueryInfo<kRows, kHeads>));
  static constexpr int barriers = (stage_info + kStages * static_cast<int>(sizeof(StageInfo)) + 7) / 8 * 8;
  // page full, page empty, query full, query empty, query staged, and with
  // kSelect logits ready
  static constexpr int kBarriers = 2 * kStages + 6 + (kSelect ? kStages : 0);
  // The last query load issued (see produce).
  static constexpr int issued_generation = barriers + kBarriers * 8;
  // The last round of each stage slot pushed (see produce).
  static constexpr int pushed_rounds = issued_generation + 8;
  static constexpr int select_histogram = pushed_rounds + kMaxStages * 4;
  static constexpr int bytes = select_histogram + kHistogramBytes;  // one per selector
  static constexpr int launch_bytes = bytes + 1024;
  static_assert(launch_bytes <= kMaxSharedBytes, "shared memory layout too large");

  // Named views of the layout from the CTA's 1024-byte-aligned base.
  __device__ static std::uint8_t* page_keys(unsigned char* smem, int slot) {
    return smem + keys + slot * kStageKeyBytes;
  }
  __device__ static float* page_scales(unsigned char* smem, int slot) {
    return reinterpret_cast<float*>(smem + scales + slot * kStageScaleBytes);
  }
  __device__ static std::uint8_t* query_slot(unsigned char* smem, int slot) {
    return smem + queries + slot * kQueryBytes;
  }
  // Selection kernel: a stage's [kRows][64] logits for the selectors.
  __device__ static float* page_logits_of(unsigned char* smem, int slot) {
    return reinterpret_cast<float*>(smem + page_logits + slot * kPageLogitsBytes);
  }
  __device__ static QueryInfo<kRows, kHeads>* query_infos(unsigned char* smem) {
    return reinterpret_cast<QueryInfo<kRows, kHeads>*>(smem + query_info);
  }
  __device__ static StageInfo* stage_infos(unsigned char* smem) {
    return reinterpret_cast<StageInfo*>(smem + stage_info);
  }
  __device__ static std::int32_t* issued_generation_of(unsigned char* smem) {
    return reinterpret_cast<std::int32_t*>(smem + issued_generation);
  }
  __device__ static std::int32_t* pushed_rounds_of(unsigned char* smem) {
    return reinterpret_cast<std::int32_t*>(smem + pushed_rounds);
  }
  __device__ static int* selector_histogram(unsigned char* smem, int selector) {
    return reinterpret_cast<int*>(smem + select_histogram) + selector * kSelectBins;
  }
  // The barriers: kStages page-full (one arrival, the copy's bytes),
  // kStages page-empty, 2 query-full, 2 query-empty, 2 query-staged (fp4
  // queries: the codes' copy, before producer 0 turns them), and with
  // kSelect kStages logits-ready.
  __device__ static std::uint64_t* page_full(unsigned char* smem) {
    return reinterpret_cast<std::uint64_t*>(smem + barriers);
  }
  __device__ static std::uint64_t* page_empty(unsigned char* smem) { return page_full(smem) + kStages; }
  __device__ static std::uint64_t* query_full(unsigned char* smem) { return page_full(smem) + 2 * kStages; }
  __device__ static std::uint64_t* query_empty(unsigned char* smem) { return query_full(smem) + 2; }
  __device__ static std::uint64_t* query_staged(unsigned char* smem) { return query_full(smem) + 4; }
  __device__ static std::uint64_t* logits_ready(unsigned char* smem) { return query_full(smem) + 6; }
};

// How the schedule's units map to rows. kUneven: requests of uneven row counts
// (row tiles of request_offsets); otherwise a request's next_n draft rows, or
// one row on the per-token path. Kernels for fixed layouts are compiled
// without the offsets' walk, which costs the producers registers.
template <bool kUneven>
__device__ __forceinline__ UnitLayout unit_layout_of(const LogitsKernelParams& p) {
  if constexpr (kUneven) return unit_layout(p);
  return fixed_layout(p.lens, p.next_n, p.path, schedule_units(p.batch, p.next_n, p.path));
}

// The rows a schedule unit stands for: `count` (at most the kernel's kRows)
// consecutive logits rows from first_row, all of block-table row `request`.
struct UnitRows {
  std::int64_t request;
  std::int64_t first_row;
  int count;
};
template <int kRows, bool kUneven>
__device__ __forceinline__ UnitRows unit_rows(const UnitSpan& span) {
  // A fixed layout's units have the kernel's rows.
  return {span.request, span.first_row, kUneven ? static_cast<int>(span.rows) : kRows};
}
template <int kRows, bool kUneven>
__device__ __forceinline__ UnitRows unit_rows(const LogitsKernelParams& p, std::int64_t unit) {
  return unit_rows<kRows, kUneven>(unit_containing(unit_layout_of<kUneven>(p), unit));
}
// The length of the unit's row j < count.
__device__ __forceinline__ std::int32_t unit_row_length(const LogitsKernelParams& p, const UnitRows& rows,
                                                        int j) {
  const std::int64_t row = rows.first_row + j;
  return row_length(p.lens, row / p.next_n, row % p.next_n);
}
// The query map's coordinates (dimensions 2 and 3) of the unit's first row:
// (draft, request) of the [B][next_n] rows, or (row, 0) of the [T] rows of
// uneven requests.
struct QueryCoordinates {
  int c2, c3;
};
template <bool kUneven>
__device__ __forceinline__ QueryCoordinates query_coordinates(const LogitsKernelParams& p, const UnitRows& rows) {
  if constexpr (kUneven) return {static_cast<int>(rows.first_row), 0};
  return {static_cast<int>(rows.first_row % p.next_n), static_cast<int>(rows.first_row / p.next_n)};
}

// The device error a row length causes, or kNoDeviceError.
__device__ __forceinline__ std::int32_t length_violation(const LogitsKernelParams& p,
                                                         std::int32_t length) {
  return scoring_length_violation(length, p.max_context_len, p.max_blocks, p.page_tokens);
}

// Longest valid row of a unit: the key positions whose pages are read.
template <int kRows>
__device__ __forceinline__ std::int32_t read_length(const LogitsKernelParams& p,
                                                    const UnitRows& rows) {
  std::int32_t longest = 0;
  for (int j = 0; j < kRows && j < rows.count; ++j) {
    const std::int32_t length = unit_row_length(p, rows, j);
    if (length_violation(p, length) == kNoDeviceError && length > longest) longest = length;
  }
  return longest;
}

__device__ __forceinline__ void store_logit(const LogitsKernelParams& p, std::int64_t row,
                                            std::int64_t position, float value) {
  store_logit_at(p.logits, p.bf16_output, row * p.logits_stride + position, value);
}

// What a position of a valid row gets when no score is computed for it:
// NaN inside the row's length (its page was refused), -inf past it when the
// caller asked for clean logits. Returns false when nothing is written.
__device__ __forceinline__ bool unscored_value(const LogitsKernelParams& p, std::int64_t position,
                                               std::int32_t length, float* value) {
  if (position >= p.max_context_len) return false;
  if (position < length) {
    *value = invalid_logit();
    return true;
  }
  *value = masked_logit();
  return p.clean_logits;
}

// ---- fp4 codes as e5m2 rows ----------------------------------------------------

// Writes block `block` (32 codes, element i in nibble i % 8 of words[i / 8]) of
// a 128-byte row (`row_bytes`, row `row` of a 1024-byte-aligned tile) as e5m2
// bytes of code * 2^shift (`table` = e5m2_table(shift)): 16-byte chunks
// 2 * block and 2 * block + 1 of the row, placed by the 128-byte swizzle
// (chunk index ^ row % 8) as a tensor copy would have placed them.
__device__ __forceinline__ void store_e5m2_block(unsigned char* row_bytes, int row, int block,
                                                 const std::uint32_t (&words)[4], const E5m2Table& table) {
  std::uint32_t out[8];
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    std::uint32_t pair[2];
    e2m1x8_to_e5m2(words[w], table, pair);
    out[2 * w] = pair[0];
    out[2 * w + 1] = pair[1];
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const int chunk = (2 * block + c) ^ (row & 7);
    *reinterpret_cast<uint4*>(row_bytes + chunk * 16) =
        make_uint4(out[4 * c], out[4 * c + 1], out[4 * c + 2], out[4 * c + 3]);
  }
}

// ---- fp4 queries ---------------------------------------------------------------

// What turning reads of one query head besides its codes: whether its row is
// one of the tile's, its block-scale word and its weight.
struct Fp4QueryInput {
  bool in_tile;
  std::uint32_t word;
  float weight;
};

// A producer warp turns a tile of fp4 queries (kRows rows of kHeads heads),
// copied packed into the upper half of `slot`, into the e5m2 rows the
// products read, swizzled as a copied slot: each block's codes times
// 2^(its exponent - the head's largest), the head's largest scale folded into
// its weight (a positive factor passes through the ReLU), which goes to
// weights[j * kHeads + head]. input(j, head) is an Fp4QueryInput. Rows go 32
// at a time, every lane reading its whole row before any lane writes: row
// r's e5m2 bytes cover the packed rows 2r - R and 2r - R + 1 (R rows in all),
// which an earlier batch or this one has read. Blocks of zero codes and rows
// not in the tile take no part. Returns whether a head cannot be held exactly
// (e5m2_holds_fp4_row, or its folded weight leaves the normal floats); the
// consumers then score every stage against it value by value.
template <int kRows, int kHeads, typename Input>
__device__ __forceinline__ bool turn_fp4_queries(unsigned char* slot, Input&& input, float* weights, int lane) {
  constexpr int kSlotRows = kRows * kHeads;
  static_assert(kSlotRows % 32 == 0, "a lane per row of each batch");
  constexpr int kCodeBytes = kHeadDim / 2;
  constexpr int kBlocks = kHeadDim / kFp4BlockElements;
  const unsigned char* staged = slot + kSlotRows * kCodeBytes;
  bool inexact = false;
  // One batch at a time: the producer keeps few registers.
#pragma unroll 1
  for (int i = 0; i < kSlotRows / 32; ++i) {
    const int row = lane + 32 * i;  // draft row j = row / kHeads, head row % kHeads
    const int j = row / kHeads;
    const auto* source = reinterpret_cast<const uint4*>(staged + row * kCodeBytes);
    uint4 blocks[kBlocks];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) blocks[b] = source[b];
    const Fp4QueryInput in = input(j, row % kHeads);
    const std::uint32_t word = in.in_tile ? in.word : 0u;
    const float weight = in.in_tile ? in.weight : 0.0f;
    __syncwarp();  // the batch's rows are read before any is written
    unsigned used = 0;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const bool nonzero = (blocks[b].x | blocks[b].y | blocks[b].z | blocks[b].w) != 0u;
      used |= static_cast<unsigned>(in.in_tile && nonzero) << b;
    }
    const Fp4RowExponents exponents = fp4_row_exponents(word, used);
    const int top = exponents.top;
    const bool wide = !e5m2_holds_fp4_row(exponents, used);
    const float folded = used != 0 && !wide ? weight * __uint_as_float(static_cast<std::uint32_t>(top) << 23) : weight;
    inexact |= wide || (isfinite(weight) && weight != 0.0f && (!isfinite(folded) || fabsf(folded) < FLT_MIN));
    weights[row] = folded;
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int shift = (used >> b & 1u) ? static_cast<int>((word >> (8 * b)) & 0xFFu) - top : 0;
      const E5m2Table table = e5m2_table(shift >= kE5m2ExactShiftMin ? shift : 0);
      const std::uint32_t words[4] = {blocks[b].x, blocks[b].y, blocks[b].z, blocks[b].w};
      store_e5m2_block(slot + row * kHeadDim, row, b, words, table);
    }
  }
  ptx::fence_proxy_async_shared();  // the rows are the products' operands
  return __any_sync(0xffffffffu, inexact);
}

// ---- producer warps ----------------------------------------------------------

// Producer `producer` of kProducerWarps. Every producer walks the whole range
// and numbers every page (stage sequence) and every query load (generation)
// alike; producer j issues the pages of the chunks j, j + kProducerWarps, ...
// of the walk. Producer 0 alone loads the queries and publishes the
// generation it has issued; another producer pushes no page of a generation
// before that, so a consumer never waits on a query slot whose previous load
// has not been issued.
//
// A producer waits for a stage slot by the parity of its page-empty barrier's
// phase, which tells the slot's last round from the one before but not from
// two rounds back. Producers taking chunks in turn can drift further apart
// than that on a small ring (long walks of short chunks with few stages, as
// 8-row units have), so each slot also records the last round pushed into it:
// a producer pushes round r only after round r - 1 was pushed, whose pusher
// had seen round r - 2 released, and the parity it then waits on is exact.
template <int kRows, int kHeads, bool kSelect, bool kUneven, bool kFp4Keys, bool kFp4Queries>
__device__ __forceinline__ void produce(const LogitsKernelParams& p, const CUtensorMap* key_map,
                                        const CUtensorMap* query_map, unsigned char* smem,
                                        int producer) {
  using Layout = SharedLayout<kRows, kHeads, kSelect>;
  constexpr int kStages = Layout::kStages;
  constexpr int kWeightsPerLane = (kRows * kHeads + 31) / 32;
  auto* info = Layout::query_infos(smem);
  StageInfo* stage_info = Layout::stage_infos(smem);
  std::int32_t* issued_generation = Layout::issued_generation_of(smem);
  std::int32_t* pushed_rounds = Layout::pushed_rounds_of(smem);
  std::uint64_t* page_full = Layout::page_full(smem);
  std::uint64_t* page_empty = Layout::page_empty(smem);
  std::uint64_t* query_full = Layout::query_full(smem);
  std::uint64_t* query_empty = Layout::query_empty(smem);
  std::uint64_t* query_staged = Layout::query_staged(smem);

  const int lane = threadIdx.x % 32;
  const bool leader = ptx::elect_one();
  const bool loads_queries = producer == 0;

  int sequence = 0;         // stages pushed so far by all producers
  int generation = -1;      // query loads so far - 1
  int generation_pages = 0; // pages pushed against the current query load
  int chunk_ordinal = 0;    // chunks with pages walked so far
  std::int64_t current_unit = -1;
  UnitRows rows{0, 0, 0};
  std::int32_t lane_length = -1;  // lane j < kRows: row j's length, -1 when invalid
  std::int64_t read_stages = 0;  // stages spanned by the unit's longest row
  std::int64_t read_blocks = 0;  // and its block-table entries (pages of P tokens)
  const int pages_per_stage = kStageTokens / p.page_tokens;
  bool query_loaded = false;
  std::int64_t window_first = -1;  // block index held by lane 0 of the window
  std::int32_t window_entry = -1;

  // A stage's pages land side by side: keys of page i at row i * P of the
  // stage's keys, its scales at entry i * P of the stage's scales. Rows a
  // short last stage leaves unfilled are past every row's length. `read`
  // has bit i set when page i is in the cache.
  auto push_stage = [&](int stage_sequence, std::int32_t first_position, StageKind kind,
                        const std::int32_t (&pages)[kMaxPagesPerStage], int page_count, unsigned read) {
    const int slot = stage_sequence % kStages;
    const int round = stage_sequence / kStages;
    while (ptx::load_acquire_cta(&pushed_rounds[slot]) != round - 1) {
    }
    __syncwarp();  // every lane has read the round before the leader records the next
    ptx::mbarrier_wait(&page_empty[slot], (round & 1) ^ 1);
    if (leader) {
      const unsigned refused = ~read & ((1u << page_count) - 1);
      const int refused_begin = refused == 0 ? 0 : (__ffs(refused) - 1) * p.page_tokens;
      const int refused_end = refused == 0 ? 0 : (32 - __clz(refused)) * p.page_tokens;
      stage_info[slot] = StageInfo{rows.first_row, first_position, generation, kind,
                                   refused_begin, refused_end, page_count * p.page_tokens};
      if (kind == kStagePage) {
        // fp4 codes land in the upper half of the stage's key bytes, where the
        // consumer turns them into the e5m2 rows its products read.
        const int key_bytes = p.page_tokens * kKeyRowBytes<kFp4Keys>;
        const int scale_bytes = p.page_tokens * 4;
        ptx::mbarrier_arrive_expect_tx(&page_full[slot], __popc(read) * (key_bytes + scale_bytes));
#pragma unroll
        for (int i = 0; i < kMaxPagesPerStage; ++i) {
          if ((read >> i & 1u) == 0) continue;
          ptx::tensor_copy_3d(Layout::page_keys(smem, slot) + kStageCodesOffset<kFp4Keys> + i * key_bytes, key_map,
                              0, 0, pages[i], &page_full[slot]);
          ptx::bulk_copy(Layout::page_scales(smem, slot) + i * p.page_tokens,
                         p.cache_base + pages[i] * p.page_stride + key_bytes, scale_bytes,
                         &page_full[slot]);
        }
      } else {
        ptx::mbarrier_arrive(&page_full[slot]);
      }
      ptx::store_release_cta(&pushed_rounds[slot], round);
    }
    __syncwarp();
  };

  auto close_generation = [&]() {
    if (generation < 0) return;
    if (leader) {
      ptx::mbarrier_arrive(&query_empty[generation & 1],
                           kQueryReleaseArrivals -
                               kWarpgroupThreads * static_cast<std::uint32_t>(generation_pages));
    }
    __syncwarp();
  };

  // The query copy and the weight loads travel together. Once the slot is
  // free its full barrier's next phase is this load's, so the other
  // producers may push the generation's pages as soon as the copy is issued.
  // fp4 queries land packed in the slot's upper half, and this warp turns
  // them before the slot counts as full.
  auto load_queries = [&]() {
    const int slot = generation & 1;
    ptx::mbarrier_wait(&query_empty[slot], ((generation >> 1) & 1) ^ 1);
    const QueryCoordinates at = query_coordinates<kUneven>(p, rows);
    if (leader) {
      if constexpr (kFp4Queries) {
        ptx::mbarrier_arrive_expect_tx(&query_staged[slot], Layout::kQueryBytes / 2);
        ptx::tensor_copy_4d(Layout::query_slot(smem, slot) + Layout::kQueryBytes / 2, query_map, 0, 0, at.c2,
                            at.c3, &query_staged[slot]);
      } else {
        ptx::mbarrier_expect_tx(&query_full[slot], Layout::kQueryBytes);
        ptx::tensor_copy_4d(Layout::query_slot(smem, slot), query_map, 0, 0, at.c2, at.c3, &query_full[slot]);
      }
      ptx::store_release_cta(issued_generation, generation);
    }
    const std::int64_t first_row = rows.first_row;
    if constexpr (kFp4Queries) {
      ptx::mbarrier_wait(&query_staged[slot], (generation >> 1) & 1);
      // The unit's rows: drafts at.c2 + j of request at.c3, or rows at.c2 + j.
      const auto input = [&](int j, int head) {
        if (j >= rows.count) return Fp4QueryInput{false, 0u, 0.0f};
        const std::int64_t scales_row = kUneven ? (at.c2 + j) * p.q_scales_stride_b
                                                : at.c3 * p.q_scales_stride_b + (at.c2 + j) * p.q_scales_stride_n;
        return Fp4QueryInput{true, __ldg(p.q_scales + scales_row + head * p.q_scales_stride_h),
                             __ldg(p.weights + (rows.first_row + j) * p.weights_stride_row + head)};
      };
      const bool exact_only =
          turn_fp4_queries<kRows, kHeads>(Layout::query_slot(smem, slot), input, info[slot].weights, lane);
      if (lane == 0) info[slot].exact_only = exact_only;
    } else {
      float weights[kWeightsPerLane];
#pragma unroll
      for (int i = 0; i < kWeightsPerLane; ++i) {
        const int index = lane + 32 * i;
        weights[i] = index < rows.count * kHeads
                         ? __ldg(p.weights + (first_row + index / kHeads) * p.weights_stride_row +
                                 index % kHeads)
                         : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < kWeightsPerLane; ++i) {
        const int index = lane + 32 * i;
        if (index < kRows * kHeads) info[slot].weights[index] = weights[i];
      }
    }
    if (lane < kRows) info[slot].lengths[lane] = lane_length;
    const unsigned scored = __ballot_sync(0xffffffffu, lane_length >= 0);
    if (lane == 0) {
      info[slot].first_row = first_row;
      info[slot].rows_in_use = 32 - __clz(static_cast<int>(scored));
    }
    ptx::mbarrier_arrive(&query_full[slot]);  // releases this lane's weight and length stores
    __syncwarp();
  };

  // Lane j holds the block-table entry of block window_first + j.
  auto refresh_window = [&](std::int64_t block) {
    if (window_first >= 0 && block < window_first + 32) return;
    // One read of up to 32 consecutive needed entries, never past them.
    window_first = block;
    window_entry = block + lane < read_blocks
                       ? __ldg(p.block_table + rows.request * p.block_table_stride + block + lane)
                       : -1;
  };

  for_each_unit_item(p.schedule, static_cast<int>(blockIdx.x), p.num_workers, unit_layout_of<kUneven>(p),
                     [&](const UnitSpan& span, std::int64_t chunk, std::int64_t) {
                  if (span.unit != current_unit) {
                    current_unit = span.unit;
                    rows = unit_rows<kRows, kUneven>(span);
                    lane_length = -1;
                    if (lane < kRows && lane < rows.count) {
                      const std::int32_t length = unit_row_length(p, rows, lane);
                      if (length_violation(p, length) == kNoDeviceError) lane_length = length;
                    }
                    const unsigned longest =
                        warp_max(lane_length > 0 ? static_cast<unsigned>(lane_length) : 0u);
                    read_stages = pages_for_length(longest, kStageTokens);
                    read_blocks = pages_for_length(longest, p.page_tokens);
                    query_loaded = false;
                    window_first = -1;
                  }
                  const std::int64_t first_stage = chunk * kStagesPerChunk;
                  const std::int64_t left = read_stages - first_stage;
                  if (left <= 0) return;
                  const int stages = left < kStagesPerChunk ? static_cast<int>(left) : kStagesPerChunk;
                  const bool mine = chunk_ordinal++ % kProducerWarps == producer;
                  // The chunk's block-table entries are on their way during the query load.
                  if (mine) refresh_window(first_stage * pages_per_stage);
                  if (!query_loaded || generation_pages == kMaxGenerationPages) {
                    if (loads_queries) close_generation();
                    ++generation;
                    generation_pages = 0;
                    if (loads_queries) load_queries();
                    query_loaded = true;
                  }
                  if (mine) {
                    if (!loads_queries) {
                      while (ptx::load_acquire_cta(issued_generation) < generation) {
                      }
                    }
                    for (int k = 0; k < stages; ++k) {
                      const std::int64_t stage = first_stage + k;
                      std::int32_t pages[kMaxPagesPerStage];
                      int page_count = 0;
                      unsigned read = 0;
#pragma unroll
                      for (int i = 0; i < kMaxPagesPerStage; ++i) {
                        const std::int64_t block = stage * pages_per_stage + i;
                        if (i >= pages_per_stage || block >= read_blocks) break;
                        refresh_window(block);
                        pages[i] = __shfl_sync(0xffffffffu, window_entry,
                                               static_cast<int>(block - window_first));
                        const bool page_in_range = pages[i] >= 0 && pages[i] < p.num_pages;
                        if (!page_in_range && leader) {
                          report_device_error(p.error, kPageOutOfRange, rows.request, block, pages[i]);
                        }
                        read |= static_cast<unsigned>(page_in_range) << i;
                        ++page_count;
                      }
                      push_stage(sequence + k, static_cast<std::int32_t>(stage * kStageTokens),
                                 read != 0 ? kStagePage : kStageMissingPage, pages, page_count, read);
                    }
                  }
                  sequence += stages;
                  generation_pages += stages;
                });
  if (loads_queries) {
    for (int consumer = 0; consumer < Layout::kConsumers; ++consumer) {
      constexpr std::int32_t kNoPages[kMaxPagesPerStage] = {};
      push_stage(sequence + consumer, 0, kStageEnd, kNoPages, 0, 0u);
    }
  }
}

// ---- fill warps -----------------------------------------------------------------

// Columns of each unit's rows that no page covers: [pages * 64, max_context_len)
// gets -inf with clean_logits; a row whose length breaks a rule is reported
// and gets NaN everywhere. Without kStores (no logits output) it only reports.
template <int kRows, bool kStores, bool kUneven>
__device__ __forceinline__ void fill_uncovered(const LogitsKernelParams& p) {
  const int thread = static_cast<int>(threadIdx.x) - 32 * kProducerWarps;
  const UnitLayout layout = unit_layout_of<kUneven>(p);
  if (thread == 0) {
    check_schedule_share(p.schedule, static_cast<int>(blockIdx.x), p.num_workers, layout.units, p.error);
  }
  for (std::int64_t unit = blockIdx.x; unit < layout.units; unit += gridDim.x) {
    const UnitSpan span = unit_containing(layout, unit);
    if (span.unit != unit) continue;  // a later row of a row tile: its first row's CTA fills it
    const UnitRows rows = unit_rows<kRows, kUneven>(span);
    const std::int64_t read = read_length<kRows>(p, rows);
    const std::int64_t covered_pages_end = pages_for_length(read, kStageTokens) * kStageTokens;
    for (int j = 0; j < kRows && j < rows.count; ++j) {
      const std::int64_t row = rows.first_row + j;
      const std::int32_t length = unit_row_length(p, rows, j);
      const std::int32_t violation = length_violation(p, length);
      if (violation != kNoDeviceError && thread == 0) {
        report_device_error(p.error, violation, row, length,
                            scoring_length_limit(violation, p.max_context_len, p.max_blocks));
      }
      if (!kStores || (violation == kNoDeviceError && !p.clean_logits)) continue;
      const float value = violation == kNoDeviceError ? masked_logit() : invalid_logit();
      const std::int64_t first = violation == kNoDeviceError ? covered_pages_end : 0;
      for (std::int64_t position = first + thread; position < p.max_context_len;
           position += kFillThreads) {
        store_logit(p, row, position, value);
      }
    }
  }
}

// ---- consumer warpgroups ---------------------------------------------------------

// Quad reduce-scatter: the 4 threads sharing a token row each hold kValues
// partial sums; afterwards thread (b, c) = (lane & 1, (lane >> 1) & 1) holds
// the full sums of values b * kValues / 2 + c * kValues / 4 + i. With
// kValues == 2 both halves of the quad end with value b.
template <int kValues>
__device__ __forceinline__ void quad_reduce_scatter(const float (&values)[kValues],
                                                    float (&sums)[kValues >= 4 ? kValues / 4 : 1],
                                                    int lane) {
  constexpr int kHalf = kValues / 2;
  const bool b = lane & 1;
  float pair[kHalf];
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = b ? values[i] : values[i + kHalf];
    const float keep = b ? values[i + kHalf] : values[i];
    pair[i] = keep + __shfl_xor_sync(0xffffffffu, send, 1);
  }
  if constexpr (kValues >= 4) {
    constexpr int kQuarter = kHalf / 2;
    const bool c = lane & 2;
#pragma unroll
    for (int i = 0; i < kQuarter; ++i) {
      const float send = c ? pair[i] : pair[i + kQuarter];
      const float keep = c ? pair[i + kQuarter] : pair[i];
      sums[i] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
    }
  } else {
    sums[0] = pair[0] + __shfl_xor_sync(0xffffffffu, pair[0], 2);
  }
}

// partial[t * kPassRows + j]: this thread's share (its heads) of
// sum_h w[j, h] * max(0, scale_t * acc) for its token row t (0: upper, 1: lower 8).
// kScaled = false assumes non-negative scales and leaves the scale out (the
// caller multiplies once after the sum).
template <int kPassRows, int kHeads, bool kScaled>
__device__ __forceinline__ void weighted_relu_sums(const float (&acc)[kPassRows * kHeads / 2],
                                                   const float* weights, int quad_lane,
                                                   float scale_upper, float scale_lower,
                                                   float (&partial)[2 * kPassRows]) {
#pragma unroll
  for (int j = 0; j < kPassRows; ++j) {
    float upper[2] = {0.0f, 0.0f}, lower[2] = {0.0f, 0.0f};
#pragma unroll
    for (int group = 0; group < kHeads / 8; ++group) {
      const float2 w =
          *reinterpret_cast<const float2*>(weights + j * kHeads + 8 * group + 2 * quad_lane);
      const float* a = acc + 4 * (j * (kHeads / 8) + group);
      const int chain = group & 1;
      if constexpr (kScaled) {
        upper[chain] = fmaf(w.x, fmaxf(a[0] * scale_upper, 0.0f), upper[chain]);
        upper[chain] = fmaf(w.y, fmaxf(a[1] * scale_upper, 0.0f), upper[chain]);
        lower[chain] = fmaf(w.x, fmaxf(a[2] * scale_lower, 0.0f), lower[chain]);
        lower[chain] = fmaf(w.y, fmaxf(a[3] * scale_lower, 0.0f), lower[chain]);
      } else {
        upper[chain] = fmaf(w.x, fmaxf(a[0], 0.0f), upper[chain]);
        upper[chain] = fmaf(w.y, fmaxf(a[1], 0.0f), upper[chain]);
        lower[chain] = fmaf(w.x, fmaxf(a[2], 0.0f), lower[chain]);
        lower[chain] = fmaf(w.y, fmaxf(a[3], 0.0f), lower[chain]);
      }
    }
    partial[j] = upper[0] + upper[1];
    partial[kPassRows + j] = lower[0] + lower[1];
  }
}

// Everything a consumer thread knows about the page it is scoring.
struct PageContext {
  const unsigned char* keys;     // swizzled 64 x 128 bytes
  const unsigned char* queries;  // swizzled (kRows * kHeads) x 128 bytes
  const float* weights;          // [kRows][kHeads]
  const std::int32_t* lengths;   // [kRows]
  std::int64_t first_row;
  std::int64_t first_position;
  int refused_begin, refused_end;  // the stage's rows that score NaN (StageInfo)
  int rows_in_use = 1 << 30;       // passes from this draft row on are skipped (QueryInfo)
  float scale_upper, scale_lower;  // of this thread's two token rows
  int warp, lane;                  // in the warpgroup
  float* page_logits;              // selection kernel: [kRows][64] for the selectors
};

// The passes of a page: pass i scores draft rows [first_row(i), first_row(i) +
// rows(i)), kPassColumns / kHeads rows at a time, then the largest power of two
// that is left (so the reduce-scatter always splits evenly).
template <int kRows, int kHeads, int kPassColumns, int kFirstRow>
struct Pass {
  static constexpr int kRemaining = kRows - kFirstRow;
  static constexpr int kMaxRows = kPassColumns / kHeads;
  static constexpr int kRowsInPass = kRemaining >= kMaxRows ? kMaxRows
                                     : kRemaining >= 4      ? 4
                                     : kRemaining >= 2      ? 2
                                                            : 1;
  static constexpr int kColumns = kRowsInPass * kHeads;
  static constexpr int kNextRow = kFirstRow + kRowsInPass;
  static constexpr bool kLast = kNextRow == kRows;
};

// Issues (without waiting) the matrix product of one pass into `acc`; kKeys,
// kQueries: the types of the page's key bytes and of the query slot's (e5m2
// for fp4 codes turned).
template <int kHeads, int kFirstRow, int kColumns, ptx::Fp8Type kKeys, ptx::Fp8Type kQueries>
__device__ __forceinline__ void issue_pass(const PageContext& page, float (&acc)[kColumns / 2]) {
  const std::uint32_t key_descriptor = ptx::k_major_swizzle128_descriptor_low(page.keys);
  const std::uint32_t query_descriptor =
      ptx::k_major_swizzle128_descriptor_low(page.queries + kFirstRow * kHeads * kHeadDim);
  ptx::wgmma_fence();
#pragma unroll
  for (int k = 0; k < kHeadDim / 32; ++k) {
    // 32 bytes along K inside the swizzle atom = 2 descriptor address units.
    ptx::WgmmaFp8<kColumns, kKeys, kQueries>::mma(acc, ptx::swizzle128_descriptor(key_descriptor + 2 * k),
                                        ptx::swizzle128_descriptor(query_descriptor + 2 * k), k > 0);
  }
  ptx::wgmma_commit();
}

// The logits one finished pass gives this thread: weighted ReLU sums, quad
// reduce-scatter and scale. emit(j, stage_row, value) is called for each of
// its values, j the pass's draft row (from kFirstRow), stage_row the key row
// of the stage; of a quad pair holding the same sums only one emits.
template <int kHeads, int kFirstRow, int kRowsInPass, typename Emit>
__device__ __forceinline__ void pass_logits(const PageContext& page,
                                            const float (&acc)[kRowsInPass * kHeads / 2], Emit&& emit) {
  constexpr int kValues = 2 * kRowsInPass;
  const int quad_lane = page.lane & 3;
  float partial[kValues];
  const bool plain = page.scale_upper >= 0.0f && page.scale_lower >= 0.0f;
  if (plain) {
    weighted_relu_sums<kRowsInPass, kHeads, false>(acc, page.weights + kFirstRow * kHeads,
                                                   quad_lane, 1.0f, 1.0f, partial);
  } else {
    weighted_relu_sums<kRowsInPass, kHeads, true>(acc, page.weights + kFirstRow * kHeads,
                                                  quad_lane, page.scale_upper, page.scale_lower,
                                                  partial);
  }
  constexpr int kSums = kValues >= 4 ? kValues / 4 : 1;
  float sums[kSums];
  quad_reduce_scatter<kValues>(partial, sums, page.lane);

  // After the reduce-scatter, lane bit 0 selects the token row, bit 1 (and i)
  // the draft row.
  const int lower = page.lane & 1;
  const int half = (page.lane >> 1) & 1;
  if (kValues < 4 && half != 0) return;  // both halves of the quad hold the same sum
  const float scale = plain ? (lower ? page.scale_lower : page.scale_upper) : 1.0f;
  const int stage_row = 16 * page.warp + page.lane / 4 + 8 * lower;
#pragma unroll
  for (int i = 0; i < kSums; ++i) {
    emit(kFirstRow + (kValues >= 4 ? half * kSums + i : 0), stage_row, scale * sums[i]);
  }
}

// Stores the logit of draft row j at the stage's key row stage_row (-inf past
// the row's length, NaN on a refused page), or with kSelect leaves it to the
// selectors.
template <bool kSelect>
__device__ __forceinline__ void store_stage_logit(const LogitsKernelParams& p, const PageContext& page, int j,
                                                  int stage_row, float value) {
  const bool refused = stage_row >= page.refused_begin && stage_row < page.refused_end;
  if constexpr (kSelect) {
    // The selectors apply the lengths.
    page.page_logits[j * kStageTokens + stage_row] = refused ? invalid_logit() : value;
    return;
  }
  const std::int32_t length = page.lengths[j];
  if (length < 0) return;
  const std::int64_t position = page.first_position + stage_row;
  if ((position < length && !refused) || unscored_value(p, position, length, &value)) {
    store_logit(p, page.first_row + j, position, value);
  }
}

// Turns one finished pass into logits and stores them.
template <int kHeads, int kFirstRow, int kRowsInPass, bool kSelect>
__device__ __forceinline__ void finish_pass(const LogitsKernelParams& p, const PageContext& page,
                                            const float (&acc)[kRowsInPass * kHeads / 2]) {
  pass_logits<kHeads, kFirstRow, kRowsInPass>(page, acc, [&](int j, int stage_row, float value) {
    store_stage_logit<kSelect>(p, page, j, stage_row, value);
  });
}

// ---- fp4 keys -------------------------------------------------------------------

// The stage row a consumer thread turns (two threads a row).
__device__ __forceinline__ int turned_row(int thread) { return thread / 2; }

// Turns a stage's fp4 keys (64 rows of packed codes at kStageCodesOffset)
// into what the fp8 path reads: e5m2 rows in the stage's key bytes, swizzled
// as a copied page, each block's codes times 2^(its exponent - the row's
// largest), and the row's largest scale as its float scale in scales[row].
// `word` is this thread's row's scale word (turned_row); a row not `scored`
// (past every row's length, or of a refused page) has stale bytes and unused
// products. Blocks whose codes are all zero take no part in the exponents. A
// stage with a scored row e5m2 cannot hold (e5m2_holds_fp4_row), or any
// stage with `exact_only` (queries the products cannot hold), is left as it
// is and false returned (score_fp4_stage_exactly then scores it), after the
// same barrier. Every thread of the consumer warpgroup calls it; `barrier` is
// the warpgroup's named barrier, which also orders the caller's shared writes
// made before the call (the prefill kernel's scale words) ahead of the exact
// path's reads.
__device__ __forceinline__ bool turn_fp4_stage(unsigned char* keys, std::uint32_t word, bool scored, bool exact_only,
                                               float* scales, int thread, int barrier) {
  const int row = turned_row(thread), half = thread % 2;
  const auto* codes = reinterpret_cast<const uint4*>(keys + kStageCodesOffset<true> + row * kKeyRowBytes<true> +
                                                     half * kKeyRowBytes<true> / 2);
  const uint4 first = codes[0], second = codes[1];  // blocks 2 * half and 2 * half + 1
  const auto nonzero = [](const uint4& v) { return (v.x | v.y | v.z | v.w) != 0u; };
  unsigned used_blocks = (static_cast<unsigned>(nonzero(first)) | static_cast<unsigned>(nonzero(second)) << 1)
                         << (2 * half);
  used_blocks |= __shfl_xor_sync(0xffffffffu, used_blocks, 1);  // the row's other half
  const Fp4RowExponents exponents = fp4_row_exponents(word, used_blocks);
  const int top = exponents.top;
  const bool inexact = exact_only || (scored && !e5m2_holds_fp4_row(exponents, used_blocks));
  // Also orders every thread's reads of the codes before any row is written.
  if (ptx::named_barrier_or(barrier, kWarpgroupThreads, inexact)) return false;
  const uint4 halves[2] = {first, second};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int block = 2 * half + k;
    const int shift = static_cast<int>((word >> (8 * block)) & 0xFFu) - top;
    const E5m2Table table = e5m2_table(scored && shift >= kE5m2ExactShiftMin ? shift : 0);
    const std::uint32_t block_words[4] = {halves[k].x, halves[k].y, halves[k].z, halves[k].w};
    store_e5m2_block(keys + row * kHeadDim, row, block, block_words, table);
  }
  if (half == 0) scales[row] = scored ? __uint_as_float(static_cast<std::uint32_t>(top) << 23) : 0.0f;
  ptx::fence_proxy_async_shared();  // the rows are the products' operands
  ptx::named_barrier_sync(barrier, kWarpgroupThreads);
  return true;
}

// One fp4 query head as the exact path reads it: its packed codes, block-scale
// word and (unfolded) weight.
struct Fp4QueryRef {
  const unsigned char* codes;
  std::uint32_t word;
  float weight;
};

// Query head `head` of logits row `logits_row` of the paged kernels' fp4 queries.
__device__ __forceinline__ Fp4QueryRef fp4_query_of(const LogitsKernelParams& p, std::int64_t logits_row, int head) {
  const std::int64_t request = logits_row / p.next_n, draft = logits_row % p.next_n;
  return {p.q_codes + request * p.q_stride_b + draft * p.q_stride_n + head * p.q_stride_h,
          __ldg(p.q_scales + request * p.q_scales_stride_b + draft * p.q_scales_stride_n + head * p.q_scales_stride_h),
          __ldg(p.weights + logits_row * p.weights_stride_row + head)};
}

// Scores a stage of fp4 keys (as turn_fp4_stage left it untouched, a scale
// word per row in `scale_words`) value by value, for the rare stages the
// e5m2 products cannot hold exactly: per block of 32, the code products
// summed in float32 and scaled by the blocks' scales, then the weighted ReLU
// sum over the heads. fp8 queries and their weights are read from the page
// context; fp4 queries (kFp4Queries, whose slot holds them turned) through
// fp4_query(j, head), an Fp4QueryRef, for the rows j with row_in_tile(j). A warp
// takes one (draft row, token row) pair at a time, its lanes the heads; token
// rows from `rows` on score 0. emit(j, row, logit) stores, from lane 0.
template <int kRows, int kHeads, bool kFp4Queries, typename RowInTile, typename Fp4Query, typename Emit>
__device__ void score_fp4_stage_exactly(const PageContext& page, const std::uint32_t* scale_words, int rows,
                                        int thread, RowInTile&& row_in_tile, Fp4Query&& fp4_query, Emit&& emit) {
  static_assert(kHeads % 32 == 0, "lanes take the heads");
  constexpr int kHeadsPerLane = kHeads / 32;
  constexpr int kWarps = kWarpgroupThreads / 32;
  const int warp = thread / 32, lane = thread % 32;
  for (int pair = warp; pair < kRows * kStageTokens; pair += kWarps) {
    const int j = pair / kStageTokens, row = pair % kStageTokens;
    float logit = 0.0f;
    // fp4 queries are read for the tile's own rows only.
    if (row < rows && (!kFp4Queries || row_in_tile(j))) {
      const unsigned char* codes = page.keys + kStageCodesOffset<true> + row * kKeyRowBytes<true>;
      const unsigned char* query_codes[kHeadsPerLane];
      std::uint32_t query_words[kHeadsPerLane];
      float weights[kHeadsPerLane];
#pragma unroll
      for (int i = 0; i < kHeadsPerLane; ++i) {
        const int head = lane + 32 * i;
        if constexpr (kFp4Queries) {
          const Fp4QueryRef query = fp4_query(j, head);
          query_codes[i] = query.codes;
          query_words[i] = query.word;
          weights[i] = query.weight;
        } else {
          query_codes[i] = page.queries + (j * kHeads + head) * kHeadDim;
          query_words[i] = 0;
          weights[i] = page.weights[j * kHeads + head];
        }
      }
      float dot[kHeadsPerLane] = {};
#pragma unroll
      for (int b = 0; b < kHeadDim / kFp4BlockElements; ++b) {
        float block_sum[kHeadsPerLane] = {};
        for (int d = b * kFp4BlockElements; d < (b + 1) * kFp4BlockElements; d += 4) {
          float key[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) key[e] = e2m1_to_float(fp4_code(codes, d + e));
#pragma unroll
          for (int i = 0; i < kHeadsPerLane; ++i) {
            float query[4];
            if constexpr (kFp4Queries) {
              const unsigned two = __ldg(reinterpret_cast<const unsigned short*>(query_codes[i] + d / 2));
#pragma unroll
              for (int e = 0; e < 4; ++e) query[e] = e2m1_to_float(static_cast<std::uint8_t>((two >> (4 * e)) & 0xFu));
            } else {
              const int chunk = (d / 16) ^ ((j * kHeads + lane + 32 * i) & 7);  // the query slot's swizzle
              const std::uint32_t four =
                  *reinterpret_cast<const std::uint32_t*>(query_codes[i] + chunk * 16 + d % 16);
#pragma unroll
              for (int e = 0; e < 4; ++e) query[e] = e4m3_to_float(static_cast<std::uint8_t>(four >> (8 * e)));
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) block_sum[i] = fmaf(query[e], key[e], block_sum[i]);
          }
        }
        const float key_scale = fp4_block_scale_value(scale_words[row], b);
#pragma unroll
        for (int i = 0; i < kHeadsPerLane; ++i) {
          const float query_scale = kFp4Queries ? fp4_block_scale_value(query_words[i], b) : 1.0f;
          dot[i] = fmaf(block_sum[i] * query_scale, key_scale, dot[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < kHeadsPerLane; ++i) logit = fmaf(weights[i], fmaxf(dot[i], 0.0f), logit);
#pragma unroll
      for (int offset = 16; offset > 0; offset /= 2) logit += __shfl_xor_sync(0xffffffffu, logit, offset);
    }
    if (lane == 0) emit(j, row, logit);
  }
}

// Scores the passes of a page one after another (kKeys: the type of its key
// bytes): release() runs once the last product has read the page,
// finish(first_row, rows, acc) turns each finished pass (rows draft rows from
// first_row, as integral constants) into logits. Passes from draft row
// page.rows_in_use on are skipped (a row tile of a request with fewer rows
// computes only its own).
template <int kRows, int kHeads, int kPassColumns, int kFirstRow, ptx::Fp8Type kKeys = ptx::Fp8Type::e4m3,
          ptx::Fp8Type kQueries = ptx::Fp8Type::e4m3, typename Release, typename Finish>
__device__ __forceinline__ void score_passes(const PageContext& page, Release&& release, Finish&& finish) {
  using This = Pass<kRows, kHeads, kPassColumns, kFirstRow>;
  if (kFirstRow >= page.rows_in_use) {  // no later row of the unit is scored
    release();
    return;
  }
  float acc[This::kColumns / 2];
  issue_pass<kHeads, kFirstRow, This::kColumns, kKeys, kQueries>(page, acc);
  ptx::wgmma_wait<0>();
#pragma unroll
  for (int i = 0; i < This::kColumns / 2; ++i) ptx::fence_operand(acc[i]);
  if constexpr (This::kLast) release();
  finish(std::integral_constant<int, kFirstRow>{}, std::integral_constant<int, This::kRowsInPass>{}, acc);
  if constexpr (!This::kLast) {
    score_passes<kRows, kHeads, kPassColumns, This::kNextRow, kKeys, kQueries>(page, release, finish);
  }
}

template <int kRows, int kHeads, int kPassColumns, bool kSelect, bool kFp4Keys, bool kFp4Queries>
__device__ __forceinline__ void consume(const LogitsKernelParams& p, unsigned char* smem,
                                       int consumer) {
  using Layout = SharedLayout<kRows, kHeads, kSelect>;
  constexpr int kStages = Layout::kStages;
  auto* info = Layout::query_infos(smem);
  const StageInfo* stage_info = Layout::stage_infos(smem);
  std::uint64_t* page_full = Layout::page_full(smem);
  std::uint64_t* page_empty = Layout::page_empty(smem);
  std::uint64_t* query_full = Layout::query_full(smem);
  std::uint64_t* query_empty = Layout::query_empty(smem);
  std::uint64_t* logits_ready = Layout::logits_ready(smem);

  const int thread = static_cast<int>(threadIdx.x) % kWarpgroupThreads;
  const int warp = thread / 32;
  const int lane = thread % 32;
  int generation = -1;
  for (int sequence = consumer;; sequence += Layout::kConsumers) {
    const int slot = sequence % kStages;
    ptx::mbarrier_wait(&page_full[slot], (sequence / kStages) & 1);
    const StageInfo stage = stage_info[slot];
    float* page_logits = kSelect ? Layout::page_logits_of(smem, slot) : nullptr;
    if (stage.kind == kStageEnd) {
      if constexpr (kSelect) ptx::mbarrier_arrive(&logits_ready[slot]);  // ends the selectors
      break;
    }
    const int query_slot = stage.generation & 1;
    if (stage.generation != generation) {
      generation = stage.generation;
      ptx::mbarrier_wait(&query_full[query_slot], (generation >> 1) & 1);
    }
    auto& query = info[query_slot];
    auto release_page = [&]() {
      ptx::mbarrier_arrive(&page_empty[slot]);
    };
    if (stage.kind == kStagePage) {
      float* scales = Layout::page_scales(smem, slot);
      bool turned = true;
      int rows_scored = 0;  // the stage's token rows some draft row scores
      if constexpr (kFp4Keys) {
        int longest = 0;
#pragma unroll
        for (int j = 0; j < kRows; ++j) longest = max(longest, query.lengths[j]);
        rows_scored = min(max(longest - stage.first_position, 0), kStageTokens);
        const int row = turned_row(thread);
        const std::uint32_t word = reinterpret_cast<const std::uint32_t*>(scales)[row];
        const bool scored = row < stage.loaded_rows && row < rows_scored &&
                            !(row >= stage.refused_begin && row < stage.refused_end);
        // A load of queries the products cannot hold exactly leaves every stage untouched.
        turned = turn_fp4_stage(Layout::page_keys(smem, slot), word, scored, kFp4Queries && query.exact_only, scales,
                                thread, 1 + consumer);
      }
      PageContext page;
      page.keys = Layout::page_keys(smem, slot);
      page.queries = Layout::query_slot(smem, query_slot);
      page.weights = query.weights;
      page.lengths = query.lengths;
      page.first_row = query.first_row;
      page.first_position = stage.first_position;
      page.refused_begin = stage.refused_begin;
      page.refused_end = stage.refused_end;
      // The selectors read every row's logits.
      if constexpr (!kSelect) page.rows_in_use = query.rows_in_use;
      page.scale_upper = scales[16 * warp + lane / 4];
      page.scale_lower = scales[16 * warp + lane / 4 + 8];
      page.warp = warp;
      page.lane = lane;
      page.page_logits = page_logits;
      constexpr ptx::Fp8Type kKeys = kFp4Keys ? ptx::Fp8Type::e5m2 : ptx::Fp8Type::e4m3;
      constexpr ptx::Fp8Type kQueries = kFp4Queries ? ptx::Fp8Type::e5m2 : ptx::Fp8Type::e4m3;
      if (turned) {
        score_passes<kRows, kHeads, kPassColumns, 0, kKeys, kQueries>(
            page, release_page, [&](auto first_row, auto rows, const auto& acc) {
              finish_pass<kHeads, decltype(first_row)::value, decltype(rows)::value, kSelect>(p, page, acc);
            });
      } else if constexpr (kFp4Keys) {
        score_fp4_stage_exactly<kRows, kHeads, kFp4Queries>(
            page, reinterpret_cast<const std::uint32_t*>(scales), min(stage.loaded_rows, rows_scored), thread,
            [&](int j) { return page.lengths[j] >= 0; },
            [&](int j, int head) { return fp4_query_of(p, page.first_row + j, head); },
            [&](int j, int row, float logit) { store_stage_logit<kSelect>(p, page, j, row, logit); });
        release_page();
      }
    } else if constexpr (kSelect) {
      release_page();
      for (int index = thread; index < kRows * kStageTokens; index += kWarpgroupThreads) {
        page_logits[index] = invalid_logit();  // a refused page scores NaN
      }
    } else {
      release_page();
      for (int index = thread; index < kRows * kStageTokens; index += kWarpgroupThreads) {
        const int j = index / kStageTokens;
        const std::int64_t position = stage.first_position + index % kStageTokens;
        float value;
        if (query.lengths[j] >= 0 && unscored_value(p, position, query.lengths[j], &value)) {
          store_logit(p, query.first_row + j, position, value);
        }
      }
    }
    if constexpr (kSelect) ptx::mbarrier_arrive(&logits_ready[slot]);
    // This thread is done with the page's use of the queries (products waited
    // for, weights and lengths read).
    ptx::mbarrier_arrive(&query_empty[query_slot]);
  }
}

// ---- selector warps (selection kernel) -------------------------------------------

// The selector warps' role, which the selection kernel alone plays: defined
// with the fused index_topk (fused/select_pages.cuh), whose launches are the
// only instances of the kernel with kSelect.
template <int kRows, int kHeads>
__device__ __forceinline__ void select_pages(const LogitsKernelParams& p, unsigned char* smem,
                                             int selector);

// ---- the kernel ----------------------------------------------------------------

// kSelect: the selection kernel of the fused index_topk, which writes
// candidate lists (p.lists) instead of logits. kUneven: units are row tiles of
// requests of uneven row counts (p.varlen), checked on the device first.
// kFp4Keys: the cache holds fp4 keys (cache_format.hpp), turned into e5m2 by
// the consumers (turn_fp4_stage); kFp4Queries (with kFp4Keys only): fp4
// queries, turned by producer 0 (turn_fp4_queries).
template <int kRows, int kHeads, int kPassColumns, bool kSelect, bool kUneven, bool kFp4Keys, bool kFp4Queries>
__global__ void __launch_bounds__((SharedLayout<kRows, kHeads, kSelect>::kThreads), 1)
    paged_logits_sm90_kernel(const LogitsKernelParams p, const __grid_constant__ CUtensorMap key_map,
                             const __grid_constant__ CUtensorMap query_map) {
#if DSA_SM90A_ENABLED
  using Layout = SharedLayout<kRows, kHeads, kSelect>;
  constexpr int kStages = Layout::kStages;
  constexpr int kProducerBudget = kSelect ? kProducerRegisters : kScoringProducerRegisters;
  extern __shared__ unsigned char shared_raw[];
  // Swizzled tensor copies and wgmma descriptors need 1024-byte alignment.
  unsigned char* smem =
      shared_raw + ((1024 - (ptx::smem_address(shared_raw) & 1023)) & 1023);
  if (threadIdx.x == 0) {
    // Before the wait for the previous kernel: the maps are this launch's own.
    ptx::prefetch_tensor_map(&key_map);
    ptx::prefetch_tensor_map(&query_map);
    for (int s = 0; s < kStages; ++s) {
      ptx::mbarrier_init(&Layout::page_full(smem)[s], 1);
      // page empty: the consumer, and with kSelect the selectors
      ptx::mbarrier_init(&Layout::page_empty(smem)[s],
                         kWarpgroupThreads + (kSelect ? 32 * active_selectors(kRows) : 0));
      if (kSelect) ptx::mbarrier_init(&Layout::logits_ready(smem)[s], kWarpgroupThreads);
    }
    *Layout::issued_generation_of(smem) = -1;
    for (int s = 0; s < kStages; ++s) Layout::pushed_rounds_of(smem)[s] = -1;
    for (int s = 0; s < 2; ++s) {
      ptx::mbarrier_init(&Layout::query_full(smem)[s], 32);  // producer 0
      ptx::mbarrier_init(&Layout::query_empty(smem)[s], kQueryReleaseArrivals);
      ptx::mbarrier_init(&Layout::query_staged(smem)[s], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  enter_dependent_grid();
  if (p.run_if != nullptr && *p.run_if == 0) return;
  if constexpr (kUneven) {
    // Broken request_offsets: recorded, and no row is scored (rows NaN).
    if (!request_offsets_hold(p.varlen, p.batch * p.next_n, p.error)) {
      fill_share_with_nan(p, p.batch * p.next_n);
      return;
    }
  }

  // Read from lane 0, the warpgroup index is known to be warp-uniform: what
  // derives from it (stage slots, descriptors) stays in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x) / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    ptx::lower_register_limit<kProducerBudget>();
    if (threadIdx.x < 32 * kProducerWarps) {
      produce<kRows, kHeads, kSelect, kUneven, kFp4Keys, kFp4Queries>(p, &key_map, &query_map, smem,
                                                                      static_cast<int>(threadIdx.x) / 32);
    } else {
      fill_uncovered<kRows, !kSelect, kUneven>(p);
    }
  } else if (warpgroup <= Layout::kConsumers) {
    ptx::raise_register_limit<consumer_registers(Layout::kConsumers, kSelect, kProducerBudget)>();
    consume<kRows, kHeads, kPassColumns, kSelect, kFp4Keys, kFp4Queries>(p, smem, warpgroup - 1);
  } else if constexpr (kSelect) {
    ptx::raise_register_limit<kSelectorRegisters>();
    const int selector = (static_cast<int>(threadIdx.x) / 32) % kSelectorWarps;
    if (selector < active_selectors(kRows)) select_pages<kRows, kHeads>(p, smem, selector);
  }
#else
  (void)p;
  (void)key_map;
  (void)query_map;
#endif
}

}  // namespace dsa::detail::cuda::hopper
