#include "bench_prefill.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "device_timing.hpp"
#include "dsa/dsa.hpp"
#include "report.hpp"
#include "stages.hpp"
#include "verify.hpp"
#include "workload.hpp"

namespace dsa_cli {
namespace {

// One mqa_logits call's float32 logits may take at most this much (and half
// the free device memory); a point whose logits are larger is split into
// consecutive row chunks, as engines split a long prefill, and the chunks'
// calls are timed together.
constexpr std::size_t kLogitsBudget = std::size_t{8} << 30;
// A point's timed runs take about this long at most: a point whose call
// takes longer than kPointSeconds / --iters gets fewer runs, at least
// kMinRuns (and one warm-up), so that slow kernels finish the grid.
constexpr double kPointSeconds = 2.0;
constexpr int kMinRuns = 5;
// Engines gather a request's keys out of the paged cache into a contiguous
// run and call mqa_logits; scoring the rows straight from the pages must
// beat that, gather included, by this much (gather + contiguous time over
// the paged time) at every point with a prefix of at least kPagedTargetPrefix.
constexpr double kPagedSpeedupTarget = 1.1;
constexpr std::int64_t kPagedTargetPrefix = 32768;
// The formats of a grid (--key-format, --query-format, --page-size): the
// paged form's cache layout, whose format is the contiguous keys' too, and
// the queries' format.
struct PrefillFormats : OperandFormats {
  int page_tokens = dsa::kDefaultPageTokens;

  dsa::KeyCacheLayout cache() const { return {kHeadDim, page_tokens, key_format}; }
  const char* inputs() const;
};

PrefillFormats formats_of(const Options& options) {
  PrefillFormats formats;
  formats.key_format = options.key_format;
  formats.query_format = options.resolved_query_format();
  formats.page_tokens = options.page_size;
  return formats;
}

const char* PrefillFormats::inputs() const {
  if (!fp4_keys()) {
    return fp4_queries() ? "random e2m1 queries (ue8m0 block scales), random e4m3 keys, signed weights, positive key "
                           "scales"
                         : "random e4m3 queries and keys, signed weights, positive key scales";
  }
  return fp4_queries() ? "random e2m1 queries and keys, ue8m0 block scales within 2^4 of each other, signed weights"
                       : "random e4m3 queries, random e2m1 keys (ue8m0 block scales within 2^4 of each other), "
                         "signed weights";
}

// A causal prefill chunk: S new tokens over a prefix of P, the contiguous
// form (keys = the prefix then the new tokens, S_kv = P + S; row i scores
// keys [0, P + i + 1)), and the paged form (the same keys in the pages of
// one request whose rows are the S new tokens).
struct PrefillPoint {
  int heads = 64;
  std::int64_t seq = 0;
  std::int64_t prefix = 0;
  std::int64_t kv() const { return prefix + seq; }
  bool paged_target() const { return prefix >= kPagedTargetPrefix; }
};

std::vector<PrefillPoint> grid_points() {
  std::vector<PrefillPoint> points;
  for (const int heads : {64, 32}) {
    for (const std::int64_t seq : {512, 4096, 16384}) {
      for (const std::int64_t prefix : {0, 32768, 98304}) points.push_back({heads, seq, prefix});
    }
  }
  return points;
}

// The ragged top-k line is taken on this point's logits.
constexpr PrefillPoint kTopkPoint{64, 4096, 32768};
constexpr PrefillPoint kCpuPoint{64, 64, 256};

// mqa_logits' inputs in host memory: random e4m3 queries and keys (finite,
// magnitudes below 2) with positive key scales, or random e2m1 codes (every
// byte is two codes) with ue8m0 block-scale words; signed head weights,
// causal ranges.
struct PrefillInputs {
  std::vector<std::uint8_t> q;               // [S, H, query bytes]
  std::vector<std::int32_t> q_block_scales;  // fp4 queries: [S, H]
  std::vector<std::uint8_t> keys;            // [S_kv, key bytes]
  std::vector<float> weights;                // [S, H]
  std::vector<std::uint32_t> key_scales;     // [S_kv]: fp32 scales or fp4 scale words, as bits
  std::vector<std::int32_t> ks, ke;          // [S]
  std::vector<std::int32_t> lengths;         // [S] ke - ks
};

// Random bytes, eight a draw, each ANDed with `mask`.
void fill_bytes(std::vector<std::uint8_t>& bytes, std::mt19937_64& random, std::uint8_t mask) {
  for (std::size_t i = 0; i < bytes.size(); i += 8) {
    std::uint64_t bits = random();
    for (std::size_t j = i; j < std::min(i + 8, bytes.size()); ++j, bits >>= 8) {
      bytes[j] = static_cast<std::uint8_t>(bits & mask);
    }
  }
}

// e4m3 codes: clearing bit 6 keeps the exponent field below 8, which also
// rules out the NaN codes. Every byte is two e2m1 codes.
constexpr std::uint8_t kE4m3Mask = 0xBF;
constexpr std::uint8_t kE2m1Mask = 0xFF;

// A ue8m0 scale word: four block exponents in [low, low + 4], so that a row's
// blocks stay within the range the Hopper kernels turn into e5m2 exactly.
std::uint32_t scale_word(std::mt19937_64& random, int low) {
  std::uint32_t word = 0;
  for (int block = 0; block < 4; ++block) word |= static_cast<std::uint32_t>(low + random() % 5) << (8 * block);
  return word;
}

PrefillInputs make_inputs(const PrefillPoint& point, const PrefillFormats& formats, std::uint64_t seed) {
  PrefillInputs in;
  std::mt19937_64 random(seed);
  in.q.resize(static_cast<std::size_t>(point.seq * point.heads * formats.query_bytes()));
  in.keys.resize(static_cast<std::size_t>(point.kv() * formats.key_bytes()));
  fill_bytes(in.q, random, formats.fp4_queries() ? kE2m1Mask : kE4m3Mask);
  fill_bytes(in.keys, random, formats.fp4_keys() ? kE2m1Mask : kE4m3Mask);
  std::uniform_real_distribution<float> weight(-1.0f, 1.0f), scale(0.5f / 448, 2.0f / 448);
  in.weights.resize(static_cast<std::size_t>(point.seq * point.heads));
  for (float& w : in.weights) w = weight(random);
  in.key_scales.resize(static_cast<std::size_t>(point.kv()));
  for (std::uint32_t& bits : in.key_scales) {
    bits = formats.fp4_keys() ? scale_word(random, 120) : std::bit_cast<std::uint32_t>(scale(random));
  }
  if (formats.fp4_queries()) {
    in.q_block_scales.resize(static_cast<std::size_t>(point.seq * point.heads));
    for (std::int32_t& word : in.q_block_scales) word = static_cast<std::int32_t>(scale_word(random, 125));
  }
  in.ks.assign(static_cast<std::size_t>(point.seq), 0);
  in.ke.resize(in.ks.size());
  in.lengths.resize(in.ks.size());
  for (std::int64_t i = 0; i < point.seq; ++i) {
    const auto row = static_cast<std::size_t>(i);
    in.ke[row] = static_cast<std::int32_t>(point.prefix + i + 1);
    in.lengths[row] = in.ke[row] - in.ks[row];
  }
  return in;
}

// The times of one form of the call: the contiguous form, the paged form
// (the rows scored straight from the request's cache pages), or the gather
// of the request's keys out of its pages followed by the contiguous form.
struct FormTimes {
  double seconds = kNotMeasured;
  double host_s = kNotMeasured;  // host time per timed run (all its calls)
  int calls = 0;                 // scoring calls per timed run (row chunks; a gather comes on top)
  int runs = 0;                  // timed runs, the median's sample
  std::int64_t rows_per_call = 0;
};

// The paged form's logits against the contiguous form's (the reference), and
// the gathered keys and scales against the point's.
struct FormAgreement {
  bool logits_compared = false;
  bool bitwise = true;               // every chunk's logits bit for bit
  double max_relative_error = 0;     // compare_logits over the rows' valid columns
  std::int64_t non_finite = 0;       // valid paged logits that are NaN or infinite
  std::int64_t cleaned_rows = 0;     // rows whose columns past their length differ
  double tolerance = 0;
  bool keys_compared = false;
  ByteComparison gathered;           // keys, then scales

