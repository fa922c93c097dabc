"""How fast `pagetrace fleet`'s engine runs (pagetrace/sim/fleet.py): N instances behind a router.

    python bench/bench_fleet.py --mooncake tests/data/mooncake/conversation_trace.jsonl.gz   # 10 instances, each router
    python bench/bench_fleet.py --synthetic 1000000 --instances 100                           # 1 M conversation requests
    python bench/bench_fleet.py --quick                                                        # seconds

--mooncake: Mooncake's conversation trace (12,031 requests, 50 ms steps) through 10
instances of 5,860 blocks of 512 tokens (3 M tokens each), 8,192 batched tokens, its own
outputs (or --max-tokens 1, the §5.3.2 set-up), under each --router.
--synthetic N: N requests of the synthetic conversations (`pagetrace fleet`'s workload:
N / 4 sessions of 4 turns, a 256-token system prompt, user messages 32-256 and replies
16-128 tokens, one session starting per step per 100 instances... `--session-rate`),
blocks of 16, 4,096 blocks per instance.

Each point runs in a fresh process (its peak RSS is its own); the time covers the workload's
generation or reading and `run_fleet()` apart. Wall time and CPU time are printed: on a shared
machine the wall time is the CPU time stretched by the other processes. One process: one core.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def point(kind: str, size: int, instances: int, router: str, max_tokens: int | None, session_rate: float, cache: str) -> dict:
    from pagetrace.sim.fleet import run_fleet
    from pagetrace.sim.fleet_workload import cap_outputs
    from pagetrace.sim.router import make_router
    from pagetrace.sim.scheduler import SchedulerConfig

    t0, c0 = time.perf_counter(), time.process_time()
    sessions = None
    if kind == "mooncake":
        from pagetrace.sim.mooncake import read_mooncake

        reqs = read_mooncake(str(size), 512).requests
        num_blocks, block_size, budget = 5860, 512, 8192
    else:
        from pagetrace.sim.conversation import ConversationSpec, conversations

        reqs, sessions = conversations(ConversationSpec(sessions=size // 4, turns=4, session_rate=session_rate))
        num_blocks, block_size, budget = 4096, 16, 4096
    if max_tokens:
        cap_outputs(reqs, max_tokens)
    read_s = time.perf_counter() - t0
    t1, c1 = time.perf_counter(), time.process_time()
    r = run_fleet(reqs, make_router(router, 1.0, sessions), instances, num_blocks, block_size, SchedulerConfig(budget, 256),
                  max_model_len=(num_blocks - 1) * block_size, cache=cache, store_blocks=10 * num_blocks,
                  load_stride=max(1, max(q.arrival for q in reqs) // 60), release=True)
    run_s, run_cpu = time.perf_counter() - t1, time.process_time() - c1
    d = r.to_json()
    return {"workload": kind, "requests": r.requests, "instances": instances, "router": router, "cache": cache, "max_tokens": max_tokens,
            "steps": r.steps, "instance_steps": sum(i.busy_steps for i in r.instances), "read_seconds": round(read_s, 2),
            "run_seconds": round(run_s, 2), "run_cpu_seconds": round(run_cpu, 2), "hit_rate": d["hit_rate"],
            "imbalance_requests": d["imbalance"]["requests"], "preemptions": d["preemptions"],
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "python": platform.python_version()}


def spawn(*args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--point", json.dumps(args)], capture_output=True, text=True, check=True)
    print(out.stdout.strip(), flush=True)  # as each point finishes
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mooncake", metavar="PATH")
    ap.add_argument("--synthetic", type=int, metavar="N", nargs="*")
    ap.add_argument("--instances", type=int, nargs="*", default=None)
    ap.add_argument("--router", nargs="*", default=None)
    ap.add_argument("--cache", default="local")
    ap.add_argument("--max-tokens", type=int, default=None)
    ap.add_argument("--session-rate", type=float, default=None, help="synthetic: sessions starting per step (default: instances / 100)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--point", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.point:
        print(json.dumps(point(*json.loads(args.point))))
        return
    rows = []
    if args.quick:
        rows.append(spawn("synthetic", 4000, 10, "round-robin", None, 0.1, "local"))
    if args.mooncake:
        for router in args.router or ["round-robin", "least-loaded", "prefix-aware"]:
            for n in args.instances or [10]:
                rows.append(spawn("mooncake", args.mooncake, n, router, args.max_tokens, 0.0, args.cache))
    for size in args.synthetic or []:
        for n in args.instances or [100]:
            for router in args.router or ["round-robin"]:
                rate = args.session_rate if args.session_rate is not None else n / 100
                rows.append(spawn("synthetic", size, n, router, args.max_tokens, rate, args.cache))


if __name__ == "__main__":
    main()
