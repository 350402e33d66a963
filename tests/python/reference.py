"""Independent NumPy references of the dsa-indexer semantics (include/dsa/*.hpp), written
from the documented math, plus random input generators. Shared by the CPU and GPU suites."""

import numpy as np

PAGE = 64
CHUNK = 256


def _e4m3_table():
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = codes & 0x7
    normal = (1.0 + mantissa / 8.0) * np.exp2(exponent - 7.0)
    subnormal = mantissa * 2.0**-9
    values = sign * np.where(exponent == 0, subnormal, normal)
    values[(exponent == 0xF) & (mantissa == 0x7)] = np.nan
    return values


E4M3 = _e4m3_table()
_POSITIVE = E4M3[:0x7F]  # codes 0x00 .. 0x7E: increasing, finite


def e4m3_decode(codes):
    return E4M3[np.asarray(codes, dtype=np.uint8)]


def e4m3_encode(x):
    """Round-to-nearest-even e4m3fn codes of float32 values, saturating at 448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(_POSITIVE, a), 0, len(_POSITIVE) - 1)
    lo = np.clip(hi - 1, 0, None)
    d_lo = a - _POSITIVE[lo]
    d_hi = _POSITIVE[hi] - a
    code = np.where(d_hi < d_lo, hi, lo)
    tie = d_hi == d_lo
    code = np.where(tie, np.where(lo % 2 == 0, lo, hi), code)
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def quantization_scale(amax, power_of_two):
    scale = np.maximum(np.asarray(amax, dtype=np.float32), np.float32(1e-4)) / np.float32(448.0)
    if power_of_two:
        fraction, exponent = np.frexp(scale)
        scale = np.where(fraction == 0.5, scale, np.ldexp(np.float32(1.0), exponent))
    return scale.astype(np.float32)


def quantize_rows(x, power_of_two):
    """(codes, scales) quantizing the last dimension of float32 x."""
    x = np.asarray(x, dtype=np.float32)
    scale = quantization_scale(np.abs(x).max(axis=-1), power_of_two)
    return e4m3_encode(x / scale[..., None]), scale


def page_bytes(head_dim):
    return PAGE * (head_dim + 4)


def split_cache(cache, head_dim):
    """(keys float64 [pages, 64, D], scales float32 [pages, 64]) of a [pages, stride] cache."""
    pages = cache.shape[0]
    codes = np.ascontiguousarray(cache[:, : PAGE * head_dim]).reshape(pages, PAGE, head_dim)
    scales = np.ascontiguousarray(cache[:, PAGE * head_dim: PAGE * head_dim + 4 * PAGE])
    return e4m3_decode(codes), scales.view(np.float32).reshape(pages, PAGE)


def random_cache(rng, num_pages, head_dim, page_stride=None):
    page_stride = page_stride or page_bytes(head_dim)
    cache = rng.integers(0, 256, size=(num_pages, page_stride), dtype=np.uint8)
    keys = rng.standard_normal((num_pages * PAGE, head_dim)).astype(np.float32)
    codes, scales = quantize_rows(keys, False)
    cache[:, : PAGE * head_dim] = codes.reshape(num_pages, -1)
    cache[:, PAGE * head_dim: PAGE * head_dim + 4 * PAGE] = (
        scales.reshape(num_pages, PAGE).view(np.uint8))
    return cache


def random_block_table(rng, lens_2d, num_pages, extra_columns=1, padding=-1):
    """int32 [B, max_blocks] of distinct random pages; entries past each request's need hold
    `padding` (never to be read)."""
    needed = -(-lens_2d.max(axis=1) // PAGE)
    max_blocks = int(needed.max(initial=0)) + extra_columns
    pages = rng.permutation(num_pages)
    table = np.full((len(lens_2d), max_blocks), padding, dtype=np.int32)
    used = 0
    for b, count in enumerate(needed):
        table[b, :count] = pages[used: used + count]
        used += count
    assert used <= num_pages
    return table


def logits(q_codes, cache, head_dim, weights, lens_2d, block_table, max_context_len):
    """float64 [B * next_n, max_context_len]; positions past each row's length are -inf."""
    keys, scales = split_cache(cache, head_dim)
    q = e4m3_decode(q_codes)
    batch, next_n = lens_2d.shape
    out = np.full((batch * next_n, max_context_len), -np.inf)
    for b in range(batch):
        for j in range(next_n):
            length = int(lens_2d[b, j])
            pos = np.arange(length)
            pages = block_table[b, pos // PAGE]
            k = keys[pages, pos % PAGE]  # [L, D]
            s = scales[pages, pos % PAGE].astype(np.float64)
            dots = q[b, j] @ k.T  # [H, L]
            r = b * next_n + j
            out[r, :length] = weights[r].astype(np.float64) @ np.maximum(0.0, dots * s)
    return out


def topk(values, lengths, k):
    """int32 [T, k] sorted selection: largest first, NaN as -inf, ties by smaller position;
    rows with length <= k list 0 .. length - 1 then -1."""
    out = np.full((len(lengths), k), -1, dtype=np.int32)
    for r, length in enumerate(lengths):
        length = int(length)
        if length <= k:
            out[r, :length] = np.arange(length)
            continue
        row = np.where(np.isnan(values[r, :length]), -np.inf, values[r, :length])
        row = np.where(row == 0, 0.0, row)  # -0.0 equals +0.0
        order = np.lexsort((np.arange(length), -row))
        out[r] = order[:k]
    return out


def schedule(lens_2d, num_workers, path):
    """int32 [num_workers + 1, 2] as documented in include/dsa/schedule.hpp."""
    if path == "native":
        chunks = -(-lens_2d.max(axis=1, initial=0) // CHUNK)
    else:
        chunks = -(-lens_2d.reshape(-1) // CHUNK)
    items = [(unit, chunk) for unit, count in enumerate(chunks) for chunk in range(count)]
    total = len(items)
    out = np.zeros((num_workers + 1, 2), dtype=np.int32)
    for w in range(num_workers):
        first = w * total // num_workers
        out[w] = items[first] if first < total else (len(chunks), 0)
    out[num_workers] = (len(chunks), CHUNK)
    return out
