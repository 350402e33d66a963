// The CUDA backends' key store, query quantization, length builders and
// device schedule planner against the host references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;

std::vector<std::uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<std::uint16_t> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = bf16_encode(values[i]);
  return out;
}
std::vector<float> bf16_values(const std::vector<float>& values) {
  std::vector<float> out(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) out[i] = bf16_round(values[i]);
  return out;
}

// ---- store_index_keys -----------------------------------------------------

struct StoreCase {
  int head_dim;
  DType keys_dtype;
  DType slots_dtype;
  bool power_of_two;
  int page_tokens = 64;
  bool view_4d = false;  // the DeepGEMM view (which tells the page size), else 2-D with the option
};

class GpuStoreKeys : public ::testing::TestWithParam<StoreCase> {};

TEST_P(GpuStoreKeys, BitExactWithReference) {
  DSA_REQUIRE_GPU();
  const StoreCase c = GetParam();
  Rng rng(c.head_dim * 7 + static_cast<int>(c.keys_dtype));
  CacheGeometry geometry;
  geometry.head_dim = c.head_dim;
  geometry.page_tokens = c.page_tokens;
  geometry.num_pages = 320 / c.page_tokens;
  geometry.page_stride = std::int64_t{c.page_tokens} * (c.head_dim + 4) + 16;
  const std::int64_t tokens = 150;
  std::vector<float> keys(static_cast<std::size_t>(tokens * c.head_dim));
  for (std::int64_t t = 0; t < tokens; ++t) random_vector(rng, keys.data() + t * c.head_dim, c.head_dim);
  // Distinct slots in random order, some tokens padding (-1).
  std::vector<std::int64_t> slots(static_cast<std::size_t>(geometry.num_slots()));
  for (std::size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<std::int64_t>(i);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(static_cast<std::size_t>(tokens));
  for (std::size_t i = 0; i < slots.size(); i += 11) slots[i] = -1;

  std::vector<std::uint8_t> expected(static_cast<std::size_t>(geometry.bytes()));
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<std::uint8_t>(i * 29 + 3);
  const dsa::DeviceBuffer cache = device_copy(expected);
  const std::vector<float> stored_keys = c.keys_dtype == DType::bfloat16 ? bf16_values(keys) : keys;
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (slots[t] >= 0) store_token(stored_keys.data() + t * c.head_dim, slots[t], geometry, c.power_of_two, expected.data());
  }

  const dsa::DeviceBuffer keys_device =
      c.keys_dtype == DType::bfloat16 ? device_copy(to_bf16(keys)) : device_copy(keys);
  std::vector<std::int32_t> slots32(slots.begin(), slots.end());
  const dsa::DeviceBuffer slots_device = c.slots_dtype == DType::int32 ? device_copy(slots32) : device_copy(slots);
  GpuContext gpu(Backend::cuda_generic, 0);
  gpu.ctx.check_device_errors = true;
  dsa::StoreKeysOptions options;
  options.power_of_two_scales = c.power_of_two;
  options.page_size = c.view_4d ? 0 : c.page_tokens;
  const std::int64_t width = c.head_dim + 4;
  const dsa::TensorView cache_view =
      c.view_4d ? device_view(cache, DType::uint8, {geometry.num_pages, c.page_tokens, 1, width},
                              {geometry.page_stride, width, width, 1})
                : device_view(cache, DType::uint8, {geometry.num_pages, geometry.page_stride});
  DSA_GPU_ASSERT_OK(dsa::store_index_keys(device_view(keys_device, c.keys_dtype, {tokens, c.head_dim}),
                                          device_view(slots_device, c.slots_dtype, {tokens}), cache_view, options,
                                          gpu.ctx));
  const std::vector<std::uint8_t> got = host_copy<std::uint8_t>(cache);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "cache byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuStoreKeys,
                         ::testing::Values(StoreCase{128, DType::float32, DType::int64, false},
                                           StoreCase{128, DType::bfloat16, DType::int32, false},
                                           StoreCase{128, DType::float32, DType::int32, true},
                                           StoreCase{64, DType::bfloat16, DType::int64, true},
                                           StoreCase{48, DType::float32, DType::int64, false},
                                           StoreCase{128, DType::bfloat16, DType::int32, false, 32},
                                           StoreCase{128, DType::float32, DType::int64, true, 32, true},
                                           StoreCase{64, DType::bfloat16, DType::int32, true, 64, true},
                                           StoreCase{48, DType::float32, DType::int64, false, 32}));

