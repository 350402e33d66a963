// Warp-wide scans shared by the kernels that append to lists.
#pragma once

namespace dsa::detail::cuda {

// The lanes below this one in its warp, as a mask.
__device__ inline unsigned lanes_below() { return (1u << (threadIdx.x & 31u)) - 1u; }

// Sum of `value` over this lane and the lanes below it; the whole warp calls it.
__device__ inline int warp_inclusive_sum(int value) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

}  // namespace dsa::detail::cuda
