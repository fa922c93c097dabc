"""The run's history for `simulate --html` (pagetrace/sim/history.py): the block tables as
per-step changes, and the pool by state at every stride-th step, against hand-counted runs
and against `simulate(tables_at=...)`'s own copies of the tables (what `--at N` prints)."""

from __future__ import annotations

import pytest

from pagetrace.sim.history import EXACT_POOL_BLOCKS
from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import simulate
from pagetrace.sim.scheduler import SchedulerConfig


def test_a_table_that_grows_records_its_tail_and_a_finished_one_is_dropped():
    """vLLM, block size 4, 7 usable blocks. R (4 prompt tokens, 7 outputs: 10 tokens stored
    at most) takes block 1 at step 0. S (3 tokens, 4 outputs) arrives at step 1: R's 5th token
    needs block 2 (a tail: "add"), S takes block 3 (a new table: "set"). Step 2: nothing
    changes. Step 3: S's 5th token takes block 4 while R's table stays. Step 4: S finishes
    (dropped; its full block 3 stays cached, block 4 goes back to the front). Step 5: R's 9th
    token takes block 4 again. Step 6: R finishes: blocks 1, 2, 3 cached, 4 free."""
    r = SimRequest("R", [1, 2, 3, 4], list(range(10, 17)))
    s = SimRequest("S", [50, 51, 52], list(range(20, 24)), arrival=1)
    h = simulate([r, s], 8, 4, record_history=True).history
    assert h.changes == [
        {"set": [[0, [1]]]},
        {"add": [[0, [2]]], "set": [[1, [3]]]},
        {},
        {"add": [[1, [4]]]},
        {"drop": [1]},
        {"add": [[0, [4]]]},
        {"drop": [0]},
    ]
    # (free, used, cached, shared) of the 7 usable blocks after each step
    assert h.pool == {0: (6, 1, 0, 0), 1: (4, 3, 0, 0), 2: (4, 3, 0, 0), 3: (3, 4, 0, 0), 4: (4, 2, 1, 0), 5: (3, 3, 1, 0), 6: (4, 0, 3, 0)}
    assert h.stride == 1


def test_sglang_pool_by_state_counts_tree_pages_as_cached_and_two_holders_as_shared():
    """SGLang, page size 4, 6 usable pages. A (tokens 1-8 and 100, 2 outputs) takes pages 1-3
    at step 0: (free 3, used 3). It finishes at step 1: its 2 whole pages stay in the tree
    (cached), page 3 is freed: (4, 0, 2, 0). C and D (the same 8 tokens and one of their own)
    arrive at step 3, both match pages 1 and 2 and take one page each: 4 used, 2 of them held
    twice: (2, 4, 0, 2). Both finish at step 4: (4, 0, 2, 0). Idle step 2 is no step."""
    shared = list(range(1, 9))
    reqs = [SimRequest("A", shared + [100], [1, 2]), SimRequest("C", shared + [300], [1, 2], arrival=3),
            SimRequest("D", shared + [400], [1, 2], arrival=3)]
    result = simulate(reqs, 7, 4, record_history=True, policy="sglang")
    assert [s.step for s in result.steps] == [0, 1, 3, 4]
    h = result.history
    assert h.pool == {0: (3, 3, 0, 0), 1: (4, 0, 2, 0), 2: (2, 4, 0, 2), 3: (4, 0, 2, 0)}
    assert h.changes == [{"set": [[0, [1, 2, 3]]]}, {"drop": [0]}, {"set": [[1, [1, 2, 3]], [2, [1, 2, 4]]]}, {"drop": [1, 2]}]


def rebuilt(result):
    """The tables after each step, rebuilt from the changes as the page does (sim_data.py)."""
    ids = [r.request_id for r in result.requests]
    state: dict[str, list[int]] = {}
    out = []
    for change in result.history.changes:
        for i in change.get("drop", ()):
            del state[ids[i]]
        for i, blocks in change.get("set", ()):
            state[ids[i]] = list(blocks)
        for i, blocks in change.get("add", ()):
            state[ids[i]].extend(blocks)
        out.append({rid: list(b) for rid, b in state.items()})
    return out


