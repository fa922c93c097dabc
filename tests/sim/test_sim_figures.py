"""The simulator's figures on small workloads counted here by hand: each prompt token's
hit/miss cause, the waste of the Orca baselines and of paging, the summary's document,
and the occupancy map.

Every expectation below is worked out in the comments from the rules the modules follow
(vLLM's lookup of whole blocks of the first `num_tokens - 1` tokens, its free queue, SGLang's
whole-leaf eviction, Orca's first-fit contiguous reservation), not read off a run.
"""

from __future__ import annotations

import pytest

from pagetrace.sim.baselines import FirstFit, Waste, contiguous_waste, paged_waste
from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import CACHED, FREE, simulate
from pagetrace.sim.summary import summarize


def ids(start, stop):
    return list(range(start, stop))


def why(result):
    """Each request's causes, the zero ones left out."""
    return {r.request_id: {k: v for k, v in r.why.items() if v} for r in result.requests}


# -- causes ------------------------------------------------------------------------------
#
# Block size 4, a pool large enough that nothing is evicted; one request at a time (each
# arrives after the one before has finished: one prefill step, one output token).
#   A  tokens 1-8 + [100]            lookup 2 blocks (8 of 9 tokens), first seen 8, partial 1
#   D  tokens 1-8 + [300], salt s    A's blocks under another key: the same tokens were cached
#                                    without a salt (in ever_cached): different extra key 8
#   P  tokens 50-57 + [1], salt s    never seen: first seen 8
#   E  tokens 50-57 + [2], salt t    cached only under salt s (ever_cached_content): different key 8
#   F  tokens 50-57 + [3], no salt   cached only salted: different extra key 8 (the unsalted chain)
#   C  tokens 1-8 exactly            ends on a block boundary: only 7 tokens are looked up, one
#                                    whole block: hit 4, partial 4 (the second block)
#   G  tokens 1-8 + [400], salt s    D's chain: hit 8, partial 1
SALTED = {
    "A": {"partial block": 1, "first seen": 8},
    "D": {"partial block": 1, "different extra key": 8},
    "P": {"partial block": 1, "first seen": 8},
    "E": {"partial block": 1, "different extra key": 8},
    "F": {"partial block": 1, "different extra key": 8},
    "C": {"hit": 4, "partial block": 4},
    "G": {"hit": 8, "partial block": 1},
}


def salted_workload():
    return [
        SimRequest("A", ids(1, 9) + [100], [1]),
        SimRequest("D", ids(1, 9) + [300], [1], arrival=1, cache_salt="s"),
        SimRequest("P", ids(50, 58) + [1], [1], arrival=2, cache_salt="s"),
        SimRequest("E", ids(50, 58) + [2], [1], arrival=3, cache_salt="t"),
        SimRequest("F", ids(50, 58) + [3], [1], arrival=4),
        SimRequest("C", ids(1, 9), [1], arrival=5),
        SimRequest("G", ids(1, 9) + [400], [1], arrival=6, cache_salt="s"),
    ]


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_causes_of_salted_and_unsalted_prompts_request_by_request(policy):
    result = simulate(salted_workload(), 64, 4, policy=policy)
    assert why(result) == SALTED
    assert result.causes == {"hit": 12, "partial block": 10, "evicted": 0, "different extra key": 24, "first seen": 16}


def test_causes_with_caching_off_are_partial_block_and_first_seen_only():
    """Nothing is cached, so nothing was ever seen: every whole looked-up block is first
    seen (8 a request, C's one block 4: 52), the rest partial (1 a request, C's 4: 10)."""
    result = simulate(salted_workload(), 64, 4, enable_caching=False)
    assert result.causes == {"hit": 0, "partial block": 10, "evicted": 0, "different extra key": 0, "first seen": 52}


