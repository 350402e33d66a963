// The paged index-key cache and how keys are stored into it.
//
// Layout (byte-compatible with DeepGEMM's [num_pages, P, 1, D + 4] uint8 view
// and with sglang's and vLLM's index-key caches). A uint8 array of num_pages
// pages of P tokens each, P = 64 or 32 (the page size, see below); page stride
// >= P * (D + 4) bytes and a multiple of 16. Inside page p:
//   bytes [0, P * D)              the P tokens' fp8 e4m3 keys, token t at t * D
//   bytes [P * D, P * D + 4 * P)  the P fp32 scales, token t at P * D + 4 * t
// Token slot s lives in page s / P, row s % P. The key of a token is
// scale * e4m3_to_float(fp8[d]).
//
// The cache argument of every operation is a uint8 view, either
//   2-D [num_pages, bytes_per_page] with strides [page_stride, 1], or
//   4-D [num_pages, P, 1, D + 4] with strides [page_stride, D + 4, D + 4, 1]
//       (the DeepGEMM view; D + 4 is the byte width of its last dimension),
// where bytes_per_page >= P * (D + 4) and page_stride % 16 == 0 (the page
// stride of a one-page cache is never used and may be anything).
//
// Page size. The 4-D view states P (its dimension 1); the 2-D view does not.
// Every operation that takes a cache has `page_size` in its options
// (StoreKeysOptions, LogitsOptions, IndexTopkOptions), read the same way:
//   0        P is the 4-D view's dimension 1, or 64 (kDefaultPageTokens) for
//            a 2-D view
//   32 or 64 P; a 4-D view whose dimension 1 differs is bad_shape
// Any other page_size is invalid_argument; a 4-D view whose dimension 1 is
// neither 32 nor 64 is bad_shape.
#pragma once

#include <cstdint>

#include "dsa/context.hpp"
#include "dsa/status.hpp"
#include "dsa/tensor.hpp"

namespace dsa {

// P of a 2-D cache view whose options leave page_size at 0.
inline constexpr int kDefaultPageTokens = 64;
// The page sizes P the library serves.
constexpr bool supported_page_size(std::int64_t tokens) { return tokens == 32 || tokens == 64; }
inline constexpr float kFp8Max = 448.0f;     // largest finite e4m3 value
inline constexpr float kMinAmax = 1e-4f;     // amax is clamped below at this

// Byte offsets inside one page for head dimension D and page size P.
struct KeyCacheLayout {
  int head_dim = 128;
  int page_tokens = kDefaultPageTokens;  // P

  constexpr std::int64_t key_offset(int token) const { return std::int64_t{token} * head_dim; }
  constexpr std::int64_t scale_offset(int token) const {
    return std::int64_t{page_tokens} * head_dim + 4 * std::int64_t{token};
  }
  // Smallest legal page stride: P * (D + 4).
  constexpr std::int64_t min_page_bytes() const { return std::int64_t{page_tokens} * (head_dim + 4); }
};

struct StoreKeysOptions {
  // Round each scale up to a power of two ("ue8m0" scales).
  bool power_of_two_scales = false;
  // Tokens per cache page: 0 (from the view), 32 or 64; see "Page size" above.
  int page_size = 0;
};

// Quantizes N token keys and writes them into the cache.
//   keys          bfloat16 or float32 [N, D], inner dimension contiguous; D % 16 == 0, D <= 256
//   slot_mapping  int32 or int64 [N]; token i goes to slot slot_mapping[i]
//                 (a negative slot skips the token: padding); a slot must be
//                 < num_pages * P, else page_out_of_range
//   cache         the paged cache (see above), written in place
// Per token: amax = max(max_d |k[d]|, 1e-4), scale = amax / 448 (rounded up to
// a power of two with power_of_two_scales), fp8[d] = e4m3(k[d] / scale) with
// saturation to +-448 and round-to-nearest-even. Two tokens mapped to the same
// slot: the later one wins on the CPU; unspecified on CUDA.
Status store_index_keys(const TensorView& keys, const TensorView& slot_mapping,
                        const TensorView& cache, const StoreKeysOptions& options,
                        const ExecContext& ctx);
std::size_t store_index_keys_workspace_bytes(const ExecContext& ctx);

}  // namespace dsa
