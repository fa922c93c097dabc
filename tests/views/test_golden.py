"""Golden renderings of the terminal views: each view rendered for a few fixed, realistic
inputs on a fixed console (a truecolor terminal, no legacy Windows, nothing read from the
environment) and compared, styles included, with the file checked in under
tests/views/golden/. A change of alignment, padding, wrapping, title, caption or style shows
here as a diff that a test splitting output on whitespace cannot see.

The inputs are plain numbers chosen by hand (no kernel runs, no float arithmetic that could
round differently on another CPU): `lookup`'s arithmetic, `run`'s per-token rows and block
masses, `replay`'s summary, `simulate`'s integer simulation of a seeded workload.

Regenerate after an intended change, then read every changed file (`cat -v` shows the styles,
`less -R` renders them) before committing:

    PAGETRACE_UPDATE_GOLDEN=1 python -m pytest -q tests/views/test_golden.py

Each file's first line records the Rich version and the width it was rendered with. Rich may
lay out or style a table differently from one major version to the next (pyproject allows
rich>=13.7): under another major version than the recorded one the comparison is skipped,
saying so, rather than failing on Rich's change instead of ours; the tests in
tests/views/test_view_layout.py, which check the same properties by meaning, still run.
"""

from __future__ import annotations

import difflib
import io
import json
import os
import re
from importlib.metadata import version
from pathlib import Path

import pytest
from rich.console import Console

from bundles import write_bundle
from conftest import cli
from pagetrace.attention.report import Checks, HeadSummary, Row, SequenceReport
from pagetrace.engines.bundle import read_manifest
from pagetrace.engines.replay import RequestResult, ReplaySummary, cache_read
from pagetrace.paging.blocks import coverage
from pagetrace.paging.lookup import trace_token
from pagetrace.sim.compare import Comparison
from pagetrace.sim.events import EventStream
from pagetrace.views.replay import render_replay
from pagetrace.views.run import check_line, render_run
from pagetrace.views.sim import render_comparison
from pagetrace.views.text import render_lookup

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("PAGETRACE_UPDATE_GOLDEN") == "1"
RICH = version("rich")
HEADER = re.compile(r"^# rich (\S+), width (\d+)")


def console(width: int) -> Console:
    """What a user's truecolor terminal of `width` columns shows, whatever this process's
    environment says (COLUMNS, NO_COLOR, TERM, FORCE_COLOR are not read)."""
    return Console(file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor", legacy_windows=False,
                   no_color=False, highlight=False, _environ={})


def render(renderable, width: int) -> str:
    c = console(width)
    c.print(renderable)
    return c.file.getvalue()


def check_golden(name: str, text: str, width: int) -> None:
    path = GOLDEN / f"{name}.ansi"
    header = f"# rich {RICH}, width {width}: tests/views/test_golden.py; regenerate with PAGETRACE_UPDATE_GOLDEN=1 and review\n"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(header + text, encoding="utf-8")
        return
    assert path.exists(), f"{path} is missing: run PAGETRACE_UPDATE_GOLDEN=1 python -m pytest {__file__}, read it, commit it"
    first, _, expected = path.read_text(encoding="utf-8").partition("\n")
    recorded = HEADER.match(first)
    assert recorded and int(recorded.group(2)) == width, f"{path}: the first line must be '# rich X.Y.Z, width {width}...'"
    if recorded.group(1).split(".")[0] != RICH.split(".")[0]:
        pytest.skip(f"{path.name} was rendered with rich {recorded.group(1)}, this is rich {RICH}: another major version "
                    "may lay tables out differently; regenerate with PAGETRACE_UPDATE_GOLDEN=1 and review")
    if text != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "now", lineterm=""))
        pytest.fail(f"{path.name} differs from the rendering (rich {RICH}; the file's {recorded.group(1)}). If the change is "
                    f"intended, regenerate with PAGETRACE_UPDATE_GOLDEN=1 and review the file by eye.\n{diff}")


# -- lookup ------------------------------------------------------------------------------------