  bool logits_agree() const {
    return logits_compared &&
           (bitwise || (non_finite == 0 && cleaned_rows == 0 && max_relative_error <= tolerance));
  }
};

struct PrefillResult {
  PrefillPoint point;
  double pairs = 0;         // valid (row, key) pairs: sum of ke - ks
  double flops = 0;         // 2 * H * D * pairs
  double logits_bytes = 0;  // 4 * S * S_kv: every column written (clean_logits)
  double bytes = 0;         // the inputs read once plus the logits written once
  double compute_floor_s = kNotMeasured;
  double memory_floor_s = kNotMeasured;
  FormTimes contiguous;
  FormTimes paged;
  FormTimes gathered;  // gather + contiguous
  FormAgreement agreement;
  int rotation = 1;
  std::string problems;  // empty when the point was measured and checked

  void note(const std::string& problem) { problems += (problems.empty() ? "" : "; ") + problem; }
  double floor_s() const { return std::max(compute_floor_s, memory_floor_s); }  // NaN without a rate
  const char* bound() const {
    if (std::isnan(compute_floor_s)) return "-";
    return compute_floor_s >= memory_floor_s ? "compute" : "memory";
  }
  // What the paged form saves over gathering the keys first: (gather +
  // contiguous) / paged, the target kPagedSpeedupTarget.
  double paged_speedup() const { return gathered.seconds / paged.seconds; }
};

// dsa::topk over the rows of one chunk's full logits, row i's candidates
// [ks[i], ke[i]), against one read of the valid logits.
struct RaggedTopk {
  PrefillPoint point;
  int k = 0;
  double valid_bytes = 0;
  double seconds = kNotMeasured;
  double host_s = kNotMeasured;
  double floor_s = kNotMeasured;
  int rotation = 1;
  std::string problems;
  bool measured = false;
};

template <typename T>
dsa::Status upload(const std::vector<T>& values, dsa::Device device, Buffer* out) {
  DSA_RETURN_IF_ERROR(Buffer::allocate(values.size() * sizeof(T), device, out));
  return out->upload(values.data(), values.size() * sizeof(T));
}

// The ragged top-k of `logits` (the point's full [S, S_kv] logits), checked
// against the CPU backend's selection of the same rows.
void measure_ragged_topk(const Bench& bench, const PrefillInputs& in, const Buffer& logits, const Buffer& ks,
                         const Buffer& lengths, dsa::ExecContext ctx, RaggedTopk* line) {
  const PrefillPoint& point = line->point;
  const std::int64_t rows = point.seq, cols = point.kv();
  const int k = line->k;
  line->measured = true;
  const auto fail = [&](const char* what, const dsa::Status& status) {
    line->problems = std::string(what) + ": " + status.to_string();
  };
  const dsa::Device device = bench.target.device;
  Buffer indices;
  if (auto s = Buffer::allocate(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k) * 4, device, &indices);
      !s.ok()) {
    return fail("allocate", s);
  }
  Bench line_bench = bench;
  line_bench.ctx = ctx;
  Rotation sets;
  if (auto s = sets.create(logits, line_bench); !s.ok()) return fail("rotation", s);
  line->rotation = sets.size();
  dsa::TopkOptions options;
  options.row_starts = ks.view(dsa::DType::int32, {rows});
  options.position_offsets = options.row_starts;
  const dsa::TensorView lengths_view = lengths.view(dsa::DType::int32, {rows});
  const dsa::TensorView indices_view = indices.view(dsa::DType::int32, {rows, k});
  if (auto s = line_bench.time([&](int run) {
        return dsa::topk(sets.at(run).view(dsa::DType::float32, {rows, cols}), lengths_view, k, indices_view,
                         options, ctx);
      }, &line->seconds, &line->host_s);
      !s.ok()) {
    return fail("topk", s);
  }
  if (auto s = dsa::read_device_error(ctx); !s.ok()) return fail("device error", s);
  line->floor_s = line->valid_bytes / bench.copy_bandwidth;

