// Small host-side helpers shared by the CUDA entry points: the stream and the
// error record of an ExecContext, workspace alignment, launch geometry and
// the one function that launches every kernel of the backend.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

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

// Devices whose answers OncePerDevice keeps; a device beyond is asked afresh.
inline constexpr int kRememberedDevices = 64;

// A value computed once per device for the process. It holds answers that
// cannot change while the process runs (an attribute, once set on a kernel,
// stays set; an occupancy depends on the kernel, its launch shape and the
// device alone), each a runtime call the launch path then skips.
template <typename Value>
class OncePerDevice {
 public:
  template <typename Compute>
  Value get(int device, Compute&& compute) {
    if (device < 0 || device >= kRememberedDevices) return compute();
    std::call_once(computed_[device], [&] { values_[device] = compute(); });
    return values_[device];
  }

 private:
  std::once_flag computed_[kRememberedDevices];
  Value values_[kRememberedDevices]{};
};

// The calling thread's current device (the operation's, inside its scope).
inline int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return device;
}

// Lets kKernel launch with up to `bytes` of dynamic shared memory on the
// current device, setting the attribute once per device: `bytes` must be the
// same at every call for a kernel and device.
template <auto kKernel>
Status allow_shared_bytes(std::size_t bytes) {
  static OncePerDevice<cudaError_t> attribute_set;
  const cudaError_t error = attribute_set.get(current_device(), [&] {
    const cudaError_t set =
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    cudaGetLastError();
    return set;
  });
  return cuda_status(error, "cudaFuncSetAttribute(max dynamic shared memory)");
}

// CTAs of kKernel (of `threads` threads and `shared_bytes` of dynamic shared
// memory, the same at every call) that device `device` holds at once; 0 when
// unknown. Asked once per device.
template <auto kKernel>
std::int64_t resident_blocks(int threads, std::size_t shared_bytes, int device) {
  static OncePerDevice<std::int64_t> resident;
  return resident.get(device, [&]() -> std::int64_t {
    int multiprocessors = 0;
    int per_multiprocessor = 0;
    if (cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kKernel, threads, shared_bytes) !=
            cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return std::int64_t{multiprocessors} * per_multiprocessor;
  });
}

// Grid size for a grid-stride loop over `count` elements.
inline unsigned grid_for(std::int64_t count, int threads_per_block, unsigned max_blocks = 65535u) {
  const std::int64_t blocks = (count + threads_per_block - 1) / threads_per_block;
  if (blocks < 1) return 1u;
  return blocks > max_blocks ? max_blocks : static_cast<unsigned>(blocks);
}

// What one kernel launch runs: its grid, CTAs, dynamic shared memory and,
// with cluster_ctas > 1, thread-block clusters of that many CTAs along x.
struct LaunchShape {
  dim3 grid;
  dim3 block;
  std::size_t shared_bytes = 0;
  unsigned cluster_ctas = 1;
};

// The launch attribute asking for clusters of `ctas` CTAs along x.
inline cudaLaunchAttribute cluster_attribute(unsigned ctas) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = ctas;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  return attribute;
}

// True when the code `kernel` runs on the current device was compiled for
// compute capability 9.0 or newer, where its enter_dependent_grid()
// (grid_dependency.cuh) waits; older targets (the generic PTX compiled just
// in time on a newer GPU, say) compile that wait to nothing.
template <typename Kernel>
bool waits_for_prior_grids(Kernel* kernel) {
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, kernel) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.ptxVersion >= 90;
}

// Launches kernel(args...) with `shape` on ctx.stream; every kernel of the
// CUDA backend is launched here. With ctx.programmatic_dependent_launch,
// and where the kernel's code waits (waits_for_prior_grids), the launch
// asks for programmatic stream serialization: the kernel may start while
// the one before it on the stream finishes, and waits on the device
// (enter_dependent_grid) before touching memory. `name` names the kernel in
// the error of a failed launch.
template <typename... Params, typename... Args>
Status launch_kernel(const char* name, void (*kernel)(Params...), const LaunchShape& shape,
                     const ExecContext& ctx, Args&&... args) {
  cudaLaunchAttribute attributes[2];
  unsigned count = 0;
  if (shape.cluster_ctas > 1) attributes[count++] = cluster_attribute(shape.cluster_ctas);
  if (ctx.programmatic_dependent_launch && waits_for_prior_grids(kernel)) {
    cudaLaunchAttribute overlap{};
    overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    overlap.val.programmaticStreamSerializationAllowed = 1;
    attributes[count++] = overlap;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = shape.grid;
  config.blockDim = shape.block;
  config.dynamicSmemBytes = shape.shared_bytes;
  config.stream = stream_of(ctx);
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t error = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (error == cudaSuccess) return Status::success();
  cudaGetLastError();  // the call's Status carries it; later checks start clean
  return cuda_status(error, (std::string("launch of ") + name).c_str());
}

}  // namespace dsa::detail::cuda