# Eviction, block size 4, 5 usable blocks:
#   A  tokens 1-12 + [100] (13 tokens, 4 blocks; 3 full blocks cached: [1-4] [5-8] [9-12]).
#      vLLM's free queue [1 2 3 4 5]: A takes 1-4; freed tail first, the queue is [5 4 3 2 1].
#   X  arrives at step 1, 9 own tokens (3 blocks): takes 5, 4 and 3, evicting [9-12].
#   B  arrives at step 2, tokens 1-16 + [200] (17 tokens): looks up 4 blocks; [1-4] [5-8] hit,
#      [9-12] was cached and evicted, [13-16] is first seen; 1 token partial.
# SGLang: A's 12 tokens are one leaf of 3 pages; X needs 3 pages with 2 free (5 and A's
# unaligned tail page) and evicts a whole leaf: all of A's. B: evicted 12, first seen 4.
EVICTED = {
    "vllm": {"hit": 8, "partial block": 1, "evicted": 4, "first seen": 4},
    "sglang": {"partial block": 1, "evicted": 12, "first seen": 4},
}


@pytest.mark.parametrize("salt", [None, "s"])
@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_an_evicted_block_and_the_first_seen_one_after_it(policy, salt):
    reqs = [SimRequest("A", ids(1, 13) + [100], [1], cache_salt=salt), SimRequest("X", ids(500, 509), [1], arrival=1),
            SimRequest("B", ids(1, 17) + [200], [1], arrival=2, cache_salt=salt)]
    result = simulate(reqs, 6, 4, policy=policy)
    assert why(result)["B"] == EVICTED[policy]
    assert [s.evicted for s in result.steps][:2] == ([0, 1] if policy == "vllm" else [0, 3])


# -- Orca's baselines ----------------------------------------------------------------------


def test_orca_admits_a_request_arriving_while_another_runs_at_its_step():
    """Oracle, 12 slots. A: prompt 3, 4 outputs (final 6), from step 0; B: prompt 2, 3
    outputs (final 4), arrives at step 2.
      step 0: A [0,6) stores 3: tokens 3, reserved 3
      step 1: A stores 4: tokens 4, reserved 2
      step 2: B [6,10) stores 2, A 5: tokens 7, reserved 1 + 2
      step 3: A stores 6 and finishes; B 3: tokens 3, reserved 1
      step 4: B stores 4 and finishes.
    (Admitted a step early, B would finish with A: 4 steps.)"""
    reqs = [SimRequest("A", ids(0, 3), [1, 2, 3, 4]), SimRequest("B", ids(10, 12), [1, 2, 3], arrival=2)]
    w = contiguous_waste(reqs, 12, "oracle", 8)
    assert (w.token_states, w.reservation, w.internal, w.external, w.steps, w.peak_running) == (17, 9, 0, 0, 5, 2)


def test_orca_runs_at_most_256_requests_at_once_by_default():
    reqs = [SimRequest(str(i), [i], [1, 2]) for i in range(257)]  # each stores 1 then 2 (final 2)
    w = contiguous_waste(reqs, 1000, "oracle", 8)
    # step 0: 256 store 1, the 257th waits (max_num_seqs); step 1: the 256 are still running when
    # admission runs, then store 2 and finish; step 2: the 257th stores 1; step 3: it finishes
    assert (w.steps, w.peak_running, w.token_states, w.reservation) == (4, 256, 256 + 1, 256 + 1)


def test_summary_passes_max_num_seqs_to_the_baselines():
    """The hand workload of test_sim_boundaries.py (R1 3+2, R2 1+4, R3 3+2, R4 7+2 tokens) in 12
    slots, one request at a time: R1 (3,1), R2 (1,3) (2,2) (3,1), R3 (3,1), R4 (7,1), each also
    finishing in a step of its own: 10 steps, tokens 19, reserved 9; no request ever waits
    for a hole, so no external fragmentation. Max additionally wastes 4 slots a step in the
    first three (size 8 against final 4): 5 steps measured, 20."""
    reqs = [SimRequest("R1", ids(0, 3), [1, 2]), SimRequest("R2", ids(10, 11), [1, 2, 3, 4]),
            SimRequest("R3", ids(20, 23), [1, 2]), SimRequest("R4", ids(30, 37), [1, 2])]
    result = simulate(reqs, 4, 4, enable_caching=False, max_model_len=8)
    s = summarize(result, result.causes, 4, 8, 1)
    got = {w.system: (w.token_states, w.reservation, w.internal, w.external, w.steps, w.peak_running) for w in s.waste}
    assert got == {
        "vLLM (paged)": (19, 0, 9, 0, 4, 3),  # the scheduler's own max_num_seqs is not summarize's
        "Orca (Max)": (19, 9, 20, 0, 10, 1),
        "Orca (Pow2)": (19, 9, 0, 0, 10, 1),
        "Orca (Oracle)": (19, 9, 0, 0, 10, 1),
    }


