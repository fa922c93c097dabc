"""`pagetrace replay`'s terminal view, cell by cell, against the JSON document of the same replay:
the header's words, each request's row (its new tokens, seq_len, block table with shared
blocks' reference counts, both differences, the verdict), the traced token's rows, the cut
of a long table (the heaviest rows, the first and the last, "..." between) and the verdict."""

from __future__ import annotations

import json

import pytest

from bundles import write_bundle
from conftest import cli

ARGS = ["--request", "a", "--token", "5", "--backend", "torch"]


@pytest.fixture
def replayed(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = write_bundle(tmp_path / "b", "vllm-hnd")
    code, out, _ = cli(capsys, "replay", str(path), *ARGS, "--json")
    assert code == 0
    return path, json.loads(out)


def words(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines()]


def test_replay_text_is_the_json_cell_by_cell(replayed, capsys):
    path, doc = replayed
    code, out, err = cli(capsys, "replay", str(path), *ARGS)
    assert code == 0 and err == "", err
    lines = words(out)
    assert out.splitlines()[0] == "hand 0 step 0 layer 0 · layout vllm-hnd · block size 4 · fp32 · backend torch (no kernel ran)"
    assert out.splitlines()[1] == f"cache read: {doc['cache_read']}"
    # --backend torch: no kernel ran, and the view says so, never "kernel" (the JSON says which ran)
    assert doc["backend"] == "torch" and doc["kernel_ran"] is False and doc["compared"] == "torch path = contiguous attention = engine output"
    assert lines[2] == ["requests"]
    assert lines[3] == ["request", "new", "seq_len", "block", "table", "vs", "contiguous", "vs", "engine"]
    refs = {int(b): n for b, n in doc["shared_blocks"].items()}
    for row, r in zip(lines[4:6], doc["requests"]):
        table = ",".join(f"{b}(x{refs[b]})" if b in refs else str(b) for b in r["block_table"])
        assert row == [r["request"], str(r["new_tokens"]), str(r["seq_len"]), table,
                       f"{r['max_diff_contiguous']:.2e}", f"{r['max_diff_engine']:.2e}", "equal"]
    assert lines[4][3] == "3(x2),5(x2),1" and lines[5][3] == "3(x2),5(x2),4"
    caption = " ".join(" ".join(w) for w in lines[6:8])
    assert caption == "vs contiguous, vs engine: the largest |torch path - contiguous attention| and |torch path - the engine's output|"
    assert out.splitlines()[8].strip() == "request a, token 5: what it read (weights: mean over heads)"
    assert lines[9] == ["token", "logical", "offset", "physical", "slot", "ref", "score", "weight"]
    tokens = doc["traced"]["tokens"]
    assert len(tokens) == 6
    for row, t in zip(lines[10:16], tokens):
        assert row == [str(t[k]) for k in ("token", "logical_block", "offset", "physical_block", "slot", "refcount")] + [
            f"{t['score']:.4f}", f"{t['weight']:.4f}"]
    assert out.splitlines()[16] == f"passed: torch path = contiguous attention = engine output (tolerance {doc['tolerance']:g} x (1 + |x|))"
    assert len(lines) == 17


def test_a_long_token_table_keeps_the_heaviest_the_first_and_the_last(replayed, capsys, monkeypatch):
    """A limit of 6 rows: the 2 heaviest (tokens 2 and 0), the first (0) and the last (5),
    with "..." for each gap."""
    import pagetrace.commands.replay as command

    path, doc = replayed
    weights = [t["weight"] for t in doc["traced"]["tokens"]]
    assert sorted(range(6), key=lambda t: -weights[t])[:2] == [2, 0]
    monkeypatch.setattr(command, "ROWS", 6)
    code, out, _ = cli(capsys, "replay", str(path), *ARGS)
    assert code == 0
    lines = words(out)
    start = lines.index(["token", "logical", "offset", "physical", "slot", "ref", "score", "weight"]) + 1
    assert [row[0] for row in lines[start:start + 5]] == ["0", "...", "2", "...", "5"]
    assert lines[start + 1] == ["..."] and lines[start + 5][0] == "passed:"


def test_a_replay_that_differs_says_so_per_request_and_at_the_end(replayed, capsys):
    """The bundle's buffer read in another layout of the same raw shape: every request differs."""
    path, _ = replayed
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["kv_cache"]["layout"] = "vllm-cpu"
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = cli(capsys, "replay", str(path), *ARGS)
    assert code == 1
    lines = words(out)
    assert [row[-1] for row in lines[4:6]] == ["DIFFERS", "DIFFERS"]
    assert out.splitlines()[-1] == "failed: replay differs beyond 1e-05 x (1 + |x|)"


def spans(line: str) -> list[tuple[int, int]]:
    import re

    return [m.span() for m in re.finditer(r"\S+", line)]


def test_replay_tables_are_aligned_flush_left_numbers_right(replayed, capsys):
    """Titles and captions start at column 0 (no padding at the edge); in the token table every
    number ends under the end of its column's header; in the request table the names and block
    tables start under their headers, the counts end under theirs."""
    path, _ = replayed
    code, out, _ = cli(capsys, "replay", str(path), *ARGS)
    lines = out.splitlines()
    assert lines[2].startswith("requests") and lines[6].startswith("vs contiguous") and lines[8].startswith("request a, token 5")
    assert lines[3].startswith("request ") and lines[4].startswith("a ") and lines[10].startswith(" ")
    head = spans(lines[9])
    for line in lines[10:16]:
        assert [end for _, end in spans(line)] == [end for _, end in head], line
    h = {word: span for word, span in zip(lines[3].split(), spans(lines[3]))}
    for line in lines[4:6]:
        cells = spans(line)
        assert cells[0][0] == h["request"][0] and cells[3][0] == h["block"][0]  # left
        assert cells[1][1] == h["new"][1] and cells[2][1] == h["seq_len"][1]  # right
        assert cells[4][1] == h["contiguous"][1] and cells[5][1] == lines[3].index("vs engine") + len("vs engine")
