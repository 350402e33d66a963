#include "backend.hpp"
#include "cpu/parallel.hpp"
#include "cpu/quantize.hpp"

namespace dsa::detail::cpu {
namespace {

// Quantizes the H heads of row r = b * next_n + j and writes its weights.
void quantize_row(const QuantizeQueriesProblem& p, std::int64_t row) {
  const std::int64_t b = row / p.next_n, j = row % p.next_n;
  for (std::int64_t h = 0; h < p.heads; ++h) {
    const void* q = element_address(p.q, p.q_dtype, b * p.q_stride_b + j * p.q_stride_n + h * p.q_stride_h);
    std::uint8_t* q_fp8 = p.q_fp8 + b * p.q_fp8_stride_b + j * p.q_fp8_stride_n + h * p.q_fp8_stride_h;
    const float q_scale = quantize_vector(q, p.q_dtype, p.head_dim, p.power_of_two_scales, q_fp8);
    const float gate = load_element(p.gate, p.gate_dtype, row * p.gate_stride_row + h * p.gate_stride_h);
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
