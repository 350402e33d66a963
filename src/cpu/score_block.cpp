#include "cpu/score_block.hpp"

#include <cstring>

#include "cpu/simd_clones.hpp"

#if DSA_CPU_X86_VARIANTS
#include <immintrin.h>
#endif

namespace dsa::detail::cpu {
namespace {

// Eight float lanes (GCC and Clang vector extension); one key per lane.
using Lanes = float __attribute__((vector_size(32)));
using Words = std::uint32_t __attribute__((vector_size(32)));
constexpr int kLanes = 8;
// score_key_block_fma takes a block in halves of two vectors: 4 heads x 2
// vectors of accumulators, plus the key vectors and a broadcast query value,
// fill the 16 vector registers of AVX2.
constexpr int kVectors = 2;
constexpr int kHalfKeys = kVectors * kLanes;
constexpr int kFmaGroupHeads = 4;

// Through a reference: a vector passed by value would change the calling
// convention between the clones.
template <typename Vector, typename Element>
[[gnu::always_inline]] inline void load(const Element* from, Vector& vector) {
  std::memcpy(&vector, from, sizeof(vector));
}

// Adds heads [0, kHeads) of in.query, from head `first`, to `logit`, in
// ascending head order.
template <int kHeads>
[[gnu::always_inline]] inline void fma_heads(const BlockInputs& in, int half, int first, const Lanes* scale,
                                             Lanes* logit) {
  const float* query = in.query + first * in.head_dim;
  Lanes dot[kHeads][kVectors] = {};
  for (int w = 0; w < in.head_dim / 2; ++w) {
    for (int v = 0; v < kVectors; ++v) {
      Words pairs;
      load(in.key_pairs + w * kBlockKeys + half * kHalfKeys + v * kLanes, pairs);
      const Lanes even = reinterpret_cast<Lanes>(pairs << 16);
      const Lanes odd = reinterpret_cast<Lanes>(pairs & 0xFFFF0000u);
      for (int h = 0; h < kHeads; ++h) {
        dot[h][v] = query[h * in.head_dim + 2 * w] * even + dot[h][v];
        dot[h][v] = query[h * in.head_dim + 2 * w + 1] * odd + dot[h][v];
      }
    }
  }
  const Lanes zero = {};
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) {
      const Lanes scaled = scale[v] * dot[h][v];
      // Selected as the reference's relu is: NaN gives 0.
      const Lanes relu = scaled > zero ? scaled : zero;
      logit[v] = in.weights[first + h] * relu + logit[v];
    }
  }
}

#if DSA_CPU_X86_VARIANTS
#define DSA_BF16_DOT_TARGET __attribute__((target("avx512f,avx512bf16")))

// score_key_block_bf16_dot advances 8 heads x 2 vectors of 16 keys
// together: 16 accumulators cover the instruction's latency, and each
// broadcast query pair serves two instructions.
constexpr int kBf16Lanes = 16;
constexpr int kBf16Vectors = kBlockKeys / kBf16Lanes;
constexpr int kBf16GroupHeads = 8;

template <int kHeads>
DSA_BF16_DOT_TARGET [[gnu::always_inline]] inline void bf16_dot_heads(const BlockInputs& in, int first,
                                                                      const __m512* scale, __m512* logit) {
  const int words = in.head_dim / 2;
  const std::uint32_t* query = in.query_pairs + first * words;
  __m512 dot[kHeads][kBf16Vectors];
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kBf16Vectors; ++v) dot[h][v] = _mm512_setzero_ps();
  }
  for (int w = 0; w < words; ++w) {
    __m512bh keys[kBf16Vectors];
    for (int v = 0; v < kBf16Vectors; ++v) {
      keys[v] = reinterpret_cast<__m512bh>(_mm512_loadu_si512(in.key_pairs + w * kBlockKeys + v * kBf16Lanes));
    }
    for (int h = 0; h < kHeads; ++h) {
      const __m512bh q = reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(query[h * words + w])));
      for (int v = 0; v < kBf16Vectors; ++v) dot[h][v] = _mm512_dpbf16_ps(dot[h][v], keys[v], q);
    }
  }
  for (int h = 0; h < kHeads; ++h) {
    const __m512 weight = _mm512_set1_ps(in.weights[first + h]);
    for (int v = 0; v < kBf16Vectors; ++v) {
      // Kept where above 0 (an ordered compare: NaN gives 0, as the reference's relu does).
      const __m512 scaled = _mm512_mul_ps(scale[v], dot[h][v]);
      const __m512 relu = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(scaled, _mm512_setzero_ps(), _CMP_GT_OQ), scaled);
      logit[v] = _mm512_fmadd_ps(weight, relu, logit[v]);
    }
  }
}
#endif

}  // namespace

DSA_CPU_CLONES void score_key_block_fma(const BlockInputs& in, float* out) {
  for (int half = 0; half < kBlockKeys / kHalfKeys; ++half) {
    Lanes scale[kVectors];
    Lanes logit[kVectors] = {};
    for (int v = 0; v < kVectors; ++v) load(in.scales + half * kHalfKeys + v * kLanes, scale[v]);
    int h = 0;
    for (; h + kFmaGroupHeads <= in.heads; h += kFmaGroupHeads) fma_heads<kFmaGroupHeads>(in, half, h, scale, logit);
    for (; h < in.heads; ++h) fma_heads<1>(in, half, h, scale, logit);
    std::memcpy(out + half * kHalfKeys, logit, sizeof(logit));
  }
}

#if DSA_CPU_X86_VARIANTS
bool bf16_dot_available() { return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"); }

DSA_BF16_DOT_TARGET void score_key_block_bf16_dot(const BlockInputs& in, float* out) {
  __m512 scale[kBf16Vectors], logit[kBf16Vectors];
  for (int v = 0; v < kBf16Vectors; ++v) {
    scale[v] = _mm512_loadu_ps(in.scales + v * kBf16Lanes);
    logit[v] = _mm512_setzero_ps();
  }
  int h = 0;
  for (; h + kBf16GroupHeads <= in.heads; h += kBf16GroupHeads) bf16_dot_heads<kBf16GroupHeads>(in, h, scale, logit);
  for (; h < in.heads; ++h) bf16_dot_heads<1>(in, h, scale, logit);
  for (int v = 0; v < kBf16Vectors; ++v) _mm512_storeu_ps(out + v * kBf16Lanes, logit[v]);
}
#else
bool bf16_dot_available() { return false; }

void score_key_block_bf16_dot(const BlockInputs& in, float* out) { score_key_block_fma(in, out); }
#endif

void score_key_block(const BlockInputs& in, float* out) {
  if (bf16_dot_available()) {
    score_key_block_bf16_dot(in, out);
  } else {
    score_key_block_fma(in, out);
  }
}

}  // namespace dsa::detail::cpu
