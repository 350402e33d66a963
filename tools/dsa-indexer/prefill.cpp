#include "prefill.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

#include "buffer.hpp"
#include "dsa/dsa.hpp"
#include "json.hpp"
#include "report.hpp"
#include "stages.hpp"
#include "run.hpp"
#include "timing.hpp"
#include "verify.hpp"
#include "workload.hpp"

namespace dsa_cli {
namespace {

// Defaults: small enough for a 2-core CPU to finish in seconds, and on a GPU
// a chunk whose float64 reference the host threads still check in seconds.
constexpr std::int64_t kCpuSeq = 256;
constexpr std::int64_t kGpuSeq = 512;
constexpr std::int64_t kCpuPrefix = 1024;
constexpr std::int64_t kGpuPrefix = 8192;
constexpr int kCpuIters = 3;
constexpr int kGpuIters = 20;
constexpr int kStorePage = 64;  // pages of the host cache the keys are quantized through

template <typename T>
dsa::Status upload(const std::vector<T>& values, dsa::Device device, Buffer* out) {
  DSA_RETURN_IF_ERROR(Buffer::allocate(std::max<std::size_t>(values.size() * sizeof(T), 1), device, out));
  return out->upload(values.data(), values.size() * sizeof(T));
}

// The inputs of mqa_logits, quantized on the host through the library
// (quantize_queries or quantize_queries_fp4, and store_index_keys, on the CPU
// backend) from the default run's random bf16 queries, head gates and keys:
// each of the two fp8, or fp4 (--key-format, --query-format) packed e2m1
// codes with ue8m0 block-scale words.
struct PrefillInputs {
  OperandFormats formats;
  std::vector<std::uint8_t> q;               // [S, H, query bytes]
  std::vector<std::int32_t> q_block_scales;  // fp4 queries: [S, H]
  std::vector<float> weights;                // [S, H], the fp8 q scale folded in
  std::vector<std::uint8_t> keys;            // [S_kv, key bytes]
  std::vector<std::uint32_t> key_scales;     // [S_kv]: fp32 scales (fp8) or scale words (fp4), as bits
  std::vector<std::int32_t> ks, ke;          // [S]
  std::vector<std::int32_t> lengths;         // [S] ke - ks
};

dsa::Status make_prefill_inputs(std::int64_t seq, std::int64_t prefix, int heads, std::uint64_t seed,
                                const OperandFormats& formats, PrefillInputs* out) {
  const std::int64_t dim = kHeadDim;
  const std::int64_t kv = prefix + seq;
  dsa::ExecContext host;
  host.backend = dsa::Backend::cpu;
  out->formats = formats;
  const dsa::KeyCacheLayout cache_layout{static_cast<int>(dim), kStorePage, formats.key_format};

  WorkloadShape query_shape;
  query_shape.batch = seq;
  query_shape.next_n = 1;
  query_shape.heads = heads;
  query_shape.seed = seed;
  HostInputs queries = make_host_queries(query_shape);
  const std::int64_t query_bytes = formats.query_bytes();
  out->q.resize(static_cast<std::size_t>(seq * heads * query_bytes));
  out->weights.resize(static_cast<std::size_t>(seq * heads));
  const dsa::TensorView q_in = dsa::make_view(queries.queries.data(), dsa::DType::bfloat16, {seq, 1, heads, dim});
  const dsa::TensorView gate = dsa::make_view(queries.head_gate.data(), dsa::DType::bfloat16, {seq, heads});
  const dsa::TensorView weights_out = dsa::make_view(out->weights.data(), dsa::DType::float32, {seq, heads});
  if (formats.fp4_queries()) {
    out->q_block_scales.resize(static_cast<std::size_t>(seq * heads));
    DSA_RETURN_IF_ERROR(in_stage(
        "quantize_queries_fp4",
        dsa::quantize_queries_fp4(q_in, gate, dsa::make_view(out->q.data(), dsa::DType::uint8, {seq, 1, heads, query_bytes}),
                                  dsa::make_view(out->q_block_scales.data(), dsa::DType::int32, {seq, 1, heads}),
                                  weights_out, {}, host)));
  } else {
    DSA_RETURN_IF_ERROR(in_stage(
        "quantize_queries",
        dsa::quantize_queries(q_in, gate, dsa::make_view(out->q.data(), dsa::DType::float8_e4m3, {seq, 1, heads, dim}),
                              weights_out, {}, host)));
  }

  // One request of S_kv tokens in slot order: its keys, stored into a host
  // cache and read back as contiguous fp8 rows and scales.
  WorkloadShape key_shape;
  key_shape.batch = 1;
  key_shape.next_n = 1;
  key_shape.heads = 1;
  key_shape.seed = seed;
  WorkloadLayout layout;
  layout.prefix_lens = {static_cast<std::int32_t>(kv - 1)};
  layout.context_lens = {static_cast<std::int32_t>(kv)};
  layout.slot_mapping.resize(static_cast<std::size_t>(kv));
  std::iota(layout.slot_mapping.begin(), layout.slot_mapping.end(), 0);
  HostInputs keys = make_host_inputs(key_shape, layout);
  const std::int64_t pages = (kv + kStorePage - 1) / kStorePage;
  Buffer cache;
  DSA_RETURN_IF_ERROR(Buffer::allocate(static_cast<std::size_t>(pages * cache_layout.min_page_bytes()), {}, &cache));
  dsa::StoreKeysOptions store;
  store.page_size = kStorePage;
  store.key_format = formats.key_format;
  DSA_RETURN_IF_ERROR(in_stage(
      "store_index_keys",
      dsa::store_index_keys(dsa::make_view(keys.keys.data(), dsa::DType::bfloat16, {kv, dim}),
                            dsa::make_view(layout.slot_mapping.data(), dsa::DType::int32, {kv}),
                            cache.view(dsa::DType::uint8, {pages, cache_layout.min_page_bytes()}), store, host)));
  out->keys.resize(static_cast<std::size_t>(kv * formats.key_bytes()));
  out->key_scales.resize(static_cast<std::size_t>(kv));
  std::vector<std::int32_t> pages_in_order(static_cast<std::size_t>(pages));
  std::iota(pages_in_order.begin(), pages_in_order.end(), 0);
  gather_request_keys(cache_layout, pages_in_order.data(), kv, static_cast<const std::uint8_t*>(cache.data()),
                      out->keys.data(), out->key_scales.data());

  // Causal ranges: row i (token P + i) sees keys [0, P + i + 1).
  out->ks.assign(static_cast<std::size_t>(seq), 0);
  out->ke.resize(static_cast<std::size_t>(seq));
  out->lengths.resize(static_cast<std::size_t>(seq));
  for (std::int64_t i = 0; i < seq; ++i) {
    out->ke[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(prefix + i + 1);
    out->lengths[static_cast<std::size_t>(i)] = out->ke[static_cast<std::size_t>(i)] - out->ks[static_cast<std::size_t>(i)];
  }
  return {};
}

// The reference logits in host memory, rows spread over the hardware threads
// (rows are independent).
dsa::Status reference_logits(PrefillInputs& in, std::int64_t seq, int heads, std::int64_t width,
                             std::int64_t stride, const dsa::MqaLogitsOptions& options, std::vector<float>* logits) {
  const OperandFormats& f = in.formats;
  const std::int64_t query_bytes = f.query_bytes();
  const std::int64_t kv = static_cast<std::int64_t>(in.key_scales.size());
  logits->assign(static_cast<std::size_t>(seq * stride), 0.0f);
  dsa::ExecContext ctx;
  ctx.backend = dsa::Backend::cpu_reference;
  ctx.reference_float64 = true;
  return run_in_slices(seq, [&](std::int64_t first, std::int64_t end) {
    const std::int64_t rows = end - first;
    dsa::MqaLogitsOptions slice_options = options;
    if (in.formats.fp4_queries()) {
      slice_options.q_block_scales =
          dsa::make_view(in.q_block_scales.data() + first * heads, dsa::DType::int32, {rows, heads});
    }
    return dsa::mqa_logits(
          dsa::make_view(in.q.data() + first * heads * query_bytes, f.query_dtype(), {rows, heads, query_bytes}),
          dsa::make_view(in.keys.data(), f.key_dtype(), {kv, f.key_bytes()}),
          dsa::make_view(in.key_scales.data(), f.key_scale_dtype(), {kv}),
          dsa::make_view(in.weights.data() + first * heads, dsa::DType::float32, {rows, heads}),
          dsa::make_view(in.ks.data() + first, dsa::DType::int32, {rows}),
          dsa::make_view(in.ke.data() + first, dsa::DType::int32, {rows}),
          dsa::make_view(logits->data() + first * stride, dsa::DType::float32, {rows, width}, {stride, 1}), slice_options,
          ctx);
  });
}

dsa::Status execute_prefill(const Options& options, std::FILE* text, Json* document, bool* passed) {
  Target target;
  std::string target_error;
  if (!resolve_target(options.backend, &target, &target_error)) {
    return {dsa::ErrorCode::unsupported, target_error};
  }
  const bool gpu = target.on_gpu();
  const dsa::Device device = target.device;
  const std::int64_t seq = options.seq.value_or(gpu ? kGpuSeq : kCpuSeq);
  const std::int64_t prefix = options.prefix.value_or(gpu ? kGpuPrefix : kCpuPrefix);
  const int heads = options.heads;
  const std::int64_t dim = kHeadDim;
  const int k = options.k;
  const int iters = options.iters.value_or(gpu ? kGpuIters : kCpuIters);
  const int warmup = gpu ? kGpuWarmup : 0;  // the CPU was just warmed by the checked pass
  const double tolerance = options.tolerance.value_or(gpu ? kGpuTolerance : kCpuTolerance);
  const bool compressed = options.compressed;
  const std::int64_t kv = prefix + seq;
  // Full form: column j holds key j (W = S_kv); compressed: column c holds key
  // ks[i] + c, W = max_seqlen_k = max(ke - ks) = P + S. Either way, with
  // ks = 0 the scored columns of row i are [0, ke[i]) and the top-k's
  // positions are key indices.
  const std::int64_t width = kv;
  const std::int64_t stride = width;

  PrefillInputs in;
  const OperandFormats formats{options.key_format, options.resolved_query_format()};
  DSA_RETURN_IF_ERROR(make_prefill_inputs(seq, prefix, heads, options.seed, formats, &in));
  double sum_lengths = 0;
  for (const std::int32_t length : in.lengths) sum_lengths += length;
  const double flops = 2.0 * heads * static_cast<double>(dim) * sum_lengths;
  const double logits_bytes = static_cast<double>(kv) * static_cast<double>(formats.key_bytes() + 4) +
                              static_cast<double>(seq) * heads * (static_cast<double>(formats.query_bytes()) + 4) + 8.0 * seq +
                              4.0 * static_cast<double>(seq) * static_cast<double>(width);
  const double topk_bytes = 4.0 * sum_lengths + 8.0 * seq + 4.0 * static_cast<double>(seq) * k;

  dsa::ExecContext ctx;
  ctx.backend = target.backend;
  dsa::DeviceStream stream;
  if (gpu) {
    DSA_RETURN_IF_ERROR(dsa::DeviceStream::create(device.index, &stream));
    ctx.stream = stream.handle();
  }
  Buffer q, q_block_scales, keys, key_scales, weights, ks, ke, lengths, logits, indices, workspace;
  DSA_RETURN_IF_ERROR(upload(in.q, device, &q));
  DSA_RETURN_IF_ERROR(upload(in.q_block_scales, device, &q_block_scales));
  DSA_RETURN_IF_ERROR(upload(in.keys, device, &keys));
  DSA_RETURN_IF_ERROR(upload(in.key_scales, device, &key_scales));
  DSA_RETURN_IF_ERROR(upload(in.weights, device, &weights));
  DSA_RETURN_IF_ERROR(upload(in.ks, device, &ks));
  DSA_RETURN_IF_ERROR(upload(in.ke, device, &ke));
  DSA_RETURN_IF_ERROR(upload(in.lengths, device, &lengths));
  DSA_RETURN_IF_ERROR(Buffer::allocate(static_cast<std::size_t>(seq * stride) * sizeof(float), device, &logits));
  DSA_RETURN_IF_ERROR(Buffer::allocate(static_cast<std::size_t>(seq * k) * sizeof(std::int32_t), device, &indices));
  if (gpu) {
    const std::size_t bytes =
        std::max(dsa::mqa_logits_workspace_bytes(ctx), dsa::topk_workspace_bytes(seq, width, k, ctx));
    DSA_RETURN_IF_ERROR(Buffer::allocate(std::max<std::size_t>(bytes, 1), device, &workspace));
    ctx.workspace = {workspace.data(), workspace.bytes()};
  }

  dsa::MqaLogitsOptions logits_options;
  logits_options.clean_logits = true;
  logits_options.compressed = compressed;
  logits_options.max_seqlen_k = compressed ? kv : 0;
  const dsa::TensorView q_view = q.view(formats.query_dtype(), {seq, heads, formats.query_bytes()});
  const dsa::TensorView keys_view = keys.view(formats.key_dtype(), {kv, formats.key_bytes()});
  const dsa::TensorView scales_view = key_scales.view(formats.key_scale_dtype(), {kv});
  dsa::MqaLogitsOptions device_logits_options = logits_options;
  if (formats.fp4_queries()) device_logits_options.q_block_scales = q_block_scales.view(dsa::DType::int32, {seq, heads});
  const dsa::TensorView weights_view = weights.view(dsa::DType::float32, {seq, heads});
  const dsa::TensorView ks_view = ks.view(dsa::DType::int32, {seq});
  const dsa::TensorView ke_view = ke.view(dsa::DType::int32, {seq});
  const dsa::TensorView lengths_view = lengths.view(dsa::DType::int32, {seq});
  const dsa::TensorView logits_view = logits.view(dsa::DType::float32, {seq, width});
  const dsa::TensorView indices_view = indices.view(dsa::DType::int32, {seq, k});
  // The ragged top-k: the full form's row i starts at column ks[i]; the
  // compressed form's at column 0. Positions come out as key indices.
  dsa::TopkOptions topk_options;
  if (!compressed) topk_options.row_starts = ks_view;
  topk_options.position_offsets = ks_view;

  const std::string device_text = report_backend(options, target, document);
  Json& shape_json = document->set("workload", Json::object());
  shape_json.set("seq", seq);
  shape_json.set("prefix", prefix);
  shape_json.set("seq_kv", kv);
  shape_json.set("heads", heads);
  shape_json.set("head_dim", dim);
  shape_json.set("k", k);
  shape_json.set("seed", static_cast<std::int64_t>(options.seed));
  shape_json.set("ranges", "causal: ks = 0, ke = prefix + i + 1");
  shape_json.set("form", compressed ? "compressed" : "full");
  shape_json.set("key_format", dsa::key_format_name(formats.key_format));
  shape_json.set("query_format", dsa::key_format_name(formats.query_format));
  shape_json.set("clean_logits", true);
  shape_json.set("logits_columns", width);

  std::fprintf(text, "dsa-indexer prefill: backend %s (%s) on %s\n", backend_choice_name(options.backend),
               dsa::backend_name(target.backend), device_text.c_str());
  std::fprintf(text,
               "workload: S=%lld new tokens over a prefix of P=%lld (S_kv=%lld) H=%d D=%lld k=%d; "
               "causal ranges [0, P + i + 1); %s queries, %s keys; %s logits of %lld columns, clean\n",
               static_cast<long long>(seq), static_cast<long long>(prefix), static_cast<long long>(kv), heads,
               static_cast<long long>(dim), k, dsa::key_format_name(formats.query_format), dsa::key_format_name(formats.key_format),
               compressed ? "compressed" : "full",
               static_cast<long long>(width));

  const std::vector<Stage> stages = {
      {"mqa_logits",
       [&](const dsa::ExecContext& c) {
         return dsa::mqa_logits(q_view, keys_view, scales_view, weights_view, ks_view, ke_view, logits_view,
                                device_logits_options, c);
       },
       logits_bytes, flops},
      {"topk",
       [&](const dsa::ExecContext& c) {
         return dsa::topk(logits_view, lengths_view, k, indices_view, topk_options, c);
       },
       topk_bytes},
  };

  DSA_RETURN_IF_ERROR(run_stages_checked(stages, gpu, ctx));
  std::vector<float> first_logits;
  std::vector<std::int32_t> first_indices;
  DSA_RETURN_IF_ERROR(download(logits, &first_logits));
  DSA_RETURN_IF_ERROR(download(indices, &first_indices));

  DSA_RETURN_IF_ERROR(time_stages(stages, gpu, ctx, warmup, iters, text, document));

  std::vector<float> got_logits;
  std::vector<std::int32_t> got_indices;
  DSA_RETURN_IF_ERROR(download(logits, &got_logits));
  DSA_RETURN_IF_ERROR(download(indices, &got_indices));

  // The float64 reference: the same call on cpu_reference, then its top-k.
  std::vector<float> ref_logits;
  DSA_RETURN_IF_ERROR(
      in_stage("reference mqa_logits", reference_logits(in, seq, heads, width, stride, logits_options, &ref_logits)));
  dsa::ExecContext ref_ctx;
  ref_ctx.backend = dsa::Backend::cpu_reference;
  dsa::TopkOptions host_topk;
  if (!compressed) host_topk.row_starts = dsa::make_view(in.ks.data(), dsa::DType::int32, {seq});
  host_topk.position_offsets = dsa::make_view(in.ks.data(), dsa::DType::int32, {seq});
  const dsa::TensorView host_lengths = dsa::make_view(in.lengths.data(), dsa::DType::int32, {seq});
  std::vector<std::int32_t> ref_indices(static_cast<std::size_t>(seq * k));
  std::vector<std::int32_t> own_selection(static_cast<std::size_t>(seq * k));
  DSA_RETURN_IF_ERROR(in_stage(
      "reference topk",
      dsa::topk(dsa::make_view(ref_logits.data(), dsa::DType::float32, {seq, width}), host_lengths, k,
                dsa::make_view(ref_indices.data(), dsa::DType::int32, {seq, k}), host_topk, ref_ctx)));
  DSA_RETURN_IF_ERROR(in_stage(
      "reference topk of the backend logits",
      dsa::topk(dsa::make_view(got_logits.data(), dsa::DType::float32, {seq, width}), host_lengths, k,
                dsa::make_view(own_selection.data(), dsa::DType::int32, {seq, k}), host_topk, ref_ctx)));

  CheckList checks;
  {
    const LogitsComparison result = compare_logits(got_logits.data(), ref_logits.data(), seq, stride, in.lengths.data());
    std::string detail = format("max relative error %.2e (tolerance %.0e)", result.max_relative_error, tolerance);
    if (result.worst_row >= 0) {
      detail += format(", worst at row %lld key %lld", static_cast<long long>(result.worst_row),
                       static_cast<long long>(result.worst_position));
    }
    if (result.non_finite > 0) detail += format(", %lld non-finite values", static_cast<long long>(result.non_finite));
    Json& entry = checks.add("logits", result.passed(tolerance), detail);
    entry.set("max_relative_error", result.max_relative_error);
    entry.set("tolerance", tolerance);
    entry.set("non_finite", result.non_finite);
  }
  {
    // clean_logits: every column a row does not score holds -inf.
    std::int64_t wrong = 0;
    for (std::int64_t r = 0; r < seq; ++r) {
      const float* row = got_logits.data() + r * stride;
      for (std::int64_t c = in.lengths[static_cast<std::size_t>(r)]; c < width; ++c) {
        if (!(std::isinf(row[c]) && row[c] < 0)) ++wrong;
      }
    }
    checks.add("masked columns", wrong == 0,
               wrong == 0 ? "-inf outside every row's range"
                          : format("%lld columns outside the ranges are not -inf", static_cast<long long>(wrong)));
  }
  add_topk_checks(checks, check_topk(got_indices.data(), ref_indices.data(), k, ref_logits.data(), stride,
                                        in.lengths.data(), seq, k, tolerance),
                  rows_with_different_sets(got_indices.data(), own_selection.data(), k, seq, k));
  {
    const bool logits_same = std::memcmp(first_logits.data(), got_logits.data(), got_logits.size() * sizeof(float)) == 0;
    const bool indices_same = first_indices == got_indices;
    checks.add("repeatability", logits_same && indices_same,
               logits_same && indices_same
                   ? format("logits and topk bitwise identical over %d runs", 1 + warmup + iters)
                   : std::string(logits_same ? "indices" : "logits") + " changed between runs");
  }

  report_verification(checks, text, document, passed);
  return {};
}

}  // namespace

int prefill_command(const Options& options) {
  return verified_command(options, "prefill", [&](std::FILE* text, Json* document, bool* passed) {
    return execute_prefill(options, text, document, passed);
  });
}

}  // namespace dsa_cli