  std::vector<float> host_logits(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  std::vector<std::int32_t> selected(static_cast<std::size_t>(rows) * static_cast<std::size_t>(k));
  std::vector<std::int32_t> expected(selected.size());
  if (auto s = logits.download(host_logits.data(), host_logits.size() * sizeof(float)); !s.ok()) {
    return fail("download", s);
  }
  if (auto s = indices.download(selected.data(), selected.size() * sizeof(std::int32_t)); !s.ok()) {
    return fail("download", s);
  }
  dsa::ExecContext cpu;
  cpu.backend = dsa::Backend::cpu;
  dsa::TopkOptions host_options;
  host_options.row_starts = dsa::make_view(const_cast<std::int32_t*>(in.ks.data()), dsa::DType::int32, {rows});
  host_options.position_offsets = host_options.row_starts;
  if (auto s = dsa::topk(dsa::make_view(host_logits.data(), dsa::DType::float32, {rows, cols}),
                         dsa::make_view(const_cast<std::int32_t*>(in.lengths.data()), dsa::DType::int32, {rows}), k,
                         dsa::make_view(expected.data(), dsa::DType::int32, {rows, k}), host_options, cpu);
      !s.ok()) {
    return fail("cpu topk", s);
  }
  const std::int64_t differing = rows_with_different_sets(selected.data(), expected.data(), k, rows, k);
  if (differing > 0) {
    line->problems = format("%lld rows differ from the CPU selection", static_cast<long long>(differing));
  }
}

// One point's tensors on the bench's device, its row chunks and the calls of
// its three forms. The paged form reads a cache of one request holding the
// point's keys and scales, its pages in random order through a one-row block
// table (as the decode bench's workloads lay them out); each row chunk is a
// request of its own rows (offsets [0, rows], its own schedule). Queries,
// keys and the cache rotate past the L2 cache (the logits are only written).
// Holds Rotations of its own buffers: not movable.
struct PointTensors {
  PrefillPoint point;
  PrefillFormats formats;
  dsa::Device device;
  std::vector<dsa::MqaLogitsChunk> chunks;
  Buffer q, q_block_scales, keys, weights, key_scales, ks, ke, lengths, workspace, logits;
  Buffer cache, block_table, offsets, schedules;  // offsets and schedules: one each per chunk
  Buffer gathered_keys, gathered_scales;
  std::int64_t num_pages = 0, max_blocks = 0;
  int workers = 1;
  Rotation q_sets, key_sets, cache_sets;

  PointTensors() = default;
  PointTensors(const PointTensors&) = delete;
  PointTensors& operator=(const PointTensors&) = delete;

  std::int64_t rows(std::size_t c) const { return chunks[c].end - chunks[c].begin; }
  // Chunk c's rows of a tensor of `row_elements` elements a row.
  dsa::TensorView chunk_view(const Buffer& memory, std::size_t c, dsa::DType dtype, std::int64_t row_elements,
                             std::initializer_list<std::int64_t> shape) const {
    const std::int64_t offset = chunks[c].begin * row_elements * static_cast<std::int64_t>(dsa::dtype_size(dtype));
    return dsa::make_view(static_cast<std::uint8_t*>(memory.data()) + offset, dtype, shape, device);
  }
  // Chunk c's own int32 entries, `per_chunk` of them a chunk.
  dsa::TensorView chunk_entries(const Buffer& memory, std::size_t c, std::int64_t per_chunk,
                                std::initializer_list<std::int64_t> shape) const {
    return dsa::make_view(static_cast<std::int32_t*>(memory.data()) + static_cast<std::int64_t>(c) * per_chunk,
                          dsa::DType::int32, shape, device);
  }
  dsa::TensorView offsets_view(std::size_t c) const { return chunk_entries(offsets, c, 2, {2}); }
  dsa::TensorView schedule_view(std::size_t c) const {
    return chunk_entries(schedules, c, 2 * (workers + 1), {workers + 1, 2});
  }

  // mqa_logits over chunk c's rows against keys_in and scales_in.
  dsa::Status contiguous(std::size_t c, int run, const Buffer& keys_in, const Buffer& scales_in,
                         const dsa::ExecContext& ctx) const {
    const std::int64_t r = rows(c), heads = point.heads, kv = point.kv();
    const std::int64_t query_bytes = formats.query_bytes(), key_bytes = formats.key_bytes();
    dsa::MqaLogitsOptions options;
    options.clean_logits = true;  // DeepGEMM's default
    if (formats.fp4_queries()) options.q_block_scales = chunk_view(q_block_scales, c, dsa::DType::int32, heads, {r, heads});
    return dsa::mqa_logits(chunk_view(q_sets.at(run), c, formats.query_dtype(), heads * query_bytes, {r, heads, query_bytes}),
                           keys_in.view(formats.key_dtype(), {kv, key_bytes}),
                           scales_in.view(formats.key_scale_dtype(), {kv}),
                           chunk_view(weights, c, dsa::DType::float32, heads, {r, heads}),
                           chunk_view(ks, c, dsa::DType::int32, 1, {r}), chunk_view(ke, c, dsa::DType::int32, 1, {r}),
                           logits.view(dsa::DType::float32, {r, kv}), options, ctx);
  }

  // paged_mqa_logits over chunk c's rows as one request: the same logits
  // (max_context_len = S_kv, so clean_logits fills every column the
  // contiguous form fills).
  dsa::Status paged(std::size_t c, int run, const dsa::ExecContext& ctx) const {
    const std::int64_t r = rows(c), heads = point.heads, kv = point.kv(), query_bytes = formats.query_bytes();
    dsa::LogitsOptions options;
    options.clean_logits = true;
    options.path = dsa::LogitsPath::native;
    options.page_size = formats.page_tokens;
    options.key_format = formats.key_format;
    options.request_offsets = offsets_view(c);
    if (formats.fp4_queries()) {
      options.q_block_scales = chunk_view(q_block_scales, c, dsa::DType::int32, heads, {r, 1, heads});
    }
    return dsa::paged_mqa_logits(
        chunk_view(q_sets.at(run), c, formats.query_dtype(), heads * query_bytes, {r, 1, heads, query_bytes}),
        cache_sets.at(run).view(dsa::DType::uint8, {num_pages, formats.cache().min_page_bytes()}),
        chunk_view(weights, c, dsa::DType::float32, heads, {r, heads}),
        chunk_view(lengths, c, dsa::DType::int32, 1, {r}), block_table.view(dsa::DType::int32, {1, max_blocks}),
        schedule_view(c), kv, logits.view(dsa::DType::float32, {r, kv}), options, ctx);
  }

