// The one place where bytes of the paged index-key cache are interpreted
// (layout documented in include/dsa/cache.hpp).
#pragma once

#include <cstdint>

#include "dsa/cache.hpp"
#include "common/hostdevice.hpp"
#include "common/problem.hpp"

namespace dsa::detail {

DSA_HD std::uint8_t* cache_page(const CacheRef& cache, std::int64_t page) {
  return cache.base + page * cache.page_stride;
}
// fp8 key bytes of `row` (0..63) in a page.
DSA_HD std::uint8_t* page_keys(std::uint8_t* page, int head_dim, int row) {
  return page + std::int64_t{row} * head_dim;
}
// All 64 rows' keys start at the page start, `head_dim` bytes apart.
DSA_HD std::int64_t page_scales_offset(int head_dim) { return std::int64_t{kPageTokens} * head_dim; }
// fp32 scale of `row` in a page (64 consecutive floats after the keys).
DSA_HD float* page_scales(std::uint8_t* page, int head_dim) {
  return reinterpret_cast<float*>(page + page_scales_offset(head_dim));
}

}  // namespace dsa::detail
