#include "common/random_inputs.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace dsa_test {
namespace {

// Keeps data() non-null for empty vectors, so that views of empty tensors
// still carry a pointer.
template <typename T>
T* nonnull_data(std::vector<T>& v) {
  v.reserve(std::max<std::size_t>(v.size(), 1));
  return v.data();
}

std::vector<std::int32_t> convention_lens(LengthConvention convention,
                                          const std::vector<std::int32_t>& prefix, int next_n) {
  switch (convention) {
    case LengthConvention::causal: return causal_lens(prefix, next_n);
    case LengthConvention::expanded: return expanded_lens(prefix, next_n);
    case LengthConvention::legacy: return legacy_lens(prefix, next_n);
  }
  return {};
}

}  // namespace

void random_vector(Rng& rng, float* out, int n) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> exponent(-3.0f, 2.0f);
  std::uniform_int_distribution<int> die(0, 127);
  const float magnitude = std::pow(10.0f, exponent(rng));
  for (int i = 0; i < n; ++i) {
    const int roll = die(rng);
    float v = normal(rng) * magnitude;
    if (roll < 2) v = 0.0f;
    if (roll == 2) v *= 50.0f;
    out[i] = v;
  }
}

std::int64_t Workload::needed_pages(std::int64_t b) const {
  std::int64_t longest = 0;
  for (int j = 0; j < next_n; ++j) longest = std::max<std::int64_t>(longest, context_lens[b * next_n + j]);
  return (longest + geometry.page_tokens - 1) / geometry.page_tokens;
}

LogitsInputs Workload::logits_inputs() const {
  LogitsInputs in;
  in.batch = batch;
  in.next_n = next_n;
  in.heads = heads;
  in.head_dim = head_dim;
  in.q_fp8 = q_fp8.data();
  in.weights = weights.data();
  in.cache = cache.data();
  in.geometry = geometry;
  in.context_lens = context_lens.data();
  in.block_table = block_table.data();
  in.max_blocks = max_blocks;
  return in;
}

Workload make_workload(const WorkloadSpec& spec) {
  Rng rng(spec.seed);
  Workload w;
  w.batch = spec.batch;
  w.next_n = spec.next_n;
  w.heads = spec.heads;
  w.head_dim = spec.head_dim;
  w.convention = spec.convention;
  w.geometry.page_tokens = spec.page_tokens;

  if (!spec.prefix_lens.empty()) {
    w.prefix_lens = spec.prefix_lens;
  } else {
    std::uniform_int_distribution<std::int32_t> prefix(spec.min_prefix, spec.max_prefix);
    for (std::int64_t b = 0; b < spec.batch; ++b) w.prefix_lens.push_back(prefix(rng));
  }
  if (!spec.context_lens.empty()) {
    w.context_lens = spec.context_lens;
    w.causal_lens = spec.context_lens;
  } else {
    w.context_lens = convention_lens(spec.convention, w.prefix_lens, spec.next_n);
    w.causal_lens = spec.convention == LengthConvention::expanded
                        ? causal_lens(w.prefix_lens, spec.next_n)
                        : w.context_lens;
  }
  std::int32_t longest = 0;
  for (const std::int32_t len : w.context_lens) longest = std::max(longest, len);
  w.max_context_len = longest + spec.extra_context;

  // Pages: fresh ones drawn from a random permutation; with share_pages a
  // request starts with (about half of) the pages of the request before it.
  std::vector<std::int64_t> needed(static_cast<std::size_t>(w.batch));
  std::vector<std::int64_t> shared(static_cast<std::size_t>(w.batch), 0);
  std::int64_t most_needed = 0, fresh_total = 0;
  for (std::int64_t b = 0; b < w.batch; ++b) {
    needed[b] = w.needed_pages(b);
    if (spec.share_pages && b > 0) shared[b] = (std::min(needed[b], needed[b - 1]) + 1) / 2;
    most_needed = std::max(most_needed, needed[b]);
    fresh_total += needed[b] - shared[b];
  }
  w.max_blocks = std::max<std::int64_t>(most_needed + spec.padding_columns, 1);
  w.geometry.head_dim = spec.head_dim;
  w.geometry.num_pages = std::max<std::int64_t>(fresh_total + spec.extra_pages, 1);
  w.geometry.page_stride = std::int64_t{spec.page_tokens} * (spec.head_dim + 4) + spec.page_padding_bytes;

  std::vector<std::int32_t> permutation(static_cast<std::size_t>(w.geometry.num_pages));
  std::iota(permutation.begin(), permutation.end(), 0);
  std::shuffle(permutation.begin(), permutation.end(), rng);
  w.block_table.assign(static_cast<std::size_t>(w.batch * w.max_blocks), spec.block_table_padding);
  std::size_t next_fresh = 0;
  for (std::int64_t b = 0; b < w.batch; ++b) {
    for (std::int64_t i = 0; i < needed[b]; ++i) {
      w.block_table[b * w.max_blocks + i] = i < shared[b] ? w.block_table[(b - 1) * w.max_blocks + i]
                                                          : permutation[next_fresh++];
    }
  }

  // Unused pages and page padding hold random bytes; used pages hold keys.
  w.cache.resize(static_cast<std::size_t>(w.geometry.bytes()));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& c : w.cache) c = static_cast<std::uint8_t>(byte(rng));
  std::vector<bool> used(static_cast<std::size_t>(w.geometry.num_pages), false);
  for (std::int64_t b = 0; b < w.batch; ++b)
    for (std::int64_t i = 0; i < needed[b]; ++i) used[w.block_table[b * w.max_blocks + i]] = true;
  std::vector<float> key(static_cast<std::size_t>(spec.head_dim));
  for (std::int64_t page = 0; page < w.geometry.num_pages; ++page) {
    if (!used[page]) continue;
    for (int t = 0; t < spec.page_tokens; ++t) {
      if (spec.extreme_products) {
        std::fill(key.begin(), key.end(), 1.0f);
      } else {
        random_vector(rng, key.data(), spec.head_dim);
      }
      const std::int64_t slot = page * spec.page_tokens + t;
      store_token(key.data(), slot, w.geometry, spec.power_of_two_scales, w.cache.data());
      if (spec.negative_scales && slot % 3 == 1) {
        const float negated = -cached_scale(w.cache.data(), w.geometry, slot);
        std::memcpy(w.cache.data() + w.geometry.scale_byte(slot), &negated, sizeof negated);
      }
    }
  }

  const std::int64_t head_values = w.rows() * spec.heads;
  w.q.resize(static_cast<std::size_t>(head_values * spec.head_dim));
  for (std::int64_t i = 0; i < head_values; ++i) {
    float* head = w.q.data() + i * spec.head_dim;
    if (spec.extreme_products) {
      std::fill(head, head + spec.head_dim, i % 2 == 0 ? 1.0f : -1.0f);
    } else {
      random_vector(rng, head, spec.head_dim);
    }
  }
  std::normal_distribution<float> gate(0.0f, 1.0f);
  w.head_gate.resize(static_cast<std::size_t>(head_values));
  for (auto& g : w.head_gate) g = gate(rng);
  w.q_fp8.resize(w.q.size());
  w.weights.resize(w.head_gate.size());
  quantize_queries(w.q.data(), w.head_gate.data(), w.rows(), spec.heads, spec.head_dim,
                   spec.power_of_two_scales, default_weight_scale(spec.heads, spec.head_dim),
                   w.q_fp8.data(), w.weights.data());
  return w;
}