def workload(n, seed, shared=12):
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(1, 40) for _ in range(shared)]
    return [SimRequest(f"q{i}", prefix[: rng.randrange(0, shared + 1)] + [rng.randrange(1, 40) for _ in range(rng.randrange(1, 9))],
                       [rng.randrange(1, 40) for _ in range(rng.randrange(1, 12))], arrival=rng.randrange(0, 6)) for i in range(n)]


@pytest.mark.parametrize("policy", ["vllm", "sglang", "hybrid"])
def test_the_tables_rebuilt_from_the_changes_are_the_tables_at_every_step(policy):
    """A pool small enough to preempt (a dropped table set again on readmission); the hybrid
    model's sliding group replaces its first blocks by the null block while its full group
    grows, so its table changes inside, not at its tail ("set", not "add")."""
    from pagetrace.sim.hybrid import FULL, SLIDING, KVGroup, LayerKind

    groups = [KVGroup(LayerKind(FULL), 1), KVGroup(LayerKind(SLIDING, 4), 1)] if policy == "hybrid" else None
    kinds = {"drop": 0, "set": 0, "add": 0}
    preempted = 0
    for seed in range(4):
        reqs = workload(8, seed)
        result = simulate(reqs, 30 if groups else 20, 2, SchedulerConfig(16, 4, True), tables_at=range(200), record_history=True,
                          policy="sglang" if policy == "sglang" else "vllm", groups=groups)
        assert rebuilt(result) == [result.tables_at[s.step] for s in result.steps]
        preempted += result.num_preemptions
        for change in result.history.changes:
            for k in kinds:
                kinds[k] += len(change.get(k, ()))
    assert preempted > 0 and kinds["drop"] > 0, (preempted, kinds)
    if policy == "hybrid":  # changed inside: every change a "set"
        assert kinds["add"] == 0 and kinds["set"] > kinds["drop"]
    else:  # tables grow by their tail: one "set" per admission (dropped at the end or when preempted)
        assert kinds["add"] > 0 and kinds["set"] == kinds["drop"]


def one_request(steps, keep):
    """One request, a 1-token prompt and `steps` outputs: `steps` steps, one change each."""
    return simulate([SimRequest("A", [1], list(range(2, 2 + steps)))], 8, 16, record_history=True, keep_steps=keep).history


@pytest.mark.parametrize("steps, stride, counted", [
    (6, 1, [0, 1, 2, 3, 4, 5]),  # 6 counts = 2 x keep: kept
    (7, 2, [0, 2, 4, 6]),  # a 7th: every other one
    (12, 2, [0, 2, 4, 6, 8, 10]),  # 6 again at stride 2
    (13, 4, [0, 4, 8, 12]),  # a 7th at step 12: stride 4
])
def test_the_pool_stride_doubles_past_twice_keep_counts(steps, stride, counted):
    h = one_request(steps, 3)
    last = [] if steps - 1 in counted else [steps - 1]  # close() counts the run's last step too (the page's slider reaches it)
    assert len(h.changes) == steps and (h.stride, sorted(h.pool)) == (stride, counted + last)
    assert h.pool[0] == (6, 1, 0, 0)  # its one block of 16 tokens, of 7


def test_a_pool_of_exactly_exact_pool_blocks_is_counted_and_one_more_is_not():
    assert EXACT_POOL_BLOCKS == 1 << 16
    run = lambda num_blocks: simulate([SimRequest("A", [1, 2, 3], [4, 5])], num_blocks, 16, record_history=True).history
    usable = EXACT_POOL_BLOCKS - 1
    assert run(EXACT_POOL_BLOCKS).pool == {0: (usable - 1, 1, 0, 0), 1: (usable, 0, 0, 0)}  # its block never full: free again
    h = run(EXACT_POOL_BLOCKS + 1)
    assert h.pool == {} and h.changes == [{"set": [[0, [1]]]}, {"drop": [0]}]
