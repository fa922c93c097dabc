"""The simulator's core (scheduler, block manager, cruising, request hashes) on workloads small
enough to count by hand, each at a boundary a user's run hits: exactly `max_num_seqs` running,
a decode step that needs exactly the free blocks, a preempted request re-admitted on its own
cached block, a multi-turn prompt that re-reads the blocks its first turn filled while decoding.

Every expectation is counted in the docstring or comment beside it, from vLLM's rules
(vllm/v1/core/sched/scheduler.py, kv_cache_manager.py, block_pool.py), not from the code.
Block size 4 throughout; `num_blocks` includes the null block 0, so `n` blocks give `n - 1`.
"""

from __future__ import annotations

import pytest

from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import simulate
from pagetrace.sim.scheduler import SchedulerConfig

FIELDS = ("scheduled", "tokens", "allocated", "hit_tokens", "evicted", "preempted", "admitted", "finished",
          "free_blocks", "used_blocks", "waiting", "running", "empty_slots")


def table(result):
    return [tuple(getattr(s, f) for f in FIELDS) for s in result.steps]


def ids(start, n):
    return list(range(start, start + n))


@pytest.fixture(params=[True, False], ids=["cruise", "explicit"])
def cruise(request, monkeypatch):
    """Both of the scheduler's paths: cruising (the default) and every request every step."""
    if not request.param:
        from pagetrace.sim import scheduler as sched_mod

        step = sched_mod.Scheduler.step

        def slow_step(self):
            self.cruise = False
            return step(self)

        monkeypatch.setattr(sched_mod.Scheduler, "step", slow_step)
    return request.param


def test_exactly_max_num_seqs_run_and_the_next_waits_for_a_finish(cruise):
    """max_num_seqs 2, three 4-token prompts with 2 output tokens at step 0, 15 usable blocks.
    Step 0 admits a and b (one block each); c waits although blocks and budget are left.
    Step 1: a and b decode token 4 (a new block each) and finish, but admission comes before
    update_from_output frees them, so c still waits. Step 2 admits c; it finishes at step 3.
    Empty slots: step 1 holds 2 blocks a request (8 slots) for 5 tokens, but both finish."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2]), SimRequest("b", ids(10, 4), [1, 2]), SimRequest("c", ids(20, 4), [1, 2])]
    result = simulate(reqs, 16, 4, SchedulerConfig(max_num_seqs=2))
    assert table(result) == [
        (2, 8, 2, 0, 0, [], ["a", "b"], [], 13, 2, 1, 2, 0),
        (2, 2, 2, 0, 0, [], [], ["a", "b"], 15, 0, 1, 0, 0),
        (1, 4, 1, 0, 0, [], ["c"], [], 14, 1, 0, 1, 0),
        (1, 1, 1, 0, 0, [], [], ["c"], 15, 0, 0, 0, 0),
    ]


def test_a_decode_step_needing_exactly_the_free_blocks_preempts_no_one(cruise):
    """5 blocks (4 usable). a and b: 4-token prompts, 3 output tokens. Step 0: one block each,
    2 free. Step 1: both decode token 4, which starts a block: exactly the 2 free blocks,
    nobody preempted. Step 2: token 5 fits; both finish (3 tokens sampled), 4 free again.
    Empty slots after step 1: 2 x (8 slots - 5 tokens)."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2, 3]), SimRequest("b", ids(10, 4), [1, 2, 3])]
    result = simulate(reqs, 5, 4)
    assert table(result) == [
        (2, 8, 2, 0, 0, [], ["a", "b"], [], 2, 2, 0, 2, 0),
        (2, 2, 2, 0, 0, [], [], [], 0, 4, 0, 2, 6),
        (2, 2, 0, 0, 0, [], [], ["a", "b"], 4, 0, 0, 0, 0),
    ]
    assert result.num_preemptions == 0


