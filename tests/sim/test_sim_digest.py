"""The simulator's whole observable behaviour, pinned: digests recorded with the code before
the engine was made fast (issue 12), recomputed here with cruising on and off.

For each workload the digest covers every StepRecord field of every step, every live
request's block table after every step (in the table's order), each request's counters at
the end, the pool's evictions and the hit/miss causes, and the pool at the end: the free
queue head to tail, each free block's cached hash and the cached map in insertion order.
Hashes are named by order of first appearance (a salted hash changes with PYTHONHASHSEED,
and only which blocks share a hash is observable). For the small pools (up to 2,000
blocks) the free queue and its cached hashes are also digested after every step.

Regenerate the fixture (only for a deliberate change of behaviour, with the reason in the
commit): python tests/sim/test_sim_digest.py --write
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pagetrace.sim import run as run_mod  # noqa: E402
from pagetrace.sim.request import SimRequest  # noqa: E402
from pagetrace.sim.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from pagetrace.sim.workload import SyntheticSpec, parse_trace, synthetic  # noqa: E402

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "sim_digests.json"
STEP_POOL_LIMIT = 2000  # pools up to this many blocks are digested after every step


def _trace(lines: list[dict]) -> str:
    return "\n".join(json.dumps(x) for x in lines)


def _salted_trace() -> str:
    """Shared prefixes under three salts and none, some prompts sent twice."""
    out = []
    for i in range(120):
        line = {"id": f"r{i}", "prompt_len": 40 + (i * 37) % 200, "shared_prefix": 40, "output_len": 5 + (i * 13) % 60,
                "arrival": i // 3}
        if i % 4:
            line["cache_salt"] = ("alice", "bob", "carol")[i % 3]
        out.append(line)
    return _trace(out)


def _duplicates_trace() -> str:
    """The same prompt AND output sent again and again: identical hashes on different blocks."""
    prompts = [list(range(1000 * k, 1000 * k + 23 + 17 * k)) for k in range(4)]
    outputs = [list(range(50_000 + 100 * k, 50_000 + 100 * k + 20 + 9 * k)) for k in range(4)]
    out = []
    for i in range(90):
        k = i % 4
        out.append({"id": f"d{i}", "prompt": prompts[k], "output": outputs[k], "arrival": (i * 2) // 5})
    return _trace(out)


def _multi_turn_trace() -> str:
    """Conversations: each turn's prompt is the previous turn's prompt and output and new text,
    so a prompt hits (or misses, evicted) blocks that were cached while decoding."""
    out = []
    for conv in range(12):
        history: list[int] = []
        for turn in range(5):
            base = 100_000 * (conv + 1) + 10_000 * turn
            prompt = history + list(range(base, base + 10 + (conv * 7 + turn * 11) % 40))
            output = list(range(base + 5000, base + 5000 + 12 + (conv * 5 + turn * 13) % 50))
            out.append({"id": f"c{conv}t{turn}", "prompt": prompt, "output": output, "arrival": 40 * turn + 3 * conv})
            history = prompt + output
    return _trace(out)


def _long_trace() -> str:
    return _trace([{"id": f"L{i}", "prompt_len": 3000 + 1700 * i, "shared_prefix": 2000, "output_len": 30 + 7 * i,
                    "arrival": 3 * i} for i in range(8)])


# name -> (requests factory, num_blocks, block_size, simulate kwargs)
WORKLOADS = {
    "bench": (lambda: synthetic(SyntheticSpec(requests=2000, prompt_len=(64, 512), output_len=(16, 256), seed=0)),
              1_000_000, 16, {}),
    "shared_prefix": (lambda: synthetic(SyntheticSpec(requests=400, prompt_len=(64, 700), output_len=(8, 120),
                                                      shared_prefix=300, arrival_rate=2.0, seed=1)), 4000, 16, {}),
    "parallel": (lambda: synthetic(SyntheticSpec(requests=150, prompt_len=(20, 300), output_len=(4, 90), shared_prefix=50,
                                                 n=4, arrival_rate=1.0, seed=2)), 3000, 16, {}),
    "evict_preempt": (lambda: synthetic(SyntheticSpec(requests=300, prompt_len=(10, 200), output_len=(20, 200),
                                                      shared_prefix=40, n=2, arrival_rate=1.5, seed=3)), 160, 16, {}),
    "evict_preempt_bs1": (lambda: synthetic(SyntheticSpec(requests=60, prompt_len=(5, 80), output_len=(5, 80),
                                                          shared_prefix=12, arrival_rate=0.8, seed=4)), 700, 1, {}),
    "long_prompts": (lambda: parse_trace(_long_trace(), 16), 20_000, 16, {}),
    "long_prompts_small_budget": (lambda: parse_trace(_long_trace(), 32), 4000, 32,
                                  {"config": SchedulerConfig(max_num_batched_tokens=1000, max_num_seqs=4)}),
    "salts": (lambda: parse_trace(_salted_trace(), 16), 500, 16, {}),
    "duplicates": (lambda: parse_trace(_duplicates_trace(), 16), 120, 16, {}),
    "multi_turn": (lambda: parse_trace(_multi_turn_trace(), 16), 2000, 16, {}),
    "multi_turn_small": (lambda: parse_trace(_multi_turn_trace(), 8), 110, 8, {}),
    "caching_off": (lambda: synthetic(SyntheticSpec(requests=300, prompt_len=(10, 300), output_len=(5, 150), shared_prefix=64,
                                                    arrival_rate=1.0, seed=5)), 600, 16, {"enable_caching": False}),
    "sparse_arrivals": (lambda: synthetic(SyntheticSpec(requests=200, prompt_len=(16, 200), output_len=(1, 60), shared_prefix=32,
                                                        arrival_rate=0.04, seed=6)), 1500, 16, {}),
    "bs1": (lambda: synthetic(SyntheticSpec(requests=80, prompt_len=(1, 90), output_len=(1, 70), shared_prefix=9,
                                            arrival_rate=2.0, seed=7)), 5000, 1, {}),
    "bs32": (lambda: synthetic(SyntheticSpec(requests=300, prompt_len=(20, 900), output_len=(1, 300), shared_prefix=100, n=2,
                                             arrival_rate=0.5, seed=8)), 1800, 32, {}),
    "no_chunking_no_reserve": (lambda: synthetic(SyntheticSpec(requests=200, prompt_len=(10, 400), output_len=(10, 120),
                                                               shared_prefix=20, arrival_rate=3.0, seed=9)), 400, 16,
                               {"config": SchedulerConfig(max_num_batched_tokens=512, enable_chunked_prefill=False,
                                                          reserve_full_isl=False)}),
    "max_model_len": (lambda: synthetic(SyntheticSpec(requests=100, prompt_len=(50, 200), output_len=(10, 121), arrival_rate=1.0,
                                                      seed=10)), 900, 16, {"max_model_len": 320}),
}


class _Names:
    """Hashes named by order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[int, int] = {}

    def __call__(self, h: int | None) -> int | None:
        if h is None:
            return None
        return self.names.setdefault(h, len(self.names))


