"""SGLang's token pool: `req_to_token` and per-layer `k_buffer` / `v_buffer`.

SGLang's convention (python/sglang/srt/mem_cache/memory_pool.py):
    ReqToTokenPool.req_to_token  int32 [max_reqs, max_context_len]: the KV slot of every
                                 token of every request (one slot per token)
    MHATokenToKVPool.k_buffer[layer], v_buffer[layer]
                                 [size + page_size, head_num, head_dim]; slot 0 (the first
                                 page) is the padding slot that padded tokens write to
With page_size p > 1 the allocator hands out whole pages, so tokens t .. t + p - 1 of a
request (t a multiple of p) sit in one page: slot = page * p + t % p. A request's block
table is then req_to_token[r, ::p] // p, and the buffers are the `nhd` layout viewed as
[size // p, p, H, D].
"""

from __future__ import annotations

from ..errors import UsageError
from .views import as_tensors

NULL_PAGE = 0  # the padding slot's page


def block_tables(req_to_token, req_pool_indices: list[int], seq_lens: list[int], page_size: int = 1) -> list[list[int]]:
    """One block table per request from its row of req_to_token; refuses a row whose
    slots are not page-aligned runs (the allocator never produces one)."""
    tables = []
    for r, (row_index, n) in enumerate(zip(req_pool_indices, seq_lens)):
        slots = [int(s) for s in req_to_token[row_index][:n]]
        table = []
        for t, slot in enumerate(slots):
            if t % page_size == 0:
                if slot % page_size:
                    raise UsageError("req_to_token", slot, f"request {r} token {t} starts a page at slot {slot}, not a multiple of page_size {page_size}")
                table.append(slot // page_size)
            elif slot != table[-1] * page_size + t % page_size:
                raise UsageError("req_to_token", slot, f"request {r} token {t}: expected slot {table[-1] * page_size + t % page_size} in page {table[-1]}")
        tables.append(table)
    return tables


def kv_views(k_buffer, v_buffer, page_size: int = 1):
    """K and V as ``[size // page_size, page_size, H, D]`` views of one layer's buffers."""
    size, heads, dim = k_buffer.shape
    if size % page_size:
        raise UsageError("page_size", page_size, f"the buffers hold {size} slots, not a whole number of pages")
    pages = (k_buffer.view(size // page_size, page_size, heads, dim), v_buffer.view(size // page_size, page_size, heads, dim))
    return as_tensors(pages, "nhd", page_size, heads, dim)


def write_bundle(path, req_to_token, req_pool_indices, seq_lens, k_buffer, v_buffer, *, num_heads: int, page_size: int = 1, out_cache_loc=None, query=None, output=None, **options):
    """A decode step of SGLang (one new token per request; `out_cache_loc` the slots it wrote)
    as a capture bundle; slot 0's page is the null page."""
    from .export import write_bundle as write

    size, heads, dim = k_buffer.shape
    lens = [int(n) for n in seq_lens]
    tables = block_tables(req_to_token, [int(i) for i in req_pool_indices], lens, page_size)
    pages = (k_buffer.view(size // page_size, page_size, heads, dim), v_buffer.view(size // page_size, page_size, heads, dim))
    slots = None if out_cache_loc is None else [int(s) for s in out_cache_loc]
    return write(path, engine="sglang", layout="nhd", cache=pages, block_size=page_size, num_heads=num_heads, tables=tables, seq_lens=lens,
                 slot_mapping=slots, query=query, output=output, null_block=NULL_PAGE, **options)
