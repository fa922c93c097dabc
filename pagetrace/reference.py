"""Contiguous attention in plain torch: gather the blocks, then softmax attention.

This is the independent check of every kernel run and the fast CPU path for large
inputs. It never uses the kernel's stride arithmetic: each cache is permuted back to
one canonical layout, ``[num_blocks, block_size, num_kv_heads, head_dim]``, and tokens
are gathered by slot number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .layouts import get_layout

CANONICAL = ("block", "slot", "head", "dim")


def canonical_cache(cache: torch.Tensor, layout: str, which: str) -> torch.Tensor:
    """View any layout's cache as ``[num_blocks, block_size, num_kv_heads, head_dim]``."""
    lay = get_layout(layout)
    axes = list(lay.key_axes if which == "key" else lay.value_axes)
    if "head" not in axes:
        cache = cache.unsqueeze(-1)
        axes.append("head")
    if "dim_hi" in axes:
        order = [axes.index(a) for a in ("block", "slot", "head", "dim_hi", "dim_lo")]
        cache = cache.permute(order)
        return cache.reshape(*cache.shape[:3], cache.shape[3] * cache.shape[4])
    return cache.permute([axes.index(a) for a in CANONICAL])


def layout_cache(canonical: torch.Tensor, layout: str, which: str, x: int = 1) -> torch.Tensor:
    """The inverse of `canonical_cache`: lay a canonical cache out as `layout`, contiguously."""
    lay = get_layout(layout)
    axes = lay.key_axes if which == "key" else lay.value_axes
    nb, bs, h, d = canonical.shape
    if lay.single_head:
        return canonical[:, :, 0, :].contiguous()
    if "dim_hi" in axes:
        split = canonical.reshape(nb, bs, h, d // x, x)
        names = ("block", "slot", "head", "dim_hi", "dim_lo")
        return split.permute([names.index(a) for a in axes]).contiguous()
    return canonical.permute([CANONICAL.index(a) for a in axes]).contiguous()


def slots_of(table: list[int], seq_len: int, block_size: int) -> torch.Tensor:
    t = torch.arange(seq_len)
    return torch.tensor(table, dtype=torch.long)[t // block_size] * block_size + t % block_size


@dataclass
class ReferenceResult:
    output: torch.Tensor  # [num_seqs, num_heads, head_dim], in `compute_dtype`
    logits: list[torch.Tensor]  # per sequence [num_heads, seq_len]: q·k * scale
    weights: list[torch.Tensor]  # per sequence [num_heads, seq_len]: softmax of logits
    lse: torch.Tensor  # [num_seqs, num_heads]: log-sum-exp of each head's logits


def gather(cache: torch.Tensor, layout: str, which: str, table: list[int], seq_len: int, block_size: int) -> torch.Tensor:
    """One sequence's key or value vectors, contiguous: ``[seq_len, num_kv_heads, head_dim]``."""
    canon = canonical_cache(cache, layout, which)
    flat = canon.reshape(-1, canon.shape[2], canon.shape[3])
    return flat[slots_of(table, seq_len, block_size).to(cache.device)]


def reference_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    tables: list[list[int]],
    seq_lens: list[int],
    *,
    layout: str,
    block_size: int,
    scale: float,
    compute_dtype: torch.dtype = torch.float32,
) -> ReferenceResult:
    """Attention of each sequence's query over its gathered, contiguous keys and values."""
    num_seqs, num_heads, head_dim = query.shape
    outputs, all_logits, all_weights, lses = [], [], [], []
    for s in range(num_seqs):
        k = gather(key_cache, layout, "key", tables[s], seq_lens[s], block_size).to(compute_dtype)
        v = gather(value_cache, layout, "value", tables[s], seq_lens[s], block_size).to(compute_dtype)
        num_kv_heads = k.shape[1]
        q = query[s].to(compute_dtype).view(num_kv_heads, num_heads // num_kv_heads, head_dim)  # heads sharing a KV head
        logits = torch.einsum("kgd,tkd->kgt", q, k).reshape(num_heads, -1) * scale  # [num_heads, seq_len]
        weights = torch.softmax(logits, dim=-1)
        out = torch.einsum("kgt,tkd->kgd", weights.view(num_kv_heads, -1, k.shape[0]), v).reshape(num_heads, head_dim)
        outputs.append(out)
        all_logits.append(logits)
        all_weights.append(weights)
        lses.append(torch.logsumexp(logits, dim=-1))
    return ReferenceResult(torch.stack(outputs), all_logits, all_weights, torch.stack(lses))
