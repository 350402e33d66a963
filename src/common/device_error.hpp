// The error record CUDA kernels leave at the start of the workspace when they
// meet a data-dependent violation they can only see on the device. The first
// violation wins (atomicCAS on `code`); read_device_error() decodes it.
#pragma once

#include <cstdint>

#include "dsa/status.hpp"

namespace dsa::detail {

// Values of DeviceErrorRecord::code; 0 means no error.
enum DeviceErrorKind : std::int32_t {
  kNoDeviceError = 0,
  kLengthBeyondMaxContext = 1,  // (row, length, max_context_len)
  kLengthBeyondBlockTable = 2,  // (row, length, max_blocks)
  kPageOutOfRange = 3,          // (request, block index, entry)
  kSlotOutOfRange = 4,          // (token, slot, num_slots)
  kNegativeLength = 5,          // (index, length, 0)
  kScheduleMismatch = 6,        // (worker, unit, chunk)
  kLengthBeyondLogits = 7,      // (row, length, columns)
  kTopkLengthBeyondContext = 8, // (row, topk length, context length)
  kSelectionDisagreement = 9,   // (row, 0, 0): an internal inconsistency
  kRowStartOutOfRange = 10,     // (row, start, columns - length)
  kRowWithoutRequest = 11,      // (row, requests, request_offsets[requests])
  kKeyRangeStartOutOfRange = 12,  // (row, ks, ke): ks < 0 or ks > ke
  kKeyRangeEndBeyondKeys = 13,    // (row, ke, S_kv)
  kKeyRangeBeyondColumns = 14,    // (row, ke - ks, max_seqlen_k)
  kBadRequestOffsets = 15,        // (entry q, request_offsets[q], rows T)
};

struct DeviceErrorRecord {
  std::int32_t code;
  std::int32_t args[3];
};

inline constexpr std::size_t kDeviceErrorRecordBytes = 256;  // keeps what follows aligned

// Turns a record read back from the device into a Status naming `operation`.
Status decode_device_error(const DeviceErrorRecord& record, const char* operation);

}  // namespace dsa::detail
