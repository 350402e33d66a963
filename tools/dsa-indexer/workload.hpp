// DeepSeek-V3.2-shaped synthetic workloads: lengths, paged block tables,
// bf16 keys / queries / head gates, and the byte and FLOP counts of a call.
#pragma once

#include <cstdint>
#include <vector>

#include "dsa/cache.hpp"

namespace dsa_cli {

inline constexpr int kHeadDim = 128;

struct WorkloadShape {
  std::int64_t batch = 4;
  int next_n = 2;
  int heads = 64;
  int head_dim = kHeadDim;
  std::int64_t avg_context = 4096;  // average context length (tokens)
  double spread = 0.3;              // lengths uniform in +-spread around the average
  std::uint64_t seed = 1;
  int page_tokens = dsa::kDefaultPageTokens;  // tokens per cache page P: 32 or 64
  // fp8_e4m3, or fp4_e2m1 for fp4 keys and fp4 queries.
  dsa::KeyFormat key_format = dsa::KeyFormat::fp8_e4m3;

  std::int64_t rows() const { return batch * next_n; }
  dsa::KeyFormat query_format = dsa::KeyFormat::fp8_e4m3;  // fp8 or fp4 queries

  bool fp4_queries() const { return query_format == dsa::KeyFormat::fp4_e2m1; }
  // The byte layout of the shape's cache pages.
  dsa::KeyCacheLayout cache_layout() const { return {head_dim, page_tokens, key_format}; }
};

// The formats of the scoring operands: fp8 codes (keys with float32 scales),
// or fp4 packed e2m1 codes with ue8m0 scale words, for keys and queries apart.
struct OperandFormats {
  dsa::KeyFormat key_format = dsa::KeyFormat::fp8_e4m3;
  dsa::KeyFormat query_format = dsa::KeyFormat::fp8_e4m3;

  bool fp4_keys() const { return key_format == dsa::KeyFormat::fp4_e2m1; }
  bool fp4_queries() const { return query_format == dsa::KeyFormat::fp4_e2m1; }
  // Bytes of one key, of one query head: D (fp8) or D / 2 (fp4).
  std::int64_t key_bytes() const { return fp4_keys() ? kHeadDim / 2 : kHeadDim; }
  std::int64_t query_bytes() const { return fp4_queries() ? kHeadDim / 2 : kHeadDim; }
  dsa::DType key_dtype() const { return fp4_keys() ? dsa::DType::uint8 : dsa::DType::float8_e4m3; }
  dsa::DType query_dtype() const { return fp4_queries() ? dsa::DType::uint8 : dsa::DType::float8_e4m3; }
  dsa::DType key_scale_dtype() const { return fp4_keys() ? dsa::DType::int32 : dsa::DType::float32; }
};

// Lengths and the paged layout, shared by every input set of a workload.
struct WorkloadLayout {
  std::vector<std::int32_t> prefix_lens;   // [B] committed lengths
  std::vector<std::int32_t> context_lens;  // [B, next_n] causal: prefix + j + 1
  std::int64_t max_context_len = 0;
  std::int64_t max_blocks = 0;             // block-table columns
  std::int64_t num_pages = 0;
  int page_tokens = dsa::kDefaultPageTokens;  // P, the shape's
  std::vector<std::int32_t> block_table;   // [B, max_blocks]; -1 past a request's pages
  // Every cached token, request by request and position by position: its slot
  // block_table[b, p / P] * P + p % P.
  std::vector<std::int32_t> slot_mapping;

