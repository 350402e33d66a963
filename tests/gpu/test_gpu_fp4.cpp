// The fp4 key and query formats on the CUDA backends: store_index_keys and
// quantize_queries_fp4 bit for bit against the independent quantizer,
// paged_mqa_logits with fp4 keys or queries on the generic kernels and on the
// Hopper kernels (fp4 keys with fp8 or fp4 queries, which Backend::automatic
// picks there), also with request_offsets (and index_topk), and mqa_logits
// with fp4 queries and keys against the float64 reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/fp4_reference.hpp"
#include "gpu/gpu_test_support.hpp"

namespace dsa_test::gpu {
namespace {

using dsa::Backend;
using dsa::DType;

constexpr int kD = 128;

class GpuFp4Store : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GpuFp4Store, BitExactWithTheIndependentQuantizer) {
  DSA_REQUIRE_GPU();
  const auto [page_tokens, bf16] = GetParam();
  const std::int64_t tokens = 150, num_pages = 320 / page_tokens;
  Rng rng(page_tokens + (bf16 ? 1 : 0));
  std::vector<float> keys(static_cast<std::size_t>(tokens * kD));
  for (std::int64_t t = 0; t < tokens; ++t) random_vector(rng, keys.data() + t * kD, kD);
  std::vector<std::uint16_t> keys_bf16(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    keys_bf16[i] = bf16_encode(keys[i]);
    if (bf16) keys[i] = bf16_decode(keys_bf16[i]);
  }
  std::vector<std::int64_t> slots(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    slots[static_cast<std::size_t>(t)] = t % 11 == 0 ? -1 : (t * 37) % (num_pages * page_tokens);
  }
  Fp4CacheGeometry geometry{num_pages, std::int64_t{page_tokens} * 68 + 16, page_tokens};
  std::vector<std::uint8_t> expected(static_cast<std::size_t>(num_pages * geometry.page_stride), 0x3C);
  const dsa::DeviceBuffer cache = device_copy(expected);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::int64_t slot = slots[static_cast<std::size_t>(t)];
    if (slot < 0) continue;
    const std::uint32_t word = fp4_quantize(keys.data() + t * kD, kD, expected.data() + geometry.code_byte(slot));
    std::memcpy(expected.data() + geometry.word_byte(slot), &word, sizeof word);
  }
  const dsa::DeviceBuffer keys_device = bf16 ? device_copy(keys_bf16) : device_copy(keys);
  const dsa::DeviceBuffer slots_device = device_copy(slots);
  GpuContext gpu(Backend::cuda_generic, 0);
  gpu.ctx.check_device_errors = true;
  dsa::StoreKeysOptions options;
  options.page_size = page_tokens;
  options.key_format = dsa::KeyFormat::fp4_e2m1;
  DSA_GPU_ASSERT_OK(dsa::store_index_keys(device_view(keys_device, bf16 ? DType::bfloat16 : DType::float32, {tokens, kD}),
                                          device_view(slots_device, DType::int64, {tokens}),
                                          device_view(cache, DType::uint8, {num_pages, geometry.page_stride}),
                                          options, gpu.ctx));
  const std::vector<std::uint8_t> got = host_copy<std::uint8_t>(cache);
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], expected[i]) << "cache byte " << i;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuFp4Store,
                         ::testing::Combine(::testing::Values(64, 32), ::testing::Values(false, true)));