def test_waste_document_and_the_paged_default_label():
    w = Waste("Orca (Pow2)", token_states=6, reservation=3, internal=2, external=1, steps=4, peak_running=2)
    assert w.to_json() == {
        "system": "Orca (Pow2)",
        "slot_steps": {"token states": 6, "reservation": 3, "internal fragmentation": 2, "external fragmentation": 1},
        "shares": {"token states": 0.5, "reservation": 0.25, "internal fragmentation": 2 / 12, "external fragmentation": 1 / 12},
        "steps": 4,
        "peak_running": 2,
    }
    assert paged_waste([], 16).system == "vLLM (paged)"


def test_first_fit_merges_a_freed_range_with_the_hole_before_among_several():
    """Ranges [0,2) [2,5) [5,8) [8,12); free [0,2) and [8,12): holes of 2 and 4. Freeing [2,5)
    joins the hole before it ([0,5)), not the one after: a request of 5 then fits at 0."""
    pool = FirstFit(12)
    assert [pool.allocate(n) for n in (2, 3, 3, 4)] == [0, 2, 5, 8]
    pool.free(0, 2)
    pool.free(8, 4)
    pool.free(2, 3)
    assert (pool.starts, pool.sizes) == ([0, 8], [5, 4])
    assert pool.allocate(5) == 0


def test_first_fit_merges_a_freed_range_with_the_hole_after_among_several():
    """Holes [0,2) and [8,12) (ranges [2,5) and [5,8) taken): freeing [5,8) joins the hole after
    it ([5,12)) and leaves the one before alone; a request of 7 then fits at 5."""
    pool = FirstFit(12)
    assert [pool.allocate(n) for n in (2, 3, 3, 4)] == [0, 2, 5, 8]
    pool.free(0, 2)
    pool.free(8, 4)
    pool.free(5, 3)
    assert (pool.starts, pool.sizes) == ([0, 5], [2, 7])
    assert pool.allocate(7) == 5


# -- the summary ---------------------------------------------------------------------------


def test_summary_shares_by_cause_and_its_cache_label():
    """SALTED's totals over its 62 prompt tokens (six of 9, C's 8), under SGLang's cache (its label kept)."""
    result = simulate(salted_workload(), 64, 4, policy="sglang")
    s = summarize(result, result.causes, 4, 64, 256)
    doc = s.to_json()
    assert s.cache == "SGLang (radix)" and doc["prompt_tokens"] == 62
    assert doc["share_by_cause"] == {"hit": 12 / 62, "partial block": 10 / 62, "evicted": 0.0, "different extra key": 24 / 62,
                                     "first seen": 16 / 62}
    assert doc["hit_rate"] == 12 / 62


def test_summary_of_a_run_without_requests():
    result = simulate([], 8, 4)
    doc = summarize(result, result.causes or dict.fromkeys(("hit", "partial block", "evicted", "different extra key", "first seen"), 0),
                    4, 16, 256).to_json()
    assert (doc["steps"], doc["prompt_tokens"], doc["peak_used_blocks"], doc["peak_running"], doc["hit_rate"]) == (0, 0, 0, 0, 0.0)
    assert set(doc["share_by_cause"].values()) == {0.0}
    assert [w["steps"] for w in doc["waste"]] == [0, 0, 0, 0]


# -- the occupancy map -----------------------------------------------------------------------


def test_occupancy_shows_shared_blocks_once_and_cached_free_blocks():
    """vLLM, block size 4, 6 usable blocks. A and B (tokens 1-8 + one of their own, 2 outputs)
    are admitted in step 0: A takes blocks 1, 2, 3; B finds A's two full blocks cached and
    takes 4 for its own token. Step 0's row: block 0 (null) free, 1 and 2 A's (index 0, the
    first holder; also in `shared`), 3 A's, 4 B's (index 1), 5 and 6 free. Step 1: both finish;
    blocks 1 and 2 keep their hashes (cached), 3 and 4 held no full block (free)."""
    reqs = [SimRequest("A", ids(1, 9) + [100], [1, 2]), SimRequest("B", ids(1, 9) + [200], [1, 2])]
    result = simulate(reqs, 7, 4, record_occupancy=True)
    assert result.occupancy == [[FREE, 0, 0, 0, 1, FREE, FREE], [FREE, CACHED, CACHED, FREE, FREE, FREE, FREE]]
    assert result.shared == [[1, 2], []]
    assert (FREE, CACHED) == (-1, -2)


