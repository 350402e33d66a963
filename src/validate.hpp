// Validation: public TensorViews -> the problems of common/problem.hpp.
//
// The validate_* functions check everything that can be checked without
// reading tensor contents (presence, rank, extents, dtypes, strides,
// alignment, one device, scalar arguments) and fill a problem. The check_*
// functions enforce the data-dependent rules by reading host memory; the CPU
// backend runs them before writing anything (on CUDA the kernels do it).
// Every failure names the operation, the argument and the rule.
#pragma once

#include <cstdint>

#include "common/problem.hpp"
#include "dsa/cache.hpp"
#include "dsa/index_topk.hpp"
#include "dsa/logits.hpp"
#include "dsa/prefill.hpp"
#include "dsa/query.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"
#include "dsa/topk.hpp"

namespace dsa::detail {

Status validate_store_keys(const TensorView& keys, const TensorView& slot_mapping,
                           const TensorView& cache, const StoreKeysOptions& options,
                           StoreKeysProblem* problem);

// quantize_queries (q_block_scales == nullptr; q_codes is q_fp8) or
// quantize_queries_fp4 (q_codes and *q_block_scales its outputs).
Status validate_quantize_queries(const TensorView& q, const TensorView& head_gate,
                                 const TensorView& q_codes, const TensorView* q_block_scales,
                                 const TensorView& weights, const QuantizeQueriesOptions& options,
                                 QuantizeQueriesProblem* problem);

// `op` is the public name of the operation ("causal_context_lens", ...) and
// `out_name` that of its output argument.
Status validate_context_lens(const char* op, LengthConvention convention, const TensorView& input,
                             int next_n, const char* out_name, const TensorView& out,
                             const TensorView& request_offsets, LengthsProblem* problem);

// `path` must already be resolved to native or per_token; `op` names the
// operation ("plan_schedule", ...).
Status validate_plan_schedule(const char* op, const TensorView& context_lens, int num_workers, LogitsPath path,
                              const TensorView& schedule, const TensorView& request_offsets,
                              ScheduleProblem* problem);

// context_lens_and_schedule: the builder's rules and the planner's, over
// context_lens as the builder's output and the planner's input (`path`
// resolved), and a schedule apart from context_lens.
Status validate_context_lens_and_schedule(LengthConvention convention, const TensorView& lens, int next_n,
                                          const TensorView& context_lens, int num_workers, LogitsPath path,
                                          const TensorView& schedule, const TensorView& request_offsets,
                                          LengthsProblem* lengths, ScheduleProblem* plan);

// The inputs paged_mqa_logits and index_topk share.
struct ScoringInputs {
  const TensorView& q;
  const TensorView& key_cache;
  const TensorView& weights;
  const TensorView& context_lens;
  const TensorView& block_table;
  const TensorView& schedule;
  std::int64_t max_context_len;
  int page_size;  // the options' (dsa/cache.hpp)
  KeyFormat key_format;  // the options' (dsa/cache.hpp)
  const TensorView& q_block_scales;  // the options'; empty for fp8 queries
  const TensorView& request_offsets;  // the options' (empty: B requests of next_n rows)
};

// Fills every field of `problem` except `path` (resolved by the caller from
// the validated shape) and the logits output.
Status validate_scoring_inputs(const char* op, const ScoringInputs& inputs, LogitsProblem* problem);

// The logits output of paged_mqa_logits; `problem` has passed validate_scoring_inputs.
Status validate_logits_output(const TensorView& logits, const LogitsOptions& options,
                              LogitsProblem* problem);

// topk_lens, indices and options of index_topk; `problem->logits` has passed
// validate_scoring_inputs.
Status validate_index_topk_outputs(const TensorView& topk_lens, const TensorView& indices,
                                   const IndexTopkOptions& options, IndexTopkProblem* problem);

// Everything of mqa_logits but the ranges' contents (check_mqa_logits_data).
Status validate_mqa_logits(const TensorView& q, const TensorView& keys, const TensorView& key_scales,
                           const TensorView& weights, const TensorView& ks, const TensorView& ke,
                           const TensorView& logits, const MqaLogitsOptions& options,
                           MqaLogitsProblem* problem);

// ks, ke (host memory) and the options of plan_mqa_logits_chunks, as an
// MqaLogitsProblem whose ranges check_mqa_logits_data checks (full form).
Status validate_mqa_chunk_plan(const TensorView& ks, const TensorView& ke, std::int64_t num_keys,
                               DType logits_dtype, MqaLogitsProblem* problem);

Status validate_topk(const TensorView& logits, const TensorView& lengths, int k,
                     const TensorView& indices, const TopkOptions& options, TopkProblem* problem);

// Data-dependent rules on host memory.
Status check_store_keys_slots(const StoreKeysProblem& p);
Status check_length_inputs(const char* op, const LengthsProblem& p);
// request_offsets non-decreasing from 0 to `rows` (`rows_meaning` names them).
Status check_request_offsets(const char* op, const RequestRows& r, std::int64_t rows, const char* rows_meaning);
Status check_schedule_data(const char* op, const ScheduleProblem& p);
// Lengths against max_context_len and the block table, needed block-table
// entries against the cache, and the schedule against batch and path.
Status check_scoring_data(const char* op, const LogitsProblem& p);
Status check_topk_data(const TopkProblem& p);
// Every row's key range (key_range_violation in common/logit_rules.hpp).
Status check_mqa_logits_data(const MqaLogitsProblem& p);
// check_scoring_data plus topk_lens against the context lengths.
Status check_index_topk_data(const IndexTopkProblem& p);

}  // namespace dsa::detail
