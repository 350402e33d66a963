"""Independent NumPy references of the dsa-indexer semantics (include/dsa/*.hpp), written
from the documented math, plus random input generators and the comparison of results with
the references. Shared by the CPU and GPU suites."""

import numpy as np

PAGE = 64  # the default page size; the helpers take `page` for the others (32)
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


def page_bytes(head_dim, page=PAGE):
    return page * (head_dim + 4)


def split_cache(cache, head_dim, page=PAGE):
    """(keys float64 [pages, P, D], scales float32 [pages, P]) of a [pages, stride] cache of
    P-token pages."""
    pages = cache.shape[0]
    cache = cache.reshape(pages, -1)
    codes = np.ascontiguousarray(cache[:, : page * head_dim]).reshape(pages, page, head_dim)
    scales = np.ascontiguousarray(cache[:, page * head_dim: page * head_dim + 4 * page])
    return e4m3_decode(codes), scales.view(np.float32).reshape(pages, page)


def random_cache(rng, num_pages, head_dim, page_stride=None, page=PAGE):
    page_stride = page_stride or page_bytes(head_dim, page)
    cache = rng.integers(0, 256, size=(num_pages, page_stride), dtype=np.uint8)
    keys = rng.standard_normal((num_pages * page, head_dim)).astype(np.float32)
    codes, scales = quantize_rows(keys, False)
    cache[:, : page * head_dim] = codes.reshape(num_pages, -1)
    cache[:, page * head_dim: page * head_dim + 4 * page] = (
        scales.reshape(num_pages, page).view(np.uint8))
    return cache


