#include "common/prefill_inputs.hpp"

#include <algorithm>
#include <string>

namespace dsa_test {
namespace {

// Draws row i's range of `spec.ranges` into w.ks[i], w.ke[i].
void draw_ranges(const MqaSpec& spec, Rng& rng, MqaWorkload* w) {
  const std::int64_t S = spec.rows, n = spec.num_keys;
  if (spec.ranges == RangeShape::given) {
    w->ks = spec.ks;
    w->ke = spec.ke;
    return;
  }
  w->ks.assign(static_cast<std::size_t>(S), 0);
  w->ke.assign(static_cast<std::size_t>(S), 0);
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {  // in [lo, hi]
    return static_cast<std::int32_t>(std::uniform_int_distribution<std::int64_t>(lo, hi)(rng));
  };
  for (std::int64_t i = 0; i < S; ++i) {
    std::int32_t& ks = w->ks[static_cast<std::size_t>(i)];
    std::int32_t& ke = w->ke[static_cast<std::size_t>(i)];
    switch (spec.ranges) {
      case RangeShape::causal:
        ks = 0;
        ke = static_cast<std::int32_t>(std::clamp<std::int64_t>(n - S + i + 1, 0, n));
        break;
      case RangeShape::random:
        ks = uniform(0, n);
        ke = uniform(0, 3) == 0 ? ks : uniform(ks, n);  // a quarter empty
        break;
      case RangeShape::context_parallel: {
        const std::int64_t half = n / 2;
        const bool second = i >= S / 2;
        ks = static_cast<std::int32_t>(second ? half : 0);
        ke = uniform(ks, second ? n : half);
        break;
      }
      case RangeShape::given: break;
    }
  }
}

template <typename T>
dsa::TensorView view(std::vector<T>& v, dsa::DType dtype, std::initializer_list<std::int64_t> shape) {
  v.reserve(std::max<std::size_t>(v.size(), 1));  // a pointer even when empty
  return dsa::make_view(v.data(), dtype, shape);
}

}  // namespace

MqaWorkload make_mqa_workload(const MqaSpec& spec) {
  MqaWorkload w;
  w.rows = spec.rows;
  w.num_keys = spec.num_keys;
  w.heads = spec.heads;
  w.head_dim = spec.head_dim;
  Rng rng(spec.seed);
  const int D = spec.head_dim;

  // Keys quantized per token as the cache stores them; every fifth scale negated
  // (keeps the negative dot products, as a cache the library did not write).
  std::vector<float> key(static_cast<std::size_t>(D));
  w.keys.resize(static_cast<std::size_t>(spec.num_keys * D));
  w.key_scales.resize(static_cast<std::size_t>(spec.num_keys));
  for (std::int64_t j = 0; j < spec.num_keys; ++j) {
    random_vector(rng, key.data(), D);
    float amax = 0.0f;
    for (float v : key) amax = std::max(amax, std::fabs(v));
    const float scale = quantization_scale(amax, false);
    for (int d = 0; d < D; ++d) w.keys[static_cast<std::size_t>(j * D + d)] = e4m3_encode(key[d] / scale);
    w.key_scales[static_cast<std::size_t>(j)] = j % 5 == 3 ? -scale : scale;
  }

  const std::int64_t head_values = spec.rows * spec.heads;
  std::vector<float> q(static_cast<std::size_t>(head_values * D));
  for (std::int64_t h = 0; h < head_values; ++h) random_vector(rng, q.data() + h * D, D);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> gate(static_cast<std::size_t>(head_values));
  for (float& g : gate) g = normal(rng);
  w.q_fp8.resize(q.size());
  w.weights.resize(gate.size());
  quantize_queries(q.data(), gate.data(), spec.rows, spec.heads, D, false, default_weight_scale(spec.heads, D),
                   w.q_fp8.data(), w.weights.data());
  draw_ranges(spec, rng, &w);
  return w;
}

std::int64_t MqaWorkload::longest_range() const {
  std::int64_t longest = 0;
  for (std::size_t i = 0; i < ks.size(); ++i) longest = std::max<std::int64_t>(longest, ke[i] - ks[i]);
  return longest;
}

MqaInputs MqaWorkload::inputs() const {
  return MqaInputs{rows, num_keys, heads, head_dim, q_fp8.data(), keys.data(), key_scales.data(),
                   weights.data(), ks.data(), ke.data()};
}

std::vector<PrefillCase> prefill_cases() {
  std::vector<PrefillCase> cases;
  auto add = [&](std::string name, MqaSpec spec) -> PrefillCase& {
    spec.seed = 500 + cases.size();
    cases.push_back(PrefillCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  // Head counts and dims, full and compressed, fp32 and bf16, clean or not.
  for (const int heads : {1, 32, 64}) {
    for (const int head_dim : {32, 128}) {
      for (const bool compressed : {false, true}) {
        const bool bf16 = (heads + head_dim / 32 + compressed) % 2 == 1;
        const bool clean = heads != 32 || compressed;
        PrefillCase& c = add("h" + std::to_string(heads) + "_d" + std::to_string(head_dim) +
                                 (compressed ? "_compressed" : "_full") + (bf16 ? "_bf16" : "_fp32") +
                                 (clean ? "_clean" : ""),
                             MqaSpec{.rows = 19, .heads = heads, .head_dim = head_dim, .num_keys = 170,
                                     .ranges = heads == 32 ? RangeShape::random : RangeShape::causal});
        c.compressed = compressed;
        c.bf16_out = bf16;
        c.clean = clean;
      }
    }
  }
  for (const bool compressed : {false, true}) {
    const std::string form = compressed ? "_compressed" : "_full";
    add("random_ranges" + form, MqaSpec{.rows = 37, .num_keys = 411, .ranges = RangeShape::random})
        .compressed = compressed;
    add("context_parallel" + form, MqaSpec{.rows = 26, .num_keys = 333, .ranges = RangeShape::context_parallel})
        .compressed = compressed;
    add("empty_ranges" + form, MqaSpec{.rows = 5, .num_keys = 64, .ranges = RangeShape::given,
                                       .ks = {0, 7, 64, 33, 0}, .ke = {0, 7, 64, 33, 0}})
        .compressed = compressed;
    add("ranges_ending_at_s_kv" + form, MqaSpec{.rows = 6, .num_keys = 97, .ranges = RangeShape::given,
                                                .ks = {0, 96, 50, 1, 97, 31}, .ke = {97, 97, 97, 97, 97, 97}})
        .compressed = compressed;
    add("one_row" + form, MqaSpec{.rows = 1, .num_keys = 129, .ranges = RangeShape::given, .ks = {3}, .ke = {128}})
        .compressed = compressed;
    add("non_monotone" + form, MqaSpec{.rows = 7, .num_keys = 300, .ranges = RangeShape::given,
                                       .ks = {200, 0, 150, 299, 10, 0, 40}, .ke = {300, 100, 151, 300, 10, 33, 41}})
        .compressed = compressed;
    // S and the ranges fit no tile or block size (8 rows, 32 keys).
    add("odd_sizes" + form, MqaSpec{.rows = 13, .heads = 7, .head_dim = 48, .num_keys = 77,
                                    .ranges = RangeShape::random})
        .compressed = compressed;
    add("no_rows" + form, MqaSpec{.rows = 0, .num_keys = 50});
    cases.back().compressed = compressed;
    add("no_keys" + form, MqaSpec{.rows = 3, .num_keys = 0, .ranges = RangeShape::given, .ks = {0, 0, 0},
                                  .ke = {0, 0, 0}})
        .compressed = compressed;
  }
  {
    PrefillCase& c = add("compressed_wider_than_ranges_unclean_bf16",
                         MqaSpec{.rows = 9, .num_keys = 200, .ranges = RangeShape::random});
    c.compressed = true;
    c.extra_width = 13;
    c.clean = false;
    c.bf16_out = true;
  }
  {
    PrefillCase& c = add("compressed_wider_than_ranges_clean", MqaSpec{.rows = 9, .num_keys = 200,
                                                                      .ranges = RangeShape::random});
    c.compressed = true;
    c.extra_width = 13;
  }
  {
    PrefillCase& c = add("strided_full", MqaSpec{.rows = 11, .num_keys = 150, .ranges = RangeShape::random});
    c.extra_columns = 5;
    c.extra_stride = 19;
    c.q_pad_bytes = 16;
  }
  {
    PrefillCase& c = add("strided_compressed_unclean", MqaSpec{.rows = 11, .num_keys = 150,
                                                              .ranges = RangeShape::random});
    c.compressed = true;
    c.clean = false;
    c.extra_columns = 7;
    c.extra_stride = 3;
    c.q_pad_bytes = 32;
  }
  add("float64_full", MqaSpec{.rows = 9, .num_keys = 120, .ranges = RangeShape::random}).float64 = true;
  {
    PrefillCase& c = add("float64_compressed", MqaSpec{.rows = 9, .num_keys = 120, .ranges = RangeShape::random});
    c.float64 = true;
    c.compressed = true;
  }
  add("long_causal", MqaSpec{.rows = 40, .heads = 32, .num_keys = 1500});
  return cases;
}

std::vector<std::uint8_t> MqaWorkload::padded_q(std::int64_t pad_bytes) const {
  const std::int64_t head_stride = head_dim + pad_bytes;
  std::vector<std::uint8_t> out(static_cast<std::size_t>(std::max<std::int64_t>(rows * heads * head_stride, 1)), 0x7F);
  for (std::int64_t i = 0; i < rows * heads; ++i) {
    std::copy_n(q_fp8.begin() + i * head_dim, head_dim, out.begin() + i * head_stride);
  }
  return out;
}

PrefillLayout prefill_layout(const PrefillCase& c, const MqaWorkload& w) {
  PrefillLayout l;
  l.width = c.compressed ? w.longest_range() + c.extra_width : w.num_keys;
  l.cols = l.width + c.extra_columns;
  l.stride = l.cols + c.extra_stride;
  l.options.clean_logits = c.clean;
  l.options.compressed = c.compressed;
  l.options.max_seqlen_k = c.compressed ? l.width : 0;
  return l;
}

dsa::TensorView MqaWorkload::q_view() { return view(q_fp8, dsa::DType::float8_e4m3, {rows, heads, head_dim}); }
dsa::TensorView MqaWorkload::weights_view() { return view(weights, dsa::DType::float32, {rows, heads}); }
dsa::TensorView MqaWorkload::keys_view() { return view(keys, dsa::DType::float8_e4m3, {num_keys, head_dim}); }
dsa::TensorView MqaWorkload::key_scales_view() { return view(key_scales, dsa::DType::float32, {num_keys}); }
dsa::TensorView MqaWorkload::ks_view() { return view(ks, dsa::DType::int32, {rows}); }
dsa::TensorView MqaWorkload::ke_view() { return view(ke, dsa::DType::int32, {rows}); }

}  // namespace dsa_test
