#include "validate.hpp"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "common/cache_format.hpp"
#include "common/logit_rules.hpp"
#include "common/schedule_walk.hpp"
#include "dsa/schedule.hpp"

namespace dsa::detail {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr int kMaxHeadDim = 256;
constexpr int kHeadDimMultiple = 16;
constexpr std::int64_t kQueryRowAlignment = 16;  // bytes
constexpr std::int64_t kCacheAlignment = 16;     // bytes

std::string str(std::int64_t value) { return std::to_string(value); }

Status fail(ErrorCode code, const char* op, const char* arg, const std::string& rule) {
  return {code, std::string(op) + ": " + arg + ": " + rule};
}

std::string dtype_list(std::initializer_list<DType> dtypes) {
  std::string names;
  for (DType dtype : dtypes) names += (names.empty() ? "" : " or ") + std::string(dtype_name(dtype));
  return names;
}

std::string device_name(Device device) {
  return (device.type == DeviceType::cuda ? "cuda:" : "cpu:") + std::to_string(device.index);
}

bool aligned(const void* pointer, std::int64_t alignment) {
  return reinterpret_cast<std::uintptr_t>(pointer) % static_cast<std::uintptr_t>(alignment) == 0;
}

// True when the product of the (non-negative) extents does not fit int64: every
// size derived from them (B * next_n, rows, loop bounds) would wrap.
bool element_count_overflows(const TensorView& view) {
  std::int64_t count = 1;
  bool overflow = false;
  for (int d = 0; d < view.ndim; ++d) {
    const std::int64_t extent = view.size(d);
    if (extent == 0) return false;  // an empty tensor, whatever the other extents
    overflow = overflow || count > std::numeric_limits<std::int64_t>::max() / extent;
    if (!overflow) count *= extent;
  }
  return overflow;
}

// Presence, rank, dtype, non-negative extents and strides of a required tensor.
Status check_tensor(const char* op, const char* arg, const TensorView& view, int rank,
                    std::initializer_list<DType> dtypes) {
  if (view.empty()) return fail(ErrorCode::null_pointer, op, arg, "required tensor is missing (empty view)");
  if (view.ndim != rank) {
    return fail(ErrorCode::bad_shape, op, arg,
                "expected rank " + str(rank) + ", got " + view.describe());
  }
  bool dtype_ok = false;
  for (DType dtype : dtypes) dtype_ok = dtype_ok || view.dtype == dtype;
  if (!dtype_ok) {
    return fail(ErrorCode::bad_dtype, op, arg,
                "expected " + dtype_list(dtypes) + ", got " + dtype_name(view.dtype));
  }
  for (int d = 0; d < rank; ++d) {
    if (view.size(d) < 0) {
      return fail(ErrorCode::bad_shape, op, arg,
                  "dimension " + str(d) + " has negative extent in " + view.describe());
    }
    if (view.stride(d) < 0) {
      return fail(ErrorCode::bad_stride, op, arg,
                  "negative strides are not accepted, got " + view.describe());
    }
  }
  if (element_count_overflows(view)) {
    return fail(ErrorCode::bad_shape, op, arg,
                "extents multiply past the int64 range, got " + view.describe());
  }
  if (view.data == nullptr && view.numel() > 0) {
    return fail(ErrorCode::null_pointer, op, arg,
                "data pointer is null but the tensor has " + str(view.numel()) + " elements");
  }
  return Status::success();
}

Status expect_extent(const char* op, const char* arg, const TensorView& view, int dim,
                     std::int64_t expected, const std::string& meaning) {
  if (view.size(dim) != expected) {
    return fail(ErrorCode::bad_shape, op, arg,
                "dimension " + str(dim) + " must be " + meaning + " = " + str(expected) + ", got " +
                    view.describe());
  }
  return Status::success();
}

Status expect_inner_contiguous(const char* op, const char* arg, const TensorView& view) {
  const int inner = view.ndim - 1;
  if (view.size(inner) > 1 && view.stride(inner) != 1) {
    return fail(ErrorCode::bad_stride, op, arg,
                "inner dimension must be contiguous (stride 1), got " + view.describe());
  }
  return Status::success();
}

// Rows of a 2-D output hold `written` elements each; a smaller row stride would make
// them overlap, so one row's results would overwrite another's.
Status expect_rows_apart(const char* op, const char* arg, const TensorView& view, std::int64_t written,
                         const std::string& meaning) {
  if (view.size(0) > 1 && view.stride(0) < written) {
    return fail(ErrorCode::bad_stride, op, arg,
                "row stride " + str(view.stride(0)) + " is smaller than " + meaning + " = " + str(written) +
                    " (rows would overlap)");
  }
  return Status::success();
}

// Two outputs written by one operation share no byte: the spans from each
// one's lowest to its highest element are disjoint.
Status expect_apart(const char* op, const char* arg, const TensorView& view, const char* other_arg,
                    const TensorView& other) {
  const auto span_of = [](const TensorView& v) {
    std::int64_t low = 0, high = 0;  // element offsets
    for (int d = 0; d < v.ndim; ++d) {
      if (v.size(d) == 0) return std::pair<std::uintptr_t, std::uintptr_t>{0, 0};
      (v.stride(d) < 0 ? low : high) += v.stride(d) * (v.size(d) - 1);
    }
    const auto base = reinterpret_cast<std::uintptr_t>(v.data);
    const auto bytes = static_cast<std::int64_t>(dtype_size(v.dtype));
    return std::pair<std::uintptr_t, std::uintptr_t>{base + low * bytes, base + (high + 1) * bytes};
  };
  const auto [first, end] = span_of(view);
  const auto [other_first, other_end] = span_of(other);
  if (first < end && other_first < other_end && first < other_end && other_first < end) {
    return fail(ErrorCode::invalid_argument, op, arg, std::string("shares memory with ") + other_arg + ", got " +
                                                          view.describe() + " and " + other.describe());
  }
  return Status::success();
}

// An enum argument holds one of its named values (a C++ caller can cast any
// integer into one).
Status expect_path(const char* op, const char* arg, LogitsPath path) {
  if (path != LogitsPath::automatic && path != LogitsPath::native && path != LogitsPath::per_token) {
    return fail(ErrorCode::invalid_argument, op, arg,
                "not a LogitsPath value, got " + str(static_cast<std::int64_t>(path)));
  }
  return Status::success();
}

// No two elements of an output share memory: taken by increasing stride, each
// dimension of extent > 1 steps past everything the smaller strides reach.
Status expect_no_overlap(const char* op, const char* arg, const TensorView& view) {
  std::vector<std::pair<std::int64_t, std::int64_t>> steps;  // (stride, extent)
  for (int d = 0; d < view.ndim; ++d) {
    if (view.size(d) > 1) steps.emplace_back(view.stride(d), view.size(d));
  }
  std::sort(steps.begin(), steps.end());
  std::int64_t reach = 1;  // elements from the first to one past the last, over the dimensions so far
  for (const auto& [stride, extent] : steps) {
    if (stride < reach) {
      return fail(ErrorCode::bad_stride, op, arg, "elements would overlap, got " + view.describe());
    }
    reach = stride * (extent - 1) + reach;
  }
  return Status::success();
}

Status expect_head_dim(const char* op, const char* arg, std::int64_t head_dim) {
  if (head_dim <= 0 || head_dim % kHeadDimMultiple != 0 || head_dim > kMaxHeadDim) {
    return fail(ErrorCode::bad_shape, op, arg,
                "head dim must be a positive multiple of " + str(kHeadDimMultiple) + " and at most " +
                    str(kMaxHeadDim) + ", got " + str(head_dim));
  }
  return Status::success();
}

Status expect_next_n(const char* op, const char* arg, const TensorView& view) {
  if (view.size(1) < 1) {
    return fail(ErrorCode::bad_shape, op, arg,
                "dimension 1 (next_n) must be >= 1, got " + view.describe());
  }
  return Status::success();
}

Status expect_k(const char* op, int k) {
  if (k < 1 || k > kMaxTopk) {
    return fail(ErrorCode::k_out_of_range, op, "k",
                "must be in 1.." + str(kMaxTopk) + ", got " + str(k));
  }
  return Status::success();
}

Status expect_indices(const char* op, const TensorView& indices, std::int64_t rows, int k,
                      const std::string& rows_meaning) {
  DSA_RETURN_IF_ERROR(check_tensor(op, "indices", indices, 2, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "indices", indices, 0, rows, rows_meaning));
  if (indices.size(1) < k) {
    return fail(ErrorCode::k_out_of_range, op, "indices",
                "has " + str(indices.size(1)) + " columns, fewer than k = " + str(k));
  }
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "indices", indices));
  return expect_rows_apart(op, "indices", indices, k, "k");
}