TEST(GpuStoreKeysErrors, SlotBeyondCacheIsRecordedAndSkipped) {
  DSA_REQUIRE_GPU();
  for (const int page_tokens : {64, 32}) {
    SCOPED_TRACE("pages of " + std::to_string(page_tokens));
    const int head_dim = 128;
    CacheGeometry geometry;
    geometry.head_dim = head_dim;
    geometry.page_tokens = page_tokens;
    geometry.num_pages = 4 * 32 / page_tokens;  // 128 slots
    geometry.page_stride = std::int64_t{page_tokens} * (head_dim + 4);
    Rng rng(5);
    std::vector<float> keys(3 * head_dim);
    for (int t = 0; t < 3; ++t) random_vector(rng, keys.data() + t * head_dim, head_dim);
    const std::vector<std::int64_t> slots = {3, geometry.num_slots() + 10, 100};
    std::vector<std::uint8_t> expected(static_cast<std::size_t>(geometry.bytes()), 0xAB);
    const dsa::DeviceBuffer cache = device_copy(expected);
    store_token(keys.data(), 3, geometry, false, expected.data());
    store_token(keys.data() + 2 * head_dim, 100, geometry, false, expected.data());
    const dsa::DeviceBuffer keys_device = device_copy(keys);
    const dsa::DeviceBuffer slots_device = device_copy(slots);
    for (bool check : {true, false}) {
      GpuContext gpu(Backend::cuda_generic, 0);
      gpu.ctx.check_device_errors = check;
      dsa::StoreKeysOptions options;
      options.page_size = page_tokens;
      const dsa::Status status = dsa::store_index_keys(
          device_view(keys_device, DType::float32, {3, head_dim}), device_view(slots_device, DType::int64, {3}),
          device_view(cache, DType::uint8, {geometry.num_pages, geometry.page_stride}), options, gpu.ctx);
      const dsa::Status reported = check ? status : dsa::read_device_error(gpu.ctx);
      if (!check) DSA_GPU_ASSERT_OK(status);
      EXPECT_EQ(reported.code(), dsa::ErrorCode::page_out_of_range) << reported.to_string();
      EXPECT_EQ(host_copy<std::uint8_t>(cache), expected);
    }
  }
}

// ---- quantize_queries -------------------------------------------------------

TEST(GpuQuantizeQueries, BitExactWithReference) {
  DSA_REQUIRE_GPU();
  for (DType dtype : {DType::float32, DType::bfloat16}) {
    for (bool power_of_two : {false, true}) {
      const std::int64_t batch = 3, next_n = 2;
      const int heads = 64, head_dim = 128;
      const std::int64_t rows = batch * next_n;
      Rng rng(11 + power_of_two);
      std::vector<float> q(static_cast<std::size_t>(rows * heads * head_dim));
      for (std::int64_t i = 0; i < rows * heads; ++i) random_vector(rng, q.data() + i * head_dim, head_dim);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> gate(static_cast<std::size_t>(rows * heads));
      for (auto& g : gate) g = normal(rng);
      const std::vector<float> q_used = dtype == DType::bfloat16 ? bf16_values(q) : q;
      const std::vector<float> gate_used = dtype == DType::bfloat16 ? bf16_values(gate) : gate;
      std::vector<std::uint8_t> want_fp8(q.size());
      std::vector<float> want_weights(gate.size());
      const float weight_scale = default_weight_scale(heads, head_dim);
      quantize_queries(q_used.data(), gate_used.data(), rows, heads, head_dim, power_of_two, weight_scale,
                       want_fp8.data(), want_weights.data());

      const dsa::DeviceBuffer q_device = dtype == DType::bfloat16 ? device_copy(to_bf16(q)) : device_copy(q);
      const dsa::DeviceBuffer gate_device = dtype == DType::bfloat16 ? device_copy(to_bf16(gate)) : device_copy(gate);
      const dsa::DeviceBuffer fp8 = device_filled(q.size(), 0xEE);
      const dsa::DeviceBuffer weights = device_filled(gate.size() * 4, 0xEE);
      GpuContext gpu(Backend::cuda_generic, 0);
      gpu.ctx.check_device_errors = true;
      dsa::QuantizeQueriesOptions options;
      options.power_of_two_scales = power_of_two;
      DSA_GPU_ASSERT_OK(dsa::quantize_queries(device_view(q_device, dtype, {batch, next_n, heads, head_dim}),
                                              device_view(gate_device, dtype, {rows, heads}),
                                              device_view(fp8, DType::float8_e4m3, {batch, next_n, heads, head_dim}),
                                              device_view(weights, DType::float32, {rows, heads}), options, gpu.ctx));
      EXPECT_EQ(host_copy<std::uint8_t>(fp8), want_fp8);
      const std::vector<float> got_weights = host_copy<float>(weights);
      ASSERT_EQ(got_weights.size(), want_weights.size());
      EXPECT_EQ(0, std::memcmp(got_weights.data(), want_weights.data(), 4 * got_weights.size()))
          << "weights differ bitwise (dtype " << dsa::dtype_name(dtype) << ")";
    }
  }
}

