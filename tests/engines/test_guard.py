"""The guard on hand-built metadata: each invariant, each planted bug, named exactly.

The step (block size 4, a pool of 16 blocks, the 'vllm-cpu' layout with 2 KV heads of
head_dim 8 in bf16, prefix caching on):

    r0  a prefill of 6 tokens (positions 0..5)   table [3, 4]      slots 12..17
    r1  a decode, seq_len 9 (position 8)          table [1, 2, 5]   slot 20
    r2  a decode, seq_len 5 (position 4)          table [1, 6]      slot 24
    block 1 is r1's and r2's full logical block 0 (a shared prefix); two padding slots.

The bytes are written out here from the layout's definition (per (block, head) page of
2 x bs x D elements, K column-major: slot s, dim 0 of KV head 0 at element s), not taken
from pagetrace's layout table. `verdict` (torch, vectorised) is held to `check`'s rules on
random metadata with random bugs: it is clean exactly when check names nothing.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagetrace.engines.guard import as_step, line, manifest, name
from pagetrace.engines.guard import verdict as _verdict


def verdict(*args, **kw):
    """The guard's verdict on both its paths (torch ops; numpy on the host), which must agree."""
    on_host, by_torch = _verdict(*args, **kw, path="host"), _verdict(*args, **kw, path="torch")
    assert on_host == by_torch, ("host", on_host, "torch", by_torch)
    return on_host
from pagetrace.engines.vllm import client_id

BS, POOL, KVH, D = 4, 16, 2, 8
REQS = ["cmpl-a-0", "cmpl-b-0", "cmpl-c-0"]


def base():
    return {
        "query_start_loc": torch.tensor([0, 6, 7, 8], dtype=torch.int32),
        "seq_lens": torch.tensor([6, 9, 5], dtype=torch.int32),
        "block_table": torch.tensor([[3, 4, 0, 0], [1, 2, 5, 0], [1, 6, 0, 0]], dtype=torch.int32),
        "slot_mapping": torch.tensor([12, 13, 14, 15, 16, 17, 20, 24, -1, -1], dtype=torch.int64),
        "positions": torch.tensor([0, 1, 2, 3, 4, 5, 8, 4, 0, 0], dtype=torch.int64),
    }


def key_byte(physical: int, offset: int) -> int:
    """bf16 byte of (physical block, slot offset, KV head 0, dim 0)'s key, by hand: a record's
    byte is that of the slot it names (check.py)."""
    return (physical * KVH * 2 * BS * D + offset) * 2


def run(t, sharing="full-blocks", num_tokens=8):
    ok = verdict(t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"], block_size=BS, num_blocks=POOL,
                 sharing=sharing, positions=t["positions"], num_tokens=num_tokens)
    m = manifest(layout="vllm-cpu", num_blocks=POOL, block_size=BS, num_heads=4, num_kv_heads=KVH, head_dim=D, dtype="bf16", sharing=sharing)
    from types import SimpleNamespace

    from pagetrace.engines.vllm import step_tensors

    md = SimpleNamespace(**{k: v for k, v in t.items() if k != "positions"})
    n = int(t["query_start_loc"][-1])
    found = name(m, as_step(7, REQS[: t["seq_lens"].shape[0]], step_tensors(md, BS, t["positions"][:n])), num_tokens)
    return ok, found


def fields(v):
    return (v.check, v.request, v.token, v.logical_block, v.physical_block, v.slot, v.byte)


def test_a_clean_step_reports_nothing():
    ok, found = run(base())
    assert ok and found == []


def test_a_bad_slot_is_named():
    t = base()
    t["slot_mapping"][6] = 21  # r1's token 8 one slot further
    ok, found = run(t)
    assert not ok and [fields(v) for v in found] == [("slot", "cmpl-b-0", 8, 2, 5, 21, key_byte(5, 1))]
    assert line(found[0]) == ("pagetrace guard: step 7 · slot · request cmpl-b-0 · token 8 · logical block 2 · physical block 5 · slot 21 · "
                              f"byte {key_byte(5, 1)}: slot_mapping[6] = 21; block table gives 5 x 4 + 0 = 20")


