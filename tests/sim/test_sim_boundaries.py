"""The simulator at its boundaries, and its waste figures against counts made here by hand.

Each case is one a user hits first: a prompt that uses the step's token budget exactly, a
request that exactly fills a block another request shares, a block filled while decoding
and read again by a later prompt, a free-slot count exactly equal to what the next
request needs, an exact power of two under Pow2.
"""

from __future__ import annotations

import pytest

from pagetrace.sim.baselines import FirstFit, contiguous_waste, reservation_size
from pagetrace.sim.run import simulate
from pagetrace.sim.request import SimRequest
from pagetrace.sim.scheduler import Scheduler, SchedulerConfig
from pagetrace.sim.summary import summarize


def ids(start, n):
    return list(range(start, start + n))


@pytest.mark.parametrize("first", [40, 63])
def test_prompt_exactly_using_the_remaining_budget_is_admitted_with_chunked_prefill_off(first):
    """Budget 64, chunked prefill off: a prompt of exactly what is left runs this step;
    one token more waits for the next."""
    cfg = SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=False)
    fits = [SimRequest("a", ids(0, first), [1, 2]), SimRequest("b", ids(100, 64 - first), [1, 2])]
    result = simulate(fits, 64, 16, config=cfg)
    assert result.steps[0].admitted == ["a", "b"] and result.steps[0].tokens == 64
    over = [SimRequest("a", ids(0, first), [1, 2]), SimRequest("b", ids(100, 65 - first), [1, 2])]
    result = simulate(over, 64, 16, config=cfg)
    assert result.steps[0].admitted == ["a"] and result.steps[1].admitted == ["b"]


def test_prompt_exactly_using_the_budget_left_by_a_decode():
    """A running request decodes one token: a waiting prompt of exactly budget - 1 joins it."""
    cfg = SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=False)
    reqs = [SimRequest("a", ids(0, 20), ids(500, 5)), SimRequest("b", ids(100, 63), [1], arrival=1)]
    result = simulate(reqs, 64, 16, config=cfg)
    assert result.steps[1].admitted == ["b"] and result.steps[1].tokens == 64


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_request_exactly_filling_a_shared_block(policy):
    """A prompt of exactly one block (16 tokens) caches it; a later prompt that starts with
    those 16 tokens shares that block and computes only the rest."""
    a = SimRequest("a", ids(0, 16), ids(900, 20))
    b = SimRequest("b", ids(0, 16) + ids(300, 5), [1, 2, 3], arrival=2)
    result = simulate([a, b], 16, 16, tables_at=[2], policy=policy)
    assert b.num_cached_tokens == 16
    tables = result.tables_at[2]
    assert tables["a"][0] == tables["b"][0] and tables["a"][1] != tables["b"][1]
    assert result.steps[2].tokens == 1 + 5  # a's decode, b's 5 new tokens


def test_same_step_request_shares_the_block_another_just_filled():
    """vLLM caches a full block when it allocates it: a request admitted in the same step,
    after one whose 16-token prompt filled the block, already hits it."""
    a = SimRequest("a", ids(0, 16), [1, 2])
    b = SimRequest("b", ids(0, 16) + [7], [1, 2])
    result = simulate([a, b], 16, 16, tables_at=[0])
    assert b.num_cached_tokens == 16 and result.tables_at[0]["a"][0] == result.tables_at[0]["b"][0]


@pytest.mark.parametrize("outputs", [14, 7])
@pytest.mark.parametrize("cruise", [True, False])
@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_block_filled_while_decoding_is_reread_by_a_later_identical_prompt(outputs, cruise, policy, monkeypatch):
    """A 10-token prompt decodes: its first block (10 prompt + 6 output tokens) fills while
    decoding (vLLM hashes it on the decode fast path or in the cruising batch). With 7
    outputs the request stores its 16th and last token in that step and finishes. A later
    prompt of exactly those 16 tokens and 4 more hits the block."""
    from pagetrace.sim import scheduler as sched_mod

    if not cruise:
        step = sched_mod.Scheduler.step

        def slow_step(self):
            self.cruise = False
            return step(self)

        monkeypatch.setattr(sched_mod.Scheduler, "step", slow_step)
    prompt, output = ids(0, 10), ids(500, outputs)
    a = SimRequest("a", prompt, output)
    b = SimRequest("b", prompt + output[:6] + ids(800, 4), [1], arrival=30)
    c = SimRequest("c", prompt + output[:5] + ids(800, 5), [1], arrival=40)  # one token short of the block
    simulate([a, b, c], 16, 16, policy=policy)
    assert b.num_cached_tokens == 16
    assert c.num_cached_tokens == 0  # hits are whole blocks (pages of 16)