  std::int64_t num_tokens() const { return static_cast<std::int64_t>(slot_mapping.size()); }
  std::int64_t cache_bytes(const WorkloadShape& shape) const;  // num_pages * P * W
};

// `count` lengths drawn uniformly from [average * (1 - spread), average *
// (1 + spread)] (at least 1), from the seed's stream of lengths.
std::vector<std::int32_t> varied_lengths(std::int64_t count, std::int64_t average, double spread,
                                         std::uint64_t seed);

// `count` row counts drawn uniformly from [1, max_rows] (requests of uneven
// row counts), from the seed's stream of row counts.
std::vector<std::int32_t> varied_row_counts(std::int64_t count, int max_rows, std::uint64_t seed);

// Most cache slots make_layout can use for `shape`: every request's longest row
// (at most the longest drawn length plus next_n) in whole pages.
std::int64_t max_cache_slots(const WorkloadShape& shape);

// Lengths uniform in [avg * (1 - spread), avg * (1 + spread)] (at least 0)
// for the prefix, causal rows on top, pages of every request drawn from one
// random permutation of [0, num_pages).
WorkloadLayout make_layout(const WorkloadShape& shape);
// The same layout for given prefix lengths (one request each): next_n causal
// rows on each prefix, pages of P = page_tokens tokens from the seed's
// random permutation.
WorkloadLayout layout_for_prefixes(const std::vector<std::int32_t>& prefix_lens, int next_n, int page_tokens,
                                   std::uint64_t seed);

// Cache bytes on the host, pages of layout.min_page_bytes() bytes. Token t's
// codes (layout.code_bytes() bytes at codes + t * code_bytes) and its 4-byte
// scale (fp32, or fp4's scale word, at scales + 4 t) go to slot
// slot_mapping[t].
void write_cache_tokens(const dsa::KeyCacheLayout& layout, const std::vector<std::int32_t>& slot_mapping,
                        const std::uint8_t* codes, const void* scales, std::uint8_t* cache);
// The inverse for one request: positions [0, tokens) read through its
// block-table row into contiguous codes and scales, as an engine gathers a
// request's keys for mqa_logits.
void gather_request_keys(const dsa::KeyCacheLayout& layout, const std::int32_t* table_row, std::int64_t tokens,
                         const std::uint8_t* cache, std::uint8_t* codes, void* scales);

// bf16 values (as raw 16-bit patterns) of one input set.
struct HostInputs {
  std::vector<std::uint16_t> keys;       // [num_tokens, D], row i stored at slot_mapping[i]
  std::vector<std::uint16_t> queries;    // [B, next_n, H, D]
  std::vector<std::uint16_t> head_gate;  // [B * next_n, H]
};

// Roughly normal values; every key token also gets its own gain in
// [0.25, 4] so that quantization scales differ between tokens.
HostInputs make_host_inputs(const WorkloadShape& shape, const WorkloadLayout& layout);
// Only the queries and head gate (the keys are produced elsewhere).
HostInputs make_host_queries(const WorkloadShape& shape);

// Round-to-nearest-even float -> bfloat16 bit pattern (NaN stays NaN).
std::uint16_t float_to_bf16(float value);

// Bytes and FLOPs of one paged_mqa_logits call (see DESIGN.md, "Measuring
// performance"): keys (W = D + 4 bytes a token, D / 2 + 4 for fp4) read once per request on the
// native path and once per row on the per-token path, 4 bytes of logits
// written per row and valid position, 2 * H * D FLOPs per row and position.
struct Traffic {
  double sum_lengths = 0;        // sum of L[b, j]
  double native_bytes = 0;       // sum_b (D + 4) * max_j L[b, j] + 4 * sum L
  double per_token_bytes = 0;    // sum_{b,j} (D + 4) * L[b, j] + 4 * sum L
  double flops = 0;              // 2 * H * D * sum L
  double logits_bytes = 0;       // 4 * sum L: one read (top-k) or write (logits)
};
Traffic traffic_of(const WorkloadShape& shape, const WorkloadLayout& layout);
// The same counts for rows grouped by request_offsets (int32 [B + 1]): request
// b owns rows [offsets[b], offsets[b + 1]) of `context_lens` and its keys are
// read once (shape's batch and next_n take no part).
Traffic traffic_of_rows(const WorkloadShape& shape, const std::vector<std::int32_t>& context_lens,
                        const std::vector<std::int32_t>& request_offsets);

}  // namespace dsa_cli