LOOKUPS = {
    # the worked example: token 20 of a 3-block table, one KV head, the 'blocks' layout
    "lookup_worked_example": (dict(token=20, table=[7, 2, 15]), 80),
    # a long table (the strip leaves entries out on both sides), 4 KV heads, vLLM's split key cache, fp16
    "lookup_long_table_vllm": (dict(token=100, table=[31, 4, 17, 8, 22, 3, 40, 11, 26, 5, 19, 33, 2, 38, 14, 29, 7, 35, 12, 0],
                                    block_size=8, head_dim=64, kv_heads=4, head=2, dtype="fp16", layout="vllm", num_blocks=41), 80),
    # the same at 56 columns: fewer strip entries, the address table wrapped, nothing cut
    "lookup_long_table_vllm_narrow": (dict(token=100, table=[31, 4, 17, 8, 22, 3, 40, 11, 26, 5, 19, 33, 2, 38, 14, 29, 7, 35, 12, 0],
                                           block_size=8, head_dim=64, kv_heads=4, head=2, dtype="fp16", layout="vllm", num_blocks=41), 56),
    # the last entry highlighted (its right neighbour is past the end), 2 KV heads, nhd, bf16
    "lookup_last_entry_nhd": (dict(token=159, table=list(range(30, 10, -2)), block_size=16, head_dim=128, kv_heads=2, head=1,
                                   dtype="bf16", layout="nhd"), 80),
}


@pytest.mark.parametrize("name", list(LOOKUPS))
def test_lookup_golden(name):
    args, width = LOOKUPS[name]
    check_golden(name, render(render_lookup(trace_token(**args)), width), width)


# -- run ---------------------------------------------------------------------------------------

def report(index, seq_len, table, block_size, rows, heads, mass, traced=None, head_rows=None, query_position=0):
    """A SequenceReport from hand-chosen figures: rows are (token, scores per head, weights per head[, mask])."""
    built = []
    for token, scores, weights, *mask in rows:
        logical, offset = divmod(token, block_size)
        built.append(Row(token, logical, offset, table[logical], table[logical] * block_size + offset, 0, scores, weights, *mask))
    shown = {r.token for r in built}
    return SequenceReport(index, seq_len, table, coverage(seq_len, table, block_size), heads, built, mass,
                          head_rows or [shown] * len(heads), traced, query_position=query_position)


def run_decode():
    """pagetrace run --tokens 38,20 --token 20 --rows 12 --table 7,2,15 --table 2,2: sequence 0 hides
    stretches of rows (one of a single row); sequence 1 maps physical block 2 twice, and shares it with 0."""
    seq0 = report(0, 38, [7, 2, 15], 16, [
        (0, [0.4021], [0.0412]), (1, [-0.1832], [0.0230]), (2, [0.0911], [0.0302]), (3, [0.6604], [0.0533]),
        (5, [0.0215], [0.0281]),
        (17, [1.2040], [0.0916]), (20, [1.5127], [0.1248]), (21, [1.9113], [0.1855]), (22, [0.8450], [0.0638]),
        (34, [-0.7310], [0.0133]), (35, [0.1201], [0.0311]), (36, [0.3385], [0.0387]), (37, [-0.2264], [0.0220]),
    ], [HeadSummary(0, 0.1855, 21, 1.2963, 3.4412)], [0.3107, 0.5281, 0.1612], traced=20)
    seq1 = report(1, 20, [2, 2], 16, [(t, [0.1 * t - 1.0], [0.05]) for t in range(20)],
                  [HeadSummary(0, 0.05, 0, 0.8120, 2.9957)], [0.8, 0.2])
    summary = [
        ("key vector norm at token 20", "2.8302 (sequence 0, KV head 0)"),
        ("max attention weight", "0.1855 at position 21 (sequence 0, head 0)"),
        ("output vector norm", "1.2963 (sequence 0, head 0)"),
        ("check", check_line(Checks(3.58e-07, 1e-05, True))),
        ("slots", "every slot the kernel read is the block table's"),
        ("backend", "interpret (Triton's interpreter) on cpu, 812.4 ms, partitions of 4096 tokens"),
    ]
    header = ("[bold]pagetrace run[/] · 2 sequence(s) · tokens 38,20 · block size 16 · head_dim 8 · 1 head(s) / 1 KV head(s) · "
              "fp32 · layout blocks · pool 16 blocks · backend [bold]interpret[/] (Triton's interpreter) on cpu")
    return render_run(header, 16, [seq0, seq1], [0], 1, 12, (0, 20), {2: 2}, [set(), {2}], summary)


