// The paged index-key cache and how keys are stored into it.
//
// Key formats (KeyFormat below). A token's key is D values stored as
//   fp8_e4m3  D bytes of e4m3 codes and one fp32 scale: the key of a token
//             is scale * e4m3_to_float(fp8[d]) (DeepSeek-V3.2's format);
//   fp4_e2m1  D / 2 bytes of e2m1 codes, two per byte (element 2i in the low
//             nibble of byte i, 2i + 1 in the high nibble), and one 32-bit
//             word of D / 32 ue8m0 block scales (block b, elements
//             [32 b, 32 b + 32), in byte b, block 0 the lowest byte): element
//             d is e2m1(code[d]) * 2^(e_b - 127) with no other scale
//             (DeepGEMM's FP4 indexer format, DeepSeek-V4.1). D == 128 only.
// e2m1 magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6 (bit 3 of a nibble is the sign).
//
// Layout (byte-compatible with DeepGEMM's [num_pages, P, 1, W] uint8 view,
// W = D + 4 for fp8 and D / 2 + 4 for fp4, and with sglang's and vLLM's
// index-key caches). A uint8 array of num_pages pages of P tokens each,
// P = 64 or 32 (the page size, see below); page stride >= P * W bytes and a
// multiple of 16. With C = D (fp8) or D / 2 (fp4) code bytes per token,
// inside page p:
//   bytes [0, P * C)              the P tokens' codes, token t at t * C
//   bytes [P * C, P * C + 4 * P)  the P tokens' fp32 scales (fp8) or scale
//                                 words (fp4), token t at P * C + 4 * t
// Token slot s lives in page s / P, row s % P.
//
// The cache argument of every operation is a uint8 view, either
//   2-D [num_pages, bytes_per_page] with strides [page_stride, 1], or
//   4-D [num_pages, P, 1, W] with strides [page_stride, W, W, 1]
//       (the DeepGEMM view; W is the byte width of a token),
// where bytes_per_page >= P * W and page_stride % 16 == 0 (the page
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
//
// Key format. The 4-D view states it (W = D + 4: fp8, W = D / 2 + 4: fp4,
// with D from the keys or queries); the 2-D view does not. The same options
// have `key_format`, read the same way:
//   automatic  the 4-D view's format, or fp8_e4m3 for a 2-D view
//   fp8_e4m3 or fp4_e2m1  that format; a 4-D view whose W differs is bad_shape
// fp4_e2m1 with D != 128 is bad_shape.
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

// How a token's key is stored (see "Key formats" above).
enum class KeyFormat {
  automatic,  // options only: the 4-D view's format, fp8_e4m3 for a 2-D view
  fp8_e4m3,
  fp4_e2m1,
};
const char* key_format_name(KeyFormat format) noexcept;
// The one head dimension the fp4 format serves (four 32-element blocks, one scale word).
inline constexpr int kFp4HeadDim = 128;

// Byte offsets inside one page for head dimension D, page size P and key format.
struct KeyCacheLayout {
  int head_dim = 128;
  int page_tokens = kDefaultPageTokens;  // P
  KeyFormat format = KeyFormat::fp8_e4m3;

  // Code bytes of one token: D (fp8) or D / 2 (fp4).
  constexpr std::int64_t code_bytes() const { return format == KeyFormat::fp4_e2m1 ? head_dim / 2 : head_dim; }
  // Bytes of one token, codes and scale: DeepGEMM's last dimension W.
  constexpr std::int64_t token_bytes() const { return code_bytes() + 4; }
  constexpr std::int64_t key_offset(int token) const { return std::int64_t{token} * code_bytes(); }
  constexpr std::int64_t scale_offset(int token) const {
    return std::int64_t{page_tokens} * code_bytes() + 4 * std::int64_t{token};
  }
  // Smallest legal page stride: P * W.
  constexpr std::int64_t min_page_bytes() const { return std::int64_t{page_tokens} * token_bytes(); }
};

struct StoreKeysOptions {
  // Round each scale up to a power of two ("ue8m0" scales).
  bool power_of_two_scales = false;
  // Tokens per cache page: 0 (from the view), 32 or 64; see "Page size" above.
  int page_size = 0;
  // See "Key format" above.
  KeyFormat key_format = KeyFormat::automatic;
};

// Quantizes N token keys and writes them into the cache.
//   keys          bfloat16 or float32 [N, D], inner dimension contiguous; D % 16 == 0, D <= 256
//                 (D == 128 for fp4_e2m1)
//   slot_mapping  int32 or int64 [N]; token i goes to slot slot_mapping[i]
//                 (a negative slot skips the token: padding); a slot must be
//                 < num_pages * P, else page_out_of_range
//   cache         the paged cache (see above), written in place
// fp8_e4m3, per token: amax = max(max_d |k[d]|, 1e-4), scale = amax / 448
// (rounded up to a power of two with power_of_two_scales), fp8[d] =
// e4m3(k[d] / scale) with saturation to +-448 and round-to-nearest-even.
// fp4_e2m1, per block of 32 elements: amax = max(|k[d]|, 1e-4) over the block
// (NaN left out), scale = amax / 6 rounded up to a power of two (its ue8m0
// byte is the float's exponent field), code[d] = the e2m1 value nearest
// k[d] / scale, saturated at +-6, a tie taking the smaller magnitude and a
// value rounding to zero taking code 0 (never negative zero);
// power_of_two_scales has no effect (fp4 scales are powers of two).
// Two tokens mapped to the same slot: the later one wins on the CPU;
// unspecified on CUDA.
Status store_index_keys(const TensorView& keys, const TensorView& slot_mapping,
                        const TensorView& cache, const StoreKeysOptions& options,
                        const ExecContext& ctx);
std::size_t store_index_keys_workspace_bytes(const ExecContext& ctx);

}  // namespace dsa