def test_a_table_entry_pointing_into_another_request_is_named():
    t = base()
    t["block_table"][2, 1] = 4  # r2's block for position 4 is r0's (half-full) block 4
    ok, found = run(t)
    assert not ok
    assert [fields(v) for v in found] == [
        ("slot", "cmpl-c-0", 4, 1, 4, 24, key_byte(6, 0)),  # the engine writes slot 24 (block 6); the table says block 4
        ("sharing", "cmpl-a-0", 4, 1, 4, 16, key_byte(4, 0)),  # only full blocks are shared: r0 fills 2 of 4
        ("sharing", "cmpl-c-0", 4, 1, 4, 16, key_byte(4, 0)),  # and r2 1 of 4
    ]


def test_a_partly_filled_block_in_two_tables_is_named():
    t = base()
    t["block_table"][1, 1] = 6  # r1's full logical block 1 on r2's block 6, which r2 fills 1 of 4 and writes now
    ok, found = run(t)
    assert not ok and [fields(v) for v in found] == [("sharing", "cmpl-c-0", 4, 1, 6, 24, key_byte(6, 0))]


def test_a_partly_filled_block_is_named_whichever_table_comes_first():
    """The sharing check sorts the table's entries: the partly filled holder first (r0, row 0) as
    well as last (above) must be caught."""
    t = base()
    t["block_table"][1, 1] = 4  # r1's full logical block 1 on r0's block 4, which r0 fills 2 of 4 (tokens 4, 5)
    ok, found = run(t)
    assert not ok and [fields(v)[:5] for v in found] == [("sharing", "cmpl-a-0", 4, 1, 4)]


def test_a_table_entry_outside_the_pool_is_named():
    t = base()
    t["block_table"][1, 1] = POOL  # r1's logical block 1 (tokens 4..7) past the pool's 16 blocks
    ok, found = run(t)
    assert not ok and [fields(v) for v in found] == [("pool", "cmpl-b-0", 4, 1, POOL, POOL * BS, None)]


def test_the_null_block_under_a_used_logical_block_is_named():
    t = base()
    t["block_table"][0, 1] = 0  # r0's tokens 4, 5 on vLLM's null block
    ok, found = run(t)
    assert not ok
    assert [fields(v) for v in found] == [
        ("null", "cmpl-a-0", 4, 1, 0, 0, key_byte(0, 0)),
        ("slot", "cmpl-a-0", 4, 1, 0, 16, key_byte(4, 0)),  # the byte of the slot written, block 4
        ("slot", "cmpl-a-0", 5, 1, 0, 17, key_byte(4, 1)),
    ]


def test_two_requests_writing_one_slot_is_a_collision():
    t = base()
    t["slot_mapping"][7] = 20  # r2 writes r1's slot
    ok, found = run(t)
    assert not ok
    assert [fields(v) for v in found] == [("slot", "cmpl-c-0", 4, 1, 6, 20, key_byte(5, 0)), ("collision", "cmpl-c-0", 4, 1, 5, 20, key_byte(5, 0))]


def test_a_position_that_is_not_the_sequences_is_named():
    t = base()
    t["positions"][7] = 3
    ok, found = run(t)
    assert not ok and [fields(v)[:3] for v in found] == [("position", "cmpl-c-0", 4)]


def test_a_block_twice_in_one_table_is_named():
    t = base()
    t["block_table"][1, 1] = 1  # r1's logical blocks 0 and 1 both on block 1
    ok, found = run(t)
    assert not ok and ("sharing", "cmpl-b-0", 4, 1, 1) in [fields(v)[:5] for v in found]


def test_sharing_without_prefix_caching_is_named():
    ok, found = run(base(), sharing="none")
    assert not ok and [fields(v)[:5] for v in found] == [("sharing", "cmpl-c-0", 0, 0, 1)]