// ---- context lengths --------------------------------------------------------

TEST(GpuContextLens, ThreeConventions) {
  DSA_REQUIRE_GPU();
  std::vector<std::int32_t> prefix = {0, 1, 2, 7, 64, 1000, 65535};
  // A strided input: every other element.
  std::vector<std::int32_t> strided(2 * prefix.size(), -99);
  for (std::size_t i = 0; i < prefix.size(); ++i) strided[2 * i] = prefix[i];
  const dsa::DeviceBuffer input = device_copy(strided);
  const auto batch = static_cast<std::int64_t>(prefix.size());
  for (int next_n : {1, 2, 4, 8}) {
    const dsa::TensorView in = device_view(input, DType::int32, {batch}, {2});
    const dsa::DeviceBuffer out = device_filled(4 * batch * next_n, 0xFF);
    const dsa::TensorView out_view = device_view(out, DType::int32, {batch, next_n});
    GpuContext gpu(Backend::cuda_generic, 0);
    gpu.ctx.check_device_errors = true;
    DSA_GPU_ASSERT_OK(dsa::causal_context_lens(in, next_n, out_view, gpu.ctx));
    EXPECT_EQ(host_copy<std::int32_t>(out), causal_lens(prefix, next_n));
    DSA_GPU_ASSERT_OK(dsa::expanded_context_lens(in, next_n, out_view, gpu.ctx));
    EXPECT_EQ(host_copy<std::int32_t>(out), expanded_lens(prefix, next_n));
    DSA_GPU_ASSERT_OK(dsa::legacy_context_lens(in, next_n, out_view, gpu.ctx));
    EXPECT_EQ(host_copy<std::int32_t>(out), legacy_lens(prefix, next_n));
  }
}

TEST(GpuContextLens, NegativeInputIsRecorded) {
  DSA_REQUIRE_GPU();
  const std::vector<std::int32_t> prefix = {5, -3, 9};
  const dsa::DeviceBuffer input = device_copy(prefix);
  const dsa::DeviceBuffer out = device_filled(4 * 3 * 2, 0xFF);
  GpuContext gpu(Backend::cuda_generic, 0);
  gpu.ctx.check_device_errors = true;
  const dsa::Status status = dsa::causal_context_lens(device_view(input, DType::int32, {3}), 2,
                                                      device_view(out, DType::int32, {3, 2}), gpu.ctx);
  EXPECT_EQ(status.code(), dsa::ErrorCode::invalid_argument) << status.to_string();
  EXPECT_EQ(host_copy<std::int32_t>(out), (std::vector<std::int32_t>{6, 7, 1, 2, 10, 11}));  // clamped to 0
}

// ---- plan_schedule ----------------------------------------------------------

