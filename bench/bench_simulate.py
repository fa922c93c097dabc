"""How fast `pagetrace simulate`'s engine runs: requests through vLLM V1's block manager.

    python bench/bench_simulate.py                      # 100,000 requests, 1M-block pool
    python bench/bench_simulate.py --requests 10000     # a shorter run
    python bench/bench_simulate.py --quick              # 1,000 requests (seconds)
    python bench/bench_simulate.py --mooncake tests/data/mooncake/conversation_trace.jsonl.gz \
        --num-blocks 5860 --block-size 512 --max-num-batched-tokens 8192 [--requests N] [--prompt-fraction F]

--mooncake runs Mooncake's published trace (read by pagetrace/sim/mooncake.py, 50 ms steps):
its first --requests requests (default all), each prompt cut to its first --prompt-fraction of
blocks (default 1: whole), so time and memory can be read against requests and prompt length.
The read is timed apart from the run; peak RSS covers both.

Wall time and this process's CPU time are both printed: on a shared machine the wall time
is the CPU time stretched by the other processes. The workload is the synthetic one of `pagetrace simulate` (prompts 64-512 tokens, outputs
16-256, all arriving at step 0, seed 0); the time covers `simulate()` alone (pool set-up
included), not the workload's generation or the summary.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagetrace.sim.run import simulate  # noqa: E402
from pagetrace.sim.workload import SyntheticSpec, synthetic  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--num-blocks", type=int, default=1_000_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--quick", action="store_true", help="1,000 requests")
    ap.add_argument("--mooncake", metavar="PATH", help="Mooncake's trace (.jsonl or .jsonl.gz) instead of the synthetic workload")
    ap.add_argument("--prompt-fraction", type=float, default=1.0)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    args = ap.parse_args()
    if args.mooncake:
        return mooncake(args)
    n = 1000 if args.quick else args.requests
    requests = synthetic(SyntheticSpec(requests=n, prompt_len=(64, 512), output_len=(16, 256), arrival_rate=0.0, seed=0))
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(requests, args.num_blocks, args.block_size)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    request_steps = sum(s.scheduled for s in result.steps)
    print(json.dumps({
        "requests": n, "num_blocks": args.num_blocks, "block_size": args.block_size,
        "steps": len(result.steps), "request_steps": request_steps, "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
        "us_per_request_step": round(seconds / request_steps * 1e6, 2),
        "preemptions": result.num_preemptions,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "python": platform.python_version(), "machine": platform.machine(),
    }))


def mooncake(args) -> None:
    import math

    from pagetrace.sim.mooncake import MOONCAKE_BLOCK, parse_mooncake, read_text
    from pagetrace.sim.scheduler import SchedulerConfig

    rows = [json.loads(line) for line in read_text(args.mooncake).splitlines() if line.strip()]
    if args.requests != 100_000:
        rows = rows[: args.requests]
    if args.prompt_fraction != 1.0:  # each prompt's first blocks only
        for r in rows:
            keep = max(1, math.ceil(len(r["hash_ids"]) * args.prompt_fraction))
            r["hash_ids"] = r["hash_ids"][:keep]
            r["input_length"] = min(r["input_length"], keep * MOONCAKE_BLOCK)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    start = time.perf_counter()
    trace = parse_mooncake(text, args.block_size)
    read_s = time.perf_counter() - start
    config = SchedulerConfig(args.max_num_batched_tokens or 8192, 256, True)
    start, cpu_start = time.perf_counter(), time.process_time()
    result = simulate(trace.requests, args.num_blocks, args.block_size, config, max_model_len=(args.num_blocks - 1) * args.block_size)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    prompt = sum(r.prompt_len for r in result.requests)
    print(json.dumps({
        "trace": args.mooncake, "requests": len(rows), "prompt_tokens": prompt, "num_blocks": args.num_blocks,
        "block_size": args.block_size, "steps": len(result.steps), "read_seconds": round(read_s, 2),
        "seconds": round(seconds, 2), "cpu_seconds": round(cpu, 2),
        "hit_rate": round(sum(r.num_cached_tokens or 0 for r in result.requests) / prompt, 4),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "python": platform.python_version(), "machine": platform.machine(),
    }))


if __name__ == "__main__":
    main()
