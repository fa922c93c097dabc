"""Contiguous attention in plain torch: gather the blocks, then softmax attention.

This is the check of every kernel run and the fast CPU path for large inputs, with
the kernel's mask semantics (`mask_states`) but none of its code. It never uses the kernel's stride arithmetic: each cache is permuted back to
one canonical layout, ``[num_blocks, block_size, num_kv_heads, head_dim]``, and tokens
are gathered by slot number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..paging.layouts import get_layout

CANONICAL = ("block", "slot", "head", "dim")
SPLIT = ("block", "slot", "head", "dim/x", "dim%x")  # vLLM's split key, its chunks kept apart


def canonical_cache(cache: torch.Tensor, layout: str, which: str) -> torch.Tensor:
    """View any layout's cache as ``[num_blocks, block_size, num_kv_heads, head_dim]`` (a copy for split keys)."""
    view = canonical_view(cache, layout, which)
    return view.reshape(*view.shape[:3], -1) if view.dim() == 5 else view


def canonical_view(cache: torch.Tensor, layout: str, which: str) -> torch.Tensor:
    """`canonical_cache` without a copy: a key split in runs of x stays ``[..., head_dim // x, x]``."""
    lay = get_layout(layout)
    axes = list(lay.factors(which))
    if "head" not in axes:
        cache = cache.unsqueeze(-1)
        axes.append("head")
    names = SPLIT if "dim/x" in axes else CANONICAL
    return cache.permute([axes.index(a) for a in names])


