"""Static report of the compiled kernel, without a GPU: every launch `paged_attention`
would make, compiled for sm_90 and sm_80 with Triton's own ptxas.

    python bench/compile_report.py                  # the representative configs (as CI compiles)
    python bench/compile_report.py --full           # the full matrix (pagetrace/attention/compile_matrix.py)
    python bench/compile_report.py --fixes --save after.json --compare bench/compile_before.json
    python bench/compile_report.py --prefill --save after.json --compare before.json

Per launch: registers and spill bytes per thread (ptxas -v), shared memory, the width of
each tensor's global loads (from the PTX line info: "16B cp.async" is a pipelined 16-byte
copy, "2B" a scalar 2-byte load), the dot instructions (wgmma / mma / fma), programs
resident per SM (registers, shared memory, threads) and the grid in waves of those.

--fixes compiles the configs behind issue 10's fixes; --compare prints them against a
saved run of an older kernel (see bench/README.md for how bench/compile_before.json was made).
--prefill compiles every prefill config of the full matrix and prints, per (arch, dtype,
head_dim, GQA group), the worst partition launch: spills, registers, shared memory, tiles.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pagetrace.attention.compile_matrix import ARCH_NAMES, compile_configs, from_record, full_matrix, representative  # noqa: E402
from pagetrace.attention.gpu_compile import Compiled, Config  # noqa: E402

TILES = ("q", "k", "v")  # the loads shown per launch; the rest are a few scalars per program
PRODUCTION = dict(block_size=16, head_dim=128, num_heads=32, num_kv_heads=8)
GROWING_CONTEXTS = [(n,) * b for b in (1, 16) for n in (1000, 1024, 3000, 4096, 16384, 131072)]


def fixes_configs() -> dict[str, list[Config]]:
    """The configs issue 10's fixes show in, by the row they make."""
    return {
        "vllm fp16 d128, batch 16 x 4k": [Config("vllm", "fp16", seq_lens=(4096,) * 16, **PRODUCTION)],
        "nhd fp16 d128, batch 16 x 4k": [Config("nhd", "fp16", seq_lens=(4096,) * 16, **PRODUCTION)],
        "nhd fp16 d128 traced, batch 16 x 4k": [Config("nhd", "fp16", seq_lens=(4096,) * 16, trace=True, **PRODUCTION)],
        "worked example (blocks fp32 d8, 1 head, 38 tokens)": [Config("blocks", "fp32", 16, 8, 1, 1, (38,))],
        "nhd fp32 d128 group 4, batch 16 x 4k": [Config("nhd", "fp32", seq_lens=(4096,) * 16, **PRODUCTION)],
        "nhd fp16 d128, batch 1 x 1k": [Config("nhd", "fp16", seq_lens=(1024,), **PRODUCTION)],
        "nhd fp16 d128, 12 contexts 1k-128k, batch 1 and 16": [Config("nhd", "fp16", seq_lens=c, **PRODUCTION) for c in GROWING_CONTEXTS],
    }


