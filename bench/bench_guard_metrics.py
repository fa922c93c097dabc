"""The cost of exporting the guard's counts to /metrics (pagetrace/engines/guard_metrics.py).

    python bench/bench_guard_metrics.py              # steps/s with the exporter off and on, and the cost of one write
    python bench/bench_guard_metrics.py --quick      # shorter blocks

The step: what `Tap.forward` does for the guard on a step, `guard.verdict` on a decode step of
32 requests with 2,048 tokens of context each (bench_guard.py's `decode_step`, one torch thread)
and its two counters, in a loop for --seconds per block. The exporter adds nothing to that loop:
its thread reads the counters and writes them when they changed, once a second (and a flagged
step writes at once). Blocks alternate off, on (the exporter's thread running, writing
`rank0.json` the way the worker does), --pairs times; the figure is the median of the pairs'
on/off ratios of CPU time per step (the process's, every thread: the exporter's included; CPU
time, not wall time, as the machine is shared), and the same with the thread writing every 10 ms (100 times
as often) to show what it would take to see it. One write: the median µs of `Exporter.flush()`
with a changed count, wall and CPU (the thread's), to the file (FileSink: written whole, fsync'd,
renamed) and, in a process of its own with PROMETHEUS_MULTIPROC_DIR, to prometheus_client's
multiprocess Counters. At one write a second, a write's CPU µs is the exporter's cost per second
of serving, whatever the step rate: divided by the steps per second, its cost per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def block(step, seconds: float) -> float:
    """CPU µs per step of `step` (this process's CPU time, every thread: the exporter's too) over `seconds` of wall time."""
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    end = start + seconds
    while True:
        step()
        n += 1
        if time.perf_counter() >= end:
            return (time.process_time() - cpu) / n * 1e6


def paired(seconds: float, pairs: int, interval: float) -> dict:
    from bench_guard import BS, decode_step

    from pagetrace.engines import guard_metrics
    from pagetrace.engines.guard import verdict

    qsl, lens, table, slots, pos, num_blocks = decode_step(32, 2048)
    tap = SimpleNamespace(guard_steps=0, guard_seconds=0.0, affected=[], failed=0)

    def step():
        started = time.perf_counter()
        assert verdict(qsl, lens, table, slots, block_size=BS, num_blocks=num_blocks, positions=pos, num_tokens=int(qsl[-1]))
        tap.guard_seconds += time.perf_counter() - started
        tap.guard_steps += 1

    block(step, min(seconds, 0.5))  # warm-up
    ratios, off_us = [], []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(pairs):
            off = block(step, seconds)
            exporter = guard_metrics.Exporter(tap, 0, guard_metrics.FileSink(folder, 0), interval=interval).start()
            on = block(step, seconds)
            exporter.stop()
            ratios.append(on / off)
            off_us.append(off)
    return {"interval_s": interval, "cpu_us_per_step_off": round(statistics.median(off_us), 1), "ratio_on_off": round(statistics.median(ratios), 4),
            "ratios": [round(r, 4) for r in ratios]}


FLUSH = """
import statistics, sys, time, tempfile
from types import SimpleNamespace
from pagetrace.engines import guard_metrics
tap = SimpleNamespace(guard_steps=0, guard_seconds=0.0, affected=[], failed=0)
sink = guard_metrics.sink_for(0) if sys.argv[1] == "counters" else guard_metrics.FileSink(tempfile.mkdtemp(), 0)
exporter = guard_metrics.Exporter(tap, 0, sink)
wall, cpu = [], []
for i in range(int(sys.argv[2])):
    tap.guard_steps += 1
    tap.guard_seconds += 1e-4
    start, start_cpu = time.perf_counter(), time.thread_time()
    exporter.flush()
    cpu.append(time.thread_time() - start_cpu)
    wall.append(time.perf_counter() - start)
print(statistics.median(wall) * 1e6, statistics.median(cpu) * 1e6)
"""


def flush_us(kind: str, repeat: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", "PAGETRACE_GUARD_METRICS_DIR")}
    with tempfile.TemporaryDirectory() as prom:
        if kind == "counters":
            env["PROMETHEUS_MULTIPROC_DIR"] = prom
        done = subprocess.run([sys.executable, "-c", FLUSH, kind, str(repeat)], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                              timeout=300, check=True)
    wall, cpu = map(float, done.stdout.split())
    return {"wall": round(wall, 1), "cpu": round(cpu, 1)}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per block")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="blocks of 1 s, 3 pairs")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.pairs = 1.0, 3
    torch.set_num_threads(1)
    out = {"step": "guard.verdict, decode, 32 requests x 2048 tokens, block size 16, 1 torch thread",
           "exporter": [paired(args.seconds, args.pairs, interval) for interval in (1.0, 0.01)],
           "write_us": {"file": flush_us("file", 200), "multiprocess_counters": flush_us("counters", 2000)}}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
