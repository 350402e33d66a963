// mqa_logits (prefill scoring) on the generic CUDA kernel and on the one
// automatic picks (the sm_90a kernel on a Hopper GPU for H 32 or 64,
// D 128) against the float64 reference: the CPU suite's cases, cases of
// several key chunks and row tiles, repeatability, and the range violations
// only the device sees.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/prefill_inputs.hpp"
#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::DType;

// The device copy of an MqaWorkload's inputs (q padded when the case asks).
struct DeviceMqa {
  const MqaWorkload* host;
  std::int64_t q_head_stride;
  dsa::DeviceBuffer q, weights, keys, key_scales, ks, ke;

  DeviceMqa(const MqaWorkload& w, std::int64_t q_pad_bytes)
      : host(&w),
        q_head_stride(w.head_dim + q_pad_bytes),
        q(device_copy(w.padded_q(q_pad_bytes))),
        weights(device_copy(w.weights)),
        keys(device_copy(w.keys)),
        key_scales(device_copy(w.key_scales)),
        ks(device_copy(w.ks)),
        ke(device_copy(w.ke)) {}

  dsa::TensorView q_view() const {
    return device_view(q, DType::float8_e4m3, {host->rows, host->heads, host->head_dim},
                       {host->heads * q_head_stride, q_head_stride, 1});
  }
  dsa::TensorView weights_view() const { return device_view(weights, DType::float32, {host->rows, host->heads}); }
  dsa::TensorView keys_view() const { return device_view(keys, DType::float8_e4m3, {host->num_keys, host->head_dim}); }
  dsa::TensorView key_scales_view() const { return device_view(key_scales, DType::float32, {host->num_keys}); }
  dsa::TensorView ks_view() const { return device_view(ks, DType::int32, {host->rows}); }
  dsa::TensorView ke_view() const { return device_view(ke, DType::int32, {host->rows}); }
};

struct PrefillRun {
  dsa::Status status;
  std::vector<std::uint8_t> bytes;  // [rows, stride] elements, 0xFF where not written
};

// Runs mqa_logits into an output poisoned with 0xFF bytes.
PrefillRun run_prefill(const DeviceMqa& d, const PrefillLayout& l, DType dtype, const dsa::ExecContext& ctx) {
  const std::size_t bytes = static_cast<std::size_t>(d.host->rows * l.stride) * dsa::dtype_size(dtype);
  dsa::DeviceBuffer out = device_filled(std::max<std::size_t>(bytes, 16), 0xFF);
  PrefillRun run;
  run.status = dsa::mqa_logits(d.q_view(), d.keys_view(), d.key_scales_view(), d.weights_view(), d.ks_view(),
                               d.ke_view(), device_view(out, dtype, {d.host->rows, l.cols}, {l.stride, 1}), l.options,
                               ctx);
  run.bytes = host_copy<std::uint8_t>(out);  // waits for the device
  run.bytes.resize(bytes);
  return run;
}

bool poisoned(const std::vector<std::uint8_t>& bytes, std::size_t element, std::int64_t index) {
  bool all = true;
  for (std::size_t i = 0; i < element; ++i) all &= bytes[static_cast<std::size_t>(index) * element + i] == 0xFF;
  return all;
}

// The CPU suite's cases, then GPU-only ones big enough for several of the
// Hopper kernel's 4096-key chunks and row tiles (8 rows at H 64, 16 at 32).
std::vector<PrefillCase> gpu_prefill_cases() {
  std::vector<PrefillCase> cases = prefill_cases();
  auto add = [&](std::string name, MqaSpec spec) -> PrefillCase& {
    spec.seed = 900 + cases.size();
    cases.push_back(PrefillCase{std::move(name), std::move(spec)});
    return cases.back();
  };
  for (const bool compressed : {false, true}) {
    const std::string form = compressed ? "_compressed" : "_full";
    add("chunks_causal_h64" + form, MqaSpec{.rows = 21, .heads = 64, .num_keys = 8300}).compressed = compressed;
    add("chunks_random_h32" + form, MqaSpec{.rows = 35, .heads = 32, .num_keys = 4500, .ranges = RangeShape::random})
        .compressed = compressed;
    add("chunks_context_parallel_h64" + form,
        MqaSpec{.rows = 18, .heads = 64, .num_keys = 4200, .ranges = RangeShape::context_parallel})
        .compressed = compressed;
  }
  PrefillCase& c = add("chunks_bf16_strided_unclean", MqaSpec{.rows = 17, .heads = 64, .num_keys = 4160,
                                                               .ranges = RangeShape::random});
  c.bf16_out = true;
  c.clean = false;
  c.extra_stride = 3;
  c.q_pad_bytes = 32;
  return cases;
}

