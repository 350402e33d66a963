// Naive host-side reference implementations of everything the library
// computes, written from the documented semantics (include/dsa/*.hpp) and
// sharing no code with the library: they are what the test suites compare
// against. Host-only and free of CUDA so that the CPU and GPU suites can both
// use them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dsa_test {

// ---- Number formats -------------------------------------------------------

// OCP e4m3fn: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; codes 0x7F
// and 0xFF are NaN; no infinities.
float e4m3_decode(std::uint8_t code);
// The nearest finite e4m3 code found by searching the table of all finite
// codes; ties go to the code with an even mantissa; magnitudes beyond 448
// saturate to +-448; NaN gives a NaN code with the input's sign.
std::uint8_t e4m3_encode(float x);

float bf16_decode(std::uint16_t bits);
// Round to nearest, ties to even; NaN stays a (quiet) NaN.
std::uint16_t bf16_encode(float x);
// x rounded to bfloat16 and back.
float bf16_round(float x);

// max(amax, 1e-4) / 448 in float32, optionally rounded up to a power of two.
float quantization_scale(float amax, bool power_of_two);

// ---- The paged key cache --------------------------------------------------

// Pages of P tokens: P keys of head_dim fp8 bytes, then P fp32 scales.
struct CacheGeometry {
  int head_dim = 128;
  std::int64_t num_pages = 0;
  std::int64_t page_stride = 0;  // bytes between pages
  int page_tokens = 64;          // P

  std::int64_t num_slots() const { return num_pages * page_tokens; }
  std::int64_t bytes() const { return num_pages * page_stride; }
  std::int64_t key_byte(std::int64_t slot) const {
    return (slot / page_tokens) * page_stride + (slot % page_tokens) * head_dim;
  }
  std::int64_t scale_byte(std::int64_t slot) const {
    return (slot / page_tokens) * page_stride + std::int64_t{page_tokens} * head_dim + 4 * (slot % page_tokens);
  }
  // The slot of key position p of a request: block_table_row[p / P] * P + p % P.
  std::int64_t position_slot(const std::int32_t* block_table_row, std::int64_t p) const {
    return std::int64_t{block_table_row[p / page_tokens]} * page_tokens + p % page_tokens;
  }
};

// Quantizes one token key (head_dim floats) into its slot of `cache`.
void store_token(const float* key, std::int64_t slot, const CacheGeometry& geometry,
                 bool power_of_two_scales, std::uint8_t* cache);
float cached_scale(const std::uint8_t* cache, const CacheGeometry& geometry, std::int64_t slot);
float cached_key(const std::uint8_t* cache, const CacheGeometry& geometry, std::int64_t slot,
                 int d);

// ---- Queries --------------------------------------------------------------

// The model's default weight multiplier H^-0.5 * D^-0.5.
float default_weight_scale(int heads, int head_dim);

// Per (row, head) quantization of contiguous float q [rows, heads, head_dim]
// and gate [rows, heads] into contiguous q_fp8 and weights.
void quantize_queries(const float* q, const float* gate, std::int64_t rows, int heads,
                      int head_dim, bool power_of_two_scales, float weight_scale,
                      std::uint8_t* q_fp8, float* weights);
// The q_scale of one (row, head) vector, as quantize_queries uses it.
float query_scale(const float* q_head, int head_dim, bool power_of_two_scales);

// ---- Context lengths ------------------------------------------------------

std::vector<std::int32_t> causal_lens(const std::vector<std::int32_t>& prefix, int next_n);
std::vector<std::int32_t> expanded_lens(const std::vector<std::int32_t>& prefix, int next_n);
std::vector<std::int32_t> legacy_lens(const std::vector<std::int32_t>& lens, int next_n);

// ---- Logits ---------------------------------------------------------------

