#include "common/reference.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>

namespace dsa_test {
namespace {

constexpr std::uint8_t kE4m3NanCode = 0x7F;
constexpr std::uint8_t kE4m3MaxCode = 0x7E;  // 448
constexpr std::uint8_t kE4m3SignBit = 0x80;

// Values of the non-negative finite codes 0x00 .. 0x7E, increasing with the code.
std::array<double, kE4m3MaxCode + 1> positive_e4m3_values() {
  std::array<double, kE4m3MaxCode + 1> values{};
  for (int code = 0; code <= kE4m3MaxCode; ++code) values[code] = e4m3_decode(static_cast<std::uint8_t>(code));
  return values;
}

std::uint32_t bits_of(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

float float_of(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

double ranking_key(float v) {
  return std::isnan(v) ? -std::numeric_limits<double>::infinity() : static_cast<double>(v);
}

}  // namespace

float e4m3_decode(std::uint8_t code) {
  const bool negative = (code & kE4m3SignBit) != 0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  double magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = mantissa / 8.0 * std::pow(2.0, -6);
  } else {
    magnitude = (1.0 + mantissa / 8.0) * std::pow(2.0, exponent - 7);
  }
  return static_cast<float>(negative ? -magnitude : magnitude);
}

std::uint8_t e4m3_encode(float x) {
  static const std::array<double, kE4m3MaxCode + 1> values = positive_e4m3_values();
  const std::uint8_t sign = std::signbit(x) ? kE4m3SignBit : 0;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | kE4m3NanCode);
  const double a = std::fabs(static_cast<double>(x));
  if (a >= values[kE4m3MaxCode]) return static_cast<std::uint8_t>(sign | kE4m3MaxCode);
  // The two codes around `a`; the table is sorted, so the nearest is one of them.
  const auto upper = std::upper_bound(values.begin(), values.end(), a);
  const int hi = static_cast<int>(upper - values.begin());
  const int lo = hi - 1;
  const double to_lo = a - values[lo];
  const double to_hi = values[hi] - a;
  int best;
  if (to_lo < to_hi) {
    best = lo;
  } else if (to_hi < to_lo) {
    best = hi;
  } else {
    best = (lo % 2 == 0) ? lo : hi;  // the even mantissa
  }
  return static_cast<std::uint8_t>(sign | best);
}

float bf16_decode(std::uint16_t bits) { return float_of(std::uint32_t{bits} << 16); }

std::uint16_t bf16_encode(float x) {
  const std::uint32_t u = bits_of(x);
  if (std::isnan(x)) return static_cast<std::uint16_t>((u >> 16) | 0x0040);
  if (std::isinf(x)) return static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t toward_zero = static_cast<std::uint16_t>(u >> 16);
  const std::uint16_t away = static_cast<std::uint16_t>(toward_zero + 1);
  const double a = std::fabs(static_cast<double>(x));
  const double lo = std::fabs(static_cast<double>(bf16_decode(toward_zero)));
  // The candidate one step away may be the infinity code; for rounding it
  // stands at 2^128, where the next exponent would start.
  const float away_value = bf16_decode(away);
  const double hi = std::isinf(away_value) ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(away_value));
  if (a - lo < hi - a) return toward_zero;
  if (hi - a < a - lo) return away;
  return (toward_zero & 1) == 0 ? toward_zero : away;
}

float bf16_round(float x) { return bf16_decode(bf16_encode(x)); }

float quantization_scale(float amax, bool power_of_two) {
  const float clamped = std::max(amax, 1e-4f);
  const float scale = clamped / 448.0f;
  if (!power_of_two) return scale;
  double p = 1.0;
  while (p < scale) p *= 2.0;
  while (p / 2.0 >= scale) p /= 2.0;
  return static_cast<float>(p);
}

void store_token(const float* key, std::int64_t slot, const CacheGeometry& geometry,
                 bool power_of_two_scales, std::uint8_t* cache) {
  float amax = 0.0f;
  for (int d = 0; d < geometry.head_dim; ++d) amax = std::max(amax, std::fabs(key[d]));
  const float scale = quantization_scale(amax, power_of_two_scales);
  std::uint8_t* key_bytes = cache + geometry.key_byte(slot);
  for (int d = 0; d < geometry.head_dim; ++d) key_bytes[d] = e4m3_encode(key[d] / scale);
  std::memcpy(cache + geometry.scale_byte(slot), &scale, sizeof scale);
}

