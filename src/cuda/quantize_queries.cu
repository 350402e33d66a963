// quantize_queries and quantize_queries_fp4 on CUDA: one warp quantizes one
// (row, head) query vector and writes its head weight (with the fp8 scale
// folded in).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend.hpp"
#include "cuda/grid_dependency.cuh"
#include "cuda/launch_utils.hpp"
#include "cuda/quantization.cuh"

namespace dsa::detail::cuda {

namespace {

constexpr int kQuantizeThreads = 256;
constexpr int kVectorsPerBlock = kQuantizeThreads / kWarpSize;

__global__ void __launch_bounds__(kQuantizeThreads) quantize_queries_kernel(QuantizeQueriesProblem p) {
  enter_dependent_grid();
  const int lane = threadIdx.x % kWarpSize;
  const std::int64_t vectors = p.batch * p.next_n * p.heads;
  const std::size_t q_element = p.q_dtype == DType::bfloat16 ? 2 : 4;
  for (std::int64_t v = blockIdx.x * std::int64_t{kVectorsPerBlock} + threadIdx.x / kWarpSize;
       v < vectors; v += std::int64_t{gridDim.x} * kVectorsPerBlock) {
    const std::int64_t h = v % p.heads;
    const std::int64_t row = v / p.heads;  // b * next_n + j
    const std::int64_t b = row / p.next_n;
    const std::int64_t j = row % p.next_n;
    const void* q = static_cast<const unsigned char*>(p.q) +
                    (b * p.q_stride_b + j * p.q_stride_n + h * p.q_stride_h) * q_element;
    std::uint8_t* codes = p.q_codes + b * p.q_codes_stride_b + j * p.q_codes_stride_n + h * p.q_codes_stride_h;
    const float gate = load_float_or_bf16(p.gate, p.gate_dtype, row * p.gate_stride_row + h * p.gate_stride_h);
    if (p.fp4()) {
      // The block scales stay with the codes; the weight is the gate's alone.
      const std::uint32_t scales = warp_quantize_fp4_vector(q, p.q_dtype, codes, lane);
      if (lane == 0) {
        p.q_block_scales[b * p.q_scales_stride_b + j * p.q_scales_stride_n + h * p.q_scales_stride_h] =
            static_cast<std::int32_t>(scales);
        p.weights[row * p.weights_stride_row + h] = gate * p.weight_scale;
      }
      continue;
    }
    const float scale = warp_vector_scale(q, p.q_dtype, p.head_dim, p.power_of_two_scales, lane);
    warp_quantize_vector(q, p.q_dtype, p.head_dim, scale, codes, lane);
    if (lane == 0) p.weights[row * p.weights_stride_row + h] = gate * scale * p.weight_scale;
  }
}

}  // namespace

Status quantize_queries(const QuantizeQueriesProblem& p, const ExecContext& ctx) {
  const std::int64_t vectors = p.batch * p.next_n * p.heads;
  if (vectors == 0) return Status::success();
  return launch_kernel("quantize_queries_kernel", quantize_queries_kernel,
                       {grid_for(vectors, kVectorsPerBlock), kQuantizeThreads}, ctx, p);
}

}  // namespace dsa::detail::cuda