# -- waste figures: a workload counted by hand ------------------------------------------
#
# Block size 4, 4 blocks (3 usable): 12 slots; max_model_len 8. Final length = prompt +
# output - 1 (the last token is never stored). All arrive at step 0, in this order:
#   R1: prompt 3, output 2 -> final 4      R2: prompt 1, output 4 -> final 4
#   R3: prompt 3, output 2 -> final 4      R4: prompt 7, output 2 -> final 8
# Orca stores the prompt in the first step, then one token a step; it frees a range in the
# step its last token is stored; every figure is measured after the step's frees. External
# fragmentation: in a step whose head waiting request found no hole, the free slots at
# admission, when they are at least what it needs.
#
# Oracle (sizes 4, 4, 4, 8), which Pow2 equals here (4 and 8 are powers of two):
#   step 0: R1 [0,4) R2 [4,8) R3 [8,12); R4 waits (0 free). Stored 3, 1, 3: tokens 7, reserved 1+3+1 = 5
#   step 1: R4 waits (0 free). R1 and R3 store their 4th and finish; R2 stores 2: tokens 2, reserved 2
#   step 2: R4 needs 8, holes 4 + 4 = exactly 8 free: external 8. R2 stores 3: tokens 3, reserved 1
#   step 3: R4 waits again (8 free): external 8. R2 stores 4 and finishes.
#   step 4: R4 [0,8), stores 7: tokens 7, reserved 1.   step 5: stores 8, finishes.
#   -> tokens 19, reservation 9, internal 0, external 16; 6 steps, at most 3 running.
# Max (size 8 each): one request at a time (12 slots hold one range of 8; 4 free < 8: no external):
#   R1 steps 0-1: step 0 tokens 3, reserved 1, internal 4; finishes in step 1.
#   R2 steps 2-5: (1, 3, 4), (2, 2, 4), (3, 1, 4); finishes in step 5.
#   R3 steps 6-7: (3, 1, 4).   R4 steps 8-9: (7, 1, 0).
#   -> tokens 3+1+2+3+3+7 = 19, reservation 1+3+2+1+1+1 = 9, internal 4 * 5 = 20, external 0; 10 steps.
# Paged (vLLM, caching off; empty slots = the tails of running requests' last blocks):
#   step 0: R1, R2, R3 one block each (3, 1, 3 tokens); R4's 7 tokens need 2 blocks, none free.
#           3 blocks used, 5 empty slots: tokens 7, internal 5
#   step 1: R1 and R3 compute their 4th token and finish; R2 has 2: tokens 2, internal 2
#   step 2: R4 (2 blocks) prefills 7; R2 has 3: 3 blocks, 12 - 10 = 2 empty: tokens 10, internal 2
#   step 3: R2 and R4 finish. 0 blocks.
#   -> tokens 19, internal 9, reservation 0, external 0; 4 steps, at most 3 running.

HAND = {
    "vLLM (paged)": dict(token_states=19, reservation=0, internal=9, external=0, steps=4, peak_running=3),
    "Orca (Max)": dict(token_states=19, reservation=9, internal=20, external=0, steps=10, peak_running=1),
    "Orca (Pow2)": dict(token_states=19, reservation=9, internal=0, external=16, steps=6, peak_running=3),
    "Orca (Oracle)": dict(token_states=19, reservation=9, internal=0, external=16, steps=6, peak_running=3),
}


def hand_workload():
    return [SimRequest("R1", ids(0, 3), [1, 2]), SimRequest("R2", ids(10, 1), [1, 2, 3, 4]),
            SimRequest("R3", ids(20, 3), [1, 2]), SimRequest("R4", ids(30, 7), [1, 2])]


def test_waste_of_a_hand_counted_workload_every_system_every_category():
    result = simulate(hand_workload(), 4, 4, enable_caching=False, max_model_len=8)
    summary = summarize(result, result.causes, 4, 8, 256)
    got = {w.system: dict(token_states=w.token_states, reservation=w.reservation, internal=w.internal,
                          external=w.external, steps=w.steps, peak_running=w.peak_running) for w in summary.waste}
    assert got == HAND
    shares = {w.system: w.shares() for w in summary.waste}
    assert shares["Orca (Max)"]["internal fragmentation"] == pytest.approx(20 / 48)
    assert shares["Orca (Oracle)"]["external fragmentation"] == pytest.approx(16 / 44)
    assert shares["vLLM (paged)"]["token states"] == pytest.approx(19 / 28)


