// include/dsa/device.hpp for builds with CUDA: device discovery and the
// RAII owners of device memory and streams; the backend's DeviceGuard.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "backend.hpp"
#include "cuda/cuda_check.hpp"
#include "dsa/device.hpp"

namespace dsa {

namespace detail::cuda {

DeviceGuard::~DeviceGuard() {
  if (restore_) cudaSetDevice(previous_);
}

Status DeviceGuard::enter(int device) {
  DSA_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    DSA_CUDA_CHECK(cudaSetDevice(device));
    restore_ = true;
  }
  return Status::success();
}

}  // namespace detail::cuda

using detail::cuda::DeviceGuard;

namespace {

Status check_device_index(int device, const char* operation) {
  const int count = cuda_device_count();
  if (device < 0 || device >= count) {
    return {ErrorCode::bad_device, std::string(operation) + ": device " + std::to_string(device) +
                                       " is not one of the " + std::to_string(count) +
                                       " CUDA devices"};
  }
  return Status::success();
}

}  // namespace

bool built_with_cuda() noexcept { return true; }

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error, just none
    return 0;
  }
  return count;
}

Status get_device_info(int device, DeviceInfo* info) {
  if (info == nullptr) return {ErrorCode::null_pointer, "get_device_info: info is null"};
  DSA_RETURN_IF_ERROR(check_device_index(device, "get_device_info"));
  cudaDeviceProp prop{};
  DSA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  info->name = prop.name;
  info->compute_major = prop.major;
  info->compute_minor = prop.minor;
  info->multiprocessors = prop.multiProcessorCount;
  info->global_memory_bytes = prop.totalGlobalMem;
  info->l2_cache_bytes = static_cast<std::size_t>(prop.l2CacheSize);
  info->shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  return Status::success();
}

// ---- DeviceBuffer -----------------------------------------------------------
// The synchronous helpers first wait for all work on the device: the
// library's streams are non-blocking, so a plain cudaMemcpy would not wait for
// kernels still running on them.

Status DeviceBuffer::allocate(std::size_t bytes, int device, DeviceBuffer* out) {
  if (out == nullptr) return {ErrorCode::null_pointer, "DeviceBuffer::allocate: out is null"};
  DSA_RETURN_IF_ERROR(check_device_index(device, "DeviceBuffer::allocate"));
  DeviceBuffer fresh;
  fresh.device_ = device;
  if (bytes > 0) {
    DeviceGuard guard;
    DSA_RETURN_IF_ERROR(guard.enter(device));
    DSA_CUDA_CHECK(cudaMalloc(&fresh.data_, bytes));
    fresh.bytes_ = bytes;
  }
  *out = std::move(fresh);
  return Status::success();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer discarded(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);  // cudaFree needs no current-device switch
}

namespace {
Status check_range(const char* operation, std::size_t offset, std::size_t bytes,
                   std::size_t capacity) {
  if (offset > capacity || bytes > capacity - offset) {
    return {ErrorCode::invalid_argument, std::string(operation) + ": " + std::to_string(bytes) +
                                             " bytes at offset " + std::to_string(offset) +
                                             " exceed the buffer's " + std::to_string(capacity) +
                                             " bytes"};
  }
  return Status::success();
}
}  // namespace

Status DeviceBuffer::copy_from_host(const void* src, std::size_t bytes, std::size_t offset) {
  DSA_RETURN_IF_ERROR(check_range("DeviceBuffer::copy_from_host", offset, bytes, bytes_));
  if (bytes == 0) return Status::success();
  if (src == nullptr) return {ErrorCode::null_pointer, "DeviceBuffer::copy_from_host: src is null"};
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(device_));
  DSA_CUDA_CHECK(cudaDeviceSynchronize());
  DSA_CUDA_CHECK(cudaMemcpy(static_cast<unsigned char*>(data_) + offset, src, bytes,
                            cudaMemcpyHostToDevice));
  return Status::success();
}

Status DeviceBuffer::copy_to_host(void* dst, std::size_t bytes, std::size_t offset) const {
  DSA_RETURN_IF_ERROR(check_range("DeviceBuffer::copy_to_host", offset, bytes, bytes_));
  if (bytes == 0) return Status::success();
  if (dst == nullptr) return {ErrorCode::null_pointer, "DeviceBuffer::copy_to_host: dst is null"};
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(device_));
  DSA_CUDA_CHECK(cudaDeviceSynchronize());
  DSA_CUDA_CHECK(cudaMemcpy(dst, static_cast<const unsigned char*>(data_) + offset, bytes,
                            cudaMemcpyDeviceToHost));
  return Status::success();
}

Status DeviceBuffer::fill_bytes(unsigned char value) {
  if (bytes_ == 0) return Status::success();
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(device_));
  DSA_CUDA_CHECK(cudaDeviceSynchronize());
  DSA_CUDA_CHECK(cudaMemset(data_, value, bytes_));
  DSA_CUDA_CHECK(cudaDeviceSynchronize());
  return Status::success();
}

// ---- DeviceStream -----------------------------------------------------------

Status DeviceStream::create(int device, DeviceStream* out) {
  if (out == nullptr) return {ErrorCode::null_pointer, "DeviceStream::create: out is null"};
  DSA_RETURN_IF_ERROR(check_device_index(device, "DeviceStream::create"));
  DeviceGuard guard;
  DSA_RETURN_IF_ERROR(guard.enter(device));
  cudaStream_t stream = nullptr;
  DSA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DeviceStream fresh;
  fresh.stream_ = stream;
  fresh.device_ = device;
  *out = std::move(fresh);
  return Status::success();
}

DeviceStream::DeviceStream(DeviceStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}

DeviceStream& DeviceStream::operator=(DeviceStream&& other) noexcept {
  if (this != &other) {
    DeviceStream discarded(std::move(*this));
    stream_ = std::exchange(other.stream_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

DeviceStream::~DeviceStream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status DeviceStream::synchronize() const {
  if (stream_ == nullptr) return {ErrorCode::invalid_argument, "DeviceStream::synchronize: no stream"};
  DSA_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return Status::success();
}

}  // namespace dsa