TEST(GpuFp4QuantizeQueries, BitExactWithTheIndependentQuantizer) {
  DSA_REQUIRE_GPU();
  const Workload w = make_workload(WorkloadSpec{.batch = 3, .next_n = 2, .heads = 16, .seed = 9});
  const Fp4Queries want = fp4_queries_of(w);
  const dsa::DeviceBuffer q = device_copy(w.q);
  const dsa::DeviceBuffer gate = device_copy(w.head_gate);
  const dsa::DeviceBuffer codes = device_filled(want.codes.size(), 0xEE);
  const dsa::DeviceBuffer scales = device_filled(want.scales.size() * 4, 0xEE);
  const dsa::DeviceBuffer weights = device_filled(want.weights.size() * 4, 0xEE);
  GpuContext gpu(Backend::cuda_generic, 0);
  dsa::QuantizeQueriesOptions options;
  options.weight_scale = default_weight_scale(w.heads, kD);
  DSA_GPU_ASSERT_OK(dsa::quantize_queries_fp4(
      device_view(q, DType::float32, {w.batch, w.next_n, w.heads, kD}),
      device_view(gate, DType::float32, {w.rows(), w.heads}),
      device_view(codes, DType::uint8, {w.batch, w.next_n, w.heads, kD / 2}),
      device_view(scales, DType::int32, {w.batch, w.next_n, w.heads}),
      device_view(weights, DType::float32, {w.rows(), w.heads}), options, gpu.ctx));
  DSA_GPU_ASSERT_OK(gpu.sync());
  EXPECT_EQ(host_copy<std::uint8_t>(codes), want.codes);
  EXPECT_EQ(host_copy<std::int32_t>(scales), want.scales);
  EXPECT_EQ(host_copy<float>(weights), want.weights);
}

struct Fp4GpuCase {
  WorkloadSpec spec;
  bool fp4_queries;
  Backend backend;
  // Every 7th token's block scales spread 2^20 apart: beyond what the Hopper
  // kernels' e5m2 products hold exactly, so those stages take the exact path.
  bool wide_tokens = false;
  // The same for every 5th query head (fp4 queries): every stage of such a
  // unit takes the exact path.
  bool wide_query_heads = false;
  // Every 3rd token has a block of zero codes whose exponent lies 2^100 below
  // the others': it adds nothing, so the products stay exact.
  bool zero_blocks_far_below = false;
  // bfloat16 logits without clean_logits (otherwise float32, cleaned).
  bool bf16_unclean = false;
};

// Spreads the block exponents of every 5th query head (2^+10 and 2^-10 around
// its first block's).
void spread_query_block_scales(Fp4Queries* queries) {
  for (std::size_t head = 2; head < queries->scales.size(); head += 5) {
    auto word = static_cast<std::uint32_t>(queries->scales[head]);
    const int exponent = static_cast<int>(word & 0xFFu);
    word = (word & 0xFF0000FFu) | static_cast<std::uint32_t>(std::clamp(exponent + 10, 1, 254)) << 8 |
           static_cast<std::uint32_t>(std::clamp(exponent - 10, 1, 254)) << 16;
    queries->scales[head] = static_cast<std::int32_t>(word);
  }
}

// Zeroes block 3 of every 3rd token and sets its exponent to 1.
void zero_far_blocks(Fp4Cache* cache) {
  const std::int64_t slots = cache->geometry.num_pages * cache->geometry.page_tokens;
  for (std::int64_t slot = 1; slot < slots; slot += 3) {
    std::memset(cache->bytes.data() + cache->geometry.code_byte(slot) + 48, 0, 16);
    cache->bytes[static_cast<std::size_t>(cache->geometry.word_byte(slot) + 3)] = 1;
  }
}

// Spreads the block exponents of every 7th token of the cache (2^+10 and 2^-10
// around the first block's).
void spread_block_scales(Fp4Cache* cache) {
  const std::int64_t slots = cache->geometry.num_pages * cache->geometry.page_tokens;
  for (std::int64_t slot = 3; slot < slots; slot += 7) {
    std::uint8_t* word = cache->bytes.data() + cache->geometry.word_byte(slot);
    const int exponent = word[0];
    word[1] = static_cast<std::uint8_t>(std::clamp(exponent + 10, 1, 254));
    word[2] = static_cast<std::uint8_t>(std::clamp(exponent - 10, 1, 254));
  }
}

// An fp4 cache and fp4 queries (codes, block scales, weights) on the device.
struct DeviceFp4 {
  DeviceFp4(const Fp4Cache& cache_bytes, const Fp4Queries& queries)
      : cache(device_copy(cache_bytes.bytes)),
        codes(device_copy(queries.codes)),
        scales(device_copy(queries.scales)),
        weights(device_copy(queries.weights)) {}
  dsa::DeviceBuffer cache, codes, scales, weights;
};

