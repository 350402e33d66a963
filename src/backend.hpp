// The backends' entry points. The public API (api.cpp) validates arguments
// into the problems of common/problem.hpp, picks a backend and calls exactly one of
// these. Every function may assume a fully validated problem whose tensors
// live on the backend's device; data-dependent rules (lengths vs. block table,
// page indices, slots) are still the backend's to enforce.
#pragma once

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "common/problem.hpp"

namespace dsa::detail {

// Which implementation serves a call, after resolving Backend::automatic.
enum class Engine { cpu_reference, cpu_parallel, cuda_generic, cuda_hopper };

namespace cpu {
// `parallel` selects the multithreaded path (ctx.num_threads workers) over the
// straightforward reference loops (ctx.reference_float64 honoured there).
Status store_index_keys(const StoreKeysProblem& p, bool parallel, const ExecContext& ctx);
Status quantize_queries(const QuantizeQueriesProblem& p, bool parallel, const ExecContext& ctx);
Status context_lens(const LengthsProblem& p, const ExecContext& ctx);
Status plan_schedule(const ScheduleProblem& p, const ExecContext& ctx);
Status paged_mqa_logits(const LogitsProblem& p, bool parallel, const ExecContext& ctx);
Status topk(const TopkProblem& p, bool parallel, const ExecContext& ctx);
Status index_topk(const IndexTopkProblem& p, bool parallel, const ExecContext& ctx);
}  // namespace cpu

namespace cuda {
// Largest next_n the Hopper kernels score natively (one unit of rows).
inline constexpr int kMaxNativeRows = 8;
// Tokens per cache page the Hopper kernels (and the fused index_topk pieces
// they feed) are compiled for; caches of other page sizes go to the generic
// kernels.
inline constexpr int kHopperPageTokens = 64;
// All are stream-ordered on ctx.stream, allocation-free, and use
// ctx.workspace (its first kDeviceErrorRecordBytes hold the error record).
Status store_index_keys(const StoreKeysProblem& p, const ExecContext& ctx);
Status quantize_queries(const QuantizeQueriesProblem& p, const ExecContext& ctx);
Status context_lens(const LengthsProblem& p, const ExecContext& ctx);
Status plan_schedule(const ScheduleProblem& p, const ExecContext& ctx);
// hopper: use the sm_90a kernels (the caller checked hopper_supports()).
Status paged_mqa_logits(const LogitsProblem& p, bool hopper, const ExecContext& ctx);
Status topk(const TopkProblem& p, const ExecContext& ctx);
Status index_topk(const IndexTopkProblem& p, bool hopper, const ExecContext& ctx);

// Workspace each operation needs, in bytes (error record included).
std::size_t workspace_bytes_basic();
std::size_t topk_workspace_bytes(std::int64_t rows, std::int64_t max_length, int k, int device);
// fused: candidate lists for a schedule of `workers` workers over units of
// `rows_per_unit` rows (candidate_lists.hpp); otherwise staged logits.
std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len, int k,
                                       bool fused, int workers, int rows_per_unit, int device);

// True when device `device` can run the Hopper kernels (sm_90 and built with sm_90a).
bool hopper_available(int device);
// True when the Hopper logits kernel has a native variant for (next_n, heads, head_dim).
bool hopper_supports_native(int next_n, int heads, int head_dim);
// Multiprocessor count (0 when unavailable).
int multiprocessor_count(int device);
// Synchronizes `ctx.stream`, reads the error record and decodes it.
Status read_device_error(const ExecContext& ctx, const char* operation);
}  // namespace cuda

}  // namespace dsa::detail