dsa::TensorView Workload::q_fp8_view() {
  return dsa::make_view(nonnull_data(q_fp8), dsa::DType::float8_e4m3, {batch, next_n, heads, head_dim});
}

dsa::TensorView Workload::weights_view() {
  return dsa::make_view(nonnull_data(weights), dsa::DType::float32, {rows(), heads});
}

dsa::TensorView Workload::context_lens_view() {
  return dsa::make_view(nonnull_data(context_lens), dsa::DType::int32, {batch, next_n});
}

dsa::TensorView Workload::causal_lens_view() {
  return dsa::make_view(nonnull_data(causal_lens), dsa::DType::int32, {rows()});
}

dsa::TensorView Workload::block_table_view() {
  return dsa::make_view(nonnull_data(block_table), dsa::DType::int32, {batch, max_blocks});
}

dsa::TensorView Workload::cache_view_2d() {
  const CacheGeometry& g = geometry;
  return dsa::make_view(cache.data(), dsa::DType::uint8,
                        {g.num_pages, std::int64_t{g.page_tokens} * (g.head_dim + 4)},
                        {g.page_stride, 1});
}

dsa::TensorView Workload::cache_view_4d() {
  const CacheGeometry& g = geometry;
  const std::int64_t width = g.head_dim + 4;
  return dsa::make_view(cache.data(), dsa::DType::uint8, {g.num_pages, g.page_tokens, 1, width},
                        {g.page_stride, width, width, 1});
}

OwnedView Workload::strided_q_fp8(std::int64_t pad_bytes) const {
  const std::int64_t head_stride = head_dim + pad_bytes;
  OwnedView out;
  // Padding holds NaN codes so that reading it would show in the logits.
  out.bytes.assign(static_cast<std::size_t>(std::max<std::int64_t>(rows() * heads * head_stride, 1)), 0x7F);
  for (std::int64_t i = 0; i < rows() * heads; ++i)
    std::memcpy(out.bytes.data() + i * head_stride, q_fp8.data() + i * head_dim, static_cast<std::size_t>(head_dim));
  out.view = dsa::make_view(out.bytes.data(), dsa::DType::float8_e4m3, {batch, next_n, heads, head_dim},
                            {next_n * heads * head_stride, heads * head_stride, head_stride, 1});
  return out;
}

