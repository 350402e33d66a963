#include "workload.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numeric>
#include <thread>

#include "dsa/cache.hpp"

namespace dsa_cli {
namespace {

// splitmix64: a small, fast, well-mixed generator; one stream per
// (seed, purpose, index) so parallel generation stays deterministic.
class Random {
 public:
  explicit Random(std::uint64_t seed) : state_(seed) {}
  Random(std::uint64_t seed, std::uint64_t stream, std::uint64_t index)
      : state_(seed ^ (stream * 0x9E3779B97F4A7C15ull) ^ (index * 0xD1B54A32D192ED03ull)) {
    next();
  }

  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [low, high].
  std::int64_t integer(std::int64_t low, std::int64_t high) {
    return low + static_cast<std::int64_t>(next() % static_cast<std::uint64_t>(high - low + 1));
  }
  // Sum of four 16-bit uniforms, centred and scaled to unit variance: close
  // enough to a normal for synthetic activations, one draw per value.
  float roughly_normal() {
    const std::uint64_t bits = next();
    const double sum = static_cast<double>(bits & 0xFFFF) + static_cast<double>((bits >> 16) & 0xFFFF) +
                       static_cast<double>((bits >> 32) & 0xFFFF) + static_cast<double>(bits >> 48);
    constexpr double kMean = 4 * 32767.5;
    constexpr double kStdDev = 37837.2;  // sqrt(4 * (65536^2 - 1) / 12)
    return static_cast<float>((sum - kMean) / kStdDev);
  }

 private:
  std::uint64_t state_;
};

enum Stream : std::uint64_t {
  lengths_stream = 1,
  pages_stream,
  keys_stream,
  queries_stream,
  gate_stream,
  row_counts_stream,
};

// Runs body(i) for i in [0, count) on the hardware threads.
template <typename Body>
void parallel_for(std::int64_t count, const Body& body) {
  const std::int64_t workers =
      std::clamp<std::int64_t>(std::thread::hardware_concurrency(), 1, std::max<std::int64_t>(count, 1));
  std::vector<std::thread> threads;
  for (std::int64_t w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      for (std::int64_t i = w; i < count; i += workers) body(i);
    });
  }
  for (auto& thread : threads) thread.join();
}

std::int64_t request_max_len(const WorkloadLayout& layout, std::int64_t b, int next_n) {
  return layout.context_lens[static_cast<std::size_t>(b * next_n + next_n - 1)];
}

// The longest length varied_lengths can draw.
std::int64_t longest_varied_length(std::int64_t average, double spread) {
  return static_cast<std::int64_t>(std::ceil(static_cast<double>(average) * (1.0 + spread)));
}

// Pages of P tokens holding `length` tokens.
std::int64_t pages_for(std::int64_t length, int page_tokens) { return (length + page_tokens - 1) / page_tokens; }

}  // namespace

std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if (std::isnan(value)) return static_cast<std::uint16_t>((bits >> 16) | 0x40);
  const std::uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

std::int64_t WorkloadLayout::cache_bytes(const WorkloadShape& shape) const {
  return num_pages * shape.cache_layout().min_page_bytes();
}

std::vector<std::int32_t> varied_lengths(std::int64_t count, std::int64_t average, double spread,
                                         std::uint64_t seed) {
  Random random(seed, lengths_stream, 0);
  const auto low = static_cast<std::int64_t>(std::floor(static_cast<double>(average) * (1.0 - spread)));
  const std::int64_t high = longest_varied_length(average, spread);
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(count));
  for (auto& length : lengths) {
    length = static_cast<std::int32_t>(random.integer(std::max<std::int64_t>(low, 1), std::max<std::int64_t>(high, 1)));
  }
  return lengths;
}

std::vector<std::int32_t> varied_row_counts(std::int64_t count, int max_rows, std::uint64_t seed) {
  Random random(seed, row_counts_stream, 0);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(count));
  for (auto& rows : counts) rows = static_cast<std::int32_t>(random.integer(1, std::max(max_rows, 1)));
  return counts;
}

std::int64_t max_cache_slots(const WorkloadShape& shape) {
  const std::int64_t longest_row = longest_varied_length(shape.avg_context, shape.spread) + shape.next_n;
  return shape.batch * pages_for(longest_row, shape.page_tokens) * shape.page_tokens;
}

