"""Start-up of `pagetrace lookup` against the floor of its stack (bench/floor_app.py: a
minimal Typer app printing one Rich table), each run as a fresh process.

    python bench/bench_startup.py [--runs 30]

Runs the two commands alternately (so a busy machine slows both alike) and prints the
median wall time of each and their ratio; the aim is 1.15x or less.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
COMMANDS = {
    "floor (Typer + one Rich table)": [sys.executable, str(HERE / "floor_app.py"), "lookup", "--token", "20"],
    "pagetrace lookup": [sys.executable, "-m", "pagetrace", "lookup", "--token", "20", "--table", "7,2,15"],
}


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=HERE.parent)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for name, command in COMMANDS.items():  # warm the bytecode caches
        wall(command)
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            times[name].append(wall(command))
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, m in medians.items():
        print(f"{name:<32} median {m * 1000:7.1f} ms  (min {min(times[name]) * 1000:.1f} ms, {args.runs} runs)")
    floor, lookup = medians.values()
    print(f"ratio lookup / floor: {lookup / floor:.2f}x")


if __name__ == "__main__":
    main()
