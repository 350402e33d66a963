// An independent model of the fp4 index-key format (e2m1 codes, two a byte,
// one ue8m0 scale per 32 elements packed four to a 32-bit word): a
// table-driven quantizer in float64, the page layout, and float64 logits
// over fp4 caches with fp8 or fp4 queries, for the CPU and GPU suites.
#pragma once

#include <cstdint>
#include <vector>

#include "common/random_inputs.hpp"
#include "common/reference.hpp"

namespace dsa_test {

// The value of an e2m1 code (bit 3 the sign).
double e2m1_value(std::uint8_t code);
// The code of the e2m1 value nearest x (saturating at +-6): a tie takes the
// smaller magnitude, and a value nearest zero takes code 0 whatever its sign.
std::uint8_t e2m1_nearest(double x);
// The ue8m0 byte of a block with largest magnitude amax: the smallest e with
// 6 * 2^(e - 127) >= max(amax, 1e-4f).
int ue8m0_for_amax(double amax);
// Quantizes `count` values (a multiple of 32): codes[count / 2] packed low
// nibble first, the block scales as the returned word (block b in byte b).
std::uint32_t fp4_quantize(const float* x, int count, std::uint8_t* codes);
// Element d of a packed fp4 vector.
double fp4_value(const std::uint8_t* codes, std::uint32_t scale_word, int d);

// Pages of P tokens: P x 64 code bytes, then P scale words (head dim 128).
struct Fp4CacheGeometry {
  std::int64_t num_pages = 0;
  std::int64_t page_stride = 0;  // bytes, >= P * 68
  int page_tokens = 64;
  std::int64_t code_byte(std::int64_t slot) const {
    return slot / page_tokens * page_stride + slot % page_tokens * 64;
  }
  std::int64_t word_byte(std::int64_t slot) const {
    return slot / page_tokens * page_stride + std::int64_t{page_tokens} * 64 + slot % page_tokens * 4;
  }
};

// An fp4 cache holding, slot for slot, the fp4 quantization of the keys a
// workload's fp8 cache dequantizes to (so its lengths, block table, queries
// and weights serve unchanged).
struct Fp4Cache {
  Fp4CacheGeometry geometry;
  std::vector<std::uint8_t> bytes;
  double value(std::int64_t slot, int d) const;
  dsa::TensorView view_2d();
  dsa::TensorView view_4d();
};
Fp4Cache fp4_cache_of(const Workload& w, std::int64_t page_padding_bytes = 0);

// A workload's raw queries quantized to fp4: codes [B, next_n, H, 64],
// scale words [B, next_n, H], weights = head_gate * weight_scale.
struct Fp4Queries {
  std::vector<std::uint8_t> codes;
  std::vector<std::int32_t> scales;
  std::vector<float> weights;
  dsa::TensorView codes_view(const Workload& w);
  dsa::TensorView scales_view(const Workload& w);
  dsa::TensorView weights_view(const Workload& w);
};
Fp4Queries fp4_queries_of(const Workload& w);

// Logits in float64 over an fp4 cache: queries the workload's fp8 ones
// (with its weights), or `fp4_q` (with its weights) when given.
ReferenceLogits fp4_reference_logits(const Workload& w, const Fp4Cache& cache, const Fp4Queries* fp4_q);
// The same for requests of uneven row counts: row r reads block-table row
// v.row_request[r] of v.table (cache and queries built from v.rows).
ReferenceLogits fp4_reference_logits(const VarlenWorkload& v, const Fp4Cache& cache, const Fp4Queries* fp4_q);

}  // namespace dsa_test