# -- simulate's options ----------------------------------------------------------------------


def test_what_a_plain_run_records_and_the_collector_left_as_found():
    import gc

    result = simulate([SimRequest("A", ids(1, 5), [1])], 8, 4)
    assert (result.occupancy, result.shared, result.events, result.history, result.group_blocks) == (None, None, None, None, None)
    assert (result.num_preemptions, result.prefix_requests, result.occupancy_cut) == (0, 0, False)
    assert gc.isenabled()  # paused for the run only
    gc.disable()
    try:
        simulate([SimRequest("A", ids(1, 5), [1])], 8, 4)
        assert not gc.isenabled()  # a caller's disabled collector stays disabled
    finally:
        gc.enable()


def test_kv_events_come_request_by_request_within_a_step():
    """Block size 4: a (6 prompt tokens) and b (5) fill their first block in step 0 and their
    second when 8 tokens are computed: a at step 2 (6 + 2 decoded), b at step 3. With a and b
    both of 6 tokens, step 2 stores a's block then b's, in the order they were scheduled."""
    reqs = [SimRequest("a", ids(1, 7), ids(100, 110)), SimRequest("b", ids(50, 55), ids(200, 210))]
    result = simulate(reqs, 16, 4, record_events=True)
    got = [(step, [(kind, rid, i) for kind, rid, i, _ in events]) for step, events in result.events]
    assert got[:3] == [(0, [("stored", "a", 0), ("stored", "b", 0)]), (2, [("stored", "a", 1)]), (3, [("stored", "b", 1)])]
    both = simulate([SimRequest("a", ids(1, 7), ids(100, 110)), SimRequest("b", ids(50, 56), ids(200, 210))], 16, 4, record_events=True)
    assert [(step, [(rid, i) for _, rid, i, _ in events]) for step, events in both.events][:2] == [(0, [("a", 0), ("b", 0)]), (2, [("a", 1), ("b", 1)])]
    with pytest.raises(ValueError) as caught:
        simulate([SimRequest("a", ids(1, 7), [1])], 16, 4, record_events=True, policy="sglang")
    assert str(caught.value) == "the sglang cache publishes no vLLM KV events"


def test_the_history_keeps_between_keep_and_twice_keep_pool_counts():
    """One request, 2,002 steps (a prompt of 1, 2,002 outputs). The pool is counted at every
    step until more than 2 x 1000 counts are held (after step 2000's, the 2,001st): then every
    other step, the odd ones dropped: 1,001 counts, stride 2. keep_steps=10: the stride doubles
    whenever a 21st count comes; at stride 64 that is step 20 x 64 = 1,280, then stride 128
    keeps the multiples of 128 up to step 2,001: 0 ... 1,920, 16 counts. The run's last step (2,001)
    is counted too, after the run (`close`), so the page's slider reaches it."""
    run = lambda **kw: simulate([SimRequest("A", [1], ids(1, 2003))], 130, 16, record_history=True, **kw)  # noqa: E731
    h = run().history
    assert len(h.changes) == 2002 and (h.stride, len(h.pool)) == (2, 1002) and min(h.pool) == 0 and max(h.pool) == 2001
    h = run(keep_steps=10).history
    assert (h.stride, len(h.pool)) == (128, 17) and max(h.pool) == 2001
    assert h.pool[0] == (128, 1, 0, 0)  # (free, used, cached, shared) of 129 usable blocks after step 0