namespace {

template <typename T>
OwnedView filled_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride, T fill,
                        dsa::DType dtype) {
  OwnedView out;
  const std::int64_t elements = std::max<std::int64_t>(rows * row_stride, 1);
  out.bytes.resize(static_cast<std::size_t>(elements) * sizeof(T));
  const std::vector<T> values(static_cast<std::size_t>(elements), fill);
  std::memcpy(out.bytes.data(), values.data(), out.bytes.size());
  out.view = dsa::make_view(out.bytes.data(), dtype, {rows, cols}, {row_stride, 1});
  return out;
}

}  // namespace

OwnedView float_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride, float fill) {
  return filled_matrix(rows, cols, row_stride, fill, dsa::DType::float32);
}

OwnedView bf16_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                      std::uint16_t fill) {
  return filled_matrix(rows, cols, row_stride, fill, dsa::DType::bfloat16);
}

OwnedView int32_matrix(std::int64_t rows, std::int64_t cols, std::int64_t row_stride,
                       std::int32_t fill) {
  return filled_matrix(rows, cols, row_stride, fill, dsa::DType::int32);
}

dsa::TensorView view_of(std::vector<std::int32_t>& v, std::initializer_list<std::int64_t> shape) {
  return dsa::make_view(nonnull_data(v), dsa::DType::int32, shape);
}

dsa::TensorView view_of(std::vector<float>& v, std::initializer_list<std::int64_t> shape) {
  return dsa::make_view(nonnull_data(v), dsa::DType::float32, shape);
}

}  // namespace dsa_test

namespace dsa_test {

VarlenWorkload make_varlen_workload(const VarlenSpec& spec) {
  Rng rng(spec.seed * 7919 + 13);
  VarlenWorkload v;
  v.requests = static_cast<std::int64_t>(spec.rows_per_request.size());
  v.request_offsets.assign(1, 0);
  std::vector<std::int32_t> lens;
  for (std::int64_t b = 0; b < v.requests; ++b) {
    const int n = spec.rows_per_request[static_cast<std::size_t>(b)];
    const std::int32_t prefix = std::uniform_int_distribution<std::int32_t>(0, spec.max_prefix)(rng);
    std::vector<std::int32_t> request_lens(static_cast<std::size_t>(n));
    for (int t = 0; t < n; ++t) {
      request_lens[static_cast<std::size_t>(t)] =
          spec.causal ? prefix + t + 1 : std::uniform_int_distribution<std::int32_t>(0, spec.max_prefix)(rng);
    }
    if (!spec.causal && n > 0) {
      // The longest row last, the others in any order.
      auto longest = std::max_element(request_lens.begin(), request_lens.end());
      std::iter_swap(longest, request_lens.end() - 1);
    }
    lens.insert(lens.end(), request_lens.begin(), request_lens.end());
    for (int t = 0; t < n; ++t) v.row_request.push_back(static_cast<std::int32_t>(b));
    v.request_offsets.push_back(v.request_offsets.back() + n);
  }
  const auto total = static_cast<std::int64_t>(lens.size());
  v.rows = make_workload(WorkloadSpec{.batch = total, .next_n = 1, .heads = spec.heads, .head_dim = spec.head_dim,
                                      .context_lens = lens, .page_tokens = spec.page_tokens, .seed = spec.seed});
  // Request b reads the pages of its longest row: they hold every position its rows need.
  const std::int64_t width = v.rows.max_blocks;
  v.table.assign(static_cast<std::size_t>(std::max<std::int64_t>(v.requests, 0) * width), -1);
  for (std::int64_t b = 0; b < v.requests; ++b) {
    const std::int32_t begin = v.request_offsets[static_cast<std::size_t>(b)];
    const std::int32_t end = v.request_offsets[static_cast<std::size_t>(b) + 1];
    if (begin == end) continue;
    std::int32_t longest = begin;
    for (std::int32_t r = begin; r < end; ++r) {
      if (lens[static_cast<std::size_t>(r)] > lens[static_cast<std::size_t>(longest)]) longest = r;
    }
    std::copy_n(v.rows.block_table.begin() + longest * width, width, v.table.begin() + b * width);
  }
  return v;
}

dsa::TensorView VarlenWorkload::request_offsets_view() {
  return dsa::make_view(request_offsets.data(), dsa::DType::int32, {requests + 1});
}

dsa::TensorView VarlenWorkload::table_view() {
  return dsa::make_view(nonnull_data(table), dsa::DType::int32, {requests, rows.max_blocks});
}

dsa::TensorView VarlenWorkload::q_view_3d() {
  return dsa::make_view(nonnull_data(rows.q_fp8), dsa::DType::float8_e4m3, {rows.batch, rows.heads, rows.head_dim});
}

dsa::TensorView VarlenWorkload::row_lengths_view() {
  return dsa::make_view(nonnull_data(rows.context_lens), dsa::DType::int32, {rows.batch});
}

ReferenceLogits VarlenWorkload::reference() const {
  LogitsInputs in = rows.logits_inputs();
  in.block_table = table.data();
  in.row_request = row_request.data();
  return reference_logits(in, rows.max_context_len);
}

}  // namespace dsa_test
