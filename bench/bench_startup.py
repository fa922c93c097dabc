"""Start-up of `pagetrace lookup` against the floor of its stack (bench/floor_app.py: a
minimal Typer app printing one Rich table), each run as a fresh process.

    python bench/bench_startup.py [--runs 30]

Runs the two commands alternately (so a busy machine slows both alike) and prints the
median wall time and the median CPU time (user + system, from the children's rusage:
steadier than wall time on a shared machine) of each, and their ratios; the aim is 1.15x.
"""

from __future__ import annotations

import argparse
import compileall
import resource
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


def timed(command: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of `command`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, cwd=HERE.parent)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpus: dict[str, list[float]] = {name: [] for name in COMMANDS}
    # pip writes the package's byte code at install; a run with PYTHONDONTWRITEBYTECODE set
    # (as some machines do) would otherwise compile every edited module on every start
    compileall.compile_dir(str(HERE.parent / "pagetrace"), quiet=1)
    import platform

    import typer

    print(f"typer {typer.__version__}, Python {platform.python_version()}, {platform.machine()}")
    for command in COMMANDS.values():  # warm the file caches
        timed(command)
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            wall, cpu = timed(command)
            walls[name].append(wall)
            cpus[name].append(cpu)
    for name in COMMANDS:
        print(
            f"{name:<32} wall median {statistics.median(walls[name]) * 1000:6.1f} ms (min {min(walls[name]) * 1000:.1f}),"
            f" CPU median {statistics.median(cpus[name]) * 1000:6.1f} ms  ({args.runs} runs)"
        )
    (floor, lookup) = COMMANDS
    print(f"ratio lookup / floor: wall {statistics.median(walls[lookup]) / statistics.median(walls[floor]):.2f}x,"
          f" CPU {statistics.median(cpus[lookup]) / statistics.median(cpus[floor]):.2f}x")


if __name__ == "__main__":
    main()
