"""Checks on `paged_attention`'s inputs, on the host, before any kernel reads them.

A table entry outside the pool, a table too short for its length, or a query range
past the query tensor makes a GPU kernel fault and the interpreter read garbage, so
they are refused here with the argument's name, its value and the fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import UsageError
from ..paging.layouts import KERNEL_LAYOUTS, get_layout

QUERY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)  # vLLM's "fp8" / "fp8_e4m3" and "fp8_e5m2" caches
INDEX_DTYPES = (torch.int32, torch.int64)  # vLLM's int32; PyTorch's own paged attention uses int64 page tables


@dataclass(slots=True)
class Batch:
    """What the checks learnt about a call: lengths as Python ints, and the geometry."""

    seq_lens: list[int]  # tokens per sequence, new ones included
    query_lens: list[int]  # new (query) tokens per sequence
    query_start_loc: torch.Tensor  # [num_seqs + 1], on the query's device (arange for decode)
    num_kv_heads: int
    block_size: int
    alibi_slopes: torch.Tensor | None  # fp32, contiguous
    k_scale: torch.Tensor | None  # fp32 [1], None for unscaled caches
    v_scale: torch.Tensor | None


def _index_tensor(name: str, tensor: torch.Tensor) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype not in INDEX_DTYPES:
        raise UsageError(name, str(getattr(tensor, "dtype", type(tensor).__name__)), "must be an int32 or int64 tensor")


def _scale_tensor(name: str, value, device: torch.device) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
    if t.numel() != 1 or not math.isfinite(float(t[0])) or float(t[0]) <= 0:
        raise UsageError(name, value if not isinstance(value, torch.Tensor) else tuple(value.shape), "must be one finite positive number (a per-tensor scale)")
    return t.to(device)


def check_inputs(
    query, key_cache, value_cache, block_tables, seq_lens, layout: str, *,
    query_start_loc=None, sliding_window=None, soft_cap=None, alibi_slopes=None, k_scale=None, v_scale=None, out=None,
) -> Batch:
    lay = get_layout(layout, option="layout")
    if not lay.kernel_ready:
        raise UsageError("layout", layout, f"is not a key and a value tensor with one stride per axis; view it with pagetrace.engines.views.as_tensors and pass layout='nhd' (the kernel takes {', '.join(KERNEL_LAYOUTS)})")
    if query.dim() != 3 or 0 in query.shape[1:]:
        raise UsageError("query", tuple(query.shape), "must be [num_query_tokens, num_heads, head_dim], heads and head_dim at least 1")
    num_tokens, num_heads, head_dim = query.shape
    if query.dtype not in QUERY_DTYPES:
        raise UsageError("query", str(query.dtype), "the kernel takes float32, float16 or bfloat16 queries")
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        if tensor.dtype != query.dtype and tensor.dtype not in FP8_DTYPES:
            raise UsageError(name, str(tensor.dtype), f"must have the query's dtype, {query.dtype}, or be float8_e4m3fn / float8_e5m2")
    if key_cache.dtype != value_cache.dtype:
        raise UsageError("value_cache", str(value_cache.dtype), f"must have the key cache's dtype, {key_cache.dtype}")
    fp8 = key_cache.dtype in FP8_DTYPES
    if not fp8 and (k_scale is not None or v_scale is not None):
        raise UsageError("k_scale", k_scale if k_scale is not None else v_scale, "scales apply to fp8 caches only")
    for name, tensor in (("block_tables", block_tables), ("seq_lens", seq_lens), ("query_start_loc", query_start_loc)):
        if tensor is not None:
            _index_tensor(name, tensor)
    tensors = [query, key_cache, value_cache, block_tables, seq_lens] + [t for t in (query_start_loc, out) if t is not None]
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise UsageError("query", str(query.device), f"all tensors must be on one device, got {sorted(map(str, devices))}")
    for name, cache, axes in (("key_cache", key_cache, lay.key), ("value_cache", value_cache, lay.value)):
        if cache.dim() != len(axes):
            raise UsageError(name, tuple(cache.shape), f"the '{layout}' layout has axes {axes}")
    key = dict(zip(lay.key, key_cache.shape))
    value = dict(zip(lay.value, value_cache.shape))
    key_dim = key["dim"] if "dim" in key else key["dim/x"] * key["dim%x"]
    for axis in ("block", "slot", "head"):
        if key.get(axis, 1) != value.get(axis, 1):
            raise UsageError("value_cache", tuple(value_cache.shape), f"its {axis} axis differs from the key cache's {tuple(key_cache.shape)}")
    if key_dim != head_dim or value["dim"] != head_dim:
        raise UsageError("query", tuple(query.shape), f"head_dim {head_dim} differs from the caches' ({key_dim}, {value['dim']})")
    num_blocks, block_size, num_kv_heads = key["block"], key["slot"], key.get("head", 1)
    if num_heads % num_kv_heads:
        raise UsageError("query", tuple(query.shape), f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    num_seqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    if seq_lens.dim() != 1 or num_seqs < 1:
        raise UsageError("seq_lens", tuple(seq_lens.shape), "must be [num_seqs], at least one sequence")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise UsageError("block_tables", tuple(block_tables.shape), f"need one row per sequence ({num_seqs})")
    lens = [int(n) for n in seq_lens.tolist()]
    if min(lens) < 0:
        raise UsageError("seq_lens", lens, "lengths cannot be negative")
    query_lens, query_start_loc = _query_ranges(query_start_loc, lens, num_tokens, query.device)
    if out is not None and (tuple(out.shape) != tuple(query.shape) or out.dtype != query.dtype):
        raise UsageError("out", f"{tuple(out.shape)} {out.dtype}", f"must match the query: {tuple(query.shape)} {query.dtype}")
    needed = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    if int(needed.max()) > block_tables.shape[1]:
        raise UsageError("block_tables", tuple(block_tables.shape), f"a sequence of {max(lens)} tokens needs {int(needed.max())} blocks of {block_size}")
    used = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < needed[:, None].to(block_tables.device)
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    if bool(bad.any()):
        s, b = (int(i) for i in torch.nonzero(bad)[0])
        raise UsageError("block_tables", int(block_tables[s, b]), f"sequence {s} maps logical block {b} outside the pool of {num_blocks} blocks")
    if sliding_window is not None and (isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 1):
        raise UsageError("sliding_window", sliding_window, "must be a whole number of tokens >= 1")
    if soft_cap is not None and not (isinstance(soft_cap, (int, float)) and math.isfinite(soft_cap) and soft_cap > 0):
        raise UsageError("soft_cap", soft_cap, "must be a finite number > 0")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or tuple(alibi_slopes.shape) != (num_heads,):
            raise UsageError("alibi_slopes", tuple(getattr(alibi_slopes, "shape", ())), f"must be a tensor of {num_heads} slopes, one per query head")
        alibi_slopes = alibi_slopes.to(device=query.device, dtype=torch.float32).contiguous()
    scales = (None, None)
    if fp8:
        scales = (_scale_tensor("k_scale", 1.0 if k_scale is None else k_scale, query.device),
                  _scale_tensor("v_scale", 1.0 if v_scale is None else v_scale, query.device))
    return Batch(lens, query_lens, query_start_loc, num_kv_heads, block_size, alibi_slopes, *scales)


def _query_ranges(query_start_loc, lens: list[int], num_tokens: int, device) -> tuple[list[int], torch.Tensor]:
    """New tokens per sequence, from query_start_loc (None: one each, decode)."""
    num_seqs = len(lens)
    if query_start_loc is None:
        if num_tokens != num_seqs:
            raise UsageError("query", num_tokens, f"without query_start_loc the query has one token per sequence ({num_seqs})")
        return [1] * num_seqs, torch.arange(num_seqs + 1, dtype=torch.int32, device=device)
    if tuple(query_start_loc.shape) != (num_seqs + 1,):
        raise UsageError("query_start_loc", tuple(query_start_loc.shape), f"must be [num_seqs + 1] = [{num_seqs + 1}], cumulative query counts")
    starts = [int(v) for v in query_start_loc.tolist()]
    q_lens = [b - a for a, b in zip(starts, starts[1:])]
    if starts[0] != 0 or min(q_lens) < 0 or starts[-1] != num_tokens:
        raise UsageError("query_start_loc", starts, f"must rise from 0 to the number of query tokens ({num_tokens})")
    for s, (q, n) in enumerate(zip(q_lens, lens)):
        if q > n:
            raise UsageError("query_start_loc", starts, f"sequence {s} has {q} new tokens but seq_lens says {n} in all (seq_lens counts the new tokens too)")
    return q_lens, query_start_loc