WorkloadLayout make_layout(const WorkloadShape& shape) {
  const std::vector<std::int32_t> drawn_lengths =
      varied_lengths(shape.batch, shape.avg_context, shape.spread, shape.seed);
  std::vector<std::int32_t> prefix_lens(drawn_lengths.size());
  for (std::size_t b = 0; b < drawn_lengths.size(); ++b) {
    // Average length of a request's rows is prefix + (next_n + 1) / 2;
    // the drawn value is the length of its middle row.
    prefix_lens[b] = std::max<std::int32_t>(drawn_lengths[b] - (shape.next_n + 1) / 2, 0);
  }
  return layout_for_prefixes(prefix_lens, shape.next_n, shape.page_tokens, shape.seed);
}

WorkloadLayout layout_for_prefixes(const std::vector<std::int32_t>& prefix_lens, int next_n, int page_tokens,
                                   std::uint64_t seed) {
  WorkloadLayout layout;
  const auto batch = static_cast<std::int64_t>(prefix_lens.size());
  layout.prefix_lens = prefix_lens;
  layout.context_lens.resize(static_cast<std::size_t>(batch * next_n));
  std::int64_t total_pages = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t prefix = prefix_lens[static_cast<std::size_t>(b)];
    for (int j = 0; j < next_n; ++j) {
      layout.context_lens[static_cast<std::size_t>(b * next_n + j)] = static_cast<std::int32_t>(prefix + j + 1);
    }
    const std::int64_t max_len = prefix + next_n;
    layout.max_context_len = std::max(layout.max_context_len, max_len);
    const std::int64_t pages = pages_for(max_len, page_tokens);
    layout.max_blocks = std::max(layout.max_blocks, pages);
    total_pages += pages;
  }
  layout.num_pages = total_pages;
  layout.page_tokens = page_tokens;

  std::vector<std::int32_t> permutation(static_cast<std::size_t>(total_pages));
  std::iota(permutation.begin(), permutation.end(), 0);
  Random pages(seed, pages_stream, 0);
  for (std::int64_t i = total_pages - 1; i > 0; --i) {
    std::swap(permutation[static_cast<std::size_t>(i)],
              permutation[static_cast<std::size_t>(pages.integer(0, i))]);
  }

  layout.block_table.assign(static_cast<std::size_t>(batch * layout.max_blocks), -1);
  std::size_t next_page = 0;
  for (std::int64_t b = 0; b < batch; ++b) {
    const std::int64_t max_len = request_max_len(layout, b, next_n);
    const std::int64_t pages_needed = pages_for(max_len, page_tokens);
    for (std::int64_t i = 0; i < pages_needed; ++i) {
      layout.block_table[static_cast<std::size_t>(b * layout.max_blocks + i)] = permutation[next_page++];
    }
    for (std::int64_t p = 0; p < max_len; ++p) {
      const std::int32_t page = layout.block_table[static_cast<std::size_t>(b * layout.max_blocks + p / page_tokens)];
      layout.slot_mapping.push_back(page * page_tokens + static_cast<std::int32_t>(p % page_tokens));
    }
  }
  return layout;
}

void write_cache_tokens(const dsa::KeyCacheLayout& layout, const std::vector<std::int32_t>& slot_mapping,
                        const std::uint8_t* codes, const void* scales, std::uint8_t* cache) {
  const std::int64_t code_bytes = layout.code_bytes();
  const std::int64_t page_bytes = layout.min_page_bytes();
  for (std::size_t t = 0; t < slot_mapping.size(); ++t) {
    const std::int32_t slot = slot_mapping[t];
    std::uint8_t* page = cache + (slot / layout.page_tokens) * page_bytes;
    const int row = slot % layout.page_tokens;
    std::memcpy(page + layout.key_offset(row), codes + static_cast<std::int64_t>(t) * code_bytes,
                static_cast<std::size_t>(code_bytes));
    std::memcpy(page + layout.scale_offset(row), static_cast<const std::uint8_t*>(scales) + 4 * t, 4);
  }
}