def hybrid_run(**kw):
    """tests/sim/test_sim_hybrid.py's case through simulate: one full and one sliding (window
    40) group, block size 16, 24 blocks; a: a 100-token prompt, 3 outputs; b: the same prompt at step 5."""
    from pagetrace.sim.hybrid import FULL, SLIDING, KVGroup, LayerKind
    from pagetrace.sim.scheduler import SchedulerConfig

    prompt = ids(1000, 1100)
    reqs = [SimRequest("a", prompt, [1, 2, 3]), SimRequest("b", prompt, [4, 5], arrival=5)]
    groups = [KVGroup(LayerKind(FULL), 1), KVGroup(LayerKind(SLIDING, 40), 1)]
    return simulate(reqs, 24, 16, config=SchedulerConfig(4096, 8, True), groups=groups, record_history=True, **kw)


@pytest.mark.parametrize(("retention", "cached"), [("default", (0, 9)), (0, (0, 9)), (None, (3, 12))])
def test_a_hybrid_run_by_group_and_what_its_retention_keeps_cached(retention, cached):
    """Step 0: cdiv(100, 16) = 7 blocks a group, 14 used. Step 1: 100 - 40 + 1 = 61 tokens left
    the window: the sliding group's first 3 blocks go (it holds 4). vLLM's default retention 0
    caches none of them (free 12, cached 0); dense (None) keeps them cached (free 9, cached 3).
    Step 2: a finishes: cached are the full group's 6 full blocks and the sliding group's 3 before
    the replay boundary (token 99): 9; dense all 6 of its full blocks: 12. b (steps 3-4) hits
    6 blocks, 96 tokens, and holds 7 + 4 real blocks."""
    result = hybrid_run() if retention == "default" else hybrid_run(retention=retention)
    assert result.group_blocks == [[7, 7], [7, 4], [0, 0], [7, 4], [0, 0]]
    pool = result.history.pool
    assert pool[0] == (9, 14, 0, 0)
    assert pool[1] == (12 - cached[0], 11, cached[0], 0) and pool[2] == (23 - cached[1], 0, cached[1], 0)
    assert [r.num_cached_tokens for r in result.requests] == [0, 96]


def test_a_hybrid_request_exactly_the_pool_runs_and_one_block_more_is_refused():
    """Budget 16 tokens, window 40, block size 16: the sliding group holds at most
    cdiv(39 + 16, 16) + 1 = 5 blocks of a request; 200 stored tokens need 13 full-group blocks:
    18 in all. 18 usable blocks run it; 17 refuse it, counting by group."""
    from pagetrace.sim.hybrid import FULL, SLIDING, KVGroup, LayerKind
    from pagetrace.sim.scheduler import SchedulerConfig

    groups = [KVGroup(LayerKind(FULL), 1), KVGroup(LayerKind(SLIDING, 40), 1)]
    cfg = SchedulerConfig(max_num_batched_tokens=16)
    req = lambda: [SimRequest("a", ids(1, 201), [1])]  # noqa: E731
    assert simulate(req(), 19, 16, config=cfg, groups=groups).steps[-1].finished == ["a"]
    with pytest.raises(ValueError) as caught:
        simulate(req(), 18, 16, config=cfg, groups=groups)
    assert str(caught.value) == "request a needs 18 blocks of 16 tokens at its longest, more than the 17 usable blocks of the pool"
    with pytest.raises(ValueError) as caught:
        simulate(req(), 19, 16, config=cfg, groups=groups, policy="sglang")
    assert str(caught.value) == "the sglang cache has no KV cache groups; hybrid models run with the vllm policy"


def test_sglang_occupancy_through_whole_leaf_evictions():
    """The eviction workload above under SGLang (page size 4, pages 1-5 free, freed pages go to
    the front of the free list):
      step 0: A takes 1-4; finished, its 12 whole tokens (pages 1-3) stay in the tree as one
              leaf (cached) and page 4 is freed: cached 1 2 3, free 4 5
      step 1: X needs 3 pages, 2 are free: the LRU leaf goes whole (3 pages evicted), X takes
              1 2 3, inserts its 8 whole tokens (1 2) and frees 3: cached 1 2, free 3 4 5
      step 2: B needs 5 pages, 3 are free: X's leaf goes (2 more evicted); B inserts its 16
              whole tokens (4 pages): cached 1-4 in some order, one page free
    Every page evicted and freed is free again, not cached; 5 pages evicted in all."""
    reqs = [SimRequest("A", ids(1, 13) + [100], [1]), SimRequest("X", ids(500, 509), [1], arrival=1),
            SimRequest("B", ids(1, 17) + [200], [1], arrival=2)]
    result = simulate(reqs, 6, 4, policy="sglang", record_occupancy=True)
    assert result.occupancy[:2] == [[FREE, CACHED, CACHED, CACHED, FREE, FREE], [FREE, CACHED, CACHED, FREE, FREE, FREE]]
    assert sorted(result.occupancy[2]) == [CACHED] * 4 + [FREE] * 2
    assert result.policy.pool.evictions == 5 and [s.evicted for s in result.steps] == [0, 3, 2]
    assert result.policy.block_ids("B") == [] and result.policy.block_ids("nobody") == []
    s = summarize(result, result.causes, 4, 17, 256)  # B stores 17 tokens: max_model_len 17
    # each request finishes in the step it is admitted: measured after the step, no page is held
    assert (s.evictions, s.usable_blocks, s.peak_used_blocks) == (5, 5, 0)