class GpuPrefill : public ::testing::TestWithParam<std::tuple<dsa::Backend, PrefillCase>> {};

TEST_P(GpuPrefill, MatchesReferenceAndRepeats) {
  DSA_REQUIRE_GPU();
  const auto& [backend, c] = GetParam();
  const MqaWorkload w = make_mqa_workload(c.spec);
  const DeviceMqa d(w, c.q_pad_bytes);
  const PrefillLayout l = prefill_layout(c, w);
  const DType dtype = c.bf16_out ? DType::bfloat16 : DType::float32;
  GpuContext gpu(backend, dsa::mqa_logits_workspace_bytes(dsa::ExecContext{}));
  gpu.ctx.check_device_errors = true;
  const PrefillRun first = run_prefill(d, l, dtype, gpu.ctx);
  DSA_GPU_ASSERT_OK(first.status);
  const std::size_t element = dsa::dtype_size(dtype);
  const auto read = [&](std::int64_t r, std::int64_t col) { return logit_at(first.bytes, dtype, r * l.stride + col); };
  const auto bound = [&](double want, double magnitude) {
    return logits_tolerance(backend) * magnitude +
           (dtype == DType::bfloat16 ? std::ldexp(std::fabs(want), -8) : 0.0);
  };
  const auto untouched = [&](std::int64_t r, std::int64_t col) { return poisoned(first.bytes, element, r * l.stride + col); };
  EXPECT_TRUE(check_mqa_logits(w, w.reference(), c.compressed, l.width, l.stride, c.clean, read, bound, untouched));
  // Every defined column of a clean output was written: none is still poison.
  if (c.clean) {
    for (std::int64_t r = 0; r < w.rows; ++r) {
      for (std::int64_t col = 0; col < l.width; ++col) {
        ASSERT_FALSE(poisoned(first.bytes, element, r * l.stride + col)) << "row " << r << " col " << col;
      }
    }
  }
  // Bitwise repeatable, and the same without the synchronizing error check.
  gpu.ctx.check_device_errors = false;
  const PrefillRun second = run_prefill(d, l, dtype, gpu.ctx);
  DSA_GPU_ASSERT_OK(second.status);
  DSA_GPU_ASSERT_OK(dsa::read_device_error(gpu.ctx));
  EXPECT_TRUE(first.bytes == second.bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuPrefill,
    ::testing::Combine(::testing::Values(dsa::Backend::cuda_generic, dsa::Backend::automatic),
                       ::testing::ValuesIn(gpu_prefill_cases())),
    [](const ::testing::TestParamInfo<GpuPrefill::ParamType>& info) {
      return backend_tag(std::get<0>(info.param)) + "_" + std::get<1>(info.param).name;
    });

// cuda_hopper serves H 32 and 64 at D 128 (as automatic does on a Hopper
// GPU, bit for bit) and refuses other shapes by name.
TEST(GpuPrefillHopper, ServedShapesAndRefusals) {
  DSA_REQUIRE_HOPPER();
  const MqaWorkload w = make_mqa_workload(MqaSpec{.rows = 12, .heads = 64, .num_keys = 700});
  const DeviceMqa d(w, 0);
  PrefillCase c;
  c.spec = MqaSpec{.rows = 12, .heads = 64, .num_keys = 700};
  const PrefillLayout l = prefill_layout(c, w);
  GpuContext hopper(dsa::Backend::cuda_hopper, dsa::mqa_logits_workspace_bytes(dsa::ExecContext{}));
  hopper.ctx.check_device_errors = true;
  GpuContext automatic(dsa::Backend::automatic, dsa::mqa_logits_workspace_bytes(dsa::ExecContext{}));
  automatic.ctx.check_device_errors = true;
  const PrefillRun from_hopper = run_prefill(d, l, DType::float32, hopper.ctx);
  const PrefillRun from_automatic = run_prefill(d, l, DType::float32, automatic.ctx);
  DSA_GPU_ASSERT_OK(from_hopper.status);
  DSA_GPU_ASSERT_OK(from_automatic.status);
  EXPECT_TRUE(from_hopper.bytes == from_automatic.bytes);

  const MqaWorkload odd = make_mqa_workload(MqaSpec{.rows = 4, .heads = 8, .head_dim = 32, .num_keys = 64});
  const DeviceMqa d_odd(odd, 0);
  PrefillCase c_odd;
  c_odd.spec = MqaSpec{.rows = 4, .heads = 8, .head_dim = 32, .num_keys = 64};
  const PrefillRun refused = run_prefill(d_odd, prefill_layout(c_odd, odd), DType::float32, hopper.ctx);
  EXPECT_EQ(refused.status.code(), dsa::ErrorCode::unsupported) << refused.status.to_string();
  EXPECT_NE(refused.status.message().find("cuda_hopper"), std::string::npos) << refused.status.to_string();
}

// A row whose range breaks a rule is recorded and filled with NaN over its
// defined columns; the other rows are scored, nothing past the width is written.
TEST(GpuPrefillErrors, RangeViolationsAreRecordedOnTheDevice) {
  DSA_REQUIRE_GPU();
  struct Violation {
    std::vector<std::int32_t> ks, ke;
    bool compressed;
    std::int64_t bad_row;
    std::string message;
  };
  // S_kv = 64; max_seqlen_k = 16 when compressed.
  const std::vector<Violation> violations{
      {{0, 3, -2, 0}, {10, 9, 4, 64}, false, 2, "mqa_logits: ks: row 2 has ks = -2 with ke = 4"},
      {{0, 9, 0, 0}, {10, 3, 4, 64}, false, 1, "mqa_logits: ks: row 1 has ks = 9 with ke = 3"},
      {{0, 3, 0, 60}, {10, 9, 4, 65}, false, 3, "mqa_logits: ke: row 3 has ke = 65, beyond the 64 keys"},
      {{0, 3, 0, 20}, {10, 9, 4, 37}, true, 3,
       "mqa_logits: ke: row 3 has a range of 17 keys (ke - ks), beyond max_seqlen_k = 16"},
  };
  // Either kernel automatic picks: the generic one (H 8, D 32) and, on a
  // Hopper GPU, the sm_90a one (H 64, D 128).
  for (const auto& [heads, head_dim] : {std::pair{8, 32}, std::pair{64, 128}})
  for (const Violation& v : violations) {
    SCOPED_TRACE(v.message + " H " + std::to_string(heads));
    MqaWorkload w = make_mqa_workload(MqaSpec{.rows = 4, .heads = heads, .head_dim = head_dim, .num_keys = 64,
                                              .ranges = RangeShape::given, .ks = v.ks, .ke = v.ke, .seed = 17});
    const DeviceMqa d(w, 0);
    PrefillLayout l;
    l.width = v.compressed ? 16 : 64;
    l.cols = l.width;
    l.stride = l.width + 8;
    l.options.clean_logits = true;
    l.options.compressed = v.compressed;
    l.options.max_seqlen_k = v.compressed ? 16 : 0;
    GpuContext gpu(dsa::Backend::automatic, dsa::mqa_logits_workspace_bytes(dsa::ExecContext{}));
    gpu.ctx.check_device_errors = true;
    const PrefillRun synced = run_prefill(d, l, DType::float32, gpu.ctx);
    EXPECT_EQ(synced.status.code(), dsa::ErrorCode::length_out_of_range) << synced.status.to_string();
    EXPECT_NE(synced.status.message().find(v.message), std::string::npos) << synced.status.to_string();
    gpu.ctx.check_device_errors = false;
    const PrefillRun later = run_prefill(d, l, DType::float32, gpu.ctx);
    DSA_GPU_ASSERT_OK(later.status);
    // The record names the rule; read_device_error names itself as the operation.
    const dsa::Status recorded = dsa::read_device_error(gpu.ctx);
    EXPECT_EQ(recorded.code(), dsa::ErrorCode::length_out_of_range) << recorded.to_string();
    const std::string rule = v.message.substr(std::string("mqa_logits: ").size());
    EXPECT_NE(recorded.message().find("read_device_error: " + rule), std::string::npos) << recorded.to_string();
    for (std::int64_t r = 0; r < w.rows; ++r) {
      for (std::int64_t col = 0; col < l.stride; ++col) {
        const float got = logit_at(synced.bytes, DType::float32, r * l.stride + col);
        if (col >= l.width) {
          ASSERT_TRUE(poisoned(synced.bytes, 4, r * l.stride + col)) << "row " << r << " col " << col;
        } else if (r == v.bad_row) {
          ASSERT_TRUE(std::isnan(got)) << "row " << r << " col " << col;
        } else {
          ASSERT_FALSE(std::isnan(got)) << "row " << r << " col " << col;
        }
      }
    }
    EXPECT_TRUE(synced.bytes == later.bytes);
  }
}

}  // namespace
}  // namespace dsa_test::gpu