// backend, query format, rows, heads, page size and the data's special cases.
std::string fp4_case_name(const Fp4GpuCase& c) {
  std::string name = std::string(dsa::backend_name(c.backend)) + (c.fp4_queries ? "_fp4q" : "_fp8q") + "_n" +
                     std::to_string(c.spec.next_n) + "_h" + std::to_string(c.spec.heads) + "_p" +
                     std::to_string(c.spec.page_tokens);
  if (c.wide_tokens) name += "_wide_tokens";
  if (c.wide_query_heads) name += "_wide_query_heads";
  if (c.zero_blocks_far_below) name += "_zero_blocks";
  if (c.bf16_unclean) name += "_bf16_unclean";
  return name;
}

class GpuFp4Logits : public ::testing::TestWithParam<Fp4GpuCase> {};

TEST_P(GpuFp4Logits, MatchesTheFloat64Reference) {
  DSA_REQUIRE_GPU();
  const Fp4GpuCase c = GetParam();
  if (c.backend == Backend::cuda_hopper) DSA_REQUIRE_HOPPER();
  const Workload w = make_workload(c.spec);
  Fp4Cache cache = fp4_cache_of(w);
  if (c.wide_tokens) spread_block_scales(&cache);
  if (c.zero_blocks_far_below) zero_far_blocks(&cache);
  Fp4Queries queries = fp4_queries_of(w);
  if (c.wide_query_heads) spread_query_block_scales(&queries);
  const DeviceWorkload dw(w);
  const DeviceFp4 device(cache, queries);
  GpuContext gpu(c.backend, 0);
  gpu.ctx.check_device_errors = true;
  const int workers = dsa::default_num_workers(kGpu, gpu.ctx);
  const dsa::LogitsPath path = dsa::resolve_logits_path(dsa::LogitsPath::automatic, w.next_n, w.heads, kGpu, gpu.ctx);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, workers, path, gpu.ctx);
  const std::int64_t stride = w.max_context_len + 3;
  const DType dtype = c.bf16_unclean ? DType::bfloat16 : DType::float32;
  const dsa::DeviceBuffer logits =
      device_filled(static_cast<std::size_t>(w.rows() * stride) * dsa::dtype_size(dtype), 0xFF);
  const Fp4CacheGeometry& g = cache.geometry;
  dsa::LogitsOptions options;
  options.clean_logits = !c.bf16_unclean;
  const dsa::TensorView q = c.fp4_queries ? device_view(device.codes, DType::uint8, {w.batch, w.next_n, w.heads, kD / 2})
                                          : dw.q_view();
  if (c.fp4_queries) options.q_block_scales = device_view(device.scales, DType::int32, {w.batch, w.next_n, w.heads});
  DSA_GPU_ASSERT_OK(dsa::paged_mqa_logits(
      q, device_view(device.cache, DType::uint8, {g.num_pages, g.page_tokens, 1, 68}, {g.page_stride, 68, 68, 1}),
      c.fp4_queries ? device_view(device.weights, DType::float32, {w.rows(), w.heads}) : dw.weights_view(),
      dw.lens_view(), dw.block_table_view(), schedule_view(schedule), w.max_context_len,
      device_view(logits, dtype, {w.rows(), w.max_context_len}, {stride, 1}), options, gpu.ctx));
  EXPECT_TRUE(logits_match(w, fp4_reference_logits(w, cache, c.fp4_queries ? &queries : nullptr),
                           host_copy<std::uint8_t>(logits), dtype, stride, options.clean_logits,
                           logits_tolerance(c.backend)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuFp4Logits,
    ::testing::Values(Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 1, .max_prefix = 700}, false, Backend::cuda_generic},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 3, .heads = 5}, false, Backend::cuda_generic},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 2, .page_tokens = 32}, false, Backend::automatic},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 2}, true, Backend::automatic},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 4, .page_tokens = 32}, true, Backend::cuda_generic},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 3, .heads = 64}, false, Backend::automatic},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 2, .heads = 32, .page_tokens = 32}, false,
                                 Backend::automatic, true},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 1, .heads = 64}, false, Backend::automatic, true},
                      // fp4 queries on the Hopper kernels: every row count, both head counts and page sizes.
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 1, .heads = 64, .max_prefix = 2000}, true,
                                 Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 2, .heads = 32, .page_tokens = 32}, true,
                                 Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 3, .heads = 64}, true, Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 4, .heads = 32}, true, Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 5, .heads = 64, .page_tokens = 32}, true,
                                 Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 8, .heads = 64}, true, Backend::cuda_hopper},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 7, .heads = 32, .page_tokens = 32}, true,
                                 Backend::cuda_hopper},
                      // Exact paths: wide query heads, wide tokens with fp4 queries, and zero blocks that
                      // would otherwise look wide.
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 2, .heads = 64}, true, Backend::cuda_hopper, false,
                                 true},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 1, .heads = 32, .page_tokens = 32}, true,
                                 Backend::cuda_hopper, true},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 4, .heads = 64}, true, Backend::cuda_hopper, false,
                                 false, true},
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 2, .heads = 64}, false, Backend::cuda_hopper, false,
                                 false, true},
                      // bfloat16 logits, unclean, both query formats.
                      Fp4GpuCase{WorkloadSpec{.batch = 3, .next_n = 3, .heads = 64, .page_tokens = 32}, true,
                                 Backend::cuda_hopper, false, false, false, true},
                      Fp4GpuCase{WorkloadSpec{.batch = 2, .next_n = 2, .heads = 32}, false, Backend::cuda_hopper, false,
                                 false, false, true}),
    [](const ::testing::TestParamInfo<Fp4GpuCase>& info) { return fp4_case_name(info.param); });

