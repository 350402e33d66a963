#include <vector>

#include "backend.hpp"
#include "common/cache_format.hpp"
#include "cpu/parallel.hpp"
#include "cpu/quantize.hpp"
#include "validate.hpp"

namespace dsa::detail::cpu {
namespace {

std::int64_t slot_of(const StoreKeysProblem& p, std::int64_t token) {
  const std::int64_t offset = token * p.slots_stride;
  return p.slots_dtype == DType::int32 ? static_cast<const std::int32_t*>(p.slots)[offset]
                                       : static_cast<const std::int64_t*>(p.slots)[offset];
}

void store_token(const StoreKeysProblem& p, std::int64_t token, std::int64_t slot) {
  const CacheRow at = slot_row(p.cache, slot);
  std::uint8_t* page = cache_page(p.cache, at.page);
  const void* key = element_address(p.keys, p.keys_dtype, token * p.keys_stride);
  if (p.cache.format == KeyFormat::fp4_e2m1) {
    page_scale_words(p.cache, page)[at.row] =
        quantize_fp4_vector(key, p.keys_dtype, p.head_dim, page_keys(p.cache, page, at.row));
    return;
  }
  page_scales(p.cache, page)[at.row] = quantize_vector(key, p.keys_dtype, p.head_dim, p.power_of_two_scales,
                                                       page_keys(p.cache, page, at.row));
}

}  // namespace

Status store_index_keys(const StoreKeysProblem& p, bool parallel, const ExecContext& ctx) {
  DSA_RETURN_IF_ERROR(check_store_keys_slots(p));
  if (!parallel) {
    for (std::int64_t token = 0; token < p.num_tokens; ++token) {
      const std::int64_t slot = slot_of(p, token);
      if (slot >= 0) store_token(p, token, slot);
    }
    return Status::success();
  }
  // Thread t owns the slots with slot % threads == t and visits tokens in
  // order, so of two tokens mapped to one slot the later one wins.
  const int threads = thread_count(ctx);
  run_on_threads(threads, [&](int thread) {
    for (std::int64_t token = 0; token < p.num_tokens; ++token) {
      const std::int64_t slot = slot_of(p, token);
      if (slot >= 0 && slot % threads == thread) store_token(p, token, slot);
    }
  });
  return Status::success();
}

}  // namespace dsa::detail::cpu