using NamedView = std::pair<const char*, const TensorView*>;

// Every non-empty tensor must live on the first one's device.
Status expect_one_device(const char* op, std::initializer_list<NamedView> views) {
  const NamedView* first = nullptr;
  for (const NamedView& named : views) {
    if (named.second->empty()) continue;
    if (first == nullptr) {
      first = &named;
    } else if (!(named.second->device == first->second->device)) {
      return fail(ErrorCode::bad_device, op, named.first,
                  "is on " + device_name(named.second->device) + " but " + first->first + " is on " +
                      device_name(first->second->device));
    }
  }
  return Status::success();
}

// A tensor added to an already validated problem must share q's device.
Status expect_device(const char* op, const char* arg, const TensorView& view, Device device) {
  if (!view.empty() && !(view.device == device)) {
    return fail(ErrorCode::bad_device, op, arg,
                "is on " + device_name(view.device) + " but q is on " + device_name(device));
  }
  return Status::success();
}

// The 2-D [num_pages, bytes_per_page] or 4-D DeepGEMM [num_pages, P, 1, W]
// cache view, with the page size and key format its operation's options give
// (`page_size`, `key_format`, read as dsa/cache.hpp says).
Status parse_cache(const char* op, const char* arg, const TensorView& cache, int page_size, KeyFormat key_format,
                   int head_dim, const char* head_dim_source, CacheRef* out) {
  if (page_size != 0 && !supported_page_size(page_size)) {
    return fail(ErrorCode::invalid_argument, op, "options.page_size",
                "must be 0 (the page size of the cache view), 32 or 64, got " + str(page_size));
  }
  if (key_format != KeyFormat::automatic && key_format != KeyFormat::fp8_e4m3 &&
      key_format != KeyFormat::fp4_e2m1) {
    return fail(ErrorCode::invalid_argument, op, "options.key_format",
                "not a KeyFormat value, got " + str(static_cast<std::int64_t>(key_format)));
  }
  if (cache.empty()) return fail(ErrorCode::null_pointer, op, arg, "required tensor is missing (empty view)");
  if (cache.ndim != 2 && cache.ndim != 4) {
    return fail(ErrorCode::bad_shape, op, arg,
                "expected rank 2 [num_pages, bytes_per_page] or rank 4 [num_pages, P, 1, W], got " +
                    cache.describe());
  }
  DSA_RETURN_IF_ERROR(check_tensor(op, arg, cache, cache.ndim, {DType::uint8}));
  int page_tokens = page_size != 0 ? page_size : kDefaultPageTokens;
  KeyFormat format = key_format != KeyFormat::automatic ? key_format : KeyFormat::fp8_e4m3;
  if (cache.ndim == 4) {
    const std::int64_t fp8_width = KeyCacheLayout{head_dim, page_tokens, KeyFormat::fp8_e4m3}.token_bytes();
    const std::int64_t fp4_width = KeyCacheLayout{head_dim, page_tokens, KeyFormat::fp4_e2m1}.token_bytes();
    const std::int64_t width = cache.size(3);
    if (!supported_page_size(cache.size(1)) || cache.size(2) != 1 || (width != fp8_width && width != fp4_width)) {
      return fail(ErrorCode::bad_shape, op, arg,
                  "4-D cache must be [num_pages, P, 1, W] with P in {32, 64} and W = D + 4 = " + str(fp8_width) +
                      " (fp8 keys) or D / 2 + 4 = " + str(fp4_width) + " (fp4 keys) for head dim " + str(head_dim) +
                      " (from " + head_dim_source + "), got " + cache.describe());
    }
    if (page_size != 0 && cache.size(1) != page_size) {
      return fail(ErrorCode::bad_shape, op, arg,
                  "4-D cache has pages of " + str(cache.size(1)) + " tokens (dimension 1) but options.page_size is " +
                      str(page_size));
    }
    const KeyFormat view_format = width == fp8_width ? KeyFormat::fp8_e4m3 : KeyFormat::fp4_e2m1;
    if (key_format != KeyFormat::automatic && key_format != view_format) {
      return fail(ErrorCode::bad_shape, op, arg,
                  "4-D cache has " + str(width) + "-byte tokens (dimension 3), the " + key_format_name(view_format) +
                      " format for head dim " + str(head_dim) + ", but options.key_format is " +
                      key_format_name(key_format));
    }
    if (cache.stride(3) != 1 || cache.stride(1) != width) {
      return fail(ErrorCode::bad_stride, op, arg,
                  "4-D cache strides must be [page_stride, W, W, 1], got " + cache.describe());
    }
    page_tokens = static_cast<int>(cache.size(1));
    format = view_format;
  }
  if (format == KeyFormat::fp4_e2m1 && head_dim != kFp4HeadDim) {
    return fail(ErrorCode::bad_shape, op, arg,
                "the fp4_e2m1 key format serves head dim " + str(kFp4HeadDim) + " only, got head dim " +
                    str(head_dim) + " (from " + head_dim_source + ")");
  }
  const KeyCacheLayout layout{head_dim, page_tokens, format};
  const std::int64_t min_page_bytes = layout.min_page_bytes();
  const std::int64_t page_bytes = cache.ndim == 4 ? min_page_bytes : cache.size(1);
  if (cache.ndim == 2) {
    if (page_bytes < min_page_bytes) {
      return fail(ErrorCode::bad_shape, op, arg,
                  "pages of " + str(page_bytes) + " bytes are smaller than " +
                      (format == KeyFormat::fp4_e2m1 ? "P * (D / 2 + 4) = " : "P * (D + 4) = ") + str(page_tokens) + " * " +
                      str(layout.token_bytes()) + " = " + str(min_page_bytes) + " for head dim " + str(head_dim) +
                      " (from " + head_dim_source + "), " + key_format_name(format) + " keys and " +
                      str(page_tokens) + "-token pages");
    }
    DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, arg, cache));
  }
  const std::int64_t num_pages = cache.size(0);
  // As for q: the stride of a single page is free; the backends get the packed value.
  const std::int64_t page_stride = num_pages > 1 ? cache.stride(0) : min_page_bytes;
  if (num_pages > 1 && page_stride < page_bytes) {
    return fail(ErrorCode::bad_stride, op, arg,
                "page stride " + str(page_stride) + " is smaller than the " + str(page_bytes) +
                    " bytes of a page (pages would overlap)");
  }
  if (page_stride % kCacheAlignment != 0) {
    return fail(ErrorCode::bad_alignment, op, arg,
                "page stride " + str(page_stride) + " bytes is not a multiple of " + str(kCacheAlignment));
  }
  if (!aligned(cache.data, kCacheAlignment)) {
    return fail(ErrorCode::bad_alignment, op, arg,
                "base pointer is not " + str(kCacheAlignment) + "-byte aligned");
  }
  if (num_pages > kInt32Max / page_tokens) {
    return fail(ErrorCode::bad_shape, op, arg,
                str(num_pages) + " pages exceed the int32 slot range (at most " + str(kInt32Max / page_tokens) +
                    " pages of " + str(page_tokens) + " tokens)");
  }
  *out = CacheRef{static_cast<std::uint8_t*>(cache.data), page_stride, num_pages, head_dim, page_tokens, format};
  return Status::success();
}

// An fp8 tensor [..., H, D] (queries, or keys [S_kv, D]) that has passed
// check_tensor: for queries (rank >= 3) at least one head; a supported head
// dim; inner dimension contiguous; the other strides multiples of 16 bytes
// (those of extent 1 are never used); 16-byte aligned.
Status expect_fp8_rows(const char* op, const char* arg, const TensorView& view) {
  const int inner = view.ndim - 1;
  if (inner >= 2 && view.size(inner - 1) < 1) {
    return fail(ErrorCode::bad_shape, op, arg,
                "dimension " + str(inner - 1) + " (heads) must be >= 1, got " + view.describe());
  }
  DSA_RETURN_IF_ERROR(expect_head_dim(op, arg, view.size(inner)));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, arg, view));
  for (int d = 0; d < inner; ++d) {
    if (view.size(d) > 1 && view.stride(d) % kQueryRowAlignment != 0) {
      return fail(ErrorCode::bad_alignment, op, arg,
                  (inner == 1 ? std::string("row stride must be a multiple")
                              : "strides of dimensions 0.." + str(inner - 1) + " must be multiples") +
                      " of 16 bytes, got " + view.describe());
    }
  }
  if (!aligned(view.data, kQueryRowAlignment)) {
    return fail(ErrorCode::bad_alignment, op, arg, "data pointer is not 16-byte aligned");
  }
  return Status::success();
}

