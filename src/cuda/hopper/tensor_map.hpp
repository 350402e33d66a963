// Tensor maps (the descriptors of bulk tensor copies) for the sm_90a kernels.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "dsa/status.hpp"

namespace dsa::detail::cuda::hopper {

// Encodes `map` over a uint8 tensor of `rank` dimensions at `base`
// (dimension 0 innermost and contiguous; strides[i] is dimension i + 1's, in
// bytes), copied in boxes of `box` elements that land in shared memory with
// the 128-byte swizzle the wgmma descriptors expect; elements past the
// tensor read as zero. `op` and `what` name the operation and the tensor in
// the error.
Status encode_swizzled_map(const char* op, const char* what, const void* base, int rank,
                           const std::uint64_t* dims, const std::uint64_t* strides,
                           const std::uint32_t* box, CUtensorMap* map);

// As encode_swizzled_map, the box landing in shared memory as it is, rows
// packed (fp4 codes, which the consumers read and rewrite themselves).
Status encode_plain_map(const char* op, const char* what, const void* base, int rank,
                        const std::uint64_t* dims, const std::uint64_t* strides,
                        const std::uint32_t* box, CUtensorMap* map);

}  // namespace dsa::detail::cuda::hopper