def _pool_state(pool, name: _Names) -> tuple:
    order = pool.queue.order()
    return order, [name(pool.block_hash[b]) for b in order]


def digest(workload: str, cruise: bool = True) -> dict:
    make, num_blocks, block_size, kwargs = WORKLOADS[workload]
    requests = make()
    name = _Names()
    parts = {k: hashlib.sha256() for k in ("steps", "tables", "pool_steps")}
    holder: list[Scheduler] = []

    def scheduler(policy, config):
        sched = Scheduler(policy, config)
        sched.cruise = cruise
        holder.append(sched)
        return sched

    def on_step(record) -> None:
        sched = holder[0]
        parts["steps"].update(repr(tuple(getattr(record, f) for f in record.__slots__)).encode())
        parts["tables"].update(repr((record.step, list(sched.policy.req_to_blocks.items()))).encode())
        pool = sched.policy.pool
        if pool.num_blocks <= STEP_POOL_LIMIT:
            parts["pool_steps"].update(repr((record.step, _pool_state(pool, name))).encode())

    original = run_mod.Scheduler
    run_mod.Scheduler = scheduler
    try:
        result = run_mod.simulate(requests, num_blocks, block_size, on_step=on_step, **kwargs)
    finally:
        run_mod.Scheduler = original
    pool = result.policy.pool
    per_request = [(r.request_id, r.status, r.num_cached_tokens, r.first_scheduled, r.finished_step, r.num_preemptions,
                    r.num_generated) for r in result.requests]
    cached = [(name(h), blocks) for h, blocks in pool.cached_items()]
    end = (_pool_state(pool, name), cached, pool.num_free, pool.ref_cnt.count(0))
    return {
        "steps": len(result.steps),
        "preemptions": result.num_preemptions,
        "evictions": pool.evictions,
        "causes": result.causes,
        "step_records": parts["steps"].hexdigest()[:20],
        "tables": parts["tables"].hexdigest()[:20],
        "pool_steps": parts["pool_steps"].hexdigest()[:20],
        "requests": hashlib.sha256(repr(per_request).encode()).hexdigest()[:20],
        "pool_end": hashlib.sha256(repr(end).encode()).hexdigest()[:20],
    }


@pytest.mark.parametrize("cruise", [True, False], ids=["cruise", "explicit"])
@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_behaviour_unchanged(workload, cruise):
    expected = json.loads(FIXTURE.read_text())[workload]
    assert digest(workload, cruise) == expected


def test_workloads_reach_their_cases():
    """The fixture covers what it claims: preemption and eviction, prefix hits, salts."""
    fixture = json.loads(FIXTURE.read_text())
    assert fixture["evict_preempt"]["preemptions"] > 0 and fixture["evict_preempt"]["evictions"] > 0
    assert fixture["evict_preempt_bs1"]["preemptions"] > 0
    assert fixture["shared_prefix"]["causes"]["hit"] > 0 and fixture["parallel"]["causes"]["hit"] > 0
    assert fixture["salts"]["causes"]["different extra key"] > 0
    assert fixture["caching_off"]["causes"]["hit"] == 0
    assert fixture["multi_turn"]["causes"]["hit"] > 0 and fixture["multi_turn_small"]["causes"]["evicted"] > 0


def test_digest_sees_a_one_token_change(monkeypatch):
    """The digest is not blind: one request with one output token less changes it."""
    make, num_blocks, block_size, kwargs = WORKLOADS["sparse_arrivals"]

    def shorter():
        requests = make()
        r = requests[7]
        requests[7] = SimRequest(r.request_id, r.prompt, r.output[:-1] or r.output[:2], arrival=r.arrival)
        return requests

    monkeypatch.setitem(WORKLOADS, "sparse_arrivals", (shorter, num_blocks, block_size, kwargs))
    changed = digest("sparse_arrivals")
    expected = json.loads(FIXTURE.read_text())["sparse_arrivals"]
    assert changed["requests"] != expected["requests"] and changed["step_records"] != expected["step_records"]


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import time

    out = {}
    for w in WORKLOADS:
        t = time.process_time()
        out[w] = digest(w)
        print(w, out[w]["steps"], out[w]["preemptions"], out[w]["evictions"], f"{time.process_time() - t:.2f} s CPU", flush=True)
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