@pytest.mark.parametrize("edit,check", [
    (lambda t: t["query_start_loc"].__setitem__(0, 1), "query"),
    (lambda t: t["query_start_loc"].__setitem__(1, 8), "query"),  # decreasing: 8 then 7
    (lambda t: t["slot_mapping"].__setitem__(8, 5), "query"),  # padding that is not padding
    (lambda t: t["seq_lens"].__setitem__(1, 17), "capacity"),  # 17 tokens need 5 blocks; the row has 4
])
def test_broken_lengths_are_named(edit, check):
    t = base()
    edit(t)
    ok, found = run(t)
    assert not ok and check in {v.check for v in found}


def test_query_start_loc_must_end_at_the_engines_token_count():
    ok, found = run(base(), num_tokens=9)
    assert not ok and [v.check for v in found] == ["query"]


def test_a_full_shared_prefix_and_padding_are_clean_at_exact_boundaries():
    t = base()
    t["seq_lens"][2] = 4  # r2 at exactly one full block: its decode token is position 3, in shared block 1
    t["positions"][7] = 3
    t["slot_mapping"][7] = 1 * BS + 3
    t["block_table"][2, 1] = 0  # past its one used block: padding, never read
    ok, found = run(t)
    # r2 now writes into the shared block 1: allowed (prefix caching recomputes a cached block's last token)
    assert ok and found == []


def test_client_ids_drop_vllms_random_suffix():
    assert client_id("cmpl-load3-0-a12eca2a") == "cmpl-load3-0"
    assert client_id("0-92bb6aed") == "0"
    assert client_id("my-id") == "my-id" and client_id("cmpl-x-0-A12ECA2A") == "cmpl-x-0-A12ECA2A"