// The device planner writes exactly the host plan: for one unit per planner
// thread and fewer (1025 units), many units per thread (100000), one request
// for many workers, and more workers than planner threads (2500).
TEST(GpuPlanSchedule, MatchesHostPlan) {
  DSA_REQUIRE_GPU();
  Rng rng(3);
  const std::int64_t batches[] = {0, 1, 5, 333, 1025, 30000, 100000};
  for (const std::int64_t batch : batches) {
    for (int next_n : {1, 2, 4, 7}) {
      if (batch * next_n > 60000 && next_n > 2) continue;
      std::vector<std::int32_t> lens(static_cast<std::size_t>(batch * next_n));
      std::uniform_int_distribution<std::int32_t> length(0, 3000);
      for (std::size_t i = 0; i < lens.size(); ++i) lens[i] = i % 5 == 0 ? 0 : length(rng);
      if (!lens.empty()) lens[0] = 0;  // an empty first unit
      const dsa::DeviceBuffer lens_device = device_copy(lens.empty() ? std::vector<std::int32_t>{0} : lens);
      for (int workers : {1, 3, 132, 1000, 2500}) {
        for (dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
          std::vector<std::int32_t> host(static_cast<std::size_t>(2 * (workers + 1)), -5);
          dsa::ExecContext cpu;
          cpu.backend = Backend::cpu_reference;
          std::vector<std::int32_t> host_lens = lens;
          host_lens.reserve(1);
          DSA_GPU_ASSERT_OK(dsa::plan_schedule(dsa::make_view(host_lens.data(), DType::int32, {batch, next_n}), workers,
                                               path, dsa::make_view(host.data(), DType::int32, {workers + 1, 2}), cpu));
          GpuContext gpu(Backend::cuda_generic, 0);
          gpu.ctx.check_device_errors = true;
          const dsa::DeviceBuffer schedule = device_filled(host.size() * 4, 0xFF);
          DSA_GPU_ASSERT_OK(dsa::plan_schedule(device_view(lens_device, DType::int32, {batch, next_n}), workers, path,
                                               device_view(schedule, DType::int32, {workers + 1, 2}), gpu.ctx));
          ASSERT_EQ(host_copy<std::int32_t>(schedule), host)
              << "batch " << batch << " next_n " << next_n << " workers " << workers << " "
              << dsa::logits_path_name(path);
          // Walking the plan covers every item once.
          const auto shares = worker_shares(host.data(), workers, lens, batch, next_n,
                                            path == dsa::LogitsPath::per_token);
          std::int64_t covered = 0;
          for (const WorkerShare& share : shares) covered += share.items;
          std::int64_t total = 0;
          const std::int64_t units = path == dsa::LogitsPath::per_token ? batch * next_n : batch;
          for (std::int64_t u = 0; u < units; ++u) {
            std::int64_t longest = 0;
            if (path == dsa::LogitsPath::per_token) {
              longest = lens[u];
            } else {
              for (int j = 0; j < next_n; ++j) longest = std::max<std::int64_t>(longest, lens[u * next_n + j]);
            }
            total += (longest + 255) / 256;
          }
          EXPECT_EQ(covered, total);
        }
      }
    }
  }
}

// With request_offsets (row tiles of kVarlenRowTile rows named by their
// first row): few rows for many workers, and many rows of requests from 0 to
// 40 rows, so that planner segments start inside row tiles.
TEST(GpuPlanSchedule, MatchesHostPlanWithRequestOffsets) {
  DSA_REQUIRE_GPU();
  Rng rng(11);
  for (const std::int64_t requests : {1, 3, 700, 20000}) {
    std::vector<std::int32_t> offsets{0};
    std::uniform_int_distribution<int> rows_of(0, requests == 1 ? 12 : 40);
    for (std::int64_t b = 0; b < requests; ++b) offsets.push_back(offsets.back() + rows_of(rng));
    const std::int64_t rows = offsets.back();
    std::vector<std::int32_t> lens(static_cast<std::size_t>(rows));
    std::uniform_int_distribution<std::int32_t> length(0, 5000);
    for (std::size_t i = 0; i < lens.size(); ++i) lens[i] = i % 7 == 3 ? 0 : length(rng);
    const dsa::DeviceBuffer lens_device = device_copy(lens.empty() ? std::vector<std::int32_t>{0} : lens);
    const dsa::DeviceBuffer offsets_device = device_copy(offsets);
    lens.reserve(1);
    for (int workers : {1, 7, 132, 1000, 2500}) {
      for (dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
        std::vector<std::int32_t> host(static_cast<std::size_t>(2 * (workers + 1)), -5);
        dsa::ExecContext cpu;
        cpu.backend = Backend::cpu_reference;
        DSA_GPU_ASSERT_OK(dsa::plan_schedule(dsa::make_view(lens.data(), DType::int32, {rows}), workers, path,
                                             dsa::make_view(host.data(), DType::int32, {workers + 1, 2}), cpu,
                                             dsa::make_view(offsets.data(), DType::int32, {requests + 1})));
        GpuContext gpu(Backend::cuda_generic, 0);
        gpu.ctx.check_device_errors = true;
        const dsa::DeviceBuffer schedule = device_filled(host.size() * 4, 0xFF);
        DSA_GPU_ASSERT_OK(dsa::plan_schedule(device_view(lens_device, DType::int32, {rows}), workers, path,
                                             device_view(schedule, DType::int32, {workers + 1, 2}), gpu.ctx,
                                             device_view(offsets_device, DType::int32, {requests + 1})));
        ASSERT_EQ(host_copy<std::int32_t>(schedule), host)
            << "requests " << requests << " rows " << rows << " workers " << workers << " "
            << dsa::logits_path_name(path);
      }
    }
  }
}