  // The request's keys and scales out of its pages into gathered_keys and
  // gathered_scales: a kernel on a GPU, a loop on the host.
  dsa::Status gather(int run, const dsa::ExecContext& ctx) const {
    const auto* table = static_cast<const std::int32_t*>(block_table.data());
    if (device.type == dsa::DeviceType::cuda) {
      return gather_request_keys_on_device(formats.cache(), table, point.kv(), cache_sets.at(run).data(),
                                           gathered_keys.data(), gathered_scales.data(), ctx.stream);
    }
    gather_request_keys(formats.cache(), table, point.kv(), static_cast<const std::uint8_t*>(cache_sets.at(run).data()),
                        static_cast<std::uint8_t*>(gathered_keys.data()), gathered_scales.data());
    return {};
  }

  // Every chunk of the run, in each form.
  dsa::Status contiguous_form(int run, const dsa::ExecContext& ctx) const {
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      DSA_RETURN_IF_ERROR(contiguous(c, run, key_sets.at(run), key_scales, ctx));
    }
    return {};
  }
  dsa::Status paged_form(int run, const dsa::ExecContext& ctx) const {
    for (std::size_t c = 0; c < chunks.size(); ++c) DSA_RETURN_IF_ERROR(paged(c, run, ctx));
    return {};
  }
  dsa::Status gathered_form(int run, const dsa::ExecContext& ctx) const {
    DSA_RETURN_IF_ERROR(gather(run, ctx));
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      DSA_RETURN_IF_ERROR(contiguous(c, run, gathered_keys, gathered_scales, ctx));
    }
    return {};
  }
};

// Uploads the point's inputs, builds its paged cache and block table, the
// rotations and the row chunks, allocates the logits and plans each chunk's
// schedule.
dsa::Status prepare_point(const Bench& bench, const PrefillInputs& in, std::uint64_t seed, const RaggedTopk* topk,
                          PointTensors* t, dsa::ExecContext* ctx) {
  const PrefillPoint& point = t->point;
  const std::int64_t seq = point.seq, kv = point.kv();
  const dsa::Device device = t->device;
  // One request of S rows over a prefix of P: its causal lengths are the
  // contiguous form's ke (ks = 0), its slots hold keys [0, S_kv).
  const WorkloadLayout layout =
      layout_for_prefixes({static_cast<std::int32_t>(point.prefix)}, static_cast<int>(seq), t->formats.page_tokens,
                          seed);
  t->num_pages = layout.num_pages;
  t->max_blocks = layout.max_blocks;
  std::vector<std::uint8_t> cache(static_cast<std::size_t>(layout.num_pages * t->formats.cache().min_page_bytes()));
  write_cache_tokens(t->formats.cache(), layout.slot_mapping, in.keys.data(), in.key_scales.data(), cache.data());
  const dsa::Status uploaded = [&]() -> dsa::Status {
    DSA_RETURN_IF_ERROR(upload(in.q, device, &t->q));
    DSA_RETURN_IF_ERROR(upload(in.q_block_scales, device, &t->q_block_scales));
    DSA_RETURN_IF_ERROR(upload(in.keys, device, &t->keys));
    DSA_RETURN_IF_ERROR(upload(in.weights, device, &t->weights));
    DSA_RETURN_IF_ERROR(upload(in.key_scales, device, &t->key_scales));
    DSA_RETURN_IF_ERROR(upload(in.ks, device, &t->ks));
    DSA_RETURN_IF_ERROR(upload(in.ke, device, &t->ke));
    DSA_RETURN_IF_ERROR(upload(in.lengths, device, &t->lengths));
    DSA_RETURN_IF_ERROR(upload(cache, device, &t->cache));
    DSA_RETURN_IF_ERROR(upload(layout.block_table, device, &t->block_table));
    DSA_RETURN_IF_ERROR(Buffer::allocate(in.keys.size(), device, &t->gathered_keys));
    return Buffer::allocate(in.key_scales.size() * sizeof(std::uint32_t), device, &t->gathered_scales);
  }();
  DSA_RETURN_IF_ERROR(in_stage("inputs", uploaded));

  if (bench.gpu()) {
    const std::size_t bytes =
        std::max({dsa::mqa_logits_workspace_bytes(*ctx), dsa::paged_mqa_logits_workspace_bytes(*ctx),
                  topk != nullptr ? dsa::topk_workspace_bytes(seq, kv, topk->k, *ctx) : 0});
    DSA_RETURN_IF_ERROR(in_stage("allocate workspace", Buffer::allocate(bytes, device, &t->workspace)));
    ctx->workspace = {t->workspace.data(), t->workspace.bytes()};
  }
  Bench point_bench = bench;
  point_bench.ctx = *ctx;
  DSA_RETURN_IF_ERROR(in_stage("rotation", t->q_sets.create(t->q, point_bench)));
  DSA_RETURN_IF_ERROR(in_stage("rotation", t->key_sets.create(t->keys, point_bench)));
  DSA_RETURN_IF_ERROR(in_stage("rotation", t->cache_sets.create(t->cache, point_bench)));

  // The rows' chunks: one call unless the logits exceed the budget.
  std::size_t budget = kLogitsBudget;
  if (bench.gpu()) {
    std::size_t free_bytes = 0, total_bytes = 0;
    DSA_RETURN_IF_ERROR(in_stage("device memory", device_memory(&free_bytes, &total_bytes)));
    budget = std::min(budget, free_bytes / 2);
  }
  DSA_RETURN_IF_ERROR(in_stage(
      format("no chunk of the logits fits %zu MiB", budget >> 20).c_str(),
      dsa::plan_mqa_logits_chunks(dsa::make_view(const_cast<std::int32_t*>(in.ks.data()), dsa::DType::int32, {seq}),
                                  dsa::make_view(const_cast<std::int32_t*>(in.ke.data()), dsa::DType::int32, {seq}),
                                  kv, false, dsa::DType::float32, budget, &t->chunks)));
  std::int64_t rows_per_call = 0;
  for (std::size_t c = 0; c < t->chunks.size(); ++c) rows_per_call = std::max(rows_per_call, t->rows(c));
  DSA_RETURN_IF_ERROR(in_stage(
      "allocate logits",
      Buffer::allocate(static_cast<std::size_t>(rows_per_call) * static_cast<std::size_t>(kv) * sizeof(float), device,
                       &t->logits)));

  // The paged form's requests, one a chunk, and their schedules.
  std::vector<std::int32_t> offsets;
  for (std::size_t c = 0; c < t->chunks.size(); ++c) {
    offsets.insert(offsets.end(), {0, static_cast<std::int32_t>(t->rows(c))});
  }
  DSA_RETURN_IF_ERROR(upload(offsets, device, &t->offsets));
  t->workers = dsa::default_num_workers(device, *ctx);
  DSA_RETURN_IF_ERROR(Buffer::allocate(
      t->chunks.size() * 2 * static_cast<std::size_t>(t->workers + 1) * sizeof(std::int32_t), device, &t->schedules));
  dsa::ExecContext checked = *ctx;
  checked.check_device_errors = bench.gpu();
  for (std::size_t c = 0; c < t->chunks.size(); ++c) {
    DSA_RETURN_IF_ERROR(in_stage(
        "plan_schedule",
        dsa::plan_schedule(t->chunk_view(t->lengths, c, dsa::DType::int32, 1, {t->rows(c)}), t->workers,
                           dsa::LogitsPath::native, t->schedule_view(c), checked, t->offsets_view(c))));
  }
  return {};
}

