"""`pagetrace simulate`'s terminal view, cell by cell, against the JSON document of the same
run: every timeline row shown (its step's record, names cut at four with "+N", preemptions),
the block tables asked for, the summary's rows, the hit causes with their shares and the waste
table's shares. The pool is small enough that requests are preempted."""

from __future__ import annotations

import json

import pytest

from conftest import cli

ARGS = ["simulate", "--requests", "30", "--num-blocks", "30", "--prompt-len", "20:80", "--output-len", "4:40",
        "--arrival-rate", "4", "--at", "3"]


def rows(out: str, title: str) -> list[list[str]]:
    """The body rows of the table whose title starts with `title`, as stripped cells."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    body = []
    for line in lines[start + 1:]:
        if line.startswith(("└", "╰")):
            break
        if line.startswith("│"):
            body.append([c.strip() for c in line.strip("│").split("│")])
    return body


def names(ids, limit=4):
    return ", ".join(ids[:limit]) + (f" +{len(ids) - limit}" if len(ids) > limit else "")


@pytest.fixture
def run(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = cli(capsys, *ARGS, "--json")
    assert code == 0, err
    doc = json.loads(out)
    code, out, err = cli(capsys, *ARGS)
    assert code == 0, err
    return doc, out


def test_every_timeline_row_is_its_steps_record(run):
    doc, out = run
    steps = {s["step"]: s for s in doc["steps"]}
    shown = rows(out, "Step timeline")
    assert out.splitlines()[0].startswith(f"Step timeline: {len(shown)} of {doc['summary']['steps']} steps (")
    assert any(s["preempted"] for s in doc["steps"]), "the workload must preempt"
    for cells in shown:
        s = steps[int(cells[0])]
        assert cells == [str(s["step"]), str(s["scheduled"]), str(s["tokens"]), names(s["admitted"]), str(s["hit_tokens"]),
                         str(s["allocated"]), str(s["evicted"]), names(s["preempted"]), names(s["finished"]), str(s["free_blocks"])]
    assert any(cells[7] for cells in shown)  # a preemption is on the timeline


def test_the_block_tables_summary_causes_and_waste_are_the_documents(run):
    doc, out = run
    tables = doc["tables_at"]["3"]
    assert rows(out, "Block tables after step 3") == [[rid, ", ".join(map(str, b))] for rid, b in tables.items()]
    s = doc["summary"]
    assert rows(out, "Summary") == [
        ["KV cache", "vLLM (paged), vLLM's scheduler"],
        ["requests", f"{s['requests']:,}"],
        ["steps", f"{s['steps']:,}"],
        ["peak blocks in use", f"{s['peak_used_blocks']:,} of {s['usable_blocks']:,}"],
        ["peak running requests", f"{s['peak_running']:,}"],
        ["preemptions", f"{s['preemptions']:,} ({s['preempted_requests']:,} requests recomputed)"],
        ["cached blocks evicted", f"{s['evictions']:,}"],
    ]
    assert s["preemptions"] > s["preempted_requests"] > 0  # one request preempted twice: the two counts differ
    causes = rows(out, "Prompt tokens by prefix-cache outcome")
    total = s["prompt_tokens"]
    assert causes == [[cause, f"{n:,}", f"{n / total:.1%}"] for cause, n in s["prompt_tokens_by_cause"].items()]
    assert sum(int(c[1].replace(",", "")) for c in causes) == total
    assert f"(hit rate {s['hit_rate']:.1%})" in out
    waste = rows(out, "KV memory handed to requests, by use")
    assert waste == [[w["system"], *(f"{v:.1%}" for v in w["shares"].values()), str(w["steps"]), str(w["peak_running"])]
                     for w in s["waste"]]
    assert [w[0] for w in waste] == ["vLLM (paged)", "Orca (Max)", "Orca (Pow2)", "Orca (Oracle)"]


def test_names_are_cut_at_four():
    from pagetrace.views.sim import _names

    assert _names(["a", "b", "c", "d"]) == "a, b, c, d"
    assert _names(["a", "b", "c", "d", "e", "f"]) == "a, b, c, d +2"
    assert _names([]) == ""
