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

// Dequantizes the fp8 queries and paged keys of one scoring problem and
// evaluates logit = sum_h w[h] * max(0, scale * sum_d q[h, d] * key[d]).
class Scorer {
 public:
  explicit Scorer(const LogitsProblem& problem);

  const LogitsProblem& problem() const { return p_; }
  std::int64_t query_floats() const { return p_.heads * p_.head_dim; }
  // Writes the H * D dequantized fp8 values of row (b, j) to `out`.
  void decode_query(std::int64_t b, std::int64_t j, float* out) const;
  // Writes the D fp8 values of request b's key at `position` to `out`; returns its scale.
  float decode_key(std::int64_t b, std::int64_t position, float* out) const;
  const float* weights_row(std::int64_t row) const { return p_.weights + row * p_.weights_stride_row; }

  // Accumulates in Acc (float, or double for the float64 reference), in a
  // fixed order: d ascending inside a head, heads ascending.
  template <typename Acc>
  Acc score(const float* query, const float* weights, const float* key, float scale) const {
    Acc logit = 0;
    for (std::int64_t h = 0; h < p_.heads; ++h) {
      const float* q = query + h * p_.head_dim;
      Acc dot = 0;
      for (int d = 0; d < p_.head_dim; ++d) dot += static_cast<Acc>(q[d]) * static_cast<Acc>(key[d]);
      logit += static_cast<Acc>(weights[h]) * relu(static_cast<Acc>(scale) * dot);
    }
    return logit;
  }

  // Decodes positions [first, first + count) of request b, count <= kBlockKeys,
  // into `block` for score_block; the lanes past count get zero keys and scales.
  void decode_key_block(std::int64_t b, std::int64_t first, int count, KeyBlock* block) const;

  // One row's logits for the block's kBlockKeys positions (query as written by
  // decode_query, and as bf16 pairs): score_key_block's arithmetic.
  void score_block(const float* query, const std::uint32_t* query_pairs, const float* weights,
                   const KeyBlock& block, float* out) const {
    score_key_block(BlockInputs{static_cast<int>(p_.heads), p_.head_dim, query, query_pairs, weights,
                                block.pairs.data(), block.scales.data()},
                    out);
  }

 private:
  // The fp8 bytes of request b's key at `position`; its scale into *scale.
  const std::uint8_t* key_bytes(std::int64_t b, std::int64_t position, float* scale) const;

  template <typename T>
  static T relu(T x) {
    return x > 0 ? x : T{0};
  }

  const LogitsProblem& p_;
  std::array<float, 256> e4m3_values_{};
  std::array<std::uint16_t, 256> e4m3_bf16_{};  // the same values' bf16 bits
};

// Consecutive rows of one request scored together by the threaded path
// (a unit's rows, or a single row), so that each block of keys is decoded
// once for all of them.
struct RowGroup {
  std::int64_t b = -1;  // none loaded yet
  std::int64_t first_j = 0;
  std::vector<std::int64_t> lengths;  // positions [0, lengths[i]) of row first_j + i are scored
  std::vector<float> queries;               // the rows' queries, [H][D] each
  std::vector<std::uint32_t> query_pairs;  // the same as bf16 pairs, [H][D / 2] each
  KeyBlock block;

  std::int64_t rows() const { return static_cast<std::int64_t>(lengths.size()); }
  // Sets the group to `rows` rows of request b from row first_j, decoding
  // their queries unless the group holds those rows already (a thread's
  // successive items are mostly chunks of one unit).
  void load(const Scorer& scorer, std::int64_t request, std::int64_t first_row, std::int64_t rows);
};

// Scores positions [begin, end) of the group's rows, in blocks of kBlockKeys
// (begin a multiple of it), with score_block. For each block a row needs,
// calls emit(i, first, values, count): row first_j + i, positions
// [first, first + count).
template <typename Emit>
void score_group(const Scorer& scorer, std::int64_t begin, std::int64_t end, RowGroup* group, Emit&& emit) {
  const LogitsProblem& p = scorer.problem();
  const std::int64_t query_floats = scorer.query_floats();
  float values[kBlockKeys];
  for (std::int64_t first = begin; first < end; first += kBlockKeys) {
    scorer.decode_key_block(group->b, first, static_cast<int>(std::min<std::int64_t>(kBlockKeys, end - first)),
                            &group->block);
    for (std::int64_t i = 0; i < group->rows(); ++i) {
      const std::int64_t length = group->lengths[static_cast<std::size_t>(i)];
      if (first >= length) continue;
      const std::int64_t row = group->b * p.next_n + group->first_j + i;
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

// Scores positions [0, length) of row (b, j) into out[0, length), one key at a time.
void score_row(const Scorer& scorer, std::int64_t b, std::int64_t j, std::int64_t length,
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