// ---- context_lens_and_schedule ------------------------------------------------

// One kernel writes what the builder and the planner write: the conventions'
// formulas (strided input, padded output rows) and the host plan of those
// lengths, for batches from one unit to more than the planner's threads.
TEST(GpuContextLensAndSchedule, MatchesTheFormulasAndTheHostPlan) {
  DSA_REQUIRE_GPU();
  Rng rng(17);
  const std::pair<dsa::LengthConvention, std::vector<std::int32_t> (*)(const std::vector<std::int32_t>&, int)>
      conventions[] = {{dsa::LengthConvention::causal, causal_lens},
                       {dsa::LengthConvention::expanded, expanded_lens},
                       {dsa::LengthConvention::legacy, legacy_lens}};
  for (const auto& [convention, formula] : conventions) {
    for (const std::int64_t batch : {1, 32, 333, 3000}) {
      for (const int next_n : {1, 2, 4, 8}) {
        std::vector<std::int32_t> prefix(static_cast<std::size_t>(batch));
        std::uniform_int_distribution<std::int32_t> length(0, 70000);
        for (std::size_t i = 0; i < prefix.size(); ++i) prefix[i] = i % 9 == 4 ? 0 : length(rng);
        std::vector<std::int32_t> strided(2 * prefix.size(), -99);
        for (std::size_t i = 0; i < prefix.size(); ++i) strided[2 * i] = prefix[i];
        const dsa::DeviceBuffer input = device_copy(strided);
        const std::vector<std::int32_t> want_lens = formula(prefix, next_n);
        const std::int64_t padded = next_n + 1;
        for (const int workers : {1, 132, 2500}) {
          for (const dsa::LogitsPath path : {dsa::LogitsPath::native, dsa::LogitsPath::per_token}) {
            SCOPED_TRACE("batch " + std::to_string(batch) + " next_n " + std::to_string(next_n) + " workers " +
                         std::to_string(workers) + " " + dsa::logits_path_name(path));
            std::vector<std::int32_t> want_schedule(static_cast<std::size_t>(2 * (workers + 1)), -5);
            std::vector<std::int32_t> host_lens = want_lens;
            dsa::ExecContext cpu;
            cpu.backend = Backend::cpu_reference;
            DSA_GPU_ASSERT_OK(dsa::plan_schedule(dsa::make_view(host_lens.data(), DType::int32, {batch, next_n}),
                                                 workers, path,
                                                 dsa::make_view(want_schedule.data(), DType::int32, {workers + 1, 2}),
                                                 cpu));
            const dsa::DeviceBuffer lens = device_filled(4 * batch * padded, 0xFF);
            const dsa::DeviceBuffer schedule = device_filled(want_schedule.size() * 4, 0xFF);
            GpuContext gpu(Backend::cuda_generic, 0);
            gpu.ctx.check_device_errors = true;
            DSA_GPU_ASSERT_OK(dsa::context_lens_and_schedule(
                convention, device_view(input, DType::int32, {batch}, {2}), next_n,
                device_view(lens, DType::int32, {batch, next_n}, {padded, 1}), workers, path,
                device_view(schedule, DType::int32, {workers + 1, 2}), gpu.ctx));
            const std::vector<std::int32_t> got_lens = host_copy<std::int32_t>(lens);
            for (std::int64_t b = 0; b < batch; ++b) {
              for (int j = 0; j < next_n; ++j) {
                ASSERT_EQ(got_lens[b * padded + j], want_lens[b * next_n + j]) << b << ", " << j;
              }
              ASSERT_EQ(got_lens[b * padded + next_n], -1) << "padding of row " << b;
            }
            ASSERT_EQ(host_copy<std::int32_t>(schedule), want_schedule);
          }
        }
      }
    }
  }
}

