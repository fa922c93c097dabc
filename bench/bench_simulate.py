"""How fast `pagetrace simulate`'s engine runs: requests through vLLM V1's block manager.

    python bench/bench_simulate.py                      # 100,000 requests, 1M-block pool
    python bench/bench_simulate.py --requests 10000     # a shorter run
    python bench/bench_simulate.py --quick              # 1,000 requests (seconds)

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
    args = ap.parse_args()
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


if __name__ == "__main__":
    main()
