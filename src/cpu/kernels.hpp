// Building blocks the CPU operations share: decoding and scoring keys
// (paged_mqa_logits, index_topk) and selecting a row's top k (topk,
// index_topk), so that the fused and unfused paths compute identical values.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/problem.hpp"
#include "cpu/score_block.hpp"

namespace dsa::detail::cpu {

// Up to kBlockKeys consecutive keys of one request as score_key_block reads
// them: bf16 pairs, transposed [head_dim / 2][kBlockKeys], and their scales.
struct KeyBlock {
  std::vector<std::uint32_t> pairs;
  std::array<float, kBlockKeys> scales{};
};

// Every e4m3 code's value, as float32 and as bf16 bits (exact: e4m3 fits bf16).
struct E4m3Tables {
  E4m3Tables();
  std::array<float, 256> values{};
  std::array<std::uint16_t, 256> bf16{};
};

// Writes `heads` fp8 vectors of head_dim values, `stride` bytes apart from
// `fp8`, dequantized to out[heads][head_dim].
void decode_fp8_heads(const E4m3Tables& tables, const std::uint8_t* fp8, std::int64_t stride, std::int64_t heads,
                      int head_dim, float* out);

// Writes `heads` packed fp4 vectors of head_dim values (codes `stride` bytes
// apart from `codes`, scale words `scales_stride` words apart from
// `scale_words`) to out[heads][head_dim], block scales applied (exact).
void decode_fp4_heads(const std::uint8_t* codes, std::int64_t stride, const std::uint32_t* scale_words,
                      std::int64_t scales_stride, std::int64_t heads, int head_dim, float* out);

// The same values as bf16 pairs (score_block.hpp), out[i] from values[2i], values[2i + 1].
void to_bf16_pairs(const std::vector<float>& values, std::vector<std::uint32_t>* out);

// Fills block->pairs from kBlockKeys fp8 keys of head_dim bytes (nullptr: a
// padding lane, zero); the scales are the caller's.
void pack_key_block(const E4m3Tables& tables, int head_dim, const std::uint8_t* const* keys, KeyBlock* block);

// Fills block->pairs from kBlockKeys fp4 keys (packed codes and scale words;
// nullptr codes: a padding lane, zero), each element's block scale folded
// into its value (exact in bf16: an e2m1 value has two significant bits);
// the scales, 1 for every real lane, are the caller's.
void pack_fp4_key_block(int head_dim, const std::uint8_t* const* codes, const std::uint32_t* scale_words,
                        KeyBlock* block);

// logit = sum_h weights[h] * max(0, scale * sum_d query[h][d] * key[d]),
// accumulated in Acc (float, or double for the float64 reference) in a fixed
// order: d ascending inside a head, heads ascending.
template <typename Acc>
Acc score_key(std::int64_t heads, int head_dim, const float* query, const float* weights, const float* key,
              float scale) {
  Acc logit = 0;
  for (std::int64_t h = 0; h < heads; ++h) {
    const float* q = query + h * head_dim;
    Acc dot = 0;
    for (int d = 0; d < head_dim; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(key[d]);
    const Acc scaled = static_cast<Acc>(scale) * dot;
    logit += static_cast<Acc>(weights[h]) * (scaled > 0 ? scaled : Acc{0});
  }
  return logit;
}

// One row's logits for a block's kBlockKeys keys (query as decode_fp8_heads
// writes it, and as bf16 pairs): score_key_block's arithmetic.
inline void score_block(std::int64_t heads, int head_dim, const float* query, const std::uint32_t* query_pairs,
                        const float* weights, const KeyBlock& block, float* out) {
  score_key_block(BlockInputs{static_cast<int>(heads), head_dim, query, query_pairs, weights, block.pairs.data(),
                              block.scales.data()},
                  out);
}

// Dequantizes the queries and paged keys of one scoring problem and
// evaluates logit = sum_h w[h] * max(0, scale * sum_d q[h, d] * key[d]).
// fp4 values are decoded with their block scales folded in (a power of two
// times an e2m1 value, exact in float32), so fp4 keys are scored as keys of
// scale 1 and every product stays exact: the same arithmetic serves every
// combination of fp8 and fp4 queries and keys.
class Scorer {
 public:
  explicit Scorer(const LogitsProblem& problem) : p_(problem) {}

  const LogitsProblem& problem() const { return p_; }
  std::int64_t query_floats() const { return p_.heads * p_.head_dim; }
  // Writes the H * D dequantized values of flat row `row` (b * next_n + j) to `out`.
  void decode_query(std::int64_t row, float* out) const;
  // Writes the D values of the key at `position` of block-table row
  // `request` to `out` (fp8 codes, or fp4 values with their block scales);
  // returns the key's scale (fp8) or 1 (fp4).
  float decode_key(std::int64_t request, std::int64_t position, float* out) const;
  const float* weights_row(std::int64_t row) const { return p_.weights + row * p_.weights_stride_row; }

  // score_key over this problem's heads.
  template <typename Acc>
  Acc score(const float* query, const float* weights, const float* key, float scale) const {
    return score_key<Acc>(p_.heads, p_.head_dim, query, weights, key, scale);
  }

  // Decodes positions [first, first + count) of block-table row `request`,
  // count <= kBlockKeys, into `block` for score_block; the lanes past count
  // get zero keys and scales.
  void decode_key_block(std::int64_t request, std::int64_t first, int count, KeyBlock* block) const;

  // score_block over this problem's heads.
  void score_block(const float* query, const std::uint32_t* query_pairs, const float* weights,
                   const KeyBlock& block, float* out) const {
    cpu::score_block(p_.heads, p_.head_dim, query, query_pairs, weights, block, out);
  }

 private:
  // The key at `position` of block-table row `request`: its code bytes, and
  // its fp32 scale (fp8 keys) or its scale word (fp4 keys).
  struct KeyRef {
    const std::uint8_t* codes;
    float scale;
    std::uint32_t scale_word;
  };
  KeyRef key_at(std::int64_t request, std::int64_t position) const;

  const LogitsProblem& p_;
  E4m3Tables tables_;
};

// Consecutive rows of one request scored together by the threaded path
// (a unit's rows, or a single row), so that each block of keys is decoded
// once for all of them.
struct RowGroup {
  std::int64_t request = -1;  // block-table row; none loaded yet
  std::int64_t first_row = 0;  // flat (b * next_n + j)
  std::vector<std::int64_t> lengths;  // positions [0, lengths[i]) of row first_row + i are scored
  std::vector<float> queries;               // the rows' queries, [H][D] each
  std::vector<std::uint32_t> query_pairs;  // the same as bf16 pairs, [H][D / 2] each
  KeyBlock block;

  std::int64_t rows() const { return static_cast<std::int64_t>(lengths.size()); }
  // Sets the group to `rows` rows of block-table row `request` from flat row
  // first_row, decoding their queries unless the group holds those rows
  // already (a thread's successive items are mostly chunks of one unit).
  void load(const Scorer& scorer, std::int64_t request, std::int64_t first_row, std::int64_t rows);
};

// Scores positions [begin, end) of the group's rows, in blocks of kBlockKeys
// (begin a multiple of it), with score_block. For each block a row needs,
// calls emit(i, first, values, count): row first_row + i, positions
// [first, first + count).
template <typename Emit>
void score_group(const Scorer& scorer, std::int64_t begin, std::int64_t end, RowGroup* group, Emit&& emit) {
  const std::int64_t query_floats = scorer.query_floats();
  float values[kBlockKeys];
  for (std::int64_t first = begin; first < end; first += kBlockKeys) {
    scorer.decode_key_block(group->request, first, static_cast<int>(std::min<std::int64_t>(kBlockKeys, end - first)),
                            &group->block);
    for (std::int64_t i = 0; i < group->rows(); ++i) {
      const std::int64_t length = group->lengths[static_cast<std::size_t>(i)];
      if (first >= length) continue;
      const std::int64_t row = group->first_row + i;
      scorer.score_block(group->queries.data() + i * query_floats, group->query_pairs.data() + i * query_floats / 2,
                         scorer.weights_row(row), group->block, values);
      emit(i, first, values, std::min<std::int64_t>(kBlockKeys, length - first));
    }
  }
}

// How score_row accumulates: the plain loops (float or float64) of the reference.
enum class ScoreMode { plain_float, plain_float64 };

struct RowScoreScratch {
  std::vector<float> query;
  std::vector<float> key;
};

// Scores positions [0, length) of flat row `row` against block-table row
// `request` into out[0, length), one key at a time.
void score_row(const Scorer& scorer, std::int64_t row, std::int64_t request, std::int64_t length,
               ScoreMode mode, RowScoreScratch* scratch, float* out);

// The straightforward or multithreaded logits pass (validated problem, data checked).
void compute_logits(const LogitsProblem& p, bool parallel, const ExecContext& ctx);

// Buffers of select_row, kept between rows.
struct SelectScratch {
  std::vector<std::uint32_t> keys;  // the row's values as ordered keys
  std::vector<std::uint32_t> pool;  // the radix select's remaining candidates
  std::vector<std::int32_t> winners;
};

// Row selection of the top-k contract (dsa/topk.hpp): positions in `out[0, k)`.
void select_row(const float* values, std::int64_t length, int k, bool sorted, SelectScratch* scratch,
                std::int32_t* out);

// Rewrites selected positions as cache slots through one block-table row of
// pages of `page_size` tokens; -1 stays.
void positions_to_slots(const std::int32_t* table_row, int page_size, int k, std::int32_t* out);

}  // namespace dsa::detail::cpu
