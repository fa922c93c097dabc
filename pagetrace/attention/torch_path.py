"""The torch backend: paged attention in plain torch, for CPUs and anything without the kernel.

Decode and other short query runs read a sequence's blocks in chunks of about
`CHUNK_BYTES`: `index_select` copies a chunk of blocks into a buffer this thread keeps
between calls (see `_scratch`), the scores are one batched matmul per chunk, softmax
runs over the whole row, then the values are read the same way. An nhd chunk is read as
tokens (each KV head a matrix with a row stride of num_kv_heads * head_dim, which BLAS
takes as it is); an hnd or vLLM value chunk as blocks (each (block, KV head) a matrix as
stored); see `_Reader`. Compared with gathering the whole sequence and calling SDPA, this
never copies a sequence's keys or values into fresh memory, which on these CPUs costs more
than the attention itself (bench/bench_prefill.py --sdpa-only, bench/README.md); only the
score rows (kv_heads x query rows x keys, fp32) are sequence-sized. The kept buffers stay
with the thread: one for each of five names per device, each at most `SCRATCH_BYTES`, so a
thread keeps at most `KEPT_BYTES` (80 MiB) per device whatever shapes and dtypes it runs.

The weights are normalised after the value product, as FlashAttention and the kernel do:
out = (sum_j e_j v_j) / sum_j e_j with e_j = exp(s_j - max s). Rows of equal scores over
equal values then give those values exactly (FlashInfer's extreme-logits test: 1.0 at zero
tolerance), where the sum of n rounded 1/n would not.

Like the kernel, this path computes no gradient: it runs under `torch.no_grad()`.

A long prefill would need a q_len x seq_len score matrix per head; past `SCORES_BYTES`
the sequence goes through the reference's gather + fused SDPA instead.
"""

from __future__ import annotations

import threading

import torch

from .inputs import Batch
from .reference import VISIBLE, canonical_view, mask_states, reference_attention

CHUNK_BYTES = 4 << 20  # one chunk of keys or values, in fp32 (measured, bench/README.md: 4 MiB is the fastest here)
SCORES_BYTES = 64 << 20  # the largest fp32 score matrix a sequence may build on the chunked path


def torch_attention(query, key_cache, value_cache, tables: torch.Tensor, batch: Batch, layout: str, scale: float,
                    sliding_window: int | None, soft_cap: float | None, out: torch.Tensor) -> torch.Tensor:
    """Write every sequence's attention output into `out` (``[num_query_tokens, num_heads, head_dim]``)."""
    with torch.no_grad():  # a query that requires grad would refuse the matmuls' out= buffers
        return _attention(query, key_cache, value_cache, tables, batch, layout, scale, sliding_window, soft_cap, out)


def _attention(query, key_cache, value_cache, tables, batch, layout, scale, sliding_window, soft_cap, out):
    num_heads = query.shape[1]
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


SCRATCH_BYTES = 16 << 20  # the largest buffer a thread keeps between calls
SCRATCH_NAMES = ("gathered", "work", "scores", "part", "products")
KEPT_BYTES = len(SCRATCH_NAMES) * SCRATCH_BYTES  # the most a thread keeps per device
_kept = threading.local()