float cached_scale(const std::uint8_t* cache, const CacheGeometry& geometry, std::int64_t slot) {
  float scale;
  std::memcpy(&scale, cache + geometry.scale_byte(slot), sizeof scale);
  return scale;
}

float cached_key(const std::uint8_t* cache, const CacheGeometry& geometry, std::int64_t slot,
                 int d) {
  return e4m3_decode(cache[geometry.key_byte(slot) + d]);
}

float default_weight_scale(int heads, int head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(heads) * head_dim));
}

float query_scale(const float* q_head, int head_dim, bool power_of_two_scales) {
  float amax = 0.0f;
  for (int d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(q_head[d]));
  return quantization_scale(amax, power_of_two_scales);
}

void quantize_queries(const float* q, const float* gate, std::int64_t rows, int heads,
                      int head_dim, bool power_of_two_scales, float weight_scale,
                      std::uint8_t* q_fp8, float* weights) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const std::int64_t offset = (r * heads + h) * head_dim;
      const float scale = query_scale(q + offset, head_dim, power_of_two_scales);
      for (int d = 0; d < head_dim; ++d) q_fp8[offset + d] = e4m3_encode(q[offset + d] / scale);
      weights[r * heads + h] = gate[r * heads + h] * scale * weight_scale;
    }
  }
}

std::vector<std::int32_t> causal_lens(const std::vector<std::int32_t>& prefix, int next_n) {
  std::vector<std::int32_t> out;
  for (const std::int32_t p : prefix)
    for (int j = 0; j < next_n; ++j) out.push_back(p + j + 1);
  return out;
}

std::vector<std::int32_t> expanded_lens(const std::vector<std::int32_t>& prefix, int next_n) {
  std::vector<std::int32_t> out;
  for (const std::int32_t p : prefix)
    for (int j = 0; j < next_n; ++j) out.push_back(p + next_n);
  return out;
}

std::vector<std::int32_t> legacy_lens(const std::vector<std::int32_t>& lens, int next_n) {
  std::vector<std::int32_t> out;
  for (const std::int32_t len : lens)
    for (int j = 0; j < next_n; ++j) out.push_back(std::max(0, len - next_n + j + 1));
  return out;
}

namespace {

// sum_h w[h] * max(0, scale * sum_d q[h][d] * key[d]) in float64, and into
// *magnitude sum_h |w[h]| * |scale| * sum_d |q[h][d] * key[d]|.
double score_key(const double* q, const double* key, double scale, const float* weights, int H, int D,
                 double* magnitude) {
  double sum = 0.0;
  *magnitude = 0.0;
  for (int h = 0; h < H; ++h) {
    double dot = 0.0, dot_magnitude = 0.0;
    for (int d = 0; d < D; ++d) {
      dot += q[h * D + d] * key[d];
      dot_magnitude += std::fabs(q[h * D + d] * key[d]);
    }
    const double w = weights[h];
    sum += w * std::max(0.0, scale * dot);
    *magnitude += std::fabs(w) * std::fabs(scale) * dot_magnitude;
  }
  return sum;
}

}  // namespace

ReferenceLogits reference_logits(const LogitsInputs& in, std::int64_t max_context_len) {
  const std::int64_t rows = in.batch * in.next_n;
  const int H = in.heads, D = in.head_dim;
  ReferenceLogits out;
  out.rows = rows;
  out.cols = max_context_len;
  out.value.assign(static_cast<std::size_t>(rows * max_context_len),
                   std::numeric_limits<double>::quiet_NaN());
  out.magnitude.assign(out.value.size(), 0.0);

  std::vector<double> q(static_cast<std::size_t>(H) * D);
  std::vector<double> key(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < in.batch; ++b) {
    for (int j = 0; j < in.next_n; ++j) {
      const std::int64_t r = b * in.next_n + j;
      const std::int64_t length = in.context_lens[r];
      for (std::int64_t i = 0; i < std::int64_t{H} * D; ++i) q[i] = e4m3_decode(in.q_fp8[r * H * D + i]);
      for (std::int64_t p = 0; p < length; ++p) {
        const std::int64_t table_row = in.row_request != nullptr ? in.row_request[r] : b;
        const std::int64_t slot = in.geometry.position_slot(in.block_table + table_row * in.max_blocks, p);
        const double scale = cached_scale(in.cache, in.geometry, slot);
        for (int d = 0; d < D; ++d) key[d] = cached_key(in.cache, in.geometry, slot, d);
        const std::size_t at = static_cast<std::size_t>(r * max_context_len + p);
        out.value[at] = score_key(q.data(), key.data(), scale, in.weights + r * H, H, D, &out.magnitude[at]);
      }
    }
  }
  return out;
}

