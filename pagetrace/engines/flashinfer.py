"""FlashInfer's paged KV cache: a CSR page table and a 5-D cache or a (k, v) tuple.

FlashInfer's convention (flashinfer/decode.py, BatchDecodeWithPagedKVCacheWrapper.plan and
its docstring example; flashinfer/page.py `get_seq_lens`):
    kv_indptr         int32 [batch + 1]: request i's pages are kv_indices[kv_indptr[i]:kv_indptr[i+1]]
    kv_indices        int32 [kv_indptr[-1]]: physical page ids, in logical order
    kv_last_page_len  int32 [batch]: tokens in each request's last page, 1..page_size
    seq_len           = (num_pages - 1) * page_size + kv_last_page_len
    paged_kv_cache    [max_num_pages, 2, page_size, H, D] (kv_layout "NHD") or
                      [max_num_pages, 2, H, page_size, D] ("HND"), or a (k_cache, v_cache)
                      tuple of [max_num_pages, page_size, H, D] / [max_num_pages, H, page_size, D]
"""

from __future__ import annotations

from ..errors import UsageError
from ..paging.layouts import LAYOUTS, Layout
from .views import as_tensors


def block_tables(kv_indptr: list[int], kv_indices: list[int], kv_last_page_len: list[int], page_size: int) -> tuple[list[list[int]], list[int]]:
    """(one block table per request, seq_lens) from FlashInfer's CSR page table."""
    if len(kv_indptr) != len(kv_last_page_len) + 1 or kv_indptr[0] != 0 or kv_indptr[-1] > len(kv_indices):
        raise UsageError("kv_indptr", kv_indptr, f"needs batch + 1 = {len(kv_last_page_len) + 1} offsets from 0 to at most len(kv_indices) = {len(kv_indices)}")
    tables, lens = [], []
    for i, last in enumerate(kv_last_page_len):
        start, end = kv_indptr[i], kv_indptr[i + 1]
        if end <= start:
            raise UsageError("kv_indptr", kv_indptr, f"request {i} has no pages")
        if not 1 <= last <= page_size:
            raise UsageError("kv_last_page_len", kv_last_page_len, f"request {i}: the last page holds 1..{page_size} tokens")
        tables.append(list(kv_indices[start:end]))
        lens.append((end - start - 1) * page_size + last)
    return tables, lens


def cache_layout(paged_kv_cache, kv_layout: str) -> Layout:
    if kv_layout not in ("NHD", "HND"):
        raise UsageError("kv_layout", kv_layout, "FlashInfer's layouts are NHD and HND")
    if isinstance(paged_kv_cache, (tuple, list)):
        return LAYOUTS[kv_layout.lower()]
    return LAYOUTS["flashinfer" if kv_layout == "NHD" else "flashinfer-hnd"]


def kv_views(paged_kv_cache, kv_layout: str, page_size: int, num_kv_heads: int, head_dim: int):
    """K and V as ``[max_num_pages, page_size, H, D]`` views of FlashInfer's cache (no copy)."""
    return as_tensors(paged_kv_cache, cache_layout(paged_kv_cache, kv_layout), page_size, num_kv_heads, head_dim)


def write_bundle(path, kv_indptr, kv_indices, kv_last_page_len, paged_kv_cache, *, kv_layout: str, page_size: int, num_qo_heads: int, query=None, output=None, **options):
    """A batch-decode step of FlashInfer (its `plan` arguments and the cache) as a capture bundle."""
    from .export import write_bundle as write

    tables, lens = block_tables(list(map(int, kv_indptr)), list(map(int, kv_indices)), list(map(int, kv_last_page_len)), page_size)
    return write(path, engine="flashinfer", layout=cache_layout(paged_kv_cache, kv_layout).name, cache=paged_kv_cache, block_size=page_size,
                 num_heads=num_qo_heads, tables=tables, seq_lens=lens, query=query, output=output, **options)
