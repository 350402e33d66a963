// Validated, normalized descriptions of each operation: what validation
// produces from the public TensorViews and what every backend consumes.
// Strides here are in elements of the named type; all pointers are on
// `device`. Nothing in this file depends on CUDA.
#pragma once

#include <cstdint>

#include "dsa/cache.hpp"
#include "dsa/context.hpp"
#include "dsa/lengths.hpp"
#include "dsa/schedule.hpp"
#include "dsa/tensor.hpp"

namespace dsa::detail {

// The paged key cache; byte-level access lives in cache_format.hpp.
struct CacheRef {
  std::uint8_t* base = nullptr;
  std::int64_t page_stride = 0;  // bytes, multiple of 16
  std::int64_t num_pages = 0;
  int head_dim = 0;
  int page_tokens = 0;  // P: 32 or 64
  KeyFormat format = KeyFormat::fp8_e4m3;  // resolved: fp8_e4m3 or fp4_e2m1
};

struct StoreKeysProblem {
  Device device;
  std::int64_t num_tokens = 0;
  int head_dim = 0;
  const void* keys = nullptr;  // [N, D]
  DType keys_dtype = DType::float32;  // float32 or bfloat16
  std::int64_t keys_stride = 0;       // between tokens
  const void* slots = nullptr;        // [N]
  DType slots_dtype = DType::int64;   // int32 or int64
  std::int64_t slots_stride = 0;
  CacheRef cache;
  bool power_of_two_scales = false;
};

struct QuantizeQueriesProblem {
  Device device;
  std::int64_t batch = 0, next_n = 0, heads = 0;
  int head_dim = 0;
  const void* q = nullptr;  // [B, next_n, H, D]
  DType q_dtype = DType::float32;  // float32 or bfloat16
  std::int64_t q_stride_b = 0, q_stride_n = 0, q_stride_h = 0;
  const void* gate = nullptr;  // [B * next_n, H]
  DType gate_dtype = DType::float32;
  std::int64_t gate_stride_row = 0, gate_stride_h = 0;
  // fp8 codes [B, next_n, H, D], or with fp4 packed e2m1 codes [B, next_n, H, D / 2]
  std::uint8_t* q_codes = nullptr;
  std::int64_t q_codes_stride_b = 0, q_codes_stride_n = 0, q_codes_stride_h = 0;
  // fp4 only: the packed ue8m0 block scales [B, next_n, H]; nullptr for fp8.
  std::int32_t* q_block_scales = nullptr;
  std::int64_t q_scales_stride_b = 0, q_scales_stride_n = 0, q_scales_stride_h = 0;
  float* weights = nullptr;  // [B * next_n, H]
  std::int64_t weights_stride_row = 0;
  bool power_of_two_scales = false;
  float weight_scale = 1.0f;  // resolved (never 0)

  // constexpr: the CUDA kernels call it too.
  constexpr bool fp4() const { return q_block_scales != nullptr; }
};

using dsa::LengthConvention;


// 2-D context lengths [B, next_n].
struct LengthsRef {
  const std::int32_t* data = nullptr;
  std::int64_t stride_b = 0, stride_n = 0;
};

// Requests of uneven row counts (request_offsets, dsa/logits.hpp): request
// q owns rows [offsets[q], offsets[q + 1]). Where a problem holds them, its
// batch is the number of rows T, next_n is 1 and lens is [T, 1]; the
// block-table row of a row is its request.
struct RequestRows {
  const std::int32_t* offsets = nullptr;  // [requests + 1], contiguous; nullptr: none
  std::int64_t requests = 0;
};

struct LengthsProblem {
  Device device;
  LengthConvention convention = LengthConvention::causal;
  std::int64_t batch = 0;
  int next_n = 1;
  const std::int32_t* input = nullptr;  // [B]
  std::int64_t input_stride = 0;
  std::int32_t* out = nullptr;  // [B, next_n]; with varlen [T] (out_stride_n unused)
  std::int64_t out_stride_b = 0, out_stride_n = 0;
  RequestRows varlen;  // causal only: row offsets[b] + t of request b gets input[b] + t + 1
  std::int64_t rows = 0;  // T, with varlen
};

struct ScheduleProblem {
  Device device;
  std::int64_t batch = 0;
  int next_n = 1;
  LengthsRef lens;
  RequestRows varlen;
  int num_workers = 1;
  LogitsPath path = LogitsPath::native;  // resolved: native or per_token
  std::int32_t* schedule = nullptr;      // [num_workers + 1, 2], row stride 2
};

struct LogitsProblem {
  Device device;
  std::int64_t batch = 0, next_n = 1, heads = 0;
  int head_dim = 0;
  // fp8 [B, next_n, H, D], or fp4 packed codes [B, next_n, H, D / 2] (bytes)
  const std::uint8_t* q = nullptr;
  std::int64_t q_stride_b = 0, q_stride_n = 0, q_stride_h = 0;
  // fp4 queries only: packed ue8m0 block scales [B, next_n, H]; nullptr for fp8 queries.
  const std::uint32_t* q_scales = nullptr;
  std::int64_t q_scales_stride_b = 0, q_scales_stride_n = 0, q_scales_stride_h = 0;
  CacheRef cache;
  const float* weights = nullptr;  // [B * next_n, H]
  std::int64_t weights_stride_row = 0;
  LengthsRef lens;
  RequestRows varlen;  // with it, batch = T rows, next_n = 1 (see RequestRows)
  const std::int32_t* block_table = nullptr;  // [B or requests, max_blocks]
  std::int64_t block_table_stride = 0, max_blocks = 0;
  const std::int32_t* schedule = nullptr;  // [num_workers + 1, 2], row stride 2
  int num_workers = 0;
  LogitsPath path = LogitsPath::native;  // resolved: native or per_token
  std::int64_t max_context_len = 0;
  void* logits = nullptr;  // [B * next_n, >= max_context_len]
  DType logits_dtype = DType::float32;  // float32 or bfloat16
  std::int64_t logits_stride = 0;
  bool clean_logits = false;

