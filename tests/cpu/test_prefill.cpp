// mqa_logits (prefill scoring) on the CPU backends against the float64
// reference: full and compressed outputs, range shapes, output dtypes,
// repeatability and every validation message.
#include <gtest/gtest.h>

#include <cstring>
#include <algorithm>
#include <functional>
#include <random>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "common/prefill_inputs.hpp"
#include "cpu_test_helpers.hpp"

namespace dsa_test {
namespace {

constexpr float kSentinel = 8192.0f;  // exact in float32 and bfloat16

// One call's buffers, kept alive together.
struct PrefillCall {
  MqaWorkload w;
  std::int64_t width = 0;
  OwnedView logits;
  std::vector<std::uint8_t> padded_q;
};

dsa::Status run_case(PrefillCall& call, const PrefillCase& c, const dsa::ExecContext& ctx) {
  MqaWorkload& w = call.w;
  const PrefillLayout l = prefill_layout(c, w);
  call.width = l.width;
  call.logits = c.bf16_out ? bf16_matrix(w.rows, l.cols, l.stride, bf16_encode(kSentinel))
                           : float_matrix(w.rows, l.cols, l.stride, kSentinel);
  dsa::TensorView q = w.q_view();
  if (c.q_pad_bytes > 0) {
    const std::int64_t head_stride = w.head_dim + c.q_pad_bytes;
    call.padded_q = w.padded_q(c.q_pad_bytes);
    q = dsa::make_view(call.padded_q.data(), dsa::DType::float8_e4m3, {w.rows, w.heads, w.head_dim},
                       {w.heads * head_stride, head_stride, 1});
  }
  return dsa::mqa_logits(q, w.keys_view(), w.key_scales_view(), w.weights_view(), w.ks_view(), w.ke_view(),
                         call.logits.view, l.options, ctx);
}

::testing::AssertionResult matches_reference(const PrefillCall& call, const PrefillCase& c, Precision precision) {
  const auto read = [&](std::int64_t r, std::int64_t col) { return read_logit(call.logits, r, col); };
  const auto bound = [precision](double want, double magnitude) { return rounding_bound(precision, want, magnitude); };
  const auto untouched = [&](std::int64_t r, std::int64_t col) { return read_logit(call.logits, r, col) == kSentinel; };
  return check_mqa_logits(call.w, call.w.reference(), c.compressed, call.width, call.logits.view.stride(0), c.clean,
                          read, bound, untouched);
}

Precision precision_of(const PrefillCase& c, dsa::Backend backend) {
  if (c.bf16_out) return Precision::bfloat16;
  return c.float64 && backend == dsa::Backend::cpu_reference ? Precision::float64 : Precision::float32;
}

class PrefillTest : public ::testing::TestWithParam<std::tuple<dsa::Backend, PrefillCase>> {};

TEST_P(PrefillTest, MatchesReference) {
  const auto& [backend, c] = GetParam();
  PrefillCall call{make_mqa_workload(c.spec)};
  DSA_ASSERT_OK(run_case(call, c, cpu_context(backend, 3, c.float64)));
  EXPECT_TRUE(matches_reference(call, c, precision_of(c, backend)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, PrefillTest, ::testing::Combine(::testing::ValuesIn(cpu_backends()), ::testing::ValuesIn(prefill_cases())),
    [](const ::testing::TestParamInfo<PrefillTest::ParamType>& info) {
      return std::get<1>(info.param).name + "_" + backend_label({std::get<0>(info.param), info.index});
    });

class PrefillPropertyTest : public ::testing::TestWithParam<dsa::Backend> {};

// The same inputs give bitwise the same output, whatever the thread count.
TEST_P(PrefillPropertyTest, BitwiseRepeatable) {
  for (const bool compressed : {false, true}) {
    PrefillCase c{"repeat", MqaSpec{.rows = 29, .num_keys = 700, .ranges = RangeShape::random, .seed = 91}};
    c.compressed = compressed;
    PrefillCall first{make_mqa_workload(c.spec)};
    DSA_ASSERT_OK(run_case(first, c, cpu_context(GetParam(), 3)));
    for (const int threads : {1, 3, 0}) {
      SCOPED_TRACE(std::string(compressed ? "compressed" : "full") + ", threads " + std::to_string(threads));
      PrefillCall again{make_mqa_workload(c.spec)};
      DSA_ASSERT_OK(run_case(again, c, cpu_context(GetParam(), threads)));
      EXPECT_TRUE(first.logits.bytes == again.logits.bytes);
    }
  }
}

// The compressed form holds the full form's values, shifted by ks.
TEST_P(PrefillPropertyTest, CompressedIsTheFullFormShifted) {
  PrefillCase full{"full", MqaSpec{.rows = 21, .num_keys = 260, .ranges = RangeShape::context_parallel, .seed = 5}};
  PrefillCase compressed = full;
  compressed.compressed = true;
  PrefillCall a{make_mqa_workload(full.spec)}, b{make_mqa_workload(full.spec)};
  DSA_ASSERT_OK(run_case(a, full, cpu_context(GetParam())));
  DSA_ASSERT_OK(run_case(b, compressed, cpu_context(GetParam())));
  for (std::int64_t r = 0; r < a.w.rows; ++r) {
    for (std::int64_t j = a.w.ks[r]; j < a.w.ke[r]; ++j) {
      ASSERT_EQ(read_logit(a.logits, r, j), read_logit(b.logits, r, j - a.w.ks[r])) << "row " << r << " key " << j;
    }
  }
}

// The prefill pipeline: full logits, then the ragged top-k (row_starts = ks,
// lengths = ke - ks, position_offsets = ks) selects key indices within each
// row's range, as the reference selection of the same values does.
TEST_P(PrefillPropertyTest, RaggedTopkSelectsWithinTheRanges) {
  const PrefillCase c{"pipeline", MqaSpec{.rows = 24, .num_keys = 400, .ranges = RangeShape::context_parallel,
                                          .seed = 23}};
  PrefillCall call{make_mqa_workload(c.spec)};
  const dsa::ExecContext ctx = cpu_context(GetParam());
  DSA_ASSERT_OK(run_case(call, c, ctx));
  const MqaWorkload& w = call.w;
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(w.rows)), starts = w.ks;
  for (std::size_t i = 0; i < lengths.size(); ++i) lengths[i] = w.ke[i] - w.ks[i];
  constexpr int k = 32;
  std::vector<std::int32_t> indices(static_cast<std::size_t>(w.rows * k), -7);
  dsa::TopkOptions options;
  options.sorted = true;
  options.row_starts = view_of(starts, {w.rows});
  options.position_offsets = view_of(starts, {w.rows});
  DSA_ASSERT_OK(dsa::topk(call.logits.view, view_of(lengths, {w.rows}), k, view_of(indices, {w.rows, k}), options, ctx));
  const auto* values = reinterpret_cast<const float*>(call.logits.bytes.data());
  for (std::int64_t r = 0; r < w.rows; ++r) {
    std::vector<std::int32_t> want =
        reference_topk(values + r * call.logits.view.stride(0) + w.ks[r], lengths[static_cast<std::size_t>(r)], k);
    for (std::int32_t& i : want) i = i < 0 ? i : i + w.ks[r];
    const std::vector<std::int32_t> got(indices.begin() + r * k, indices.begin() + (r + 1) * k);
    EXPECT_EQ(got, want) << "row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, PrefillPropertyTest, ::testing::ValuesIn(cpu_backends()), backend_label);

// ---- Validation -------------------------------------------------------------

struct ErrorCase {
  std::string name;
  dsa::ErrorCode code;
  std::string message;  // a substring of the status message
};

// A valid call that one test breaks in one place.
struct ValidCall {
  MqaWorkload w = make_mqa_workload(MqaSpec{.rows = 6, .heads = 4, .head_dim = 32, .num_keys = 40,
                                            .ranges = RangeShape::random, .seed = 3});
  OwnedView logits = float_matrix(6, 40, 40, kSentinel);
  dsa::TensorView q = w.q_view(), keys = w.keys_view(), key_scales = w.key_scales_view(),
                  weights = w.weights_view(), ks = w.ks_view(), ke = w.ke_view(), out = logits.view;
  dsa::MqaLogitsOptions options{};
  dsa::ExecContext ctx = cpu_context(dsa::Backend::cpu);

  dsa::Status run() const { return dsa::mqa_logits(q, keys, key_scales, weights, ks, ke, out, options, ctx); }
};

void expect_error(const dsa::Status& status, dsa::ErrorCode code, const std::string& message) {
  EXPECT_EQ(status.code(), code) << status.to_string();
  EXPECT_NE(status.message().find(message), std::string::npos) << status.to_string();
}

TEST(PrefillValidation, ValidCallSucceeds) { DSA_ASSERT_OK(ValidCall{}.run()); }

TEST(PrefillValidation, ShapesDtypesAndOptions) {
  using dsa::DType;
  using dsa::ErrorCode;
  const dsa::Device gpu{dsa::DeviceType::cuda, 0};
  std::vector<std::pair<std::function<void(ValidCall&)>, ErrorCase>> cases;
  auto add = [&](std::function<void(ValidCall&)> edit, ErrorCode code, std::string message) {
    cases.emplace_back(std::move(edit), ErrorCase{"", code, std::move(message)});
  };
  add([](ValidCall& v) { v.q = {}; }, ErrorCode::null_pointer, "mqa_logits: q: required tensor is missing");
  add([](ValidCall& v) { v.q.dtype = DType::int32; }, ErrorCode::bad_dtype, "mqa_logits: q: expected float8_e4m3");
  add([](ValidCall& v) { v.q.dtype = DType::uint8; }, ErrorCode::bad_dtype,
      "mqa_logits: q: uint8 queries are packed fp4 codes and need options.q_block_scales");
  add([](ValidCall& v) { v.q.ndim = 2; }, ErrorCode::bad_shape, "mqa_logits: q: expected rank 3");
  add([](ValidCall& v) { v.q.shape[2] = 24; v.q.strides = {96, 24, 1}; }, ErrorCode::bad_shape,
      "q: head dim must be a positive multiple of 16");
  add([](ValidCall& v) { v.q.strides[1] = 40; v.q.strides[0] = 160; }, ErrorCode::bad_alignment,
      "q: strides of dimensions 0..1 must be multiples of 16 bytes");
  add([](ValidCall& v) { v.keys.dtype = DType::int32; }, ErrorCode::bad_dtype, "mqa_logits: keys: expected float8_e4m3");
  // uint8 keys are packed fp4 codes, which serve D = 128 only.
  add([](ValidCall& v) { v.keys.dtype = DType::uint8; }, ErrorCode::bad_shape,
      "mqa_logits: keys: fp4 keys (uint8) are packed codes [S_kv, D / 2] with D == 128");
  add([](ValidCall& v) { v.keys.shape[1] = 64; }, ErrorCode::bad_shape,
      "keys: dimension 1 must be the head dim of q = 32");
  add([](ValidCall& v) { v.keys.strides[0] = 40; }, ErrorCode::bad_alignment,
      "keys: row stride must be a multiple of 16 bytes");
  add([](ValidCall& v) { v.key_scales.shape[0] = 39; }, ErrorCode::bad_shape,
      "key_scales: dimension 0 must be S_kv of keys = 40");
  add([](ValidCall& v) { v.key_scales.dtype = DType::bfloat16; }, ErrorCode::bad_dtype,
      "key_scales: expected float32");
  add([](ValidCall& v) { v.weights.shape[1] = 5; }, ErrorCode::bad_shape,
      "weights: dimension 1 must be the head count of q = 4");
  add([](ValidCall& v) { v.weights.shape[0] = 5; }, ErrorCode::bad_shape, "weights: dimension 0 must be S of q = 6");
  add([](ValidCall& v) { v.weights.strides = {8, 2}; }, ErrorCode::bad_stride, "weights: inner dimension must be contiguous");
  add([](ValidCall& v) { v.ks.dtype = DType::int64; }, ErrorCode::bad_dtype, "mqa_logits: ks: expected int32");
  add([](ValidCall& v) { v.ke.shape[0] = 5; }, ErrorCode::bad_shape, "ke: dimension 0 must be S of q = 6");
  add([](ValidCall& v) { v.ke = {}; }, ErrorCode::null_pointer, "mqa_logits: ke: required tensor is missing");
  add([](ValidCall& v) { v.out.shape[1] = 39; }, ErrorCode::bad_shape,
      "logits: has 39 columns, fewer than S_kv of keys = 40");
  add([](ValidCall& v) { v.out.dtype = DType::int32; }, ErrorCode::bad_dtype, "logits: expected float32 or bfloat16");
  add([](ValidCall& v) { v.out.strides = {20, 1}; v.out.shape[1] = 40; }, ErrorCode::bad_stride,
      "logits: row stride 20 is smaller than S_kv of keys = 40");
  add([](ValidCall& v) { v.options.max_seqlen_k = 8; }, ErrorCode::invalid_argument,
      "options.max_seqlen_k: is the compressed output's column count and must be 0 without options.compressed");
  add([](ValidCall& v) { v.options.compressed = true; v.options.max_seqlen_k = -1; }, ErrorCode::invalid_argument,
      "options.max_seqlen_k: must be in [0, 2^31 - 1] with compressed output, got -1");
  add([](ValidCall& v) { v.options.compressed = true; v.options.max_seqlen_k = 41; }, ErrorCode::bad_shape,
      "logits: has 40 columns, fewer than max_seqlen_k = 41");
  add([gpu](ValidCall& v) { v.ke.device = gpu; }, ErrorCode::bad_device, "mqa_logits: ke: is on cuda:0 but q is on cpu:0");
  add([](ValidCall& v) { v.ctx.backend = dsa::Backend::cuda_generic; }, ErrorCode::bad_device,
      "mqa_logits: ctx.backend: the cuda_generic backend cannot run on tensors in host memory");
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i) + ": " + cases[i].second.message);
    ValidCall v;
    cases[i].first(v);
    expect_error(v.run(), cases[i].second.code, cases[i].second.message);
    EXPECT_EQ(read_logit(v.logits, 0, 0), kSentinel);  // nothing written
  }
}

TEST(PrefillValidation, RangesAreCheckedBeforeAnythingIsWritten) {
  struct RangeError {
    std::vector<std::int32_t> ks, ke;
    std::int64_t max_seqlen_k;  // compressed when > 0
    std::string message;
  };
  const std::vector<RangeError> errors{
      {{0, 0, -1, 0, 0, 0}, {1, 1, 1, 1, 1, 1}, 0, "mqa_logits: ks: ks[2] = -1, ke[2] = 1 breaks 0 <= ks[i] <= ke[i]"},
      {{0, 5, 0, 0, 0, 0}, {1, 4, 1, 1, 1, 1}, 0, "mqa_logits: ks: ks[1] = 5, ke[1] = 4 breaks 0 <= ks[i] <= ke[i]"},
      {{0, 0, 0, 0, 0, 0}, {1, 1, 1, 1, 1, 41}, 0, "mqa_logits: ke: ks[5] = 0, ke[5] = 41 breaks ke[i] <= S_kv = 40"},
      {{0, 0, 0, 0, 0, 0}, {1, 1, 1, 9, 1, 1}, 8,
       "mqa_logits: ke: ks[3] = 0, ke[3] = 9 spans 9 keys, more than max_seqlen_k = 8"},
  };
  for (const RangeError& e : errors) {
    for (const dsa::Backend backend : cpu_backends()) {
      SCOPED_TRACE(e.message + " on " + dsa::backend_name(backend));
      ValidCall v;
      v.w.ks = e.ks;
      v.w.ke = e.ke;
      v.ks = v.w.ks_view();
      v.ke = v.w.ke_view();
      v.options.compressed = e.max_seqlen_k > 0;
      v.options.max_seqlen_k = e.max_seqlen_k;
      v.options.clean_logits = true;
      v.ctx.backend = backend;
      expect_error(v.run(), dsa::ErrorCode::length_out_of_range, e.message);
      for (std::int64_t r = 0; r < 6; ++r) {
        for (std::int64_t c = 0; c < 40; ++c) ASSERT_EQ(read_logit(v.logits, r, c), kSentinel);
      }
    }
  }
}

// ---- plan_mqa_logits_chunks ---------------------------------------------------

// The bytes a chunk of rows [begin, end) needs, computed from the ranges
// directly: rows x W x element size, W = the keys or, compressed, the widest
// range (at least one column).
std::size_t chunk_bytes(const std::vector<std::int32_t>& ks, const std::vector<std::int32_t>& ke,
                        std::int64_t begin, std::int64_t end, std::int64_t num_keys, bool compressed,
                        std::size_t element) {
  std::int64_t width = compressed ? 1 : num_keys;
  if (compressed) {
    for (std::int64_t i = begin; i < end; ++i) width = std::max<std::int64_t>(width, ke[i] - ks[i]);
  }
  return static_cast<std::size_t>(end - begin) * static_cast<std::size_t>(width) * element;
}

TEST(PrefillChunks, GreedyChunksFitTheBudgetAndCoverEveryRow) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::int64_t rows = std::uniform_int_distribution<int>(0, 60)(rng);
    const std::int64_t num_keys = std::uniform_int_distribution<int>(1, 500)(rng);
    std::vector<std::int32_t> ks(rows), ke(rows);
    for (std::int64_t i = 0; i < rows; ++i) {
      // Causal ranges, then random ones (context-parallel layouts are not monotone).
      const int a = std::uniform_int_distribution<int>(0, static_cast<int>(num_keys))(rng);
      const int b = std::uniform_int_distribution<int>(0, static_cast<int>(num_keys))(rng);
      ks[i] = trial % 2 == 0 ? 0 : std::min(a, b);
      ke[i] = trial % 2 == 0 ? static_cast<std::int32_t>(std::min<std::int64_t>(num_keys, i + 1 + num_keys / 2))
                             : std::max(a, b);
    }
    const bool compressed = trial % 3 != 0;
    const dsa::DType dtype = trial % 4 == 0 ? dsa::DType::bfloat16 : dsa::DType::float32;
    const std::size_t element = dtype == dsa::DType::bfloat16 ? 2 : 4;
    const std::size_t budget = std::uniform_int_distribution<std::size_t>(num_keys * element, 40 * num_keys * element)(rng);
    std::vector<dsa::MqaLogitsChunk> chunks;
    DSA_ASSERT_OK(dsa::plan_mqa_logits_chunks(dsa::make_view(ks.data(), dsa::DType::int32, {rows}),
                                              dsa::make_view(ke.data(), dsa::DType::int32, {rows}), num_keys,
                                              compressed, dtype, budget, &chunks));
    std::int64_t next = 0;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const dsa::MqaLogitsChunk& chunk = chunks[c];
      ASSERT_EQ(chunk.begin, next) << "trial " << trial;
      ASSERT_LT(chunk.begin, chunk.end) << "trial " << trial;
      EXPECT_LE(chunk_bytes(ks, ke, chunk.begin, chunk.end, num_keys, compressed, element), budget);
      if (c + 1 < chunks.size()) {  // greedy: the next row did not fit beside these
        EXPECT_GT(chunk_bytes(ks, ke, chunk.begin, chunk.end + 1, num_keys, compressed, element), budget);
      }
      std::int64_t widest = 0;
      for (std::int64_t i = chunk.begin; i < chunk.end; ++i) widest = std::max<std::int64_t>(widest, ke[i] - ks[i]);
      EXPECT_EQ(chunk.max_seqlen_k, compressed ? widest : 0);
      next = chunk.end;
    }
    EXPECT_EQ(next, rows) << "trial " << trial;
  }
}

