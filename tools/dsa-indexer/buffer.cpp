#include "buffer.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace dsa_cli {

dsa::Status Buffer::allocate(std::size_t bytes, dsa::Device device, Buffer* out) {
  constexpr std::size_t kAlignment = dsa::kWorkspaceAlignment;
  Buffer buffer;
  buffer.bytes_ = bytes;
  buffer.device_ = device;
  if (device.type == dsa::DeviceType::cuda) {
    dsa::DeviceBuffer memory;
    DSA_RETURN_IF_ERROR(dsa::DeviceBuffer::allocate(std::max<std::size_t>(bytes, 1), device.index, &memory));
    DSA_RETURN_IF_ERROR(memory.fill_bytes(0));
    buffer.memory_ = std::move(memory);
  } else {
    const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
    HostMemory memory(std::aligned_alloc(kAlignment, rounded));
    if (memory == nullptr) {
      return {dsa::ErrorCode::internal, "out of host memory allocating " + std::to_string(bytes) + " bytes"};
    }
    std::memset(memory.get(), 0, rounded);
    buffer.memory_ = std::move(memory);
  }
  *out = std::move(buffer);
  return {};
}

void* Buffer::data() const noexcept {
  if (const auto* host = std::get_if<HostMemory>(&memory_)) return host->get();
  return std::get<dsa::DeviceBuffer>(memory_).data();
}

dsa::Status Buffer::upload(const void* src, std::size_t bytes) {
  if (bytes > bytes_) return {dsa::ErrorCode::internal, "upload larger than the buffer"};
  if (auto* device = std::get_if<dsa::DeviceBuffer>(&memory_)) return device->copy_from_host(src, bytes);
  if (bytes > 0) std::memcpy(data(), src, bytes);
  return {};
}

dsa::Status Buffer::download(void* dst, std::size_t bytes) const {
  if (bytes > bytes_) return {dsa::ErrorCode::internal, "download larger than the buffer"};
  if (const auto* device = std::get_if<dsa::DeviceBuffer>(&memory_)) return device->copy_to_host(dst, bytes);
  if (bytes > 0) std::memcpy(dst, data(), bytes);
  return {};
}

dsa::TensorView Buffer::view(dsa::DType dtype, std::initializer_list<std::int64_t> shape) const {
  return dsa::make_view(data(), dtype, shape, device_);
}

}  // namespace dsa_cli
