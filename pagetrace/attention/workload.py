"""Build a seeded paged KV cache, queries and block tables from a `Plan`.

Values are drawn in the worked example's order (key cache, value cache, query) from
one seeded generator, in the canonical shape ``[num_blocks, block_size, kv_heads,
head_dim]``, then laid out as asked. With one KV head this draws exactly what
``torch.manual_seed(0); torch.randn(16, 16, 8)`` does. Every slot no sequence uses is
filled with NaN, so a read outside a sequence poisons the result.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UsageError
from ..paging.layouts import CacheGeometry, make_geometry
from ..paging.plan import Plan, available_memory_bytes, cache_bytes, human_bytes
from .reference import layout_cache, slots_of

TORCH_DTYPES = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,  # caches only: their queries are fp16
}


@dataclass
class Workload:
    plan: Plan
    geometry: CacheGeometry
    num_heads: int
    query: torch.Tensor  # [num_query_tokens, num_heads, head_dim]: each sequence's new tokens, in order
    key_cache: torch.Tensor  # laid out as geometry.layout's key axes
    value_cache: torch.Tensor  # laid out as geometry.layout's value axes
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks], -1 where a table is shorter
    seq_lens: torch.Tensor  # int32 [num_seqs], new tokens included
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: sequence s's new tokens are query rows [qsl[s], qsl[s+1])


def torch_dtype(dtype: str) -> torch.dtype:
    try:
        return TORCH_DTYPES[dtype]
    except KeyError:
        raise UsageError("--dtype", dtype, f"the kernel runs on {', '.join(TORCH_DTYPES)} caches") from None


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi's standard slopes (Press et al.; vLLM's `_get_alibi_slopes`, Bloom's too): a
    geometric series 2**(-8/n), 2**(-16/n), ... over the nearest power of two n, and for
    the heads beyond it every other slope of the series for 2n."""
    n = 1 << (num_heads.bit_length() - 1)
    slopes = [2 ** (-8 * (i + 1) / n) for i in range(n)]
    slopes += [2 ** (-4 * (2 * i + 1) / n) for i in range(num_heads - n)]
    return torch.tensor(slopes, dtype=torch.float32)


def padded_block_tables(tables: list[list[int]], device: str | torch.device = "cpu") -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=torch.int32, device=device)


def run_extra_bytes(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, json_rows: bool, num_query_tokens: int | None = None) -> int:
    """Bytes a traced, checked run needs beside the cache: the trace (fp32 logits and
    weights, mask states per query token; slots, partitions), the float64 reference (one
    sequence's gathered K and V at a time, every query token's logits and weights), and
    with --json a Python row per key."""
    s, l = len(seq_lens), max(seq_lens)
    rows = s if num_query_tokens is None else num_query_tokens
    per_token = rows * l * (num_heads * 32 + 2) + s * l * (12 + (300 + 48 * num_heads if json_rows else 0))
    return per_token + 16 * l * num_kv_heads * head_dim


def check_memory(geom: CacheGeometry, device: torch.device, option: str, value: object, extra: int = 0) -> None:
    """Refuse, before allocating, a cache (and `extra` working bytes) that cannot fit where it is going."""
    need = cache_bytes(geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim, geom.element_size)
    what = f"the KV cache needs {human_bytes(need)}" + (f" and the run {human_bytes(extra)} more" if extra else "")
    # the draw happens in fp32 on the CPU, one cache at a time, before the cast and the copy
    host_need = need // 2 * 4 // geom.element_size + (need + extra if device.type == "cpu" else 0)
    host_free = available_memory_bytes()
    if host_free is not None and host_need > host_free:
        raise UsageError(option, value, f"{what} ({human_bytes(host_need)} on the host); only {human_bytes(host_free)} of memory is available")
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need + extra > free:
            raise UsageError(option, value, f"{what}; the GPU has {human_bytes(free)} free")


def make_workload(
    plan: Plan,
    *,
    num_heads: int = 1,
    num_kv_heads: int = 1,
    head_dim: int = 8,
    dtype: str = "fp32",
    layout: str = "blocks",
    seed: int = 0,
    device: str | torch.device = "cpu",
    memory_option: tuple[str, object] = ("--tokens", None),
    query_lens: list[int] | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> Workload:
    """query_lens: new tokens per sequence (default one: decode). fp8 caches store the
    drawn values divided by k_scale / v_scale (vLLM: value = stored x scale)."""
    geom = make_geometry(layout, plan.num_blocks, plan.block_size, num_kv_heads, head_dim, dtype)
    if num_heads < 1 or num_heads % num_kv_heads:
        raise UsageError("--heads", num_heads, f"must be a positive multiple of --kv-heads ({num_kv_heads})")
    device = torch.device(device)
    tdtype = torch_dtype(dtype)
    check_memory(geom, device, *memory_option)

    gen = torch.Generator().manual_seed(seed)
    canonical_shape = (plan.num_blocks, plan.block_size, num_kv_heads, head_dim)
    used = torch.zeros(plan.num_blocks * plan.block_size, dtype=torch.bool)
    for table, n in zip(plan.tables, plan.seq_lens):
        used[slots_of(table, n, plan.block_size)] = True
    unused = ~used.view(plan.num_blocks, plan.block_size)

    caches = []
    fp8 = dtype.startswith("fp8")
    for which, scale in (("key", k_scale), ("value", v_scale)):
        canon = torch.randn(canonical_shape, generator=gen)
        canon[unused] = float("nan")
        if fp8:
            canon /= scale
        caches.append(layout_cache(canon.to(tdtype), layout, which, geom.x).to(device))
        del canon
    query_lens = [1] * len(plan.seq_lens) if query_lens is None else query_lens
    qdtype = torch.float16 if fp8 else tdtype
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=gen).to(qdtype).to(device)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return Workload(
        plan=plan,
        geometry=geom,
        num_heads=num_heads,
        query=query,
        key_cache=caches[0],
        value_cache=caches[1],
        block_tables=padded_block_tables(plan.tables, device),
        seq_lens=torch.tensor(plan.seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
    )
