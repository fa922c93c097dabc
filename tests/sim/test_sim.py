"""The simulator without vLLM: the design doc's walkthrough, the free queue, hits and misses."""

from __future__ import annotations

import pytest

from pagetrace.errors import UsageError
from pagetrace.sim.blockpool import FreeBlockQueue
from pagetrace.sim.policy import VllmPrefixCaching
from pagetrace.sim.request import SimRequest, block_key
from pagetrace.sim.run import simulate
from pagetrace.sim.scheduler import SchedulerConfig
from pagetrace.sim.workload import SyntheticSpec, SyntheticTokens, parse_trace, synthetic


def doc_walkthrough(uncached_first: bool):
    """docs/design/prefix_caching.md, "Example": block size 4, 10 blocks.

    The doc numbers blocks from 0; vLLM's pool keeps block 0 as the null block, so the
    doc's block k is block k + 1 here (11 blocks).
    """
    p = VllmPrefixCaching(11, 4, uncached_first=uncached_first)
    doc = lambda ids: [b - 1 for b in ids]  # noqa: E731
    shared = list(range(100, 112))
    # Time 1: request 0, 15 prompt tokens -> 4 blocks, 3 full and cached.
    r0 = SimRequest("0", shared + [7, 8, 9], list(range(200, 210)))
    hits, n = p.lookup(r0)
    assert (hits, n) == ([], 0)
    p.allocate_slots(r0, 15, hits, n)
    r0.num_computed, r0.num_generated = 15, 1
    assert doc(p.block_ids("0")) == [0, 1, 2, 3]
    assert sorted(doc([b for b in range(11) if p.pool.block_hash[b] is not None])) == [0, 1, 2]
    # Times 2-3: decode; block 3 fills up and block 4 is allocated.
    for _ in range(2):
        p.allocate_slots(r0, 1)
        r0.num_computed += 1
        r0.num_generated += 1
    assert doc(p.block_ids("0")) == [0, 1, 2, 3, 4]
    assert p.pool.block_hash[4] is not None  # the doc's block 3 is now cached
    # Time 4: request 1, 14 tokens, the first 10 shared: only 2 blocks (8 tokens) hit.
    r1 = SimRequest("1", shared[:10] + [50, 51, 52, 53], [300])
    hits, n = p.lookup(r1)
    assert (doc(hits), n) == ([0, 1], 8)
    p.allocate_slots(r1, 14 - n, hits, n)
    assert doc(p.block_ids("1")) == [0, 1, 5, 6]
    # Times 5 and 6: request 0, then request 1, finish.
    p.free(r0)
    p.free(r1)
    queue = doc(p.pool.queue.order())
    # Time 7: request 2, 29 tokens, the first 12 shared: blocks 0, 1, 2 hit.
    r2 = SimRequest("2", shared + list(range(400, 417)), [500])
    hits, n = p.lookup(r2)
    assert (doc(hits), n) == ([0, 1, 2], 12)
    evicted = p.pool.evictions
    p.allocate_slots(r2, 29 - n, hits, n)
    return queue, doc(p.block_ids("2")), p.pool.evictions - evicted


def test_design_doc_walkthrough():
    """With every freed block going to the back, the doc's figures exactly."""
    queue, table, evicted = doc_walkthrough(uncached_first=False)
    assert queue == [7, 8, 9, 4, 3, 2, 6, 5, 1, 0]
    assert table == [0, 1, 2, 7, 8, 9, 4, 3]  # "3 (evicted)"
    assert evicted == 1


def test_design_doc_walkthrough_as_vllm_0_32_frees():
    """vLLM 0.32's block_pool.free_blocks puts never-cached blocks at the FRONT (LIFO):
    the partial tails 4 (request 0) and 6 (request 1) are reused first, and nothing cached
    is evicted for request 2."""
    queue, table, evicted = doc_walkthrough(uncached_first=True)
    assert queue == [6, 4, 7, 8, 9, 3, 2, 5, 1, 0]
    assert table == [0, 1, 2, 6, 4, 7, 8, 9]
    assert evicted == 0