def test_pow2_differs_from_oracle_only_by_its_rounding():
    """R2 made final 5 (prompt 1, output 5): Pow2 reserves 8 for it where Oracle reserves 5."""
    reqs = [SimRequest("R1", ids(0, 1), [1, 2, 3, 4, 5])]
    pow2 = contiguous_waste(reqs, 12, "pow2", 8)
    oracle = contiguous_waste(reqs, 12, "oracle", 8)
    # steps store 1, 2, 3, 4, 5 (finishes at 5): measured in 4 steps, reserved 4 + 3 + 2 + 1
    assert (oracle.token_states, oracle.reservation, oracle.internal) == (10, 10, 0)
    assert (pow2.token_states, pow2.reservation, pow2.internal) == (10, 10, 3 * 4)


def test_reservation_sizes_at_their_boundaries():
    assert [reservation_size("pow2", n, 64) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [1, 2, 4, 4, 8, 8, 16, 16, 32]
    assert reservation_size("pow2", 33, 48) == 48  # capped at the maximum length
    assert reservation_size("max", 3, 48) == 48 and reservation_size("oracle", 3, 48) == 3


def test_first_fit_exact_hole_and_merges():
    pool = FirstFit(12)
    assert [pool.allocate(4), pool.allocate(4), pool.allocate(4)] == [0, 4, 8]
    assert pool.allocate(1) is None and pool.free_slots == 0
    pool.free(0, 4)
    pool.free(8, 4)
    assert pool.free_slots == 8 and pool.allocate(8) is None  # two holes of 4
    assert pool.allocate(4) == 0  # an exact fit takes the hole away
    assert (pool.starts, pool.sizes) == ([8], [4])
    pool.free(0, 4)
    pool.free(4, 4)  # merges with the holes before and after
    assert (pool.starts, pool.sizes) == ([0], [12])


def test_free_slots_exactly_the_need_count_as_external_in_every_orca_mode():
    """The hand workload: R4 needs 8 and finds two holes of exactly 4 + 4 = 8 free slots:
    counted as external (twice). With one slot more the holes are 4 + 5: 9 counted twice."""
    for mode in ("pow2", "oracle"):
        assert contiguous_waste(hand_workload(), 12, mode, 8).external == 2 * 8
        assert contiguous_waste(hand_workload(), 13, mode, 8).external == 2 * 9


def test_summary_of_the_hand_workload_field_by_field():
    result = simulate(hand_workload(), 4, 4, enable_caching=False, max_model_len=8)
    s = summarize(result, result.causes, 4, 8, 256)
    doc = s.to_json()
    assert {k: doc[k] for k in ("requests", "prefix_requests", "steps", "preemptions", "preempted_requests", "prompt_tokens",
                                "peak_used_blocks", "usable_blocks", "peak_running", "evictions", "hit_rate")} == {
        "requests": 4, "prefix_requests": 0, "steps": 4, "preemptions": 0, "preempted_requests": 0, "prompt_tokens": 14,
        "peak_used_blocks": 3, "usable_blocks": 3, "peak_running": 3, "evictions": 0, "hit_rate": 0.0}
    assert s.cache == "vLLM (paged)" and [w["system"] for w in doc["waste"]] == list(HAND)
    assert doc["waste"][1]["slot_steps"] == {"token states": 19, "reservation": 9, "internal fragmentation": 20, "external fragmentation": 0}
    assert doc["prompt_tokens_by_cause"] == s.causes and sum(s.causes.values()) == 14


def test_preempted_requests_are_counted_once_each():
    reqs = [SimRequest(str(i), ids(1000 * i, 30), ids(0, 40)) for i in range(2)]
    result = simulate(reqs, 6, 16, enable_caching=False)  # 5 usable blocks: the second is preempted while the first decodes
    s = summarize(result, result.causes, 16, 70, 256)
    assert s.preemptions == result.num_preemptions >= 1 and s.preempted_requests == 1


def test_orca_keeps_arrival_steps_and_the_sequence_limit():
    """A request arriving at step 5 into an empty pool waits idle steps uncounted; with
    max_num_seqs 1 a second request waits for the first although there is room."""
    late = [SimRequest("R1", ids(0, 3), [1, 2], arrival=5)]
    w = contiguous_waste(late, 12, "oracle", 8)
    assert (w.steps, w.token_states, w.reservation) == (2, 3, 1)
    two = [SimRequest("A", ids(0, 3), [1, 2]), SimRequest("B", ids(10, 3), [1, 2])]
    w = contiguous_waste(two, 12, "oracle", 8, max_num_seqs=1)
    assert (w.steps, w.peak_running, w.external) == (4, 1, 0)
    w = contiguous_waste(two, 12, "oracle", 8, max_num_seqs=2)
    assert (w.steps, w.peak_running) == (2, 2)
    gap = [SimRequest("A", ids(0, 3), [1, 2]), SimRequest("B", ids(10, 3), [1, 2], arrival=9)]
    assert contiguous_waste(gap, 12, "oracle", 8).steps == 4  # 2 + 2: the idle steps 2-8 are not counted


def test_orca_takes_a_request_exactly_the_pool_and_refuses_one_past_it():
    exact = [SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5])]  # final 12: exactly the 12 slots
    assert contiguous_waste(exact, 12, "oracle", 12).token_states == 8 + 9 + 10 + 11
    with pytest.raises(ValueError, match="request R needs 13 contiguous slots; the pool has 12"):
        contiguous_waste([SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5, 6])], 12, "oracle", 13)
    with pytest.raises(ValueError, match="request R needs 13 contiguous slots; the pool has 20"):
        contiguous_waste([SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5, 6])], 20, "oracle", 12)  # final 13 > max_model_len 12


