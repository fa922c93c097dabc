"""What `--html` costs: each command timed with and without it, in alternating pairs, and the
size of the page it writes.

    python bench/bench_page.py                 # run (worked example, 5,000 tokens), simulate (default): 5 pairs each
    python bench/bench_page.py --large         # and simulate of 100,000 requests over a 1M-block pool, one pair
    python bench/bench_page.py --sizes         # write docs/pages.md's table of page sizes (each page made now, its bytes counted)

Each timing is the whole command in a fresh process (`python -m pagetrace ...`), so the ratio
is what a user waits for; pairs alternate so the machine's load hits both alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "run (worked example)": ["run"],
    "run, 5,000 tokens (torch backend; the page summarised)": ["run", "--tokens", "5000", "--backend", "torch"],
    "simulate (default, 200 requests)": ["simulate"],
}
LARGE = {"simulate, 100,000 requests, 1M-block pool": ["simulate", "--requests", "100000", "--num-blocks", "1000000", "--arrival-rate", "0"]}


# docs/pages.md's table of page sizes: (what the page is, the command's arguments); written between the markers
SIZES = [
    ("the worked example", ["run"]),
    ("5,000 tokens (the page summarised)", ["run", "--tokens", "5000", "--backend", "torch"]),
    ("100,000 tokens (a pool of 7,824 blocks)", ["run", "--tokens", "100000"]),
    ("100,000 tokens, block size 1 (a 100,000-entry table)", ["run", "--tokens", "100000", "--block-size", "1", "--backend", "torch"]),
    ("64 sequences", ["run", "--tokens", ",".join(str(1000 + 37 * i) for i in range(64))]),
    ("a 64-token prefill of 20,000 tokens", ["run", "--tokens", "20000", "--query-len", "64"]),
    ("default simulate (200 requests)", ["simulate"]),
    ("simulate, 20,000 requests", ["simulate", "--requests", "20000"]),
    ("simulate, 10,000 requests over 100,000 blocks", ["simulate", "--requests", "10000", "--num-blocks", "100000", "--arrival-rate", "0"]),
    ("lookup, a tiled layout", ["lookup", "--token", "20", "--layout", "vllm-cpu-amx", "--dtype", "bf16", "--block-size", "32", "--head-dim", "32"]),
]
BEGIN, END = "<!-- page-sizes: written by python bench/bench_page.py --sizes -->", "<!-- /page-sizes -->"


def size_table(rows=SIZES) -> str:
    """The markdown table of each page's size in bytes, each page written now."""
    lines = ["| page | bytes | command |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "page.html"
        for name, cmd in rows:
            timed([*cmd, "--html", str(page)])
            shown = " ".join(cmd).replace("--tokens " + ",".join(str(1000 + 37 * i) for i in range(64)), "--tokens 1000,1037,...,3331")
            lines.append(f"| {name} | {page.stat().st_size:,} | `pagetrace {shown} --html page.html` |")
    return "\n".join(lines)


def write_sizes(doc: Path = ROOT / "docs" / "pages.md") -> None:
    text = doc.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    if not rest:
        raise SystemExit(f"{doc} has no {BEGIN!r} line")
    doc.write_text(head + BEGIN + "\n" + size_table() + "\n" + END + tail, encoding="utf-8")
    print(f"wrote the page sizes into {doc}")


def timed(args: list[str]) -> float:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pagetrace", *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"pagetrace {' '.join(args)} exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--large", action="store_true", help="also the 100,000-request simulate (one pair; a minute or more)")
    ap.add_argument("--sizes", action="store_true", help="write docs/pages.md's table of page sizes, and nothing else")
    args = ap.parse_args()
    if args.sizes:
        return write_sizes()
    print(f"# {time.strftime('%Y-%m-%d')} · {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| command | without --html | with --html | ratio | page |")
    print("|---|---|---|---|---|")
    todo = [(name, cmd, args.pairs) for name, cmd in COMMANDS.items()]
    if args.large:
        todo += [(name, cmd, 1) for name, cmd in LARGE.items()]
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd, pairs in todo:
            page = Path(tmp) / "page.html"
            plain, html = [], []
            for _ in range(pairs):
                plain.append(timed(cmd))
                html.append(timed([*cmd, "--html", str(page)]))
            a, b = statistics.median(plain), statistics.median(html)
            print(f"| `pagetrace {' '.join(cmd)}` | {a:.2f} s | {b:.2f} s | {b / a:.2f}x | {page.stat().st_size / 1e3:,.0f} kB |", flush=True)


if __name__ == "__main__":
    main()
