// The work schedule of the scoring kernels.
//
// Work is split into items. On the native path an item is (request b, chunk c)
// and covers all next_n rows of b against key positions [256 c, 256 c + 256);
// request b has ceil(max_j L[b, j] / 256) items. On the per-token path every
// row r = b * next_n + j is its own unit with ceil(L[b, j] / 256) items. Items
// are ordered lexicographically by (unit, chunk) and cut into num_workers
// contiguous ranges of equal weight, where a unit with n > 0 items weighs
// n + e, with e = kUnitStartWeight = 2 for a unit of at most 2 rows (every
// unit on the per-token path; next_n <= 2 on the native path) and e = 0 for
// more rows (below), and a unit without items weighs 0. Laid end to end in
// unit order, the weights give positions 0 .. total - 1; the first e + 1
// positions of a unit name its item 0 and position e + c its item c. Worker w
// starts at the item that position floor(w * total / num_workers) names
// (position 0: (0, 0)).
//
// schedule is int32 [num_workers + 1, 2], inner dimension contiguous:
//   schedule[w]           = (unit, chunk) of worker w's first item, w < num_workers
//                           (an empty range starts where the next one starts)
//   schedule[num_workers] = (number of units, 256): B on the native path,
//                           B * next_n on the per-token path (T rows on
//                           either path with request_offsets, below)
// The plan can be computed on the host or on the device (a kernel, so a
// CUDA-graph replay refreshes it without a host synchronization).
//
// Requests of uneven row counts (request_offsets, see dsa/logits.hpp): the
// rows r = 0 .. T - 1 are grouped by request. On the native path a unit is a
// row tile of request b: rows offsets[b] + kVarlenRowTile * t up to
// min(offsets[b] + kVarlenRowTile * (t + 1), offsets[b + 1]), so a request
// of at most kVarlenRowTile rows (decode, verification) is read once and a
// prefill-sized one once per kVarlenRowTile rows. A unit is named by its
// first row, and its length is the longest of its rows'; on the per-token
// path every row is its own unit. Items are ordered by (first row, chunk)
// and cut as above; the trailer is (T, 256) on either path. Empty requests
// own no rows and no units.
//
// Using a schedule planned for other lengths or another worker count is safe:
// workers walk their (unit, chunk) range against the lengths they are given,
// so coverage stays complete and only balance suffers. A schedule for another
// batch, path or chunk size, or one that is not monotone, is detected
// (schedule_mismatch) and never hangs. With request_offsets, one planned for
// other offsets of the same T rows (or for the other path) is also safe: a
// worker whose first entry falls inside a row tile starts at the next tile,
// which the worker before it ends past.
#pragma once

#include "dsa/context.hpp"
#include "dsa/lengths.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

inline constexpr int kChunkTokens = 256;
// What entering a unit of at most kUnitStartWeightMaxRows rows weighs in
// the split, in items: a worker whose range enters a unit first reads the
// unit's lengths, block-table entries and queries, a chain of dependent reads
// that costs the scoring kernels about two items' streaming time; weighing it
// gives ranges that cross into another unit fewer items, so that they end
// with the others. Units of more rows are bound by their products, behind
// which that chain hides: entering them weighs nothing.
inline constexpr int kUnitStartWeight = 2;
inline constexpr int kUnitStartWeightMaxRows = 2;
// Rows of one request a native unit scores together when requests have
// uneven row counts (request_offsets).
inline constexpr int kVarlenRowTile = 8;

// How the scoring operation reads the key cache.
enum class LogitsPath {
  automatic,  // native where the backend has a native kernel for (next_n, H), else per_token
  native,     // one read of a request's keys for all of its next_n rows
  per_token,  // "flattened": each row its own request; keys read next_n times
};

const char* logits_path_name(LogitsPath path) noexcept;

// The path `automatic` resolves to for this shape on the backend ctx selects
// for tensors on `device`. native and per_token resolve to themselves. The
// cache's page size takes no part (plan_schedule sees no cache): where the
// Hopper kernels do not read the pages, the generic kernels serve the path
// resolved here.
LogitsPath resolve_logits_path(LogitsPath requested, int next_n, int num_heads, Device device,
                               const ExecContext& ctx);

// Number of workers to plan for: the multiprocessor count of a CUDA device,
// the thread count of the CPU backend.
int default_num_workers(Device device, const ExecContext& ctx);

// Plans the schedule described above.
//   context_lens     int32 [B, next_n] (B may be 0), on the host or the device;
//                    with request_offsets, the per-row lengths int32 [T] or [T, 1]
//   num_workers      >= 1
//   path             native or per_token (automatic is resolved with
//                    resolve_logits_path for H = 64, and to native with
//                    request_offsets); must match the scoring call
//   schedule         int32 [num_workers + 1, 2] output, same device as context_lens
//   request_offsets  optional, as LogitsOptions::request_offsets (int32
//                    [B + 1], contiguous, same device); must match the
//                    scoring call's. The CPU backend checks its entries
//                    (invalid_argument naming request_offsets); on CUDA,
//                    entries that are not non-decreasing from 0 to T give a
//                    schedule the scoring call then reports.
Status plan_schedule(const TensorView& context_lens, int num_workers, LogitsPath path,
                     const TensorView& schedule, const ExecContext& ctx,
                     const TensorView& request_offsets = {});

// The context lengths and their schedule in one operation: the same outputs,
// bit for bit, as the convention's builder (dsa/lengths.hpp) writing
// context_lens from lens, then plan_schedule(context_lens, num_workers, path,
// schedule, ctx, request_offsets), in one kernel on CUDA (where the two calls
// take two kernels and a clearing of the error record), so that a decode step
// is the scoring and the selection after one launch. The arguments follow
// those two operations' rules (lens is the builder's prefix_lens, or lens for
// legacy; context_lens its out; request_offsets with causal only), and
// schedule must not overlap context_lens.
Status context_lens_and_schedule(LengthConvention convention, const TensorView& lens, int next_n,
                                 const TensorView& context_lens, int num_workers, LogitsPath path,
                                 const TensorView& schedule, const ExecContext& ctx,
                                 const TensorView& request_offsets = {});

}  // namespace dsa
