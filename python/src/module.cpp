// dsa_indexer._core: one Python function per public operation. Every array
// argument is any DLPack-capable object (NumPy, PyTorch, CuPy, ...) viewed in
// place; outputs and the workspace are allocated by the Python layer in the
// caller's framework. Calls run without the GIL; a failed call raises.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>

#include "dsa/dsa.hpp"
#include "views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace dsa::python {
namespace {

using LengthsBuilder = Status (*)(const TensorView&, int, const TensorView&, const ExecContext&,
                                  const TensorView&);

// The builders without the varlen form, as LengthsBuilder: request_offsets is
// always absent (the Python layer passes it to causal_context_lens only).
template <Status (*Build)(const TensorView&, int, const TensorView&, const ExecContext&)>
Status without_offsets(const TensorView& lens, int next_n, const TensorView& out, const ExecContext& ctx,
                       const TensorView&) {
  return Build(lens, next_n, out, ctx);
}

// The page sizes of the key cache the library serves (supported_page_size),
// in increasing order.
nb::tuple page_sizes() {
  nb::list sizes;
  for (int tokens = 1; tokens <= 1024; tokens *= 2) {
    if (supported_page_size(tokens)) sizes.append(tokens);
  }
  return nb::tuple(sizes);
}

void bind_enums(nb::module_& m) {
  nb::enum_<Backend>(m, "Backend")
      .value("automatic", Backend::automatic)
      .value("cpu_reference", Backend::cpu_reference)
      .value("cpu", Backend::cpu)
      .value("cuda_generic", Backend::cuda_generic)
      .value("cuda_hopper", Backend::cuda_hopper);
  nb::enum_<LogitsPath>(m, "LogitsPath")
      .value("automatic", LogitsPath::automatic)
      .value("native", LogitsPath::native)
      .value("per_token", LogitsPath::per_token);
  nb::enum_<IndexTopkStrategy>(m, "IndexTopkStrategy")
      .value("automatic", IndexTopkStrategy::automatic)
      .value("fused", IndexTopkStrategy::fused)
      .value("logits_then_topk", IndexTopkStrategy::logits_then_topk);
  nb::enum_<KeyFormat>(m, "KeyFormat")
      .value("automatic", KeyFormat::automatic)
      .value("fp8_e4m3", KeyFormat::fp8_e4m3)
      .value("fp4_e2m1", KeyFormat::fp4_e2m1);
  nb::enum_<LengthConvention>(m, "LengthConvention")
      .value("causal", LengthConvention::causal)
      .value("expanded", LengthConvention::expanded)
      .value("legacy", LengthConvention::legacy);
  nb::enum_<DeviceType>(m, "DeviceType")
      .value("cpu", DeviceType::cpu)
      .value("cuda", DeviceType::cuda);
}

void bind_context(nb::module_& m) {
  nb::class_<ExecContext>(m, "ExecContext",
                          "Where and how an operation runs (see dsa/context.hpp); the "
                          "workspace is passed to each call separately.")
      .def(nb::init<>())
      .def_rw("backend", &ExecContext::backend)
      .def_prop_rw(
          "stream",
          [](const ExecContext& ctx) { return reinterpret_cast<std::uintptr_t>(ctx.stream); },
          [](ExecContext& ctx, std::uintptr_t stream) {
            ctx.stream = reinterpret_cast<void*>(stream);
          },
          "cudaStream_t as an integer (0: the legacy default stream)")
      .def_rw("num_threads", &ExecContext::num_threads)
      .def_rw("reference_float64", &ExecContext::reference_float64)
      .def_rw("check_device_errors", &ExecContext::check_device_errors)
      .def_rw("programmatic_dependent_launch", &ExecContext::programmatic_dependent_launch);

  m.def("workspace_alignment", [] { return kWorkspaceAlignment; });
  m.def(
      "read_device_error",
      [](const ExecContext& ctx, const OptionalOutput& workspace) {
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] { return read_device_error(call_ctx); });
      },
      "ctx"_a, "workspace"_a.none(),
      "Synchronizes the stream and raises the first data-dependent error recorded in the "
      "workspace by the last CUDA operation that used it.");
}