ReferenceLogits reference_mqa_logits(const MqaInputs& in) {
  const int H = in.heads, D = in.head_dim;
  ReferenceLogits out;
  out.rows = in.rows;
  out.cols = in.num_keys;
  out.value.assign(static_cast<std::size_t>(in.rows * in.num_keys), std::numeric_limits<double>::quiet_NaN());
  out.magnitude.assign(out.value.size(), 0.0);
  std::vector<double> q(static_cast<std::size_t>(H) * D);
  std::vector<double> key(static_cast<std::size_t>(D));
  for (std::int64_t i = 0; i < in.rows; ++i) {
    for (std::int64_t e = 0; e < std::int64_t{H} * D; ++e) q[e] = e4m3_decode(in.q_fp8[i * H * D + e]);
    for (std::int64_t j = in.ks[i]; j < in.ke[i]; ++j) {
      for (int d = 0; d < D; ++d) key[d] = e4m3_decode(in.keys[j * D + d]);
      const std::size_t at = static_cast<std::size_t>(i * in.num_keys + j);
      out.value[at] = score_key(q.data(), key.data(), in.key_scales[j], in.weights + i * H, H, D, &out.magnitude[at]);
    }
  }
  return out;
}

bool ranks_before(float a, std::int64_t pa, float b, std::int64_t pb) {
  const double ka = ranking_key(a), kb = ranking_key(b);
  if (ka != kb) return ka > kb;
  return pa < pb;
}

std::vector<std::int32_t> reference_topk(const float* values, std::int64_t length, int k) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(k), -1);
  if (length <= k) {
    for (std::int64_t p = 0; p < length; ++p) out[p] = static_cast<std::int32_t>(p);
    return out;
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(length));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int32_t x, std::int32_t y) {
    return ranks_before(values[x], x, values[y], y);
  });
  std::copy(order.begin(), order.begin() + k, out.begin());
  return out;
}

namespace {

struct ScheduleModel {
  std::vector<std::int64_t> items;        // items of each unit
  std::vector<std::int64_t> items_until;  // items of the units before each unit
  std::int64_t total = 0;
  // What entering a unit weighs in the split: 2 for units of at most two
  // rows, else 0.
  std::int64_t entry = 0;
  // The split's weight positions laid end to end, each as the index of the
  // item it names: a unit of n > 0 items contributes its first item
  // 1 + entry times, then each later item once (weight n + entry).
  std::vector<std::int64_t> named_item;

  std::int64_t units() const { return static_cast<std::int64_t>(items.size()); }
  // Items strictly before (unit, chunk) in (unit, chunk) order.
  std::int64_t items_before(std::int64_t unit, std::int64_t chunk) const {
    if (unit >= units()) return total;
    if (unit < 0) return 0;
    return items_until[unit] + std::clamp<std::int64_t>(chunk, 0, items[unit]);
  }
};

ScheduleModel model_schedule(const std::vector<std::int32_t>& lens, std::int64_t batch, int next_n,
                             bool per_token) {
  constexpr std::int64_t kChunk = 256;
  ScheduleModel model;
  model.entry = (per_token || next_n <= 2) ? 2 : 0;
  const std::int64_t units = per_token ? batch * next_n : batch;
  for (std::int64_t u = 0; u < units; ++u) {
    std::int64_t length = 0;
    if (per_token) {
      length = std::max<std::int32_t>(lens[u], 0);
    } else {
      for (int j = 0; j < next_n; ++j) length = std::max<std::int64_t>(length, lens[u * next_n + j]);
    }
    model.items_until.push_back(model.total);
    model.items.push_back((length + kChunk - 1) / kChunk);
    for (std::int64_t c = 0; c < model.items.back(); ++c) {
      const std::int64_t copies = c == 0 ? 1 + model.entry : 1;
      for (std::int64_t i = 0; i < copies; ++i) model.named_item.push_back(model.total + c);
    }
    model.total += model.items.back();
  }
  return model;
}

bool entry_before(const std::int32_t* a, const std::int32_t* b) {
  return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]);
}