// Scores every chunk in the contiguous and the paged form (device errors
// checked) and compares the logits; then gathers the keys once and compares
// them with the point's. A call that fails is an error; outputs that differ
// are recorded in `agreement`.
dsa::Status check_forms(const Bench& bench, const PrefillInputs& in, const PointTensors& t, const dsa::ExecContext& ctx,
                        FormAgreement* agreement) {
  dsa::ExecContext checked = ctx;
  checked.check_device_errors = bench.gpu();
  agreement->tolerance = bench.gpu() ? kGpuTolerance : kCpuTolerance;
  const std::int64_t kv = t.point.kv();
  // Host copies of one chunk's logits in each form, up to 1.9e9 values each
  // on the grid: left uninitialized, the downloads fill them.
  const std::size_t capacity = t.logits.bytes() / sizeof(float);
  const auto contiguous = std::make_unique_for_overwrite<float[]>(capacity);
  const auto paged = std::make_unique_for_overwrite<float[]>(capacity);
  for (std::size_t c = 0; c < t.chunks.size(); ++c) {
    const std::int64_t rows = t.rows(c);
    const std::size_t bytes = static_cast<std::size_t>(rows) * static_cast<std::size_t>(kv) * sizeof(float);
    DSA_RETURN_IF_ERROR(in_stage("contiguous", t.contiguous(c, 0, t.keys, t.key_scales, checked)));
    DSA_RETURN_IF_ERROR(t.logits.download(contiguous.get(), bytes));
    DSA_RETURN_IF_ERROR(in_stage("paged", t.paged(c, 0, checked)));
    DSA_RETURN_IF_ERROR(t.logits.download(paged.get(), bytes));
    // Row slices on the host threads, for the largest points' sake.
    const std::int32_t* lengths = in.lengths.data() + t.chunks[c].begin;
    std::mutex merge;
    DSA_RETURN_IF_ERROR(run_in_slices(rows, [&](std::int64_t first, std::int64_t end) -> dsa::Status {
      const float* got = paged.get() + first * kv;
      const float* want = contiguous.get() + first * kv;
      const std::size_t slice_bytes = static_cast<std::size_t>((end - first) * kv) * sizeof(float);
      if (std::memcmp(got, want, slice_bytes) == 0) return {};
      const LogitsComparison valid = compare_logits(got, want, end - first, kv, lengths + first);
      std::int64_t cleaned_rows = 0;  // columns past the length: -inf in both forms (clean_logits)
      for (std::int64_t r = 0; r < end - first; ++r) {
        const std::int64_t length = lengths[first + r];
        cleaned_rows += std::memcmp(got + r * kv + length, want + r * kv + length,
                                    static_cast<std::size_t>(kv - length) * sizeof(float)) != 0;
      }
      const std::lock_guard<std::mutex> lock(merge);
      agreement->bitwise = false;
      agreement->max_relative_error = std::max(agreement->max_relative_error, valid.max_relative_error);
      agreement->non_finite += valid.non_finite;
      agreement->cleaned_rows += cleaned_rows;
      return {};
    }));
  }
  agreement->logits_compared = true;

  DSA_RETURN_IF_ERROR(in_stage("gather", t.gather(0, checked)));
  if (bench.gpu()) DSA_RETURN_IF_ERROR(in_stage("gather", synchronize_stream(ctx.stream)));
  std::vector<std::uint8_t> keys(in.keys.size());
  std::vector<std::uint32_t> scales(in.key_scales.size());
  DSA_RETURN_IF_ERROR(t.gathered_keys.download(keys.data(), keys.size()));
  DSA_RETURN_IF_ERROR(t.gathered_scales.download(scales.data(), scales.size() * sizeof(float)));
  agreement->gathered = compare_bytes(keys.data(), in.keys.data(), static_cast<std::int64_t>(keys.size()));
  if (agreement->gathered.passed()) {
    agreement->gathered = compare_bytes(scales.data(), in.key_scales.data(),
                                        static_cast<std::int64_t>(scales.size() * sizeof(std::uint32_t)));
    if (!agreement->gathered.passed()) agreement->gathered.first_mismatch += static_cast<std::int64_t>(keys.size());
  }
  agreement->keys_compared = true;
  return {};
}

// Times one form: a checked pass first (a range the device refuses is an
// error here, not a fast time of NaN rows; it synchronizes, so its wall clock
// bounds the runs a slow point gets, see kPointSeconds), then the timed runs.
dsa::Status time_form(const Bench& point_bench, const std::function<dsa::Status(int, const dsa::ExecContext&)>& form,
                      FormTimes* times) {
  dsa::ExecContext checked = point_bench.ctx;
  checked.check_device_errors = point_bench.gpu();
  const auto checked_start = std::chrono::steady_clock::now();
  DSA_RETURN_IF_ERROR(form(0, checked));
  const std::chrono::duration<double> checked_time = std::chrono::steady_clock::now() - checked_start;
  const int affordable = static_cast<int>(std::min(kPointSeconds / checked_time.count(), 1e6));
  Bench form_bench = point_bench;
  form_bench.iters = std::min(point_bench.iters, std::max(kMinRuns, affordable));
  if (form_bench.iters < point_bench.iters) form_bench.warmup = 1;  // the checked pass warmed it too
  times->runs = form_bench.iters;
  DSA_RETURN_IF_ERROR(form_bench.time([&](int run) { return form(run, point_bench.ctx); }, &times->seconds,
                                      &times->host_s));
  if (point_bench.gpu()) DSA_RETURN_IF_ERROR(in_stage("device error", dsa::read_device_error(point_bench.ctx)));
  return {};
}

