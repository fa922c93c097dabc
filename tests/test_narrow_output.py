"""What a user sees in an 80-column pipe: headers and option names whole, never cut to "…";
and simulate's default timeline tells the whole run's story, saying how rows were chosen."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.views.sim import pick_steps
from pagetrace.sim.scheduler import StepRecord

NARROW = {"COLUMNS": "80", "TERM": "dumb"}


def narrow(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), env=NARROW)
    assert result.exit_code in (0, 1), result.output
    return result.stdout


@pytest.mark.parametrize("args", [
    ["simulate"], ["simulate", "--shared-prefix", "64", "--requests", "60"], ["capacity", "--memory", "80GB"],
    ["lookup", "--layout", "vllm-cpu-amx", "--block-size", "32", "--head-dim", "32", "--kv-heads", "2", "--dtype", "bf16"],
    ["where", "--slot", "36", "--table", "7,2,15"], ["layouts"],
])
def test_no_word_is_cut_at_80_columns(args):
    out = narrow(*args)
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_replay_and_check_headers_are_whole_at_80_columns(tmp_path):
    from test_engines import write_bundle

    path = write_bundle(tmp_path / "b", "vllm-cpu")
    replay, check = (narrow(*args) for args in (["replay", str(path), "--backend", "torch"], ["check", str(path)]))
    assert "…" not in replay + check, replay + check
    assert "vs contiguous" in replay and "vs engine" in replay


def step(n: int, **events) -> StepRecord:
    fields = dict(scheduled=1, tokens=1, allocated=0, hit_tokens=0, evicted=0, preempted=[], admitted=[], finished=[],
                  free_blocks=10, used_blocks=1, waiting=0, running=1, empty_slots=0)
    fields.update(events)
    return StepRecord(n, **fields)


def test_the_story_keeps_firsts_and_the_end_and_spreads_the_rest():
    # 100 steps: admissions at 0..9, a hit at 5, evictions from 40, preemptions at 60..99 (40 of them), the end at 99
    steps = [step(i, admitted=[str(i)] if i < 10 else [], hit_tokens=16 if i == 5 else 0, evicted=1 if i >= 40 else 0,
                  preempted=[f"p{i}"] if i >= 60 else [], finished=[str(i)] if i == 99 else []) for i in range(100)]
    shown, how = pick_steps(steps, 12)
    numbers = [s.step for s in shown]
    assert len(shown) == 12 and numbers == sorted(numbers)
    assert {0, 5, 40, 60, 99} <= set(numbers)  # first admission, first hit, first eviction, first preemption, the end
    assert how.startswith("the first admission, the first prefix hit, the first eviction, the first preemption, the last step")
    assert any(s.step < 40 and s.admitted for s in shown[1:])  # not only preemptions: the early admissions show
    # spread over the whole run (steps 10..39 have no event at all): early, middle and late rows
    assert sum(n < 10 for n in numbers) >= 2 and sum(40 <= n < 60 for n in numbers) >= 2 and sum(n >= 60 for n in numbers) >= 3
    # everything fits: every step with an event, said so
    few, how = pick_steps(steps[:8], 30)
    assert [s.step for s in few] == list(range(8)) and how == "every step with an event"


def test_default_simulate_timeline_spans_the_run_and_admits():
    import re

    out = narrow("simulate")
    total = int(re.search(r"Step timeline: 30 of (\d+) steps \(the first admission", out).group(1))
    table = out[: out.index("ran: requests run")]
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == 30 and rows[0][0] == "0" and rows[-1][0] == str(total - 1)
    assert sum(1 for r in rows if r[3]) >= 3  # admissions show, not only preemptions
    assert int(rows[-1][0]) - int(rows[-2][0]) < total // 3