def test_a_run_without_evictions_counts_none():
    for policy in ("vllm", "sglang"):
        result = simulate(salted_workload(), 64, 4, policy=policy)
        assert result.policy.pool.evictions == 0 and summarize(result, result.causes, 4, 64, 256).evictions == 0


def test_sglang_checkpoints_a_one_token_prompt_after_its_prefill():
    """Page size 1: A's prompt is one token, [7]; its prefill step ends with the page in the
    tree (SGLang checkpoints every prefill), while A goes on decoding. B ([7, 8]) arrives at
    step 1 and looks up its first token: a hit of 1, its last token partial. A's own lookup
    is of 0 tokens: its one token partial."""
    reqs = [SimRequest("A", [7], [1, 2, 3, 4]), SimRequest("B", [7, 8], [1], arrival=1)]
    result = simulate(reqs, 16, 1, policy="sglang")
    assert why(result) == {"A": {"partial block": 1}, "B": {"hit": 1, "partial block": 1}}


def test_a_prompt_past_the_budget_with_chunked_prefill_off_is_refused_for_the_budget():
    """Chunked prefill off, budget 16: a 20-token prompt can never be scheduled, and the
    refusal says so (the pool, 63 blocks of 4 tokens, holds it easily). A prompt exactly the
    budget runs; a request the pool cannot hold is refused for the pool."""
    from pagetrace.sim.scheduler import SchedulerConfig

    cfg = SchedulerConfig(max_num_batched_tokens=16, enable_chunked_prefill=False)
    with pytest.raises(ValueError) as caught:
        simulate([SimRequest("R", ids(0, 20), [1, 2])], 64, 4, config=cfg)
    assert str(caught.value) == "request R needs 20 tokens in one step with chunked prefill off, more than max_num_batched_tokens=16"
    assert len(simulate([SimRequest("R", ids(0, 16), [1, 2])], 64, 4, config=cfg).steps) == 2


def test_kv_events_name_the_request_whose_allocation_dropped_a_hash():
    """16 blocks of 2 tokens, four requests decoding side by side until the pool runs out and
    allocations evict cached blocks. `simulate(record_events=True)` must give, step by step,
    the events of a scheduler stepped explicitly, request by request (cruising off): each
    removal is the request's whose allocation dropped it, in scheduling order. (Cruising batches
    a step's allocations: it would pin step 5's removal on request 3, not 1.)"""
    from sim_drive import drive

    from pagetrace.sim.policy import VllmPrefixCaching
    from pagetrace.sim.scheduler import Scheduler

    def reqs():
        return [SimRequest("0", [3, 3, 3, 3, 1, 2], ids(100, 104)), SimRequest("1", [1, 2, 2], ids(100, 104), arrival=3),
                SimRequest("2", [1, 3, 1, 1, 3, 1, 2, 2, 1], ids(100, 107), arrival=1), SimRequest("3", [1, 3], ids(100, 110), arrival=3)]

    policy = VllmPrefixCaching(16, 2)
    log = policy.record_events()
    sched = Scheduler(policy)
    sched.cruise = False
    expected = []
    for step, _ in enumerate(drive(sched, reqs(), 100)):
        if log:
            expected.append((step, list(log)))
            log.clear()
    got = simulate(reqs(), 16, 2, record_events=True).events
    assert got == expected
    assert [e for e in dict(got)[5] if e[0] == "removed"][0][2] == "1"
