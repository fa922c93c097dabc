"""Mooncake's §5.3.2 set-up on its conversation trace (tests/data/mooncake, kept by the Mooncake
reader's tests): 10 instances of 3 M tokens, outputs of 1. The claims are the paper's: a global
cache reaches nearly the trace's ceiling, local caches behind a router that ignores prefixes
lose more than half of it, and routing by prefix wins most of it back. The ceiling is computed
here from `hash_ids` alone, not by the simulator."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from pagetrace.sim.fleet import run_fleet
from pagetrace.sim.fleet_workload import cap_outputs
from pagetrace.sim.mooncake import read_mooncake
from pagetrace.sim.router import PrefixAware, RoundRobin
from pagetrace.sim.scheduler import SchedulerConfig

TRACE = Path(__file__).resolve().parent.parent / "data" / "mooncake" / "conversation_trace.jsonl.gz"
BLOCKS = 5860  # 5,859 usable blocks of 512 tokens: 3.0 M tokens


@pytest.fixture(scope="module")
def ceiling() -> tuple[int, int]:
    seen: set[int] = set()
    hit = total = 0
    with gzip.open(TRACE, "rt") as f:
        for line in f:
            o = json.loads(line)
            ids, n = o["hash_ids"], o["input_length"]
            total += n
            k = 0
            while k < (n - 1) // 512 and ids[k] in seen:
                k += 1
            hit += k * 512
            seen.update(ids[: n // 512])
    return hit, total


def _run(router, cache):
    reqs = read_mooncake(str(TRACE), 512).requests
    cap_outputs(reqs, 1)
    r = run_fleet(reqs, router, 10, BLOCKS, 512, SchedulerConfig(8192, 256), max_model_len=(BLOCKS - 1) * 512, cache=cache, release=True)
    o = r.outcomes()
    return o["local hit"], o["shared hit"], r.prompt_tokens(), r


def test_mooncake_local_against_global(ceiling):
    top_hit, total = ceiling
    assert total == 144_793_823 and 0.37 < top_hit / total < 0.38
    rr_local, rr_shared, p, _ = _run(RoundRobin(), "local")
    assert p == total and rr_shared == 0
    g_local, g_shared, _, g = _run(RoundRobin(), "pooled")
    assert g_local == rr_local  # the same blocks were computed into the same pools; peers' copies came on top
    assert g_local + g_shared <= top_hit and g_local + g_shared > 0.95 * top_hit
    assert rr_local < 0.5 * (g_local + g_shared)  # the paper: a local cache misses more than half (its ratio 2.22x)
    pa_local, _, _, pa = _run(PrefixAware(1000.0), "local")
    assert rr_local < pa_local <= top_hit
    assert pa_local > 0.9 * top_hit  # longest-prefix routing keeps a session where its blocks are
    assert pa.imbalance()["requests"] > g.imbalance()["requests"]  # ... and pays in balance
