// Helpers of the GPU suites: device copies of host workloads, contexts with a
// workspace, and the comparison of device logits with the float64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/logits_check.hpp"
#include "common/random_inputs.hpp"
#include "common/reference.hpp"
#include "dsa/dsa.hpp"

namespace dsa_test::gpu {

#define DSA_GPU_ASSERT_OK(expr)                                            \
  do {                                                                     \
    const ::dsa::Status dsa_gpu_status_ = (expr);                          \
    ASSERT_TRUE(dsa_gpu_status_.ok()) << dsa_gpu_status_.to_string();     \
  } while (0)

// Every GPU test starts with this: without a device there is nothing to run.
#define DSA_REQUIRE_GPU()                                                          \
  do {                                                                             \
    if (::dsa::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device available"; \
  } while (0)

inline constexpr dsa::Device kGpu{dsa::DeviceType::cuda, 0};

// One worker per multiprocessor.
inline int workers_for(const dsa::ExecContext& ctx) { return dsa::default_num_workers(kGpu, ctx); }

inline std::string backend_tag(dsa::Backend backend) {
  return backend == dsa::Backend::cuda_generic ? "generic" : "automatic";
}

inline bool device_is_sm90() {
  if (dsa::cuda_device_count() == 0) return false;
  dsa::DeviceInfo info;
  return dsa::get_device_info(0, &info).ok() && info.compute_major == 9 && info.compute_minor == 0;
}

#define DSA_REQUIRE_HOPPER()                                                         \
  do {                                                                               \
    if (!device_is_sm90()) GTEST_SKIP() << "needs a compute capability 9.0 GPU";     \
  } while (0)

// A device buffer holding a copy of host bytes (or `bytes` bytes of `fill`).
inline dsa::DeviceBuffer device_copy(const void* host, std::size_t bytes) {
  dsa::DeviceBuffer buffer;
  const dsa::Status allocated = dsa::DeviceBuffer::allocate(bytes, 0, &buffer);
  EXPECT_TRUE(allocated.ok()) << allocated.to_string();
  if (allocated.ok() && bytes > 0) {
    const dsa::Status copied = buffer.copy_from_host(host, bytes);
    EXPECT_TRUE(copied.ok()) << copied.to_string();
  }
  return buffer;
}
template <typename T>
dsa::DeviceBuffer device_copy(const std::vector<T>& host) {
  return device_copy(host.data(), host.size() * sizeof(T));
}
inline dsa::DeviceBuffer device_filled(std::size_t bytes, unsigned char fill) {
  dsa::DeviceBuffer buffer;
  const dsa::Status allocated = dsa::DeviceBuffer::allocate(bytes, 0, &buffer);
  EXPECT_TRUE(allocated.ok()) << allocated.to_string();
  if (allocated.ok()) {
    const dsa::Status filled = buffer.fill_bytes(fill);
    EXPECT_TRUE(filled.ok()) << filled.to_string();
  }
  return buffer;
}

template <typename T>
std::vector<T> host_copy(const dsa::DeviceBuffer& buffer) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  const dsa::Status copied = buffer.copy_to_host(host.data(), host.size() * sizeof(T));
  EXPECT_TRUE(copied.ok()) << copied.to_string();
  return host;
}

// A view of a device buffer with the given shape and strides (in elements).
inline dsa::TensorView device_view(const dsa::DeviceBuffer& buffer, dsa::DType dtype,
                                   std::initializer_list<std::int64_t> shape) {
  return dsa::make_view(buffer.data(), dtype, shape, kGpu);
}
inline dsa::TensorView device_view(const dsa::DeviceBuffer& buffer, dsa::DType dtype,
                                   std::initializer_list<std::int64_t> shape,
                                   std::initializer_list<std::int64_t> strides) {
  return dsa::make_view(buffer.data(), dtype, shape, strides, kGpu);
}

// A stream and a workspace of at least `bytes` (never less than what the
// basic operations need), on device 0.
struct GpuContext {
  dsa::DeviceStream stream;
  dsa::DeviceBuffer workspace;
  dsa::ExecContext ctx;

  GpuContext(dsa::Backend backend, std::size_t bytes) {
    const dsa::Status created = dsa::DeviceStream::create(0, &stream);
    EXPECT_TRUE(created.ok()) << created.to_string();
    const std::size_t size = bytes > 4096 ? bytes : 4096;
    workspace = device_filled(size, 0);
    ctx.backend = backend;
    ctx.stream = stream.handle();
    ctx.workspace = dsa::Workspace{workspace.data(), workspace.bytes()};
  }
  dsa::Status sync() const { return stream.synchronize(); }
};

// The device copy of a Workload's scoring inputs.
struct DeviceWorkload {
  dsa::DeviceBuffer q_fp8, weights, context_lens, causal_lens, block_table, cache;
  const Workload* host = nullptr;

  explicit DeviceWorkload(const Workload& w)
      : q_fp8(device_copy(w.q_fp8)),
        weights(device_copy(w.weights)),
        context_lens(device_copy(w.context_lens)),
        causal_lens(device_copy(w.causal_lens)),
        block_table(device_copy(w.block_table)),
        cache(device_copy(w.cache)),
        host(&w) {}

  dsa::TensorView q_view() const {
    return device_view(q_fp8, dsa::DType::float8_e4m3, {host->batch, host->next_n, host->heads, host->head_dim});
  }
  dsa::TensorView weights_view() const {
    return device_view(weights, dsa::DType::float32, {host->rows(), host->heads});
  }
  dsa::TensorView lens_view() const {
    return device_view(context_lens, dsa::DType::int32, {host->batch, host->next_n});
  }
  dsa::TensorView causal_view() const {
    return device_view(causal_lens, dsa::DType::int32, {host->rows()});
  }
  dsa::TensorView block_table_view() const {
    return device_view(block_table, dsa::DType::int32, {host->batch, host->max_blocks});
  }
  // The 2-D view for 64-token pages (the options' default), the DeepGEMM
  // view [num_pages, P, 1, D + 4] otherwise: it carries the page size, so
  // every call reads the pages right without a page_size option.
  dsa::TensorView cache_view() const {
    const CacheGeometry& g = host->geometry;
    if (g.page_tokens == dsa::kDefaultPageTokens) {
      return device_view(cache, dsa::DType::uint8, {g.num_pages, g.page_stride});
    }
    const std::int64_t width = g.head_dim + 4;
    return device_view(cache, dsa::DType::uint8, {g.num_pages, g.page_tokens, 1, width},
                       {g.page_stride, width, width, 1});
  }
};

// A schedule planned on the device for the workload's lengths.
inline dsa::DeviceBuffer plan_on_device(const DeviceWorkload& dw, int num_workers, dsa::LogitsPath path,
                                        const dsa::ExecContext& ctx) {
  dsa::DeviceBuffer schedule = device_filled(sizeof(std::int32_t) * 2 * (num_workers + 1), 0xFF);
  const dsa::Status planned = dsa::plan_schedule(
      dw.lens_view(), num_workers, path, device_view(schedule, dsa::DType::int32, {num_workers + 1, 2}), ctx);
  EXPECT_TRUE(planned.ok()) << planned.to_string();
  return schedule;
}

inline dsa::TensorView schedule_view(const dsa::DeviceBuffer& schedule) {
  const auto workers = static_cast<std::int64_t>(schedule.bytes() / (2 * sizeof(std::int32_t))) - 1;
  return device_view(schedule, dsa::DType::int32, {workers + 1, 2});
}

// The device copy of a VarlenWorkload (requests of uneven row counts).
struct DeviceVarlen {
  explicit DeviceVarlen(const VarlenWorkload& v)
      : host(&v), rows(v.rows), offsets(device_copy(v.request_offsets)), table(device_copy(v.table)) {}

  const VarlenWorkload* host;
  DeviceWorkload rows;
  dsa::DeviceBuffer offsets, table;

  std::int64_t total_rows() const { return host->total_rows(); }
  dsa::TensorView q_view() const {
    const Workload& w = host->rows;
    return device_view(rows.q_fp8, dsa::DType::float8_e4m3, {w.batch, 1, w.heads, w.head_dim});
  }
  dsa::TensorView lens_view() const { return device_view(rows.context_lens, dsa::DType::int32, {total_rows()}); }
  dsa::TensorView offsets_view() const { return device_view(offsets, dsa::DType::int32, {host->requests + 1}); }
  dsa::TensorView table_view() const {
    return device_view(table, dsa::DType::int32, {host->requests, host->rows.max_blocks});
  }
};

// A schedule planned on the device for the rows of uneven requests.
inline dsa::DeviceBuffer plan_varlen(const DeviceVarlen& dv, int workers, dsa::LogitsPath path,
                                     const dsa::ExecContext& ctx) {
  dsa::DeviceBuffer schedule = device_filled(sizeof(std::int32_t) * 2 * (workers + 1), 0xFF);
  const dsa::Status planned = dsa::plan_schedule(dv.lens_view(), workers, path, schedule_view(schedule), ctx,
                                                 dv.offsets_view());
  EXPECT_TRUE(planned.ok()) << planned.to_string();
  return schedule;
}

// Relative rounding bound (times the reference magnitude) of a backend's
// float32 logits: fp32 dot products on the generic kernels, fp8 tensor-core
// accumulation on the Hopper kernels that Backend::automatic picks on sm_90.
// Allowed |logit - reference| as a fraction of the magnitude
// sum_h |w| * scale * sum_d |q k|. The generic kernel accumulates in plain
// fp32. The Hopper kernels (and automatic, which picks them on sm_90) sum the
// fp8 products inside the tensor cores, whose accumulator keeps only about 13
// mantissa bits per step; the bound sits above the largest errors measured
// (docs/performance.md, Method).
inline double logits_tolerance(dsa::Backend backend) {
  return backend == dsa::Backend::cuda_generic ? 2e-5 : 2e-3;
}

inline float logit_at(const std::vector<std::uint8_t>& bytes, dsa::DType dtype, std::int64_t index) {
  if (dtype == dsa::DType::bfloat16) {
    std::uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * index, sizeof bits);
    return bf16_decode(bits);
  }
  float value;
  std::memcpy(&value, bytes.data() + 4 * index, sizeof value);
  return value;
}

// Checks device logits (copied back as bytes, row stride `stride` elements,
// poisoned with 0xFF bytes before the run) against the reference: every valid
// position within the bound, -inf past the length with `clean`, and every
// column at or past max_context_len untouched.
inline ::testing::AssertionResult logits_match(const Workload& w, const ReferenceLogits& ref,
                                               const std::vector<std::uint8_t>& bytes, dsa::DType dtype,
                                               std::int64_t stride, bool clean, double tolerance) {
  const std::size_t element = dtype == dsa::DType::bfloat16 ? 2 : 4;
  const auto read = [&](std::int64_t r, std::int64_t p) { return logit_at(bytes, dtype, r * stride + p); };
  const auto bound = [&](double want, double magnitude) {
    return tolerance * magnitude + (dtype == dsa::DType::bfloat16 ? std::ldexp(std::fabs(want), -8) : 0.0);
  };
  const auto untouched = [&](std::int64_t r, std::int64_t p) {
    const std::size_t first = static_cast<std::size_t>(r * stride + p) * element;
    bool poisoned = true;
    for (std::size_t i = 0; i < element; ++i) poisoned &= bytes[first + i] == 0xFF;
    return poisoned;
  };
  return check_logits(w, ref, stride, clean, read, bound, untouched);
}

}  // namespace dsa_test::gpu
