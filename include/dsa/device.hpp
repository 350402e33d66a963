// Small host-side helpers for CUDA devices: discovery, owned device memory and
// streams. They exist so that programs using the library (its tool, tests and
// bindings) need no CUDA headers. In a build without CUDA every query reports
// no device and every allocation fails with `unsupported`.
#pragma once

#include <cstddef>
#include <string>

#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

// True when the library was built with its CUDA backends.
bool built_with_cuda() noexcept;
// Number of usable CUDA devices (0 without CUDA, a driver or a GPU).
int cuda_device_count() noexcept;

struct DeviceInfo {
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  int multiprocessors = 0;
  std::size_t global_memory_bytes = 0;
  std::size_t l2_cache_bytes = 0;
  std::size_t shared_memory_per_block_optin = 0;
};
Status get_device_info(int device, DeviceInfo* info);

// Owned device memory (cudaMalloc / cudaFree), move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Status allocate(std::size_t bytes, int device, DeviceBuffer* out);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const noexcept { return data_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int device() const noexcept { return device_; }

  // Synchronous copies between this buffer (at byte offset) and host memory.
  Status copy_from_host(const void* src, std::size_t bytes, std::size_t offset = 0);
  Status copy_to_host(void* dst, std::size_t bytes, std::size_t offset = 0) const;
  // Sets every byte to `value` (synchronous).
  Status fill_bytes(unsigned char value);

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

// Owned non-blocking CUDA stream, move-only; handle() is a cudaStream_t.
class DeviceStream {
 public:
  DeviceStream() = default;
  static Status create(int device, DeviceStream* out);
  DeviceStream(DeviceStream&& other) noexcept;
  DeviceStream& operator=(DeviceStream&& other) noexcept;
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;
  ~DeviceStream();

  void* handle() const noexcept { return stream_; }
  Status synchronize() const;

 private:
  void* stream_ = nullptr;
  int device_ = 0;
};

}  // namespace dsa