def test_free_queue_links():
    q = FreeBlockQueue(6)
    assert q.popleft_n(2) == [0, 1]
    q.remove(4)
    q.append_n([1, 4])
    q.prepend_n([0])
    assert q.order() == [0, 2, 3, 5, 1, 4] and q.num_free == 6
    assert q.popleft_n(0) == [] and q.popleft_n(6) == [0, 2, 3, 5, 1, 4] and q.order() == []
    q.append_n([3])
    assert q.order() == [3] and 3 in q and 2 not in q


def test_shared_prefix_69_tokens():
    """The case tried on vLLM by hand: [1, 2, 3] and [1, 2, 4], 64 cached tokens."""
    base = list(range(100, 169))
    reqs = [SimRequest("a", base + [5, 6, 7], list(range(5))), SimRequest("b", base + [8, 9], list(range(10, 15)))]
    result = simulate(reqs, 4096, 32, tables_at=[0, 4])
    assert result.tables_at[0] == {"a": [1, 2, 3], "b": [1, 2, 4]}
    assert result.tables_at[4] == {}
    assert [r.num_cached_tokens for r in reqs] == [0, 64]
    assert len(result.steps) == 5


def test_whole_block_prompt_recomputes_its_last_block():
    """A prompt of exactly 2 blocks sent twice hits 1 block: the last token is recomputed."""
    p = list(range(64))
    reqs = [SimRequest("a", p, [1]), SimRequest("b", p, [2], arrival=5)]
    simulate(reqs, 64, 32)
    assert reqs[1].num_cached_tokens == 32


def test_cache_salt_separates():
    p = list(range(100))
    reqs = [SimRequest("a", p, [1]), SimRequest("b", p, [2], arrival=3, cache_salt="x"), SimRequest("c", p, [3], arrival=6)]
    simulate(reqs, 64, 16)
    assert [r.num_cached_tokens for r in reqs] == [0, 0, 96]


def test_same_tokens_hit_whatever_holds_them():
    """A block's hash key is a range for consecutive ids and a tuple otherwise (block_key):
    the same ids must hit whether a list, a range or SyntheticTokens holds them, in the
    prompt or in the output, and non-consecutive ids must not collide with a run."""
    ids = list(range(5000, 5064))
    a = SimRequest("a", ids[:40], ids[40:])  # a list prompt, a list output: 4 blocks cached at the end
    b = SimRequest("b", SyntheticTokens(0, 5000, 64), [1], arrival=100)  # one run of ids
    c = SimRequest("c", list(range(5000, 5032)) + [7] * 32, [1], arrival=200)  # 2 blocks, then other ids
    d = SimRequest("d", ids[:20], range(5020, 5050), arrival=300)  # a range output fills blocks 2-3 again
    e = SimRequest("e", SyntheticTokens(16, 5000, 64), [1], arrival=400)  # ids 1..16, then 5000...
    f = SimRequest("f", list(range(1, 17)) + ids[:32] + [2], [1], arrival=500)
    simulate([a, b, c, d, e, f], 64, 16)
    assert [r.num_cached_tokens for r in (a, b, c, d, e, f)] == [0, 48, 32, 16, 0, 48]
    assert block_key((3, 4, 5)) == range(3, 6) and type(block_key((3, 5, 4))) is tuple
    assert block_key(range(0, 6, 2)) == (0, 2, 4) and type(block_key(range(0, 6, 2))) is tuple


def test_preemption_recomputes_last_running():
    """Two requests that fit at admission but not while decoding: the last one is preempted."""
    reqs = [SimRequest(str(i), list(range(1000 * i, 1000 * i + 30)), list(range(40))) for i in range(2)]
    result = simulate(reqs, 6, 16)  # 5 usable blocks: 2 each at admission, 5 each at the end
    assert result.num_preemptions >= 1
    first = next(s for s in result.steps if s.preempted)
    assert first.preempted == ["1"]
    assert all(r.num_generated == 40 for r in reqs)


def test_request_larger_than_pool_is_refused():
    with pytest.raises(ValueError, match="7 blocks of 16 tokens at its longest, more than the 3 usable"):
        simulate([SimRequest("big", list(range(100)), [1])], 4, 16)


def test_request_longer_than_max_model_len_is_refused_up_front():
    requests = synthetic(SyntheticSpec(requests=3, prompt_len=(50, 60), output_len=(10, 12), arrival_rate=1.0, seed=1))
    with pytest.raises(ValueError, match="max_model_len=40"):
        simulate(requests, 100, 16, max_model_len=40, max_steps=1_000)  # it used to run to the step bound