def table(records: list[Compiled]) -> list[str]:
    rows = [
        "| arch | config | kernel | grid | regs | spills | smem | loads | dot | programs/SM | waves |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        kernel = r.kernel.removeprefix("_paged_attention_")
        grid = "x".join(map(str, r.grid))
        if r.error:
            rows.append(f"| {r.arch} | {r.config.label} | {kernel} | {grid} | **{r.error}** | | | | | | |")
            continue
        tiles = {k: v for k, v in r.loads.items() if k in TILES} or r.loads  # the per-tile tensors, when the kernel has them
        shown = ", ".join(f"{k}: {v}" for k, v in tiles.items())
        rows.append(
            f"| {r.arch} | {r.config.label} | {kernel} | {grid} | {r.registers} | {r.spill_bytes} B | "
            f"{r.shared_bytes / 1024:.1f} KiB | {shown} | {r.dot} | {r.programs_per_sm} | {r.waves:.2f} |"
        )
    return rows


def summary(records: list[Compiled]) -> dict[str, str]:
    """One row's figures for the before/after table."""
    part = [r for r in records if r.kernel.endswith("partition")]
    first = part[0]
    return {
        "registers": str(first.registers),
        "spills": f"{first.spill_bytes} B",
        "K loads": first.loads.get("k", "-"),
        "V loads": first.loads.get("v", "-"),
        "PTX instr.": str(first.instructions),
        "fp32 FMAs": str(first.fmas),
        "programs (waves)": f"{'x'.join(map(str, first.grid))} ({first.waves:.2f})",
        "variants": f"{len({r.key for r in part})} + {len({r.key for r in records if r not in part})}",
    }


def compare(before: list[Compiled], after: list[Compiled]) -> list[str]:
    """One row per (arch, fix config), each cell "before → after" (the partition kernel's figures)."""
    figures = list(summary(after[:1] or before[:1]) if after else [])
    rows = ["| arch | config | " + " | ".join(figures) + " |", "|---" * (len(figures) + 2) + "|"]
    for arch in ARCH_NAMES:
        for name, configs in fixes_configs().items():
            pick = lambda recs: [r for r in recs if r.arch == arch and r.config in configs]  # noqa: E731
            b, a = pick(before), pick(after)
            if not b or not a:
                continue
            sb, sa = summary(b), summary(a)
            cells = [
                ("" if len(configs) > 1 and f != "variants" else sb[f] if sb[f] == sa[f] else f"{sb[f]} → **{sa[f]}**")
                for f in figures
            ]
            rows.append(f"| {arch} | {name} | " + " | ".join(cells) + " |")
    return rows


def prefill_rows(records: list[Compiled]) -> dict[tuple, dict[str, str]]:
    """The prefill partition launches by (arch, dtype, head_dim, group): the worst figures."""
    groups: dict[tuple, list[Compiled]] = {}
    for r in records:
        if r.kernel.endswith("partition") and not r.config.decode and not r.error:
            c = r.config
            groups.setdefault((r.arch, c.cache_dtype or c.dtype, c.head_dim, c.num_heads // c.num_kv_heads), []).append(r)
    out = {}
    for key, rs in sorted(groups.items()):
        tiles = sorted({(r.constexprs["BLOCK_Q"] * r.constexprs["GROUP_P"], r.constexprs["BLOCK_N"]) for r in rs})
        out[key] = {
            "configs": str(len(rs)),
            "spills (max)": f"{max(r.spill_bytes for r in rs)} B",
            "registers (max)": str(max(r.registers for r in rs)),
            "smem (max)": f"{max(r.shared_bytes for r in rs) / 1024:.0f} KiB",
            "rows x keys": ", ".join(f"{m}x{n}" for m, n in tiles),
            "dot": "/".join(sorted({r.dot for r in rs})),
        }
    return out


def prefill_table(records: list[Compiled], before: list[Compiled] | None = None) -> list[str]:
    after = prefill_rows(records)
    old = prefill_rows(before) if before else {}
    figures = list(next(iter(after.values()), {}))
    rows = ["| arch | dtype | head_dim | group | " + " | ".join(figures) + " |", "|---" * (len(figures) + 4) + "|"]
    for key, cells in after.items():
        b = old.get(key, cells)
        shown = [cells[f] if b[f] == cells[f] else f"{b[f]} → **{cells[f]}**" for f in figures]
        rows.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(shown) + " |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the full matrix, not the representative configs")
    parser.add_argument("--fixes", action="store_true", help="the configs behind issue 10's fixes")
    parser.add_argument("--prefill", action="store_true", help="every prefill config of the full matrix, worst figures per dtype/head_dim/group")
    parser.add_argument("--arch", default=",".join(ARCH_NAMES), help="comma-separated, of " + ", ".join(ARCH_NAMES))
    parser.add_argument("--jobs", type=int, help="worker processes (default: one per core, at most 8)")
    parser.add_argument("--kernel", default="", help="only the launches whose kernel name contains this (e.g. partition)")
    parser.add_argument("--save", type=Path, help="write the records as JSON here")
    parser.add_argument("--compare", type=Path, help="a --save file of an older kernel: print before/after")
    args = parser.parse_args()

    if args.prefill:
        configs = [c for c in full_matrix() if not c.decode]
    elif args.fixes:
        configs = list(dict.fromkeys(c for group in fixes_configs().values() for c in group))
    else:
        configs = full_matrix() if args.full else representative()
    start = time.perf_counter()
    records, missing = compile_configs(configs, tuple(args.arch.split(",")), jobs=args.jobs)
    if missing:
        sys.exit(f"compile_report.py: {missing}")
    took = time.perf_counter() - start
    if args.save:
        args.save.write_text(json.dumps([asdict(r) for r in records], indent=0))
    variants = len({r.key for r in records})
    print(f"# {len(configs)} configs, {len(records)} launches, {variants} distinct variants, compiled in {took:.0f} s\n")
    if args.prefill:
        before = [from_record(r) for r in json.loads(args.compare.read_text())] if args.compare else None
        print("\n".join(prefill_table(records, before)))
    elif args.compare:
        before = [from_record(r) for r in json.loads(args.compare.read_text())]
        print("\n".join(compare(before, records)))
    else:
        print("\n".join(table([r for r in records if args.kernel in r.kernel])))


if __name__ == "__main__":
    main()
