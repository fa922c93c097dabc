"""Predicted KV events against a server's (pagetrace/sim/compare.py), item by item, on
workloads small enough to follow by hand; the server's events are built as vLLM publishes
them (vllm/distributed/kv_events.py: a BlockStored per `cache_full_blocks` call with its
parent's hash and token ids, a BlockRemoved per evicted block, int hashes or 32-byte digests).

The workload: A (tokens 1..8, one output token) at step 0, then B (11..18, one output) at
step 5, block size 4, a pool of 4 blocks (3 usable): A stores its 2 blocks at step 0; B's
allocation at step 5 takes the never-used block and evicts A's second (A freed its table
tail first, so A1 sits before A0 in the free queue), then stores its 2 blocks.
"""

from __future__ import annotations

import json

import pytest

from pagetrace.sim.compare import Item, _content_chain, _norm, _show, compare, predicted_items, server_items
from pagetrace.sim.events import AllBlocksCleared, Batch, BlockRemoved, BlockStored, EventStream
from pagetrace.sim.run import simulate
from pagetrace.sim.vllm_hash import block_hashes
from pagetrace.sim.workload import read_trace

A, B = list(range(1, 9)), list(range(11, 19))


def trace_text(header=None, a_extra=None, b_extra=None):
    lines = [] if header is None else [{"format": "pagetrace-trace", "version": 1, "block_size": 4, **header}]
    lines += [{"id": "A", "prompt": A, "output": [50], **(a_extra or {})}, {"id": "B", "prompt": B, "output": [60], "arrival": 5, **(b_extra or {})}]
    return "".join(json.dumps(x) + "\n" for x in lines)


def run(text=None, num_blocks=4):
    trace = read_trace(text or trace_text(), 4)
    return simulate(trace.requests, num_blocks, 4, record_events=True), trace


def stream(*events_per_message, gaps=(), problems=(), seqs=None) -> EventStream:
    seqs = seqs or range(len(events_per_message))
    return EventStream([Batch(s, float(s), list(evs)) for s, evs in zip(seqs, events_per_message)], list(problems), list(gaps), "test")


def servers(seed=None, a_salt=None, a_form=int):
    """The server's three messages for the workload: A's store, B's eviction, B's store."""
    ha, hb = block_hashes(A, 4, a_salt, seed), block_hashes(B, 4, None, seed)
    form = (lambda h: bytes(24) + h.to_bytes(8, "big")) if a_form is bytes else (lambda h: h)
    return [
        [BlockStored([form(h) for h in ha], None, A, 4, group_idx=0)],
        [BlockRemoved([form(ha[1])], group_idx=0)],
        [BlockStored(hb, None, B, 4, group_idx=0)],
    ], ha, hb


def test_the_prediction_item_by_item():
    result, trace = run()
    ha, hb = block_hashes(A, 4), block_hashes(B, 4)
    items = predicted_items(result, trace, 4, "hash")
    assert [(i.kind, i.key, i.where, i.request, i.block) for i in items] == [
        ("stored", ha[0], "step 0", "A", 0), ("stored", ha[1], "step 0", "A", 1),
        ("removed", ha[1], "step 5", "B", None),
        ("stored", hb[0], "step 5", "B", 0), ("stored", hb[1], "step 5", "B", 1)]
    content = predicted_items(result, trace, 4, "content")
    assert [i.key for i in content] == [*_content_chain(A, 4, None, None), _content_chain(A, 4, None, None)[1], *_content_chain(B, 4, None, None)]


def test_equal_to_the_servers_events():
    result, trace = run()
    msgs, _, _ = servers()
    c = compare(result, trace, stream(*msgs), 4)
    assert c.to_json() == {"mode": "hash", "predicted_items": 5, "server_items": 5, "agree": 5, "same_items_any_order": True,
                           "equal": True, "first_divergence": None, "likely": [], "notes": [], "server_events_skipped": 0}