// Times one point in its three forms (every chunk's call in each timed run),
// after checking the paged form and the gather against the contiguous form,
// and with `topk` the ragged top-k of its logits.
PrefillResult measure_point(const Bench& bench, const PrefillPoint& point, const PrefillFormats& formats,
                            std::uint64_t seed, RaggedTopk* topk) {
  PrefillResult result;
  result.point = point;
  const std::int64_t seq = point.seq, kv = point.kv(), heads = point.heads, dim = kHeadDim;
  const PrefillInputs in = make_inputs(point, formats, seed);
  for (const std::int32_t length : in.lengths) result.pairs += length;
  result.flops = 2.0 * static_cast<double>(heads * dim) * result.pairs;
  result.logits_bytes = 4.0 * static_cast<double>(seq) * static_cast<double>(kv);
  result.bytes = static_cast<double>(in.q.size() + in.keys.size()) +
                 4.0 * static_cast<double>(in.weights.size() + in.q_block_scales.size() + in.key_scales.size() +
                                           in.ks.size() + in.ke.size()) +
                 result.logits_bytes;
  if (bench.gpu()) {
    result.memory_floor_s = result.bytes / bench.copy_bandwidth;
    if (bench.fp8_peak_rate > 0) result.compute_floor_s = result.flops / bench.fp8_peak_rate;
  }

  PointTensors t;
  t.point = point;
  t.formats = formats;
  t.device = bench.target.device;
  dsa::ExecContext ctx = bench.ctx;
  if (auto s = prepare_point(bench, in, seed, topk, &t, &ctx); !s.ok()) {
    result.note(s.to_string());
    return result;
  }
  result.rotation = std::min({t.q_sets.size(), t.key_sets.size(), t.cache_sets.size()});
  std::int64_t rows_per_call = 0;
  for (std::size_t c = 0; c < t.chunks.size(); ++c) rows_per_call = std::max(rows_per_call, t.rows(c));
  for (FormTimes* form : {&result.contiguous, &result.paged, &result.gathered}) {
    form->calls = static_cast<int>(t.chunks.size());
    form->rows_per_call = rows_per_call;
  }

  const dsa::Status checked = check_forms(bench, in, t, ctx, &result.agreement);
  if (!checked.ok()) result.note("check: " + checked.to_string());
  const FormAgreement& agreement = result.agreement;
  if (agreement.logits_compared && !agreement.logits_agree()) {
    result.note(format("paged logits differ from the contiguous ones: max relative error %.2e (tolerance %.0e), "
                       "%lld non-finite, %lld rows with other columns past their length",
                       agreement.max_relative_error, agreement.tolerance,
                       static_cast<long long>(agreement.non_finite), static_cast<long long>(agreement.cleaned_rows)));
  }
  if (agreement.keys_compared && !agreement.gathered.passed()) {
    result.note(format("gathered keys and scales differ from the point's in %lld bytes, the first at byte %lld",
                       static_cast<long long>(agreement.gathered.mismatches),
                       static_cast<long long>(agreement.gathered.first_mismatch)));
  }

  // The contiguous form last, so that the top-k reads its logits.
  Bench point_bench = bench;
  point_bench.ctx = ctx;
  if (auto s = time_form(point_bench, [&](int run, const dsa::ExecContext& c) { return t.paged_form(run, c); },
                         &result.paged);
      !s.ok()) {
    result.note("paged: " + s.to_string());
  }
  if (auto s = time_form(point_bench, [&](int run, const dsa::ExecContext& c) { return t.gathered_form(run, c); },
                         &result.gathered);
      !s.ok()) {
    result.note("gather + contiguous: " + s.to_string());
  }
  if (auto s = time_form(point_bench, [&](int run, const dsa::ExecContext& c) { return t.contiguous_form(run, c); },
                         &result.contiguous);
      !s.ok()) {
    result.note("mqa_logits: " + s.to_string());
    return result;
  }
  if (topk != nullptr) {
    topk->valid_bytes = 4.0 * result.pairs;
    if (t.chunks.size() == 1) {
      measure_ragged_topk(bench, in, t.logits, t.ks, t.lengths, ctx, topk);
    } else {
      topk->problems = "the point's logits were split into chunks";
    }
  }
  return result;
}

Json form_json(const PrefillResult& r, const FormTimes& form) {
  Json entry = Json::object();
  entry.set("us", form.seconds * 1e6);
  entry.set("host_us", form.host_s * 1e6);
  entry.set("tflops", r.flops / form.seconds * 1e-12);
  entry.set("fraction_of_floor", r.floor_s() / form.seconds);
  entry.set("calls", form.calls);
  entry.set("rows_per_call", form.rows_per_call);
  entry.set("runs", form.runs);
  return entry;
}

Json point_json(const PrefillResult& r) {
  Json entry = Json::object();
  entry.set("heads", r.point.heads);
  entry.set("head_dim", kHeadDim);
  entry.set("seq", r.point.seq);
  entry.set("prefix", r.point.prefix);
  entry.set("seq_kv", r.point.kv());
  entry.set("valid_pairs", r.pairs);
  entry.set("flops", r.flops);
  entry.set("logits_bytes", r.logits_bytes);
  entry.set("bytes", r.bytes);
  entry.set("compute_floor_us", r.compute_floor_s * 1e6);
  entry.set("memory_floor_us", r.memory_floor_s * 1e6);
  entry.set("floor_us", r.floor_s() * 1e6);
  entry.set("bound", std::isnan(r.compute_floor_s) ? Json() : Json(r.bound()));
  entry.set("contiguous", form_json(r, r.contiguous));
  const FormAgreement& agreement = r.agreement;
  Json& paged = entry.set("paged", form_json(r, r.paged));
  paged.set("bitwise_equal_to_contiguous", agreement.logits_compared ? Json(agreement.bitwise) : Json());
  paged.set("max_relative_error_vs_contiguous",
            agreement.logits_compared ? Json(agreement.max_relative_error) : Json());
  paged.set("tolerance", agreement.tolerance);
  Json& gathered = entry.set("gather_contiguous", form_json(r, r.gathered));
  gathered.set("gathered_keys_equal", agreement.keys_compared ? Json(agreement.gathered.passed()) : Json());
  entry.set("gather_contiguous_over_paged", r.paged_speedup());
  entry.set("paged_speedup_target", r.point.paged_target() ? Json(kPagedSpeedupTarget) : Json());
  entry.set("rotating_input_sets", r.rotation);
  entry.set("ok", r.problems.empty());
  if (!r.problems.empty()) entry.set("problems", r.problems);
  return entry;
}

