#include "dsa/status.hpp"

namespace dsa {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::ok: return "ok";
    case ErrorCode::null_pointer: return "null_pointer";
    case ErrorCode::bad_shape: return "bad_shape";
    case ErrorCode::bad_dtype: return "bad_dtype";
    case ErrorCode::bad_stride: return "bad_stride";
    case ErrorCode::bad_alignment: return "bad_alignment";
    case ErrorCode::bad_device: return "bad_device";
    case ErrorCode::length_out_of_range: return "length_out_of_range";
    case ErrorCode::page_out_of_range: return "page_out_of_range";
    case ErrorCode::k_out_of_range: return "k_out_of_range";
    case ErrorCode::schedule_mismatch: return "schedule_mismatch";
    case ErrorCode::workspace_too_small: return "workspace_too_small";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::unsupported: return "unsupported";
    case ErrorCode::cuda_error: return "cuda_error";
    case ErrorCode::out_of_memory: return "out_of_memory";
    case ErrorCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(error_code_name(code_)) + ": " + message_;
}

}  // namespace dsa
