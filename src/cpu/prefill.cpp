// mqa_logits on the CPU: the reference loops and the threaded path, which
// scores tiles of rows against blocks of keys with score_block (the paged
// scoring's arithmetic).
#include <algorithm>
#include <array>
#include <vector>

#include "backend.hpp"
#include "common/logit_rules.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

// Rows the threaded path scores together against each decoded key block.
constexpr std::int64_t kTileRows = 8;
// Keys of one work item: whole key blocks.
constexpr std::int64_t kItemKeys = 8 * kBlockKeys;

// The queries and keys of one problem, dequantized: fp8, or fp4 with the
// block scales folded into the values, as the paged Scorer does (fp4 keys
// then have scale 1).
class MqaScorer {
 public:
  explicit MqaScorer(const MqaLogitsProblem& problem) : p_(problem) {}

  const MqaLogitsProblem& problem() const { return p_; }
  std::int64_t query_floats() const { return p_.heads * p_.head_dim; }
  void decode_query(std::int64_t row, float* out) const {
    const std::uint8_t* q = p_.q + row * p_.q_stride_row;
    if (p_.fp4_queries()) {
      decode_fp4_heads(q, p_.q_stride_h, p_.q_scales + row * p_.q_scales_stride_row, p_.q_scales_stride_h,
                       p_.heads, p_.head_dim, out);
    } else {
      decode_fp8_heads(tables_, q, p_.q_stride_h, p_.heads, p_.head_dim, out);
    }
  }
  const float* weights_row(std::int64_t row) const { return p_.weights + row * p_.weights_stride_row; }
  float scale(std::int64_t key) const { return p_.fp4_keys() ? 1.0f : p_.key_scales[key * p_.key_scales_stride]; }
  void decode_key(std::int64_t key, float* out) const {
    const std::uint8_t* codes = p_.keys + key * p_.keys_stride;
    if (p_.fp4_keys()) {
      decode_fp4_heads(codes, 0, scale_word(key), 0, 1, p_.head_dim, out);
    } else {
      decode_fp8_heads(tables_, codes, 0, 1, p_.head_dim, out);
    }
  }
  // Keys [first, first + count), count <= kBlockKeys, into `block`; lanes
  // past count are zero keys of scale 0.
  void decode_key_block(std::int64_t first, int count, KeyBlock* block) const {
    std::array<const std::uint8_t*, kBlockKeys> keys{};
    std::array<std::uint32_t, kBlockKeys> scale_words{};
    for (int i = 0; i < kBlockKeys; ++i) {
      const auto lane = static_cast<std::size_t>(i);
      keys[lane] = i < count ? p_.keys + (first + i) * p_.keys_stride : nullptr;
      block->scales[lane] = i < count ? scale(first + i) : 0.0f;
      if (i < count && p_.fp4_keys()) scale_words[lane] = *scale_word(first + i);
    }
    if (p_.fp4_keys()) {
      pack_fp4_key_block(p_.head_dim, keys.data(), scale_words.data(), block);
    } else {
      pack_key_block(tables_, p_.head_dim, keys.data(), block);
    }
  }

 private:
  const std::uint32_t* scale_word(std::int64_t key) const { return p_.key_scale_words + key * p_.key_scales_stride; }

  const MqaLogitsProblem& p_;
  E4m3Tables tables_;
};

// Sets the columns [0, width) of a row that its range does not score to -inf.
void clean_row(const MqaLogitsProblem& p, std::int64_t row) {
  const KeyRange scored = mqa_scored_columns(p, mqa_key_range(p, row));
  for (std::int64_t c = 0; c < p.width(); ++c) {
    if (c < scored.start || c >= scored.end) store_mqa_logit(p, row, c, masked_logit());
  }
}

void reference_mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx) {
  const MqaScorer scorer(p);
  std::vector<float> query(static_cast<std::size_t>(scorer.query_floats()));
  std::vector<float> key(static_cast<std::size_t>(p.head_dim));
  for (std::int64_t row = 0; row < p.rows; ++row) {
    scorer.decode_query(row, query.data());
    const float* weights = scorer.weights_row(row);
    const KeyRange range = mqa_key_range(p, row);
    const KeyRange scored = mqa_scored_columns(p, range);
    for (std::int64_t c = scored.start; c < scored.end; ++c) {
      const std::int64_t j = mqa_column_key(p, range, c);
      scorer.decode_key(j, key.data());
      const float value =
          ctx.reference_float64
              ? static_cast<float>(score_key<double>(p.heads, p.head_dim, query.data(), weights, key.data(), scorer.scale(j)))
              : score_key<float>(p.heads, p.head_dim, query.data(), weights, key.data(), scorer.scale(j));
      store_mqa_logit(p, row, c, value);
    }
    if (p.clean_logits) clean_row(p, row);
  }
}

// A tile of rows [first, first + count) and the keys [begin, end) its
// ranges reach (empty ranges reach none).
struct RowTile {
  std::int64_t first = 0, count = 0;
  std::int64_t begin = 0, end = 0;
};

struct MqaItem {
  std::int64_t tile = 0;
  std::int64_t first_key = 0;  // kItemKeys keys from here, within the tile's [begin, end)
};

// A thread's decoded queries of its current tile, and its key block.
struct TileScratch {
  std::int64_t tile = -1;
  std::vector<float> queries;
  std::vector<std::uint32_t> query_pairs;
  KeyBlock block;
};

