"""Today's `guard.verdict` (64 ops a decode step, issue 29) against the verdict before it
(bench/guard_before.py, frozen: about 130 ops, every tensor widened to int64, masks over every
row): the same boolean on random steps, clean and broken, and on steps planted at each
boundary. The cut verdict drops masks where one failing check implies another (e.g. a token
outside its table row is a capacity or query violation already), so a step where only the
dropped mask would have mattered is exactly what these steps reach for: tokens past the row,
entries one past the pool, the null block, block multiples, one request, one token, no
padding, sliding windows, narrow dtypes, a token count the tensors disagree with. Its
per-shape constants are kept across calls, so the random steps also run it on shapes that
shrink and grow between calls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagetrace.engines.guard import verdict

_spec = importlib.util.spec_from_file_location("guard_before", Path(__file__).resolve().parents[2] / "bench" / "guard_before.py")
_before = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_before)
verdict_before = _before.verdict_before


def both(t, **kw):
    """(today's verdict, the one before): today's on both its paths, torch ops and numpy on the
    host, which must agree."""
    args = (t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"])
    kw = dict(kw, positions=t.get("positions"))
    on_host, by_torch = verdict(*args, **kw, path="host"), verdict(*args, **kw, path="torch")
    assert on_host == by_torch, ("host", on_host, "torch", by_torch)
    return on_host, verdict_before(*args, **kw)


def clean_step(lens, qlens, *, bs, pool, width, shared, rng, null_block=0, pad=2, window=None):
    """A step as vLLM builds it: each request's blocks drawn from the pool without the null
    block, a full first block shared by every request that holds it unwritten (prefix caching);
    with a window, the blocks wholly outside every new token's window are the null block."""
    free = [b for b in range(pool) if b != null_block]
    rng.shuffle(free)
    common = free.pop() if shared and free else None
    tables = []
    for L, q in zip(lens, qlens):
        need = -(-L // bs)
        row = [free.pop() if free else 1 for _ in range(need)]
        if common is not None and L - q >= bs:
            row[0] = common
        if window is not None and null_block is not None:
            seen = L - max(q, 1) - window + 1  # the first new token's window starts here
            row = [null_block if (c + 1) * bs <= seen else b for c, b in enumerate(row)]
        tables.append(row + [null_block or 0] * (width - need))
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    positions = [p for L, q in zip(lens, qlens) for p in range(L - q, L)]
    owners = [r for r, q in enumerate(qlens) for _ in range(q)]
    slots = [tables[r][p // bs] * bs + p % bs for r, p in zip(owners, positions)]
    return {"query_start_loc": torch.tensor(qsl), "seq_lens": torch.tensor(lens),
            "block_table": torch.tensor(tables).reshape(len(lens), width),
            "slot_mapping": torch.tensor(slots + [-1] * pad), "positions": torch.tensor(positions + [0] * pad)}


@st.composite
def cases(draw):
    bs = draw(st.sampled_from([1, 2, 4, 16]))
    n = draw(st.integers(1, 6))
    # lengths at and around block multiples
    lens = [max(1, draw(st.integers(0, 4)) * bs + draw(st.sampled_from([-1, 0, 0, 1, 2]))) for _ in range(n)]
    qlens = [draw(st.sampled_from([0, 1, 1, L, draw(st.integers(0, L))])) for L in lens]
    width = max(-(-L // bs) for L in lens) + draw(st.integers(0, 2))
    pool = sum(-(-L // bs) for L in lens) + 2 + draw(st.integers(0, 3))
    null_block = draw(st.sampled_from([0, 0, None]))
    window = draw(st.sampled_from([None, None, 1, bs, 2 * bs + 1]))
    rng = draw(st.randoms(use_true_random=False))
    t = clean_step(lens, qlens, bs=bs, pool=pool, width=width, shared=draw(st.booleans()), rng=rng, null_block=null_block,
                   pad=draw(st.integers(0, 3)), window=window)
    for _ in range(draw(st.integers(0, 2))):  # up to two planted bugs, anywhere, at the boundaries
        which = draw(st.sampled_from(["query_start_loc", "seq_lens", "block_table", "slot_mapping", "positions"]))
        flat = t[which].view(-1)
        if flat.numel() == 0:
            continue
        i = draw(st.integers(0, flat.numel() - 1))
        flat[i] = draw(st.sampled_from([flat[i] + 1, flat[i] - 1, flat[i] + bs, flat[i] - bs, pool, pool - 1, -1, 0, null_block or 0,
                                        pool * bs, width * bs, width * bs + 1, 5_000_000, 2**31 - 1]))
    total = int(t["query_start_loc"][-1])
    num_tokens = draw(st.sampled_from([None, total, total, total + 1, total - 1]))
    if draw(st.integers(0, 4)) == 0:  # positions shorter or longer than the tokens, or none
        t["positions"] = draw(st.sampled_from([None, t["positions"][: max(total - 1, 0)], torch.cat([t["positions"], t["positions"]])]))
    dtype = draw(st.sampled_from([torch.int32, torch.int32, torch.int64, torch.int16]))
    for k in ("query_start_loc", "seq_lens", "block_table"):
        if dtype != torch.int16 or bool((t[k].abs() < 2**15).all()):
            t[k] = t[k].to(dtype)
    if draw(st.booleans()):
        t["slot_mapping"] = t["slot_mapping"].to(torch.int32)
    if draw(st.integers(0, 5)) == 0:  # buffers sized for more requests than the step has (vLLM's persistent ones)
        t["query_start_loc"] = torch.cat([t["query_start_loc"], t["query_start_loc"][-1:].repeat(2)])
        t["block_table"] = torch.cat([t["block_table"], torch.full((2, width), 99, dtype=t["block_table"].dtype)])
    kw = dict(block_size=bs, num_blocks=pool, null_block=null_block, sharing=draw(st.sampled_from(["full-blocks", "none"])),
              sliding_window=window, num_tokens=num_tokens)
    return t, kw


@settings(max_examples=1500, deadline=None)
@given(cases())
def test_the_verdict_is_the_same_as_before_on_random_and_planted_steps(case):
    t, kw = case
    new, old = both(t, **kw)
    assert new == old, (t, kw)


def test_the_random_steps_reach_both_verdicts():
    """The property above means something only if its steps are clean and broken alike."""
    import random

    seen = set()
    for seed in range(40):
        rng = random.Random(seed)
        t = clean_step([5, 9, 3], [5, 1, 1], bs=4, pool=12, width=3, shared=True, rng=rng)
        seen.add(both(t, block_size=4, num_blocks=12, num_tokens=7))
        t["block_table"][rng.randrange(3), 0] = 12
        seen.add(both(t, block_size=4, num_blocks=12, num_tokens=7))
    assert seen == {(True, True), (False, False)}


def base(bs=4):
    # r0 a prefill of 8 tokens (two full blocks), r1 a decode of token 4 (its block 1 starts), one padding slot
    return {"query_start_loc": torch.tensor([0, 8, 9], dtype=torch.int32), "seq_lens": torch.tensor([8, 5], dtype=torch.int32),
            "block_table": torch.tensor([[2, 3, 0], [4, 5, 0]], dtype=torch.int32),
            "slot_mapping": torch.tensor([8, 9, 10, 11, 12, 13, 14, 15, 20, -1]), "positions": torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 4, 0])}


def plant(t, key, index, value):
    t = {k: v.clone() for k, v in t.items()}
    t[key][index] = value
    return t


@pytest.mark.parametrize("edit,ok", [
    (None, True),
    (("block_table", (1, 1), 6), False),  # one past the pool of 6 blocks
    (("block_table", (1, 1), 5_000_000), False),
    (("block_table", (1, 1), -1), False),
    (("block_table", (0, 0), 0), False),  # the null block under a visible token
    (("block_table", (1, 2), 6), True),  # past the tokens' blocks: never read
    (("slot_mapping", 8, 21), False),
    (("slot_mapping", 8, 15), False),  # r0's slot: a collision too
    (("slot_mapping", 9, 0), False),  # padding that is not padding
    (("seq_lens", 1, 12), False),  # 12 tokens fill the row's 3 blocks exactly, the decode token on the null column
    (("seq_lens", 1, 13), False),  # one past the row
    (("query_start_loc", 2, 10), False),  # ends past the engine's 9 tokens
    (("positions", 8, 3), False),
    (("positions", 9, 7), True),  # padding's position: not read
])
def test_planted_steps_at_each_boundary(edit, ok):
    t = base() if edit is None else plant(base(), *edit)
    assert both(t, block_size=4, num_blocks=6, num_tokens=9) == (ok, ok)


def test_one_request_one_token_no_padding_and_an_empty_batch():
    t = {"query_start_loc": torch.tensor([0, 1], dtype=torch.int32), "seq_lens": torch.tensor([1], dtype=torch.int32),
         "block_table": torch.tensor([[3]], dtype=torch.int32), "slot_mapping": torch.tensor([12]), "positions": torch.tensor([0])}
    assert both(t, block_size=4, num_blocks=4, num_tokens=1) == (True, True)
    assert both(plant(t, "block_table", (0, 0), 4), block_size=4, num_blocks=4, num_tokens=1) == (False, False)  # one past
    assert both(t, block_size=4, num_blocks=4, num_tokens=2) == (False, False)
    assert both(t, block_size=4, num_blocks=4, num_tokens=0) == (False, False)
    empty = {"query_start_loc": torch.tensor([0], dtype=torch.int32), "seq_lens": torch.zeros(0, dtype=torch.int32),
             "block_table": torch.zeros(0, 4, dtype=torch.int32), "slot_mapping": torch.tensor([-1, -1]), "positions": torch.zeros(2, dtype=torch.int64)}
    assert both(empty, block_size=4, num_blocks=4, num_tokens=0) == (True, True)


def test_shapes_that_shrink_and_grow_between_calls_use_constants_of_their_own():
    """The aranges and sentinels kept across steps: a step after a bigger one and after a
    smaller one, on another table width, block size and dtype, reads what it must."""
    t = base()
    for bs_t in (t, {k: v.to(torch.int64) for k, v in t.items()}):
        assert both(bs_t, block_size=4, num_blocks=6, num_tokens=9) == (True, True)
    big = clean_step([300] * 40, [1] * 40, bs=16, pool=800, width=20, shared=True, rng=__import__("random").Random(1))
    assert both(big, block_size=16, num_blocks=800, num_tokens=40) == (True, True)
    for _ in range(2):
        assert both(plant(base(), "block_table", (1, 1), 6), block_size=4, num_blocks=6, num_tokens=9) == (False, False)
        assert both(base(), block_size=4, num_blocks=6, num_tokens=9) == (True, True)
