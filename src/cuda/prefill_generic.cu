// The generic mqa_logits kernel: correct on every GPU the toolkit supports,
// for any head count and head dimension (D % 16 == 0).
//
// Block (x, y) serves rows x, x + gridDim.x, ... and, in each, the columns
// y * kThreads + t, stepping by gridDim.y * kThreads: every column below the
// row's width belongs to exactly one thread, which writes it once (a score,
// -inf with clean_logits, or NaN over a row whose range breaks a rule), and
// no thread touches a column at or past the width. A thread scores its key
// alone, reading the query and the key in 16-byte vectors: dot products over
// d in order, heads in order, so results are bitwise repeatable. The range
// rules (key_range_violation) are checked here, on the device: a violating
// row reads no key, and block (x, 0) records it. fp4 queries or keys are
// read value by value with their block scales applied (exact), the keys
// then of scale 1, as the CPU backends score them.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.hpp"
#include "common/logit_rules.hpp"
#include "common/number_formats.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/logits_generic.hpp"

namespace dsa::detail::cuda::generic {
namespace {

constexpr int kThreads = 128;
constexpr unsigned kMaxRowBlocks = 65535u;
constexpr unsigned kMaxColumnBlocks = 65535u;  // gridDim.y's limit

// acc + sum of the 16 products of two vectors of 16 e4m3 values, in order.
__device__ __forceinline__ float dot16(const uint4& a, const uint4& b, float acc) {
  const std::uint32_t wa[4] = {a.x, a.y, a.z, a.w};
  const std::uint32_t wb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int e = 0; e < 16; ++e) {
    const auto qa = static_cast<std::uint8_t>(wa[e / 4] >> (8 * (e % 4)));
    const auto kb = static_cast<std::uint8_t>(wb[e / 4] >> (8 * (e % 4)));
    acc = fmaf(e4m3_to_float(qa), e4m3_to_float(kb), acc);
  }
  return acc;
}

// Value d of a vector of fp8 codes, or of packed fp4 codes with its scale word.
__device__ __forceinline__ float vector_value(const std::uint8_t* codes, bool fp4, std::uint32_t scale_word, int d) {
  return fp4 ? fp4_element(codes, scale_word, d) : e4m3_to_float(codes[d]);
}

// score_key where the queries or the keys are fp4: dot products over d in
// order, heads in order.
__device__ float score_key_fp4(const MqaLogitsProblem& p, std::int64_t row, std::int64_t key) {
  const std::uint8_t* key_codes = p.keys + key * p.keys_stride;
  const bool fp4_keys = p.fp4_keys();
  const std::uint32_t key_word = fp4_keys ? p.key_scale_words[key * p.key_scales_stride] : 0u;
  const float scale = fp4_keys ? 1.0f : p.key_scales[key * p.key_scales_stride];
  const float* weights = p.weights + row * p.weights_stride_row;
  float logit = 0.0f;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const std::uint8_t* q = p.q + row * p.q_stride_row + h * p.q_stride_h;
    const std::uint32_t q_word =
        p.fp4_queries() ? p.q_scales[row * p.q_scales_stride_row + h * p.q_scales_stride_h] : 0u;
    float dot = 0.0f;
    for (int d = 0; d < p.head_dim; ++d) {
      dot = fmaf(vector_value(q, p.fp4_queries(), q_word, d), vector_value(key_codes, fp4_keys, key_word, d), dot);
    }
    logit = fmaf(weights[h], fmaxf(scale * dot, 0.0f), logit);
  }
  return logit;
}

// logit(row, key) of the mqa_logits formula; `key` is within [0, S_kv).
__device__ float score_key(const MqaLogitsProblem& p, std::int64_t row, std::int64_t key) {
  if (p.fp4_queries() || p.fp4_keys()) return score_key_fp4(p, row, key);
  const std::uint8_t* query = p.q + row * p.q_stride_row;
  const std::uint8_t* key_bytes = p.keys + key * p.keys_stride;
  const float scale = p.key_scales[key * p.key_scales_stride];
  const float* weights = p.weights + row * p.weights_stride_row;
  float logit = 0.0f;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const std::uint8_t* q = query + h * p.q_stride_h;
    float dot = 0.0f;
    for (int d = 0; d < p.head_dim; d += 16) {
      dot = dot16(*reinterpret_cast<const uint4*>(q + d), *reinterpret_cast<const uint4*>(key_bytes + d), dot);
    }
    // fmaxf gives 0 for NaN, as the reference's relu does.
    logit = fmaf(weights[h], fmaxf(scale * dot, 0.0f), logit);
  }
  return logit;
}

__global__ void __launch_bounds__(kThreads) mqa_logits_kernel(MqaLogitsProblem p, DeviceErrorRecord* record) {
  enter_dependent_grid();
  const std::int64_t width = p.width();
  for (std::int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const KeyRange range = mqa_key_range(p, row);
    const RowViolation violation = key_range_violation(p, range);
    const bool usable = violation.kind == kNoDeviceError;
    if (!usable && blockIdx.y == 0 && threadIdx.x == 0) {
      report_device_error(record, violation.kind, row, violation.value, violation.bound);
    }
    const KeyRange scored = usable ? mqa_scored_columns(p, range) : KeyRange{};
    for (std::int64_t c = std::int64_t{blockIdx.y} * kThreads + threadIdx.x; c < width;
         c += std::int64_t{gridDim.y} * kThreads) {
      if (!usable) {
        store_mqa_logit(p, row, c, invalid_logit());
      } else if (c >= scored.start && c < scored.end) {
        store_mqa_logit(p, row, c, score_key(p, row, mqa_column_key(p, range, c)));
      } else if (p.clean_logits) {
        store_mqa_logit(p, row, c, masked_logit());
      }
    }
  }
}

}  // namespace

Status mqa_logits(const MqaLogitsProblem& p, const ExecContext& ctx) {
  if (p.rows == 0) return Status::success();
  // At least one block per row even without columns: it records the row's violations.
  const dim3 grid(grid_for(p.rows, 1, kMaxRowBlocks), grid_for(p.width(), kThreads, kMaxColumnBlocks));
  return launch_kernel("mqa_logits_kernel", mqa_logits_kernel, {grid, kThreads}, ctx, p, error_record(ctx));
}

}  // namespace dsa::detail::cuda::generic