// The queries of the scoring operations, rank 4 [B, next_n, H, ...] (paged)
// or rank 3 [S, H, ...] (prefill): fp8 [..., H, D], or with q_block_scales
// fp4 packed codes uint8 [..., H, D / 2] (D == 128) and int32 [..., H]
// block-scale words. Sets *head_dim to D.
Status validate_query(const char* op, const TensorView& q, const TensorView& scales, int rank, int* head_dim) {
  const int inner = rank - 1;
  const std::string rows = rank == 4 ? "B, next_n, H" : "S, H";
  if (scales.empty()) {
    if (!q.empty() && q.dtype == DType::uint8) {
      return fail(ErrorCode::bad_dtype, op, "q",
                  "uint8 queries are packed fp4 codes and need options.q_block_scales; fp8 queries are float8_e4m3");
    }
    DSA_RETURN_IF_ERROR(check_tensor(op, "q", q, rank, {DType::float8_e4m3}));
    if (rank == 4) DSA_RETURN_IF_ERROR(expect_next_n(op, "q", q));
    DSA_RETURN_IF_ERROR(expect_fp8_rows(op, "q", q));
    *head_dim = static_cast<int>(q.size(inner));
    return Status::success();
  }
  DSA_RETURN_IF_ERROR(check_tensor(op, "q", q, rank, {DType::uint8}));
  if (rank == 4) DSA_RETURN_IF_ERROR(expect_next_n(op, "q", q));
  if (q.size(inner) != kFp4HeadDim / 2) {
    return fail(ErrorCode::bad_shape, op, "q",
                "fp4 queries (q_block_scales given) are packed codes [" + rows + ", D / 2] with D == " +
                    str(kFp4HeadDim) + ", so dimension " + str(inner) + " must be " + str(kFp4HeadDim / 2) +
                    ", got " + q.describe());
  }
  DSA_RETURN_IF_ERROR(expect_fp8_rows(op, "q", q));
  DSA_RETURN_IF_ERROR(check_tensor(op, "q_block_scales", scales, inner, {DType::int32}));
  for (int d = 0; d < inner; ++d) {
    DSA_RETURN_IF_ERROR(expect_extent(op, "q_block_scales", scales, d, q.size(d), "the matching extent of q"));
  }
  *head_dim = kFp4HeadDim;
  return Status::success();
}

// The stride of dimension `dim` as the backends step it: a dimension of
// extent 1 is never stepped over, so its stride is free (PyTorch's DLPack
// export sets it to 1); the backends get the packed value instead.
std::int64_t used_stride(const TensorView& view, int dim, std::int64_t packed) {
  return view.size(dim) > 1 ? view.stride(dim) : packed;
}

LengthsRef lengths_ref(const TensorView& lens) {
  return LengthsRef{lens.ptr<const std::int32_t>(), lens.stride(0), lens.ndim > 1 ? lens.stride(1) : 0};
}

// An optional request_offsets (int32 [B + 1], contiguous) into `rows`.
Status parse_request_offsets(const char* op, const TensorView& offsets, RequestRows* rows) {
  *rows = RequestRows{};
  if (offsets.empty()) return Status::success();
  DSA_RETURN_IF_ERROR(check_tensor(op, "request_offsets", offsets, 1, {DType::int32}));
  if (offsets.size(0) < 1 || offsets.size(0) > kInt32Max) {
    return fail(ErrorCode::bad_shape, op, "request_offsets",
                "must hold B + 1 entries, 1 <= B + 1 <= 2^31 - 1, got " + offsets.describe());
  }
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "request_offsets", offsets));
  *rows = RequestRows{offsets.ptr<const std::int32_t>(), offsets.size(0) - 1};
  return Status::success();
}

// context_lens of rows of uneven requests: int32 [T] or [T, 1].
Status expect_row_lengths(const char* op, const TensorView& lens, std::int64_t rows) {
  DSA_RETURN_IF_ERROR(check_tensor(op, "context_lens", lens, lens.ndim == 1 ? 1 : 2, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "context_lens", lens, 0, rows, "the rows T"));
  if (lens.ndim == 2) DSA_RETURN_IF_ERROR(expect_extent(op, "context_lens", lens, 1, 1, "1 with request_offsets"));
  return Status::success();
}

const char* length_input_name(LengthConvention convention) {
  return convention == LengthConvention::legacy ? "lens" : "prefix_lens";
}

// The schedule agreement rule is schedule_entry_agrees (common/schedule_walk.hpp).
Status check_schedule(const char* op, const LogitsProblem& p) {
  const std::int64_t units = schedule_units(p.batch, p.next_n, p.path);
  // The trailer first: it names the most likely mistake, a schedule planned for another call.
  for (int i = 0; i <= p.num_workers; ++i) {
    const int w = i == 0 ? p.num_workers : i - 1;
    if (schedule_entry_agrees(p.schedule, w, p.num_workers, units)) continue;
    const WorkItem entry = schedule_entry(p.schedule, w);
    const std::string got = "(" + str(entry.unit) + ", " + str(entry.chunk) + ")";
    if (w == p.num_workers) {
      return fail(ErrorCode::schedule_mismatch, op, "schedule",
                  "last row is " + got + " but the " + logits_path_name(p.path) + " path for this " +
                      (p.varlen.offsets != nullptr ? "number of rows" : "batch") + " needs (" +
                      str(units) + ", " + str(kChunkTokens) + "): planned for another batch, path or chunk size");
    }
    if (w == 0) return fail(ErrorCode::schedule_mismatch, op, "schedule", "row 0 must be (0, 0), got " + got);
    return fail(ErrorCode::schedule_mismatch, op, "schedule",
                "row " + str(w) + " = " + got + " is outside [0, " + str(units) + "] units or not monotone");
  }
  return Status::success();
}

}  // namespace

Status validate_store_keys(const TensorView& keys, const TensorView& slot_mapping,
                           const TensorView& cache, const StoreKeysOptions& options,
                           StoreKeysProblem* problem) {
  const char* op = "store_index_keys";
  DSA_RETURN_IF_ERROR(check_tensor(op, "keys", keys, 2, {DType::bfloat16, DType::float32}));
  DSA_RETURN_IF_ERROR(expect_head_dim(op, "keys", keys.size(1)));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "keys", keys));
  DSA_RETURN_IF_ERROR(check_tensor(op, "slot_mapping", slot_mapping, 1, {DType::int32, DType::int64}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "slot_mapping", slot_mapping, 0, keys.size(0), "the number of keys"));
  const int head_dim = static_cast<int>(keys.size(1));
  StoreKeysProblem p;
  DSA_RETURN_IF_ERROR(
      parse_cache(op, "cache", cache, options.page_size, options.key_format, head_dim, "keys", &p.cache));
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"keys", &keys}, {"slot_mapping", &slot_mapping}, {"cache", &cache}}));
  p.device = keys.device;
  p.num_tokens = keys.size(0);
  p.head_dim = head_dim;
  p.keys = keys.data;
  p.keys_dtype = keys.dtype;
  p.keys_stride = keys.stride(0);
  p.slots = slot_mapping.data;
  p.slots_dtype = slot_mapping.dtype;
  p.slots_stride = slot_mapping.stride(0);
  p.power_of_two_scales = options.power_of_two_scales;
  *problem = p;
  return Status::success();
}

