// Small host-side helpers shared by the CUDA entry points: the stream and the
// error record of an ExecContext, workspace alignment and launch geometry.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend.hpp"
#include "common/device_error.hpp"
#include "cuda/cuda_check.hpp"

namespace dsa::detail::cuda {

inline cudaStream_t stream_of(const ExecContext& ctx) {
  return static_cast<cudaStream_t>(ctx.stream);
}

// The error record at the start of the workspace (validation guarantees at
// least kDeviceErrorRecordBytes of workspace for CUDA operations).
inline DeviceErrorRecord* error_record(const ExecContext& ctx) {
  return static_cast<DeviceErrorRecord*>(ctx.workspace.data);
}

// Rounds a byte count up to the workspace alignment.
inline std::size_t align_workspace(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// CTAs of `kernel` (of `threads` threads and `shared_bytes` of dynamic
// shared memory) that device `device` holds at once; 0 when unknown.
template <typename Kernel>
std::int64_t resident_blocks(Kernel kernel, int threads, std::size_t shared_bytes, int device) {
  int multiprocessors = 0;
  int per_multiprocessor = 0;
  if (cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) !=
          cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, threads,
                                                    shared_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return std::int64_t{multiprocessors} * per_multiprocessor;
}

// Grid size for a grid-stride loop over `count` elements.
inline unsigned grid_for(std::int64_t count, int threads_per_block, unsigned max_blocks = 65535u) {
  const std::int64_t blocks = (count + threads_per_block - 1) / threads_per_block;
  if (blocks < 1) return 1u;
  return blocks > max_blocks ? max_blocks : static_cast<unsigned>(blocks);
}

}  // namespace dsa::detail::cuda
