#include "dsa/tensor.hpp"

#include <limits>
#include <string>

namespace dsa {

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return 1;
    case DType::int32: return 4;
    case DType::int64: return 8;
    case DType::float32: return 4;
    case DType::bfloat16: return 2;
    case DType::float8_e4m3: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::uint8: return "uint8";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::float32: return "float32";
    case DType::bfloat16: return "bfloat16";
    case DType::float8_e4m3: return "float8_e4m3";
  }
  return "unknown";
}

std::int64_t TensorView::numel() const noexcept {
  if (ndim <= 0) return 0;  // an empty view holds nothing (the API has no scalars)
  std::int64_t count = 1;
  for (int d = 0; d < ndim; ++d) count *= size(d);
  return count;
}

bool TensorView::is_contiguous() const noexcept {
  std::int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    // A dimension of extent 1 is never stepped over, so its stride is irrelevant.
    if (size(d) != 1 && stride(d) != expected) return false;
    expected *= size(d);
  }
  return true;
}

std::string TensorView::describe() const {
  // Plain string building (no iostreams): this runs in the error paths of
  // every operation, also inside extension modules.
  const auto list = [this](const std::array<std::int64_t, kMaxDims>& values) {
    std::string text;
    for (int d = 0; d < ndim; ++d) {
      if (d > 0) text += ", ";
      text += std::to_string(values[static_cast<std::size_t>(d)]);
    }
    return text;
  };
  return std::string(dtype_name(dtype)) + '[' + list(shape) + "] strides [" + list(strides) + "] on " +
         (device.type == DeviceType::cuda ? "cuda:" : "cpu:") + std::to_string(device.index);
}

namespace {

TensorView view_with_shape(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                           Device device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  // Extra dimensions beyond kMaxDims are dropped; validation then reports the wrong rank.
  for (std::int64_t extent : shape) {
    if (view.ndim == kMaxDims) break;
    view.shape[static_cast<std::size_t>(view.ndim++)] = extent;
  }
  return view;
}

}  // namespace

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     Device device) {
  TensorView view = view_with_shape(data, dtype, shape, device);
  std::int64_t stride = 1;
  for (int d = view.ndim - 1; d >= 0; --d) {
    view.strides[static_cast<std::size_t>(d)] = stride;
    // Shapes too large to address saturate (validation rejects them) rather
    // than overflow.
    if (__builtin_mul_overflow(stride, view.size(d), &stride)) stride = std::numeric_limits<std::int64_t>::max();
  }
  return view;
}

TensorView make_view(void* data, DType dtype, std::initializer_list<std::int64_t> shape,
                     std::initializer_list<std::int64_t> strides, Device device) {
  TensorView view = view_with_shape(data, dtype, shape, device);
  int d = 0;
  for (std::int64_t stride : strides) {
    if (d == view.ndim) break;
    view.strides[static_cast<std::size_t>(d++)] = stride;
  }
  return view;
}

}  // namespace dsa
