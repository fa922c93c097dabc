"""Mutation testing by hand: realistic one-line bugs, applied one at a time to a copy of
the package, each run against the tests that should catch it.

    python scripts/mutations.py                # every mutation (about 10 minutes on 2 cores)
    python scripts/mutations.py --only layouts # the ones whose name contains "layouts"
    python scripts/mutations.py --list

A mutation is *caught* when its tests fail (or error), *missed* when they pass. A
mutation whose text is no longer in the source is reported as stale and not counted:
update it when the code moves. The score and the command go in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

KERNEL_TESTS = [
    "tests/test_kernel.py::test_worked_example_numbers",
    "tests/test_kernel.py::test_kernel_on_caches_built_by_an_explicit_permute",
    "tests/test_kernel.py::test_many_partitions_merge",
]
LAYOUT_TESTS = ["tests/test_layout_conventions.py", "tests/test_layouts.py", "tests/test_kernel.py::test_kernel_on_caches_built_by_an_explicit_permute"]
BLOCK_TESTS = ["tests/test_blocks.py", "tests/test_cli_lookup.py"]
RUN_TESTS = ["tests/test_cli_run.py", "tests/test_cli_run_report.py"]
CLI_TESTS = ["tests/test_cli_app.py", "tests/test_cli_lookup.py"]
WHERE_TESTS = ["tests/test_layout_conventions.py"]
LAYOUT_MODEL_TESTS = ["tests/test_layout_model.py"]
ENGINE_TESTS = ["tests/test_engines.py"]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    tests: list[str]


MUTATIONS = [
    # block-table arithmetic
    Mutation("blocks: logical block off by one", "pagetrace/paging/blocks.py", "logical_block, offset = divmod(token, block_size)", "logical_block, offset = divmod(token + 1, block_size)", BLOCK_TESTS),
    Mutation("blocks: slot without the block size", "pagetrace/paging/blocks.py", "slot=physical_block * block_size + offset,", "slot=physical_block + offset,", BLOCK_TESTS),
    Mutation("blocks: capacity one block too many", "pagetrace/paging/blocks.py", "return len(table) * block_size", "return (len(table) + 1) * block_size", BLOCK_TESTS),
    Mutation("blocks: coverage last token inclusive+1", "pagetrace/paging/blocks.py", "min(first + block_size, seq_len) - 1", "min(first + block_size, seq_len)", BLOCK_TESTS),
    Mutation("blocks: blocks_needed floors", "pagetrace/paging/blocks.py", "return cdiv(seq_len, block_size)", "return seq_len // block_size + 1", BLOCK_TESTS),
    Mutation("blocks: pool bound off by one", "pagetrace/paging/blocks.py", "if num_blocks is not None and physical >= num_blocks:", "if num_blocks is not None and physical > num_blocks:", BLOCK_TESTS),
    Mutation("blocks: repeats allowed", "pagetrace/paging/blocks.py", "if physical in seen and not allow_repeats:", "if False:", BLOCK_TESTS),
    Mutation("blocks: slot_mapping offset", "pagetrace/paging/blocks.py", "* block_size + t % block_size for t in range(seq_len)]", "* block_size + t // block_size for t in range(seq_len)]", BLOCK_TESTS),
    # layouts: the one table and its arithmetic
    Mutation("layouts: hnd as nhd", "pagetrace/paging/layouts.py", '''               ("block", "head", "slot", "dim"), ("block", "head", "slot", "dim")),''', '''               ("block", "slot", "head", "dim"), ("block", "slot", "head", "dim")),''', LAYOUT_TESTS),
    Mutation("layouts: vllm value dim and slot swapped", "pagetrace/paging/layouts.py", '("block", "head", "dim/x", "slot", "dim%x"), ("block", "head", "dim", "slot")),', '("block", "head", "dim/x", "slot", "dim%x"), ("block", "head", "slot", "dim")),', LAYOUT_TESTS),
    Mutation("layouts: vllm key chunk of 8 bytes", "pagetrace/paging/layouts.py", "VLLM_KEY_CHUNK_BYTES = 16", "VLLM_KEY_CHUNK_BYTES = 8", LAYOUT_TESTS),
    Mutation("layouts: amx pairs of 2 bytes", "pagetrace/paging/layouts.py", "AMX_PAIR_BYTES = 4", "AMX_PAIR_BYTES = 2", LAYOUT_MODEL_TESTS),
    Mutation("layouts: amx key groups of 8 slots", "pagetrace/paging/layouts.py", '("block", "head", "kv", "slot/16", "dim/p", "slot%16", "dim%p"),', '("block", "head", "kv", "slot/8", "dim/p", "slot%8", "dim%p"),', LAYOUT_MODEL_TESTS),
    Mutation("layouts: amx value tiles in slot order", "pagetrace/paging/layouts.py", '("block", "head", "kv", "dim/16", "slot/p", "dim%16", "slot%p")', '("block", "head", "kv", "slot/p", "dim/16", "dim%16", "slot%p")', LAYOUT_MODEL_TESTS),
    Mutation("layouts: vllm-cpu key row-major", "pagetrace/paging/layouts.py", '("block", "head", "kv", "dim", "slot"), ("block", "head", "kv", "slot", "dim"), raw=', '("block", "head", "kv", "slot", "dim"), ("block", "head", "kv", "slot", "dim"), raw=', LAYOUT_MODEL_TESTS + ENGINE_TESTS),
    Mutation("layouts: strides not accumulated", "pagetrace/paging/layouts.py", "            stride *= n\n", "            stride += n\n", LAYOUT_TESTS),
    Mutation("layouts: byte offset in elements", "pagetrace/paging/layouts.py", "byte_offset=offsets[0] * geom.element_size,", "byte_offset=offsets[0],", LAYOUT_TESTS),
    Mutation("layouts: value in the key half", "pagetrace/paging/layouts.py", 'coords = {"block": block, "slot": slot, "head": head, "dim": dim, "kv": 0 if which == "key" else 1}\n        total = 0', 'coords = {"block": block, "slot": slot, "head": head, "dim": dim, "kv": 0}\n        total = 0', LAYOUT_TESTS),
    Mutation("layouts: flash-hnd in NHD memory order", "pagetrace/paging/layouts.py", '''               ("kv", "block", "head", "slot", "dim"), ("kv", "block", "head", "slot", "dim"), view=_FA),''', '''               ("kv", "block", "slot", "head", "dim"), ("kv", "block", "slot", "head", "dim"), view=_FA),''', LAYOUT_TESTS),
    Mutation("layouts: flashinfer kv outermost", "pagetrace/paging/layouts.py", '_FI = ("block", "kv", "slot", "head", "dim")', '_FI = ("kv", "block", "slot", "head", "dim")', LAYOUT_TESTS),
    Mutation("layouts: block base at slot 1", "pagetrace/paging/layouts.py", "block_base=geom.element(which, block, 0, 0, 0),", "block_base=geom.element(which, block, 1, 0, 0),", LAYOUT_TESTS + BLOCK_TESTS),
    Mutation("layouts: inverse ignores the kv factor", "pagetrace/paging/layouts.py", '            if kv is None or ("key", "value")[kv] == which:', "            if True:", LAYOUT_MODEL_TESTS + WHERE_TESTS),
    Mutation("layouts: inverse drops the divisor", "pagetrace/paging/layouts.py", "                coords[f.axis] += digit * f.div", "                coords[f.axis] += digit", LAYOUT_MODEL_TESTS + WHERE_TESTS),
    Mutation("layouts: tiled split accepted", "pagetrace/paging/layouts.py", "            if geom.axis_size(axis) % need:", "            if False:", LAYOUT_MODEL_TESTS),
    Mutation("layouts: a split value counts as affine", "pagetrace/paging/layouts.py", "            elif f.size > 1:  # a split that matters", "            elif False:", LAYOUT_MODEL_TESTS + ENGINE_TESTS),
    # the probe: a layout learned from a writer
    Mutation("probe: one digit per coordinate", "pagetrace/engines/probe.py", "            if div >= n:", "            if True:", LAYOUT_MODEL_TESTS),
    Mutation("probe: values not told from keys", "pagetrace/engines/probe.py", '    for which, sign in (("key", 1), ("value", -1)):', '    for which, sign in (("key", 1),):', LAYOUT_MODEL_TESTS),
    Mutation("probe: dims unchecked", "pagetrace/engines/probe.py", '& (named["head"][where] == hh) & (named["dim"][where] == dd)', '& (named["head"][where] == hh)', LAYOUT_MODEL_TESTS),
    Mutation("dtypes: bf16 four bytes", "pagetrace/paging/dtypes.py", '"bf16": 2, "fp8_e4m3"', '"bf16": 4, "fp8_e4m3"', LAYOUT_TESTS + CLI_TESTS),
    Mutation("lookup: chunk bytes in elements", "pagetrace/paging/lookup.py", '"byte_offset": c.element_offset * addr.element_size,', '"byte_offset": c.element_offset,', LAYOUT_TESTS + CLI_TESTS),
    # the kernel and its launcher
    Mutation("kernel: partition end past the sequence", "pagetrace/attention/kernel.py", "end = tl.minimum(part * partition_size + partition_size, hi)", "end = part * partition_size + partition_size", KERNEL_TESTS),
    Mutation("kernel: key ignores the KV head", "pagetrace/attention/kernel.py", "k_token = physical * stride_kb + offset * stride_ko + kv_head * stride_kh", "k_token = physical * stride_kb + offset * stride_ko", KERNEL_TESTS),
    Mutation("kernel: rescale factor inverted", "pagetrace/attention/kernel.py", "alpha = tl.exp(m_i - m_safe)", "alpha = tl.exp(m_safe - m_i)", KERNEL_TESTS),
    Mutation("kernel: traced slot without offset", "pagetrace/attention/kernel.py", "t * stride_tt, physical * block_size + offset, mask=first_head)", "t * stride_tt, physical * block_size, mask=first_head)", KERNEL_TESTS + ["tests/test_cli_run.py::test_run_json_carries_every_row"]),
    Mutation("launcher: block-table strides swapped", "pagetrace/attention/launch.py", "*block_tables.stride(),", "*reversed(block_tables.stride()),", KERNEL_TESTS),
    # run's check and report
    Mutation("report: fp32 tolerance x1000", "pagetrace/attention/report.py", '"fp32": 1e-5', '"fp32": 1e-2', RUN_TESTS),
    Mutation("report: bf16 tolerance x1000", "pagetrace/attention/report.py", '"bf16": 1.6e-2', '"bf16": 16.0', RUN_TESTS),
    Mutation("report: comparison ignores the bound", "pagetrace/attention/report.py", "passed = bool((diff <= tol * (1 + want.abs())).all())", "passed = bool((diff <= tol * (1 + want.abs()) * 1000).all())", RUN_TESTS),
    Mutation("report: slot check compares with itself", "pagetrace/attention/report.py", "torch.nonzero(got != want)", "torch.nonzero(got != got)", RUN_TESTS + ["tests/test_report.py"]),
    Mutation("report: block mass misses the last token", "pagetrace/attention/report.py", "cumulative[span.last_token + 1] - cumulative[span.first_token]", "cumulative[span.last_token] - cumulative[span.first_token]", RUN_TESTS),
    Mutation("render_run: repeated blocks need three", "pagetrace/commands/run.py", "if n > 1}", "if n > 2}", RUN_TESTS),
    Mutation("render_run: plural always", "pagetrace/views/run.py", 'noun = what if count != 1 else what.removesuffix("s")', "noun = what", RUN_TESTS),
    Mutation("run: torch backend claims the kernel check", "pagetrace/commands/run.py", '("slots", slots_line(checks, kernel_ran=s.backend != "torch")),', '("slots", slots_line(checks, kernel_ran=True)),', RUN_TESTS),
    # where
    Mutation("where: owner token without offset", "pagetrace/paging/where.py", "SlotOwner(s, logical, logical * block_size + offset)", "SlotOwner(s, logical, logical * block_size)", WHERE_TESTS),
    Mutation("where: the cache option ignored", "pagetrace/paging/where.py", 'geom.coordinates(element, None if geom.layout.combined else which)', 'geom.coordinates(element, None)', WHERE_TESTS + LAYOUT_MODEL_TESTS),
    # the command line
    Mutation("cli: unicode digits accepted", "pagetrace/commands/options.py", '_ASCII_INT = re.compile(r"-?[0-9]+")', '_ASCII_INT = re.compile(r"-?\\d+")', CLI_TESTS),
    Mutation("cli: usage errors exit 1", "pagetrace/cli.py", "        return _fail(str(exc), 2)", "        return _fail(str(exc), 1)", CLI_TESTS),
    Mutation("cli: aliases ignored", "pagetrace/commands/options.py", "canonical = self.aliases.get(text.lower(), text)", "canonical = text", CLI_TESTS),
]


def copy_tree(dest: Path) -> None:
    for name in ("pagetrace", "tests"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):  # tests hold the README and docs/ to the code
        shutil.copy(ROOT / name, dest / name)
    shutil.copytree(ROOT / "docs", dest / "docs")


def run_tests(workdir: Path, tests: list[str], timeout: int) -> tuple[bool, float]:
    """True when the tests pass (the mutation is missed)."""
    existing = [t for t in tests if (workdir / t.split("::")[0]).exists()]
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *existing],
            cwd=workdir, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        )
        passed = proc.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False  # a hang is a caught mutation: the suite did not pass
    return passed, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="", help="run the mutations whose name contains this text")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per mutation's tests")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if args.only in m.name]
    if args.list:
        for m in chosen:
            print(f"{m.name}  ({m.path})")
        return 0
    caught, missed, stale = [], [], []
    with tempfile.TemporaryDirectory(prefix="pagetrace-mutations-") as tmp:
        work = Path(tmp)
        copy_tree(work)
        # the unmutated tests must pass, or every mutation would look caught
        baseline = sorted({t for m in chosen for t in m.tests})
        ok, seconds = run_tests(work, baseline, args.timeout * 2)
        print(f"baseline: the unmutated tests {'pass' if ok else 'FAIL'} ({seconds:.0f} s)", flush=True)
        if not ok:
            return 2
        for m in chosen:
            target = work / m.path
            original = (ROOT / m.path).read_text()
            if original.count(m.old) != 1:
                stale.append(m)
                print(f"STALE   {m.name}: the text to mutate is not in {m.path} exactly once", flush=True)
                continue
            target.write_text(original.replace(m.old, m.new))
            try:
                passed, seconds = run_tests(work, m.tests, args.timeout)
            finally:
                target.write_text(original)
            (missed if passed else caught).append(m)
            print(f"{'MISSED' if passed else 'caught'}  {m.name}  ({seconds:.0f} s)", flush=True)
    counted = len(caught) + len(missed)
    score = 100 * len(caught) / counted if counted else 0.0
    print(f"\n{len(caught)} of {counted} mutations caught ({score:.0f}%); {len(stale)} stale")
    for m in missed:
        print(f"  missed: {m.name}")
    return 0 if not missed else 1


if __name__ == "__main__":
    sys.exit(main())