void bind_devices(nb::module_& m) {
  m.def("built_with_cuda", &built_with_cuda);
  m.def("cuda_device_count", &cuda_device_count);
  m.def(
      "device_info",
      [](int device) {
        DeviceInfo info;
        raise_if_error(get_device_info(device, &info));
        nb::dict result;
        result["name"] = info.name;
        result["compute_capability"] = nb::make_tuple(info.compute_major, info.compute_minor);
        result["multiprocessors"] = info.multiprocessors;
        result["global_memory_bytes"] = info.global_memory_bytes;
        result["l2_cache_bytes"] = info.l2_cache_bytes;
        result["shared_memory_per_block_optin"] = info.shared_memory_per_block_optin;
        return result;
      },
      "device"_a);
  m.def(
      "resolve_logits_path",
      [](LogitsPath path, int next_n, int num_heads, DeviceType type, int index,
         const ExecContext& ctx) {
        return resolve_logits_path(path, next_n, num_heads, Device{type, index}, ctx);
      },
      "path"_a, "next_n"_a, "num_heads"_a, "device_type"_a, "device_index"_a, "ctx"_a);
  m.def(
      "default_num_workers",
      [](DeviceType type, int index, const ExecContext& ctx) {
        return default_num_workers(Device{type, index}, ctx);
      },
      "device_type"_a, "device_index"_a, "ctx"_a);
}

void bind_store_and_quantize(nb::module_& m) {
  m.def(
      "store_index_keys",
      [](const InputArray& keys, const InputArray& slot_mapping, const OutputArray& cache,
         bool power_of_two_scales, int page_size, KeyFormat key_format, const ExecContext& ctx,
         const OptionalOutput& workspace) {
        const TensorView keys_view = to_view(keys, "store_index_keys: keys");
        const TensorView slots_view = to_view(slot_mapping, "store_index_keys: slot_mapping");
        const TensorView cache_view = to_view(cache, "store_index_keys: cache");
        StoreKeysOptions options;
        options.power_of_two_scales = power_of_two_scales;
        options.page_size = page_size;
        options.key_format = key_format;
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return store_index_keys(keys_view, slots_view, cache_view, options, call_ctx);
        });
      },
      "keys"_a, "slot_mapping"_a, "cache"_a, "power_of_two_scales"_a, "page_size"_a, "key_format"_a,
      "ctx"_a, "workspace"_a.none());
  m.def("store_index_keys_workspace_bytes", &store_index_keys_workspace_bytes, "ctx"_a);

  m.def(
      "quantize_queries",
      [](const InputArray& q, const InputArray& head_gate, const OutputArray& q_fp8,
         const OutputArray& weights, bool power_of_two_scales, float weight_scale,
         const ExecContext& ctx, const OptionalOutput& workspace) {
        const TensorView q_view = to_view(q, "quantize_queries: q");
        const TensorView gate_view = to_view(head_gate, "quantize_queries: head_gate");
        const TensorView q_fp8_view =
            to_view(q_fp8, "quantize_queries: q_fp8", Uint8Meaning::float8_e4m3);
        const TensorView weights_view = to_view(weights, "quantize_queries: weights");
        QuantizeQueriesOptions options;
        options.power_of_two_scales = power_of_two_scales;
        options.weight_scale = weight_scale;
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return quantize_queries(q_view, gate_view, q_fp8_view, weights_view, options, call_ctx);
        });
      },
      "q"_a, "head_gate"_a, "q_fp8"_a, "weights"_a, "power_of_two_scales"_a, "weight_scale"_a,
      "ctx"_a, "workspace"_a.none());
  m.def(
      "quantize_queries_fp4",
      [](const InputArray& q, const InputArray& head_gate, const OutputArray& q_codes,
         const OutputArray& q_block_scales, const OutputArray& weights, float weight_scale,
         const ExecContext& ctx, const OptionalOutput& workspace) {
        const TensorView q_view = to_view(q, "quantize_queries_fp4: q");
        const TensorView gate_view = to_view(head_gate, "quantize_queries_fp4: head_gate");
        const TensorView codes_view = to_view(q_codes, "quantize_queries_fp4: q_codes");
        const TensorView scales_view = to_view(q_block_scales, "quantize_queries_fp4: q_block_scales");
        const TensorView weights_view = to_view(weights, "quantize_queries_fp4: weights");
        QuantizeQueriesOptions options;
        options.weight_scale = weight_scale;
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return quantize_queries_fp4(q_view, gate_view, codes_view, scales_view, weights_view, options,
                                      call_ctx);
        });
      },
      "q"_a, "head_gate"_a, "q_codes"_a, "q_block_scales"_a, "weights"_a, "weight_scale"_a, "ctx"_a,
      "workspace"_a.none());
  m.def("quantize_queries_workspace_bytes", &quantize_queries_workspace_bytes, "ctx"_a);
}

