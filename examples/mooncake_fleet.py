"""Mooncake's §5.3.2 set-up (FAST'25) in `pagetrace fleet`: 10 prefill instances of 3 M tokens each,
outputs of 1, prefix-aware routing, local caches against one global cache, on the conversation trace.

    python examples/mooncake_fleet.py                       # the trace kept in tests/data
    python examples/mooncake_fleet.py --trace /path/to/conversation_trace.jsonl --json

Each row is one `pagetrace fleet` run (the command line is printed with it); the paper's bars
(Figure 10, read off the chart) and the trace's own ceiling (every block seen before is a hit,
infinite cache, computed here from `hash_ids`) are printed beside them. docs/simulate.md
("A fleet") names every difference between this model and the paper's cluster.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shlex
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

from pagetrace.cli import run_cli

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "mooncake" / "conversation_trace.jsonl.gz"
BLOCKS = 5860  # 3,000,000 tokens / 512 = 5,859.4: 5,859 usable blocks of 512 (3.0 M tokens) and the null block
PAPER = {"local": 0.17, "global": 0.37}  # Figure 10, conversation: about 17% and 37% (the chart's "2.22x")
RUNS = [  # (label, the cache's flags, the router's flags)
    ("local, prefix-aware (longest prefix first)", ["--cache", "local"], ["--router", "prefix-aware", "--overlap-weight", "1000"]),
    ("global, prefix-aware (longest prefix first)", ["--cache", "pooled"], ["--router", "prefix-aware", "--overlap-weight", "1000"]),
    ("local, prefix-aware (Dynamo's weight 1)", ["--cache", "local"], ["--router", "prefix-aware"]),
    ("global, prefix-aware (Dynamo's weight 1)", ["--cache", "pooled"], ["--router", "prefix-aware"]),
    ("local, round-robin", ["--cache", "local"], ["--router", "round-robin"]),
    ("global, round-robin", ["--cache", "pooled"], ["--router", "round-robin"]),
]


def ceiling(path: Path) -> float:
    """Prompt tokens in full blocks whose prefix an earlier request sent (vLLM's lookup: at most
    (input_length - 1) // 512 blocks), over all prompt tokens: an infinite cache's hit rate."""
    opener = gzip.open if path.suffix == ".gz" else open
    seen: set[int] = set()
    hit = total = 0
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            o = json.loads(line)
            ids, n = o["hash_ids"], o["input_length"]
            total += n
            k = 0
            while k < (n - 1) // 512 and ids[k] in seen:  # an id names its whole prefix (mooncake.py)
                k += 1
            hit += k * 512
            seen.update(ids[: n // 512])
    return hit / total


def fleet(trace: Path, cache: list[str], router: list[str], step_ms: float) -> tuple[list[str], dict]:
    args = ["fleet", "--trace", str(trace), "--instances", "10", "--num-blocks", str(BLOCKS), "--block-size", "512",
            "--max-num-batched-tokens", "8192", "--max-tokens", "1", "--step-ms", str(step_ms), *cache, *router, "--json"]
    out = StringIO()
    with redirect_stdout(out):
        code = run_cli(args)
    if code:
        sys.exit(f"pagetrace {shlex.join(args)} exited {code}")
    return args, json.loads(out.getvalue())["fleet"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--step-ms", type=float, default=50.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    top = ceiling(a.trace)
    rows = []
    for label, cache, router in RUNS:
        args, doc = fleet(a.trace, cache, router, a.step_ms)
        rows.append({"run": label, "command": "pagetrace " + shlex.join(args[:-1]), "hit_rate": doc["hit_rate"],
                     "local_hit_rate": doc["local_hit_rate"], "shared_hit_rate": doc["shared_hit_rate"],
                     "imbalance_requests": doc["imbalance"]["requests"], "of_ceiling": round(doc["hit_rate"] / top, 4)})
    if a.json:
        print(json.dumps({"ceiling": round(top, 6), "paper": PAPER, "runs": rows}, indent=2))
        return
    print(f"the trace's ceiling (infinite cache): {100 * top:.1f}%; the paper (Figure 10): local about "
          f"{100 * PAPER['local']:.0f}%, global about {100 * PAPER['global']:.0f}%")
    for r in rows:
        print(f"{r['run']:<46} hit rate {100 * r['hit_rate']:5.1f}%  (local {100 * r['local_hit_rate']:5.1f}%, "
              f"from peers {100 * r['shared_hit_rate']:5.1f}%; {100 * r['of_ceiling']:.0f}% of the ceiling; "
              f"requests max/mean {r['imbalance_requests']:.2f})")


if __name__ == "__main__":
    main()
