"""Helpers for serving engines: building, checking and decoding the 2-D context
lengths of a speculative-verification step, and block tables whose rows repeat
per draft token.

The check and decode helpers read the lengths on the host (a device
synchronization for GPU arrays): use them in tests and debugging, not inside
CUDA-graph captures. The view helpers copy nothing.
"""

import numpy as np

from . import _frameworks as fw
from . import ops

CONVENTIONS = ("causal", "expanded", "legacy")


def _host(array):
    framework = fw.framework_of(array)
    if framework == fw.TORCH:
        return array.detach().cpu().numpy()
    if framework == fw.CUPY:
        return array.get()
    return np.asarray(array)


def context_lens_from_committed(committed_lens, next_n, convention="causal", **kwargs):
    """The int32 [B, next_n] context lengths of a step whose requests have `committed_lens`
    tokens before this step's next_n draft tokens (which are already in the cache).

    "causal" (canonical): L[b, j] = committed[b] + j + 1; "expanded": committed[b] + next_n
    for every j (pass causal_topk_lens() to the top-k). For "legacy" pass the total lengths
    committed + next_n. Runs on the arrays' device."""
    return ops.context_lens(committed_lens, next_n, convention, **kwargs)


def causal_topk_lens(committed_lens, next_n, **kwargs):
    """int32 [B * next_n] causal selection lengths committed[b] + j + 1 (row b * next_n + j),
    the topk_lens to use with expanded context lengths."""
    return ops.causal_context_lens(committed_lens, next_n, **kwargs).reshape(-1)


def expected_context_lens(committed_lens, next_n, convention="causal"):
    """The lengths the builders produce, computed on the host with NumPy (int64 [B, next_n])."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention: unknown value {convention!r}; accepted: {CONVENTIONS}")
    base = _host(committed_lens).astype(np.int64).reshape(-1, 1)
    draft = np.arange(int(next_n), dtype=np.int64).reshape(1, -1)
    if convention == "causal":
        return base + draft + 1
    if convention == "expanded":
        return np.broadcast_to(base + int(next_n), (base.shape[0], int(next_n))).copy()
    return np.maximum(base - int(next_n) + draft + 1, 0)


def verify_context_lens(context_lens, committed_lens, next_n, convention="causal"):
    """Raises ValueError naming the first entry of context_lens [B, next_n] that differs from
    what `convention` gives for these committed lengths; returns None when all match."""
    actual = _host(context_lens)
    expected = expected_context_lens(committed_lens, next_n, convention)
    if actual.shape != expected.shape:
        raise ValueError(f"context_lens: shape {tuple(actual.shape)} differs from "
                         f"{tuple(expected.shape)} (committed_lens [B], next_n = {next_n})")
    mismatch = np.argwhere(actual != expected)
    if mismatch.size:
        b, j = (int(i) for i in mismatch[0])
        raise ValueError(
            f"context_lens: [{b}, {j}] = {int(actual[b, j])} but the {convention} convention "
            f"gives {int(expected[b, j])} for next_n = {next_n} ({len(mismatch)} mismatching "
            f"entries)")


def decode_context_lens(context_lens):
    """(committed_lens int64 [B], next_n, convention) of 2-D context lengths built by the
    causal or expanded convention. Legacy lengths decode as causal (they are causal lengths
    with len_b = committed_b + next_n); for next_n == 1 the conventions coincide and
    "causal" is reported. Raises ValueError for lengths no convention produces."""
    lens = _host(context_lens).astype(np.int64)
    if lens.ndim != 2:
        raise ValueError(f"context_lens: expected rank 2 [B, next_n], got shape {lens.shape}")
    next_n = lens.shape[1]
    draft = np.arange(next_n, dtype=np.int64)
    committed = lens[:, 0] - 1
    if np.array_equal(lens, committed[:, None] + draft + 1) and (committed >= 0).all():
        return committed, next_n, "causal"
    committed = lens[:, 0] - next_n
    if (lens == lens[:, :1]).all() and (committed >= 0).all():
        return committed, next_n, "expanded"
    raise ValueError("context_lens: neither causal (L[b, j] = c_b + j + 1) nor expanded "
                     "(L[b, j] = c_b + next_n) with committed lengths c_b >= 0")


def per_request_block_table(block_table, next_n):
    """The [B, max_blocks] view (rows 0, next_n, 2 * next_n, ...) of a [B * next_n,
    max_blocks] table whose rows repeat per draft token; no copy is made. Use
    check_repeated_rows() to verify the repetition."""
    rows = int(block_table.shape[0])
    if next_n < 1 or rows % next_n:
        raise ValueError(f"block_table: {rows} rows are not a multiple of next_n = {next_n}")
    return block_table[::next_n]


def check_repeated_rows(block_table, next_n, context_lens=None, page_size=ops.PAGE_TOKENS):
    """Raises ValueError when the next_n rows of a request in a [B * next_n, max_blocks]
    table differ in an entry the lengths need (all entries when context_lens is None;
    with int32 [B, next_n] lengths, the first ceil(max_j L[b, j] / page_size) entries,
    page_size being the tokens per entry: the cache's page size, 64 or 32)."""
    table = _host(block_table)
    if next_n < 1 or table.shape[0] % next_n:
        raise ValueError(f"block_table: {table.shape[0]} rows are not a multiple of "
                         f"next_n = {next_n}")
    if page_size < 1:
        raise ValueError(f"page_size: must be >= 1 (tokens per block_table entry), "
                         f"got {page_size}")
    per_request = table.reshape(-1, next_n, table.shape[1])
    needed = np.full(per_request.shape[0], table.shape[1], dtype=np.int64)
    if context_lens is not None:
        longest = _host(context_lens).astype(np.int64).reshape(per_request.shape[0], -1).max(1)
        needed = np.minimum(-(-longest // int(page_size)), table.shape[1])
    for b, blocks in enumerate(needed):
        rows = per_request[b, :, :blocks]
        differs = np.argwhere(rows != rows[:1])
        if differs.size:
            j, i = (int(x) for x in differs[0])
            raise ValueError(
                f"block_table: row {b * next_n + j} entry {i} = {int(rows[j, i])} differs from "
                f"row {b * next_n} ({int(rows[0, i])}), the first row of request {b}")