def test_synthetic_is_seeded_and_shares_prefix():
    spec = SyntheticSpec(requests=20, prompt_len=(10, 40), output_len=(1, 8), shared_prefix=48, n=2, arrival_rate=1.0, seed=3)
    a, b = synthetic(spec), synthetic(spec)
    assert [(r.request_id, len(r.prompt), len(r.output), r.arrival) for r in a] == [
        (r.request_id, len(r.prompt), len(r.output), r.arrival) for r in b
    ]
    assert len(a) == 40 and a[0].prompt[0:48] == tuple(range(1, 49))
    result = simulate(a, 200, 16)
    later = [r.num_cached_tokens for r in a[1:]]
    assert min(later) >= 48 and result.num_preemptions == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('{"prompt_len": -3, "output_len": 4}', ["line 1", "prompt_len"]),
        ('{"prompt_len": 3, "output_len": "x"}', ["line 1", "output_len"]),
        ('{"prompt": [1, 2], "output_len": 2}\n{oops', ["line 2", "not JSON"]),
        ('{"output_len": 2}', ["line 1", "prompt_len"]),
        ('{"prompt_len": 5, "output_len": 2, "shared_prefix": 9}', ["line 1", "shared_prefix"]),
        ('{"prompt_len": 5, "output_len": 2, "arrival": -1}', ["line 1", "arrival"]),
        # vLLM's validate_cache_salt (entrypoints/generate/base/protocol.py): "must be a non-empty string"
        ('{"prompt": [1, 2], "output_len": 2}\n{"prompt": [1, 2], "output_len": 2, "cache_salt": ""}', ["line 2", "cache_salt", "non-empty"]),
    ],
)
def test_bad_trace_names_line_and_field(line, words):
    with pytest.raises(UsageError) as err:
        parse_trace(line, 16)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_trace_parallel_and_order():
    reqs = parse_trace('{"id": "x", "prompt_len": 40, "output_len": 3, "n": 2, "arrival": 2}\n{"prompt": [1,2,3], "output": [4,5]}', 16)
    assert [r.request_id for r in reqs] == ["1", "x.0", "x.1"]
    assert reqs[1].prompt is reqs[2].prompt and list(reqs[0].output) == [4, 5]


def test_no_chunked_prefill_waits_for_budget():
    cfg = SchedulerConfig(max_num_batched_tokens=64, enable_chunked_prefill=False)
    reqs = [SimRequest("a", list(range(40)), [1, 2]), SimRequest("b", list(range(100, 140)), [1, 2])]
    result = simulate(reqs, 32, 16, config=cfg)
    assert result.steps[0].admitted == ["a"] and result.steps[1].admitted == ["b"]


def causes_of(reqs, num_blocks=64, block_size=16):
    from pagetrace.sim.policy import VllmPrefixCaching
    from pagetrace.sim.scheduler import Scheduler

    sched = Scheduler(VllmPrefixCaching(num_blocks, block_size))
    for r in reqs:
        sched.add(r)
    while sched.waiting or sched.running:
        sched.step()
    return sched.causes


def test_causes_partial_block_and_first_seen():
    """A 10-token shared prefix (less than a block of 16) is never hit: all partial/first seen."""
    a = SimRequest("a", list(range(10)) + list(range(100, 110)), [1])
    b = SimRequest("b", list(range(10)) + list(range(200, 210)), [1])
    c = causes_of([a, b])
    assert c == {"hit": 0, "partial block": 8, "evicted": 0, "different extra key": 0, "first seen": 32}


def test_causes_evicted_and_extra_key():
    p = list(range(48))
    first = SimRequest("a", p + [1], [1])
    filler = [SimRequest(f"f{i}", list(range(1000 * (i + 1), 1000 * (i + 1) + 40)), [1]) for i in range(3)]
    again = SimRequest("b", p + [2], [1])
    salted = SimRequest("c", p + [3], [1], cache_salt="s")
    c = causes_of([first, *filler, again, salted], num_blocks=5)  # 4 usable: the filler evicts 'a'
    assert c["evicted"] == 48 and c["different extra key"] == 48 and c["hit"] == 0
    assert sum(c.values()) == sum(len(r.prompt) for r in [first, *filler, again, salted])