def run_prefill_masked():
    """pagetrace run --tokens 40 --query-len 4 --sliding-window 16 --heads 2 --block-size 4 --rows 10 --table ...:
    two query heads with different rows, the mask column, the mask map, a block mapped twice,
    hidden blocks (one of them alone) and a check that failed."""
    table = [5, 0, 3, 5, 8, 1, 9, 6, 2, 4]
    rows = [(0, [0.1, 0.2], [0.0, 0.0], "window"), (1, [0.3, -0.1], [0.0, 0.0], "window"), (2, [0.5, 0.4], [0.0, 0.0], "window"),
            (21, [0.9, 1.1], [0.0712, 0.0830], "visible"), (25, [1.7, 0.2], [0.1441, 0.0301], "visible"),
            (26, [0.4, 2.1], [0.0494, 0.2210], "visible"), (36, [1.2, 0.6], [0.0905, 0.0482], "visible"),
            (37, [0.0, 0.0], [0.0, 0.0], "causal"), (38, [0.0, 0.0], [0.0, 0.0], "causal")]
    head_rows = [{0, 1, 2, 21, 25, 36, 37, 38}, {0, 1, 2, 21, 26, 36, 37, 38}]  # the last row hidden
    seq = report(0, 40, table, 4, rows, [HeadSummary(0, 0.1441, 25, 0.9137, 2.7781), HeadSummary(1, 0.2210, 26, 1.0402, 2.5130)],
                 [0.0, 0.0, 0.0, 0.0, 0.0, 0.1893, 0.3121, 0.2407, 0.1802, 0.0777], head_rows=head_rows, query_position=36)
    mask_rows = [(33, "·····░████"), (34, "·····░████"), (35, "······████"), (36, "······███░")]
    summary = [
        ("query", "new token 3 of 4 in sequence 0, at position 36: the tables show its scores, mask and weights"),
        ("max attention weight", "0.1441 at position 25 (sequence 0, head 0)"),
        ("check", check_line(Checks(0.0213, 1e-05, False), kernel_ran=False)),
    ]
    header = "[bold]pagetrace run[/] · 1 sequence(s) · tokens 40 · block size 4 · new tokens 4 · sliding window 16"
    return render_run(header, 4, [seq], [0, 1], 2, 6, None, {}, [{5}], summary, show_mask=True, mask_rows=mask_rows, mask_seq=0)


def run_middle_rows():
    """pagetrace run --tokens 50 --block-size 8 --heads 4 --show-heads 2 --token 12 --rows 2: the traced token is
    the heaviest ("traced + max"), rows hidden before and after; the coverage keeps the 2 heaviest
    blocks and the traced one, hiding one block before and three after."""
    table = [12, 3, 7, 0, 9, 4, 1]
    rows = [(10, [0.8812], [0.1210]), (11, [1.0391], [0.1602]), (12, [1.4470], [0.2391]), (13, [0.2218], [0.0530]), (14, [-0.0114], [0.0401])]
    heads = [HeadSummary(0, 0.4102, 3, 0.9113, 1.2), HeadSummary(1, 0.3001, 40, 0.8804, 1.4), HeadSummary(2, 0.2391, 12, 0.7770, 1.9021),
             HeadSummary(3, 0.1980, 11, 0.6502, 2.1)]  # every query head's; the table shows head 2's
    seq = report(0, 50, table, 8, rows, heads,
                 [0.0611, 0.2107, 0.3320, 0.2914, 0.0431, 0.0402, 0.0215], traced=12, head_rows=[{10, 11, 12, 13, 14}])
    summary = [("max attention weight", "0.2391 at position 12 (head 2)")]
    return render_run("[bold]pagetrace run[/] · 1 sequence(s) · tokens 50", 8, [seq], [2], 4, 2, (0, 12), {}, [set()], summary)


def run_prefill_last_query():
    """pagetrace run --tokens 6 --query-len 3 --block-size 4: the last new token sees every key, so the
    mask column holds only ticks (it keeps the width "causal" and "window" need)."""
    rows = [(t, [0.25 * t], [w], "visible") for t, w in enumerate([0.1082, 0.1341, 0.1567, 0.1702, 0.1989, 0.2319])]
    seq = report(0, 6, [2, 0], 4, rows, [HeadSummary(0, 0.2319, 5, 1.0113, 1.8)], [0.5692, 0.4308], query_position=5)
    return render_run("[bold]pagetrace run[/] · 1 sequence(s) · tokens 6 · new tokens 3", 4, [seq], [0], 1, None, None, {}, [set()], [("max attention weight", "0.2319 at position 5")],
                      show_mask=True, mask_rows=[(3, "█·"), (4, "█░"), (5, "██")], mask_seq=0)


