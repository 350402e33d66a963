#include "views.hpp"

#include <cstdint>
#include <string>

namespace dsa::python {
namespace {

namespace dl = nb::dlpack;

// DLPack device codes (dlpack.h DLDeviceType).
constexpr std::int32_t kDLCPU = 1;
constexpr std::int32_t kDLCUDA = 2;
constexpr std::int32_t kDLCUDAHost = 3;
constexpr std::int32_t kDLCUDAManaged = 13;

// DLPack dtype code for OCP float8 e4m3fn (DLPack 1.1); numbered here so that
// nanobind releases without the named constant work as well.
constexpr std::uint8_t kDLFloat8E4M3FN = 10;

[[noreturn]] void raise_value_error(const std::string& message) {
  throw nb::value_error(message.c_str());
}

std::string dtype_description(const dl::dtype& dtype) {
  return "code " + std::to_string(dtype.code) + ", " + std::to_string(dtype.bits) + " bits, " +
         std::to_string(dtype.lanes) + " lanes";
}

DType to_dtype(const dl::dtype& dtype, const char* argument, Uint8Meaning uint8_meaning) {
  if (dtype.lanes == 1) {
    const auto code = static_cast<dl::dtype_code>(dtype.code);
    if (code == dl::dtype_code::UInt && dtype.bits == 8) {
      return uint8_meaning == Uint8Meaning::float8_e4m3 ? DType::float8_e4m3 : DType::uint8;
    }
    if (code == dl::dtype_code::Int && dtype.bits == 32) return DType::int32;
    if (code == dl::dtype_code::Int && dtype.bits == 64) return DType::int64;
    if (code == dl::dtype_code::Float && dtype.bits == 32) return DType::float32;
    if (code == dl::dtype_code::Bfloat && dtype.bits == 16) return DType::bfloat16;
    if (dtype.code == kDLFloat8E4M3FN && dtype.bits == 8) return DType::float8_e4m3;
  }
  raise_value_error(std::string(argument) + ": unsupported element type (" +
                    dtype_description(dtype) +
                    "); accepted: uint8, int32, int64, float32, bfloat16, float8_e4m3fn");
}

Device to_device(std::int32_t device_type, std::int32_t device_id, const char* argument) {
  switch (device_type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: the CPU reads it directly
      return Device{DeviceType::cpu, 0};
    case kDLCUDA:
    case kDLCUDAManaged:
      return Device{DeviceType::cuda, device_id};
    default:
      raise_value_error(std::string(argument) + ": unsupported device type " +
                        std::to_string(device_type) + " (accepted: CPU and CUDA memory)");
  }
}

template <typename Array>
TensorView view_of(const Array& array, const char* argument, Uint8Meaning uint8_meaning) {
  const auto ndim = static_cast<int>(array.ndim());
  if (ndim > kMaxDims) {
    raise_value_error(std::string(argument) + ": rank " + std::to_string(ndim) +
                      " exceeds the largest accepted rank " + std::to_string(kMaxDims));
  }
  TensorView view;
  view.data = const_cast<void*>(static_cast<const void*>(array.data()));
  view.dtype = to_dtype(array.dtype(), argument, uint8_meaning);
  view.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    const auto i = static_cast<std::size_t>(d);
    view.shape[i] = static_cast<std::int64_t>(array.shape(i));
    view.strides[i] = static_cast<std::int64_t>(array.stride(i));
  }
  view.device = to_device(array.device_type(), array.device_id(), argument);
  return view;
}

}  // namespace

TensorView to_view(const InputArray& array, const char* argument, Uint8Meaning uint8_meaning) {
  return view_of(array, argument, uint8_meaning);
}

TensorView to_view(const OutputArray& array, const char* argument, Uint8Meaning uint8_meaning) {
  return view_of(array, argument, uint8_meaning);
}

TensorView to_view(const OptionalInput& array, const char* argument) {
  return array ? view_of(*array, argument, Uint8Meaning::bytes) : TensorView{};
}

ExecContext with_workspace(const ExecContext& ctx, const OptionalOutput& workspace) {
  ExecContext result = ctx;
  result.workspace = Workspace{};
  if (!workspace) return result;
  const TensorView view = view_of(*workspace, "workspace", Uint8Meaning::bytes);
  if (view.ndim != 1 || view.strides[0] != 1) {
    raise_value_error("workspace: must be a 1-D contiguous array, got " + view.describe());
  }
  const std::size_t bytes = static_cast<std::size_t>(view.shape[0]) * dtype_size(view.dtype);
  const auto address = reinterpret_cast<std::uintptr_t>(view.data);
  const std::uintptr_t aligned =
      (address + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  const std::size_t skipped = aligned - address;
  if (bytes <= skipped) return result;  // too small to hold anything once aligned
  result.workspace = Workspace{reinterpret_cast<void*>(aligned), bytes - skipped};
  return result;
}

void raise_if_error(const Status& status) {
  if (status.ok()) return;
  PyObject* type = PyExc_ValueError;
  switch (status.code()) {
    case ErrorCode::unsupported:
      type = PyExc_NotImplementedError;
      break;
    case ErrorCode::out_of_memory:
      type = PyExc_MemoryError;
      break;
    case ErrorCode::cuda_error:
    case ErrorCode::internal:
      type = PyExc_RuntimeError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, status.to_string().c_str());
  throw nb::python_error();
}

}  // namespace dsa::python
