// Context-length builders and the host schedule planner.
#include <algorithm>

#include "backend.hpp"
#include "common/schedule_walk.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

const char* lengths_op_name(LengthConvention convention) {
  switch (convention) {
    case LengthConvention::causal: return "causal_context_lens";
    case LengthConvention::expanded: return "expanded_context_lens";
    case LengthConvention::legacy: return "legacy_context_lens";
  }
  return "context_lens";
}

std::int32_t row_context_length(LengthConvention convention, std::int32_t input, int next_n, int j) {
  switch (convention) {
    case LengthConvention::causal: return input + j + 1;
    case LengthConvention::expanded: return input + next_n;
    case LengthConvention::legacy: return std::max(0, input - next_n + j + 1);
  }
  return 0;
}

void write_context_lens(const LengthsProblem& p) {
  if (p.varlen.offsets != nullptr) {
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int32_t first = p.varlen.offsets[b];
      for (std::int32_t row = first; row < p.varlen.offsets[b + 1]; ++row) {
        p.out[row * p.out_stride_b] = row_context_length(p.convention, p.input[b * p.input_stride], 1, row - first);
      }
    }
    return;
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int32_t input = p.input[b * p.input_stride];
    for (int j = 0; j < p.next_n; ++j) {
      p.out[b * p.out_stride_b + j * p.out_stride_n] = row_context_length(p.convention, input, p.next_n, j);
    }
  }
}

// Worker w starts at weight position floor(w * total / W) (schedule_walk.hpp):
// position 0 is written (0, 0), the start of the walk, and any other as the
// (unit, chunk) it names.
void write_schedule(const ScheduleProblem& p) {
  const UnitLayout layout = unit_layout(p);
  const auto weight_of = [&](const UnitSpan& span) {
    return unit_weight(chunks_for_length(unit_length(layout, span)), span.rows);
  };
  std::int64_t total = 0;
  for (std::int64_t unit = 0; unit < layout.units;) {
    const UnitSpan span = unit_containing(layout, unit);
    total += weight_of(span);
    unit = span.next;
  }
  UnitSpan span = layout.units > 0 ? unit_containing(layout, 0) : UnitSpan{};
  std::int64_t weight_before_unit = 0;
  for (int w = 0; w < p.num_workers; ++w) {
    const std::int64_t first = worker_first_position(w, total, p.num_workers);
    WorkItem start{0, 0};
    if (first > 0) {
      // Advance to the unit holding position `first` (workers start in increasing order).
      for (;;) {
        const std::int64_t weight = weight_of(span);
        if (first < weight_before_unit + weight) break;
        weight_before_unit += weight;
        span = unit_containing(layout, span.next);
      }
      start = WorkItem{span.unit, chunk_at_weight_offset(first - weight_before_unit, span.rows)};
    }
    p.schedule[2 * w] = static_cast<std::int32_t>(start.unit);
    p.schedule[2 * w + 1] = static_cast<std::int32_t>(start.chunk);
  }
  p.schedule[2 * p.num_workers] = static_cast<std::int32_t>(layout.units);
  p.schedule[2 * p.num_workers + 1] = kChunkTokens;
}

}  // namespace

Status context_lens(const LengthsProblem& p, const ExecContext&) {
  DSA_RETURN_IF_ERROR(check_length_inputs(lengths_op_name(p.convention), p));
  write_context_lens(p);
  return Status::success();
}

Status plan_schedule(const ScheduleProblem& p, const ExecContext&) {
  DSA_RETURN_IF_ERROR(check_schedule_data("plan_schedule", p));
  write_schedule(p);
  return Status::success();
}

Status context_lens_and_schedule(const LengthsProblem& lengths, const ScheduleProblem& plan, const ExecContext&) {
  // The lengths' check covers request_offsets, which the planner shares.
  DSA_RETURN_IF_ERROR(check_length_inputs("context_lens_and_schedule", lengths));
  write_context_lens(lengths);
  write_schedule(plan);
  return Status::success();
}

}  // namespace dsa::detail::cpu
