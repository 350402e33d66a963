// Backend-wide CUDA entry points: device capabilities, the operations'
// prologue, the error record and the choice between the Hopper and the
// generic logits kernels.
#include <cuda_runtime.h>

#include "backend.hpp"
#include "common/device_error.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/device_error.cuh"
#include "cuda/grid_dependency.cuh"
#include "cuda/hopper/logits_sm90.hpp"
#include "cuda/hopper/prefill_sm90.hpp"
#include "cuda/launch_utils.hpp"
#include "cuda/logits_generic.hpp"

namespace dsa::detail::cuda {

namespace {

// Clears the error record under programmatic dependent launch. A kernel
// rather than a memset there, so that the operation's kernels overlap the end
// of the work before it: only kernels take part in the overlap, a memset
// between two operations would serialize them. It waits like every kernel,
// so whatever the previous operation recorded is written before the clear.
// Without the option a memset is the cheaper node (a kernel launch more per
// operation shows in small calls).
__global__ void clear_error_record_kernel(DeviceErrorRecord* record) {
  enter_dependent_grid();
  clear_error_record(record);
}

}  // namespace

std::size_t workspace_bytes_basic() { return kDeviceErrorRecordBytes; }

bool hopper_available(int device) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // an unusable device simply has no Hopper kernels
    return false;
  }
  // The library carries sm_90a machine code, which runs on compute capability 9.0 only.
  return major == 9 && minor == 0;
}

bool hopper_supports_native(int next_n, int heads, int head_dim) {
  return hopper::supports_native(next_n, heads, head_dim);
}

bool hopper_supports_mqa_logits(const MqaLogitsProblem& p) { return hopper::supports_mqa_logits(p); }

int multiprocessor_count(int device) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

Status OperationScope::enter(int device, const ExecContext& ctx, RecordClear clear) {
  DSA_RETURN_IF_ERROR(device_.enter(device));
  if (clear == RecordClear::by_first_kernel) return Status::success();
  if (!ctx.programmatic_dependent_launch) {
    return cuda_status(cudaMemsetAsync(error_record(ctx), 0, sizeof(DeviceErrorRecord), stream_of(ctx)),
                       "cudaMemsetAsync(error record)");
  }
  return launch_kernel("clear_error_record_kernel", clear_error_record_kernel, {1, 1}, ctx, error_record(ctx));
}

Status read_device_error(const ExecContext& ctx, const char* operation) {
  if (ctx.workspace.data == nullptr || ctx.workspace.bytes < sizeof(DeviceErrorRecord)) {
    return {ErrorCode::workspace_too_small,
            std::string(operation) + ": workspace has no room for the device error record"};
  }
  DeviceErrorRecord record{};
  DSA_CUDA_CHECK(cudaMemcpyAsync(&record, error_record(ctx), sizeof record, cudaMemcpyDeviceToHost,
                                 stream_of(ctx)));
  DSA_CUDA_CHECK(cudaStreamSynchronize(stream_of(ctx)));
  return decode_device_error(record, operation);
}

Status paged_mqa_logits(const LogitsProblem& p, bool hopper, const ExecContext& ctx) {
  return hopper ? hopper::paged_mqa_logits(p, ctx) : generic::paged_mqa_logits(p, ctx);
}

Status mqa_logits(const MqaLogitsProblem& p, bool hopper, const ExecContext& ctx) {
  return hopper ? hopper::mqa_logits(p, ctx) : generic::mqa_logits(p, ctx);
}

}  // namespace dsa::detail::cuda
