// The one place where bytes of the paged index-key cache are interpreted
// (layout documented in include/dsa/cache.hpp), for either page size and
// either key format.
#pragma once

#include <cstdint>

#include "common/hostdevice.hpp"
#include "common/number_formats.hpp"
#include "common/problem.hpp"
#include "dsa/cache.hpp"

namespace dsa::detail {

// The byte offsets of the cache's pages.
DSA_HD KeyCacheLayout page_layout(const CacheRef& cache) {
  return {cache.head_dim, cache.page_tokens, cache.format};
}

DSA_HD std::uint8_t* cache_page(const CacheRef& cache, std::int64_t page) {
  return cache.base + page * cache.page_stride;
}
// Key code bytes of `row` (0..P-1) in a page: every row's codes start at the
// page start, D (fp8) or D / 2 (fp4) bytes apart.
DSA_HD std::uint8_t* page_keys(const CacheRef& cache, std::uint8_t* page, int row) {
  return page + page_layout(cache).key_offset(row);
}
// fp8 caches: the fp32 scales of a page's P rows (P consecutive floats after the keys).
DSA_HD float* page_scales(const CacheRef& cache, std::uint8_t* page) {
  return reinterpret_cast<float*>(page + page_layout(cache).scale_offset(0));
}
// fp4 caches: the packed ue8m0 block-scale words of a page's P rows (P
// consecutive 32-bit words after the codes).
DSA_HD std::uint32_t* page_scale_words(const CacheRef& cache, std::uint8_t* page) {
  return reinterpret_cast<std::uint32_t*>(page + page_layout(cache).scale_offset(0));
}

// Slots of the whole cache: num_pages * P.
DSA_HD std::int64_t cache_slots(const CacheRef& cache) { return cache.num_pages * cache.page_tokens; }

// Where a token lives: a page of the cache and a row of it.
struct CacheRow {
  std::int64_t page;
  int row;
};
// Token slot s: page s / P, row s % P.
DSA_HD CacheRow slot_row(const CacheRef& cache, std::int64_t slot) {
  return {slot / cache.page_tokens, static_cast<int>(slot % cache.page_tokens)};
}
// Key position p of a request whose block-table row is `table_row`: page
// table_row[p / P], row p % P.
DSA_HD CacheRow position_row(const std::int32_t* table_row, std::int64_t position, int page_tokens) {
  return {table_row[position / page_tokens], static_cast<int>(position % page_tokens)};
}
// The slot of that position (what physical_slots writes): table_row[p / P] * P + p % P.
DSA_HD std::int32_t position_slot(const std::int32_t* table_row, std::int64_t position, int page_tokens) {
  const CacheRow at = position_row(table_row, position, page_tokens);
  return static_cast<std::int32_t>(at.page * page_tokens + at.row);
}

}  // namespace dsa::detail