std::vector<RowTile> row_tiles(const MqaLogitsProblem& p) {
  std::vector<RowTile> tiles;
  for (std::int64_t first = 0; first < p.rows; first += kTileRows) {
    RowTile t{first, std::min(kTileRows, p.rows - first), 0, 0};
    bool any = false;
    for (std::int64_t row = first; row < first + t.count; ++row) {
      const KeyRange r = mqa_key_range(p, row);
      if (r.start == r.end) continue;
      t.begin = any ? std::min(t.begin, r.start) : r.start;
      t.end = any ? std::max(t.end, r.end) : r.end;
      any = true;
    }
    tiles.push_back(t);
  }
  return tiles;
}

void score_mqa_item(const MqaScorer& scorer, const RowTile& tile, std::int64_t tile_index, std::int64_t first_key,
                    TileScratch* s) {
  const MqaLogitsProblem& p = scorer.problem();
  const std::int64_t floats = scorer.query_floats();
  if (s->tile != tile_index) {
    s->tile = tile_index;
    s->queries.resize(static_cast<std::size_t>(tile.count * floats));
    for (std::int64_t i = 0; i < tile.count; ++i) scorer.decode_query(tile.first + i, s->queries.data() + i * floats);
    to_bf16_pairs(s->queries, &s->query_pairs);
  }
  float values[kBlockKeys];
  const std::int64_t last = std::min(first_key + kItemKeys, tile.end);
  for (std::int64_t first = first_key; first < last; first += kBlockKeys) {
    const std::int64_t count = std::min<std::int64_t>(kBlockKeys, last - first);
    scorer.decode_key_block(first, static_cast<int>(count), &s->block);
    for (std::int64_t i = 0; i < tile.count; ++i) {
      const std::int64_t row = tile.first + i;
      const KeyRange range = mqa_key_range(p, row);
      const std::int64_t from = std::max(first, range.start);
      const std::int64_t to = std::min(first + count, range.end);
      if (from >= to) continue;
      score_block(p.heads, p.head_dim, s->queries.data() + i * floats, s->query_pairs.data() + i * floats / 2,
                  scorer.weights_row(row), s->block, values);
      const std::int64_t offset = mqa_column_key(p, range, 0);  // column c holds key offset + c
      for (std::int64_t j = from; j < to; ++j) store_mqa_logit(p, row, j - offset, values[j - first]);
    }
  }
}

void parallel_mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx) {
  const MqaScorer scorer(p);
  const std::vector<RowTile> tiles = row_tiles(p);
  std::vector<MqaItem> items;
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    for (std::int64_t first = tiles[t].begin; first < tiles[t].end; first += kItemKeys) {
      items.push_back(MqaItem{static_cast<std::int64_t>(t), first});
    }
  }
  std::vector<TileScratch> scratch(static_cast<std::size_t>(thread_count(ctx)));
  parallel_for_items(static_cast<std::int64_t>(items.size()), ctx, [&](std::int64_t i, int thread) {
    const MqaItem& item = items[static_cast<std::size_t>(i)];
    score_mqa_item(scorer, tiles[static_cast<std::size_t>(item.tile)], item.tile, item.first_key,
                   &scratch[static_cast<std::size_t>(thread)]);
  });
  if (p.clean_logits) parallel_for_items(p.rows, ctx, [&](std::int64_t row, int) { clean_row(p, row); });
}

}  // namespace

Status plan_mqa_logits_chunks(const MqaLogitsProblem& p, bool compressed, std::size_t budget_bytes,
                              std::vector<MqaLogitsChunk>* chunks) {
  const std::size_t element_bytes = p.logits_dtype == DType::bfloat16 ? 2 : 4;
  // A row of W columns; a compressed row is at least one column wide, so a
  // chunk of empty ranges still has a logits row to point at.
  const auto row_bytes = [&](std::int64_t width) {
    return static_cast<std::size_t>(std::max<std::int64_t>(width, 1)) * element_bytes;
  };
  chunks->clear();
  MqaLogitsChunk chunk;
  for (std::int64_t row = 0; row < p.rows; ++row) {
    const KeyRange r = mqa_key_range(p, row);
    const std::int64_t own_width = compressed ? r.end - r.start : p.num_keys;
    if (row_bytes(own_width) > budget_bytes) {
      return {ErrorCode::invalid_argument,
              "plan_mqa_logits_chunks: budget_bytes: " + std::to_string(budget_bytes) + " bytes cannot hold row " +
                  std::to_string(row) + "'s logits (" + std::to_string(row_bytes(own_width)) + " bytes)"};
    }
    const std::int64_t width = std::max(compressed ? chunk.max_seqlen_k : 0, own_width);
    // rows * row_bytes <= budget, without the product's overflow.
    if (row > chunk.begin &&
        row_bytes(width) > budget_bytes / static_cast<std::size_t>(row - chunk.begin + 1)) {
      chunk.end = row;
      chunks->push_back(chunk);
      chunk = MqaLogitsChunk{row, row, 0};
    }
    if (compressed) chunk.max_seqlen_k = std::max(chunk.max_seqlen_k, own_width);
  }
  if (p.rows > 0) {
    chunk.end = p.rows;
    chunks->push_back(chunk);
  }
  return Status::success();
}

Status mqa_logits(const MqaLogitsProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_mqa_logits_data(p));
  if (parallel) {
    parallel_mqa_logits(p, ctx);
  } else {
    reference_mqa_logits(p, ctx);
  }
  return Status::success();
}

}  // namespace dsa::detail::cpu