void bind_lengths_builder(nb::module_& m, const char* name, const char* input_name,
                          LengthsBuilder builder) {
  m.def(
      name,
      [builder, name, input_name](const InputArray& lens, int next_n, const OutputArray& out,
                                  const OptionalInput& request_offsets, const ExecContext& ctx,
                                  const OptionalOutput& workspace) {
        const std::string input_argument = std::string(name) + ": " + input_name;
        const TensorView lens_view = to_view(lens, input_argument.c_str());
        const std::string out_argument = std::string(name) + ": out";
        const TensorView out_view = to_view(out, out_argument.c_str());
        const std::string offsets_argument = std::string(name) + ": request_offsets";
        const TensorView offsets_view = to_view(request_offsets, offsets_argument.c_str());
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] { return builder(lens_view, next_n, out_view, call_ctx, offsets_view); });
      },
      nb::arg(input_name), "next_n"_a, "out"_a, "request_offsets"_a.none(), "ctx"_a, "workspace"_a.none());
}

void bind_lengths_and_schedule(nb::module_& m) {
  bind_lengths_builder(m, "causal_context_lens", "prefix_lens",
                       static_cast<LengthsBuilder>(&causal_context_lens));
  bind_lengths_builder(m, "expanded_context_lens", "prefix_lens", &without_offsets<&expanded_context_lens>);
  bind_lengths_builder(m, "legacy_context_lens", "lens", &without_offsets<&legacy_context_lens>);

  m.def(
      "plan_schedule",
      [](const InputArray& context_lens, int num_workers, LogitsPath path,
         const OutputArray& schedule, const OptionalInput& request_offsets, const ExecContext& ctx,
         const OptionalOutput& workspace) {
        const TensorView lens_view = to_view(context_lens, "plan_schedule: context_lens");
        const TensorView schedule_view = to_view(schedule, "plan_schedule: schedule");
        const TensorView offsets_view = to_view(request_offsets, "plan_schedule: request_offsets");
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return plan_schedule(lens_view, num_workers, path, schedule_view, call_ctx, offsets_view);
        });
      },
      "context_lens"_a, "num_workers"_a, "path"_a, "schedule"_a, "request_offsets"_a.none(), "ctx"_a,
      "workspace"_a.none());

  m.def(
      "context_lens_and_schedule",
      [](LengthConvention convention, const InputArray& lens, int next_n, const OutputArray& context_lens,
         int num_workers, LogitsPath path, const OutputArray& schedule, const OptionalInput& request_offsets,
         const ExecContext& ctx, const OptionalOutput& workspace) {
        const char* op = "context_lens_and_schedule: ";
        const TensorView lens_view = to_view(lens, (std::string(op) + "lens").c_str());
        const TensorView context_lens_view = to_view(context_lens, (std::string(op) + "context_lens").c_str());
        const TensorView schedule_view = to_view(schedule, (std::string(op) + "schedule").c_str());
        const TensorView offsets_view = to_view(request_offsets, (std::string(op) + "request_offsets").c_str());
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return context_lens_and_schedule(convention, lens_view, next_n, context_lens_view, num_workers, path,
                                           schedule_view, call_ctx, offsets_view);
        });
      },
      "convention"_a, "lens"_a, "next_n"_a, "context_lens"_a, "num_workers"_a, "path"_a, "schedule"_a,
      "request_offsets"_a.none(), "ctx"_a, "workspace"_a.none());
}

