// Small helpers shared by the CPU test files: contexts, schedules and the
// comparison of library logits with the float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "common/logits_check.hpp"
#include "common/random_inputs.hpp"
#include "common/reference.hpp"
#include "dsa/dsa.hpp"

namespace dsa {
// Readable test names and failure messages for parameterized tests.
inline void PrintTo(Backend backend, std::ostream* os) { *os << backend_name(backend); }
inline void PrintTo(ErrorCode code, std::ostream* os) { *os << error_code_name(code); }
}  // namespace dsa

namespace dsa_test {

#define DSA_ASSERT_OK(expr)                                  \
  do {                                                       \
    const ::dsa::Status dsa_test_status_ = (expr);           \
    ASSERT_TRUE(dsa_test_status_.ok()) << dsa_test_status_.to_string(); \
  } while (0)

inline const std::vector<dsa::Backend>& cpu_backends() {
  static const std::vector<dsa::Backend> backends{dsa::Backend::cpu_reference, dsa::Backend::cpu};
  return backends;
}

inline std::string backend_label(const ::testing::TestParamInfo<dsa::Backend>& info) {
  return info.param == dsa::Backend::cpu_reference ? "cpu_reference" : "cpu";
}

// Two worker threads: the machine CI runs on, and enough to exercise the splits.
inline dsa::ExecContext cpu_context(dsa::Backend backend, int threads = 2,
                                    bool reference_float64 = false) {
  dsa::ExecContext ctx;
  ctx.backend = backend;
  ctx.num_threads = threads;
  ctx.reference_float64 = reference_float64;
  return ctx;
}

// Host scratch memory aligned as every workspace must be.
struct HostWorkspace {
  explicit HostWorkspace(std::size_t bytes) : storage(bytes + dsa::kWorkspaceAlignment) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    const std::size_t shift = (dsa::kWorkspaceAlignment - address % dsa::kWorkspaceAlignment) % dsa::kWorkspaceAlignment;
    workspace = dsa::Workspace{storage.data() + shift, bytes};
  }
  std::vector<std::uint8_t> storage;
  dsa::Workspace workspace;
};

// A schedule planned by the library, with the view that goes with it.
struct Schedule {
  std::vector<std::int32_t> entries;
  int num_workers = 0;
  dsa::TensorView view() { return dsa::make_view(entries.data(), dsa::DType::int32, {num_workers + 1, 2}); }
};

inline dsa::Status plan(std::vector<std::int32_t> lens, std::int64_t batch, int next_n,
                        int num_workers, dsa::LogitsPath path, const dsa::ExecContext& ctx,
                        Schedule* out) {
  out->num_workers = num_workers;
  out->entries.assign(static_cast<std::size_t>(2 * (num_workers + 1)), -7);
  lens.reserve(1);
  const dsa::TensorView lens_view = dsa::make_view(lens.data(), dsa::DType::int32, {batch, next_n});
  return dsa::plan_schedule(lens_view, num_workers, path, out->view(), ctx);
}

// A schedule planned by the library for rows of uneven requests (lengths [T],
// request_offsets [B + 1]).
inline dsa::Status plan_varlen(std::vector<std::int32_t> lens, std::vector<std::int32_t> offsets, int num_workers,
                               dsa::LogitsPath path, const dsa::ExecContext& ctx, Schedule* out) {
  out->num_workers = num_workers;
  out->entries.assign(static_cast<std::size_t>(2 * (num_workers + 1)), -7);
  lens.reserve(1);
  const dsa::TensorView lens_view =
      dsa::make_view(lens.data(), dsa::DType::int32, {static_cast<std::int64_t>(lens.size())});
  const dsa::TensorView offsets_view =
      dsa::make_view(offsets.data(), dsa::DType::int32, {static_cast<std::int64_t>(offsets.size())});
  return dsa::plan_schedule(lens_view, num_workers, path, out->view(), ctx, offsets_view);
}

// The path `requested` resolves to for host tensors of this shape.
inline dsa::LogitsPath resolved_path(dsa::LogitsPath requested, int next_n, int heads,
                                     const dsa::ExecContext& ctx) {
  return dsa::resolve_logits_path(requested, next_n, heads, dsa::Device{}, ctx);
}

// The value the library wrote at (row, col) of a float32 or bfloat16 matrix.
inline float read_logit(const OwnedView& logits, std::int64_t row, std::int64_t col) {
  const std::int64_t index = row * logits.view.stride(0) + col;
  if (logits.view.dtype == dsa::DType::bfloat16) {
    std::uint16_t bits;
    std::memcpy(&bits, logits.bytes.data() + 2 * index, sizeof bits);
    return bf16_decode(bits);
  }
  float value;
  std::memcpy(&value, logits.bytes.data() + 4 * index, sizeof value);
  return value;
}

enum class Precision { float32, float64, bfloat16 };

// How far a CPU backend's logit may be from the float64 reference `want`
// whose magnitude (reference.hpp) is `magnitude`.
inline double rounding_bound(Precision precision, double want, double magnitude) {
  switch (precision) {
    case Precision::float32: return 2e-5 * magnitude;
    case Precision::float64: return 6e-8 * std::fabs(want) + 1e-12 * magnitude;
    case Precision::bfloat16: return std::ldexp(std::fabs(want), -8) + 2e-5 * magnitude;
  }
  return 0.0;
}

// Checks library logits against the reference: valid positions within the
// rounding bound of `precision`, -inf past the lengths when `clean`, and
// columns at or past max_context_len still holding `sentinel`.
inline ::testing::AssertionResult logits_match(const Workload& w, const ReferenceLogits& ref,
                                               const OwnedView& logits, Precision precision,
                                               bool clean, float sentinel) {
  const auto read = [&](std::int64_t r, std::int64_t p) { return read_logit(logits, r, p); };
  const auto bound = [precision](double want, double magnitude) { return rounding_bound(precision, want, magnitude); };
  const auto untouched = [&](std::int64_t r, std::int64_t p) {
    const float got = read_logit(logits, r, p);
    return std::isnan(sentinel) ? std::isnan(got) : got == sentinel;
  };
  return check_logits(w, ref, logits.view.stride(0), clean, read, bound, untouched);
}

}  // namespace dsa_test