Status validate_quantize_queries(const TensorView& q, const TensorView& head_gate,
                                 const TensorView& q_codes, const TensorView* q_block_scales,
                                 const TensorView& weights, const QuantizeQueriesOptions& options,
                                 QuantizeQueriesProblem* problem) {
  const bool fp4 = q_block_scales != nullptr;
  const char* op = fp4 ? "quantize_queries_fp4" : "quantize_queries";
  const char* codes_arg = fp4 ? "q_codes" : "q_fp8";
  DSA_RETURN_IF_ERROR(check_tensor(op, "q", q, 4, {DType::bfloat16, DType::float32}));
  DSA_RETURN_IF_ERROR(expect_next_n(op, "q", q));
  DSA_RETURN_IF_ERROR(expect_head_dim(op, "q", q.size(3)));
  if (fp4 && q.size(3) != kFp4HeadDim) {
    return fail(ErrorCode::bad_shape, op, "q",
                "fp4 queries serve head dim " + str(kFp4HeadDim) + " only, got " + q.describe());
  }
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "q", q));
  const std::int64_t batch = q.size(0), next_n = q.size(1), heads = q.size(2);
  const std::int64_t rows = batch * next_n;
  DSA_RETURN_IF_ERROR(check_tensor(op, "head_gate", head_gate, 2, {DType::bfloat16, DType::float32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "head_gate", head_gate, 0, rows, "B * next_n"));
  DSA_RETURN_IF_ERROR(expect_extent(op, "head_gate", head_gate, 1, heads, "the head count of q"));
  if (fp4) {
    DSA_RETURN_IF_ERROR(check_tensor(op, codes_arg, q_codes, 4, {DType::uint8}));
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, codes_arg, q_codes, 4, {DType::float8_e4m3}));
  }
  for (int d = 0; d < 3; ++d) {
    DSA_RETURN_IF_ERROR(expect_extent(op, codes_arg, q_codes, d, q.size(d), "the matching extent of q"));
  }
  DSA_RETURN_IF_ERROR(expect_extent(op, codes_arg, q_codes, 3, fp4 ? q.size(3) / 2 : q.size(3),
                                    fp4 ? "D / 2 (two codes a byte)" : "the head dim of q"));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, codes_arg, q_codes));
  DSA_RETURN_IF_ERROR(expect_no_overlap(op, codes_arg, q_codes));
  if (fp4) {
    DSA_RETURN_IF_ERROR(check_tensor(op, "q_block_scales", *q_block_scales, 3, {DType::int32}));
    for (int d = 0; d < 3; ++d) {
      DSA_RETURN_IF_ERROR(expect_extent(op, "q_block_scales", *q_block_scales, d, q.size(d),
                                        "the matching extent of q"));
    }
    DSA_RETURN_IF_ERROR(expect_no_overlap(op, "q_block_scales", *q_block_scales));
  }
  DSA_RETURN_IF_ERROR(check_tensor(op, "weights", weights, 2, {DType::float32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", weights, 0, rows, "B * next_n"));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", weights, 1, heads, "the head count of q"));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "weights", weights));
  DSA_RETURN_IF_ERROR(expect_rows_apart(op, "weights", weights, heads, "the head count of q"));
  if (!std::isfinite(options.weight_scale)) {
    return fail(ErrorCode::invalid_argument, op, "options.weight_scale", "must be finite");
  }
  const TensorView no_scales;
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"q", &q},
                                             {"head_gate", &head_gate},
                                             {codes_arg, &q_codes},
                                             {"q_block_scales", fp4 ? q_block_scales : &no_scales},
                                             {"weights", &weights}}));
  QuantizeQueriesProblem p;
  p.device = q.device;
  p.batch = batch;
  p.next_n = next_n;
  p.heads = heads;
  p.head_dim = static_cast<int>(q.size(3));
  p.q = q.data;
  p.q_dtype = q.dtype;
  p.q_stride_b = q.stride(0);
  p.q_stride_n = q.stride(1);
  p.q_stride_h = q.stride(2);
  p.gate = head_gate.data;
  p.gate_dtype = head_gate.dtype;
  p.gate_stride_row = head_gate.stride(0);
  p.gate_stride_h = head_gate.stride(1);
  p.q_codes = static_cast<std::uint8_t*>(q_codes.data);
  p.q_codes_stride_b = q_codes.stride(0);
  p.q_codes_stride_n = q_codes.stride(1);
  p.q_codes_stride_h = q_codes.stride(2);
  if (fp4) {
    p.q_block_scales = q_block_scales->ptr<std::int32_t>();
    p.q_scales_stride_b = q_block_scales->stride(0);
    p.q_scales_stride_n = q_block_scales->stride(1);
    p.q_scales_stride_h = q_block_scales->stride(2);
  }
  p.weights = weights.ptr<float>();
  p.weights_stride_row = weights.stride(0);
  p.power_of_two_scales = options.power_of_two_scales;
  // The model's default softmax-style scaling H^-0.5 * D^-0.5, resolved once here so
  // every backend folds in the same float.
  p.weight_scale = options.weight_scale != 0.0f
                       ? options.weight_scale
                       : 1.0f / std::sqrt(static_cast<float>(heads)) /
                             std::sqrt(static_cast<float>(p.head_dim));
  *problem = p;
  return Status::success();
}

Status validate_context_lens(const char* op, LengthConvention convention, const TensorView& input,
                             int next_n, const char* out_name, const TensorView& out,
                             const TensorView& request_offsets, LengthsProblem* problem) {
  if (next_n < 1) return fail(ErrorCode::invalid_argument, op, "next_n", "must be >= 1, got " + str(next_n));
  const char* input_name = length_input_name(convention);
  LengthsProblem p;
  DSA_RETURN_IF_ERROR(parse_request_offsets(op, request_offsets, &p.varlen));
  DSA_RETURN_IF_ERROR(check_tensor(op, input_name, input, 1, {DType::int32}));
  if (p.varlen.offsets != nullptr) {
    if (next_n != 1) {
      return fail(ErrorCode::invalid_argument, op, "next_n",
                  "must be 1 with request_offsets (every row is one token), got " + str(next_n));
    }
    DSA_RETURN_IF_ERROR(expect_extent(op, input_name, input, 0, p.varlen.requests, "the requests B of request_offsets"));
    DSA_RETURN_IF_ERROR(check_tensor(op, out_name, out, out.ndim == 2 ? 2 : 1, {DType::int32}));
    if (out.ndim == 2) DSA_RETURN_IF_ERROR(expect_extent(op, out_name, out, 1, 1, "1 with request_offsets"));
    if (out.size(0) > kInt32Max) return fail(ErrorCode::bad_shape, op, out_name, "more rows than the int32 range");
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, out_name, out, 2, {DType::int32}));
    DSA_RETURN_IF_ERROR(expect_extent(op, out_name, out, 0, input.size(0), std::string("the length of ") + input_name));
    DSA_RETURN_IF_ERROR(expect_extent(op, out_name, out, 1, next_n, "next_n"));
  }
  DSA_RETURN_IF_ERROR(expect_no_overlap(op, out_name, out));
  DSA_RETURN_IF_ERROR(expect_one_device(
      op, {{input_name, &input}, {out_name, &out}, {"request_offsets", &request_offsets}}));
  p.device = input.device;
  p.convention = convention;
  p.batch = input.size(0);
  p.next_n = next_n;
  p.input = input.ptr<const std::int32_t>();
  p.input_stride = input.stride(0);
  p.out = out.ptr<std::int32_t>();
  p.out_stride_b = out.stride(0);
  p.out_stride_n = out.ndim == 2 ? out.stride(1) : 0;
  p.rows = out.size(0);
  *problem = p;
  return Status::success();
}

Status validate_plan_schedule(const char* op, const TensorView& context_lens, int num_workers, LogitsPath path,
                              const TensorView& schedule, const TensorView& request_offsets,
                              ScheduleProblem* problem) {
  DSA_RETURN_IF_ERROR(expect_path(op, "path", path));
  RequestRows varlen;
  DSA_RETURN_IF_ERROR(parse_request_offsets(op, request_offsets, &varlen));
  if (varlen.offsets != nullptr) {
    if (context_lens.ndim != 1 && context_lens.ndim != 2) {
      return fail(ErrorCode::bad_shape, op, "context_lens",
                  "expected int32 [T] or [T, 1] with request_offsets, got " + context_lens.describe());
    }
    DSA_RETURN_IF_ERROR(expect_row_lengths(op, context_lens, context_lens.size(0)));
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, "context_lens", context_lens, 2, {DType::int32}));
    DSA_RETURN_IF_ERROR(expect_next_n(op, "context_lens", context_lens));
  }
  if (num_workers < 1) {
    return fail(ErrorCode::invalid_argument, op, "num_workers", "must be >= 1, got " + str(num_workers));
  }
  DSA_RETURN_IF_ERROR(check_tensor(op, "schedule", schedule, 2, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "schedule", schedule, 0, std::int64_t{num_workers} + 1, "num_workers + 1"));
  DSA_RETURN_IF_ERROR(expect_extent(op, "schedule", schedule, 1, 2, "(unit, chunk)"));
  if (!schedule.is_contiguous()) {
    return fail(ErrorCode::bad_stride, op, "schedule", "must be contiguous, got " + schedule.describe());
  }
  const std::int64_t next_n = context_lens.ndim > 1 ? context_lens.size(1) : 1;
  if (context_lens.size(0) * next_n > kInt32Max) {
    return fail(ErrorCode::bad_shape, op, "context_lens", "B * next_n exceeds the int32 range");
  }
  DSA_RETURN_IF_ERROR(expect_one_device(
      op, {{"context_lens", &context_lens}, {"schedule", &schedule}, {"request_offsets", &request_offsets}}));
  ScheduleProblem p;
  p.device = context_lens.device;
  p.batch = context_lens.size(0);
  p.next_n = static_cast<int>(next_n);
  p.lens = lengths_ref(context_lens);
  p.varlen = varlen;
  p.num_workers = num_workers;
  p.path = path;
  p.schedule = schedule.ptr<std::int32_t>();
  *problem = p;
  return Status::success();
}

