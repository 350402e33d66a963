// Warp-wide reductions and scans shared by the CUDA kernels (quantization,
// the scoring producers, list appends, the top-k's narrowing).
#pragma once

namespace dsa::detail::cuda {

// The lanes below this one in its warp, as a mask.
__device__ inline unsigned lanes_below() { return (1u << (threadIdx.x & 31u)) - 1u; }

// `value` combined over the warp by `op` (associative and commutative), in
// every lane; the whole warp calls it. T is any type __shfl_xor_sync moves.
template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    value = op(value, __shfl_xor_sync(0xffffffffu, value, offset));
  }
  return value;
}
template <typename T>
__device__ __forceinline__ T warp_max(T value) {
  return warp_reduce(value, [](T a, T b) { return max(a, b); });
}
template <typename T>
__device__ __forceinline__ T warp_min(T value) {
  return warp_reduce(value, [](T a, T b) { return min(a, b); });
}
template <typename T>
__device__ __forceinline__ T warp_sum(T value) {
  return warp_reduce(value, [](T a, T b) { return a + b; });
}

// Sum of `value` over this lane and the lanes below it; the whole warp calls it.
template <typename T>
__device__ inline T warp_inclusive_sum(T value) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const T other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

// Where the needed-th largest item of a histogram of 256 bins (bin 255
// holding the largest items) lies: its bin, the items in higher bins, and
// its bin's count. Lane l reads bins 255 - 8 l down to 248 - 8 l, so the
// lanes in order scan from the top. The whole warp calls it with the same
// `needed`, between 1 and the histogram's total.
struct BinFromTop {
  int bin;
  int above;
  int count;
};

__device__ inline BinFromTop warp_bin_from_top(const int* histogram, int needed) {
  constexpr int kBins = 256;
  constexpr int kBinsPerLane = kBins / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  int counts[kBinsPerLane];
  int sum = 0;
#pragma unroll
  for (int m = 0; m < kBinsPerLane; ++m) {
    counts[m] = histogram[kBins - 1 - kBinsPerLane * lane - m];
    sum += counts[m];
  }
  const int inclusive = warp_inclusive_sum(sum);
  const int before = inclusive - sum;
  const unsigned holder = __ballot_sync(0xffffffffu, before < needed && needed <= inclusive);
  const int source = __ffs(static_cast<int>(holder)) - 1;
  BinFromTop found{0, 0, 0};
  if (lane == source) {
    int running = before;
#pragma unroll
    for (int m = 0; m < kBinsPerLane; ++m) {
      if (found.count == 0 && running + counts[m] >= needed) {
        found = {kBins - 1 - kBinsPerLane * lane - m, running, counts[m]};
      }
      running += counts[m];
    }
  }
  found.bin = __shfl_sync(0xffffffffu, found.bin, source);
  found.above = __shfl_sync(0xffffffffu, found.above, source);
  found.count = __shfl_sync(0xffffffffu, found.count, source);
  return found;
}

}  // namespace dsa::detail::cuda