def test_one_block_short_the_last_is_preempted_and_readmitted_on_its_own_cached_block(cruise):
    """The same two requests with 4 blocks (3 usable): one free after step 0.
    Step 1: a's token 4 takes the last free block; b's needs one, none is free: b, the last
    running, is preempted, and being the request itself ends the running loop (no admission
    in a step that preempted). Its block (its full 4-token prompt, cached) goes to the back.
    Step 2: a decodes token 5 and finishes. b is looked up first (admission precedes the frees):
    5 tokens (prompt + 1 generated), at most 4 can hit: its own block 2, free, hits.
    `scheduler_reserve_full_isl`: 2 blocks for 5 tokens, the hit counts (it leaves the free
    queue), 2 > 1 free: b waits. a frees 3 (uncached, to the front) and 1 (cached, back).
    Step 3: b re-admitted on the hit, 1 token computed (its token 4), 1 new block: block 3,
    the head, never cached (no eviction). Its hit counts as a preempted request's
    (vLLM's preempted_queries 5, preempted_hits 4), not in the step's hit_tokens.
    Step 4: token 5 fits in block 3; b finishes."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2, 3]), SimRequest("b", ids(10, 4), [1, 2, 3])]
    result = simulate(reqs, 4, 4, tables_at=[3])
    assert table(result) == [
        (2, 8, 2, 0, 0, [], ["a", "b"], [], 1, 2, 0, 2, 0),
        (1, 1, 1, 0, 0, ["b"], [], [], 1, 2, 1, 1, 3),
        (1, 1, 0, 0, 0, [], [], ["a"], 3, 0, 1, 0, 0),
        (1, 1, 1, 0, 0, [], ["b"], [], 1, 2, 0, 1, 3),
        (1, 1, 0, 0, 0, [], [], ["b"], 3, 0, 0, 0, 0),
    ]
    a, b = result.requests
    assert result.tables_at[3] == {"b": [2, 3]}
    assert (b.num_preemptions, b.num_cached_tokens, b.recomputed_hit_tokens, b.first_scheduled, b.finished_step) == (1, 0, 4, 0, 4)
    assert (result.num_preemptions, result.preempted_queries, result.preempted_hits) == (1, 5, 4)
    assert (a.num_preemptions, a.recomputed_hit_tokens, a.finished_step) == (0, 0, 2)
    # the causes are counted at first admission only: each 4-token prompt is one whole block,
    # whose last token is never looked up, so all 4 are "partial block"; b's re-admission adds none
    first = {"hit": 0, "partial block": 4, "evicted": 0, "different extra key": 0, "first seen": 0}
    assert a.why == first and b.why == first
    assert result.causes == {"hit": 0, "partial block": 8, "evicted": 0, "different extra key": 0, "first seen": 0}


def test_a_running_prefill_gets_the_budgets_last_token():
    """Budget 3: a and b (1-token prompts, 4 outputs) and c (a 5-token prompt, 1 output) at
    step 0. Step 0: a 1, b 1, c a 1-token chunk. Steps 1-3: a and b decode one token each
    and c, last in the running list, gets the one token left: its prompt advances a token
    a step. a and b sample their 4th token at step 3 and finish; c's 5th prompt token is
    computed at step 4, where it samples its only output token and finishes."""
    reqs = [SimRequest("a", [7], [1, 2, 3, 4]), SimRequest("b", [8], [1, 2, 3, 4]), SimRequest("c", ids(20, 5), [1])]
    result = simulate(reqs, 16, 4, SchedulerConfig(max_num_batched_tokens=3))
    assert [(s.scheduled, s.tokens, s.finished) for s in result.steps] == [
        (3, 3, []), (3, 3, []), (3, 3, []), (3, 3, ["a", "b"]), (1, 1, ["c"])]
    assert [r.finished_step for r in result.requests] == [3, 3, 4]


@pytest.mark.parametrize("outputs", [10, 9])
def test_a_second_turn_rereads_the_blocks_its_first_turn_filled_while_decoding(cruise, outputs):
    """Multi-turn: a's 4-token prompt, then 10 output tokens given as a range (as the synthetic
    workloads give them: the decode fast path hashes such a block in place). a stores 4 + 9
    tokens: block 0 (the prompt) is cached at step 0, blocks 1 and 2 (outputs 0-3 and 4-7)
    fill while decoding, at steps 4 and 8 (token k is computed at step k - 3); a finishes at
    step 9. With 9 outputs a stores 12 tokens and fills block 2 in its last step, 8. The second
    turn, at step 12, sends the prompt, the first 8 outputs and one more token: 13 tokens, of
    which at most 12 can hit: all 3 blocks, the last token recomputed."""
    a = SimRequest("a", ids(0, 4), range(100, 100 + outputs))
    b = SimRequest("b", ids(0, 4) + ids(100, 8) + [7], [1], arrival=12)
    result = simulate([a, b], 16, 4)
    assert a.finished_step == outputs - 1 and b.first_scheduled == 12
    assert b.num_cached_tokens == 12 and b.why["hit"] == 12 and b.why["partial block"] == 1
    assert result.steps[-1].tokens == 1


def test_a_salted_first_turn_is_a_different_extra_key_to_other_salts(cruise):
    """The same first turn under cache salt "s": every block it fills while decoding is cached
    under the salt. A second turn with salt "s" hits all 12 tokens; with salt "t", or no salt,
    it hits nothing, and its 12 lookup tokens are "different extra key" (the same tokens after
    the same prefix were cached under another salt), the 13th "partial block"."""
    turn2 = ids(0, 4) + ids(100, 9)
    for salt in ("s", "t", None):  # one run each: a second turn's own blocks would count for the next
        a = SimRequest("a", ids(0, 4), range(100, 110), cache_salt="s")
        second = SimRequest("second", turn2, [1], arrival=12, cache_salt=salt)
        simulate([a, second], 16, 4)
        if salt == "s":
            assert second.num_cached_tokens == 12 and second.why["hit"] == 12
        else:
            assert second.num_cached_tokens == 0
            assert second.why == {"hit": 0, "partial block": 1, "evicted": 0, "different extra key": 12, "first seen": 0}, salt


def test_a_two_token_prefill_chunk_inside_its_last_block_computes_both(cruise):
    """A 7-token prompt, budget 5: step 0 computes 5 (2 blocks, 8 slots), step 1 the last 2,
    both inside block 2 and filling nothing; the request samples its one output token then."""
    r = SimRequest("r", ids(0, 7), [1])
    result = simulate([r], 16, 4, SchedulerConfig(max_num_batched_tokens=5))
    assert [(s.tokens, s.allocated, s.finished) for s in result.steps] == [(5, 2, []), (2, 0, ["r"])]


def test_a_decode_that_starts_a_block_in_its_last_step_takes_it(cruise):
    """A 4-token prompt and 6 outputs: it stores 4 + 5 tokens. Token 4 (step 1) starts block 2,
    token 8 (step 5, its last: it samples its 6th output there) starts block 3, which is
    allocated before the request finishes and frees everything. Empty slots: the held slots
    less the computed tokens (8 - 5 at step 1, down to 0 at step 4)."""
    r = SimRequest("r", ids(0, 4), range(100, 106))
    result = simulate([r], 16, 4)
    assert table(result) == [
        (1, 4, 1, 0, 0, [], ["r"], [], 14, 1, 0, 1, 0),
        (1, 1, 1, 0, 0, [], [], [], 13, 2, 0, 1, 3),
        (1, 1, 0, 0, 0, [], [], [], 13, 2, 0, 1, 2),
        (1, 1, 0, 0, 0, [], [], [], 13, 2, 0, 1, 1),
        (1, 1, 0, 0, 0, [], [], [], 13, 2, 0, 1, 0),
        (1, 1, 1, 0, 0, [], [], ["r"], 15, 0, 0, 0, 0),
    ]


def test_kv_events_by_hand():
    """vLLM's KV events (block_pool.py: one BlockStored per `cache_full_blocks` call, from the
    request's first newly full block; one BlockRemoved per hash dropped, by the allocation that
    dropped it). a's 8-token prompt at once stores both blocks in one event from index 0.
    In chunks of 4 (budget 4), 3 blocks (2 usable): steps 0 and 1 store a's blocks from index 0
    and 1; a finishes and frees them tail first, both cached: the queue is 2, 1. c (8 other
    tokens) at step 2 takes block 2: a's second hash is removed, by c's allocation, then c's
    first block stored; step 3 takes block 1 (a's first hash) and stores c's block 1."""
    from pagetrace.sim.request import block_key, hash_block

    a0 = hash_block(None, block_key(tuple(ids(0, 4))), None)
    a1 = hash_block(a0, block_key(tuple(ids(4, 4))), None)
    c0 = hash_block(None, block_key(tuple(ids(50, 4))), None)
    c1 = hash_block(c0, block_key(tuple(ids(54, 4))), None)
    result = simulate([SimRequest("a", ids(0, 8), [1])], 3, 4, record_events=True)
    assert result.events == [(0, [("stored", "a", 0, [a0, a1])])]
    reqs = [SimRequest("a", ids(0, 8), [1]), SimRequest("c", ids(50, 8), [1], arrival=2)]
    result = simulate(reqs, 3, 4, SchedulerConfig(max_num_batched_tokens=4), record_events=True)
    assert result.events == [
        (0, [("stored", "a", 0, [a0])]),
        (1, [("stored", "a", 1, [a1])]),
        (2, [("removed", a1, "c"), ("stored", "c", 0, [c0])]),
        (3, [("removed", a0, "c"), ("stored", "c", 1, [c1])]),
    ]


def test_freeing_a_request_the_pool_refused_changes_nothing():
    """A prompt refused for want of blocks holds none; freeing it (vLLM's `free` pops the
    request's blocks with a default: single_type_kv_cache_manager.py) leaves the pool as it was."""
    from pagetrace.sim.policy import VllmPrefixCaching

    policy = VllmPrefixCaching(num_blocks=3, block_size=4)
    held = SimRequest("held", ids(0, 8), [1])
    assert policy.allocate_slots(held, 8) == [1, 2]
    refused = SimRequest("refused", ids(50, 4), [1])
    assert policy.allocate_slots(refused, 4) is None
    policy.free(refused)
    policy.free(SimRequest("never", [1], [1]))
    assert policy.pool.num_free == 0 and policy.block_ids("held") == [1, 2] and policy.pool.ref_cnt[1:] == [1, 1]
    policy.free(held)
    assert policy.pool.queue.order() == [2, 1] and policy.block_ids("held") == [] and "held" not in policy.num_cached_block


@pytest.mark.parametrize("reserve", [True, False])
def test_a_chunked_prompt_waits_until_its_whole_prompt_fits(reserve):
    """4 blocks (3 usable), budget 4. a (4 tokens, 2 outputs) runs alone at step 0; at step 1
    its token 4 takes a second block, 1 free, 3 of budget left. b's 9-token prompt would
    run a 3-token chunk in the free block, but `scheduler_reserve_full_isl` (on by default)
    wants its 3 blocks now: b waits for a's blocks (freed at step 1) and starts at step 2
    (4 tokens), then 4, then its last 1 at step 4. Without it b starts at step 1 (3 tokens),
    then 4 and 2, finishing at step 3."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2]), SimRequest("b", ids(50, 9), [1])]
    result = simulate(reqs, 4, 4, SchedulerConfig(max_num_batched_tokens=4, reserve_full_isl=reserve))
    b = reqs[1]
    if reserve:
        assert (b.first_scheduled, b.finished_step) == (2, 4)
        assert [s.tokens for s in result.steps] == [4, 1, 4, 4, 1]
    else:
        assert (b.first_scheduled, b.finished_step) == (1, 3)
        assert [s.tokens for s in result.steps] == [4, 4, 4, 2]


def test_two_preemptions_add_up():
    """The preemption above twice over: a second pair (other tokens) arrives at step 10, once
    the first has finished, and goes the same way. vLLM's preempted-request counters sum:
    two re-admissions of 5 tokens each, 4 of them hits each."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2, 3]), SimRequest("b", ids(10, 4), [1, 2, 3]),
            SimRequest("c", ids(20, 4), [1, 2, 3], arrival=10), SimRequest("d", ids(30, 4), [1, 2, 3], arrival=10)]
    result = simulate(reqs, 4, 4)
    assert [s.preempted for s in result.steps if s.preempted] == [["b"], ["d"]]
    assert (result.num_preemptions, result.preempted_queries, result.preempted_hits) == (2, 10, 8)
    assert [r.recomputed_hit_tokens for r in reqs] == [0, 4, 0, 4]


def test_a_preempted_request_recomputed_in_chunks_samples_only_at_the_end():
    """Caching off, 4 blocks (3 usable), budget 4. a: 4-token prompt, 6 outputs; b (4 tokens,
    3 outputs) arrives at step 1. Step 0: a prefills. Step 1: a's token 4 takes a block, b
    runs a 3-token chunk in the last free one. Step 2: b's 4th token, b samples one. Step 3:
    b's token 4 needs a block, none is free: b, last, is preempted. Steps 4-5: b (5 tokens
    now, 2 blocks with reserve_full_isl) waits while a's token 8 takes the freed block; a
    samples its 6th token at step 5 and frees 3 blocks. Step 6: b recomputes 4 of its 5
    tokens and samples nothing (its generated token is not recomputed yet); step 7 its 5th,
    then it samples; step 8 its last, and it finishes."""
    reqs = [SimRequest("a", ids(0, 4), [1, 2, 3, 4, 5, 6]), SimRequest("b", ids(10, 4), [1, 2, 3], arrival=1)]
    result = simulate(reqs, 4, 4, SchedulerConfig(max_num_batched_tokens=4), enable_caching=False)
    assert [(s.tokens, s.preempted, s.admitted, s.finished) for s in result.steps] == [
        (4, [], ["a"], []), (4, [], ["b"], []), (2, [], [], []), (1, ["b"], [], []), (1, [], [], []),
        (1, [], [], ["a"]), (4, [], ["b"], []), (1, [], [], []), (1, [], [], ["b"])]


def test_a_prompt_chunked_into_a_decoding_step_continues_its_prefill_next_step(cruise):
    """Budget 4. a (4-token prompt, 10 outputs) decodes alone from step 1. b (5-token prompt,
    1 output) arrives at step 3: a's decode leaves 3 tokens, so b runs a 3-token chunk; at
    step 4 a decodes and b computes its last 2 prompt tokens (3 tokens in the step), samples
    and finishes. a samples its 10th token at step 9."""
    reqs = [SimRequest("a", ids(0, 4), range(100, 110)), SimRequest("b", ids(50, 5), [1], arrival=3)]
    result = simulate(reqs, 16, 4, SchedulerConfig(max_num_batched_tokens=4))
    assert [s.tokens for s in result.steps] == [4, 1, 1, 4, 3, 1, 1, 1, 1, 1]
    assert [r.finished_step for r in reqs] == [9, 4]


def test_two_identical_requests_in_step_fill_one_hash_on_two_blocks(cruise):
    """Two identical requests at step 0 (4-token prompt, 6 outputs as a range): a takes block
    1, a2 block 2 (a's block is cached in the same step, but a 4-token prompt looks up no
    block). Step 1: blocks 3 and 4; step 4 fills both, with one hash: vLLM keeps both blocks
    under it (no de-duplication). Step 5: blocks 5 and 6, then both finish, a first: the
    uncached last blocks to the front, the cached ones to the back, tail first."""
    from pagetrace.sim.request import hash_block

    reqs = [SimRequest("a", ids(0, 4), range(100, 106)), SimRequest("a2", ids(0, 4), range(100, 106))]
    result = simulate(reqs, 16, 4)
    pool = result.policy.pool
    h0 = hash_block(None, range(0, 4), None)
    h1 = hash_block(h0, range(100, 104), None)
    assert pool.cached_items() == [(h0, [1, 2]), (h1, [3, 4])]
    assert pool.queue.order() == [6, 5, *range(7, 16), 3, 1, 4, 2]


def test_sglang_pages_of_one_token_take_one_page_a_decode_step(cruise):
    """SGLang's radix cache with pages of 1 token (its default page size), 16 slots (15
    usable): a 2-token prompt takes 2 pages at step 0, then each decode step 1 page."""
    r = SimRequest("r", [1, 2], [5, 6, 7, 8, 9])
    result = simulate([r], 16, 1, policy="sglang")
    assert [s.free_blocks for s in result.steps[:4]] == [13, 12, 11, 10]


def test_a_prompt_filling_no_block_publishes_no_event():
    """A 3-token prompt (block size 4) fills no block: vLLM's cache_full_blocks returns before
    publishing anything, so there is no BlockStored; nor when a prefix hit covers every full
    block and the rest is partial (b hits a's first block, its last 2 tokens fill nothing)."""
    assert simulate([SimRequest("s", [1, 2, 3], [9])], 3, 4, record_events=True).events == []
    reqs = [SimRequest("a", ids(0, 5), [9]), SimRequest("b", ids(0, 4) + [70, 71], [9], arrival=1)]
    events = simulate(reqs, 8, 4, record_events=True).events
    assert [step for step, _ in events] == [0] and [e[1] for e in events[0][1]] == ["a"]


def test_a_running_chunk_under_full_sequence_must_fit_counts_its_own_blocks():
    """3 free blocks; a 12-token prompt's first chunk (4 tokens) takes block 1. Its next call,
    6 tokens with `full_sequence_must_fit`: the whole prompt needs 3 blocks, it holds 1, so 2
    more, exactly the free ones; the chunk (10 tokens) needs the same 2. A 16-token prompt
    could never fit (4 blocks): its second chunk is refused though the chunk alone would fit;
    and a running request needing no new block gets none even with the pool empty."""
    from pagetrace.sim.policy import VllmPrefixCaching

    policy = VllmPrefixCaching(num_blocks=4, block_size=4)
    req = SimRequest("r", ids(0, 12), [1])
    assert policy.allocate_slots(req, 4) == [1]
    req.num_computed = 4
    assert policy.allocate_slots(req, 6, full_sequence_must_fit=True) == [2, 3]
    req.num_computed = 10
    assert policy.pool.num_free == 0
    assert policy.allocate_slots(req, 2, full_sequence_must_fit=True) == []
    policy = VllmPrefixCaching(num_blocks=4, block_size=4)
    long = SimRequest("long", ids(0, 16), [1])
    assert policy.allocate_slots(long, 4) == [1]
    long.num_computed = 4
    assert policy.allocate_slots(long, 4, full_sequence_must_fit=True) is None
    assert policy.block_ids("long") == [1] and policy.pool.num_free == 2


def test_a_block_with_the_first_and_last_ids_of_a_run_is_not_that_run():
    """Blocks are keyed by their token ids: [1, 9, 9, 4] starts and ends like [1, 2, 3, 4]
    but is another block, and a prompt made of it hits nothing of the first."""
    a = SimRequest("a", [1, 2, 3, 4, 5], [1])
    b = SimRequest("b", [1, 9, 9, 4, 5], [1], arrival=2)
    c = SimRequest("c", [1, 2, 3, 4, 6], [1], arrival=2)
    simulate([a, b, c], 8, 4)
    assert (b.num_cached_tokens, c.num_cached_tokens) == (0, 4)