// Walks worker w's range, calling visit(unit, chunk) for every existing item.
template <typename Visit>
void walk_worker(const std::int32_t* schedule, int w, int num_workers, const ScheduleModel& model,
                 Visit&& visit) {
  std::int64_t unit = std::max<std::int32_t>(schedule[2 * w], 0);
  std::int64_t chunk = unit == schedule[2 * w] ? std::max<std::int32_t>(schedule[2 * w + 1], 0) : 0;
  const std::int64_t end_unit = w + 1 < num_workers ? schedule[2 * (w + 1)] : model.units();
  const std::int64_t end_chunk = w + 1 < num_workers ? schedule[2 * (w + 1) + 1] : 0;
  while (unit < model.units() && (unit < end_unit || (unit == end_unit && chunk < end_chunk))) {
    if (chunk >= model.items[unit]) {
      ++unit;
      chunk = 0;
      continue;
    }
    visit(unit, chunk);
    ++chunk;
  }
}

}  // namespace

std::string check_schedule(const std::int32_t* schedule, int num_workers,
                           const std::vector<std::int32_t>& context_lens, std::int64_t batch,
                           int next_n, bool per_token) {
  const ScheduleModel model = model_schedule(context_lens, batch, next_n, per_token);
  std::ostringstream error;
  const std::int32_t* trailer = schedule + 2 * num_workers;
  if (trailer[0] != model.units() || trailer[1] != 256) {
    error << "trailer is (" << trailer[0] << ", " << trailer[1] << "), expected (" << model.units()
          << ", 256)";
    return error.str();
  }
  for (int w = 0; w < num_workers; ++w) {
    const std::int32_t* entry = schedule + 2 * w;
    if (w + 1 < num_workers && entry_before(schedule + 2 * (w + 1), entry)) {
      error << "worker " << w + 1 << " starts before worker " << w;
      return error.str();
    }
    const auto positions = static_cast<std::int64_t>(model.named_item.size());
    const std::int64_t position = w * positions / num_workers;
    const std::int64_t want = position < positions ? model.named_item[position] : 0;
    const std::int64_t got = model.items_before(entry[0], entry[1]);
    if (got != want) {
      error << "worker " << w << " starts at (" << entry[0] << ", " << entry[1] << ") = item " << got
            << ", expected item " << want << " of " << model.total << " (weight position " << position
            << " of " << positions << ")";
      return error.str();
    }
    if (entry[0] < 0 || entry[0] > model.units() || entry[1] < 0) {
      error << "worker " << w << " starts at (" << entry[0] << ", " << entry[1]
            << "), outside the " << model.units() << " units";
      return error.str();
    }
  }
  std::vector<std::vector<int>> covered(model.items.size());
  for (std::size_t u = 0; u < covered.size(); ++u) covered[u].assign(model.items[u], 0);
  for (int w = 0; w < num_workers; ++w)
    walk_worker(schedule, w, num_workers, model,
                [&](std::int64_t unit, std::int64_t chunk) { ++covered[unit][chunk]; });
  for (std::size_t u = 0; u < covered.size(); ++u) {
    for (std::size_t c = 0; c < covered[u].size(); ++c) {
      if (covered[u][c] != 1) {
        error << "item (" << u << ", " << c << ") covered " << covered[u][c] << " times";
        return error.str();
      }
    }
  }
  return {};
}

std::vector<WorkerShare> worker_shares(const std::int32_t* schedule, int num_workers,
                                       const std::vector<std::int32_t>& context_lens, std::int64_t batch,
                                       int next_n, bool per_token) {
  const ScheduleModel model = model_schedule(context_lens, batch, next_n, per_token);
  std::vector<WorkerShare> shares(static_cast<std::size_t>(num_workers));
  for (int w = 0; w < num_workers; ++w) {
    std::int64_t last_unit = -1;
    walk_worker(schedule, w, num_workers, model, [&](std::int64_t unit, std::int64_t) {
      ++shares[w].items;
      ++shares[w].weight;
      if (unit != last_unit) shares[w].weight += model.entry;
      last_unit = unit;
    });
  }
  return shares;
}

std::int64_t split_weight(const std::vector<std::int32_t>& context_lens, std::int64_t batch, int next_n,
                          bool per_token) {
  return static_cast<std::int64_t>(model_schedule(context_lens, batch, next_n, per_token).named_item.size());
}

}  // namespace dsa_test
