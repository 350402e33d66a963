#include <algorithm>
#include <vector>

#include "backend.hpp"
#include "common/cache_format.hpp"
#include "common/logit_rules.hpp"
#include "common/number_formats.hpp"
#include "common/schedule_walk.hpp"
#include "cpu/kernels.hpp"
#include "cpu/parallel.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {

E4m3Tables::E4m3Tables() {
  for (std::size_t v = 0; v < 256; ++v) {
    values[v] = e4m3_to_float(static_cast<std::uint8_t>(v));
    bf16[v] = static_cast<std::uint16_t>(float_bits(values[v]) >> 16);  // exact: e4m3 fits bf16
  }
}

void decode_fp8_heads(const E4m3Tables& tables, const std::uint8_t* fp8, std::int64_t stride, std::int64_t heads,
                      int head_dim, float* out) {
  for (std::int64_t h = 0; h < heads; ++h) {
    for (int d = 0; d < head_dim; ++d) out[h * head_dim + d] = tables.values[fp8[h * stride + d]];
  }
}

void decode_fp4_heads(const std::uint8_t* codes, std::int64_t stride, const std::uint32_t* scale_words,
                      std::int64_t scales_stride, std::int64_t heads, int head_dim, float* out) {
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::uint8_t* head = codes + h * stride;
    float* values = out + h * head_dim;
    for (int first = 0; first < head_dim; first += kFp4BlockElements) {
      // The block's 16 values: a code byte is then two lookups.
      const float scale = fp4_block_scale_value(scale_words[h * scales_stride], first / kFp4BlockElements);
      float table[16];
      for (int code = 0; code < 16; ++code) table[code] = e2m1_to_float(static_cast<std::uint8_t>(code)) * scale;
      for (int d = first; d < first + kFp4BlockElements; d += 2) {
        const std::uint8_t byte = head[d / 2];
        values[d] = table[byte & 0xF];
        values[d + 1] = table[byte >> 4];
      }
    }
  }
}

void to_bf16_pairs(const std::vector<float>& values, std::vector<std::uint32_t>* out) {
  out->resize(values.size() / 2);
  for (std::size_t w = 0; w < out->size(); ++w) (*out)[w] = bf16_pair(values[2 * w], values[2 * w + 1]);
}

void pack_key_block(const E4m3Tables& tables, int head_dim, const std::uint8_t* const* keys, KeyBlock* block) {
  const int words = head_dim / 2;
  block->pairs.resize(static_cast<std::size_t>(words) * kBlockKeys);
  // Word by word, so that the stores are consecutive.
  std::uint32_t* pairs = block->pairs.data();
  for (int w = 0; w < words; ++w) {
    for (int i = 0; i < kBlockKeys; ++i) {
      const std::uint8_t* key = keys[i];
      pairs[w * kBlockKeys + i] =
          key == nullptr ? 0u : tables.bf16[key[2 * w]] | (std::uint32_t{tables.bf16[key[2 * w + 1]]} << 16);
    }
  }
}

void pack_fp4_key_block(int head_dim, const std::uint8_t* const* codes, const std::uint32_t* scale_words,
                        KeyBlock* block) {
  constexpr int kMaxBlocks = kFp4HeadDim / kFp4BlockElements;
  const int words = head_dim / 2;  // one code byte per bf16 pair
  const int blocks = head_dim / kFp4BlockElements;
  // Per lane and block, the bf16 bits of every code's value at the block's
  // scale: each code byte then costs two lookups. A padding lane reads code 0
  // of its zero tables.
  std::uint16_t values[kBlockKeys * kMaxBlocks][16];
  for (int i = 0; i < kBlockKeys; ++i) {
    for (int b = 0; b < blocks; ++b) {
      std::uint16_t(&table)[16] = values[i * kMaxBlocks + b];
      if (codes[i] == nullptr) {
        table[0] = 0;
      } else {
        e2m1_bf16_table(static_cast<std::uint8_t>(scale_words[i] >> (8 * b)), table);
      }
    }
  }
  block->pairs.resize(static_cast<std::size_t>(words) * kBlockKeys);
  std::uint32_t* pairs = block->pairs.data();
  for (int w = 0; w < words; ++w) {
    const int b = w * 2 / kFp4BlockElements;
    for (int i = 0; i < kBlockKeys; ++i) {
      const std::uint8_t byte = codes[i] == nullptr ? 0 : codes[i][w];
      const std::uint16_t* table = values[i * kMaxBlocks + b];
      pairs[w * kBlockKeys + i] = table[byte & 0xF] | (std::uint32_t{table[byte >> 4]} << 16);
    }
  }
}