// Requests of uneven row counts (request_offsets) over an fp4 cache, fp8 or
// fp4 queries: against the float64 reference, and index_topk (positions and
// cache slots) equal to topk of those logits.
struct Fp4VarlenGpuCase {
  std::string name;
  VarlenSpec spec;
  bool fp4_queries;
  Backend backend;
};

void PrintTo(const Fp4VarlenGpuCase& c, std::ostream* os) { *os << c.name; }

class GpuFp4Varlen : public ::testing::TestWithParam<Fp4VarlenGpuCase> {};

TEST_P(GpuFp4Varlen, MatchesTheFloat64ReferenceAndIndexTopk) {
  DSA_REQUIRE_GPU();
  const Fp4VarlenGpuCase c = GetParam();
  if (c.backend == Backend::cuda_hopper) DSA_REQUIRE_HOPPER();
  const VarlenWorkload v = make_varlen_workload(c.spec);
  const Workload& w = v.rows;
  Fp4Cache cache = fp4_cache_of(w);
  Fp4Queries queries = fp4_queries_of(w);
  const DeviceVarlen dv(v);
  const DeviceFp4 device(cache, queries);
  const std::int64_t rows = v.total_rows(), cols = w.max_context_len;
  const int k = 48;
  dsa::IndexTopkOptions index_options;
  index_options.k = k;
  index_options.sorted = true;
  index_options.strategy = dsa::IndexTopkStrategy::logits_then_topk;
  index_options.request_offsets = dv.offsets_view();
  dsa::ExecContext query;
  query.backend = c.backend;
  GpuContext gpu(c.backend, std::max({dsa::paged_mqa_logits_workspace_bytes(query),
                                      dsa::index_topk_workspace_bytes(rows, cols, index_options, query),
                                      dsa::topk_workspace_bytes(rows, cols, k, query)}));
  gpu.ctx.check_device_errors = true;
  const dsa::DeviceBuffer schedule = plan_varlen(dv, workers_for(gpu.ctx), dsa::LogitsPath::native, gpu.ctx);
  const Fp4CacheGeometry& g = cache.geometry;
  const dsa::TensorView cache_view =
      device_view(device.cache, DType::uint8, {g.num_pages, g.page_tokens, 1, 68}, {g.page_stride, 68, 68, 1});
  const dsa::TensorView q =
      c.fp4_queries ? device_view(device.codes, DType::uint8, {rows, 1, w.heads, kD / 2}) : dv.q_view();
  const dsa::TensorView q_scales =
      c.fp4_queries ? device_view(device.scales, DType::int32, {rows, 1, w.heads}) : dsa::TensorView{};
  const dsa::TensorView weights =
      c.fp4_queries ? device_view(device.weights, DType::float32, {rows, w.heads}) : dv.rows.weights_view();
  const dsa::DeviceBuffer logits = device_filled(static_cast<std::size_t>(rows * cols * 4), 0xFF);
  const dsa::TensorView logits_view = device_view(logits, DType::float32, {rows, cols});
  dsa::LogitsOptions options;
  options.clean_logits = true;
  options.q_block_scales = q_scales;
  options.request_offsets = dv.offsets_view();
  DSA_GPU_ASSERT_OK(dsa::paged_mqa_logits(q, cache_view, weights, dv.lens_view(), dv.table_view(),
                                          schedule_view(schedule), cols, logits_view, options, gpu.ctx));
  EXPECT_TRUE(logits_match(w, fp4_reference_logits(v, cache, c.fp4_queries ? &queries : nullptr),
                           host_copy<std::uint8_t>(logits), DType::float32, cols, true,
                           logits_tolerance(c.backend)));

  index_options.q_block_scales = q_scales;
  for (const bool physical : {false, true}) {
    SCOPED_TRACE(physical ? "cache slots" : "positions");
    dsa::TopkOptions topk_options;
    topk_options.sorted = true;
    if (physical) {
      topk_options.block_table = dv.table_view();
      topk_options.request_offsets = dv.offsets_view();
      topk_options.page_size = g.page_tokens;
    }
    index_options.physical_slots = physical;
    const dsa::DeviceBuffer want = device_filled(static_cast<std::size_t>(rows * k * 4), 0xFF);
    const dsa::DeviceBuffer got = device_filled(want.bytes(), 0xFF);
    DSA_GPU_ASSERT_OK(dsa::topk(logits_view, dv.lens_view(), k, device_view(want, DType::int32, {rows, k}),
                                topk_options, gpu.ctx));
    DSA_GPU_ASSERT_OK(dsa::index_topk(q, cache_view, weights, dv.lens_view(), dv.table_view(),
                                      schedule_view(schedule), cols, dsa::TensorView{},
                                      device_view(got, DType::int32, {rows, k}), index_options, gpu.ctx));
    EXPECT_EQ(host_copy<std::int32_t>(want), host_copy<std::int32_t>(got));
  }
}

