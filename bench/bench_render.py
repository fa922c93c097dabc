"""`run`'s render paths at block size 1 (one block per token): they must scale linearly.

    python bench/bench_render.py            # 8192, 32768, 131072 tokens
    python bench/bench_render.py --quick    # 8192 only

For each length: the run itself on the torch backend (`execute`, not timed here), then
the terminal rendering (`render` and printing it to a null console) and the JSON document
(`run_json` and its serialisation), each timed once. The old per-block `table.count(p)`
is timed beside them on the same table, to show what the one-pass count replaced.
"""

from __future__ import annotations

import argparse
import io
import json
import time
from contextlib import nullcontext

from rich.console import Console

from pagetrace.attention.traced_run import execute, prepare
from pagetrace.commands.run import render, repeated_blocks, run_json  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    value = fn()
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    lengths = [8192] if args.quick else [8192, 32768, 131072]
    print("| tokens (block size 1) | render + print | run_json + dumps | one-pass repeats | old table.count per block |")
    print("|---|---|---|---|---|")
    for n in lengths:
        setup = prepare(str(n), None, 1, 8, 1, 1, None, "fp32", None, 0, None, None, 0, "40", None, "torch", "cpu", True)
        result = execute(setup, all_rows=True, status=lambda _: nullcontext())
        console = Console(file=io.StringIO(), width=100)
        t_render, _ = timed(lambda: console.print(render(result)))
        t_json, _ = timed(lambda: json.dumps(run_json(result)))
        table = result.reports[0].table
        t_new, _ = timed(lambda: repeated_blocks(table))
        old = (lambda: {p for p in table if table.count(p) > 1}) if n <= 32768 else None
        t_old = f"{timed(old)[0] * 1000:.0f} ms" if old else "(skipped: minutes)"
        print(f"| {n:,} | {t_render * 1000:.0f} ms | {t_json * 1000:.0f} ms | {t_new * 1000:.1f} ms | {t_old} |")


if __name__ == "__main__":
    main()
