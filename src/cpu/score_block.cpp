#include "cpu/score_block.hpp"

#include <cstring>

#include "cpu/simd_clones.hpp"

namespace dsa::detail::cpu {
namespace {

// Eight float lanes (GCC and Clang vector extension); one key per lane.
using Lanes = float __attribute__((vector_size(32)));
constexpr int kLanes = 8;
constexpr int kVectors = kBlockKeys / kLanes;
// Heads whose dot products advance together: 4 heads x 2 vectors of
// accumulators, plus the key vectors and a broadcast query value, fill the
// 16 vector registers of AVX2.
constexpr int kGroupHeads = 4;

// Through a reference: a vector passed by value would change the calling
// convention between the clones.
[[gnu::always_inline]] inline void load(const float* from, Lanes& lanes) { std::memcpy(&lanes, from, sizeof(lanes)); }

// Adds heads [0, kHeads) of `query` (rows head_dim apart) to `logit`, in
// ascending head order.
template <int kHeads>
[[gnu::always_inline]] inline void score_heads(int head_dim, const float* query, const float* weights,
                                               const float* keys, const Lanes* scale, Lanes* logit) {
  Lanes dot[kHeads][kVectors] = {};
  for (int d = 0; d < head_dim; ++d) {
    for (int v = 0; v < kVectors; ++v) {
      Lanes key;
      load(keys + d * kBlockKeys + v * kLanes, key);
      for (int h = 0; h < kHeads; ++h) dot[h][v] = query[h * head_dim + d] * key + dot[h][v];
    }
  }
  const Lanes zero = {};
  for (int h = 0; h < kHeads; ++h) {
    for (int v = 0; v < kVectors; ++v) {
      const Lanes scaled = scale[v] * dot[h][v];
      // Selected as the reference's relu is: NaN gives 0.
      const Lanes relu = scaled > zero ? scaled : zero;
      logit[v] = weights[h] * relu + logit[v];
    }
  }
}

}  // namespace

DSA_CPU_CLONES void score_key_block(int heads, int head_dim, const float* query, const float* weights, const float* keys,
                     const float* scales, float* out) {
  Lanes scale[kVectors];
  Lanes logit[kVectors] = {};
  for (int v = 0; v < kVectors; ++v) load(scales + v * kLanes, scale[v]);
  int h = 0;
  for (; h + kGroupHeads <= heads; h += kGroupHeads) {
    score_heads<kGroupHeads>(head_dim, query + h * head_dim, weights + h, keys, scale, logit);
  }
  for (; h < heads; ++h) score_heads<1>(head_dim, query + h * head_dim, weights + h, keys, scale, logit);
  std::memcpy(out, logit, sizeof(logit));
}

}  // namespace dsa::detail::cpu
