// Error reporting for every dsa-indexer operation.
//
// Operations never throw and never abort on bad input: they return a Status
// whose message names the operation, the argument and the rule it broke, e.g.
//   "paged_mqa_logits: block_table: context_lens[3,1] = 9000 needs 141 pages
//    but block_table has 128 columns".
#pragma once

#include <string>
#include <utility>

namespace dsa {

enum class ErrorCode {
  ok = 0,
  null_pointer,         // a required tensor has no data pointer
  bad_shape,            // wrong rank or extent, or extents that disagree
  bad_dtype,            // element type not accepted for that argument
  bad_stride,           // layout not accepted (e.g. inner dimension not contiguous)
  bad_alignment,        // pointer or stride not aligned as required
  bad_device,           // tensors on different devices, or a device the backend cannot use
  length_out_of_range,  // a context length beyond max_context_len, the block table or the logits
  page_out_of_range,    // a needed block-table entry negative or >= num_pages, or a slot beyond the cache
  k_out_of_range,       // top-k k outside 1..2048 or beyond the output
  schedule_mismatch,    // schedule not planned for these lengths / batch / path
  workspace_too_small,  // workspace smaller than the op's *_workspace_bytes query
  invalid_argument,     // any other rule on an argument value (next_n, num_workers, ...)
  unsupported,          // valid request the chosen backend cannot serve (e.g. no CUDA build)
  cuda_error,           // the CUDA runtime reported an error
  out_of_memory,        // host memory the CPU backend needs for the call could not be allocated
  internal,             // a bug in the library
};

// Stable, lower-case name of an error code ("bad_shape", ...).
const char* error_code_name(ErrorCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }

  bool ok() const noexcept { return code_ == ErrorCode::ok; }
  explicit operator bool() const noexcept { return ok(); }
  ErrorCode code() const noexcept { return code_; }
  // Human-readable message; empty when ok().
  const std::string& message() const noexcept { return message_; }
  // "<code name>: <message>", or "ok".
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::ok;
  std::string message_;
};

}  // namespace dsa

// Propagates a non-ok Status to the caller.
#define DSA_RETURN_IF_ERROR(expr)            \
  do {                                       \
    ::dsa::Status dsa_status_ = (expr);      \
    if (!dsa_status_.ok()) return dsa_status_; \
  } while (0)