def test_digests_in_the_events_are_read_by_their_low_64_bits():
    """VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: the events carry the 32-byte digests."""
    result, trace = run()
    msgs, _, _ = servers(a_form=bytes)
    assert compare(result, trace, stream(*msgs), 4).first_divergence is None
    assert _norm(bytes(24) + (5).to_bytes(8, "big")) == 5 and _norm(b"\x00" * 16) == b"\x00" * 16 and _norm(7) == 7


def test_the_first_divergence_names_both_sides():
    result, trace = run()
    msgs, ha, hb = servers()
    msgs[1] = [BlockRemoved([ha[0]], group_idx=0)]  # the server evicted A's first block, not its second
    c = compare(result, trace, stream(*msgs), 4)
    assert (c.agree, c.same_multiset) == (2, False)
    assert c.first_divergence == {
        "item": 2,
        "pagetrace": {"did": "BlockRemoved", "hash": f"{ha[1]:#018x}", "where": "step 5", "request": "B"},
        "server": {"did": "BlockRemoved", "hash": f"{ha[0]:#018x}", "where": "message 1, event 0", "request": "A", "block": 0},
    }
    assert len(f"{ha[0]:#018x}") == 18
    msgs[1] = [BlockRemoved([12345], group_idx=0)]  # a hash nobody predicted: no request on the server's side
    assert compare(result, trace, stream(*msgs), 4).first_divergence["server"] == {"did": "BlockRemoved", "hash": "0x0000000000003039",
                                                                                   "where": "message 1, event 0"}


def test_the_server_ends_early_or_the_prediction_does():
    result, trace = run()
    msgs, ha, hb = servers()
    c = compare(result, trace, stream(*msgs[:2]), 4)
    assert c.agree == 3 and c.first_divergence["server"] == {"did": "nothing more (the server's events end here)"}
    assert "reason" not in c.first_divergence
    cut = "f.kvev, message 2 at byte 300: truncated (a frame of 80 bytes, 9 left in the file); reading stopped there"
    c = compare(result, trace, stream(*msgs[:2], problems=["something else", cut]), 4)
    assert c.first_divergence["reason"] == f"the server's events end early: {cut}"
    c = compare(result, trace, stream(*msgs, [AllBlocksCleared()]), 4)
    assert (c.predicted, c.server, c.agree) == (5, 6, 5)
    assert c.first_divergence == {"item": 5, "pagetrace": {"did": "nothing more (the prediction ends here)"},
                                  "server": {"did": "AllBlocksCleared", "hash": "None", "where": "message 3, event 0"}}


def test_a_gap_is_the_reason_only_from_its_first_missing_message():
    result, trace = run()
    msgs, ha, hb = servers()
    # message 1 (the eviction) lost: the server's items jump from A's store to B's
    c = compare(result, trace, stream(msgs[0], msgs[2], seqs=[0, 2], gaps=[(1, 1)]), 4)
    assert c.agree == 2 and c.first_divergence["reason"] == "messages are missing from the server's stream here (a sequence gap)"
    # a gap after the divergence is not its reason
    bad = [BlockStored([999, ha[1]], None, A, 4, group_idx=0)]
    c = compare(result, trace, stream(bad, msgs[1], msgs[2], seqs=[0, 1, 3], gaps=[(2, 2)]), 4)
    assert c.agree == 0 and "reason" not in c.first_divergence
    # a gap before the first message read: nothing before it, every divergence after it
    c = compare(result, trace, stream(bad, seqs=[1], gaps=[(0, 0)]), 4)
    assert c.first_divergence["reason"].startswith("messages are missing")


def test_another_order_of_the_same_items_is_timing():
    result, trace = run()
    msgs, ha, hb = servers()
    swapped = [[BlockStored(list(reversed(ha)), None, A, 4)], msgs[1], msgs[2]]
    c = compare(result, trace, stream(*swapped), 4)
    assert c.same_multiset and c.agree == 0 and c.first_divergence["reason"].startswith("the same blocks were stored and removed in another order")
    c = compare(result, trace, stream([BlockStored([ha[0]], None, A[:4], 4)], [BlockStored([ha[0]], None, A[:4], 4)]), 4)
    assert not c.same_multiset  # A's first block twice is not the prediction's items in any order