def _trace(result):
    steps = [tuple(getattr(s, f) for f in s.__slots__) for s in result.steps]
    reqs = [(r.request_id, r.num_cached_tokens, r.first_scheduled, r.finished_step, r.num_preemptions, r.num_generated)
            for r in result.requests]
    return steps, reqs


@pytest.mark.parametrize(
    ("spec", "num_blocks", "block_size", "budget", "caching"),
    [
        (SyntheticSpec(requests=60, prompt_len=(5, 90), output_len=(1, 70), shared_prefix=20, n=2, arrival_rate=0.7, seed=1), 48, 16, 4096, True),
        (SyntheticSpec(requests=80, prompt_len=(1, 60), output_len=(1, 40), arrival_rate=0.0, seed=2), 40, 8, 4096, True),
        (SyntheticSpec(requests=40, prompt_len=(30, 200), output_len=(5, 50), shared_prefix=64, arrival_rate=1.5, seed=3), 120, 16, 100, True),
        (SyntheticSpec(requests=50, prompt_len=(5, 90), output_len=(1, 70), arrival_rate=0.5, seed=4), 30, 16, 4096, False),
    ],
)
def test_cruising_changes_nothing(spec, num_blocks, block_size, budget, caching, monkeypatch):
    """Skipping the requests whose step changes nothing gives the same steps, tables and
    requests as running every request every step; the incremental empty-slot count is the
    direct sum."""
    from pagetrace.sim import scheduler as sched_mod

    cfg = SchedulerConfig(max_num_batched_tokens=budget)
    fast = simulate(synthetic(spec), num_blocks, block_size, cfg, caching, tables_at=range(400))
    seen = []
    step = sched_mod.Scheduler.step

    def slow_step(self):
        self.cruise = False
        record = step(self)
        direct = sum(len(self.policy.block_ids(r.request_id)) * block_size - r.num_computed for r in self.running)
        seen.append(record.empty_slots == direct)
        return record

    monkeypatch.setattr(sched_mod.Scheduler, "step", slow_step)
    slow = simulate(synthetic(spec), num_blocks, block_size, cfg, caching, tables_at=range(400))
    assert _trace(fast) == _trace(slow)
    assert fast.tables_at == slow.tables_at
    assert all(seen) and len(seen) == len(slow.steps)
    assert fast.num_preemptions == slow.num_preemptions


@pytest.mark.parametrize(("spec", "num_blocks", "block_size", "max_model_len"), [
    (SyntheticSpec(requests=100, prompt_len=(50, 200), output_len=(10, 200), shared_prefix=20, arrival_rate=1.0, seed=11), 900, 16, 230),
    (SyntheticSpec(requests=60, prompt_len=(5, 60), output_len=(5, 60), arrival_rate=1.0, seed=12), 3000, 1, 70),
])
def test_cruising_past_max_model_len(spec, num_blocks, block_size, max_model_len):
    """The scheduler takes requests that outgrow max_model_len (`simulate` refuses them; vLLM
    caps their allocation and caching there): they finish, with the same steps, tables and pool
    cruising or not. The per-event cruising before the calendar never finished this workload."""
    from pagetrace.sim.scheduler import Scheduler
    from sim_drive import drive

    def run(cruise: bool):
        sched = Scheduler(VllmPrefixCaching(num_blocks, block_size, max_model_len=max_model_len))
        sched.cruise = cruise
        reqs = synthetic(spec)
        assert any(len(r.prompt) + len(r.output) - 1 > max_model_len for r in reqs)
        trace = [(tuple(getattr(rec, f) for f in rec.__slots__), list(sched.policy.req_to_blocks.items()))
                 for rec in drive(sched, reqs, 5000)]
        pool = sched.policy.pool
        return trace, [(r.request_id, r.num_generated, r.finished_step) for r in reqs], pool.cached_items(), pool.queue.order()

    assert run(True) == run(False)


def test_one_usable_block_is_said_in_the_singular():
    with pytest.raises(ValueError, match="more than the 1 usable block of the pool"):
        simulate([SimRequest("big", list(range(40)), [1])], 2, 16)