void Scorer::decode_query(std::int64_t row, float* out) const {
  const std::int64_t b = row / p_.next_n, j = row % p_.next_n;
  const std::uint8_t* q = p_.q + b * p_.q_stride_b + j * p_.q_stride_n;
  if (!p_.fp4_queries()) {
    decode_fp8_heads(tables_, q, p_.q_stride_h, p_.heads, p_.head_dim, out);
    return;
  }
  decode_fp4_heads(q, p_.q_stride_h, p_.q_scales + b * p_.q_scales_stride_b + j * p_.q_scales_stride_n,
                   p_.q_scales_stride_h, p_.heads, p_.head_dim, out);
}

Scorer::KeyRef Scorer::key_at(std::int64_t request, std::int64_t position) const {
  const CacheRow at =
      position_row(p_.block_table + request * p_.block_table_stride, position, p_.cache.page_tokens);
  std::uint8_t* page = cache_page(p_.cache, at.page);
  if (p_.fp4_keys()) return {page_keys(p_.cache, page, at.row), 1.0f, page_scale_words(p_.cache, page)[at.row]};
  return {page_keys(p_.cache, page, at.row), page_scales(p_.cache, page)[at.row], 0u};
}

float Scorer::decode_key(std::int64_t request, std::int64_t position, float* out) const {
  const KeyRef key = key_at(request, position);
  if (p_.fp4_keys()) {
    decode_fp4_heads(key.codes, 0, &key.scale_word, 0, 1, p_.head_dim, out);
  } else {
    decode_fp8_heads(tables_, key.codes, 0, 1, p_.head_dim, out);
  }
  return key.scale;
}

void Scorer::decode_key_block(std::int64_t request, std::int64_t first, int count, KeyBlock* block) const {
  std::array<const std::uint8_t*, kBlockKeys> codes{};
  std::array<std::uint32_t, kBlockKeys> scale_words{};
  for (int i = 0; i < kBlockKeys; ++i) {
    const auto lane = static_cast<std::size_t>(i);
    if (i >= count) {  // padding lane
      block->scales[lane] = 0.0f;
      continue;
    }
    const KeyRef key = key_at(request, first + i);
    codes[lane] = key.codes;
    block->scales[lane] = key.scale;
    scale_words[lane] = key.scale_word;
  }
  if (p_.fp4_keys()) {
    pack_fp4_key_block(p_.head_dim, codes.data(), scale_words.data(), block);
  } else {
    pack_key_block(tables_, p_.head_dim, codes.data(), block);
  }
}

void RowGroup::load(const Scorer& scorer, std::int64_t table_row, std::int64_t first, std::int64_t rows) {
  if (table_row == request && first == first_row && rows == this->rows()) return;
  request = table_row;
  first_row = first;
  lengths.resize(static_cast<std::size_t>(rows));
  queries.resize(static_cast<std::size_t>(rows * scorer.query_floats()));
  for (std::int64_t i = 0; i < rows; ++i) scorer.decode_query(first_row + i, queries.data() + i * scorer.query_floats());
  to_bf16_pairs(queries, &query_pairs);
}

void score_row(const Scorer& scorer, std::int64_t row, std::int64_t request, std::int64_t length, ScoreMode mode,
               RowScoreScratch* scratch, float* out) {
  const LogitsProblem& p = scorer.problem();
  scratch->query.resize(static_cast<std::size_t>(scorer.query_floats()));
  scratch->key.resize(static_cast<std::size_t>(p.head_dim));
  float* query = scratch->query.data();
  float* key = scratch->key.data();
  scorer.decode_query(row, query);
  const float* weights = scorer.weights_row(row);
  for (std::int64_t position = 0; position < length; ++position) {
    const float scale = scorer.decode_key(request, position, key);
    out[position] = mode == ScoreMode::plain_float64
                        ? static_cast<float>(scorer.score<double>(query, weights, key, scale))
                        : scorer.score<float>(query, weights, key, scale);
  }
}