void gather_request_keys(const dsa::KeyCacheLayout& layout, const std::int32_t* table_row, std::int64_t tokens,
                         const std::uint8_t* cache, std::uint8_t* codes, void* scales) {
  const std::int64_t code_bytes = layout.code_bytes();
  const std::int64_t page_bytes = layout.min_page_bytes();
  for (std::int64_t p = 0; p < tokens; ++p) {
    const std::uint8_t* page = cache + table_row[p / layout.page_tokens] * page_bytes;
    const int row = static_cast<int>(p % layout.page_tokens);
    std::memcpy(codes + p * code_bytes, page + layout.key_offset(row), static_cast<std::size_t>(code_bytes));
    std::memcpy(static_cast<std::uint8_t*>(scales) + 4 * p, page + layout.scale_offset(row), 4);
  }
}

HostInputs make_host_queries(const WorkloadShape& shape) {
  HostInputs inputs;
  const std::int64_t rows = shape.rows();
  const std::int64_t row_values = std::int64_t{shape.heads} * shape.head_dim;
  inputs.queries.resize(static_cast<std::size_t>(rows * row_values));
  inputs.head_gate.resize(static_cast<std::size_t>(rows * shape.heads));
  parallel_for(rows, [&](std::int64_t r) {
    Random query(shape.seed, queries_stream, static_cast<std::uint64_t>(r));
    for (std::int64_t i = 0; i < row_values; ++i) {
      inputs.queries[static_cast<std::size_t>(r * row_values + i)] = float_to_bf16(query.roughly_normal());
    }
    Random gate(shape.seed, gate_stream, static_cast<std::uint64_t>(r));
    for (int h = 0; h < shape.heads; ++h) {
      inputs.head_gate[static_cast<std::size_t>(r * shape.heads + h)] = float_to_bf16(gate.roughly_normal());
    }
  });
  return inputs;
}

HostInputs make_host_inputs(const WorkloadShape& shape, const WorkloadLayout& layout) {
  HostInputs inputs = make_host_queries(shape);
  const std::int64_t dim = shape.head_dim;
  inputs.keys.resize(static_cast<std::size_t>(layout.num_tokens() * dim));
  // First token of every request in slot_mapping order.
  std::vector<std::int64_t> first_token(static_cast<std::size_t>(shape.batch) + 1, 0);
  for (std::int64_t b = 0; b < shape.batch; ++b) {
    first_token[static_cast<std::size_t>(b) + 1] =
        first_token[static_cast<std::size_t>(b)] + request_max_len(layout, b, shape.next_n);
  }
  parallel_for(shape.batch, [&](std::int64_t b) {
    Random keys(shape.seed, keys_stream, static_cast<std::uint64_t>(b));
    for (std::int64_t t = first_token[static_cast<std::size_t>(b)]; t < first_token[static_cast<std::size_t>(b) + 1]; ++t) {
      const float gain = static_cast<float>(std::exp2(keys.uniform() * 4.0 - 2.0));
      std::uint16_t* row = inputs.keys.data() + t * dim;
      for (std::int64_t d = 0; d < dim; ++d) row[d] = float_to_bf16(gain * keys.roughly_normal());
    }
  });
  return inputs;
}

Traffic traffic_of(const WorkloadShape& shape, const WorkloadLayout& layout) {
  std::vector<std::int32_t> offsets(static_cast<std::size_t>(shape.batch) + 1);
  for (std::size_t b = 0; b < offsets.size(); ++b) offsets[b] = static_cast<std::int32_t>(b * shape.next_n);
  return traffic_of_rows(shape, layout.context_lens, offsets);
}

Traffic traffic_of_rows(const WorkloadShape& shape, const std::vector<std::int32_t>& context_lens,
                        const std::vector<std::int32_t>& request_offsets) {
  Traffic traffic;
  const auto token_bytes = static_cast<double>(shape.cache_layout().token_bytes());
  for (std::size_t b = 0; b + 1 < request_offsets.size(); ++b) {
    std::int32_t longest = 0;
    for (std::int32_t r = request_offsets[b]; r < request_offsets[b + 1]; ++r) {
      const std::int32_t length = context_lens[static_cast<std::size_t>(r)];
      longest = std::max(longest, length);
      traffic.sum_lengths += length;
      traffic.per_token_bytes += token_bytes * length;
    }
    traffic.native_bytes += token_bytes * longest;
  }
  traffic.logits_bytes = 4.0 * traffic.sum_lengths;
  traffic.native_bytes += traffic.logits_bytes;
  traffic.per_token_bytes += traffic.logits_bytes;
  traffic.flops = 2.0 * shape.heads * shape.head_dim * traffic.sum_lengths;
  return traffic;
}

}  // namespace dsa_cli