def _scratch(name: str, numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A flat buffer of `numel` elements that this thread reuses from call to call.

    A fresh multi-megabyte tensor is fresh memory from the OS on every call, and faulting
    its pages in cost more than the copy into it (about 1,200 page faults and 1-2 ms a 4k
    decode, bench/README.md). Buffers over `SCRATCH_BYTES` are not kept. Nothing the caller
    gets back ever points into one of these.

    One byte buffer is kept per (name, device), viewed as the dtype asked for, and grows
    only up to `SCRATCH_BYTES`: at most `KEPT_BYTES` per thread and device. It is made
    outside inference mode even when the call runs inside it (vLLM runs attention under
    torch.inference_mode()): an inference tensor could not be written by a later call
    outside that mode, while a normal tensor may be written in either.
    """
    nbytes = numel * dtype.itemsize
    if nbytes > SCRATCH_BYTES:
        return torch.empty(numel, dtype=dtype, device=device)
    kept = _kept.__dict__.setdefault("buffers", {})
    key = (name, torch.device(device))
    buffer = kept.get(key)
    if buffer is None or buffer.numel() < nbytes:
        with torch.inference_mode(False):
            buffer = kept[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return buffer[:nbytes].view(dtype)


class _Reader:
    """A sequence's blocks of one cache, read chunk by chunk as fp32 tensors in one of two forms.

    - ``tokens``: ``[tokens, kv_heads, head_dim]``, each KV head a matrix with a row stride of
      kv_heads * head_dim (nhd as stored; other layouts copied into it);
    - ``blocks``: ``[blocks, kv_heads, block_size, head_dim]``, each (block, head) a matrix; hnd
      and vLLM's value cache are this as stored (the value one transposed), so a decode reads
      them without a copy. The unwritten slots of the sequence's last block are zeroed in the
      copy, so a value product never multiplies them.

    Keys and then values go through the same two buffers, made once per sequence:
    `gathered` takes a chunk's blocks as stored (`index_select` with `out=`), and `work` takes
    them relaid in fp32 when the layout or the dtype needs a copy, the fp8 scale applied in place.
    """

    def __init__(self, cache: torch.Tensor, ids: torch.Tensor, block_size: int, per_chunk: int, kv: int, head_dim: int,
                 form: str, tokens: int):
        n = min(per_chunk, len(ids))
        self.ids, self.bs, self.per_chunk, self.form, self.tokens = ids, block_size, per_chunk, form, tokens
        # block is axis 0 in every kernel layout, and a block holds block_size * kv * head_dim elements
        # in each of the two caches (their shapes differ in vLLM's layout)
        self.gathered = _scratch("gathered", n * block_size * kv * head_dim, cache.dtype, cache.device)
        self.work = _scratch("work", n * block_size * kv * head_dim, torch.float32, cache.device)

    def chunks(self, cache: torch.Tensor, layout: str, which: str, scale: float):
        for start in range(0, len(self.ids), self.per_chunk):
            ids = self.ids[start : start + self.per_chunk]
            n = len(ids)
            blocks = self.gathered[: n * cache[0].numel()].view(n, *cache.shape[1:])
            stored = canonical_view(torch.index_select(cache, 0, ids, out=blocks), layout, which)
            if self.form == "tokens":  # stored is [n, bs, kv, D] or, for split keys, [n, bs, kv, D / x, x]
                view = stored
            else:
                view = stored.transpose(1, 2)  # [n, kv, bs, D(, x)]
            if view.dtype == torch.float32 and view.dim() == 4 and _matrices(view, self.form):
                chunk = view
            else:
                chunk = self.work[: view.numel()].view(view.shape).copy_(view)
            chunk = chunk.flatten(3)  # [n, bs, kv, D] or [n, kv, bs, D]
            if self.form == "tokens":
                chunk = chunk.view(n * self.bs, *chunk.shape[2:])
            if scale != 1.0:
                chunk.mul_(scale)  # one of the two buffers either way
            tail = start * self.bs + n * self.bs - self.tokens
            if self.form == "blocks" and which == "value" and tail > 0:
                chunk[-1, :, self.bs - tail :] = 0
            yield start * self.bs, chunk


def _matrices(view: torch.Tensor, form: str) -> bool:
    """Whether BLAS can take `view` as it is: mergeable leading dims, one unit stride per matrix."""
    if form == "tokens":
        return view.is_contiguous()
    n_stride, kv_stride, row, col = view.stride()
    return n_stride == view.shape[1] * kv_stride and (row == 1 or col == 1)


def _chunked(q, key_cache, value_cache, table, n, batch: Batch, layout, scale, sliding_window, soft_cap, k_scale, v_scale):
    """One sequence's attention, keys and values read chunk by chunk (see the module doc)."""
    q_len, num_heads, head_dim = q.shape
    kv = batch.num_kv_heads
    group, bs = num_heads // kv, batch.block_size
    rows = q_len * group  # rows of one KV head's score matrix: (query token, head in its group)
    # Keys every query of the sequence masks by its window are never read: start at the first block one can see.
    lo = 0 if sliding_window is None else max(0, n - q_len - sliding_window + 1)
    lo_block, used = lo // bs, -(-n // bs)
    base = lo_block * bs
    width, full = n - base, (used - lo_block) * bs  # keys base..n-1; full blocks reach `full`
    ids = table[lo_block:used].to(device=key_cache.device, dtype=torch.long)
    per_chunk = max(1, CHUNK_BYTES // (bs * kv * head_dim * 4))
    # Block form when the cache is not token-major already, and a chunk's value product
    # [blocks, kv, rows, head_dim] is no bigger than the chunk (a decode, not a long prefill).
    token_major = canonical_view(key_cache, layout, "key")[0].is_contiguous()
    form = "blocks" if not token_major and rows <= bs else "tokens"
    reader = _Reader(key_cache, ids, bs, per_chunk, kv, head_dim, form, width)
    qm = (q.to(torch.float32) * scale).view(q_len, kv, group, head_dim).permute(1, 0, 2, 3).reshape(kv, rows, head_dim)
    scores = _scratch("scores", kv * rows * full, torch.float32, q.device).view(kv, rows, full)
    # Each chunk's scores go to a contiguous buffer, then into the row: a matmul writing into a
    # strided slice of `scores` runs several times slower on these CPUs (bench/README.md).
    part = _scratch("part", kv * rows * min(full, per_chunk * bs), torch.float32, q.device)
    for start, k in reader.chunks(key_cache, layout, "key", k_scale):
        if form == "tokens":
            m = min(k.shape[0], width - start)
            chunk = part[: kv * rows * m].view(kv, rows, m)
            torch.matmul(qm, k[:m].permute(1, 2, 0), out=chunk)
            scores[:, :, start : start + m] = chunk
        else:  # k: [blocks, kv, bs, D]; the scores of every slot, the unwritten ones cut off below
            nb = k.shape[0]
            chunk = part[: kv * rows * nb * bs].view(nb, kv, rows, bs)
            torch.matmul(qm, k.transpose(2, 3), out=chunk)
            scores[:, :, start : start + nb * bs].view(kv, rows, nb, bs).copy_(chunk.permute(1, 2, 0, 3))
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
    # unnormalised weights, divided out after the value product (see the module doc);
    # the row's top score is finite: key p is always visible to query p
    weights = torch.exp(s - s.amax(-1, keepdim=True)).view(kv, rows, width)
    total = weights.sum(-1, keepdim=True)
    acc = torch.zeros(kv, rows, head_dim, dtype=torch.float32, device=q.device)
    if form == "blocks":  # weights of whole blocks, 0 for the last block's unwritten slots
        padded = torch.zeros(kv, rows, full, dtype=torch.float32, device=q.device)
        padded[:, :, :width] = weights
        products = _scratch("products", min(full // bs, per_chunk) * kv * rows * head_dim, torch.float32, q.device)
        products = products.view(-1, kv, rows, head_dim)
    for start, v in reader.chunks(value_cache, layout, "value", v_scale):
        if form == "tokens":
            m = min(v.shape[0], width - start)
            acc.baddbmm_(weights[:, :, start : start + m], v[:m].transpose(0, 1))
        else:  # one product per (block, KV head), then their sum over the chunk's blocks
            nb = v.shape[0]
            w = padded[:, :, start : start + nb * bs].view(kv, rows, nb, bs).permute(2, 0, 1, 3)
            acc += torch.matmul(w, v, out=products[:nb]).sum(0)
    acc /= total
    return acc.view(kv, q_len, group, head_dim).permute(1, 0, 2, 3).reshape(q_len, num_heads, head_dim)
