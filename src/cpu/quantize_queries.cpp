#include "backend.hpp"
#include "cpu/parallel.hpp"
#include "cpu/quantize.hpp"

namespace dsa::detail::cpu {
namespace {

// Quantizes the H heads of row r = b * next_n + j (fp8, or fp4 codes and
// block scales) and writes its weights.
void quantize_row(const QuantizeQueriesProblem& p, std::int64_t row) {
  const std::int64_t b = row / p.next_n, j = row % p.next_n;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const void* q = element_address(p.q, p.q_dtype, b * p.q_stride_b + j * p.q_stride_n + h * p.q_stride_h);
    std::uint8_t* codes = p.q_codes + b * p.q_codes_stride_b + j * p.q_codes_stride_n + h * p.q_codes_stride_h;
    const float gate = load_element(p.gate, p.gate_dtype, row * p.gate_stride_row + h * p.gate_stride_h);
    if (p.fp4()) {
      // The block scales stay with the codes; the weight is the gate's alone.
      p.q_block_scales[b * p.q_scales_stride_b + j * p.q_scales_stride_n + h * p.q_scales_stride_h] =
          static_cast<std::int32_t>(quantize_fp4_vector(q, p.q_dtype, p.head_dim, codes));
      p.weights[row * p.weights_stride_row + h] = gate * p.weight_scale;
      continue;
    }
    const float q_scale = quantize_vector(q, p.q_dtype, p.head_dim, p.power_of_two_scales, codes);
    p.weights[row * p.weights_stride_row + h] = gate * q_scale * p.weight_scale;
  }
}

}  // namespace

Status quantize_queries(const QuantizeQueriesProblem& p, bool parallel, const ExecContext& ctx) {
  const std::int64_t rows = p.batch * p.next_n;
  if (parallel) {
    parallel_for_items(rows, ctx, [&](std::int64_t row, int) { quantize_row(p, row); });
  } else {
    for (std::int64_t row = 0; row < rows; ++row) quantize_row(p, row);
  }
  return Status::success();
}

}  // namespace dsa::detail::cpu