// The scoring inputs paged_mqa_logits and index_topk share, as views. q is
// fp8 (a uint8 array: its bytes), or packed fp4 codes when q_block_scales is given.
struct ScoringViews {
  TensorView q, key_cache, weights, context_lens, block_table, schedule, q_block_scales;

  ScoringViews(const char* op, const InputArray& q_array, const InputArray& cache_array,
               const InputArray& weights_array, const InputArray& lens_array,
               const InputArray& table_array, const InputArray& schedule_array,
               const OptionalInput& scales_array) {
    const std::string prefix = std::string(op) + ": ";
    q_block_scales = to_view(scales_array, (prefix + "q_block_scales").c_str());
    q = to_view(q_array, (prefix + "q").c_str(),
                q_block_scales.empty() ? Uint8Meaning::float8_e4m3 : Uint8Meaning::bytes);
    key_cache = to_view(cache_array, (prefix + "key_cache").c_str());
    weights = to_view(weights_array, (prefix + "weights").c_str());
    context_lens = to_view(lens_array, (prefix + "context_lens").c_str());
    block_table = to_view(table_array, (prefix + "block_table").c_str());
    schedule = to_view(schedule_array, (prefix + "schedule").c_str());
  }
};

void bind_scoring(nb::module_& m) {
  nb::class_<IndexTopkOptions>(m, "IndexTopkOptions")
      .def(nb::init<>())
      .def_rw("k", &IndexTopkOptions::k)
      .def_rw("sorted", &IndexTopkOptions::sorted)
      .def_rw("physical_slots", &IndexTopkOptions::physical_slots)
      .def_rw("path", &IndexTopkOptions::path)
      .def_rw("strategy", &IndexTopkOptions::strategy)
      .def_rw("page_size", &IndexTopkOptions::page_size)
      .def_rw("key_format", &IndexTopkOptions::key_format);

  m.def(
      "paged_mqa_logits",
      [](const InputArray& q, const InputArray& key_cache, const InputArray& weights,
         const InputArray& context_lens, const InputArray& block_table,
         const InputArray& schedule, std::int64_t max_context_len, const OutputArray& logits,
         bool clean_logits, LogitsPath path, int page_size, KeyFormat key_format,
         const OptionalInput& q_block_scales, const OptionalInput& request_offsets, const ExecContext& ctx,
         const OptionalOutput& workspace) {
        const ScoringViews in("paged_mqa_logits", q, key_cache, weights, context_lens,
                              block_table, schedule, q_block_scales);
        const TensorView logits_view = to_view(logits, "paged_mqa_logits: logits");
        LogitsOptions options;
        options.clean_logits = clean_logits;
        options.path = path;
        options.page_size = page_size;
        options.key_format = key_format;
        options.q_block_scales = in.q_block_scales;
        options.request_offsets = to_view(request_offsets, "paged_mqa_logits: request_offsets");
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return paged_mqa_logits(in.q, in.key_cache, in.weights, in.context_lens,
                                  in.block_table, in.schedule, max_context_len, logits_view,
                                  options, call_ctx);
        });
      },
      "q"_a, "key_cache"_a, "weights"_a, "context_lens"_a, "block_table"_a, "schedule"_a,
      "max_context_len"_a, "logits"_a, "clean_logits"_a, "path"_a, "page_size"_a, "key_format"_a,
      "q_block_scales"_a.none(), "request_offsets"_a.none(), "ctx"_a, "workspace"_a.none());
  m.def("paged_mqa_logits_workspace_bytes", &paged_mqa_logits_workspace_bytes, "ctx"_a);

  m.def(
      "mqa_logits",
      [](const InputArray& q, const InputArray& keys, const InputArray& key_scales,
         const InputArray& weights, const InputArray& ks, const InputArray& ke,
         const OutputArray& logits, bool clean_logits, bool compressed,
         std::int64_t max_seqlen_k, const OptionalInput& q_block_scales, const ExecContext& ctx,
         const OptionalOutput& workspace) {
        // uint8 arrays are fp8 bytes, or packed fp4 codes when their scales say so:
        // q_block_scales for q, int32 key_scales (scale words) for keys.
        const TensorView q_scales_view = to_view(q_block_scales, "mqa_logits: q_block_scales");
        const TensorView q_view = to_view(
            q, "mqa_logits: q", q_scales_view.empty() ? Uint8Meaning::float8_e4m3 : Uint8Meaning::bytes);
        const TensorView scales_view = to_view(key_scales, "mqa_logits: key_scales");
        const TensorView keys_view = to_view(
            keys, "mqa_logits: keys",
            scales_view.dtype == DType::int32 ? Uint8Meaning::bytes : Uint8Meaning::float8_e4m3);
        const TensorView weights_view = to_view(weights, "mqa_logits: weights");
        const TensorView ks_view = to_view(ks, "mqa_logits: ks");
        const TensorView ke_view = to_view(ke, "mqa_logits: ke");
        const TensorView logits_view = to_view(logits, "mqa_logits: logits");
        MqaLogitsOptions options;
        options.clean_logits = clean_logits;
        options.compressed = compressed;
        options.max_seqlen_k = max_seqlen_k;
        options.q_block_scales = q_scales_view;
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return mqa_logits(q_view, keys_view, scales_view, weights_view, ks_view, ke_view,
                            logits_view, options, call_ctx);
        });
      },
      "q"_a, "keys"_a, "key_scales"_a, "weights"_a, "ks"_a, "ke"_a, "logits"_a,
      "clean_logits"_a, "compressed"_a, "max_seqlen_k"_a, "q_block_scales"_a.none(), "ctx"_a,
      "workspace"_a.none());
  m.def("mqa_logits_workspace_bytes", &mqa_logits_workspace_bytes, "ctx"_a);
  m.def(
      "plan_mqa_logits_chunks",
      [](const InputArray& ks, const InputArray& ke, std::int64_t num_keys, bool compressed, bool bf16,
         std::size_t budget_bytes) {
        const TensorView ks_view = to_view(ks, "plan_mqa_logits_chunks: ks");
        const TensorView ke_view = to_view(ke, "plan_mqa_logits_chunks: ke");
        std::vector<MqaLogitsChunk> chunks;
        run_released([&] {
          return plan_mqa_logits_chunks(ks_view, ke_view, num_keys, compressed,
                                        bf16 ? DType::bfloat16 : DType::float32, budget_bytes, &chunks);
        });
        std::vector<std::tuple<std::int64_t, std::int64_t, std::int64_t>> result;
        for (const MqaLogitsChunk& chunk : chunks) result.emplace_back(chunk.begin, chunk.end, chunk.max_seqlen_k);
        return result;
      },
      "ks"_a, "ke"_a, "num_keys"_a, "compressed"_a, "bf16"_a, "budget_bytes"_a);

  m.def(
      "topk",
      [](const InputArray& logits, const InputArray& lengths, int k, const OutputArray& indices,
         bool sorted, const OptionalInput& row_starts, const OptionalInput& position_offsets,
         const OptionalInput& block_table, int page_size, int rows_per_request,
         const OptionalInput& request_offsets, const ExecContext& ctx,
         const OptionalOutput& workspace) {
        const TensorView logits_view = to_view(logits, "topk: logits");
        const TensorView lengths_view = to_view(lengths, "topk: lengths");
        const TensorView indices_view = to_view(indices, "topk: indices");
        TopkOptions options;
        options.sorted = sorted;
        options.row_starts = to_view(row_starts, "topk: row_starts");
        options.position_offsets = to_view(position_offsets, "topk: position_offsets");
        options.block_table = to_view(block_table, "topk: block_table");
        options.page_size = page_size;
        options.rows_per_request = rows_per_request;
        options.request_offsets = to_view(request_offsets, "topk: request_offsets");
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return topk(logits_view, lengths_view, k, indices_view, options, call_ctx);
        });
      },
      "logits"_a, "lengths"_a, "k"_a, "indices"_a, "sorted"_a, "row_starts"_a.none(),
      "position_offsets"_a.none(), "block_table"_a.none(), "page_size"_a, "rows_per_request"_a,
      "request_offsets"_a.none(), "ctx"_a, "workspace"_a.none());
  m.def("topk_workspace_bytes", &topk_workspace_bytes, "rows"_a, "max_length"_a, "k"_a,
        "ctx"_a);

  m.def(
      "index_topk",
      [](const InputArray& q, const InputArray& key_cache, const InputArray& weights,
         const InputArray& context_lens, const InputArray& block_table,
         const InputArray& schedule, std::int64_t max_context_len, const OptionalInput& topk_lens,
         const OutputArray& indices, const IndexTopkOptions& options, const OptionalInput& q_block_scales,
         const OptionalInput& request_offsets, const ExecContext& ctx, const OptionalOutput& workspace) {
        const ScoringViews in("index_topk", q, key_cache, weights, context_lens, block_table,
                              schedule, q_block_scales);
        IndexTopkOptions call_options = options;
        call_options.q_block_scales = in.q_block_scales;
        call_options.request_offsets = to_view(request_offsets, "index_topk: request_offsets");
        const TensorView topk_lens_view = to_view(topk_lens, "index_topk: topk_lens");
        const TensorView indices_view = to_view(indices, "index_topk: indices");
        const ExecContext call_ctx = with_workspace(ctx, workspace);
        run_released([&] {
          return index_topk(in.q, in.key_cache, in.weights, in.context_lens, in.block_table,
                            in.schedule, max_context_len, topk_lens_view, indices_view, call_options,
                            call_ctx);
        });
      },
      "q"_a, "key_cache"_a, "weights"_a, "context_lens"_a, "block_table"_a, "schedule"_a,
      "max_context_len"_a, "topk_lens"_a.none(), "indices"_a, "options"_a, "q_block_scales"_a.none(),
      "request_offsets"_a.none(), "ctx"_a, "workspace"_a.none());
  m.def("index_topk_workspace_bytes", &index_topk_workspace_bytes, "rows"_a,
        "max_context_len"_a, "options"_a, "ctx"_a);

}

}  // namespace
}  // namespace dsa::python

NB_MODULE(_core, m) {
  m.doc() = "Bindings of the dsa-indexer C++ library (use the dsa_indexer package instead)";
  m.attr("MAX_TOPK") = dsa::kMaxTopk;
  m.attr("MAX_CPU_THREADS") = dsa::kMaxCpuThreads;
  m.attr("PAGE_TOKENS") = dsa::kDefaultPageTokens;
  m.attr("PAGE_SIZES") = dsa::python::page_sizes();
  m.attr("CHUNK_TOKENS") = dsa::kChunkTokens;
  dsa::python::bind_enums(m);
  dsa::python::bind_context(m);
  dsa::python::bind_devices(m);
  dsa::python::bind_store_and_quantize(m);
  dsa::python::bind_lengths_and_schedule(m);
  dsa::python::bind_scoring(m);
}