Status validate_context_lens_and_schedule(LengthConvention convention, const TensorView& lens, int next_n,
                                          const TensorView& context_lens, int num_workers, LogitsPath path,
                                          const TensorView& schedule, const TensorView& request_offsets,
                                          LengthsProblem* lengths, ScheduleProblem* plan) {
  const char* op = "context_lens_and_schedule";
  if (convention != LengthConvention::causal && convention != LengthConvention::expanded &&
      convention != LengthConvention::legacy) {
    return fail(ErrorCode::invalid_argument, op, "convention",
                "not a LengthConvention value, got " + str(static_cast<std::int64_t>(convention)));
  }
  if (convention != LengthConvention::causal && !request_offsets.empty()) {
    return fail(ErrorCode::invalid_argument, op, "request_offsets",
                "only the causal convention has the form of requests of uneven row counts");
  }
  DSA_RETURN_IF_ERROR(
      validate_context_lens(op, convention, lens, next_n, "context_lens", context_lens, request_offsets, lengths));
  DSA_RETURN_IF_ERROR(validate_plan_schedule(op, context_lens, num_workers, path, schedule, request_offsets, plan));
  return expect_apart(op, "schedule", schedule, "context_lens", context_lens);
}

Status validate_scoring_inputs(const char* op, const ScoringInputs& in, LogitsProblem* problem) {
  const TensorView& q = in.q;
  RequestRows varlen;
  DSA_RETURN_IF_ERROR(parse_request_offsets(op, in.request_offsets, &varlen));
  const bool uneven = varlen.offsets != nullptr;
  // With request_offsets q is [T, 1, H, D] or [T, H, D]: T rows of one draft each.
  const int q_rank = uneven && q.ndim == 3 ? 3 : 4;
  int head_dim = 0;
  DSA_RETURN_IF_ERROR(validate_query(op, q, in.q_block_scales, q_rank, &head_dim));
  if (uneven && q_rank == 4) DSA_RETURN_IF_ERROR(expect_extent(op, "q", q, 1, 1, "1 with request_offsets"));
  const std::int64_t batch = q.size(0), next_n = q_rank == 4 ? q.size(1) : 1, heads = q.size(q_rank - 2);
  const std::int64_t rows = batch * next_n;
  if (rows > kInt32Max) return fail(ErrorCode::bad_shape, op, "q", "B * next_n exceeds the int32 range");
  const char* rows_meaning = uneven ? "the rows T of q" : "B * next_n";

  LogitsProblem p;
  DSA_RETURN_IF_ERROR(
      parse_cache(op, "key_cache", in.key_cache, in.page_size, in.key_format, head_dim, "q", &p.cache));

  DSA_RETURN_IF_ERROR(check_tensor(op, "weights", in.weights, 2, {DType::float32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", in.weights, 0, rows, rows_meaning));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", in.weights, 1, heads, "the head count of q"));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "weights", in.weights));

  if (uneven) {
    DSA_RETURN_IF_ERROR(expect_row_lengths(op, in.context_lens, rows));
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, "context_lens", in.context_lens, 2, {DType::int32}));
    DSA_RETURN_IF_ERROR(expect_extent(op, "context_lens", in.context_lens, 0, batch, "the batch of q"));
    DSA_RETURN_IF_ERROR(expect_extent(op, "context_lens", in.context_lens, 1, next_n, "next_n of q"));
  }

  DSA_RETURN_IF_ERROR(check_tensor(op, "block_table", in.block_table, 2, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "block_table", in.block_table, 0, uneven ? varlen.requests : batch,
                                    uneven ? "the requests B of request_offsets" : "the batch of q"));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "block_table", in.block_table));

  DSA_RETURN_IF_ERROR(check_tensor(op, "schedule", in.schedule, 2, {DType::int32}));
  if (in.schedule.size(0) < 2 || in.schedule.size(0) - 1 > kInt32Max) {
    return fail(ErrorCode::bad_shape, op, "schedule",
                "must have num_workers + 1 rows with num_workers >= 1, got " + in.schedule.describe());
  }
  DSA_RETURN_IF_ERROR(expect_extent(op, "schedule", in.schedule, 1, 2, "(unit, chunk)"));
  if (!in.schedule.is_contiguous()) {
    return fail(ErrorCode::bad_stride, op, "schedule", "must be contiguous, got " + in.schedule.describe());
  }

  if (in.max_context_len < 0 || in.max_context_len > kInt32Max) {
    return fail(ErrorCode::invalid_argument, op, "max_context_len",
                "must be in [0, 2^31 - 1], got " + str(in.max_context_len));
  }
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"q", &q},
                                             {"q_block_scales", &in.q_block_scales},
                                             {"key_cache", &in.key_cache},
                                             {"weights", &in.weights},
                                             {"context_lens", &in.context_lens},
                                             {"block_table", &in.block_table},
                                             {"schedule", &in.schedule},
                                             {"request_offsets", &in.request_offsets}}));
  p.device = q.device;
  p.batch = batch;
  p.next_n = next_n;
  p.heads = heads;
  p.head_dim = head_dim;
  p.q = static_cast<const std::uint8_t*>(q.data);
  p.q_stride_h = used_stride(q, q_rank - 2, q.size(q_rank - 1));
  p.q_stride_n = q_rank == 4 ? used_stride(q, 1, p.q_stride_h * heads) : p.q_stride_h * heads;
  p.q_stride_b = used_stride(q, 0, p.q_stride_n * next_n);
  if (!in.q_block_scales.empty()) {
    const TensorView& scales = in.q_block_scales;
    p.q_scales = static_cast<const std::uint32_t*>(scales.data);
    p.q_scales_stride_h = used_stride(scales, q_rank - 2, 1);
    p.q_scales_stride_n = q_rank == 4 ? used_stride(scales, 1, p.q_scales_stride_h * heads) : p.q_scales_stride_h * heads;
    p.q_scales_stride_b = used_stride(scales, 0, p.q_scales_stride_n * next_n);
  }
  p.weights = in.weights.ptr<const float>();
  p.weights_stride_row = in.weights.stride(0);
  p.lens = lengths_ref(in.context_lens);
  p.varlen = varlen;
  p.block_table = in.block_table.ptr<const std::int32_t>();
  p.block_table_stride = in.block_table.stride(0);
  p.max_blocks = in.block_table.size(1);
  p.schedule = in.schedule.ptr<const std::int32_t>();
  p.num_workers = static_cast<int>(in.schedule.size(0) - 1);
  p.max_context_len = in.max_context_len;
  *problem = p;
  return Status::success();
}

Status validate_logits_output(const TensorView& logits, const LogitsOptions& options,
                              LogitsProblem* problem) {
  const char* op = "paged_mqa_logits";
  DSA_RETURN_IF_ERROR(expect_path(op, "options.path", options.path));
  DSA_RETURN_IF_ERROR(check_tensor(op, "logits", logits, 2, {DType::float32, DType::bfloat16}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "logits", logits, 0, problem->rows(),
                                    problem->varlen.offsets != nullptr ? "the rows T of q" : "B * next_n"));
  if (logits.size(1) < problem->max_context_len) {
    return fail(ErrorCode::bad_shape, op, "logits",
                "has " + str(logits.size(1)) + " columns, fewer than max_context_len = " +
                    str(problem->max_context_len));
  }
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "logits", logits));
  DSA_RETURN_IF_ERROR(expect_rows_apart(op, "logits", logits, problem->max_context_len, "max_context_len"));
  DSA_RETURN_IF_ERROR(expect_device(op, "logits", logits, problem->device));
  problem->logits = logits.data;
  problem->logits_dtype = logits.dtype;
  problem->logits_stride = logits.stride(0);
  problem->clean_logits = options.clean_logits;
  return Status::success();
}

