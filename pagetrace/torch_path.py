"""The torch backend: paged attention in plain torch, for CPUs and anything without the kernel.

Decode and other short query runs read a sequence's blocks in chunks: each chunk of
blocks is copied by `index_select` into one reused buffer of about `CHUNK_BYTES` (small
enough to stay in the CPU's caches), and the scores are one batched matmul per chunk
that reads the buffer in place (each KV head's keys are a matrix with a row stride of
num_kv_heads * head_dim, which BLAS takes as it is). Softmax runs over the whole row,
then the values are read the same way. Compared with gathering the whole sequence and
calling SDPA, this never writes a sequence-sized copy into fresh memory, which on these
CPUs costs more than the attention itself (bench/bench_prefill.py, "torch vs SDPA").

A long prefill would need a q_len x seq_len score matrix per head; past `SCORES_BYTES`
the sequence goes through the reference's gather + fused SDPA instead.
"""

from __future__ import annotations

import torch

from .attention_inputs import Batch
from .reference import VISIBLE, canonical_cache, mask_states, reference_attention

CHUNK_BYTES = 2 << 20  # one chunk of keys or values, in fp32 (measured: 1-4 MiB are the fastest here)
SCORES_BYTES = 64 << 20  # the largest fp32 score matrix a sequence may build on the chunked path


def torch_attention(query, key_cache, value_cache, tables: torch.Tensor, batch: Batch, layout: str, scale: float,
                    sliding_window: int | None, soft_cap: float | None, out: torch.Tensor) -> torch.Tensor:
    """Write every sequence's attention output into `out` (``[num_query_tokens, num_heads, head_dim]``)."""
    num_heads, head_dim = query.shape[1], query.shape[2]
    k_scale = 1.0 if batch.k_scale is None else float(batch.k_scale)
    v_scale = 1.0 if batch.v_scale is None else float(batch.v_scale)
    first = 0
    for s, (n, q_len) in enumerate(zip(batch.seq_lens, batch.query_lens)):
        rows = slice(first, first + q_len)
        first += q_len
        if q_len == 0:
            continue
        if n == 0:
            out[rows] = 0
        elif q_len * num_heads * n * 4 <= SCORES_BYTES:
            out[rows] = _chunked(query[rows], key_cache, value_cache, tables[s], n, batch, layout, scale,
                                 sliding_window, soft_cap, k_scale, v_scale)
        else:
            alibi = batch.alibi_slopes
            out[rows] = reference_attention(
                query[rows], key_cache, value_cache, tables[s : s + 1], [n], layout=layout, block_size=batch.block_size,
                scale=scale, query_lens=[q_len], sliding_window=sliding_window, soft_cap=soft_cap, alibi_slopes=alibi,
                k_scale=k_scale, v_scale=v_scale, keep_scores=False,
            ).output
    return out


class _Chunks:
    """A sequence's blocks [lo_block, used) of one cache, in chunks, each as ``[tokens, kv_heads, head_dim]`` fp32."""

    def __init__(self, cache: torch.Tensor, layout: str, which: str, ids: torch.Tensor, block_size: int, per_chunk: int, scale: float):
        self.cache, self.layout, self.which, self.ids, self.bs, self.scale = cache, layout, which, ids, block_size, scale
        self.per_chunk = per_chunk
        self.buffer = cache.new_empty((min(per_chunk, len(ids)), *cache.shape[1:]))  # block is axis 0 in every kernel layout

    def __iter__(self):
        for start in range(0, len(self.ids), self.per_chunk):
            ids = self.ids[start : start + self.per_chunk]
            blocks = torch.index_select(self.cache, 0, ids, out=self.buffer[: len(ids)])
            canon = canonical_cache(blocks, self.layout, self.which)  # [n, block_size, kv_heads, head_dim], a view
            tokens = canon.reshape(len(ids) * self.bs, canon.shape[2], canon.shape[3])  # copies only for hnd / vllm
            if tokens.dtype != torch.float32:
                tokens = tokens.to(torch.float32)
            if self.scale != 1.0:
                tokens = tokens * self.scale
            yield start * self.bs, tokens


def _chunked(q, key_cache, value_cache, table, n, batch: Batch, layout, scale, sliding_window, soft_cap, k_scale, v_scale):
    """One sequence's attention, keys and values read chunk by chunk (see the module doc)."""
    q_len, num_heads, head_dim = q.shape
    kv = batch.num_kv_heads
    group, bs = num_heads // kv, batch.block_size
    # Keys every query of the sequence masks by its window are never read: start at the first block one can see.
    lo = 0 if sliding_window is None else max(0, n - q_len - sliding_window + 1)
    lo_block, used = lo // bs, -(-n // bs)
    ids = table[lo_block:used].to(device=key_cache.device, dtype=torch.long)
    per_chunk = max(1, CHUNK_BYTES // (bs * kv * head_dim * 4))
    # rows of one KV head's score matrix: (query token, head in its group)
    qm = (q.to(torch.float32) * scale).view(q_len, kv, group, head_dim).permute(1, 0, 2, 3).reshape(kv, q_len * group, head_dim)
    base = lo_block * bs
    scores = torch.empty(kv, q_len * group, (used - lo_block) * bs, dtype=torch.float32, device=q.device)
    for start, k in _Chunks(key_cache, layout, "key", ids, bs, per_chunk, k_scale):
        torch.matmul(qm, k.permute(1, 2, 0), out=scores[:, :, start : start + k.shape[0]])
    width = n - base  # keys base..n-1; the last block's unwritten slots are cut off here, never read below
    s = scores[:, :, :width].view(kv, q_len, group, width)
    if soft_cap is not None:
        s = soft_cap * torch.tanh(s / soft_cap)
    p = torch.arange(n - q_len, n, device=q.device)  # each query's position (bottom-right causal alignment)
    if batch.alibi_slopes is not None:
        distance = (torch.arange(base, n, device=q.device)[None, :] - p[:, None]).to(torch.float32)  # j - p
        s = s + batch.alibi_slopes.view(kv, 1, group, 1) * distance[None, :, None, :]
    if q_len > 1 or sliding_window is not None:
        state = mask_states(n, q_len, sliding_window, device=q.device)[:, base:]
        s = s.masked_fill((state != VISIBLE)[None, :, None, :], float("-inf"))
    weights = torch.softmax(s, dim=-1).view(kv, q_len * group, width)
    acc = torch.zeros(kv, q_len * group, head_dim, dtype=torch.float32, device=q.device)
    for start, v in _Chunks(value_cache, layout, "value", ids, bs, per_chunk, v_scale):
        stop = min(start + v.shape[0], width)
        acc.baddbmm_(weights[:, :, start:stop], v[: stop - start].transpose(0, 1))
    return acc.view(kv, q_len, group, head_dim).permute(1, 0, 2, 3).reshape(q_len, num_heads, head_dim)