def test_a_concurrent_recording_says_so():
    result, trace = run(trace_text({"source": {"sequential": False}}))
    msgs, ha, hb = servers()
    msgs[1] = [BlockRemoved([ha[0]])]
    c = compare(result, trace, stream(*msgs), 4)
    assert c.first_divergence["reason"].startswith("the trace was recorded with requests sent concurrently")
    assert c.first_divergence["reason"].endswith("the two agree on the first 2 events")
    result, trace = run(trace_text({"source": {"sequential": True}}))
    assert "reason" not in compare(result, trace, stream(*msgs), 4).first_divergence


def test_events_of_other_groups_and_block_sizes_are_left_out():
    result, trace = run()
    msgs, ha, hb = servers()
    other = [BlockStored([1, 2], None, list(range(8)), 4, group_idx=1), BlockRemoved([1], group_idx=2)]
    big = [BlockStored([3], None, list(range(16)), 16, group_idx=0), BlockStored([4], None, list(range(16)), 16)]
    c = compare(result, trace, stream(msgs[0] + other + big, msgs[1], msgs[2]), 4)
    assert c.first_divergence is None and c.skipped == 4
    assert c.notes == ["message 0, event 1: an event of KV cache group 1; only group 0 (full attention) is simulated, such events are left out",
                       "message 0, event 3: a BlockStored of 16-token blocks; the simulation's blocks hold 4; left out",
                       "message 0, event 4: a BlockStored of 16-token blocks; the simulation's blocks hold 4; left out"]


def test_another_seed_falls_back_to_token_content():
    result, trace = run()
    msgs, ha, hb = servers(seed="other")
    c = compare(result, trace, stream(*msgs), 4)
    assert c.mode == "content" and c.first_divergence is None and c.agree == 5
    assert c.notes == ["no predicted block hash is one the server stored: its NONE_HASH seed or hash algorithm differs "
                       "(PYTHONHASHSEED, --prefix-caching-hash-algo); compared by token content instead"]
    # the same seed written in the trace's header: compared by hash
    result, trace = run(trace_text({"hash": {"algo": "sha256", "seed": "other"}}))
    c = compare(result, trace, stream(*msgs), 4)
    assert (c.mode, c.notes, c.first_divergence) == ("hash", [], None)


def test_content_mode_follows_the_parent_chain():
    """A server's message can store a block whose parent came in an earlier message: the
    content key of the child is chained on the parent's."""
    result, trace = run(trace_text({"hash": {"algo": "xxhash", "seed": None}}))
    ha, hb = block_hashes(A, 4, None, "x"), block_hashes(B, 4, None, "x")  # whatever the server's hashes: content decides
    msgs = [[BlockStored([ha[0]], None, A[:4], 4)], [BlockStored([ha[1]], ha[0], A[4:], 4)], [BlockRemoved([ha[1]])],
            [BlockStored(hb, None, B, 4)]]
    c = compare(result, trace, stream(*msgs), 4)
    assert c.mode == "content" and c.first_divergence is None, c.first_divergence
    assert c.notes == ["compared by token content: the trace's hashing (xxhash) is not reproduced here"]
    # the same second block with a parent the server never stored: another content
    msgs[1] = [BlockStored([ha[1]], 999, A[4:], 4)]
    c = compare(result, trace, stream(*msgs), 4)
    assert c.agree == 1 and c.first_divergence["server"]["where"] == "message 1, event 0"
    # a removal of a hash never stored cannot match
    msgs = [[BlockStored(ha, None, A, 4)], [BlockRemoved([777])], [BlockStored(hb, None, B, 4)]]
    assert compare(result, trace, stream(*msgs), 4).agree == 2