std::vector<Fp4VarlenGpuCase> gpu_fp4_varlen_cases() {
  std::vector<Fp4VarlenGpuCase> cases;
  for (const int page : {64, 32}) {
    const std::string p = page == 64 ? "" : "p32_";
    const std::uint64_t seed = 1100u + static_cast<std::uint64_t>(page);
    cases.push_back({p + "rows_1_to_4_generic",
                     VarlenSpec{.rows_per_request = {1, 4, 2, 3, 1}, .heads = 64, .max_prefix = 900,
                                .page_tokens = page, .seed = seed},
                     false, Backend::cuda_generic});
    cases.push_back({p + "row_tiles_any_order_fp4_queries_generic",
                     VarlenSpec{.rows_per_request = {9, 0, 17, 1, 6}, .heads = 32, .causal = false,
                                .max_prefix = 1500, .page_tokens = page, .seed = seed + 1},
                     true, Backend::cuda_generic});
    cases.push_back({p + "prefill_among_decodes_fp4_queries_automatic",
                     VarlenSpec{.rows_per_request = {1, 70, 2, 0}, .heads = 64, .max_prefix = 700,
                                .page_tokens = page, .seed = seed + 2},
                     true, Backend::automatic});
    cases.push_back({p + "rows_1_to_8_automatic",
                     VarlenSpec{.rows_per_request = {8, 3, 1, 5}, .heads = 16, .causal = false,
                                .page_tokens = page, .seed = seed + 3},
                     false, Backend::automatic});
    // The Hopper row tiles, fp8 and fp4 queries.
    cases.push_back({p + "rows_1_to_4_hopper",
                     VarlenSpec{.rows_per_request = {1, 4, 2, 3, 1}, .heads = 64, .max_prefix = 900,
                                .page_tokens = page, .seed = seed + 4},
                     false, Backend::cuda_hopper});
    cases.push_back({p + "row_tiles_any_order_fp4_queries_hopper",
                     VarlenSpec{.rows_per_request = {9, 0, 17, 1, 6}, .heads = 32, .causal = false,
                                .max_prefix = 1500, .page_tokens = page, .seed = seed + 5},
                     true, Backend::cuda_hopper});
    cases.push_back({p + "prefill_among_decodes_fp4_queries_hopper",
                     VarlenSpec{.rows_per_request = {1, 70, 2, 0}, .heads = 64, .max_prefix = 700,
                                .page_tokens = page, .seed = seed + 6},
                     true, Backend::cuda_hopper});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuFp4Varlen, ::testing::ValuesIn(gpu_fp4_varlen_cases()),
                         [](const ::testing::TestParamInfo<Fp4VarlenGpuCase>& info) { return info.param.name; });

// fp4 queries over an fp8 cache stay on the generic kernels.
TEST(GpuFp4Logits, HopperBackendRefusesFp4QueriesOverFp8Keys) {
  DSA_REQUIRE_GPU();
  const Workload w = make_workload(WorkloadSpec{.batch = 1, .next_n = 1});
  Fp4Cache cache = fp4_cache_of(w);
  Fp4Queries queries = fp4_queries_of(w);
  const DeviceWorkload dw(w);
  const DeviceFp4 device(cache, queries);
  GpuContext gpu(Backend::cuda_hopper, 0);
  const dsa::DeviceBuffer schedule = plan_on_device(dw, 4, dsa::LogitsPath::native, gpu.ctx);
  const dsa::DeviceBuffer logits = device_filled(static_cast<std::size_t>(w.rows() * w.max_context_len * 4), 0xFF);
  dsa::LogitsOptions options;
  options.q_block_scales = device_view(device.scales, DType::int32, {w.batch, w.next_n, w.heads});
  const dsa::Status status = dsa::paged_mqa_logits(
      device_view(device.codes, DType::uint8, {w.batch, w.next_n, w.heads, kD / 2}), dw.cache_view(),
      device_view(device.weights, DType::float32, {w.rows(), w.heads}), dw.lens_view(), dw.block_table_view(),
      schedule_view(schedule), w.max_context_len, device_view(logits, DType::float32, {w.rows(), w.max_context_len}),
      options, gpu.ctx);
  EXPECT_EQ(status.code(), dsa::ErrorCode::unsupported) << status.to_string();
  EXPECT_NE(status.message().find("cuda_hopper reads fp8 keys with fp8 queries"), std::string::npos)
      << status.to_string();
}

// mqa_logits over fp4 keys, fp8 or fp4 queries, on the generic and the Hopper
// kernels; tiles of keys with spread block scales (every 7th key's, 2^20
// apart) take the Hopper kernel's exact path.
struct Fp4PrefillCase {
  std::string name;
  std::int64_t rows, heads, num_keys;
  bool fp4_queries;
  Backend backend;
  bool wide_keys = false;
  bool wide_query_heads = false;  // every 5th head's block scales 2^20 apart: the whole CTA exact
};

void PrintTo(const Fp4PrefillCase& c, std::ostream* os) { *os << c.name; }

class GpuFp4Prefill : public ::testing::TestWithParam<Fp4PrefillCase> {};

TEST_P(GpuFp4Prefill, MatchesTheFloat64Reference) {
  DSA_REQUIRE_GPU();
  const Fp4PrefillCase c = GetParam();
  if (c.backend == Backend::cuda_hopper) DSA_REQUIRE_HOPPER();
  const std::int64_t rows = c.rows, heads = c.heads, num_keys = c.num_keys;
  Rng rng(71 + static_cast<std::uint64_t>(heads));
  std::vector<float> q(static_cast<std::size_t>(rows * heads * kD)), keys(static_cast<std::size_t>(num_keys * kD));
  for (std::int64_t v = 0; v < rows * heads; ++v) random_vector(rng, q.data() + v * kD, kD);
  for (std::int64_t j = 0; j < num_keys; ++j) random_vector(rng, keys.data() + j * kD, kD);
  std::vector<float> weights(static_cast<std::size_t>(rows * heads));
  for (float& w : weights) w = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
  // Queries: fp4 codes and scale words, or e4m3 codes; query_value(v, d) is the exact value.
  const std::int64_t q_code_bytes = c.fp4_queries ? kD / 2 : kD;
  std::vector<std::uint8_t> q_codes(static_cast<std::size_t>(rows * heads * q_code_bytes));
  std::vector<std::int32_t> q_sf(static_cast<std::size_t>(rows * heads));
  for (std::int64_t v = 0; v < rows * heads; ++v) {
    if (c.fp4_queries) {
      auto word = fp4_quantize(q.data() + v * kD, kD, q_codes.data() + v * kD / 2);
      if (c.wide_query_heads && v % 5 == 2) {
        const int exponent = static_cast<int>(word & 0xFFu);
        word = (word & 0xFF0000FFu) | static_cast<std::uint32_t>(std::clamp(exponent + 10, 1, 254)) << 8 |
               static_cast<std::uint32_t>(std::clamp(exponent - 10, 1, 254)) << 16;
      }
      q_sf[static_cast<std::size_t>(v)] = static_cast<std::int32_t>(word);
    } else {
      for (int d = 0; d < kD; ++d) {
        q_codes[static_cast<std::size_t>(v * kD + d)] = e4m3_encode(q[static_cast<std::size_t>(v * kD + d)]);
      }
    }
  }
  const auto query_value = [&](std::int64_t v, int d) {
    if (c.fp4_queries) {
      return fp4_value(q_codes.data() + v * kD / 2, static_cast<std::uint32_t>(q_sf[static_cast<std::size_t>(v)]), d);
    }
    return static_cast<double>(e4m3_decode(q_codes[static_cast<std::size_t>(v * kD + d)]));
  };
  std::vector<std::uint8_t> key_codes(static_cast<std::size_t>(num_keys * kD / 2));
  std::vector<std::int32_t> key_sf(static_cast<std::size_t>(num_keys));
  for (std::int64_t j = 0; j < num_keys; ++j) {
    auto word = fp4_quantize(keys.data() + j * kD, kD, key_codes.data() + j * kD / 2);
    if (c.wide_keys && j % 7 == 3) {
      const int exponent = static_cast<int>(word & 0xFFu);
      word = (word & 0xFF0000FFu) | static_cast<std::uint32_t>(std::clamp(exponent + 10, 1, 254)) << 8 |
             static_cast<std::uint32_t>(std::clamp(exponent - 10, 1, 254)) << 16;
    }
    key_sf[static_cast<std::size_t>(j)] = static_cast<std::int32_t>(word);
  }
  std::vector<std::int32_t> ks(static_cast<std::size_t>(rows)), ke(static_cast<std::size_t>(rows));
  for (std::int64_t i = 0; i < rows; ++i) {
    ks[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * 37) % (num_keys / 2));
    ke[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(std::min<std::int64_t>(num_keys, num_keys / 2 + i * 30));
  }
  const dsa::DeviceBuffer q_device = device_copy(q_codes), q_sf_device = device_copy(q_sf);
  const dsa::DeviceBuffer keys_device = device_copy(key_codes), key_sf_device = device_copy(key_sf);
  const dsa::DeviceBuffer weights_device = device_copy(weights), ks_device = device_copy(ks), ke_device = device_copy(ke);
  const dsa::DeviceBuffer logits = device_filled(static_cast<std::size_t>(rows * num_keys * 4), 0xFF);
  GpuContext gpu(c.backend, 0);
  gpu.ctx.check_device_errors = true;
  dsa::MqaLogitsOptions options;
  options.clean_logits = true;
  if (c.fp4_queries) options.q_block_scales = device_view(q_sf_device, DType::int32, {rows, heads});
  const dsa::TensorView q_view = c.fp4_queries ? device_view(q_device, DType::uint8, {rows, heads, kD / 2})
                                               : device_view(q_device, DType::float8_e4m3, {rows, heads, kD});
  DSA_GPU_ASSERT_OK(dsa::mqa_logits(q_view, device_view(keys_device, DType::uint8, {num_keys, kD / 2}),
                                    device_view(key_sf_device, DType::int32, {num_keys}),
                                    device_view(weights_device, DType::float32, {rows, heads}),
                                    device_view(ks_device, DType::int32, {rows}),
                                    device_view(ke_device, DType::int32, {rows}),
                                    device_view(logits, DType::float32, {rows, num_keys}), options, gpu.ctx));
  const std::vector<float> got = host_copy<float>(logits);
  for (std::int64_t i = 0; i < rows; ++i) {
    for (std::int64_t j = 0; j < num_keys; ++j) {
      const float value = got[static_cast<std::size_t>(i * num_keys + j)];
      if (j < ks[static_cast<std::size_t>(i)] || j >= ke[static_cast<std::size_t>(i)]) {
        ASSERT_TRUE(std::isinf(value) && value < 0) << "row " << i << " key " << j;
        continue;
      }
      double want = 0.0, magnitude = 0.0;
      for (std::int64_t h = 0; h < heads; ++h) {
        const std::int64_t v = i * heads + h;
        double dot = 0.0, dot_magnitude = 0.0;
        for (int d = 0; d < kD; ++d) {
          const double term = query_value(v, d) * fp4_value(key_codes.data() + j * kD / 2,
                                                            static_cast<std::uint32_t>(key_sf[static_cast<std::size_t>(j)]), d);
          dot += term;
          dot_magnitude += std::fabs(term);
        }
        want += weights[static_cast<std::size_t>(v)] * std::fmax(dot, 0.0);
        magnitude += std::fabs(weights[static_cast<std::size_t>(v)]) * dot_magnitude;
      }
      ASSERT_NEAR(value, want, logits_tolerance(c.backend) * magnitude + 1e-30) << "row " << i << " key " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuFp4Prefill,
    ::testing::Values(Fp4PrefillCase{"fp4_queries_h8_generic", 7, 8, 300, true, Backend::cuda_generic},
                      Fp4PrefillCase{"fp8_queries_h64_hopper", 21, 64, 700, false, Backend::cuda_hopper},
                      Fp4PrefillCase{"fp8_queries_h32_hopper", 37, 32, 450, false, Backend::cuda_hopper},
                      Fp4PrefillCase{"fp8_queries_h64_wide_keys_hopper", 13, 64, 330, false, Backend::cuda_hopper,
                                     true},
                      Fp4PrefillCase{"fp8_queries_h64_automatic", 9, 64, 260, false, Backend::automatic},
                      Fp4PrefillCase{"fp4_queries_h64_hopper", 19, 64, 520, true, Backend::cuda_hopper},
                      Fp4PrefillCase{"fp4_queries_h32_wide_keys_hopper", 33, 32, 390, true, Backend::cuda_hopper,
                                     true},
                      Fp4PrefillCase{"fp4_queries_h64_wide_query_heads_hopper", 11, 64, 300, true,
                                     Backend::cuda_hopper, false, true}),
    [](const ::testing::TestParamInfo<Fp4PrefillCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dsa_test::gpu
