"""Mutation testing with mutmut (3.x), module group by module group.

    python scripts/mutate.py                 # every group, in the order below
    python scripts/mutate.py engines where   # some of them
    python scripts/mutate.py --list          # the groups, their files and tests
    python scripts/mutate.py sim --only policy.py   # one file of a group, in .mutmut/sim-policy/
    python scripts/mutate.py sim --only radix.py --without test_sim_digest.py   # without a slow test file

Each group runs in its own work folder, `.mutmut/<group>/` (git-ignored): a copy of
pagetrace/, tests/, README.md, docs/ and examples/, with a pyproject.toml whose
[tool.mutmut] section names the group's files (`only_mutate`) and the tests that judge
them. mutmut then runs those tests once to learn which test reaches which function, and
for each mutant only the tests that reach it, one process at a time (`--max-children 1`:
the machine is shared). Tests marked vllm are not run (`-m "not vllm"`), nor the kernel's
Triton-interpreter tests (not selected: they test the kernel, not these modules), nor the
examples' subprocess tests (a subprocess imports the installed package, not the mutant);
engine code only the vllm tests reach (engines/vllm.py, probe.py) is left out.

Results: `.mutmut/<group>/mutants/mutmut-cicd-stats.json` (killed, survived, no tests,
timeout, ...) and, per group, a line printed at the end. `cd .mutmut/<group> && mutmut show
NAME` prints one mutant's diff. docs/testing.md has the last run's score and the survivors
judged equivalent. Not part of .ci/run: it takes tens of minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutmut"
COPIED = ["pagetrace", "tests", "README.md", "docs", "examples", "pyproject.toml"]
NOT_SLOW = "not vllm"
# groups whose judges include vllm-marked tests that need no engine: the probe's tests call
# vLLM's CPU cache writer op directly, milliseconds a call
MARKERS = {"probe": "vllm or not vllm", "vllm-trace": "vllm or not vllm"}

GROUPS: dict[str, tuple[list[str], list[str]]] = {
    # group: (files to mutate, pytest arguments selecting the tests that judge them)
    "engines": (
        [
            "pagetrace/engines/address.py",
            "pagetrace/engines/bundle.py",
            "pagetrace/engines/check.py",
            "pagetrace/engines/export.py",
            "pagetrace/engines/flashinfer.py",
            "pagetrace/engines/guard.py",
            "pagetrace/engines/replay.py",
            "pagetrace/engines/sglang.py",
            "pagetrace/engines/views.py",
            "pagetrace/engines/vllm_plugin.py",
        ],
        [
            "tests/engines/test_engines.py",
            "tests/engines/test_engine_boundaries.py",
            "tests/engines/test_engine_errors.py",
            "tests/engines/test_bundle_documents.py",
            "tests/engines/test_bundle_manifest.py",
            "tests/engines/test_guard.py",
            "tests/engines/test_vllm_plugin.py",
            "tests/engines/test_vllm_settings.py",
            "tests/commands/test_bad_input.py",
            "tests/engines/test_check_data_records.py",
            "tests/engines/test_check_step_records.py",
            "tests/engines/test_export_vllm_split_key.py",
            "tests/engines/test_lookup_from_steps.py",
            "tests/engines/test_replay_requests.py",
            "tests/engines/test_sglang_page_size_one.py",
            "tests/engines/test_views_shapes_and_devices.py",
        ],
    ),
    "sim": (
        [
            "pagetrace/sim/baselines.py",
            "pagetrace/sim/blockpool.py",
            "pagetrace/sim/causes.py",
            "pagetrace/sim/compare.py",
            "pagetrace/sim/cruise.py",
            "pagetrace/sim/events.py",
            "pagetrace/sim/explain.py",
            "pagetrace/sim/history.py",
            "pagetrace/sim/hybrid.py",
            "pagetrace/sim/parallel.py",
            "pagetrace/sim/policy.py",
            "pagetrace/sim/radix.py",
            "pagetrace/sim/record.py",
            "pagetrace/sim/request.py",
            "pagetrace/sim/run.py",
            "pagetrace/sim/scheduler.py",
            "pagetrace/sim/summary.py",
            "pagetrace/sim/trace.py",
            "pagetrace/sim/vllm_hash.py",
            "pagetrace/sim/whatif.py",
            "pagetrace/sim/workload.py",
        ],
        [
            "tests/sim/test_sim.py",
            "tests/sim/test_sim_boundaries.py",
            "tests/sim/test_sim_policy.py",
            "tests/sim/test_sim_blockpool.py",
            "tests/sim/test_sim_scheduler.py",
            "tests/sim/test_sim_radix.py",
            "tests/sim/test_sim_digest.py",
            "tests/sim/test_sim_figures.py",
            "tests/sim/test_sim_workload.py",
            "tests/sim/test_sim_events.py",
            "tests/sim/test_sim_event_messages.py",
            "tests/sim/test_sim_trace.py",
            "tests/sim/test_sim_trace_format.py",
            "tests/sim/test_sim_vllm_hash.py",
            "tests/sim/test_sim_compare.py",
            "tests/sim/test_sim_hybrid.py",
            "tests/sim/test_sim_hybrid_rules.py",
            "tests/sim/test_sim_hybrid_manager.py",
            # these two wait on vLLM's ZMQ publisher (sleeps, timeouts): events.listen's mutants
            # took a minute each; listen is left out ("no tests"), decode and read are measured
            "--deselect", "tests/sim/test_sim_events.py::test_live_listen_times_out_and_reads_a_publisher",
            "--deselect", "tests/sim/test_sim_events.py::test_live_events_on_the_command_line",
            "tests/sim/test_sim_core.py",
            "tests/sim/test_sim_whatif.py",
            "tests/sim/test_sim_history.py",
            "tests/sim/test_sim_explain.py",
            # 18 s of the group's 28 s, paid by every surviving mutant; the digests' other 15
            # workloads, both paths, stay
            "--deselect", "tests/sim/test_sim_digest.py::test_behaviour_unchanged[bench-cruise]",
            "--deselect", "tests/sim/test_sim_digest.py::test_behaviour_unchanged[bench-explicit]",
            "--deselect", "tests/sim/test_sim_digest.py::test_behaviour_unchanged[sparse_arrivals-cruise]",
            "--deselect", "tests/sim/test_sim_digest.py::test_behaviour_unchanged[sparse_arrivals-explicit]",
            "--deselect", "tests/sim/test_sim_digest.py::test_digest_sees_a_one_token_change",
        ],
    ),
    "capacity": (
        ["pagetrace/sim/capacity.py"],
        [
            "tests/sim/test_capacity_boundaries.py",
            "tests/sim/test_capacity_budget.py",
            "tests/commands/test_capacity_where_messages.py",
            "tests/commands/test_cli_simulate.py",
            "tests/commands/test_bad_input.py",
            "-k", "capacity or budget or memory or weights or mixture or term",
        ],
    ),
    "where": (
        ["pagetrace/paging/where.py"],
        [
            "tests/engines/test_engine_boundaries.py",
            "tests/paging/test_layout_conventions.py",
            "tests/paging/test_layout_model.py",
            "tests/commands/test_bad_input.py",
            "tests/commands/test_capacity_where_messages.py",
            "-k", "where",
        ],
    ),
    "probe": (  # the layout learned from the engine's own cache writer
        ["pagetrace/engines/probe.py"],
        [
            "tests/paging/test_layout_model.py",
            "tests/commands/test_cli_layouts.py",
            "-k", "probe or writer",
        ],
    ),
    "vllm-trace": (  # the server trace's writer, on vLLM's own Request objects in process (no engine)
        ["pagetrace/engines/vllm_trace.py"],
        ["tests/engines/test_vllm_trace.py", "tests/engines/test_vllm_settings.py"],
    ),
    "views": (  # the Rich renderings of lookup, run, simulate and replay
        [
            "pagetrace/views/text.py",
            "pagetrace/views/run.py",
            "pagetrace/views/sim.py",
            "pagetrace/views/replay.py",
        ],
        [
            "tests/views/test_narrow_output.py",
            "tests/views/test_terminal_map.py",
            "tests/views/test_replay_view.py",
            "tests/views/test_sim_view.py",
            "tests/views/test_golden.py",
            "tests/views/test_view_layout.py",
            "tests/sim/test_sim_trace.py",
            "tests/sim/test_sim_hybrid.py",
            "tests/commands/test_cli_lookup.py",
            "tests/commands/test_cli_run.py",
            "tests/commands/test_cli_run_report.py",
            "tests/commands/test_cli_simulate.py",
            "tests/engines/test_engines.py",
            "tests/engines/test_engine_boundaries.py",
        ],
    ),
}


def work_folder(group: str, only: list[str] | None = None, without: list[str] | None = None) -> Path:
    files, tests = GROUPS[group]
    folder = WORK / group
    if only:  # some of the group's files, in a folder of their own: the group's results stay
        files = [f for f in files if any(f.endswith(o) for o in only)]
        folder = WORK / (group + "-" + "-".join(Path(f).stem for f in files))
    if without:  # the group's tests but these files (slow ones), in a folder of their own
        tests = [t for t in tests if not any(t.endswith(w) for w in without)]
        folder = folder.with_name(folder.name + "-without-" + "-".join(Path(w).stem for w in without))
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, folder / name)
    toml = (folder / "pyproject.toml").read_text()
    section = "\n".join([
        "", "[tool.mutmut]",
        'source_paths = ["pagetrace"]',
        f"only_mutate = {json.dumps(files)}",
        'also_copy = ["README.md", "docs", "examples"]',
        f"pytest_add_cli_args = {json.dumps(['-m', MARKERS.get(group, NOT_SLOW), '-p', 'no:cacheprovider', '-q'])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        "timeout_multiplier = 5.0",
        "timeout_constant = 5.0",  # a loaded machine: a failing CLI test can take seconds
        "",
    ])
    (folder / "pyproject.toml").write_text(toml + section)
    return folder


def run_group(group: str, only: list[str] | None = None, without: list[str] | None = None) -> dict:
    folder = work_folder(group, only, without)
    mutmut = Path(sys.executable).with_name("mutmut")
    start = time.monotonic()
    # one thread: mutmut forks a child per mutant, and a child of a process whose OpenMP pool
    # already ran (torch's matmuls) hangs in its first parallel matmul
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    subprocess.run([str(mutmut), "run", "--max-children", "1"], cwd=folder, env=env, check=False)
    subprocess.run([str(mutmut), "export-cicd-stats"], cwd=folder, env=env, check=False, capture_output=True)
    stats_file = folder / "mutants" / "mutmut-cicd-stats.json"
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else {}
    stats["group"], stats["seconds"] = group, round(time.monotonic() - start)
    return stats


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help=f"of {', '.join(GROUPS)}; default: all, in that order")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--only", action="append", metavar="FILE",
                        help="mutate only the group's files ending so (repeatable); works in .mutmut/<group>-<files>/")
    parser.add_argument("--without", action="append", metavar="TEST",
                        help="leave out the group's test files ending so (repeatable): a slow one; "
                             "works in .mutmut/<group>[-<files>]-without-<tests>/")
    args = parser.parse_args()
    if args.list:
        for name, (files, tests) in GROUPS.items():
            print(f"{name}: {' '.join(files)}\n    tests: {' '.join(tests)}")
        return 0
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        parser.error(f"unknown group {unknown[0]!r}: one of {', '.join(GROUPS)}")
    for o in args.only or []:
        if not any(f.endswith(o) for g in (args.groups or GROUPS) for f in GROUPS[g][0]):
            parser.error(f"--only {o!r}: no file of the groups named ends so")
    for w in args.without or []:
        if not any(t.endswith(w) for g in (args.groups or GROUPS) for t in GROUPS[g][1]):
            parser.error(f"--without {w!r}: no test file of the groups named ends so")
    results = [run_group(g, args.only, args.without) for g in (args.groups or list(GROUPS))]
    for s in results:
        killed, survived = s.get("killed", 0), s.get("survived", 0)
        judged = killed + survived
        score = f"{killed / judged:.1%}" if judged else "n/a"
        print(f"{s['group']}: {killed} killed, {survived} survived, {s.get('no_tests', 0)} no tests, "
              f"{s.get('timeout', 0)} timeout, {s.get('suspicious', 0)} suspicious, score {score}, {s['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