TEST(GpuContextLensAndSchedule, UnevenRequestsMatchTheHostCall) {
  DSA_REQUIRE_GPU();
  Rng rng(19);
  for (const std::int64_t requests : {1, 40, 5000}) {
    std::vector<std::int32_t> offsets{0}, prefix;
    std::uniform_int_distribution<int> rows_of(0, 20);
    std::uniform_int_distribution<std::int32_t> length(0, 9000);
    for (std::int64_t b = 0; b < requests; ++b) {
      offsets.push_back(offsets.back() + rows_of(rng));
      prefix.push_back(length(rng));
    }
    const std::int64_t rows = offsets.back();
    for (const int workers : {3, 132}) {
      std::vector<std::int32_t> want_lens(static_cast<std::size_t>(rows) + 1, -5);
      std::vector<std::int32_t> want_schedule(static_cast<std::size_t>(2 * (workers + 1)), -5);
      dsa::ExecContext cpu;
      cpu.backend = Backend::cpu_reference;
      DSA_GPU_ASSERT_OK(dsa::context_lens_and_schedule(
          dsa::LengthConvention::causal, dsa::make_view(prefix.data(), DType::int32, {requests}), 1,
          dsa::make_view(want_lens.data(), DType::int32, {rows}), workers, dsa::LogitsPath::automatic,
          dsa::make_view(want_schedule.data(), DType::int32, {workers + 1, 2}), cpu,
          dsa::make_view(offsets.data(), DType::int32, {requests + 1})));
      want_lens.pop_back();
      // The host call's lengths against the rule itself.
      for (std::int64_t b = 0; b < requests; ++b) {
        for (std::int32_t r = offsets[b]; r < offsets[b + 1]; ++r) ASSERT_EQ(want_lens[r], prefix[b] + r - offsets[b] + 1);
      }
      const dsa::DeviceBuffer prefix_device = device_copy(prefix), offsets_device = device_copy(offsets);
      const dsa::DeviceBuffer lens = device_filled(4 * std::max<std::int64_t>(rows, 1), 0xFF);
      const dsa::DeviceBuffer schedule = device_filled(want_schedule.size() * 4, 0xFF);
      GpuContext gpu(Backend::cuda_generic, 0);
      gpu.ctx.check_device_errors = true;
      DSA_GPU_ASSERT_OK(dsa::context_lens_and_schedule(
          dsa::LengthConvention::causal, device_view(prefix_device, DType::int32, {requests}), 1,
          device_view(lens, DType::int32, {rows}), workers, dsa::LogitsPath::automatic,
          device_view(schedule, DType::int32, {workers + 1, 2}), gpu.ctx,
          device_view(offsets_device, DType::int32, {requests + 1})));
      std::vector<std::int32_t> got_lens = host_copy<std::int32_t>(lens);
      got_lens.resize(static_cast<std::size_t>(rows));
      EXPECT_EQ(got_lens, want_lens) << "requests " << requests << " workers " << workers;
      EXPECT_EQ(host_copy<std::int32_t>(schedule), want_schedule) << "requests " << requests << " workers " << workers;
    }
  }
}

// A negative prefix is clamped and recorded, as the builder does, and the
// record survives the clearing the same kernel does first.
TEST(GpuContextLensAndSchedule, NegativeInputIsRecorded) {
  DSA_REQUIRE_GPU();
  const std::vector<std::int32_t> prefix = {5, -3, 9};
  const dsa::DeviceBuffer input = device_copy(prefix);
  const dsa::DeviceBuffer out = device_filled(4 * 3 * 2, 0xFF);
  const dsa::DeviceBuffer schedule = device_filled(4 * 5 * 2, 0xFF);
  GpuContext gpu(Backend::cuda_generic, 0);
  gpu.ctx.check_device_errors = true;
  for (int repeat = 0; repeat < 3; ++repeat) {
    const dsa::Status status = dsa::context_lens_and_schedule(
        dsa::LengthConvention::causal, device_view(input, DType::int32, {3}), 2, device_view(out, DType::int32, {3, 2}),
        4, dsa::LogitsPath::native, device_view(schedule, DType::int32, {5, 2}), gpu.ctx);
    EXPECT_EQ(status.code(), dsa::ErrorCode::invalid_argument) << status.to_string();
    EXPECT_NE(status.message().find("context_lens_and_schedule"), std::string::npos) << status.to_string();
  }
  EXPECT_EQ(host_copy<std::int32_t>(out), (std::vector<std::int32_t>{6, 7, 1, 2, 10, 11}));  // clamped to 0
  // A clean call after it reports nothing: the kernel cleared the record.
  const std::vector<std::int32_t> good = {5, 3, 9};
  const dsa::DeviceBuffer good_input = device_copy(good);
  DSA_GPU_ASSERT_OK(dsa::context_lens_and_schedule(
      dsa::LengthConvention::causal, device_view(good_input, DType::int32, {3}), 2,
      device_view(out, DType::int32, {3, 2}), 4, dsa::LogitsPath::native, device_view(schedule, DType::int32, {5, 2}),
      gpu.ctx));
}

}  // namespace
}  // namespace dsa_test::gpu
