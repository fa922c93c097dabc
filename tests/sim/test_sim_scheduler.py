"""The scheduler step by step on two workloads small enough to count by hand: a preemption
(the last admitted request gives its blocks back, is recomputed from token 0 on re-admission,
keeps its first scheduled step) and two prefix hits in one step (hit tokens and blocks allocated
summed over the step's admissions)."""

from __future__ import annotations

from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import simulate

FIELDS = ("scheduled", "tokens", "allocated", "hit_tokens", "evicted", "preempted", "admitted", "finished", "free_blocks")


def table(result):
    return [tuple(getattr(s, f) for f in FIELDS) for s in result.steps]


def test_a_preempted_request_gives_its_blocks_back_and_is_recomputed_from_zero():
    """Block size 4, 4 usable blocks. a and b: 8-token prompts (2 blocks each), 6 output tokens.
    Step 0 admits both: 16 tokens, all 4 blocks. Step 1: a's token 8 starts a block, none is free:
    b (the last admitted) is preempted; its 2 blocks return (full, so cached: to the back, tail
    first) and a takes one of them, evicting its hash. a then decodes alone; its token 12 (step 5)
    takes the last free block, evicting b's other hash, and a finishes (6 tokens: steps 0-5), all
    4 blocks free. Step 6 re-admits b with no hit left: 8 prompt tokens + the 1 it had generated
    are recomputed (9 tokens, 3 blocks, 2 cached ones evicted); b finishes at step 10."""
    reqs = [SimRequest("a", list(range(0, 8)), list(range(100, 106))), SimRequest("b", list(range(20, 28)), list(range(200, 206)))]
    result = simulate(reqs, 5, 4)
    decode = (1, 1, 0, 0, 0, [], [], [], 1)
    assert table(result) == [
        (2, 16, 4, 0, 0, [], ["a", "b"], [], 0),
        (1, 1, 1, 0, 1, ["b"], [], [], 1),
        decode, decode, decode,
        (1, 1, 1, 0, 1, [], [], ["a"], 4),
        (1, 9, 3, 0, 2, [], ["b"], [], 1),
        decode, decode, decode,
        (1, 1, 1, 0, 1, [], [], ["b"], 4),
    ]
    a, b = result.requests
    assert (a.num_preemptions, b.num_preemptions, result.num_preemptions) == (0, 1, 1)
    assert (a.first_scheduled, b.first_scheduled) == (0, 0)  # b's re-admission keeps its first step
    assert (a.finished_step, b.finished_step) == (5, 10)


def test_two_prefix_hits_in_one_step_are_summed():
    """c (8 tokens) runs at step 0 and caches its 2 blocks. d and e arrive at step 1 with c's
    first block as their first 4 tokens: each hits 4 tokens and allocates 1 block; c's decode
    token 8 starts its third block. Step 1: 3 run, 1 + 4 + 4 tokens, 3 blocks, 8 hit tokens."""
    head = list(range(0, 4))
    reqs = [SimRequest("c", list(range(0, 8)), [100, 101, 102]),
            SimRequest("d", head + [50, 51, 52, 53], [1, 2], arrival=1),
            SimRequest("e", head + [60, 61, 62, 63], [1, 2], arrival=1)]
    result = simulate(reqs, 16, 4)
    assert table(result) == [
        (1, 8, 2, 0, 0, [], ["c"], [], 13),
        (3, 9, 3, 8, 0, [], ["d", "e"], [], 10),
        (3, 3, 2, 0, 0, [], [], ["c", "d", "e"], 15),
    ]
    assert [r.num_cached_tokens for r in result.requests] == [0, 4, 4]
    assert [r.first_scheduled for r in result.requests] == [0, 1, 1]