def layout_cache(canonical: torch.Tensor, layout: str, which: str, x: int = 1) -> torch.Tensor:
    """The inverse of `canonical_cache`: lay a canonical cache out as `layout`, contiguously."""
    lay = get_layout(layout)
    axes = lay.factors(which)
    nb, bs, h, d = canonical.shape
    if lay.single_head:
        return canonical[:, :, 0, :].contiguous()
    if "dim/x" in axes:
        split = canonical.reshape(nb, bs, h, d // x, x)
        return split.permute([SPLIT.index(a) for a in axes]).contiguous()
    return canonical.permute([CANONICAL.index(a) for a in axes]).contiguous()


def slots_of(table: list[int], seq_len: int, block_size: int) -> torch.Tensor:
    t = torch.arange(seq_len)
    return torch.as_tensor(table, dtype=torch.long).cpu()[t // block_size] * block_size + t % block_size


# mask states, as the kernel's trace writes them (pagetrace.attention.kernel has the same numbers)
VISIBLE, CAUSAL_MASKED, WINDOW_MASKED, NO_KEY = 0, 1, 2, -1


def mask_states(seq_len: int, q_len: int, sliding_window: int | None = None, device=None) -> torch.Tensor:
    """int8 ``[q_len, seq_len]``: how each new query token sees each key.

    Bottom-right causal alignment (FlashAttention's convention, vLLM's too): query i sits
    at position p = seq_len - q_len + i and sees keys t <= p; a sliding window w keeps
    only t > p - w. FlashAttention's example, 2 queries over 5 keys: rows 11110, 11111.
    """
    p = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    t = torch.arange(seq_len, device=device)[None, :]
    state = torch.where(t <= p, VISIBLE, CAUSAL_MASKED)
    if sliding_window is not None:
        state = torch.where((t <= p) & (t <= p - sliding_window), WINDOW_MASKED, state)
    return state.to(torch.int8)


@dataclass
class ReferenceResult:
    output: torch.Tensor  # [num_query_tokens, num_heads, head_dim], in `compute_dtype`
    logits: torch.Tensor | None  # [num_query_tokens, num_heads, max_seq_len]: score before the mask, NaN past the end
    weights: torch.Tensor | None  # same shape: softmax weights, 0 where masked, NaN past the end
    mask: torch.Tensor | None  # int8 [num_query_tokens, max_seq_len]: `mask_states`, NO_KEY past the end
    lse: torch.Tensor | None  # [num_query_tokens, num_heads]: log-sum-exp of the visible scores


def gather(cache: torch.Tensor, layout: str, which: str, table, seq_len: int, block_size: int) -> torch.Tensor:
    """One sequence's key or value vectors: ``[seq_len, num_kv_heads, head_dim]``.

    Only the blocks the sequence uses are copied out of the pool (index_select on the block
    axis: one contiguous run per block), then viewed in canonical order; a layout whose
    block is not (slot, head, dim) inside costs one more copy, of those blocks only.
    """
    lay = get_layout(layout)
    axes = lay.factors(which)
    used = -(-seq_len // block_size)
    ids = torch.as_tensor(table[:used], dtype=torch.long).to(cache.device)
    canon = canonical_cache(cache.index_select(axes.index("block"), ids), layout, which)
    return canon.reshape(used * block_size, canon.shape[2], canon.shape[3])[:seq_len]


def _dequantized(x: torch.Tensor, dtype: torch.dtype, scale: float) -> torch.Tensor:
    x = x.to(dtype)
    return x if scale == 1.0 else x * scale


def _scores(q, k, scale, soft_cap, alibi_slopes, seq_len):
    """[q_len, num_heads, seq_len] scores before the mask: scale, soft cap, then ALiBi."""
    q_len, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    qg = q.reshape(q_len, num_kv_heads, num_heads // num_kv_heads, head_dim)  # heads sharing a KV head
    s = torch.einsum("qkgd,tkd->qkgt", qg, k).reshape(q_len, num_heads, seq_len) * scale
    if soft_cap is not None:
        s = soft_cap * torch.tanh(s / soft_cap)
    if alibi_slopes is not None:
        distance = torch.arange(seq_len, device=q.device)[None, :] - torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        s = s + alibi_slopes.to(s.dtype)[None, :, None] * distance[:, None, :].to(s.dtype)
    return s


def reference_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    tables,
    seq_lens: list[int],
    *,
    layout: str,
    block_size: int,
    scale: float,
    query_lens: list[int] | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    compute_dtype: torch.dtype = torch.float32,
    keep_scores: bool = True,
) -> ReferenceResult:
    """Attention of each sequence's new queries over its gathered, contiguous keys and values.

    query: ``[num_query_tokens, num_heads, head_dim]``, the sequences' new tokens in order;
    query_lens: new tokens per sequence (default one each: decode). A sequence of length 0
    gives zeros. keep_scores=False skips the per-key tensors (logits, weights, mask, lse)
    and, where it can, runs torch's fused scaled_dot_product_attention.
    """
    num_tokens, num_heads, head_dim = query.shape
    query_lens = [1] * len(seq_lens) if query_lens is None else query_lens
    width = max(seq_lens, default=0)
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=compute_dtype, device=query.device)
    if keep_scores:
        logits = torch.full((num_tokens, num_heads, width), float("nan"), dtype=compute_dtype, device=query.device)
        weights = torch.full_like(logits, float("nan"))
        mask = torch.full((num_tokens, width), NO_KEY, dtype=torch.int8, device=query.device)
        lse = torch.full((num_tokens, num_heads), float("-inf"), dtype=compute_dtype, device=query.device)
    first = 0
    for s, (n, q_len) in enumerate(zip(seq_lens, query_lens)):
        rows = slice(first, first + q_len)
        first += q_len
        if q_len == 0 or n == 0:
            continue
        k = _dequantized(gather(key_cache, layout, "key", tables[s], n, block_size), compute_dtype, k_scale)
        v = _dequantized(gather(value_cache, layout, "value", tables[s], n, block_size), compute_dtype, v_scale)
        q = query[rows].to(compute_dtype)
        state = mask_states(n, q_len, sliding_window, device=query.device)
        if not keep_scores and soft_cap is None:
            out[rows] = _fused(q, k, v, scale, state, alibi_slopes)
            continue
        scores = _scores(q, k, scale, soft_cap, alibi_slopes, n)
        masked = scores.masked_fill((state != VISIBLE)[:, None, :], float("-inf"))
        top = masked.amax(-1, keepdim=True)  # key p is always visible to query p: finite
        e = torch.exp(masked - top)
        total = e.sum(-1, keepdim=True)
        row_lse = (top + torch.log(total))[..., 0]
        num_kv_heads = k.shape[1]
        eg = e.view(q_len, num_kv_heads, num_heads // num_kv_heads, n)
        # normalised after the value product, as the kernel and the torch path do: equal
        # scores over equal values give those values exactly
        acc = torch.einsum("qkgt,tkd->qkgd", eg, v).reshape(q_len, num_heads, head_dim)
        out[rows] = acc / total
        w = e / total
        if keep_scores:
            logits[rows, :, :n] = scores
            weights[rows, :, :n] = w
            mask[rows, :n] = state
            lse[rows] = row_lse
    if not keep_scores:
        return ReferenceResult(out, None, None, None, None)
    return ReferenceResult(out, logits, weights, mask, lse)


def _fused(q, k, v, scale, state, alibi_slopes):
    """torch's scaled_dot_product_attention over one sequence (no soft cap)."""
    q_len, num_heads, _ = q.shape
    seq_len, num_kv_heads, _ = k.shape
    visible = state == VISIBLE
    if alibi_slopes is not None:
        distance = torch.arange(seq_len, device=q.device)[None, :] - torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        bias = alibi_slopes.to(q.dtype)[:, None, None] * distance.to(q.dtype)[None]
        attn_mask = bias.masked_fill(~visible[None], float("-inf"))
    elif bool(visible.all()):
        attn_mask = None  # decode without a window: every key
    else:
        attn_mask = visible
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
        attn_mask=attn_mask, scale=scale, enable_gqa=num_heads != num_kv_heads,
    )
    return out[0].transpose(0, 1)
