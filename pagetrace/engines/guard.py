"""The guard: `check`'s invariants of one step, on the engine's own index tensors, before
the kernel reads them.

`verdict()` is the hot path, run on every step: torch ops on the device the metadata
lives on and one host sync (the final `bool`), no Python loop over requests or tokens.
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
    # each check adds a boolean tensor (True: broken); one `any` over them all at the end
    fails = [qsl[:1] != 0, total.view(1) > rows, total.view(1) < 0, qlen < 0, qlen > lens]
    if num_tokens is not None:
        fails.append(total.view(1) != num_tokens)
    index = torch.arange(rows, device=dev)
    real = index < total
    # per token: its request and position (a broken qsl was flagged above; clamped for safe indexing)
    owner = (torch.searchsorted(qsl[1:].clamp(min=0), index, right=True)).clamp(max=num_reqs - 1)
    pos = lens[owner] - qlen[owner] + (index - qsl[owner])
    logical = torch.div(pos, bs, rounding_mode="floor")
    inside = real & (logical >= 0) & (logical < width)
    want = table[owner, logical.clamp(0, width - 1)] * bs + pos.remainder(bs)
    token_bad = (~real & (slots != slot_padding)) | (inside & (slots != want))  # padding past the real tokens; the slot
    if positions is not None:
        given = positions.to(torch.int64)[:rows]
        token_bad[: given.shape[0]] |= real[: given.shape[0]] & (given != pos[: given.shape[0]])
    fails.append(token_bad)
    # collision: two real tokens on one slot (padding never collides)
    low = torch.iinfo(torch.int64).min
    ordered = torch.sort(torch.where(real & (slots != slot_padding), slots, low)).values
    fails.append((ordered[1:] == ordered[:-1]) & (ordered[1:] != low))
    # the table entries the tokens need: in the pool, and (where visible) not the null block
    need = torch.div(lens + bs - 1, bs, rounding_mode="floor")
    fails.append(need > width)
    j = torch.arange(width, device=dev).view(1, -1)
    used = j < need.view(-1, 1)
    in_pool = (table >= 0) & (table < num_blocks)
    entry_bad = used & ~in_pool
    if null_block is not None:
        # with a window w the first new token, at p = seq_len - query_len, sees the most: keys p - w + 1..p
        # (check.py Checker.visible; a request without new tokens by its last token's window)
        first = lens - qlen.clamp(min=1)
        visible = used if sliding_window is None else used & ((j + 1) * bs > (first - sliding_window + 1).view(-1, 1))
        entry_bad |= visible & (table == null_block)
    fails.append(entry_bad)
    # sharing, by sorting the table's entries (O(E log E) in the E = R x M entries, whatever the
    # pool's size): entries unused, null or outside the pool sort last on a sentinel; equal
    # neighbours are one block in two entries, fine only when every one is the same logical block,
    # full (prefix caching). Neighbours cover a group: equal logical blocks pairwise are equal
    # throughout, and each member of a group of two or more is in a pair. Two entries of one
    # request are two logical blocks, so they differ and are caught too.
    flat = used & in_pool if null_block is None else used & in_pool & (table != null_block)
    sentinel = torch.iinfo(torch.int64).max
    ordered, order = torch.sort(torch.where(flat, table, sentinel).reshape(-1))
    pair = (ordered[1:] == ordered[:-1]) & (ordered[1:] != sentinel)
    if sharing == "none":
        fails.append(pair)
    else:
        ll = j.expand_as(table).reshape(-1)[order]
        full = ((j + 1) * bs <= lens.view(-1, 1)).reshape(-1)[order]
        fails.append(pair & ((ll[1:] != ll[:-1]) | ~full[1:] | ~full[:-1]))
    bad = torch.cat([f.reshape(-1) for f in fails]).any()
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