Status validate_index_topk_outputs(const TensorView& topk_lens, const TensorView& indices,
                                   const IndexTopkOptions& options, IndexTopkProblem* problem) {
  const char* op = "index_topk";
  const std::int64_t rows = problem->logits.rows();
  const char* rows_meaning = problem->logits.varlen.offsets != nullptr ? "the rows T of q" : "B * next_n";
  DSA_RETURN_IF_ERROR(expect_path(op, "options.path", options.path));
  if (options.strategy != IndexTopkStrategy::automatic && options.strategy != IndexTopkStrategy::fused &&
      options.strategy != IndexTopkStrategy::logits_then_topk) {
    return fail(ErrorCode::invalid_argument, op, "options.strategy",
                "not an IndexTopkStrategy value, got " + str(static_cast<std::int64_t>(options.strategy)));
  }
  DSA_RETURN_IF_ERROR(expect_k(op, options.k));
  if (!topk_lens.empty()) {
    DSA_RETURN_IF_ERROR(check_tensor(op, "topk_lens", topk_lens, 1, {DType::int32}));
    DSA_RETURN_IF_ERROR(expect_extent(op, "topk_lens", topk_lens, 0, rows, rows_meaning));
  }
  DSA_RETURN_IF_ERROR(expect_indices(op, indices, rows, options.k, rows_meaning));
  DSA_RETURN_IF_ERROR(expect_device(op, "topk_lens", topk_lens, problem->logits.device));
  DSA_RETURN_IF_ERROR(expect_device(op, "indices", indices, problem->logits.device));
  problem->topk_lens = topk_lens.empty() ? nullptr : topk_lens.ptr<const std::int32_t>();
  problem->topk_lens_stride = topk_lens.empty() ? 0 : topk_lens.stride(0);
  problem->k = options.k;
  problem->indices = indices.ptr<std::int32_t>();
  problem->indices_stride = indices.stride(0);
  problem->sorted = options.sorted;
  problem->physical_slots = options.physical_slots;
  return Status::success();
}

Status validate_mqa_logits(const TensorView& q, const TensorView& keys, const TensorView& key_scales,
                           const TensorView& weights, const TensorView& ks, const TensorView& ke,
                           const TensorView& logits, const MqaLogitsOptions& options,
                           MqaLogitsProblem* problem) {
  const char* op = "mqa_logits";
  int head_dim = 0;
  DSA_RETURN_IF_ERROR(validate_query(op, q, options.q_block_scales, 3, &head_dim));
  const std::int64_t rows = q.size(0), heads = q.size(1);
  if (rows > kInt32Max) return fail(ErrorCode::bad_shape, op, "q", "S (dimension 0) exceeds the int32 range");
  // fp4 keys are packed codes, told apart from fp8 keys by their dtype.
  const bool fp4_keys = !keys.empty() && keys.dtype == DType::uint8;
  if (fp4_keys) {
    DSA_RETURN_IF_ERROR(check_tensor(op, "keys", keys, 2, {DType::uint8}));
    if (head_dim != kFp4HeadDim || keys.size(1) != kFp4HeadDim / 2) {
      return fail(ErrorCode::bad_shape, op, "keys",
                  "fp4 keys (uint8) are packed codes [S_kv, D / 2] with D == " + str(kFp4HeadDim) +
                      ", so dimension 1 must be " + str(kFp4HeadDim / 2) + " and q's head dim " + str(kFp4HeadDim) +
                      ", got " + keys.describe() + " with head dim " + str(head_dim) + " (from q)");
    }
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, "keys", keys, 2, {DType::float8_e4m3}));
    DSA_RETURN_IF_ERROR(expect_extent(op, "keys", keys, 1, head_dim, "the head dim of q"));
  }
  DSA_RETURN_IF_ERROR(expect_fp8_rows(op, "keys", keys));
  const std::int64_t num_keys = keys.size(0);
  if (num_keys > kInt32Max) return fail(ErrorCode::bad_shape, op, "keys", "S_kv (dimension 0) exceeds the int32 range");
  if (fp4_keys) {
    DSA_RETURN_IF_ERROR(check_tensor(op, "key_scales", key_scales, 1, {DType::int32}));
  } else {
    DSA_RETURN_IF_ERROR(check_tensor(op, "key_scales", key_scales, 1, {DType::float32}));
  }
  DSA_RETURN_IF_ERROR(expect_extent(op, "key_scales", key_scales, 0, num_keys, "S_kv of keys"));
  DSA_RETURN_IF_ERROR(check_tensor(op, "weights", weights, 2, {DType::float32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", weights, 0, rows, "S of q"));
  DSA_RETURN_IF_ERROR(expect_extent(op, "weights", weights, 1, heads, "the head count of q"));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "weights", weights));
  DSA_RETURN_IF_ERROR(check_tensor(op, "ks", ks, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "ks", ks, 0, rows, "S of q"));
  DSA_RETURN_IF_ERROR(check_tensor(op, "ke", ke, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "ke", ke, 0, rows, "S of q"));
  if (options.compressed && (options.max_seqlen_k < 0 || options.max_seqlen_k > kInt32Max)) {
    return fail(ErrorCode::invalid_argument, op, "options.max_seqlen_k",
                "must be in [0, 2^31 - 1] with compressed output, got " + str(options.max_seqlen_k));
  }
  if (!options.compressed && options.max_seqlen_k != 0) {
    return fail(ErrorCode::invalid_argument, op, "options.max_seqlen_k",
                "is the compressed output's column count and must be 0 without options.compressed, got " +
                    str(options.max_seqlen_k));
  }
  const std::int64_t width = options.compressed ? options.max_seqlen_k : num_keys;
  const std::string width_name = options.compressed ? "max_seqlen_k" : "S_kv of keys";
  DSA_RETURN_IF_ERROR(check_tensor(op, "logits", logits, 2, {DType::float32, DType::bfloat16}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "logits", logits, 0, rows, "S of q"));
  if (logits.size(1) < width) {
    return fail(ErrorCode::bad_shape, op, "logits",
                "has " + str(logits.size(1)) + " columns, fewer than " + width_name + " = " + str(width));
  }
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "logits", logits));
  DSA_RETURN_IF_ERROR(expect_rows_apart(op, "logits", logits, width, width_name));
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"q", &q},
                                             {"q_block_scales", &options.q_block_scales},
                                             {"keys", &keys},
                                             {"key_scales", &key_scales},
                                             {"weights", &weights},
                                             {"ks", &ks},
                                             {"ke", &ke},
                                             {"logits", &logits}}));
  MqaLogitsProblem p{q.device, rows, heads, num_keys, head_dim};
  p.q = static_cast<const std::uint8_t*>(q.data);
  p.q_stride_h = used_stride(q, 1, q.size(2));
  p.q_stride_row = used_stride(q, 0, p.q_stride_h * heads);
  if (!options.q_block_scales.empty()) {
    p.q_scales = static_cast<const std::uint32_t*>(options.q_block_scales.data);
    p.q_scales_stride_h = used_stride(options.q_block_scales, 1, 1);
    p.q_scales_stride_row = used_stride(options.q_block_scales, 0, p.q_scales_stride_h * heads);
  }
  p.keys = static_cast<const std::uint8_t*>(keys.data);
  p.keys_stride = used_stride(keys, 0, keys.size(1));
  if (fp4_keys) {
    p.key_scale_words = static_cast<const std::uint32_t*>(key_scales.data);
  } else {
    p.key_scales = key_scales.ptr<const float>();
  }
  p.key_scales_stride = key_scales.stride(0);
  p.weights = weights.ptr<const float>();
  p.weights_stride_row = weights.stride(0);
  p.ks = ks.ptr<const std::int32_t>();
  p.ks_stride = ks.stride(0);
  p.ke = ke.ptr<const std::int32_t>();
  p.ke_stride = ke.stride(0);
  p.compressed = options.compressed;
  p.max_seqlen_k = options.max_seqlen_k;
  p.logits = logits.data;
  p.logits_dtype = logits.dtype;
  p.logits_stride = logits.stride(0);
  p.clean_logits = options.clean_logits;
  *problem = p;
  return Status::success();
}