std::string calls_label(const FormTimes& form) {
  if (form.calls <= 1) return form.calls == 1 ? "1" : "-";
  return format("%dx%lld", form.calls, static_cast<long long>(form.rows_per_call));
}

std::string tflops(double flops, double seconds) {
  return std::isnan(seconds) ? std::string("n/a") : format("%.1f", flops / seconds * 1e-12);
}

// "bitwise", the largest relative error of the valid logits, or "n/a".
std::string agreement_label(const FormAgreement& agreement) {
  if (!agreement.logits_compared) return "n/a";
  return agreement.bitwise ? std::string("bitwise") : format("%.1e", agreement.max_relative_error);
}

void print_table(std::FILE* out, const std::vector<PrefillResult>& results, bool with_floor) {
  std::fprintf(out, "%3s %6s %6s %6s | %10s %9s %8s %9s %4s | %10s %10s %8s %8s | %10s %7s %7s | %s\n", "H", "S",
               "P", "S_kv", "us", "TFLOP/s", "host us", "calls", "runs", "paged us", "gather+c", "g+c/pg", "paged=c",
               "floor us", "floor/t", "bound", "check");
  for (const PrefillResult& r : results) {
    std::fprintf(out, "%3d %6s %6s %6s | %10s %9s %8s %9s %4d | %10s %10s %8s %8s | %10s %7s %7s | %s\n",
                 r.point.heads, context_label(r.point.seq).c_str(), context_label(r.point.prefix).c_str(),
                 context_label(r.point.kv()).c_str(), microseconds(r.contiguous.seconds).c_str(),
                 tflops(r.flops, r.contiguous.seconds).c_str(),
                 with_floor ? microseconds(r.contiguous.host_s).c_str() : "-", calls_label(r.contiguous).c_str(),
                 r.contiguous.runs, microseconds(r.paged.seconds).c_str(), microseconds(r.gathered.seconds).c_str(),
                 ratio(r.gathered.seconds, r.paged.seconds).c_str(), agreement_label(r.agreement).c_str(),
                 with_floor ? microseconds(r.floor_s()).c_str() : "-",
                 with_floor ? ratio(r.floor_s(), r.contiguous.seconds).c_str() : "-", with_floor ? r.bound() : "-",
                 r.problems.empty() ? "ok" : r.problems.c_str());
  }
}

void describe_workload(std::FILE* text, Json* document, const Bench& bench, const PrefillFormats& formats,
                       const char* grid, int k) {
  Json& parameters = document->set("parameters", Json::object());
  parameters.set("grid", grid);
  parameters.set("head_dim", kHeadDim);
  parameters.set("key_format", dsa::key_format_name(formats.key_format));
  parameters.set("query_format", dsa::key_format_name(formats.query_format));
  parameters.set("page_size", formats.page_tokens);
  parameters.set("form", "contiguous keys (prefix then new tokens), full float32 logits [S, S_kv], clean_logits");
  parameters.set("paged_form",
                 format("paged_mqa_logits over a cache of %d-token %s pages holding the same keys and scales in "
                        "random page order, one request of the S new tokens (request_offsets [0, S], lengths "
                        "P + i + 1, native path, schedule planned once outside the timed runs), max_context_len "
                        "S_kv: the same logits",
                        formats.page_tokens, dsa::key_format_name(formats.key_format)));
  parameters.set("gather_contiguous_form", "the request's keys and scales gathered out of its pages into a "
                                           "contiguous run, then the contiguous form, timed together");
  parameters.set("paged_speedup_target",
                 format("gather_contiguous.us / paged.us >= %.1f at P >= %lld", kPagedSpeedupTarget,
                        static_cast<long long>(kPagedTargetPrefix)));
  parameters.set("ranges", "causal: ks = 0, ke = P + i + 1");
  parameters.set("inputs", formats.inputs());
  parameters.set("logits_budget_bytes", static_cast<std::int64_t>(kLogitsBudget));
  parameters.set("k", k);
  Json& timing = document->set("timing", Json::object());
  timing.set("method", bench.gpu() ? "CUDA events around the enqueued work of each run, the stream held until the "
                                     "run is enqueued (host time excluded; host_us reports it), median"
                                   : "std::chrono wall clock, median");
  timing.set("warmup", bench.gpu() ? bench.warmup : 0);
  timing.set("iters", bench.iters);
  timing.set("slow_points", format("a form whose run takes over %g s / iters gets max(%d, %g s / its time) runs "
                                   "and one warm-up (each form's runs)",
                                   kPointSeconds, kMinRuns, kPointSeconds));
  if (bench.gpu()) {
    timing.set("rotation", "queries, keys and the paged cache copied until they span 4x the L2 cache (2..16 sets)");
  }
  const std::string fewer =
      bench.iters > kMinRuns
          ? format("; a form whose run takes over %.0f s / %d gets fewer runs, at least %d (runs)", kPointSeconds,
                   bench.iters, kMinRuns)
          : std::string();
  std::fprintf(text, "\nprefill grid: S new tokens over a prefix of P (S_kv = P + S contiguous keys, row i scores "
                     "keys [0, P + i + 1)), D=%d; mqa_logits writes full float32 logits [S, S_kv] with "
                     "clean_logits, as DeepGEMM's fp8_mqa_logits test runs it; %s queries, %s keys (%s); "
                     "median of %d run%s%s%s\n",
               kHeadDim, dsa::key_format_name(formats.query_format), dsa::key_format_name(formats.key_format),
               formats.inputs(), bench.iters, bench.iters == 1 ? "" : "s",
               bench.gpu() ? " (CUDA events around the enqueued work), queries, keys and cache rotated over >= 2 "
                             "copies"
                           : " (wall clock)",
               fewer.c_str());
  std::fprintf(text, "TFLOP/s counts 2*H*D per valid (row, key) pair; us and TFLOP/s compare with DeepGEMM's test; "
                     "calls = mqa_logits calls per run (NxR: logits over %zu GiB split into N chunks of R rows, "
                     "the time is their sum)\n",
               kLogitsBudget >> 30);
  std::fprintf(text, "paged us = the same rows scored straight from %d-token cache pages (paged_mqa_logits, one "
                     "request of S rows, random page order); gather+c = the request's keys gathered out of its "
                     "pages, then mqa_logits, timed together; g+c/pg = gather+c / paged (target: >= %.1f at "
                     "P >= %s); paged=c = the paged logits against the contiguous ones (bitwise, or the max "
                     "relative error)\n",
               formats.page_tokens, kPagedSpeedupTarget, context_label(kPagedTargetPrefix).c_str());
}

}  // namespace

