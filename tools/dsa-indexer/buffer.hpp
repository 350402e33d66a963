// Memory that lives either in host memory or on a CUDA device, so that one
// pipeline serves every backend.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <variant>

#include "dsa/context.hpp"
#include "dsa/device.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa_cli {

class Buffer {
 public:
  Buffer() = default;
  // Zero-filled memory of `bytes` bytes on `device` (256-byte aligned).
  static dsa::Status allocate(std::size_t bytes, dsa::Device device, Buffer* out);

  void* data() const noexcept;
  std::size_t bytes() const noexcept { return bytes_; }
  dsa::Device device() const noexcept { return device_; }

  // Synchronous copies from / to host memory at the start of the buffer.
  dsa::Status upload(const void* src, std::size_t bytes);
  dsa::Status download(void* dst, std::size_t bytes) const;

  // A contiguous view of the buffer's first elements.
  dsa::TensorView view(dsa::DType dtype, std::initializer_list<std::int64_t> shape) const;

 private:
  struct FreeHost {
    void operator()(void* p) const noexcept { std::free(p); }
  };
  using HostMemory = std::unique_ptr<void, FreeHost>;

  std::variant<HostMemory, dsa::DeviceBuffer> memory_;
  std::size_t bytes_ = 0;
  dsa::Device device_{};
};

}  // namespace dsa_cli