def test_content_mode_with_salts_and_loras():
    """vLLM's events carry the extra keys untagged (kv_cache_utils.py to_event_extra_keys):
    the LoRA name on every block, the salt on the first."""
    result, trace = run(trace_text(a_extra={"cache_salt": "s", "lora_name": "sql"}))
    hx = [1001, 1002]
    msgs = [[BlockStored(hx, None, A, 4, extra_keys=[("sql", "s"), ("sql",)])], [BlockRemoved([1002])],
            [BlockStored(block_hashes(B, 4), None, B, 4)]]
    c = compare(result, trace, stream(*msgs), 4)
    assert c.mode == "content" and c.first_divergence is None, c.first_divergence
    assert c.notes == ["compared by token content: the trace's hashing (sha256, LoRA) is not reproduced here"]
    msgs[0] = [BlockStored(hx, None, A, 4, extra_keys=[("sql",), ("sql",)])]  # no salt: another first block, and so another chain
    assert compare(result, trace, stream(*msgs), 4).agree == 0
    assert _content_chain(A, 4, "s", "sql") != _content_chain(A, 4, None, "sql") != _content_chain(A, 4, "s", None)
    assert _content_chain(A[:7], 4, None, None) == _content_chain(A, 4, None, None)[:1]  # full blocks only


def test_a_salted_request_is_compared_by_its_salted_hashes():
    result, trace = run(trace_text(a_extra={"cache_salt": "s"}))
    msgs, ha, hb = servers(a_salt="s")
    assert compare(result, trace, stream(*msgs), 4).first_divergence is None
    msgs, _, _ = servers()  # the server's hashes without the salt
    assert compare(result, trace, stream(*msgs), 4).agree == 0


def test_a_sliding_windows_event_covers_more_blocks_than_it_hashes():
    items, notes, skipped = server_items(stream([BlockStored([7], None, list(range(8)), 4, group_idx=0)],
                                                [BlockStored([8], None, list(range(8)), 4)]), 4, "content")
    assert len(items) == 2 and skipped == 0
    assert notes == ["message 0, event 0: a BlockStored (group 0) covers more blocks than it hashes (a sliding window's); "
                     "by token content its blocks cannot be told apart, so such items may not match"]
    assert server_items(stream([BlockStored([7], None, list(range(8)), 4)]), 4, "hash")[1] == []


def test_group_keys_in_a_hybrid_simulation():
    items, notes, skipped = server_items(stream([BlockStored([7], None, list(range(4)), 4, group_idx=1), BlockRemoved([7], group_idx=1),
                                                 BlockStored([9], None, list(range(4)), 4)]), 4, "hash", groups=True)
    assert [(i.kind, i.key, i.seq) for i in items] == [("stored", (7, 1), 0), ("removed", (7, 1), 0), ("stored", (9, 0), 0)]
    assert notes == [] and skipped == 0
    assert _show((7, 1)) == "0x0000000000000007 (group 1)" and _show(("unknown", 3)) == "('unknown', 3)" and _show(255) == "0x00000000000000ff"


def test_a_block_past_the_known_hashes():
    """A trace's given hashes shorter than what the simulation stored: the item says so."""
    text = ('{"format":"pagetrace-trace","version":1,"block_size":4,"hashes_only":true}\n'
            '{"id":"A","prompt_len":8,"output_len":1,"block_hashes":[5]}\n')
    result, trace = run(text)
    items = predicted_items(result, trace, 4, "hash")
    assert [i.key for i in items] == [5, ("unknown block", "A", 1)]
    assert isinstance(items[0], Item)


@pytest.mark.parametrize("where", ["cleared"])
def test_cleared_items_keep_their_message(where):
    items, _, _ = server_items(stream([], [AllBlocksCleared()], seqs=[3, 4]), 4, "hash")
    assert [(i.kind, i.key, i.where, i.seq) for i in items] == [(where, None, "message 4, event 0", 4)]


# -- a hybrid model: one full-attention group (0) and one sliding-window group (1) --