@st.composite
def steps(draw):
    """Random steps: up to 4 requests, prefill/decode/chunks, a shuffled pool, optional
    shared prefix blocks; then maybe one bug in one tensor."""
    n = draw(st.integers(1, 4))
    lens = [draw(st.integers(1, 12)) for _ in range(n)]  # at most 3 blocks each: 4 x 3 + a shared one fit the 15 non-null blocks
    qlens = [draw(st.integers(1, L)) for L in lens]
    width = 4
    pool = list(range(1, POOL))
    draw(st.randoms(use_true_random=False)).shuffle(pool)
    tables = []
    shared = pool.pop() if draw(st.booleans()) else None
    for L in lens:
        need = -(-L // BS)
        row = [pool.pop() for _ in range(need)]
        first_new = L - qlens[len(tables)]
        if shared is not None and L > BS and first_new >= BS:  # block 0 full and not written this step
            row[0] = shared
        tables.append(row + [0] * (width - need))
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    positions = [p for L, q in zip(lens, qlens) for p in range(L - q, L)]
    owners = [r for r, q in enumerate(qlens) for _ in range(q)]
    slots = [tables[r][p // BS] * BS + p % BS for r, p in zip(owners, positions)]
    t = {
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32), "seq_lens": torch.tensor(lens, dtype=torch.int32),
        "block_table": torch.tensor(tables, dtype=torch.int32), "slot_mapping": torch.tensor(slots + [-1, -1], dtype=torch.int64),
        "positions": torch.tensor(positions + [0, 0], dtype=torch.int64),
    }
    which = draw(st.sampled_from([None, "query_start_loc", "seq_lens", "block_table", "slot_mapping", "positions"]))
    if which is not None:
        flat = t[which].view(-1)
        i = draw(st.integers(0, flat.numel() - 1))
        flat[i] = flat[i] + draw(st.sampled_from([-5, -1, 1, 2, POOL]))
    return t, which


@settings(max_examples=300, deadline=None)
@given(steps())
def test_the_vectorised_guard_agrees_with_check(case):
    """Clean by the vectorised verdict exactly when check's rules name nothing."""
    t, _ = case
    # a broken query_start_loc may disagree with the token count: give the engine's count as the tensors say
    n = int(t["query_start_loc"][-1])
    if not 0 <= n <= t["slot_mapping"].shape[0] or (t["query_start_loc"][1:] < t["query_start_loc"][:-1]).any() or int(t["query_start_loc"][0]) != 0:
        ok = verdict(t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"], block_size=BS, num_blocks=POOL, positions=t["positions"])
        assert not ok
        return
    REQS.extend(f"r{i}" for i in range(len(REQS), 4))
    ok, found = run(t, num_tokens=n)
    assert ok == (found == []), (t, [fields(v) for v in found])


# -- each invariant at its exact boundary, held to check's rules ----------------------------


def judged(t, *, bs=BS, pool=POOL, null_block=0, sharing="full-blocks", window=None, num_tokens=None):
    """The verdict and check's names for one step, tensors as the engine holds them (buffers
    longer than the step's requests included: vLLM's are sized for max_num_seqs)."""
    from types import SimpleNamespace

    from pagetrace.engines.vllm import step_tensors

    ok = verdict(t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"], block_size=bs, num_blocks=pool, null_block=null_block,
                 sharing=sharing, positions=t["positions"], sliding_window=window, num_tokens=num_tokens)
    m = manifest(layout="vllm-cpu", num_blocks=pool, block_size=bs, num_heads=KVH, num_kv_heads=KVH, head_dim=D, dtype="bf16", sharing=sharing,
                 null_block=null_block, sliding_window=window)
    r = t["seq_lens"].shape[0]
    n = int(t["query_start_loc"][r]) if r else 0
    md = SimpleNamespace(**{k: v for k, v in t.items() if k != "positions"})
    found = name(m, as_step(0, [f"r{i}" for i in range(r)], step_tensors(md, bs, t["positions"][:n])), num_tokens)
    return ok, [v.check for v in found]


def step(qsl, lens, table, slots, positions, dtype=torch.int32, slot_dtype=torch.int64):
    return {"query_start_loc": torch.tensor(qsl, dtype=dtype), "seq_lens": torch.tensor(lens, dtype=dtype),
            "block_table": torch.tensor(table, dtype=dtype).reshape(len(table), -1 if table else 4),
            "slot_mapping": torch.tensor(slots, dtype=slot_dtype), "positions": torch.tensor(positions, dtype=torch.int64)}


def test_a_step_without_requests_is_clean():
    assert judged(step([0], [], [], [-1, -1], [])) == (True, [])


def test_requests_without_new_tokens_are_clean():
    # r0 holds 5 tokens and computes none this step; r1 decodes its token 2 on block 3
    assert judged(step([0, 0, 1], [5, 3], [[1, 2, 0, 0], [3, 0, 0, 0]], [14, -1], [2, 0])) == (True, [])
    # no request computes a token: query_start_loc ends at 0
    assert judged(step([0, 0], [5], [[1, 2, 0, 0]], [-1, -1], [0, 0]), num_tokens=0) == (True, [])


def test_a_slot_mapping_exactly_as_long_as_the_tokens_is_clean():
    t = base()
    t["slot_mapping"], t["positions"] = t["slot_mapping"][:8], t["positions"][:8]  # no padding row
    assert judged(t, num_tokens=8) == (True, [])


def test_buffers_sized_for_more_requests_than_the_step_has_are_read_to_its_requests():
    """vLLM's query_start_loc and block table are persistent buffers of max_num_seqs rows: past
    the step's requests, query_start_loc repeats its end and the table rows are stale."""
    t = base()
    t["query_start_loc"] = torch.tensor([0, 6, 7, 8, 8, 8], dtype=torch.int32)
    t["block_table"] = torch.cat([t["block_table"], torch.full((2, 4), 99, dtype=torch.int32)])
    assert judged(t, num_tokens=8) == (True, [])


def test_a_table_row_used_to_its_last_column_is_clean():
    # 16 tokens fill the row's 4 blocks exactly; the decode token 15 is in the last column; a prefill of 16 too
    assert judged(step([0, 1], [16], [[1, 2, 3, 4]], [4 * BS + 3], [15])) == (True, [])
    assert judged(step([0, 16], [16], [[1, 2, 3, 4]], [b * BS + o for b in (1, 2, 3, 4) for o in range(BS)], list(range(16)))) == (True, [])
    # one token more needs a fifth block the row does not have
    ok, found = judged(step([0, 1], [17], [[1, 2, 3, 4]], [5 * BS], [16]))
    assert not ok and found == ["capacity"]


def test_block_zero_is_a_block_like_any_other_without_a_null_block():
    """SGLang and FlashInfer have no null block: block 0 holds tokens."""
    t = step([0, 6], [6], [[0, 1, 0, 0]], [0, 1, 2, 3, 4, 5], list(range(6)))
    assert judged(t, null_block=None) == (True, [])
    ok, found = judged(t)  # with vLLM's null block 0 the same table reads the null block
    assert not ok and found == ["null"]


def test_the_null_block_under_a_block_not_written_this_step_is_found():
    """r1 decodes token 8; its logical block 0 (tokens 0..3, written steps ago) is the null
    block: no slot of this step is wrong, only the null check sees it."""
    t = base()
    t["block_table"][1, 0] = 0
    ok, found = judged(t, num_tokens=8)
    assert not ok and found == ["null"]


@pytest.mark.parametrize("window,qlen,table,found", [
    # a decode of token 11 with a window of 4 sees tokens 8..11: logical block 2 only
    (4, 1, [0, 0, 5, 0], []),
    (5, 1, [0, 0, 5, 0], ["null"]),  # a window of 5 sees token 7, in logical block 1: one token past the boundary
    (9, 1, [0, 6, 5, 0], ["null"]),  # tokens 3..11: block 0 holds token 3
    (8, 1, [0, 6, 5, 0], []),  # tokens 4..11: block 0 is outside, exactly
    (8, 1, [7, 0, 5, 0], ["null"]),
    # a chunk of tokens 8..11: its first token, 8, sees 5..8 with a window of 4 (check.py Checker.visible)
    (4, 4, [0, 0, 5, 0], ["null"]),
    (4, 4, [0, 6, 5, 0], []),  # token 8 sees 5..8: block 0 (tokens 0..3) outside
    (5, 4, [0, 6, 5, 0], []),  # tokens 4..8: block 0 outside, exactly
    (6, 4, [0, 6, 5, 0], ["null"]),  # tokens 3..8: block 0 holds token 3
])
def test_the_null_block_outside_a_sliding_window_is_allowed_and_inside_it_is_not(window, qlen, table, found):
    positions = list(range(12 - qlen, 12))
    slots = [table[p // BS] * BS + p % BS for p in positions]
    ok, names = judged(step([0, qlen], [12], [table], slots + [-1], positions + [0]), window=window)
    assert (ok, names) == (found == [], found)


def test_two_requests_recomputing_one_slot_of_a_shared_block_collide():
    """Two identical 4-token prompts share their full block 1 (prefix caching) and both
    recompute its last token, 3: both write slot 7."""
    ok, found = judged(step([0, 1, 2], [4, 4], [[1, 0, 0, 0], [1, 0, 0, 0]], [7, 7, -1], [3, 3, 0]))
    assert not ok and found == ["collision"]
    # one of them alone is clean: prefix caching's recompute of a cached block's token
    assert judged(step([0, 1], [4], [[1, 0, 0, 0]], [7, -1], [3, 0])) == (True, [])


def test_narrow_index_dtypes_are_widened_before_any_arithmetic():
    """A 32,760-token request in int16 tensors (a 32k context), blocks of 16 from a pool of
    4,096: seq_len + 15 and block x 16 pass int16's 32,767, so the guard must widen first."""
    bs, pool, width = 16, 4096, 2048
    row = list(range(pool - width, pool))  # blocks 2048..4095; the decode token 32,759 is on block 4095
    t = {"query_start_loc": torch.tensor([0, 1], dtype=torch.int16), "seq_lens": torch.tensor([32760], dtype=torch.int16),
         "block_table": torch.tensor([row], dtype=torch.int16), "slot_mapping": torch.tensor([4095 * bs + 7, -1], dtype=torch.int32),
         "positions": torch.tensor([32759, 0], dtype=torch.int16)}
    assert judged(t, bs=bs, pool=pool, num_tokens=1) == (True, [])
    t["block_table"][0, 0] = 0  # logical block 0 on the null block
    ok, found = judged(t, bs=bs, pool=pool, num_tokens=1)
    assert not ok and found == ["null"]


def test_far_more_new_tokens_than_tokens_is_a_violation_not_a_crash():
    # 100 new tokens of a 1-token sequence: positions -99..0 index far before the table's first column
    t = step([0, 100], [1], [[1, 0, 0, 0]], [4] * 100, [0] * 100)
    assert verdict(t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"], block_size=BS, num_blocks=POOL) is False


def test_a_token_count_the_engine_disagrees_with_is_named_field_by_field():
    ok, found = run(base(), num_tokens=9)
    assert not ok and [fields(v) + (v.step, v.message) for v in found] == [
        ("query", None, None, None, None, None, None, 7, "query_start_loc ends at 8; the engine counts 9 real tokens")]
    assert line(found[0]) == "pagetrace guard: step 7 · query: query_start_loc ends at 8; the engine counts 9 real tokens"


def test_positions_the_engine_did_not_give_are_named_as_wrong_positions():
    """The model's positions cover r0's 6 tokens only: r1's and r2's are missing, read as -1."""
    from types import SimpleNamespace

    from pagetrace.engines.vllm import step_tensors

    t = base()
    tensors = step_tensors(SimpleNamespace(**{k: v for k, v in t.items() if k != "positions"}), BS, t["positions"][:8])
    tensors["positions"] = tensors["positions"][:6]
    m = manifest(layout="vllm-cpu", num_blocks=POOL, block_size=BS, num_heads=4, num_kv_heads=KVH, head_dim=D, dtype="bf16", sharing="full-blocks")
    found = name(m, as_step(7, REQS[:3], tensors), 8)
    assert [(v.check, v.request, v.token, v.message) for v in found] == [
        ("position", "cmpl-b-0", 8, "positions[6] = -1; new token 0 of a 9-token sequence is at 8"),
        ("position", "cmpl-c-0", 4, "positions[7] = -1; new token 0 of a 5-token sequence is at 4"),
    ]


def test_the_guard_names_no_page_missing_and_no_dtype():
    """The engine's tensors are what they are (int32 and int16, not the bundle's dtypes), and
    the guard stores no page: neither is a violation of the step."""
    from types import SimpleNamespace

    from pagetrace.engines.vllm import step_tensors

    t = base()
    t = {k: v.to(torch.int16) for k, v in t.items()}
    tensors = step_tensors(SimpleNamespace(**{k: v for k, v in t.items() if k != "positions"}), BS, t["positions"][:8])
    tensors["blocks"] = tensors["blocks"][:0]
    m = manifest(layout="vllm-cpu", num_blocks=POOL, block_size=BS, num_heads=4, num_kv_heads=KVH, head_dim=D, dtype="bf16", sharing="full-blocks")
    assert name(m, as_step(7, REQS[:3], tensors), 8) == []
    tensors["slot_mapping"][0] = 13  # and a real violation is still named
    assert [v.check for v in name(m, as_step(7, REQS[:3], tensors), 8)] == ["slot", "collision"]


def test_two_requests_with_the_null_block_outside_their_windows_share_nothing():
    """vLLM frees the blocks that slid out of a window to its null block: two requests both
    holding it is no shared block."""
    # both decode token 11 (window 4: tokens 8..11, logical block 2); logical blocks 0, 1 are the null block
    t = step([0, 1, 2], [12, 12], [[0, 0, 5, 0], [0, 0, 6, 0]], [5 * BS + 3, 6 * BS + 3, -1], [11, 11, 0])
    assert judged(t, window=4, sharing="none") == (True, [])


@pytest.mark.parametrize("window,found", [(4, []), (5, ["null"])])
def test_a_request_without_new_tokens_is_judged_by_its_last_tokens_window(window, found):
    # r0 holds 12 tokens and computes none: its last token, 11, sees 8..11 (window 4) or 7..11 (window 5)
    t = step([0, 0, 1], [12, 3], [[0, 0, 5, 0], [3, 0, 0, 0]], [14, -1], [2, 0])
    ok, names = judged(t, window=window)
    assert (ok, names) == (found == [], found)


# -- the host copies the guard reads (guard.host_tensors) ------------------------------------


class Buffer:
    """vLLM's CpuGpuBuffer (v1/utils.py): a host tensor and its device copy. Here both live on
    the CPU as two tensors, standing for a GPU's pair (on vLLM's CPU runner they are one)."""

    def __init__(self, values, *, one=False):
        self.cpu = torch.tensor(values, dtype=torch.int32)
        self.gpu = self.cpu if one else self.cpu.clone()


def runner_with(qsl, tables):
    from types import SimpleNamespace

    return SimpleNamespace(query_start_loc=qsl, input_batch=SimpleNamespace(block_table=SimpleNamespace(
        block_tables=[SimpleNamespace(block_table=t) for t in tables])))


def metadata_of(qsl, table, t):
    from types import SimpleNamespace

    return SimpleNamespace(query_start_loc=qsl.gpu[:4], seq_lens=t["seq_lens"], block_table=table.gpu[:3], slot_mapping=t["slot_mapping"])


def test_the_guard_reads_the_host_copy_of_the_block_table_and_query_start_loc():
    from pagetrace.engines.guard import host_tensors

    t = base()
    # persistent buffers of 6 requests, as vLLM sizes them (max_num_seqs), and a second KV cache group
    qsl = Buffer(t["query_start_loc"].tolist() + [8, 8, 8])
    table = Buffer(t["block_table"].tolist() + [[0] * 4] * 3)
    other = Buffer([[9] * 4] * 6)
    m = metadata_of(qsl, table, t)
    picked = host_tensors(m, runner_with(qsl, [other, table]), t["positions"])
    assert picked["block_table"].data_ptr() == table.cpu.data_ptr() and picked["query_start_loc"].data_ptr() == qsl.cpu.data_ptr()
    assert picked["block_table"].tolist() == t["block_table"].tolist() and picked["query_start_loc"].tolist() == [0, 6, 7, 8]
    for k in ("seq_lens", "slot_mapping", "positions"):  # no host copy in vLLM: the metadata's own (on the host here: itself)
        assert picked[k] is t[k]

    def ok(p):
        return verdict(p["query_start_loc"], p["seq_lens"], p["block_table"], p["slot_mapping"], block_size=BS, num_blocks=POOL,
                       positions=p["positions"], num_tokens=8)

    assert ok(picked)
    table.cpu[1, 1] = POOL  # the host copy is what the guard read: a bad entry there is found
    assert not ok(host_tensors(m, runner_with(qsl, [other, table]), t["positions"]))


def test_a_table_that_is_no_buffers_device_copy_is_read_as_the_metadata_holds_it():
    """A backend that remaps the table (another kernel block size) or a buffer of another
    shape: the metadata's own tensor, never a host copy of something else."""
    from pagetrace.engines.guard import host_tensors

    t = base()
    qsl = Buffer(t["query_start_loc"].tolist() + [8, 8])
    table = Buffer(t["block_table"].tolist() + [[0] * 4] * 3)
    m = metadata_of(qsl, table, t)
    m.block_table = table.gpu[:3].clone()  # a copy, not the buffer
    assert host_tensors(m, runner_with(qsl, [table]))["block_table"] is m.block_table
    m.block_table = table.gpu[1:4]  # the buffer's memory, not from its first row
    assert host_tensors(m, runner_with(qsl, [table]))["block_table"] is m.block_table
    wide = Buffer([[0] * 8] * 6)
    m.block_table = wide.gpu[:3, :4]  # its first row, another row stride
    assert host_tensors(m, runner_with(qsl, [wide]))["block_table"] is m.block_table
    assert host_tensors(m, object())["query_start_loc"] is m.query_start_loc  # a runner without the buffers


def test_on_vllms_cpu_runner_the_host_copies_are_the_metadatas_own_memory():
    from pagetrace.engines.guard import host_tensors

    t = base()
    qsl = Buffer(t["query_start_loc"].tolist(), one=True)
    table = Buffer(t["block_table"].tolist(), one=True)
    m = metadata_of(qsl, table, t)
    picked = host_tensors(m, runner_with(qsl, [table]), t["positions"])
    assert picked["block_table"].data_ptr() == m.block_table.data_ptr() and picked["query_start_loc"].data_ptr() == m.query_start_loc.data_ptr()
