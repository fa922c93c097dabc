"""The guard: `check`'s invariants of one step, on the engine's own index tensors, before
the kernel reads them.

`verdict()` is the hot path, run on every step: torch ops on the device the metadata
lives on and one host sync (the final `bool`), no Python loop over requests or tokens.
It covers the index checks of `pagetrace check` (engines/check.py) exactly:

    query       query_start_loc starts at 0, never decreases, no request has more new
                tokens than tokens, ends inside slot_mapping; slot padding is padding
    capacity    each seq_len fits its table row
    pool        every entry a token needs lies in the pool
    null        no visible token on the null block
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


def verdict(query_start_loc, seq_lens, block_table, slot_mapping, *, block_size: int, num_blocks: int,
            null_block: int | None = 0, sharing: str = "full-blocks", positions=None, sliding_window: int | None = None,
            slot_padding: int = -1, num_tokens: int | None = None) -> bool:
    """True when every invariant holds. Tensors as the engine holds them (any int dtype, any
    device): query_start_loc [R + 1], seq_lens [R], block_table [R, M], slot_mapping [>= T]
    (padding after the T = query_start_loc[R] real tokens), positions [>= T] or None;
    num_tokens: the engine's count of real tokens (vLLM's num_actual_tokens), T must equal it."""
    import torch

    dev = block_table.device
    num_reqs = int(seq_lens.shape[0])
    if num_reqs == 0:
        return True
    qsl = query_start_loc[: num_reqs + 1].to(torch.int64)
    lens = seq_lens[:num_reqs].to(torch.int64)
    table = block_table[:num_reqs].to(torch.int64)
    slots = slot_mapping.to(torch.int64)
    width, rows = table.shape[1], slots.shape[0]
    bs = block_size
    qlen = qsl[1:] - qsl[:-1]
    total = qsl[-1]
    bad = (qsl[0] != 0) | (qlen < 0).any() | (qlen > lens).any() | (total > rows) | (total < 0)
    if num_tokens is not None:
        bad |= total != num_tokens
    index = torch.arange(rows, device=dev)
    bad |= ((index >= total) & (slots != slot_padding)).any()  # padding past the real tokens
    # per token: its request and position (a broken qsl was flagged above; clamped for safe indexing)
    owner = (torch.searchsorted(qsl[1:].clamp(min=0), index, right=True)).clamp(max=num_reqs - 1)
    real = index < total
    pos = lens[owner] - qlen[owner] + (index - qsl[owner])
    if positions is not None:
        given = positions.to(torch.int64)[:rows]
        bad |= (real[: given.shape[0]] & (given != pos[: given.shape[0]])).any()
    logical = torch.div(pos, bs, rounding_mode="floor")
    inside = real & (logical >= 0) & (logical < width)
    want = table[owner, logical.clamp(0, width - 1)] * bs + pos.remainder(bs)
    bad |= (inside & (slots != want)).any()
    # collision: two real tokens on one slot (padding never collides)
    written = torch.where(real & (slots != slot_padding), slots, torch.full_like(slots, torch.iinfo(torch.int64).min))
    ordered = torch.sort(written).values
    bad |= ((ordered[1:] == ordered[:-1]) & (ordered[1:] != torch.iinfo(torch.int64).min)).any()
    # the table entries the tokens need
    need = torch.div(lens + bs - 1, bs, rounding_mode="floor")
    bad |= (need > width).any()
    j = torch.arange(width, device=dev).view(1, -1)
    used = j < need.view(-1, 1)
    bad |= (used & ((table < 0) | (table >= num_blocks))).any()
    if null_block is not None:
        visible = used if sliding_window is None else used & ((j + 1) * bs > (lens - sliding_window).view(-1, 1))
        bad |= (visible & (table == null_block)).any()
    # sharing: used, non-null entries sorted by (block, request); neighbours in one block must agree
    keep = used if null_block is None else used & (table != null_block)
    req = torch.arange(num_reqs, device=dev).view(-1, 1).expand_as(table)
    blk, rr, ll = table[keep], req[keep], j.expand_as(table)[keep]
    full = (ll + 1) * bs <= lens[rr]
    key = blk.clamp(0, num_blocks) * num_reqs + rr
    order = torch.argsort(key)
    blk, rr, ll, full, key = blk[order], rr[order], ll[order], full[order], key[order]
    same_block = blk[1:] == blk[:-1]
    twice = key[1:] == key[:-1]  # one request holds the block twice
    if sharing == "none":
        bad |= same_block.any()
    else:
        bad |= (same_block & (twice | (ll[1:] != ll[:-1]) | ~full[1:] | ~full[:-1])).any()
    return not bool(bad)


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
    from ..layouts import LAYOUTS
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
