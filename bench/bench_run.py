"""CPU benchmarks of pagetrace: start-up and how `run`'s backends scale with tokens.

    python bench/bench_run.py            # everything (about 5 minutes on 2 cores)
    python bench/bench_run.py --quick    # the tiny version CI runs so this never rots

Start-up: each command timed as a fresh process, the pairs interleaved so that machine
noise hits both alike; medians and their ratio. Scaling: each (backend, shape, tokens)
point in its own process, so its peak RSS (from wait4) is its own; the time is the
median of the paged_attention calls alone, after one untimed call.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = [(1, 1, 8), (32, 8, 128)]  # (heads, kv_heads, head_dim)
TOKENS = [38, 512, 4096, 32768, 131072]


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def startup(reps: int) -> list[dict]:
    exe = shutil.which("pagetrace") or str(Path(sys.executable).parent / "pagetrace")
    pairs = [
        ("pagetrace lookup --token 20 --table 7,2,15", [exe, "lookup", "--token", "20", "--table", "7,2,15"],
         'python -c "import typer, rich"', [sys.executable, "-c", "import typer, rich"]),
        ("pagetrace run --tokens 38", [exe, "run", "--tokens", "38"],
         'python -c "import torch, triton"', [sys.executable, "-c", "import torch, triton"]),
    ]
    rows = []
    for name, cmd, base_name, base in pairs:
        timed(cmd), timed(base)  # warm the page cache
        ours, theirs = [], []
        for _ in range(reps):
            ours.append(timed(cmd))
            theirs.append(timed(base))
        a, b = statistics.median(ours), statistics.median(theirs)
        rows.append({"command": name, "median_s": a, "baseline": base_name, "baseline_s": b, "ratio": a / b})
    return rows


def one_point(backend: str, heads: int, kv_heads: int, head_dim: int, tokens: int, reps: int) -> dict:
    """Runs in a child process: build the workload, time paged_attention."""
    if backend == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from pagetrace import paged_attention
    from pagetrace.attention.workload import make_workload
    from pagetrace.paging.plan import plan_tables

    torch.set_num_threads(os.cpu_count() or 1)
    plan = plan_tables([tokens], None, 16)
    work = make_workload(plan, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, layout="nhd")
    args = (work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens)
    paged_attention(*args, layout="nhd", backend=backend)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        paged_attention(*args, layout="nhd", backend=backend)
        times.append(time.perf_counter() - start)
    cache = 2 * work.key_cache.numel() * work.key_cache.element_size()
    return {"median_s": statistics.median(times), "cache_bytes": cache}


def scaling(tokens: list[int], reps: int, interpret_limit: int) -> list[dict]:
    rows = []
    for heads, kv_heads, head_dim in SHAPES:
        for n in tokens:
            for backend in ("interpret", "torch"):
                if backend == "interpret" and n * kv_heads > interpret_limit:
                    continue
                r = 1 if backend == "interpret" and n * kv_heads > 4096 else reps
                cmd = [sys.executable, __file__, "--one", backend, str(heads), str(kv_heads), str(head_dim), str(n), str(r)]
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
                out = proc.stdout.read()
                _, status, usage = os.wait4(proc.pid, 0)
                if status != 0:
                    raise SystemExit(f"bench point failed: {' '.join(cmd)}")
                point = json.loads(out)
                rows.append({
                    "backend": backend, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "tokens": n,
                    "median_s": point["median_s"], "peak_rss_mib": usage.ru_maxrss / 1024,
                    "cache_mib": point["cache_bytes"] / 2**20,
                })
                print(f"  {backend:9} {heads}/{kv_heads}/{head_dim:<3} {n:>7} tokens: {point['median_s'] * 1000:10.1f} ms, "
                      f"peak RSS {usage.ru_maxrss / 1024:8.0f} MiB", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a few seconds: CI's smoke run")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON document")
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        backend, *nums = args.one
        print(json.dumps(one_point(backend, *map(int, nums))))
        return
    reps = 3 if args.quick else 7
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "startup": startup(reps),
        "scaling": scaling([38, 512] if args.quick else TOKENS, 1 if args.quick else 3, 4096 if args.quick else 10**9),
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"# {results['date']} · {results['machine']}")
    print("\n| command | median | baseline | baseline median | ratio |\n|---|---|---|---|---|")
    for r in results["startup"]:
        print(f"| `{r['command']}` | {r['median_s'] * 1000:.0f} ms | `{r['baseline']}` | {r['baseline_s'] * 1000:.0f} ms | {r['ratio']:.2f}x |")
    print("\n| backend | heads/kv/dim | tokens | median | peak RSS | K+V cache |\n|---|---|---|---|---|---|")
    for r in results["scaling"]:
        print(f"| {r['backend']} | {r['heads']}/{r['kv_heads']}/{r['head_dim']} | {r['tokens']} | "
              f"{r['median_s'] * 1000:.1f} ms | {r['peak_rss_mib']:.0f} MiB | {r['cache_mib']:.1f} MiB |")


if __name__ == "__main__":
    main()