  // constexpr: the CUDA kernels call them too.
  constexpr std::int64_t rows() const { return batch * next_n; }
  constexpr bool fp4_queries() const { return q_scales != nullptr; }
  constexpr bool fp4_keys() const { return cache.format == KeyFormat::fp4_e2m1; }
  // The most rows one schedule unit scores together: a request's next_n rows
  // (or, with request_offsets, a row tile of up to kVarlenRowTile) on the
  // native path, one row on the per-token path.
  int rows_per_unit() const {
    if (path == LogitsPath::per_token) return 1;
    return varlen.offsets != nullptr ? kVarlenRowTile : static_cast<int>(next_n);
  }
};

// mqa_logits (dsa/prefill.hpp): rows of a contiguous key run, row i over
// keys [ks[i], ke[i]).
struct MqaLogitsProblem {
  Device device;
  std::int64_t rows = 0, heads = 0, num_keys = 0;  // S, H, S_kv
  int head_dim = 0;
  const std::uint8_t* q = nullptr;  // fp8 [S, H, D], or fp4 packed codes [S, H, D / 2] (bytes)
  std::int64_t q_stride_row = 0, q_stride_h = 0;
  // fp4 queries only: packed ue8m0 block scales [S, H]; nullptr for fp8 queries.
  const std::uint32_t* q_scales = nullptr;
  std::int64_t q_scales_stride_row = 0, q_scales_stride_h = 0;
  const std::uint8_t* keys = nullptr;  // fp8 [S_kv, D], or fp4 packed codes [S_kv, D / 2] (bytes)
  std::int64_t keys_stride = 0;
  // One of the two: fp32 scales of fp8 keys, or the scale words of fp4 keys [S_kv].
  const float* key_scales = nullptr;
  const std::uint32_t* key_scale_words = nullptr;
  std::int64_t key_scales_stride = 0;
  const float* weights = nullptr;  // [S, H]
  std::int64_t weights_stride_row = 0;
  const std::int32_t* ks = nullptr;  // [S]
  std::int64_t ks_stride = 0;
  const std::int32_t* ke = nullptr;  // [S]
  std::int64_t ke_stride = 0;
  bool compressed = false;
  std::int64_t max_seqlen_k = 0;  // 0 unless compressed
  void* logits = nullptr;  // [S, >= width()]
  DType logits_dtype = DType::float32;  // float32 or bfloat16
  std::int64_t logits_stride = 0;
  bool clean_logits = false;

  // The defined columns of every row: S_kv, or max_seqlen_k when compressed
  // (constexpr: the CUDA kernels call it too).
  constexpr std::int64_t width() const { return compressed ? max_seqlen_k : num_keys; }
  constexpr bool fp4_queries() const { return q_scales != nullptr; }
  constexpr bool fp4_keys() const { return key_scale_words != nullptr; }
};

struct TopkProblem {
  Device device;
  std::int64_t rows = 0, cols = 0;
  const void* logits = nullptr;  // [T, cols]
  DType logits_dtype = DType::float32;  // float32 or bfloat16
  std::int64_t logits_stride = 0;
  const std::int32_t* lengths = nullptr;  // [T]
  std::int64_t lengths_stride = 0;
  int k = 0;
  std::int32_t* indices = nullptr;  // [T, >= k]
  std::int64_t indices_stride = 0;
  bool sorted = false;
  // Row r's candidates start at column row_starts[r]; nullptr: at column 0.
  const std::int32_t* row_starts = nullptr;  // [T], contiguous
  // Output transforms (at most one): i + position_offsets[r], or a cache
  // slot through the block table; neither when both are nullptr.
  const std::int32_t* position_offsets = nullptr;  // [T], contiguous
  const std::int32_t* block_table = nullptr;
  std::int64_t block_table_stride = 0, max_blocks = 0;
  int page_size = 64;  // 1, 32 or 64
  // Row r's request: request_offsets' interval holding r when given, else
  // r / rows_per_request.
  int rows_per_request = 1;
  const std::int32_t* request_offsets = nullptr;  // [requests + 1], contiguous
  std::int64_t requests = 0;
};

struct IndexTopkProblem {
  // Scoring inputs (logits/logits_stride unset: with fused == false each
  // backend stages the logits in memory of its own choosing).
  LogitsProblem logits;
  bool fused = true;
  const std::int32_t* topk_lens = nullptr;  // [B * next_n]; nullptr: from lens
  std::int64_t topk_lens_stride = 0;
  int k = 0;
  std::int32_t* indices = nullptr;
  std::int64_t indices_stride = 0;
  bool sorted = false;
  bool physical_slots = false;
};

}  // namespace dsa::detail
