// Device side of the error record (common/device_error.hpp): kernels call
// report_device_error() when they meet a data-dependent violation; the first
// report wins and later ones leave the record untouched.
#pragma once

#include <cstdint>

#include "common/device_error.hpp"

namespace dsa::detail::cuda {

__device__ __forceinline__ void report_device_error(DeviceErrorRecord* record, std::int32_t code,
                                                    std::int64_t a, std::int64_t b,
                                                    std::int64_t c) {
  if (record == nullptr) return;
  if (atomicCAS(&record->code, kNoDeviceError, code) == kNoDeviceError) {
    // The winner alone writes the arguments; the record is read only after
    // the kernel has finished, so no further ordering is needed.
    record->args[0] = static_cast<std::int32_t>(a);
    record->args[1] = static_cast<std::int32_t>(b);
    record->args[2] = static_cast<std::int32_t>(c);
  }
}

// Empties the record: what an operation does before its kernels record
// anything (after the wait for the work before it, grid_dependency.cuh).
__device__ __forceinline__ void clear_error_record(DeviceErrorRecord* record) {
  *record = DeviceErrorRecord{};
}

}  // namespace dsa::detail::cuda