// Everything the logits formula reads, as contiguous host arrays.
struct LogitsInputs {
  std::int64_t batch = 0;
  int next_n = 1, heads = 64, head_dim = 128;
  const std::uint8_t* q_fp8 = nullptr;        // [B, next_n, H, D]
  const float* weights = nullptr;             // [B * next_n, H]
  const std::uint8_t* cache = nullptr;        // geometry.bytes()
  CacheGeometry geometry;
  const std::int32_t* context_lens = nullptr;  // [B * next_n]
  const std::int32_t* block_table = nullptr;   // [B, max_blocks]
  std::int64_t max_blocks = 0;
  // Requests of uneven row counts: row r reads block-table row
  // row_request[r] (size B * next_n) instead of its own b.
  const std::int32_t* row_request = nullptr;
};

// Logits computed in float64: value[r * cols + p] for p < L[r] (NaN beyond),
// and magnitude[r * cols + p] = sum_h |w| * |scale| * sum_d |q * k|, the scale
// against which rounding errors of a float32 implementation are measured.
struct ReferenceLogits {
  std::int64_t rows = 0, cols = 0;
  std::vector<double> value;
  std::vector<double> magnitude;
};
ReferenceLogits reference_logits(const LogitsInputs& in, std::int64_t max_context_len);

// ---- Prefill logits (mqa_logits) -----------------------------------------

// Everything the prefill formula reads, as contiguous host arrays.
struct MqaInputs {
  std::int64_t rows = 0, num_keys = 0;  // S, S_kv
  int heads = 64, head_dim = 128;
  const std::uint8_t* q_fp8 = nullptr;    // [S, H, D]
  const std::uint8_t* keys = nullptr;     // [S_kv, D]
  const float* key_scales = nullptr;      // [S_kv]
  const float* weights = nullptr;         // [S, H]
  const std::int32_t* ks = nullptr;       // [S]
  const std::int32_t* ke = nullptr;       // [S]
};

// In float64, indexed by key: value[i * S_kv + j] for ks[i] <= j < ke[i]
// (NaN elsewhere), magnitude as for reference_logits.
ReferenceLogits reference_mqa_logits(const MqaInputs& in);

// ---- Top-k ----------------------------------------------------------------

// The documented total order: NaN counts as -inf, -0.0 equals +0.0, and of
// equal values the smaller position ranks first. True when (a, pa) ranks
// strictly before (b, pb).
bool ranks_before(float a, std::int64_t pa, float b, std::int64_t pb);

// The k selected positions of one row (values[0 .. length)) followed by -1
// padding: positions 0 .. length-1 when length <= k, else the k best under
// ranks_before, ordered best first.
std::vector<std::int32_t> reference_topk(const float* values, std::int64_t length, int k);

// ---- Schedule -------------------------------------------------------------

// Checks a schedule (int32 [num_workers + 1, 2], contiguous) against the
// documented plan for these lengths ([batch * next_n], row-major) and path:
// the trailer, monotone in-range starts, every worker starting at the item
// that weight position floor(w * total / num_workers) names (however the start
// is encoded; a unit weighs its items, + 2 where it has at most two rows, see
// dsa/schedule.hpp), and,
// by walking the ranges, that every work item is covered exactly once. Returns an empty string when all holds, else
// a description of the first violation.
std::string check_schedule(const std::int32_t* schedule, int num_workers,
                           const std::vector<std::int32_t>& context_lens, std::int64_t batch,
                           int next_n, bool per_token);

// What one worker walks: its items, and their weight in the split (the
// items plus the entry weight of each unit it scores items of).
struct WorkerShare {
  std::int64_t items = 0;
  std::int64_t weight = 0;
};

// Each worker's share when the schedule is walked against these lengths
// (the coverage the scoring operations rely on).
std::vector<WorkerShare> worker_shares(const std::int32_t* schedule, int num_workers,
                                       const std::vector<std::int32_t>& context_lens, std::int64_t batch,
                                       int next_n, bool per_token);

// The split's total weight for these lengths: each unit's items, plus the
// entry weight (2 for units of at most two rows, else 0) of each unit with items.
std::int64_t split_weight(const std::vector<std::int32_t>& context_lens, std::int64_t batch, int next_n,
                          bool per_token);

}  // namespace dsa_test