Status validate_mqa_chunk_plan(const TensorView& ks, const TensorView& ke, std::int64_t num_keys,
                               DType logits_dtype, MqaLogitsProblem* problem) {
  const char* op = "plan_mqa_logits_chunks";
  DSA_RETURN_IF_ERROR(check_tensor(op, "ks", ks, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(check_tensor(op, "ke", ke, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "ke", ke, 0, ks.size(0), "the rows of ks"));
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"ks", &ks}, {"ke", &ke}}));
  if (ks.device.type != DeviceType::cpu) {
    return fail(ErrorCode::bad_device, op, "ks", "must be in host memory: the plan is made on the host");
  }
  if (num_keys < 0 || num_keys > kInt32Max) {
    return fail(ErrorCode::invalid_argument, op, "num_keys", "must be in [0, 2^31 - 1], got " + str(num_keys));
  }
  if (logits_dtype != DType::float32 && logits_dtype != DType::bfloat16) {
    return fail(ErrorCode::bad_dtype, op, "logits_dtype", "must be float32 or bfloat16");
  }
  MqaLogitsProblem p;
  p.device = ks.device;
  p.rows = ks.size(0);
  p.num_keys = num_keys;
  p.ks = ks.ptr<const std::int32_t>();
  p.ks_stride = ks.stride(0);
  p.ke = ke.ptr<const std::int32_t>();
  p.ke_stride = ke.stride(0);
  p.logits_dtype = logits_dtype;
  *problem = p;
  return Status::success();
}

namespace {

// An optional int32 [rows] contiguous tensor of top-k's options.
Status expect_row_vector(const char* op, const char* arg, const TensorView& view, std::int64_t rows) {
  if (view.empty()) return Status::success();
  DSA_RETURN_IF_ERROR(check_tensor(op, arg, view, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, arg, view, 0, rows, "the rows of logits"));
  return expect_inner_contiguous(op, arg, view);
}

// top-k's output transform (position_offsets, or block_table with its page
// size and the rows' requests) into `p`.
Status validate_topk_transform(const TopkOptions& options, std::int64_t rows, TopkProblem* p) {
  const char* op = "topk";
  const TensorView& table = options.block_table;
  const TensorView& offsets = options.request_offsets;
  if (options.page_size != 1 && options.page_size != 32 && options.page_size != 64) {
    return fail(ErrorCode::invalid_argument, op, "page_size",
                "must be 1, 32 or 64 (tokens per block_table entry), got " + str(options.page_size));
  }
  DSA_RETURN_IF_ERROR(expect_row_vector(op, "position_offsets", options.position_offsets, rows));
  if (!options.position_offsets.empty() && !table.empty()) {
    return fail(ErrorCode::invalid_argument, op, "position_offsets",
                "is given with block_table, but a row's positions take one transform only (give one of them)");
  }
  if (!offsets.empty() && table.empty()) {
    return fail(ErrorCode::invalid_argument, op, "request_offsets",
                "maps rows to block_table rows, but no block_table is given");
  }
  p->position_offsets =
      options.position_offsets.empty() ? nullptr : options.position_offsets.ptr<const std::int32_t>();
  p->page_size = options.page_size;
  if (table.empty()) return Status::success();
  DSA_RETURN_IF_ERROR(check_tensor(op, "block_table", table, 2, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "block_table", table));
  if (options.rows_per_request < 1) {
    return fail(ErrorCode::invalid_argument, op, "rows_per_request",
                "must be >= 1, got " + str(options.rows_per_request));
  }
  std::int64_t requests = 0;
  if (!offsets.empty()) {
    if (options.rows_per_request != 1) {
      return fail(ErrorCode::invalid_argument, op, "request_offsets",
                  "is given with rows_per_request = " + str(options.rows_per_request) +
                      ", but rows map to requests one way only (leave rows_per_request at 1)");
    }
    DSA_RETURN_IF_ERROR(check_tensor(op, "request_offsets", offsets, 1, {DType::int32}));
    if (offsets.size(0) < 1 || offsets.size(0) > kInt32Max) {
      return fail(ErrorCode::bad_shape, op, "request_offsets",
                  "must hold R + 1 entries, 1 <= R + 1 <= 2^31 - 1, got " + offsets.describe());
    }
    DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "request_offsets", offsets));
    requests = offsets.size(0) - 1;
    if (table.size(0) < requests) {
      return fail(ErrorCode::bad_shape, op, "block_table",
                  "has " + str(table.size(0)) + " rows but request_offsets has " + str(requests) +
                      " requests");
    }
    p->request_offsets = offsets.ptr<const std::int32_t>();
    p->requests = requests;
  } else {
    requests = (rows + options.rows_per_request - 1) / options.rows_per_request;
    if (table.size(0) < requests) {
      return fail(ErrorCode::bad_shape, op, "block_table",
                  "has " + str(table.size(0)) + " rows but " + str(rows) + " logits rows at " +
                      str(options.rows_per_request) + " rows per request need " + str(requests));
    }
  }
  p->block_table = table.ptr<const std::int32_t>();
  p->block_table_stride = table.stride(0);
  p->max_blocks = table.size(1);
  p->rows_per_request = options.rows_per_request;
  return Status::success();
}

}  // namespace

Status validate_topk(const TensorView& logits, const TensorView& lengths, int k,
                     const TensorView& indices, const TopkOptions& options, TopkProblem* problem) {
  const char* op = "topk";
  DSA_RETURN_IF_ERROR(check_tensor(op, "logits", logits, 2, {DType::float32, DType::bfloat16}));
  DSA_RETURN_IF_ERROR(expect_inner_contiguous(op, "logits", logits));
  const std::int64_t rows = logits.size(0), cols = logits.size(1);
  if (cols > kInt32Max) return fail(ErrorCode::bad_shape, op, "logits", "more columns than int32 positions can index");
  // The CUDA kernels give every row its own thread block (at most 2^31 - 1 of them).
  if (rows > kInt32Max) {
    return fail(ErrorCode::bad_shape, op, "logits", "more rows than the int32 range, got " + logits.describe());
  }
  DSA_RETURN_IF_ERROR(check_tensor(op, "lengths", lengths, 1, {DType::int32}));
  DSA_RETURN_IF_ERROR(expect_extent(op, "lengths", lengths, 0, rows, "the rows of logits"));
  DSA_RETURN_IF_ERROR(expect_k(op, k));
  DSA_RETURN_IF_ERROR(expect_indices(op, indices, rows, k, "the rows of logits"));
  TopkProblem p;
  DSA_RETURN_IF_ERROR(validate_topk_transform(options, rows, &p));
  DSA_RETURN_IF_ERROR(expect_row_vector(op, "row_starts", options.row_starts, rows));
  p.row_starts = options.row_starts.empty() ? nullptr : options.row_starts.ptr<const std::int32_t>();
  DSA_RETURN_IF_ERROR(expect_one_device(op, {{"logits", &logits},
                                             {"lengths", &lengths},
                                             {"indices", &indices},
                                             {"block_table", &options.block_table},
                                             {"request_offsets", &options.request_offsets},
                                             {"row_starts", &options.row_starts},
                                             {"position_offsets", &options.position_offsets}}));
  p.device = logits.device;
  p.rows = rows;
  p.cols = cols;
  p.logits = logits.data;
  p.logits_dtype = logits.dtype;
  p.logits_stride = logits.stride(0);
  p.lengths = lengths.ptr<const std::int32_t>();
  p.lengths_stride = lengths.stride(0);
  p.k = k;
  p.indices = indices.ptr<std::int32_t>();
  p.indices_stride = indices.stride(0);
  p.sorted = options.sorted;
  *problem = p;
  return Status::success();
}

Status check_store_keys_slots(const StoreKeysProblem& p) {
  const std::int64_t num_slots = cache_slots(p.cache);
  for (std::int64_t i = 0; i < p.num_tokens; ++i) {
    const std::int64_t slot = p.slots_dtype == DType::int32
                                  ? static_cast<const std::int32_t*>(p.slots)[i * p.slots_stride]
                                  : static_cast<const std::int64_t*>(p.slots)[i * p.slots_stride];
    if (slot >= num_slots) {
      return fail(ErrorCode::page_out_of_range, "store_index_keys", "slot_mapping",
                  "slot_mapping[" + str(i) + "] = " + str(slot) + " is beyond the cache's " +
                      str(num_slots) + " slots (" + str(p.cache.num_pages) + " pages of " +
                      str(p.cache.page_tokens) + ")");
    }
  }
  return Status::success();
}

Status check_length_inputs(const char* op, const LengthsProblem& p) {
  const char* name = length_input_name(p.convention);
  if (p.varlen.offsets != nullptr) DSA_RETURN_IF_ERROR(check_request_offsets(op, p.varlen, p.rows, "output rows"));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int64_t length = p.input[b * p.input_stride];
    // The most added to the input: next_n, or with request_offsets the request's rows.
    const std::int64_t added =
        p.varlen.offsets != nullptr ? p.varlen.offsets[b + 1] - p.varlen.offsets[b] : p.next_n;
    if (length < 0) {
      return fail(ErrorCode::invalid_argument, op, name,
                  std::string(name) + "[" + str(b) + "] = " + str(length) + " is negative");
    }
    if (p.convention != LengthConvention::legacy && length + added > kInt32Max) {
      return fail(ErrorCode::invalid_argument, op, name,
                  std::string(name) + "[" + str(b) + "] = " + str(length) + " plus " +
                      (p.varlen.offsets != nullptr ? "the request's rows" : "next_n") + " overflows int32");
    }
  }
  return Status::success();
}

