// The backends' entry points. The public API (api.cpp) validates arguments
// into the problems of common/problem.hpp, picks a backend and calls exactly one of
// these. Every function may assume a fully validated problem whose tensors
// live on the backend's device; data-dependent rules (lengths vs. block table,
// page indices, slots) are still the backend's to enforce.
#pragma once

#include <vector>

#include "common/problem.hpp"
#include "dsa/context.hpp"
#include "dsa/prefill.hpp"
#include "dsa/status.hpp"

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
// plan's lengths are lengths' output.
Status context_lens_and_schedule(const LengthsProblem& lengths, const ScheduleProblem& plan, const ExecContext& ctx);
Status paged_mqa_logits(const LogitsProblem& p, bool parallel, const ExecContext& ctx);
Status mqa_logits(const MqaLogitsProblem& p, bool parallel, const ExecContext& ctx);
// Host-side plan of mqa_logits calls (dsa::plan_mqa_logits_chunks); p's
// ranges have been checked.
Status plan_mqa_logits_chunks(const MqaLogitsProblem& p, bool compressed, std::size_t budget_bytes,
                              std::vector<MqaLogitsChunk>* chunks);
Status topk(const TopkProblem& p, bool parallel, const ExecContext& ctx);
Status index_topk(const IndexTopkProblem& p, bool parallel, const ExecContext& ctx);
}  // namespace cpu

namespace cuda {
// Largest next_n the Hopper kernels score natively (one unit of rows).
inline constexpr int kMaxNativeRows = 8;

// Makes `device` current for the calling thread for the guard's lifetime, so
// kernels launch on the device that owns the tensors and the caller's
// current device is left as it was. Its members are defined with the CUDA
// backend, which keeps the CUDA runtime out of this header (api.cpp is
// plain C++).
class DeviceGuard {
 public:
  DeviceGuard() = default;
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard();
  Status enter(int device);

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// Who clears an operation's error record: the scope, with a kernel of its
// own, or the operation's first kernel, one CTA that records nothing and
// clears the record after its wait for the work before it (the planner), so
// that the step has one launch fewer.
enum class RecordClear { by_scope, by_first_kernel };

// The prologue of every CUDA operation, entered once per public call (by
// api.cpp's run_cuda) before the backend enqueues anything: the tensors'
// device becomes current for the scope's lifetime, then (by_scope) the error
// record is cleared on ctx.stream (a kernel on that device, hence after the
// guard), so that whatever the kernels record belongs to this call.
class OperationScope {
 public:
  Status enter(int device, const ExecContext& ctx, RecordClear clear);

 private:
  DeviceGuard device_;
};

// Key positions one pipeline stage of the Hopper kernels (and of the fused
// index_topk pieces they feed) holds: one 64-token cache page or two
// 32-token ones.
inline constexpr int kStageTokens = 64;
// All are stream-ordered on ctx.stream, allocation-free, and use
// ctx.workspace (its first kDeviceErrorRecordBytes hold the error record).
// They run inside the call's OperationScope, so one may call another
// (index_topk scores, then selects); the record keeps the first violation.
Status store_index_keys(const StoreKeysProblem& p, const ExecContext& ctx);
Status quantize_queries(const QuantizeQueriesProblem& p, const ExecContext& ctx);
Status context_lens(const LengthsProblem& p, const ExecContext& ctx);
// Both clear the error record themselves (RecordClear::by_first_kernel);
// the second builds plan's lengths (lengths' output) before it plans, in the
// same kernel.
Status plan_schedule(const ScheduleProblem& p, const ExecContext& ctx);
Status context_lens_and_schedule(const LengthsProblem& lengths, const ScheduleProblem& plan, const ExecContext& ctx);
// hopper: use the sm_90a kernels (the caller checked hopper_supports()).
Status paged_mqa_logits(const LogitsProblem& p, bool hopper, const ExecContext& ctx);
// hopper: use the sm_90a kernel (the caller checked hopper_supports_mqa_logits()).
Status mqa_logits(const MqaLogitsProblem& p, bool hopper, const ExecContext& ctx);
Status topk(const TopkProblem& p, const ExecContext& ctx);
Status index_topk(const IndexTopkProblem& p, bool hopper, const ExecContext& ctx);

// Workspace each operation needs, in bytes (error record included).
std::size_t workspace_bytes_basic();
std::size_t topk_workspace_bytes();
// fused: candidate lists for a schedule of `workers` workers over units of
// `rows_per_unit` rows (fused/candidate_lists.hpp); otherwise staged logits.
std::size_t index_topk_workspace_bytes(std::int64_t rows, std::int64_t max_context_len, bool fused,
                                       int workers, int rows_per_unit);

// True when device `device` can run the Hopper kernels (sm_90 and built with sm_90a).
bool hopper_available(int device);
// True when the Hopper logits kernel has a native variant for (next_n, heads, head_dim).
bool hopper_supports_native(int next_n, int heads, int head_dim);
// True when the Hopper mqa_logits kernel serves p's shape and alignment.
bool hopper_supports_mqa_logits(const MqaLogitsProblem& p);
// Multiprocessor count (0 when unavailable).
int multiprocessor_count(int device);
// Synchronizes `ctx.stream`, reads the error record and decodes it.
Status read_device_error(const ExecContext& ctx, const char* operation);
}  // namespace cuda

}  // namespace dsa::detail
