// The work schedule of the scoring kernels.
//
// Work is split into items. On the native path an item is (request b, chunk c)
// and covers all next_n rows of b against key positions [256 c, 256 c + 256);
// request b has ceil(max_j L[b, j] / 256) items. On the per-token path every
// row r = b * next_n + j is its own unit with ceil(L[b, j] / 256) items. Items
// are ordered lexicographically by (unit, chunk) and cut into num_workers
// contiguous ranges whose sizes differ by at most one item: worker w starts at
// item floor(w * total / num_workers).
//
// schedule is int32 [num_workers + 1, 2], inner dimension contiguous:
//   schedule[w]           = (unit, chunk) of worker w's first item, w < num_workers
//                           (an empty range starts where the next one starts)
//   schedule[num_workers] = (number of units, 256): B on the native path,
//                           B * next_n on the per-token path
// The plan can be computed on the host or on the device (a kernel, so a
// CUDA-graph replay refreshes it without a host synchronization).
//
// Using a schedule planned for other lengths or another worker count is safe:
// workers walk their (unit, chunk) range against the lengths they are given,
// so coverage stays complete and only balance suffers. A schedule for another
// batch, path or chunk size, or one that is not monotone, is detected
// (schedule_mismatch) and never hangs.
#pragma once

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

inline constexpr int kChunkTokens = 256;

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
//   context_lens  int32 [B, next_n] (B may be 0), on the host or the device
//   num_workers   >= 1
//   path          native or per_token (automatic is resolved with
//                 resolve_logits_path for H = 64); must match the scoring call
//   schedule      int32 [num_workers + 1, 2] output, same device as context_lens
Status plan_schedule(const TensorView& context_lens, int num_workers, LogitsPath path,
                     const TensorView& schedule, const ExecContext& ctx);

}  // namespace dsa