def run_hybrid(window=5, num_blocks=40, text=None):
    from pagetrace.sim.hybrid import FULL, SLIDING, KVGroup, LayerKind

    trace = read_trace(text or trace_text(), 4)
    groups = [KVGroup(LayerKind(FULL), 1), KVGroup(LayerKind(SLIDING, window), 1)]
    return simulate(trace.requests, num_blocks, 4, record_events=True, groups=groups), trace


def hybrid_server():
    """Window 5, block size 4: the sliding group needs cdiv(4, 4) = 1 block before the replay
    boundary (token 7, block 1) and caches only block 0 of each 8-token prompt; its BlockStored
    carries the tokens of both blocks the call covered (block_pool.py cache_full_blocks)."""
    ha, hb = block_hashes(A, 4), block_hashes(B, 4)
    return [[BlockStored(ha, None, A, 4, group_idx=0), BlockStored(ha[:1], None, A, 4, group_idx=1)],
            [BlockStored(hb, None, B, 4, group_idx=0), BlockStored(hb[:1], None, B, 4, group_idx=1)]], ha, hb


def test_hybrid_prediction_item_by_item():
    result, trace = run_hybrid()
    ha, hb = block_hashes(A, 4), block_hashes(B, 4)
    items = predicted_items(result, trace, 4, "hash")
    assert [(i.kind, i.key, i.where, i.request, i.block) for i in items] == [
        ("stored", (ha[0], 0), "step 0, group 0", "A", 0), ("stored", (ha[1], 0), "step 0, group 0", "A", 1),
        ("stored", (ha[0], 1), "step 0, group 1", "A", 0),
        ("stored", (hb[0], 0), "step 5, group 0", "B", 0), ("stored", (hb[1], 0), "step 5, group 0", "B", 1),
        ("stored", (hb[0], 1), "step 5, group 1", "B", 0)]


def test_hybrid_compare_equal_and_divergent():
    result, trace = run_hybrid()
    msgs, ha, hb = hybrid_server()
    c = compare(result, trace, stream(*msgs), 4)
    assert (c.mode, c.predicted, c.server, c.agree, c.first_divergence, c.skipped) == ("hash", 6, 6, 6, None, 0), c.first_divergence
    msgs[1][1] = BlockStored(hb, None, B, 4, group_idx=1)  # the server's sliding group cached both of B's blocks
    c = compare(result, trace, stream(*msgs), 4)
    assert c.agree == 6 and c.first_divergence == {"item": 6, "pagetrace": {"did": "nothing more (the prediction ends here)"},
                                                   "server": {"did": "BlockStored", "hash": f"{hb[1]:#018x} (group 1)",
                                                              "where": "message 1, event 1"}}  # no prediction owns it


def test_hybrid_removals_name_the_group():
    """A pool of 5 blocks (4 usable): A takes 3 (2 full, 2 sliding less the one that left the
    window); B's allocation evicts A's cached blocks; every removal maps to a block stored before."""
    result, trace = run_hybrid(num_blocks=6)
    items = predicted_items(result, trace, 4, "hash")
    stored = {i.key for i in items if i.kind == "stored"}
    removed = [i for i in items if i.kind == "removed"]
    assert removed and all(i.key in stored and i.request == "B" and i.where == "step 5" for i in removed)
    # the same items as the server publishes them, by hand from the prediction's order: equal
    by_message = {}
    for i in items:
        by_message.setdefault(i.where.split(",")[0], []).append(i)
    msgs = []
    for its in by_message.values():
        evs = []
        for i in its:
            (h, g) = i.key
            evs.append(BlockRemoved([h], group_idx=g) if i.kind == "removed" else BlockStored([h], None, [0] * 4, 4, group_idx=g))
        msgs.append(evs)
    assert compare(result, trace, stream(*msgs), 4).first_divergence is None


def test_hybrid_by_token_content():
    result, trace = run_hybrid(text=trace_text({"hash": {"algo": "xxhash", "seed": None}}))
    msgs, _, _ = hybrid_server()
    c = compare(result, trace, stream(*msgs), 4)
    assert c.mode == "content" and c.agree == 6 and c.first_divergence is None, c.first_divergence


