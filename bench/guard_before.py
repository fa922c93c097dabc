"""The guard's verdict as it was before its fixed cost was cut (issue 29; pagetrace commit
2ce1055, pagetrace/engines/guard.py `verdict`): about 130 torch ops a step (258 in
torch.profiler's count, nested ones included), every index tensor widened to int64, a mask
over every row of slot_mapping. bench/bench_guard.py --fixed times it beside today's `verdict`
in the same run, as the baseline, and tests/engines/test_guard_before.py holds today's verdict
to it on random and planted steps."""

from __future__ import annotations


def verdict_before(query_start_loc, seq_lens, block_table, slot_mapping, *, block_size: int, num_blocks: int,
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