TEST(PrefillChunks, Errors) {
  std::vector<std::int32_t> ks = {0, 0, 5}, ke = {4, 10, 7};
  const auto plan = [&](std::int64_t num_keys, bool compressed, dsa::DType dtype, std::size_t budget) {
    std::vector<dsa::MqaLogitsChunk> chunks;
    return dsa::plan_mqa_logits_chunks(dsa::make_view(ks.data(), dsa::DType::int32, {3}),
                                       dsa::make_view(ke.data(), dsa::DType::int32, {3}), num_keys, compressed,
                                       dtype, budget, &chunks);
  };
  DSA_ASSERT_OK(plan(10, true, dsa::DType::float32, 40));
  const dsa::Status small = plan(10, true, dsa::DType::float32, 39);  // row 1 spans 10 keys: 40 bytes
  EXPECT_EQ(small.code(), dsa::ErrorCode::invalid_argument);
  EXPECT_NE(small.message().find("budget_bytes"), std::string::npos) << small.to_string();
  const dsa::Status full = plan(10, false, dsa::DType::bfloat16, 19);  // a full row is 20 bytes
  EXPECT_EQ(full.code(), dsa::ErrorCode::invalid_argument) << full.to_string();
  const dsa::Status beyond = plan(9, true, dsa::DType::float32, 1000);  // ke[1] = 10 > S_kv
  EXPECT_EQ(beyond.code(), dsa::ErrorCode::length_out_of_range) << beyond.to_string();
  EXPECT_NE(beyond.message().find("ke"), std::string::npos);
  EXPECT_EQ(plan(10, true, dsa::DType::int32, 1000).code(), dsa::ErrorCode::bad_dtype);
  EXPECT_EQ(plan(-1, true, dsa::DType::float32, 1000).code(), dsa::ErrorCode::invalid_argument);
  ks[2] = 8;  // ks > ke
  EXPECT_EQ(plan(10, true, dsa::DType::float32, 1000).code(), dsa::ErrorCode::length_out_of_range);
  EXPECT_EQ(dsa::plan_mqa_logits_chunks(dsa::make_view(ks.data(), dsa::DType::int32, {3}),
                                        dsa::make_view(ke.data(), dsa::DType::int32, {3}), 10, true,
                                        dsa::DType::float32, 1000, nullptr)
                .code(),
            dsa::ErrorCode::null_pointer);
}

TEST(PrefillValidation, WorkspaceIsZeroOnTheCpu) {
  EXPECT_EQ(dsa::mqa_logits_workspace_bytes(cpu_context(dsa::Backend::cpu)), 0u);
}

}  // namespace
}  // namespace dsa_test