namespace {

// Fills [L, max_context_len) of a row with -inf.
void clean_row(const LogitsProblem& p, std::int64_t row) {
  const std::int64_t length = row_length(p.lens, row / p.next_n, row % p.next_n);
  for (std::int64_t position = length; position < p.max_context_len; ++position) {
    store_logit(p, row, position, masked_logit());
  }
}

void reference_logits(const LogitsProblem& p, const ExecContext& ctx) {
  const Scorer scorer(p);
  RowScoreScratch scratch;
  std::vector<float> row_values(static_cast<std::size_t>(p.max_context_len));
  const ScoreMode mode = ctx.reference_float64 ? ScoreMode::plain_float64 : ScoreMode::plain_float;
  for (std::int64_t row = 0; row < p.rows(); ++row) {
    const std::int64_t length = row_length(p.lens, row / p.next_n, row % p.next_n);
    score_row(scorer, row, table_row_of(p, row), length, mode, &scratch, row_values.data());
    for (std::int64_t position = 0; position < length; ++position) {
      store_logit(p, row, position, row_values[static_cast<std::size_t>(position)]);
    }
    if (p.clean_logits) clean_row(p, row);
  }
}

// A schedule item with its unit's rows.
struct UnitItem {
  UnitSpan span;
  std::int64_t chunk = 0;
};

// Scores one schedule item: positions [256 c, 256 c + 256) of a unit's rows.
void score_item(const Scorer& scorer, const UnitItem& item, RowGroup* group) {
  const LogitsProblem& p = scorer.problem();
  group->load(scorer, item.span.request, item.span.first_row, item.span.rows);
  for (std::int64_t i = 0; i < group->rows(); ++i) {
    const std::int64_t row = group->first_row + i;
    group->lengths[static_cast<std::size_t>(i)] = row_length(p.lens, row / p.next_n, row % p.next_n);
  }
  const std::int64_t begin = item.chunk * kChunkTokens;
  const std::int64_t longest = *std::max_element(group->lengths.begin(), group->lengths.end());
  score_group(scorer, begin, std::min<std::int64_t>(begin + kChunkTokens, longest), group,
              [&](std::int64_t i, std::int64_t first, const float* values, std::int64_t count) {
                for (std::int64_t t = 0; t < count; ++t) store_logit(p, group->first_row + i, first + t, values[t]);
              });
}

// The items of the problem's path in (unit, chunk) order. The threads take
// them dynamically rather than by the schedule's ranges, so that the work
// spreads over all threads whatever worker count the schedule was planned for.
std::vector<UnitItem> list_items(const LogitsProblem& p) {
  std::vector<UnitItem> items;
  const UnitLayout layout = unit_layout(p);
  for (std::int64_t unit = 0; unit < layout.units;) {
    const UnitSpan span = unit_containing(layout, unit);
    const std::int64_t chunks = chunks_for_length(unit_length(layout, span));
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) items.push_back(UnitItem{span, chunk});
    unit = span.next;
  }
  return items;
}

void parallel_logits(const LogitsProblem& p, const ExecContext& ctx) {
  const Scorer scorer(p);
  const std::vector<UnitItem> items = list_items(p);
  std::vector<RowGroup> scratch(static_cast<std::size_t>(thread_count(ctx)));
  parallel_for_items(static_cast<std::int64_t>(items.size()), ctx, [&](std::int64_t i, int thread) {
    score_item(scorer, items[static_cast<std::size_t>(i)], &scratch[static_cast<std::size_t>(thread)]);
  });
  if (p.clean_logits) {
    parallel_for_items(p.rows(), ctx, [&](std::int64_t row, int) { clean_row(p, row); });
  }
}

}  // namespace

void compute_logits(const LogitsProblem& p, bool parallel, const ExecContext& ctx) {
  if (parallel) {
    parallel_logits(p, ctx);
  } else {
    reference_logits(p, ctx);
  }
}

Status paged_mqa_logits(const LogitsProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_scoring_data("paged_mqa_logits", p));
  compute_logits(p, parallel, ctx);
  return Status::success();
}

}  // namespace dsa::detail::cpu
