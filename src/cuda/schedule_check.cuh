// The scoring kernels' share of the schedule agreement check.
#pragma once

#include <cstdint>

#include "common/device_error.hpp"
#include "common/schedule_walk.hpp"
#include "cuda/device_error.cuh"

namespace dsa::detail::cuda {

// Worker `worker` checks its own entry and worker 0 the trailer too, against
// schedule_entry_agrees; a broken entry is reported as (entry, unit, chunk).
// One thread per worker calls it.
__device__ __forceinline__ void check_schedule_share(const std::int32_t* schedule, int worker,
                                                     int num_workers, std::int64_t units,
                                                     DeviceErrorRecord* record) {
  const auto check = [&](int entry) {
    if (schedule_entry_agrees(schedule, entry, num_workers, units)) return;
    const WorkItem item = schedule_entry(schedule, entry);
    report_device_error(record, kScheduleMismatch, entry, item.unit, item.chunk);
  };
  check(worker);
  if (worker == 0) check(num_workers);
}

}  // namespace dsa::detail::cuda
