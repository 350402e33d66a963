// Non-owning tensor views: how every operation receives its arguments.
//
// A TensorView is a pointer plus dtype, shape, strides (in elements, not
// bytes) and the device the memory lives on. The library never allocates or
// frees the memory behind a view. Operations state, per argument, which ranks,
// dtypes and layouts they accept; an unused optional argument is an empty
// view (data == nullptr, ndim == 0).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

namespace dsa {

enum class DType : std::uint8_t {
  uint8,
  int32,
  int64,
  float32,
  bfloat16,
  float8_e4m3,  // OCP e4m3fn: no infinities, max finite 448
};

// Bytes per element.
std::size_t dtype_size(DType dtype) noexcept;
// Lower-case name ("float32", "float8_e4m3", ...).
const char* dtype_name(DType dtype) noexcept;

enum class DeviceType : std::uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA device ordinal; 0 for the CPU
  friend bool operator==(const Device&, const Device&) = default;
};

inline constexpr int kMaxDims = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::float32;
  int ndim = 0;
  std::array<std::int64_t, kMaxDims> shape{};
  std::array<std::int64_t, kMaxDims> strides{};  // in elements
  Device device{};

  bool empty() const noexcept { return data == nullptr && ndim == 0; }
  std::int64_t size(int dim) const noexcept { return shape[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const noexcept { return strides[static_cast<std::size_t>(dim)]; }
  std::int64_t numel() const noexcept;
  // True when strides are the row-major strides of the shape.
  bool is_contiguous() const noexcept;
  // "float32[4, 128] strides [256, 1] on cuda:0"
  std::string describe() const;
  // Typed element pointer; no checks.
  template <typename T>
  T* ptr() const noexcept {
    return static_cast<T*>(data);
  }
};

// A view of contiguous row-major memory.
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device = {});
// A view with explicit strides (in elements).
TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     std::initializer_list<std::int64_t> strides, Device device = {});

}  // namespace dsa