def test_empty_waste_shares_and_an_empty_run():
    from pagetrace.sim.baselines import Waste

    assert Waste("x").shares() == {"token states": 0.0, "reservation": 0.0, "internal fragmentation": 0.0, "external fragmentation": 0.0}
    w = Waste("x", token_states=1, reservation=1)
    assert w.shares()["token states"] == 0.5


def test_simulate_takes_a_request_exactly_the_pool_and_max_model_len():
    """3 usable blocks of 4 hold 12 tokens: prompt 8 + output 5 stores 12 (the last token is
    never stored) and runs; one more output token is refused up front, in words."""
    result = simulate([SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5])], 4, 4, max_model_len=12)
    assert len(result.steps) == 5 and result.steps[-1].finished == ["R"]
    with pytest.raises(ValueError) as caught:
        simulate([SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5, 6])], 4, 4)
    assert str(caught.value) == "request R needs 4 blocks of 4 tokens at its longest, more than the 3 usable blocks of the pool"
    with pytest.raises(ValueError) as caught:
        simulate([SimRequest("R", ids(0, 8), [1, 2, 3, 4, 5])], 8, 4, max_model_len=11)
    assert str(caught.value) == "request R stores 12 tokens at its longest, more than max_model_len=11"
    with pytest.raises(ValueError, match="unknown cache policy 'lru': one of vllm, sglang"):
        simulate([SimRequest("R", ids(0, 8), [1])], 8, 4, policy="lru")


def test_simulate_stops_at_exactly_max_steps():
    from pagetrace.errors import RuntimeFailure

    reqs = lambda: [SimRequest("R", ids(0, 3), [1, 2, 3, 4])]  # noqa: E731 - 4 steps
    assert len(simulate(reqs(), 8, 4, max_steps=4).steps) == 4
    with pytest.raises(RuntimeFailure, match="the simulation did not finish within 3 steps"):
        simulate(reqs(), 8, 4, max_steps=3)


def test_on_step_sees_every_record_and_the_occupancy_stops_at_max_cells():
    seen = []
    result = simulate(hand_workload(), 4, 4, enable_caching=False, record_occupancy=True, max_cells=3 * 4, on_step=seen.append)
    assert seen == result.steps and len(seen) == 4
    assert len(result.occupancy) == 3 and result.occupancy_cut  # 3 rows of 4 blocks fit in 12 cells
    assert result.occupancy[0][1:] == [0, 1, 2] and result.shared[0] == []
    full = simulate(hand_workload(), 4, 4, enable_caching=False, record_occupancy=True, max_cells=4 * 4)
    assert len(full.occupancy) == 4 and not full.occupancy_cut