def test_items_after_a_cleared_event_in_the_same_message():
    items, _, _ = server_items(stream([AllBlocksCleared(), BlockStored([7], None, [1, 2, 3, 4], 4)]), 4, "hash")
    assert [(i.kind, i.key) for i in items] == [("cleared", None), ("stored", 7)]  # without groups: the bare hash


def test_an_unseen_parent_is_not_the_start_of_a_prompt():
    """By content, a block whose parent the server stored before the stream began is not the
    first block of a prompt, even with the same tokens."""
    result, trace = run(trace_text({"hash": {"algo": "xxhash", "seed": None}}))
    msgs = [[BlockStored([71], 999, A[:4], 4)]]
    assert compare(result, trace, stream(*msgs), 4).agree == 0
    assert compare(result, trace, stream([BlockStored([71], None, A[:4], 4)]), 4).agree == 1


def test_fewer_extra_keys_than_hashes():
    result, trace = run(trace_text(a_extra={"lora_name": "sql"}))
    msgs = [[BlockStored([1001, 1002], None, A, 4, extra_keys=[("sql",)])]]  # block 1's keys left out: read as none
    c = compare(result, trace, stream(*msgs), 4)
    assert c.agree == 1 and c.first_divergence["item"] == 1


def test_a_gap_in_content_mode_and_a_gap_of_two():
    result, trace = run(trace_text({"hash": {"algo": "xxhash", "seed": None}}))
    msgs = [[BlockStored(block_hashes(A, 4), None, A, 4)], [BlockRemoved([block_hashes(A, 4)[1]])], [BlockStored([5, 6], None, B, 4)]]
    c = compare(result, trace, stream(msgs[0], msgs[2], seqs=[0, 2], gaps=[(1, 1)]), 4)
    assert c.mode == "content" and c.agree == 2 and c.first_divergence["reason"].startswith("messages are missing")
    result, trace = run()
    ms, ha, hb = servers()
    c = compare(result, trace, stream(ms[0], ms[2], seqs=[0, 3], gaps=[(1, 2)]), 4)  # messages 1 and 2 lost
    assert c.agree == 2 and c.first_divergence["reason"].startswith("messages are missing")


def test_no_fallback_where_the_hashes_overlap_or_are_given():
    result, trace = run()
    ha, hb = block_hashes(A, 4), block_hashes(B, 4)
    c = compare(result, trace, stream([BlockStored(ha[:1], None, A[:4], 4)], [BlockStored(hb, None, B, 4)]), 4)
    assert c.mode == "hash" and c.notes == []  # A's first block is the server's: the hashes are comparable
    # content mode from the start: no second note, whatever the server stored
    result, trace = run(trace_text({"hash": {"algo": "xxhash", "seed": None}}))
    c = compare(result, trace, stream([BlockStored([1], None, [9, 9, 9, 9], 4)]), 4)
    assert c.notes == ["compared by token content: the trace's hashing (xxhash) is not reproduced here"]
    # a private trace's given hashes are the server's own: compared by hash even when none matches
    text = ('{"format":"pagetrace-trace","version":1,"block_size":4,"hashes_only":true}\n'
            '{"id":"A","prompt_len":8,"output_len":1,"block_hashes":[5,6]}\n')
    result, trace = run(text)
    c = compare(result, trace, stream([BlockStored([7, 8], None, A, 4)]), 4)
    assert c.mode == "hash" and c.notes == [] and c.agree == 0


def test_the_concurrent_reason_word_for_word():
    result, trace = run(trace_text({"source": {"sequential": False}}))
    msgs, ha, hb = servers()
    msgs[1] = [BlockRemoved([ha[0]])]
    assert compare(result, trace, stream(*msgs), 4).first_divergence["reason"] == (
        "the trace was recorded with requests sent concurrently: its arrival steps are estimated from send times, and which "
        "requests the server's steps took depended on when they reached it; the two agree on the first 2 events")
