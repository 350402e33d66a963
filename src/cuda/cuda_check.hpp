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

}  // namespace dsa::detail::cuda

// Returns a cuda_error Status from the enclosing function when `call` fails.
#define DSA_CUDA_CHECK(call) \
  DSA_RETURN_IF_ERROR(::dsa::detail::cuda::cuda_status((call), #call))