int prefill_grid(const Bench& bench, const Options& options, std::FILE* text, Json* document) {
  const PrefillFormats formats = formats_of(options);
  describe_workload(text, document, bench, formats, "prefill", options.k);
  const std::vector<PrefillPoint> points = grid_points();
  std::vector<PrefillResult> results;
  RaggedTopk topk;
  topk.point = kTopkPoint;
  topk.k = options.k;
  Json& grid = document->set("grid", Json::array());
  bool all_ok = true;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const PrefillPoint& point = points[i];
    std::fprintf(text, "  [%zu/%zu] H=%d S=%s P=%s ...\n", i + 1, points.size(), point.heads,
                 context_label(point.seq).c_str(), context_label(point.prefix).c_str());
    std::fflush(text);
    const bool topk_here = point.heads == kTopkPoint.heads && point.seq == kTopkPoint.seq &&
                           point.prefix == kTopkPoint.prefix;
    results.push_back(measure_point(bench, point, formats, options.seed + i, topk_here ? &topk : nullptr));
    grid.push(point_json(results.back()));
    all_ok = all_ok && results.back().problems.empty();
  }

  if (!topk.measured && topk.problems.empty()) topk.problems = "not measured (its point failed)";
  all_ok = all_ok && topk.problems.empty();
  Json& line = document->set("ragged_topk", Json::object());
  line.set("heads", topk.point.heads);
  line.set("seq", topk.point.seq);
  line.set("prefix", topk.point.prefix);
  line.set("k", topk.k);
  line.set("candidates", "row i: columns [ks[i], ke[i]) of the full logits (row_starts = ks, lengths = ke - ks)");
  line.set("valid_bytes", topk.valid_bytes);
  line.set("us", topk.seconds * 1e6);
  line.set("host_us", topk.host_s * 1e6);
  line.set("floor_us", topk.floor_s * 1e6);
  line.set("time_over_floor", topk.seconds / topk.floor_s);
  line.set("rotating_input_sets", topk.rotation);
  line.set("ok", topk.problems.empty());
  if (!topk.problems.empty()) line.set("problems", topk.problems);

  if (bench.fp8_peak_rate > 0) {
    std::fprintf(text, "floor = max(FLOPs / fp8 tensor-core rate, bytes / copy bandwidth), bytes = the inputs read "
                       "once + 4*S*S_kv logits written once; floor/t = fraction of the floor reached; bound = the "
                       "larger term\n");
  } else {
    std::fprintf(text, "no fp8 rate floor: the tensor-core rate was not measured on this GPU (see above)\n");
  }
  print_table(text, results, bench.fp8_peak_rate > 0);

  // The paged form's target over the points it applies to.
  int target_points = 0, meeting = 0;
  const PrefillResult* smallest = nullptr;  // the point of the smallest speedup
  for (const PrefillResult& r : results) {
    if (!r.point.paged_target()) continue;
    ++target_points;
    const double speedup = r.paged_speedup();
    if (speedup >= kPagedSpeedupTarget) ++meeting;
    if (!std::isnan(speedup) && (smallest == nullptr || speedup < smallest->paged_speedup())) smallest = &r;
  }
  Json& target = document->set("paged_target", Json::object());
  target.set("target", kPagedSpeedupTarget);
  target.set("min_prefix", kPagedTargetPrefix);
  target.set("points", target_points);
  target.set("meeting", meeting);
  target.set("min_speedup", smallest != nullptr ? Json(smallest->paged_speedup()) : Json());
  std::fprintf(text, "\npaged form at P >= %s: gather+c / paged >= %.1f at %d of %d points",
               context_label(kPagedTargetPrefix).c_str(), kPagedSpeedupTarget, meeting, target_points);
  if (smallest != nullptr) {
    std::fprintf(text, ", the smallest %.2f (H=%d S=%s P=%s)", smallest->paged_speedup(), smallest->point.heads,
                 context_label(smallest->point.seq).c_str(), context_label(smallest->point.prefix).c_str());
  }
  std::fprintf(text, "\n");
  std::fprintf(text, "\nragged top-k of the H=%d S=%s P=%s logits (k=%d, row i's candidates [ks[i], ke[i]) of its "
                     "full row; floor = one read of the valid logits at copy bandwidth):\n",
               topk.point.heads, context_label(topk.point.seq).c_str(), context_label(topk.point.prefix).c_str(),
               topk.k);
  std::fprintf(text, "  %s us, floor %s us, time/floor %s (the target: at most 3), host %s us | %s\n", microseconds(topk.seconds).c_str(),
               microseconds(topk.floor_s).c_str(), ratio(topk.seconds, topk.floor_s).c_str(),
               microseconds(topk.host_s).c_str(), topk.problems.empty() ? "ok" : topk.problems.c_str());
  return all_ok ? 0 : 1;
}

int prefill_cpu_point(const Bench& bench, const Options& options, std::FILE* text, Json* document) {
  const PrefillFormats formats = formats_of(options);
  describe_workload(text, document, bench, formats, "prefill", options.k);
  const PrefillResult result = measure_point(bench, kCpuPoint, formats, options.seed, nullptr);
  document->set("cpu_point", point_json(result));
  print_table(text, {result}, false);
  return result.problems.empty() ? 0 : 1;
}

}  // namespace dsa_cli