def random_block_table(rng, lens_2d, num_pages, extra_columns=1, padding=-1, page=PAGE):
    """int32 [B, max_blocks] of distinct random pages; entries past each request's need hold
    `padding` (never to be read)."""
    needed = -(-lens_2d.max(axis=1) // page)
    max_blocks = int(needed.max(initial=0)) + extra_columns
    pages = rng.permutation(num_pages)
    table = np.full((len(lens_2d), max_blocks), padding, dtype=np.int32)
    used = 0
    for b, count in enumerate(needed):
        table[b, :count] = pages[used: used + count]
        used += count
    assert used <= num_pages
    return table


def scoring_problem(rng, batch=3, next_n=2, heads=4, head_dim=32, max_prefix=300, pages=None,
                    page_stride=None, page=PAGE, spare_pages=2, spare_columns=5):
    """NumPy inputs of a scoring call: causal lengths [B, next_n] from random committed
    prefixes, a random cache of P-token pages (`pages`, or those the lengths need plus
    spare_pages) as [pages, page_stride], a block table of distinct random pages, fp8 q
    codes, weights and max_len (spare_columns past the longest row)."""
    prefix = rng.integers(0, max_prefix, size=batch).astype(np.int32)
    lens = (prefix[:, None] + np.arange(next_n)[None, :] + 1).astype(np.int32)
    needed = int((-(-lens.max(axis=1) // page)).sum())
    cache = random_cache(rng, pages or needed + spare_pages, head_dim, page_stride, page)
    table = random_block_table(rng, lens, cache.shape[0], page=page)
    q = rng.standard_normal((batch, next_n, heads, head_dim)).astype(np.float32)
    weights = rng.standard_normal((batch * next_n, heads)).astype(np.float32)
    return dict(prefix=prefix, lens=lens, cache=cache, table=table, q=e4m3_encode(q),
                weights=weights, max_len=int(lens.max()) + spare_columns, page=page,
                head_dim=head_dim)


def problem_logits(p):
    """logits() of a scoring_problem."""
    return logits(p["q"], p["cache"], p["head_dim"], p["weights"], p["lens"], p["table"],
                  p["max_len"], p["page"])


def assert_logits_close(actual, expected, rtol=2e-4):
    """actual matches the float64 reference logits where those are finite."""
    valid = np.isfinite(expected)
    scale = max(1.0, float(np.abs(expected[valid]).max(initial=0)))
    np.testing.assert_allclose(actual[valid], expected[valid], rtol=rtol, atol=rtol * scale)


def logits(q_codes, cache, head_dim, weights, lens_2d, block_table, max_context_len, page=PAGE):
    """float64 [B * next_n, max_context_len]; positions past each row's length are -inf."""
    keys, scales = split_cache(cache, head_dim, page)
    scaled = keys.astype(np.float64) * scales.astype(np.float64)[..., None]
    return logits_of_values(e4m3_decode(q_codes), scaled, weights, lens_2d, block_table,
                            max_context_len, page)


def topk(values, lengths, k, row_starts=None):
    """int32 [T, k] sorted selection: largest first, NaN as -inf, ties by smaller position;
    rows with length <= k list 0 .. length - 1 then -1. With row_starts, row r's candidates
    are values[r, row_starts[r] + i] and it selects the positions i."""
    out = np.full((len(lengths), k), -1, dtype=np.int32)
    for r, length in enumerate(lengths):
        length = int(length)
        if length <= k:
            out[r, :length] = np.arange(length)
            continue
        start = 0 if row_starts is None else int(row_starts[r])
        row = np.asarray(values[r, start: start + length], dtype=np.float64)
        row = np.where(np.isnan(row), -np.inf, row)
        row = np.where(row == 0, 0.0, row)  # -0.0 equals +0.0
        order = np.lexsort((np.arange(length), -row))
        out[r] = order[:k]
    return out


def request_of_rows(rows, rows_per_request=1, request_offsets=None):
    """int64 [rows]: the request of each row (r // rows_per_request, or the q with
    request_offsets[q] <= r < request_offsets[q + 1])."""
    r = np.arange(rows)
    if request_offsets is None:
        return r // rows_per_request
    return np.searchsorted(np.asarray(request_offsets), r, side="right") - 1


def slots(positions, block_table, requests, page):
    """Cache slots block_table[q, i // page] * page + i % page of positions i [T, k] of rows
    of requests q [T]; -1 stays -1."""
    i = np.maximum(positions, 0).astype(np.int64)
    q = np.broadcast_to(np.asarray(requests)[:, None], positions.shape)
    slot = block_table[q, i // page].astype(np.int64) * page + i % page
    return np.where(positions >= 0, slot, -1).astype(np.int32)


def _split(units, num_workers):
    """Worker starts of the documented split (include/dsa/schedule.hpp) over units given
    as (name, item count, rows): a unit of n > 0 items weighs n + 2 where it has at most
    two rows, its first three weight positions naming its first item, else n; worker w
    starts at the (unit, chunk) that position w * total // num_workers names, position 0
    as (0, 0)."""
    named = [(name, chunk) for name, count, rows in units for chunk in range(count)
             for _ in range(3 if chunk == 0 and rows <= 2 else 1)]
    out = np.zeros((num_workers, 2), dtype=np.int32)
    for w in range(num_workers):
        first = w * len(named) // num_workers
        out[w] = named[first] if first > 0 else (0, 0)
    return out


def schedule(lens_2d, num_workers, path):
    """int32 [num_workers + 1, 2] as documented in include/dsa/schedule.hpp."""
    if path == "native":
        chunks = -(-lens_2d.max(axis=1, initial=0) // CHUNK)
    else:
        chunks = -(-lens_2d.reshape(-1) // CHUNK)
    out = np.zeros((num_workers + 1, 2), dtype=np.int32)
    rows = lens_2d.shape[1] if path == "native" else 1
    out[:num_workers] = _split([(unit, int(c), rows) for unit, c in enumerate(chunks)], num_workers)
    out[num_workers] = (len(chunks), CHUNK)
    return out


def mqa_logits(q_codes, key_codes, key_scales, weights, ks, ke, max_seqlen_k=0):
    """float64 prefill logits of q codes [S, H, D] against key codes [S_kv, D], row i over
    the keys [ks[i], ke[i]): [S, S_kv] with key j at column j, or with max_seqlen_k > 0
    [S, max_seqlen_k] with key ks[i] + c at column c. Columns a row does not score are
    -inf."""
    q = e4m3_decode(q_codes)
    keys = e4m3_decode(key_codes)
    scales = np.asarray(key_scales, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    rows, heads, _ = q.shape
    out = np.full((rows, max_seqlen_k if max_seqlen_k > 0 else keys.shape[0]), -np.inf)
    for i in range(rows):
        for j in range(int(ks[i]), int(ke[i])):
            total = 0.0
            for h in range(heads):
                total += w[i, h] * max(0.0, scales[j] * float(np.dot(q[i, h], keys[j])))
            out[i, j - int(ks[i]) if max_seqlen_k > 0 else j] = total
    return out


# ---------------------------------------------------------------------------
# The fp4 format (e2m1 codes two a byte, one ue8m0 scale per 32 values, four to a word)

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP4_TOKEN_BYTES = 68  # at D = 128: 64 code bytes, one scale word


def e2m1_decode(codes):
    codes = np.asarray(codes, dtype=np.uint8)
    magnitude = E2M1[codes & 0x7]
    return np.where(codes & 0x8, -magnitude, magnitude)


def fp4_quantize(x):
    """(codes uint8 [..., 64], scale words int32 [...]) of float32 x [..., 128]: per block
    of 32, e = the smallest byte with 6 * 2^(e - 127) >= max(amax, 1e-4) (NaN left out),
    codes the nearest e2m1 values of x / 2^(e - 127) (ties to the smaller magnitude, a
    value nearest zero code 0 whatever its sign)."""
    x = np.asarray(x, dtype=np.float32)
    blocks = x.reshape(x.shape[:-1] + (4, 32)).astype(np.float64)
    amax = np.maximum(np.nanmax(np.where(np.isnan(blocks), 0.0, np.abs(blocks)), axis=-1),
                      float(np.float32(1e-4)))
    e = 127 + np.ceil(np.log2(amax / 6.0)).astype(np.int64)
    e = np.where(6.0 * np.exp2(e - 1 - 127.0) >= amax, e - 1, e)  # log2 rounding, either way
    e = np.where(6.0 * np.exp2(e - 127.0) < amax, e + 1, e)
    v = np.where(np.isnan(blocks), 0.0, blocks / np.exp2(e - 127.0)[..., None])
    distance = np.abs(np.minimum(np.abs(v), 6.0)[..., None] - E2M1)
    code = np.argmin(distance, axis=-1)  # the first of equal distances: the smaller magnitude
    code = np.where((code != 0) & (v < 0), code | 0x8, code).astype(np.uint8)
    code = code.reshape(x.shape)
    packed = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    words = np.zeros(x.shape[:-1], dtype=np.uint32)
    for b in range(4):
        words |= e[..., b].astype(np.uint32) << np.uint32(8 * b)
    return packed, words.view(np.int32)


def fp4_decode(codes, words):
    """float64 [..., 128] of packed codes [..., 64] and scale words [...]."""
    codes = np.asarray(codes, dtype=np.uint8)
    values = np.stack([e2m1_decode(codes & 0xF), e2m1_decode(codes >> 4)], axis=-1)
    values = values.reshape(codes.shape[:-1] + (4, 32))
    e = (np.asarray(words).view(np.uint32)[..., None] >> (8 * np.arange(4, dtype=np.uint32))) & 0xFF
    return (values * np.exp2(e.astype(np.float64) - 127.0)[..., None]).reshape(codes.shape[:-1] + (128,))


def encode_queries(q, fp4):
    """(codes, block-scale words or None, float64 values) of float32 queries q [..., 128]:
    fp4 codes with their scale words, or e4m3 codes."""
    if fp4:
        codes, scales = fp4_quantize(q)
        return codes, scales, fp4_decode(codes, scales)
    codes = e4m3_encode(q)
    return codes, None, e4m3_decode(codes).astype(np.float64)


def fp4_cache(keys, page=PAGE):
    """uint8 [pages, P * 68] holding float32 keys [pages * P, 128], slot s at row s % P of
    page s // P."""
    codes, words = fp4_quantize(keys)
    pages = keys.shape[0] // page
    cache = np.empty((pages, page * FP4_TOKEN_BYTES), dtype=np.uint8)
    cache[:, : page * 64] = codes.reshape(pages, -1)
    cache[:, page * 64:] = words.reshape(pages, page).view(np.uint8).reshape(pages, -1)
    return cache


def fp4_cache_keys(cache, page=PAGE):
    """float64 keys [pages, P, 128] of an fp4 cache [pages, >= P * 68]."""
    pages = cache.shape[0]
    cache = cache.reshape(pages, -1)
    codes = np.ascontiguousarray(cache[:, : page * 64]).reshape(pages, page, 64)
    words = np.ascontiguousarray(cache[:, page * 64: page * 68]).view(np.int32).reshape(pages, page)
    return fp4_decode(codes, words)


def logits_of_values(q, keys, weights, lens_2d, block_table, max_context_len, page=PAGE):
    """float64 logits of dequantized queries q [B, next_n, H, D] against dequantized keys
    [pages, P, D] (scales included); -inf past each row's length."""
    batch, next_n = lens_2d.shape
    out = np.full((batch * next_n, max_context_len), -np.inf)
    for b in range(batch):
        for j in range(next_n):
            length = int(lens_2d[b, j])
            pos = np.arange(length)
            k = keys[block_table[b, pos // page], pos % page]
            r = b * next_n + j
            out[r, :length] = weights[r].astype(np.float64) @ np.maximum(0.0, q[b, j] @ k.T)
    return out


def varlen_problem(rng, rows_per_request, heads=4, head_dim=32, max_prefix=300, page=PAGE,
                   causal=True, spare_pages=2):
    """NumPy inputs of a scoring call with requests of uneven row counts: request b owns
    rows_per_request[b] consecutive rows (offsets int32 [B + 1], indices int32 [T] the
    request of each row); lengths int32 [T] causal (prefix_b + t + 1) or random with each
    request's last row longest; q codes [T, 1, H, D], weights [T, H], a block table
    [B, max_blocks] of distinct random pages."""
    offsets = np.concatenate([[0], np.cumsum(rows_per_request)]).astype(np.int32)
    indices = np.repeat(np.arange(len(rows_per_request)), rows_per_request).astype(np.int32)
    prefix = rng.integers(0, max_prefix, size=len(rows_per_request)).astype(np.int32)
    lens = []
    for b, n in enumerate(rows_per_request):
        row = (prefix[b] + np.arange(n) + 1 if causal
               else rng.integers(0, max_prefix, size=n))
        if not causal and n:
            row[[int(np.argmax(row)), n - 1]] = row[[n - 1, int(np.argmax(row))]]
        lens.extend(int(x) for x in row)
    lens = np.asarray(lens, dtype=np.int32)
    longest = np.array([lens[offsets[b]:offsets[b + 1]].max(initial=0)
                        for b in range(len(rows_per_request))], dtype=np.int32)
    needed = int((-(-longest // page)).sum())
    cache = random_cache(rng, needed + spare_pages, head_dim, page=page)
    table = random_block_table(rng, longest[:, None], cache.shape[0], page=page)
    rows = len(lens)
    q = rng.standard_normal((rows, 1, heads, head_dim)).astype(np.float32)
    weights = rng.standard_normal((rows, heads)).astype(np.float32)
    return dict(prefix=prefix, lens=lens, offsets=offsets, indices=indices, cache=cache,
                table=table, q=e4m3_encode(q), weights=weights,
                max_len=int(lens.max(initial=0)) + 3, page=page, head_dim=head_dim)


def varlen_logits(p):
    """float64 [T, max_len] of a varlen_problem: row r of request indices[r] over its
    request's block-table row; -inf past each row's length."""
    keys, scales = split_cache(p["cache"], p["head_dim"], p["page"])
    q = e4m3_decode(p["q"])
    out = np.full((len(p["lens"]), p["max_len"]), -np.inf)
    for r, length in enumerate(p["lens"]):
        pos = np.arange(int(length))
        pages = p["table"][p["indices"][r], pos // p["page"]]
        k = keys[pages, pos % p["page"]]
        s = scales[pages, pos % p["page"]].astype(np.float64)
        out[r, :length] = p["weights"][r].astype(np.float64) @ np.maximum(0.0, (q[r, 0] @ k.T) * s)
    return out


def varlen_schedule(lens, offsets, num_workers, path):
    """int32 [num_workers + 1, 2] for rows of uneven requests (include/dsa/schedule.hpp):
    units are row tiles of 8 rows of one request (single rows on the per-token path) named
    by their first row; the trailer is (T, 256)."""
    tile = 8 if path == "native" else 1
    units = []
    for b in range(len(offsets) - 1):
        for first in range(offsets[b], offsets[b + 1], tile):
            end = min(first + tile, offsets[b + 1])
            units.append((first, -(-int(lens[first:end].max()) // CHUNK), end - first))
    out = np.zeros((num_workers + 1, 2), dtype=np.int32)
    out[:num_workers] = _split(units, num_workers)
    out[num_workers] = (len(lens), CHUNK)
    return out
