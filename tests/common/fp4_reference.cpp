#include "common/fp4_reference.hpp"

#include <array>
#include <cmath>
#include <cstring>

namespace dsa_test {
namespace {

constexpr std::array<double, 8> kMagnitudes{0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
constexpr int kHeadDim = 128;
constexpr int kCodeBytes = kHeadDim / 2;

std::uint32_t load_word(const std::uint8_t* bytes) {
  std::uint32_t word;
  std::memcpy(&word, bytes, sizeof word);
  return word;
}

}  // namespace

double e2m1_value(std::uint8_t code) {
  const double magnitude = kMagnitudes[code & 0x7];
  return (code & 0x8) ? -magnitude : magnitude;
}

std::uint8_t e2m1_nearest(double x) {
  const double magnitude = std::fmin(std::fabs(x), 6.0);  // saturates (and keeps huge x's distances apart)
  int best = 0;
  for (int i = 1; i < 8; ++i) {  // ascending: a tie keeps the smaller magnitude
    if (std::fabs(magnitude - kMagnitudes[i]) < std::fabs(magnitude - kMagnitudes[best])) best = i;
  }
  if (best == 0) return 0;
  return static_cast<std::uint8_t>(best | (x < 0 ? 0x8 : 0x0));
}

int ue8m0_for_amax(double amax) {
  const double clamped = std::fmax(amax, static_cast<double>(1e-4f));
  int e = 0;
  while (6.0 * std::ldexp(1.0, e - 127) < clamped) ++e;
  return e;
}

std::uint32_t fp4_quantize(const float* x, int count, std::uint8_t* codes) {
  std::uint32_t word = 0;
  for (int block = 0; block < count / 32; ++block) {
    double amax = 0.0;
    for (int i = 0; i < 32; ++i) {
      const double v = x[block * 32 + i];
      if (!std::isnan(v)) amax = std::fmax(amax, std::fabs(v));
    }
    const int e = ue8m0_for_amax(amax);
    const double scale = std::ldexp(1.0, e - 127);
    for (int i = 0; i < 32; ++i) {
      const int d = block * 32 + i;
      const double v = x[d];
      const std::uint8_t code = std::isnan(v) ? 0 : e2m1_nearest(v / scale);
      if (d % 2 == 0) {
        codes[d / 2] = code;
      } else {
        codes[d / 2] = static_cast<std::uint8_t>(codes[d / 2] | (code << 4));
      }
    }
    word |= static_cast<std::uint32_t>(e) << (8 * block);
  }
  return word;
}

double fp4_value(const std::uint8_t* codes, std::uint32_t scale_word, int d) {
  const std::uint8_t code = static_cast<std::uint8_t>(d % 2 == 0 ? codes[d / 2] & 0xF : codes[d / 2] >> 4);
  const int e = static_cast<int>((scale_word >> (8 * (d / 32))) & 0xFF);
  return e2m1_value(code) * std::ldexp(1.0, e - 127);
}

double Fp4Cache::value(std::int64_t slot, int d) const {
  return fp4_value(bytes.data() + geometry.code_byte(slot), load_word(bytes.data() + geometry.word_byte(slot)), d);
}

dsa::TensorView Fp4Cache::view_2d() {
  return dsa::make_view(bytes.data(), dsa::DType::uint8, {geometry.num_pages, geometry.page_stride});
}

dsa::TensorView Fp4Cache::view_4d() {
  const std::int64_t width = kCodeBytes + 4;
  return dsa::make_view(bytes.data(), dsa::DType::uint8, {geometry.num_pages, geometry.page_tokens, 1, width},
                        {geometry.page_stride, width, width, 1});
}

Fp4Cache fp4_cache_of(const Workload& w, std::int64_t page_padding_bytes) {
  Fp4Cache cache;
  cache.geometry.num_pages = w.geometry.num_pages;
  cache.geometry.page_tokens = w.geometry.page_tokens;
  cache.geometry.page_stride = std::int64_t{w.geometry.page_tokens} * (kCodeBytes + 4) + page_padding_bytes;
  cache.bytes.assign(static_cast<std::size_t>(cache.geometry.num_pages * cache.geometry.page_stride), 0xA5);
  std::array<float, kHeadDim> key{};
  for (std::int64_t slot = 0; slot < w.geometry.num_slots(); ++slot) {
    for (int d = 0; d < kHeadDim; ++d) key[static_cast<std::size_t>(d)] = cached_key(w.cache.data(), w.geometry, slot, d);
    const std::uint32_t word = fp4_quantize(key.data(), kHeadDim, cache.bytes.data() + cache.geometry.code_byte(slot));
    std::memcpy(cache.bytes.data() + cache.geometry.word_byte(slot), &word, sizeof word);
  }
  return cache;
}

dsa::TensorView Fp4Queries::codes_view(const Workload& w) {
  return dsa::make_view(codes.data(), dsa::DType::uint8, {w.batch, w.next_n, w.heads, kCodeBytes});
}
dsa::TensorView Fp4Queries::scales_view(const Workload& w) {
  return dsa::make_view(scales.data(), dsa::DType::int32, {w.batch, w.next_n, w.heads});
}
dsa::TensorView Fp4Queries::weights_view(const Workload& w) {
  return dsa::make_view(weights.data(), dsa::DType::float32, {w.rows(), w.heads});
}

Fp4Queries fp4_queries_of(const Workload& w) {
  Fp4Queries out;
  const std::int64_t vectors = w.rows() * w.heads;
  out.codes.resize(static_cast<std::size_t>(vectors * kCodeBytes));
  out.scales.resize(static_cast<std::size_t>(vectors));
  out.weights.resize(static_cast<std::size_t>(vectors));
  const float weight_scale = default_weight_scale(w.heads, kHeadDim);
  for (std::int64_t v = 0; v < vectors; ++v) {
    const auto i = static_cast<std::size_t>(v);
    out.scales[i] = static_cast<std::int32_t>(
        fp4_quantize(w.q.data() + v * kHeadDim, kHeadDim, out.codes.data() + v * kCodeBytes));
    out.weights[i] = w.head_gate[i] * weight_scale;
  }
  return out;
}

namespace {

// Row r reads the block-table row table_row_of(r) points at.
template <typename TableRow>
ReferenceLogits fp4_logits(const Workload& w, const Fp4Cache& cache, const Fp4Queries* fp4_q,
                           TableRow&& table_row_of) {
  ReferenceLogits ref;
  ref.rows = w.rows();
  ref.cols = w.max_context_len;
  ref.value.assign(static_cast<std::size_t>(ref.rows * ref.cols), std::nan(""));
  ref.magnitude.assign(ref.value.size(), 0.0);
  std::vector<double> q(static_cast<std::size_t>(w.heads * kHeadDim));
  std::vector<double> key(kHeadDim);
  for (std::int64_t r = 0; r < ref.rows; ++r) {
    for (std::int64_t h = 0; h < w.heads; ++h) {
      const std::int64_t v = r * w.heads + h;
      for (int d = 0; d < kHeadDim; ++d) {
        q[static_cast<std::size_t>(h * kHeadDim + d)] =
            fp4_q != nullptr ? fp4_value(fp4_q->codes.data() + v * kCodeBytes,
                                         static_cast<std::uint32_t>(fp4_q->scales[static_cast<std::size_t>(v)]), d)
                             : e4m3_decode(w.q_fp8[static_cast<std::size_t>(v * kHeadDim + d)]);
      }
    }
    const float* weights = (fp4_q != nullptr ? fp4_q->weights.data() : w.weights.data()) + r * w.heads;
    const std::int32_t* table_row = table_row_of(r);
    for (std::int64_t p = 0; p < w.context_lens[static_cast<std::size_t>(r)]; ++p) {
      const std::int64_t slot = std::int64_t{table_row[p / cache.geometry.page_tokens]} * cache.geometry.page_tokens +
                                p % cache.geometry.page_tokens;
      for (int d = 0; d < kHeadDim; ++d) key[static_cast<std::size_t>(d)] = cache.value(slot, d);
      double logit = 0.0, magnitude = 0.0;
      for (std::int64_t h = 0; h < w.heads; ++h) {
        double dot = 0.0, dot_magnitude = 0.0;
        for (int d = 0; d < kHeadDim; ++d) {
          const double term = q[static_cast<std::size_t>(h * kHeadDim + d)] * key[static_cast<std::size_t>(d)];
          dot += term;
          dot_magnitude += std::fabs(term);
        }
        logit += weights[h] * std::fmax(dot, 0.0);
        magnitude += std::fabs(weights[h]) * dot_magnitude;
      }
      ref.value[static_cast<std::size_t>(r * ref.cols + p)] = logit;
      ref.magnitude[static_cast<std::size_t>(r * ref.cols + p)] = magnitude;
    }
  }
  return ref;
}

}  // namespace

ReferenceLogits fp4_reference_logits(const Workload& w, const Fp4Cache& cache, const Fp4Queries* fp4_q) {
  return fp4_logits(w, cache, fp4_q,
                    [&](std::int64_t r) { return w.block_table.data() + (r / w.next_n) * w.max_blocks; });
}

ReferenceLogits fp4_reference_logits(const VarlenWorkload& v, const Fp4Cache& cache, const Fp4Queries* fp4_q) {
  return fp4_logits(v.rows, cache, fp4_q, [&](std::int64_t r) {
    return v.table.data() + std::int64_t{v.row_request[static_cast<std::size_t>(r)]} * v.rows.max_blocks;
  });
}

}  // namespace dsa_test
