"""CPU benchmarks of prefill, and of the torch path against SDPA on contiguous K/V.

    python bench/bench_prefill.py            # about 5 minutes on 2 cores
    python bench/bench_prefill.py --quick    # seconds: CI's smoke run
    python bench/bench_prefill.py --sdpa-only  # only the torch path against SDPA (a minute)
    python bench/bench_prefill.py --chunks 1024,2048,4096,8192  # 4k decode against SDPA per chunk size (KiB)

Prefill: one sequence whose whole prompt is new (q_len = seq_len), fp32, nhd, block
size 16, scrambled tables; the interpreter and the torch path, each point in its own
process (the interpreter's first call in a process is reported apart: "cold").
Torch path vs SDPA: the same K/V, once paged (pagetrace's torch backend: decode reads the
blocks in cache-sized chunks, a long prefill gathers them for SDPA) and once laid out contiguously
([1, kv_heads, seq_len, head_dim], F.scaled_dot_product_attention with enable_gqa),
decode and prefill; medians of interleaved calls.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def paged_inputs(heads, kv_heads, head_dim, seq_len, q_len, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    blocks = -(-seq_len // 16)
    table = torch.randperm(2 * blocks, generator=gen)[:blocks]
    k = torch.randn(seq_len, kv_heads, head_dim, generator=gen)
    v = torch.randn(seq_len, kv_heads, head_dim, generator=gen)
    kc = torch.zeros(2 * blocks * 16, kv_heads, head_dim)
    vc = torch.zeros_like(kc)
    t = torch.arange(seq_len)
    slots = table[t // 16] * 16 + t % 16
    kc[slots], vc[slots] = k, v
    q = torch.randn(q_len, heads, head_dim, generator=gen)
    args = dict(
        query=q, key_cache=kc.view(-1, 16, kv_heads, head_dim), value_cache=vc.view(-1, 16, kv_heads, head_dim),
        block_tables=table[None].to(torch.int32), seq_lens=torch.tensor([seq_len], dtype=torch.int32),
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
    )
    return args, k, v


def one_point(backend, heads, kv_heads, head_dim, seq_len, reps):
    if backend == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from pagetrace import paged_attention

    torch.set_num_threads(os.cpu_count() or 1)
    args, _, _ = paged_inputs(heads, kv_heads, head_dim, seq_len, seq_len)
    start = time.perf_counter()
    paged_attention(**args, backend=backend)
    cold = time.perf_counter() - start
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        paged_attention(**args, backend=backend)
        times.append(time.perf_counter() - start)
    return {"cold_s": cold, "median_s": statistics.median(times) if times else cold}


def prefill(quick: bool) -> list[dict]:
    points = [("interpret", 1, 1, 64), ("torch", 1, 1, 64), ("torch", 32, 8, 128)]
    lengths = [1024] if quick else [1024, 2048, 4096, 8192]
    rows = []
    for backend, h, kv, d in points:
        for n in lengths:
            if h > 1 and n > 4096:
                continue  # 32 heads x 8k x 8k scores: a minute a call on 2 cores
            reps = 0 if backend == "interpret" and n > 2048 else (1 if backend == "interpret" or h > 1 else 3)
            cmd = [sys.executable, __file__, "--one", backend, str(h), str(kv), str(d), str(n), str(reps)]
            point = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            flops = 2 * h * n * n * d  # causal: half of 4 * h * n^2 * d
            rows.append({"backend": backend, "shape": f"{h}/{kv}/{d}", "tokens": n, **point, "gflops": flops / point["median_s"] / 1e9})
            print(f"  prefill {backend:9} {h}/{kv}/{d} {n:>5}: cold {point['cold_s']:.3f} s, median {point['median_s']:.3f} s", file=sys.stderr, flush=True)
    return rows


def against_sdpa(quick: bool) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from pagetrace import paged_attention

    torch.set_num_threads(os.cpu_count() or 1)
    from pagetrace.attention.reference import layout_cache

    cases = [(4096, 1, "nhd"), (4096, 512, "nhd")] if quick else [
        (4096, 1, "nhd"), (32768, 1, "nhd"), (4096, 1, "hnd"), (4096, 1, "vllm"), (4096, 512, "nhd"), (4096, 4096, "nhd")]
    rows = []
    for seq_len, q_len, layout in cases:
        args, k, v = paged_inputs(32, 8, 128, seq_len, q_len)
        if layout != "nhd":  # the same blocks in another layout (vllm: keys split in 16-byte runs, x = 4 fp32)
            args["key_cache"] = layout_cache(args["key_cache"], layout, "key", 4)
            args["value_cache"] = layout_cache(args["value_cache"], layout, "value", 4)
        kt, vt = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous()
        qt = args["query"].transpose(0, 1)[None]
        p = torch.arange(seq_len - q_len, seq_len)[:, None]
        mask = None if q_len == 1 else torch.arange(seq_len)[None, :] <= p

        def paged():
            return paged_attention(**args, layout=layout, backend="torch")

        def sdpa():
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True)

        diff = float((paged() - sdpa()[0].transpose(0, 1)).abs().max())
        for _ in range(0 if q_len > 1 else 5):  # warm both up: first calls fault in buffers and start threads
            paged(), sdpa()
        a, b, faults = [], [], {paged: 0, sdpa: 0}
        for _ in range(3 if q_len > 1 else 9 if quick else 31):
            for f, acc in ((paged, a), (sdpa, b)):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                f()
                acc.append(time.perf_counter() - start)
                faults[f] += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        rows.append({"seq_len": seq_len, "q_len": q_len, "layout": layout, "paged_s": statistics.median(a), "sdpa_s": statistics.median(b),
                     "ratio": statistics.median(a) / statistics.median(b), "max_abs_diff": diff,
                     "faults": (faults[paged] / len(a), faults[sdpa] / len(b))})
        print(f"  torch vs SDPA {seq_len:>6}/{q_len:<5} {layout}: {rows[-1]['ratio']:.2f}x", file=sys.stderr, flush=True)
    return rows


def chunk_sizes(kib: list[int]) -> None:
    """The 4k-token nhd decode against SDPA with torch_path.CHUNK_BYTES set to each size, interleaved."""
    import torch
    import torch.nn.functional as F

    from pagetrace import paged_attention
    from pagetrace.attention import torch_path

    torch.set_num_threads(os.cpu_count() or 1)
    args, k, v = paged_inputs(32, 8, 128, 4096, 1)
    kt, vt, qt = k.transpose(0, 1)[None].contiguous(), v.transpose(0, 1)[None].contiguous(), args["query"].transpose(0, 1)[None]
    calls = {"sdpa": lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)}
    for size in kib:
        def paged(size=size):
            torch_path.CHUNK_BYTES = size << 10
            return paged_attention(**args, backend="torch")
        calls[f"{size} KiB"] = paged
    times = {name: [] for name in calls}
    for rep in range(36):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if rep >= 5:  # five warm-up rounds
                times[name].append(time.perf_counter() - start)
    sdpa = statistics.median(times["sdpa"])
    print("| chunk | torch path | SDPA | ratio |\n|---|---|---|---|")
    for name in list(calls)[1:]:
        t = statistics.median(times[name])
        print(f"| {name} | {t * 1e3:.1f} ms | {sdpa * 1e3:.1f} ms | {t / sdpa:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sdpa-only", action="store_true", help="only the torch path against SDPA")
    parser.add_argument("--chunks", help="comma-separated chunk sizes in KiB: the 4k decode against SDPA for each")
    parser.add_argument("--one", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        backend, *nums = args.one
        print(json.dumps(one_point(backend, *map(int, nums))))
        return
    if args.chunks:
        chunk_sizes([int(x) for x in args.chunks.split(",")])
        return
    pre = [] if args.sdpa_only else prefill(args.quick)
    sd = against_sdpa(args.quick)
    print(f"# {time.strftime('%Y-%m-%d')} · {os.cpu_count()} cores")
    print("\n| backend | heads/kv/dim | prompt | cold (first call) | median | GFLOP/s |\n|---|---|---|---|---|---|")
    for r in pre:
        print(f"| {r['backend']} | {r['shape']} | {r['tokens']} | {r['cold_s']:.3f} s | {r['median_s']:.3f} s | {r['gflops']:.1f} |")
    print("\n| seq_len | new tokens | layout | torch path (paged) | SDPA (contiguous) | ratio | max abs diff | page faults a call |\n|---|---|---|---|---|---|---|---|")
    for r in sd:
        print(f"| {r['seq_len']} | {r['q_len']} | {r['layout']} | {r['paged_s'] * 1e3:.1f} ms | {r['sdpa_s'] * 1e3:.1f} ms | {r['ratio']:.2f}x | {r['max_abs_diff']:.1e} | {r['faults'][0]:.0f} / {r['faults'][1]:.0f} |")


if __name__ == "__main__":
    main()
