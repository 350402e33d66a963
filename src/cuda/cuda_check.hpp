// Turning CUDA runtime errors into dsa::Status, for every CUDA source file.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "dsa/status.hpp"

namespace dsa::detail::cuda {

// ok for cudaSuccess, otherwise cuda_error naming the failed call.
inline Status cuda_status(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return Status::success();
  return {ErrorCode::cuda_error, std::string(call) + " failed: " + cudaGetErrorName(error) + " (" +
                                     cudaGetErrorString(error) + ")"};
}

// The launch error of the kernel launched last on this thread, if any.
inline Status launch_status(const char* kernel) {
  return cuda_status(cudaGetLastError(), kernel);
}

}  // namespace dsa::detail::cuda

// Returns a cuda_error Status from the enclosing function when `call` fails.
#define DSA_CUDA_CHECK(call) \
  DSA_RETURN_IF_ERROR(::dsa::detail::cuda::cuda_status((call), #call))

// Returns a cuda_error Status when the preceding kernel launch failed.
#define DSA_CUDA_CHECK_LAUNCH(kernel_name) \
  DSA_RETURN_IF_ERROR(::dsa::detail::cuda::launch_status("launch of " kernel_name))