Status check_scoring_data(const char* op, const LogitsProblem& p) {
  const bool uneven = p.varlen.offsets != nullptr;
  if (uneven) DSA_RETURN_IF_ERROR(check_request_offsets(op, p.varlen, p.rows(), "rows of q"));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t j = 0; j < p.next_n; ++j) {
      const std::int64_t length = row_length(p.lens, b, j);
      const std::string where = (uneven ? "context_lens[" + str(b) : "context_lens[" + str(b) + ", " + str(j)) +
                                "] = " + str(length);
      switch (scoring_length_violation(length, p.max_context_len, p.max_blocks, p.cache.page_tokens)) {
        case kNegativeLength:
          return fail(ErrorCode::length_out_of_range, op, "context_lens", where + " is negative");
        case kLengthBeyondMaxContext:
          return fail(ErrorCode::length_out_of_range, op, "context_lens",
                      where + " exceeds max_context_len = " + str(p.max_context_len));
        case kLengthBeyondBlockTable:
          return fail(ErrorCode::length_out_of_range, op, "block_table",
                      where + " needs " + str(pages_for_length(length, p.cache.page_tokens)) + " pages of " +
                          str(p.cache.page_tokens) + " tokens but block_table has " + str(p.max_blocks) +
                          " columns");
        default: break;
      }
    }
  }
  // The pages each request needs: those of its longest row.
  const std::int64_t requests = uneven ? p.varlen.requests : p.batch;
  for (std::int64_t request = 0; request < requests; ++request) {
    const std::int64_t first = uneven ? p.varlen.offsets[request] : request * p.next_n;
    const std::int64_t end = uneven ? p.varlen.offsets[request + 1] : first + p.next_n;
    std::int64_t longest = 0;
    for (std::int64_t row = first; row < end; ++row) {
      longest = std::max<std::int64_t>(longest, row_length(p.lens, row / p.next_n, row % p.next_n));
    }
    const std::int32_t* table_row = p.block_table + request * p.block_table_stride;
    for (std::int64_t i = 0; i < pages_for_length(longest, p.cache.page_tokens); ++i) {
      if (table_row[i] < 0 || table_row[i] >= p.cache.num_pages) {
        return fail(ErrorCode::page_out_of_range, op, "block_table",
                    "block_table[" + str(request) + ", " + str(i) + "] = " + str(table_row[i]) +
                        " is needed but is not a page index in [0, " + str(p.cache.num_pages) + ")");
      }
    }
  }
  return check_schedule(op, p);
}

Status check_request_offsets(const char* op, const RequestRows& r, std::int64_t rows, const char* rows_meaning) {
  const std::int32_t* offsets = r.offsets;
  const auto entry = [&](std::int64_t q) { return "request_offsets[" + str(q) + "] = " + str(offsets[q]); };
  for (std::int64_t q = 0; q <= r.requests; ++q) {
    switch (request_offsets_violation(r, q, rows)) {
      case OffsetsViolation::first_not_zero:
        return fail(ErrorCode::invalid_argument, op, "request_offsets", entry(0) + " must be 0");
      case OffsetsViolation::decreasing:
        return fail(ErrorCode::invalid_argument, op, "request_offsets",
                    entry(q) + " is below " + entry(q - 1) + " (entries must be non-decreasing)");
      case OffsetsViolation::last_not_rows:
        return fail(ErrorCode::invalid_argument, op, "request_offsets",
                    entry(q) + " must equal the " + str(rows) + " " + rows_meaning);
      case OffsetsViolation::none: break;
    }
  }
  return Status::success();
}

Status check_schedule_data(const char* op, const ScheduleProblem& p) {
  if (p.varlen.offsets == nullptr) return Status::success();
  return check_request_offsets(op, p.varlen, p.batch, "rows of context_lens");
}

Status check_topk_data(const TopkProblem& p) {
  const char* op = "topk";
  if (p.request_offsets != nullptr) {
    DSA_RETURN_IF_ERROR(check_request_offsets(op, RequestRows{p.request_offsets, p.requests}, p.rows, "rows of logits"));
  }
  for (std::int64_t r = 0; r < p.rows; ++r) {
    const std::int64_t length = p.lengths[r * p.lengths_stride];
    const std::int64_t start = topk_row_start(p, r);
    const std::string row_length = "lengths[" + str(r) + "] = " + str(length);
    switch (topk_row_violation(p, length, start).kind) {
      case kNegativeLength:
      case kLengthBeyondLogits:
        return fail(ErrorCode::length_out_of_range, op, "lengths",
                    row_length + " is outside [0, " + str(p.cols) + "] (the logits columns)");
      case kRowStartOutOfRange:
        return fail(ErrorCode::length_out_of_range, op, "row_starts",
                    "row_starts[" + str(r) + "] = " + str(start) + " with " + row_length +
                        " needs 0 <= start and start + length <= " + str(p.cols) + " (the logits columns)");
      case kLengthBeyondBlockTable:
        return fail(ErrorCode::length_out_of_range, op, "block_table",
                    row_length + " needs " + str(pages_for_length(length, p.page_size)) +
                        " entries of " + str(p.page_size) + " positions but block_table has " +
                        str(p.max_blocks) + " columns");
      default: break;
    }
    if (p.block_table == nullptr) continue;
    const std::int64_t request = topk_request(p, r);
    const std::int32_t* table_row = p.block_table + request * p.block_table_stride;
    for (std::int64_t i = 0; i < pages_for_length(length, p.page_size); ++i) {
      if (table_row[i] < 0 || table_row[i] > kInt32Max / p.page_size) {
        return fail(ErrorCode::page_out_of_range, op, "block_table",
                    "block_table[" + str(request) + ", " + str(i) + "] = " + str(table_row[i]) +
                        " is needed but gives no int32 slot at " + str(p.page_size) + " positions per entry");
      }
    }
  }
  return Status::success();
}

Status check_mqa_logits_data(const MqaLogitsProblem& p) {
  const char* op = "mqa_logits";
  for (std::int64_t i = 0; i < p.rows; ++i) {
    const KeyRange r = mqa_key_range(p, i);
    const std::string range = "ks[" + str(i) + "] = " + str(r.start) + ", ke[" + str(i) + "] = " + str(r.end);
    switch (key_range_violation(p, r).kind) {
      case kKeyRangeStartOutOfRange:
        return fail(ErrorCode::length_out_of_range, op, "ks", range + " breaks 0 <= ks[i] <= ke[i]");
      case kKeyRangeEndBeyondKeys:
        return fail(ErrorCode::length_out_of_range, op, "ke",
                    range + " breaks ke[i] <= S_kv = " + str(p.num_keys) + " (the keys)");
      case kKeyRangeBeyondColumns:
        return fail(ErrorCode::length_out_of_range, op, "ke",
                    range + " spans " + str(r.end - r.start) + " keys, more than max_seqlen_k = " +
                        str(p.max_seqlen_k) + " (the compressed logits columns)");
      default: break;
    }
  }
  return Status::success();
}

Status check_index_topk_data(const IndexTopkProblem& p) {
  const char* op = "index_topk";
  DSA_RETURN_IF_ERROR(check_scoring_data(op, p.logits));
  if (p.topk_lens == nullptr) return Status::success();
  for (std::int64_t b = 0; b < p.logits.batch; ++b) {
    for (std::int64_t j = 0; j < p.logits.next_n; ++j) {
      const std::int64_t r = b * p.logits.next_n + j;
      const std::int64_t topk_length = p.topk_lens[r * p.topk_lens_stride];
      const std::int64_t context_length = row_length(p.logits.lens, b, j);
      if (topk_lens_violation(topk_length, context_length) != kNoDeviceError) {
        return fail(ErrorCode::length_out_of_range, op, "topk_lens",
                    "topk_lens[" + str(r) + "] = " + str(topk_length) + " is outside [0, " +
                        str(context_length) + "] (context_lens[" + str(b) + ", " + str(j) + "])");
      }
    }
  }
  return Status::success();
}

}  // namespace dsa::detail
