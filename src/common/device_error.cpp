#include "common/device_error.hpp"

#include <string>

namespace dsa::detail {

Status decode_device_error(const DeviceErrorRecord& record, const char* operation) {
  const std::string op = std::string(operation) + ": ";
  const auto arg = [&](int i) { return std::to_string(record.args[i]); };
  switch (record.code) {
    case kNoDeviceError:
      return Status::success();
    case kLengthBeyondMaxContext:
      return {ErrorCode::length_out_of_range,
              op + "context_lens: row " + arg(0) + " has length " + arg(1) +
                  ", beyond max_context_len " + arg(2)};
    case kLengthBeyondBlockTable:
      return {ErrorCode::length_out_of_range,
              op + "block_table: row " + arg(0) + " has length " + arg(1) +
                  ", which needs more pages than the " + arg(2) + " block_table columns"};
    case kPageOutOfRange:
      return {ErrorCode::page_out_of_range,
              op + "block_table: entry [" + arg(0) + ", " + arg(1) + "] = " + arg(2) +
                  " is needed but is not a page index in [0, num_pages)"};
    case kSlotOutOfRange:
      return {ErrorCode::page_out_of_range,
              op + "slot_mapping: token " + arg(0) + " maps to slot " + arg(1) +
                  ", beyond the cache's " + arg(2) + " slots"};
    case kNegativeLength:
      return {ErrorCode::invalid_argument,
              op + "lengths: entry " + arg(0) + " is negative (" + arg(1) + ")"};
    case kScheduleMismatch:
      return {ErrorCode::schedule_mismatch,
              op + "schedule: worker " + arg(0) + " starts at (unit " + arg(1) + ", chunk " +
                  arg(2) + "), which does not fit these lengths, batch or path"};
    case kLengthBeyondLogits:
      return {ErrorCode::length_out_of_range,
              op + "lengths: row " + arg(0) + " has length " + arg(1) + ", beyond the " +
                  arg(2) + " logits columns"};
    case kTopkLengthBeyondContext:
      return {ErrorCode::length_out_of_range,
              op + "topk_lens: row " + arg(0) + " has top-k length " + arg(1) +
                  ", beyond its context length " + arg(2)};
    case kSelectionDisagreement:
      return {ErrorCode::internal,
              op + "row " + arg(0) +
                  ": the selection's counts disagree with its ranks, so the row's indices "
                  "are not exact (an internal error)"};
    case kRowStartOutOfRange:
      return {ErrorCode::length_out_of_range,
              op + "row_starts: row " + arg(0) + " starts at column " + arg(1) + ", outside [0, " +
                  arg(2) + "] (the logits columns less the row's length)"};
    case kRowWithoutRequest:
      return {ErrorCode::invalid_argument,
              op + "request_offsets: row " + arg(0) + " lies in no request's rows [request_offsets[q], " +
                  "request_offsets[q + 1]) of the " + arg(1) + " requests (request_offsets[" + arg(1) +
                  "] = " + arg(2) + "); the entries must be non-decreasing from 0 to the number of rows"};
    case kBadRequestOffsets:
      return {ErrorCode::invalid_argument,
              op + "request_offsets: request_offsets[" + arg(0) + "] = " + arg(1) +
                  " breaks the rule that the entries run non-decreasing from 0 to the " + arg(2) +
                  " rows; every row's logits are NaN"};
    case kKeyRangeStartOutOfRange:
      return {ErrorCode::length_out_of_range,
              op + "ks: row " + arg(0) + " has ks = " + arg(1) + " with ke = " + arg(2) +
                  "; the rule is 0 <= ks <= ke"};
    case kKeyRangeEndBeyondKeys:
      return {ErrorCode::length_out_of_range,
              op + "ke: row " + arg(0) + " has ke = " + arg(1) + ", beyond the " + arg(2) + " keys"};
    case kKeyRangeBeyondColumns:
      return {ErrorCode::length_out_of_range,
              op + "ke: row " + arg(0) + " has a range of " + arg(1) + " keys (ke - ks), beyond max_seqlen_k = " +
                  arg(2) + " (the compressed logits columns)"};
    default:
      return {ErrorCode::internal,
              op + "unknown device error record code " + std::to_string(record.code)};
  }
}

}  // namespace dsa::detail