RUNS = {"run_decode": (run_decode, 80), "run_middle_rows": (run_middle_rows, 80), "run_prefill_last_query": (run_prefill_last_query, 80), "run_decode_narrow": (run_decode, 64), "run_prefill_masked": (run_prefill_masked, 100)}


@pytest.mark.parametrize("name", list(RUNS))
def test_run_golden(name):
    build, width = RUNS[name]
    check_golden(name, render(build(), width), width)


# -- replay ------------------------------------------------------------------------------------

def replay_summary(manifest, token_weights):
    """Request a (7 tokens, one new) and b (9 tokens, one new) share blocks 3 and 5; a's token 6 traced."""
    bs = manifest.block_size
    table = [3, 5]
    refcount = {3: 2, 5: 2, 1: 1, 4: 1}
    rows = [{"token": t, "logical_block": t // bs, "offset": t % bs, "physical_block": table[t // bs],
             "slot": table[t // bs] * bs + t % bs, "refcount": refcount[table[t // bs]], "score": s, "weight": w}
            for t, (s, w) in enumerate(token_weights)]
    requests = [RequestResult("a", 1, 7, [3, 5], 5.96e-08, 1.19e-07, True), RequestResult("b", 1, 9, [3, 5, 4], 0.0, None, True)]
    mass = [sum(w for _, w in token_weights[:bs]), sum(w for _, w in token_weights[bs:])]
    return ReplaySummary("torch", manifest.dtype, 1e-05, requests, 0, len(token_weights) - 1, rows, mass, refcount, cache_read(manifest), "a")


WEIGHTS = [(0.1250, 0.0921), (-0.4410, 0.0523), (0.9031, 0.2010), (0.3362, 0.1139), (1.1208, 0.2498), (-0.0871, 0.0749), (0.6113, 0.2160)]


@pytest.mark.parametrize("name, layout, limit, width", [
    ("replay_vllm_hnd", "vllm-hnd", 40, 80),  # every row
    ("replay_cut_rows", "flashinfer", 7, 80),  # the 3 heaviest (tokens 4, 6, 2), the first and the last: "..." between
    ("replay_narrow", "vllm-cpu", 40, 66),
])
def test_replay_golden(tmp_path, name, layout, limit, width):
    manifest = read_manifest(write_bundle(tmp_path / "b", layout))
    step = type("Step", (), {"step": 3})()
    check_golden(name, render(render_replay(manifest, step, 0, replay_summary(manifest, WEIGHTS), limit), width), width)


def test_replay_large_block_ids_golden(tmp_path):
    """A real pool's block ids (tens of thousands): the slots are wider than their header, the table
    wider than its title, which still starts flush left."""
    manifest = read_manifest(write_bundle(tmp_path / "b", "vllm-hnd"))
    summary = replay_summary(manifest, WEIGHTS)
    big = {3: 31207, 5: 877, 4: 30001}
    for row in summary.rows:
        row["physical_block"] = big[row["physical_block"]]
        row["slot"] = row["physical_block"] * manifest.block_size + row["offset"]
    summary.requests = [RequestResult(r.request, r.new_tokens, r.seq_len, [big[b] for b in r.table], r.vs_contiguous, r.vs_engine, r.passed)
                        for r in summary.requests]
    summary.refcount = {big[b]: n for b, n in summary.refcount.items() if b in big}
    check_golden("replay_large_block_ids", render(render_replay(manifest, type("Step", (), {"step": 812})(), 27, summary, 40), 80), 80)


def test_replay_failed_golden(tmp_path):
    manifest = read_manifest(write_bundle(tmp_path / "b", "vllm-hnd"))
    summary = replay_summary(manifest, WEIGHTS[:5])
    summary.requests[1] = RequestResult("b", 1, 9, [3, 5, 4], 0.0314, 0.0297, False)
    check_golden("replay_failed", render(render_replay(manifest, type("Step", (), {"step": 0})(), 1, summary, 40), 80), 80)


# -- simulate ----------------------------------------------------------------------------------

SIMULATIONS = {
    # a pool small enough to preempt: the timeline, block tables after step 3, the summary, causes and waste
    "simulate_preempting": (["--requests", "30", "--num-blocks", "30", "--prompt-len", "20:80", "--output-len", "4:40",
                             "--arrival-rate", "4", "--at", "3", "--timeline-rows", "12"], 80),
    "simulate_preempting_wide": (["--requests", "30", "--num-blocks", "30", "--prompt-len", "20:80", "--output-len", "4:40",
                                  "--arrival-rate", "4", "--timeline-rows", "8"], 140),
    # a shared prefix: hits, evictions, --explain's per-request causes
    "simulate_explain": (["--requests", "12", "--num-blocks", "24", "--block-size", "8", "--shared-prefix", "24",
                          "--prompt-len", "30:60", "--output-len", "4:12", "--explain", "--timeline-rows", "0"], 80),
    # --what-if: the same workload under other settings
    "simulate_what_if": (["--requests", "16", "--num-blocks", "40", "--block-size", "8", "--shared-prefix", "16", "--prompt-len", "20:60", "--output-len", "4:12",
                          "--what-if", "num-blocks=12", "--what-if", "block-size=16", "--what-if", "prefix-caching=off",
                          "--what-if", "policy=sglang,num-blocks=60", "--timeline-rows", "0"], 100),
    # --layers: a hybrid model's KV cache groups
    "simulate_layers": (["--requests", "20", "--layers", "full:1,sliding:64:2", "--num-blocks", "600", "--timeline-rows", "0"], 80),
}


# a trace: request 0's two full blocks are evicted by request 1's prompt before request 2 asks for
# them (at steps 4 and 5); request 3, arriving with 2, hits the blocks 2 is writing; d's salt is another key
EVICTING = [{"prompt": list(range(1, 10)), "output_len": 2, "arrival": 0},
            {"prompt": list(range(100, 124)), "output_len": 2, "arrival": 4},
            {"prompt": list(range(1, 10)) + [50], "output_len": 2, "arrival": 8},
            {"prompt": list(range(1, 10)) + [60], "output_len": 2, "arrival": 8},
            {"prompt": list(range(1, 10)) + [70], "output_len": 2, "arrival": 12, "cache_salt": "tenant-b"}]
TRACES = {
    "simulate_explain_evictions": (EVICTING, ["--block-size", "4", "--num-blocks", "8", "--explain", "--timeline-rows", "0"], 80),
    # SGLang's radix cache with parallel sampling: prefix requests, block tables longer than 12 blocks (cut with "…")
    "simulate_sglang_samples": (None, ["--policy", "sglang", "--n", "2", "--requests", "3", "--block-size", "4", "--prompt-len", "40:60",
                                       "--output-len", "4:8", "--num-blocks", "200", "--at", "2", "--timeline-rows", "0"], 100),
}


@pytest.mark.parametrize("name", list(SIMULATIONS) + list(TRACES))
def test_simulate_golden(name, capsys, monkeypatch, tmp_path):
    if name in TRACES:
        lines, args, width = TRACES[name]
        if lines is not None:
            trace = tmp_path / "trace.jsonl"
            trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
            args = ["--trace", str(trace), *args]
    else:
        args, width = SIMULATIONS[name]
    shown = console(width)
    monkeypatch.setattr("pagetrace.commands.output.stdout_console", lambda: shown)
    code, out, err = cli(capsys, "simulate", *args)
    assert code == 0, err
    check_golden(name, shown.file.getvalue(), width)


def comparisons():
    stream = EventStream(batches=[object()] * 14, gaps=[(3, 4), (9, 9)], source="server.kvev")
    diverged = Comparison("hash", 41, 39, 17, False, {
        "item": 17,
        "pagetrace": {"did": "BlockRemoved", "hash": "0x5f3a0c2b91d4e7a6", "where": "step 12", "request": "c", "block": 1},
        "server": {"did": "BlockStored", "hash": "0x1b22e0f4a9c35d71", "where": "message 6, event 2"},
        "reason": "messages are missing from the server's stream here (a sequence gap)",
    }, notes=["message 2, event 0: an event of KV cache group 1; only group 0 (full attention) is simulated, such events are left out"])
    ended = Comparison("content", 8, 7, 7, False, {"item": 7, "pagetrace": {"did": "BlockStored", "hash": "(4, 'x')", "where": "step 9"},
                                                  "server": {"did": "nothing more (the server's events end here)"}})
    equal = Comparison("hash", 1234, 1234, 1234, True, None)
    return {"events_diverged": (diverged, stream), "events_ended": (ended, EventStream(batches=[object()] * 3)),
            "events_equal": (equal, EventStream(batches=[object()] * 1001))}


@pytest.mark.parametrize("name", list(comparisons()))
def test_events_comparison_golden(name):
    cmp, stream = comparisons()[name]
    check_golden(name, render(render_comparison(cmp, stream, "server.kvev"), 80), 80)
