"""The metadata ring's cost per step and its bytes per step (pagetrace/engines/meta_ring.py).

    python bench/bench_meta_ring.py            # batch 1, 16, 256 x context 512, 4096
    python bench/bench_meta_ring.py --quick

Each point runs --steps decode steps of R requests (block size 16, int32 tables as vLLM builds
them, one persistent batch: seq_lens grow by one a step and each row gains a block every 16
steps), and times, on the same steps in the same run: `MetaRing.add` (the ring), the guard's
`verdict` (the baseline a guarded server pays already) and a plain copy of the step's index
tensors (what a capture with pages does for the metadata alone). Medians after a warm-up; one
torch thread. Bytes a step are the ring's compressed bytes over the steps. The figures are in
bench/README.md; nothing here is asserted in a test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BS = 16


def point(requests: int, context: int, steps: int) -> dict:
    import torch

    from pagetrace.engines.guard import verdict
    from pagetrace.engines.meta_ring import MetaRing

    torch.set_num_threads(1)
    width = -(-(context + steps) // BS) + 1
    table = torch.zeros(requests, width, dtype=torch.int32)
    lens = torch.full((requests,), context, dtype=torch.int32)
    per = -(-context // BS)
    table[:, :per] = (torch.arange(requests * per, dtype=torch.int32).view(requests, per) + 1)
    nxt = requests * per + 1
    ids = [f"cmpl-{r:06d}-0-{r * 2654435761 % (1 << 32):08x}" for r in range(requests)]
    qsl = torch.arange(requests + 1, dtype=torch.int32)
    ring = MetaRing(256 << 20, BS)
    times = {"ring": [], "guard": [], "copy": []}
    rows = torch.arange(requests)
    for n in range(steps):
        lens += 1
        grow = ((lens - 1) % BS == 0).nonzero().flatten()
        for r in grow.tolist():
            table[r, (int(lens[r]) - 1) // BS] = nxt
            nxt += 1
        pos = lens.to(torch.int64) - 1
        slots = table[rows, pos // BS].to(torch.int64) * BS + pos % BS
        t0 = time.perf_counter()
        ring.add(n, ids, qsl, lens, table, slots, pos)
        t1 = time.perf_counter()
        verdict(qsl, lens, table, slots, block_size=BS, num_blocks=nxt + 1, positions=pos, num_tokens=requests)
        t2 = time.perf_counter()
        [t.clone() for t in (qsl, lens, table, slots, pos)]
        t3 = time.perf_counter()
        if n >= 20:  # warm-up
            times["ring"].append(t1 - t0)
            times["guard"].append(t2 - t1)
            times["copy"].append(t3 - t2)
    info, data, _ = ring.flush()  # zlib holds the last records until a flush
    med = {k: statistics.median(v) * 1e6 for k, v in times.items()}
    return {"requests": requests, "context": context, "steps": steps, "ring_us": med["ring"], "guard_us": med["guard"], "copy_us": med["copy"],
            "bytes_per_step": ring.bytes / steps, "steps_in_256_mib": int((256 << 20) / (ring.bytes / steps))}  # MAGIC and the flush included


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    grid = [(1, 512), (256, 512)] if args.quick else [(1, 512), (16, 512), (256, 512), (1, 4096), (16, 4096), (256, 4096)]
    print("| requests | context | ring µs | guard µs | ring / guard | index copy µs | bytes a step | steps in 256 MiB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for requests, context in grid:
        p = point(requests, context, args.steps)
        print(f"| {requests} | {context} | {p['ring_us']:.0f} | {p['guard_us']:.0f} | {p['ring_us'] / p['guard_us']:.2f} | {p['copy_us']:.0f} | "
              f"{p['bytes_per_step']:.0f} | {p['steps_in_256_mib']:,} |", flush=True)


if __name__ == "__main__":
    main()
