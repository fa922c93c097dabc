"""The terminal views' layout by meaning, whatever Rich's version (tests/views/test_golden.py
compares whole renderings under the recorded major version): no table is cut at 80 columns,
numbers end under their header, titles start flush left, the highlighted entry is styled."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from conftest import cli
from test_golden import run_decode
from pagetrace.paging.lookup import trace_token
from pagetrace.views.text import HIGHLIGHT, Fitted, block_table_strip, render_lookup

RIGHT_EDGES = "┓┃┩│┘┐┤"


def plain(renderable, width: int) -> list[str]:
    c = Console(file=io.StringIO(), width=width, color_system=None, legacy_windows=False, _environ={})
    c.print(renderable)
    return c.file.getvalue().splitlines()


def test_simulate_at_80_columns_cuts_no_table(capsys, monkeypatch):
    """Every boxed line of `simulate` at 80 columns ends with its right border: the waste
    table's last column ("peak run") is whole. (Rich's own narrowing left it 83 columns wide
    and the console cut it.)"""
    shown = Console(file=io.StringIO(), width=80, color_system=None, legacy_windows=False, _environ={})
    monkeypatch.setattr("pagetrace.commands.output.stdout_console", lambda: shown)
    code, _, err = cli(capsys, "simulate", "--timeline-rows", "5", "--explain")
    assert code == 0, err
    lines = shown.file.getvalue().splitlines()
    boxed = [line.rstrip() for line in lines if line[:1] in "┏┃┡│└┌├"]
    assert boxed and all(line[-1] in RIGHT_EDGES for line in boxed), [line for line in boxed if line[-1] not in RIGHT_EDGES]
    waste = lines.index(next(line for line in lines if line.startswith("KV memory handed to requests")))
    assert "peak" in lines[waste + 2] and "run" in lines[waste + 3] and lines[waste + 5].rstrip().endswith("│")


def test_fitted_gives_each_column_its_minimum_and_the_rest_to_the_wanting():
    t = Table(title="t", title_justify="left")
    t.add_column("name", no_wrap=True)
    t.add_column("a long header", justify="right", min_width=6)
    t.add_column("another long header", justify="right", min_width=7)
    t.add_row("a-name-of-20-letters", "1.5%", "12")
    # 3 columns: borders 4, padding 6; minimums 20 + 6 + 7 = 33: fits 43 exactly, where Rich's own is cut
    fitted = plain(Fitted(t), 43)
    assert fitted[1:] == ["┏━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━┓",
                          "┃                      ┃        ┃ another ┃",
                          "┃                      ┃ a long ┃    long ┃",
                          "┃ name                 ┃ header ┃  header ┃",
                          "┡━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━┩",
                          "│ a-name-of-20-letters │   1.5% │      12 │",
                          "└──────────────────────┴────────┴─────────┘"]
    assert not plain(t, 43)[1].endswith("┓")
    # 2 columns to spare, shared: one each to the two that want more
    assert plain(Fitted(t), 45)[6] == "│ a-name-of-20-letters │    1.5% │       12 │"
    # wide enough: Rich's own table, untouched
    assert plain(Fitted(t), 80) == plain(t, 80)
    # too narrow for the minimums: Rich's own narrowing
    assert plain(Fitted(t), 42) == plain(t, 42)


def right_edges(line: str, words: list[str]) -> list[int]:
    out, start = [], 0
    for w in words:
        start = line.index(w, start) + len(w)
        out.append(start)
    return out


def test_run_numbers_end_under_their_headers_and_titles_start_flush_left():
    lines = plain(run_decode(), 80)
    title = lines.index("sequence 0: 38 tokens" + " " * (len(lines[3]) - 21))
    head = lines[title + 2]
    columns = ["token", "logical", "offset", "physical", "slot", "part", "score", "weight"]
    edges = right_edges(head, columns)
    row = lines[title + 4]  # token 0: 0 0 0 7 112 0 0.4021 0.0412
    assert right_edges(row, ["0", "0", "0", "7", "112", "0", "0.4021", "0.0412"]) == edges
    assert lines[lines.index(next(line for line in lines if line.startswith("block coverage")))].startswith("block coverage")
    assert any(line.startswith("summary") for line in lines)
    # the hidden-rows marker stands under "token", its count in the bar's column
    hidden = next(line for line in lines if "1 row hidden" in line)
    assert hidden.index("⋮") == edges[0] - 1 and hidden.index("1 row hidden") == edges[-1] + 1


def test_lookup_highlights_the_tokens_entry_only():
    c = Console(file=io.StringIO(), width=80, force_terminal=True, color_system="truecolor", legacy_windows=False, _environ={})
    segments = list(c.render(block_table_strip([7, 2, 15], 1)))
    styled = [s.text for s in segments if s.style is not None and s.style == c.get_style(HIGHLIGHT)]
    assert styled == ["2"]
    lines = plain(render_lookup(trace_token(20, [7, 2, 15])), 80)
    assert lines[0] == "token 20 · block size 16 · head_dim 8 · fp32 · pool of 16 blocks"
    strip = lines.index(next(line for line in lines if line.startswith("block table")))
    assert right_edges(lines[strip + 1], ["logical", "0", "1", "2"]) == right_edges(lines[strip + 2], ["physical", "7", "2", "15"])


LONG = [31, 4, 17, 8, 22, 3, 40, 11, 26, 5, 19, 33, 2, 38, 14, 29, 7, 35, 12, 0]


def strip_words(table, highlight, width):
    lines = plain(block_table_strip(table, highlight), width)
    assert lines[0].startswith("block table") and len(lines) == 3, lines
    assert max(len(line.rstrip()) for line in lines) <= width
    return lines[1].split(), lines[2].split()


def test_the_strip_keeps_the_entries_that_fit_the_width_exactly():
    # entry 12 highlighted: wanted first 12, 11, 13, then the ends inwards 0, 19, 1, 18, 2, ...
    # a column is its widest cell plus 2: "logical" 10, "0"/"31" 4, "1"/"4" 3, "2"/"17" 4,
    # "…"/"8 more" 8, 11..13 4 each, "…"/"4 more" 8, 18 and 19 4 each: 57 columns for 8 entries
    logical, physical = strip_words(LONG, 12, 57)
    assert logical == ["logical", "0", "1", "2", "…", "11", "12", "13", "…", "18", "19"]
    assert physical == ["physical", "31", "4", "17", "8", "more", "33", "2", "38", "4", "more", "12", "0"]
    # one column less: entry 2 goes ("9 more" then)
    logical, physical = strip_words(LONG, 12, 56)
    assert logical == ["logical", "0", "1", "…", "11", "12", "13", "…", "18", "19"]
    assert physical == ["physical", "31", "4", "9", "more", "33", "2", "38", "4", "more", "12", "0"]
    # wide: the 12 wanted entries, no more (STRIP_ENTRIES)
    logical, _ = strip_words(LONG, 12, 200)
    assert logical == ["logical", "0", "1", "2", "3", "4", "…", "11", "12", "13", "…", "16", "17", "18", "19"]
    # only the highlighted entry fits (10 + 9 + 4 + 8 = 31 columns); narrower still, it is shown all the same
    for width in (31, 30):
        assert strip_words(LONG, 12, width) == (["logical", "…", "12", "…"], ["physical", "12", "more", "2", "7", "more"]), width
    assert strip_words(LONG, 12, 35)[0] == ["logical", "…", "11", "12", "…"]  # 11 fits next to it at 35


def test_the_strip_at_the_tables_ends_and_without_a_highlight():
    # entry 0 highlighted: its left neighbour does not exist; alone it needs 10 + 4 + 9 = 23 columns
    assert strip_words(LONG, 0, 25)[0] == ["logical", "0", "…"]
    assert strip_words(LONG, 0, 26)[0] == ["logical", "0", "1", "…"]
    assert strip_words(LONG, 19, 24)[0] == ["logical", "…", "19"]
    # no highlight: the two ends inwards, nothing styled as the token's entry
    logical, _ = strip_words(LONG, None, 200)
    assert logical == ["logical", "0", "1", "2", "3", "4", "5", "…", "14", "15", "16", "17", "18", "19"]
    c = Console(file=io.StringIO(), width=200, force_terminal=True, color_system="truecolor", legacy_windows=False, _environ={})
    assert not [s for s in c.render(block_table_strip(LONG, None)) if s.style == c.get_style(HIGHLIGHT)]
    # a table of exactly 12 entries: all of them, no "more" column
    assert strip_words(LONG[:12], 5, 200)[0] == ["logical", *map(str, range(12))]
    # 13: entry 7 is the one left out (5, 4, 6, then 0, 12, 1, 11, 2, 10, 3, 9, 8)
    assert strip_words(LONG[:13], 5, 200) == (["logical", *"0 1 2 3 4 5 6 … 8 9 10 11 12".split()],
                                              ["physical", *"31 4 17 8 22 3 40 1 more 26 5 19 33 2".split()])


def test_fitted_keeps_a_columns_min_width_wider_than_its_cells_and_never_less():
    t = Table()
    t.add_column("n", min_width=5)
    t.add_column("words")
    t.add_row("1", "alpha beta gamma delta")
    # natural: 7 + 24 + 3 borders = 34; at 20 the 13 columns of content go 5 to "n" (its min_width), 8 to "words"
    assert plain(Fitted(t), 20) == ["┏━━━━━━━┳━━━━━━━━━━┓",
                                    "┃ n     ┃ words    ┃",
                                    "┡━━━━━━━╇━━━━━━━━━━┩",
                                    "│ 1     │ alpha    │",
                                    "│       │ beta     │",
                                    "│       │ gamma    │",
                                    "│       │ delta    │",
                                    "└───────┴──────────┘"]
    # at 24: 17 columns of content, 5 to "n" and 12 to "words" (which wants 22)
    assert plain(Fitted(t), 24) == ["┏━━━━━━━┳━━━━━━━━━━━━━━┓",
                                    "┃ n     ┃ words        ┃",
                                    "┡━━━━━━━╇━━━━━━━━━━━━━━┩",
                                    "│ 1     │ alpha beta   │",
                                    "│       │ gamma delta  │",
                                    "└───────┴──────────────┘"]


def test_weight_bars_at_their_limits():
    from pagetrace.views.run import weight_bar

    assert weight_bar(0.2, 0.2).plain == "████████"  # the peak: the whole bar
    assert weight_bar(0.3, 0.2).plain == "████████"  # above the peak (another head's): no longer than the bar
    assert weight_bar(0.0124, 0.2).plain == "········"  # 0.496 cells rounds to none
    assert weight_bar(0.0126, 0.2).plain == "█·······"
    assert weight_bar(-0.1, 0.2).plain == "········"
    for weight, peak in ((float("nan"), 0.5), (0.1, float("nan")), (0.1, 0.0), (float("inf"), 1.0), (0.1, -1.0)):
        assert weight_bar(weight, peak).plain == "········", (weight, peak)  # nothing to scale by: an empty bar, no error
    bar = weight_bar(0.1, 0.2, "traced + max")
    assert bar.plain == "████···· ◀ traced + max"
    assert [(bar.plain[s.start:s.end], str(s.style)) for s in bar.spans] == [(" ◀ traced + max", "bold")] and str(bar.style) == "cyan"


VLLM_TOKEN = dict(token=100, table=LONG, block_size=8, head_dim=64, kv_heads=4, head=2, dtype="fp16", layout="vllm", num_blocks=41)


def test_the_address_table_wraps_between_words_never_inside_a_number():
    from pagetrace.views.text import address_table

    for width in (80, 60, 56):  # the minimums fit from 55 columns
        lines = plain(address_table(trace_token(**VLLM_TOKEN)), width)
        words = " ".join(line.replace("│", " ").replace("┃", " ") for line in lines).split()
        for number in ("[block=41,", "head=4,", "dim/x=8,", "slot=8,", "dim%x=8]", "2×2048", "2×512", "4×8", "4×1", "5152", "5124", "10304", "10248"):
            assert number in words, (width, number, lines)
    # below 55 the minimums do not fit: the byte column is cut at the edge, but the numbers shown stay whole
    lines = plain(address_table(trace_token(**VLLM_TOKEN)), 50)
    words = " ".join(line.replace("│", " ") for line in lines).split()
    assert {"[block=41,", "dim/x=8,", "dim%x=8]", "2×2048", "5152", "5124"} <= set(words), lines
    # and the index column is narrower than its header's "index×stride": the header folds, every letter kept
    header = [line for line in lines if line.startswith("┃")]
    third = "".join(line.split("┃")[3].strip() for line in header)
    assert third == "index: Σindex×stride"
    # the memory labels stay on one line even at 30 columns
    lines = plain(address_table(trace_token(**VLLM_TOKEN)), 30)
    assert any(line.startswith(" key in memory ") for line in lines) and any(line.startswith(" value in memory ") for line in lines)


def test_a_token_at_the_start_of_block_0_is_at_offset_0():
    lines = plain(render_lookup(trace_token(0, [0, 1])), 100)
    rows = [line for line in lines if line.startswith("│ key") or line.startswith("│ value")]
    assert len(rows) == 2 and all("│ (0, 0, 0): 0 " in row for row in rows), rows


def test_explained_rows_count_evictions_by_step_and_skip_what_has_no_causes():
    from types import SimpleNamespace

    from pagetrace.views.sim import render_explained

    causes = {"hit": 16, "partial block": 3, "evicted": 32, "different extra key": 0, "first seen": 0}
    requests = [SimpleNamespace(request_id="r7", prompt_len=51), SimpleNamespace(request_id="prefix-0", prompt_len=40)]
    docs = [{"prompt_tokens_by_cause": causes,
             "evicted_blocks": [{"step": 12, "by": "r3"}, {"step": 12, "by": "r3"}, {"step": 15, "by": "r5"}, {"step": None, "by": None}],
             "hit_while_written": [{"by": "r2"}, {"by": "r2"}, {"by": "r4"}], "recomputed_hit_tokens": 16},
            {"prompt_tokens_by_cause": None}]  # no causes (a prefix request): no row
    lines = plain(render_explained(requests, docs), 250)
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 1
    cells = [c.strip() for c in rows[0].strip("│").split("│")]
    assert cells == ["r7", "51", "16", "3", "32", "0", "0",
                     "evicted at step 12 by r3 (x2); evicted at step 15 by r5; hit while written by r2, r4; 16 tokens hit again after preemption"]


def test_replays_diagram_view_carries_the_traced_requests_mass_and_token(tmp_path):
    from bundles import write_bundle
    from test_golden import WEIGHTS, replay_summary

    from pagetrace.engines.bundle import read_manifest, read_step
    from pagetrace.views.replay import mapping_view

    folder = write_bundle(tmp_path / "b", "vllm-hnd")  # step 0: a has 11 tokens in [3, 5, 1], b 10 in [3, 5, 4]
    manifest = read_manifest(folder)
    step = read_step(folder, manifest, 0)
    for traced in (0, 1):
        summary = replay_summary(manifest, WEIGHTS)
        summary.traced_request, summary.traced_token = traced, 6
        view = mapping_view(manifest, step, summary)
        assert (view.block_size, view.num_blocks, view.highlight) == (4, manifest.num_blocks, (traced, 6))
        assert [(s.name, s.seq_len, s.table) for s in view.sequences] == [("req a", 11, [3, 5, 1]), ("req b", 10, [3, 5, 4])]
        assert [s.attention_mass for s in view.sequences] == [summary.block_mass if r == traced else None for r in (0, 1)]


def test_spread_and_the_story_at_their_boundaries():
    from test_narrow_output import step

    from pagetrace.views.sim import _spread, pick_steps

    five = [step(i) for i in range(5)]
    assert _spread(five, 0) == [] and _spread([], 3) == []
    assert _spread(five, 1) == [five[2]]  # the middle one
    assert _spread(five, 2) == [five[0], five[4]] and _spread(five, 3) == [five[0], five[2], five[4]]
    assert _spread(five, 5) == five and _spread(five, 9) == five
    # exactly as many steps with events as rows: all of them, said so
    steps = [step(i, admitted=[str(i)]) for i in range(8)]
    assert pick_steps(steps, 8) == (steps, "every step with an event")
    # fewer rows than anchors: the first ones only, named so
    steps = [step(0, admitted=["a"]), step(1, hit_tokens=16, admitted=["b"]), step(2, evicted=1, admitted=["c"]),
             step(3, preempted=["a"], admitted=["d"]), step(4, finished=["b"])]
    shown, how = pick_steps(steps, 2)
    assert [s.step for s in shown] == [0, 1]
    assert how == "the first admission, the first prefix hit; the other steps with events spread evenly"
    # no preemption left to spread once the anchors are in: not said
    shown, how = pick_steps(steps, 4)
    assert [s.step for s in shown] == [0, 1, 2, 3] and "preemptions spread" not in how


def test_block_tables_cut_past_12_blocks():
    from pagetrace.views.sim import block_tables

    lines = plain(block_tables(9, {"a": list(range(100, 112)), "b": list(range(200, 213))}), 120)
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    assert lines[0].startswith("Block tables after step 9")
    assert rows == [["a", ", ".join(map(str, range(100, 112)))],
                    ["b", "200, 201, 202, 203, 204, 205, 206, 207, 208, …, 211, 212  (13 blocks)"]]


def test_what_if_keeps_the_settings_whole_when_the_table_is_too_wide():
    from types import SimpleNamespace

    from pagetrace.views.sim import render_what_if

    setting = SimpleNamespace(num_blocks=62)  # 61 usable: 60 of them is 98%
    outcomes = [SimpleNamespace(label=label, setting=setting, hit_rate=0.264, peak_used=60, mean_used_share=0.59, preemptions=1234,
                                steps=25, evictions=54) for label in ("as given", "num-blocks=60,policy=sglang")]
    for width in (80, 60, 36):  # at 36 the numbers are cut at the edge; the label, up to 40 characters, still whole
        lines = plain(render_what_if(outcomes), width)
        assert any("│ num-blocks=60,policy=sglang │" in line for line in lines), (width, lines)
    lines = plain(render_what_if(outcomes), 120)
    row = next(line for line in lines if "as given" in line)
    assert [c.strip() for c in row.strip("│").split("│")] == ["as given", "26.4%", "98%", "59%", "1,234", "25", "54"]


def test_explained_ids_stay_whole():
    from types import SimpleNamespace

    from pagetrace.views.sim import render_explained

    causes = {"hit": 16, "partial block": 3, "evicted": 0, "different extra key": 0, "first seen": 32}
    requests = [SimpleNamespace(request_id="prefix-0", prompt_len=40), SimpleNamespace(request_id="chatcmpl-7f3e2b1c9a", prompt_len=51)]
    docs = [{"prompt_tokens_by_cause": None}, {"prompt_tokens_by_cause": causes}]  # a row without causes first: the next still shows
    for width in (80, 50):
        lines = plain(render_explained(requests, docs), width)
        assert any(line.startswith("│ chatcmpl-7f3e2b1c9a │") for line in lines), (width, lines)


def test_a_timeline_of_one_row_and_the_metric_without_admissions(capsys, monkeypatch):
    from pagetrace.views.sim import render_metric

    shown = Console(file=io.StringIO(), width=100, color_system=None, legacy_windows=False, _environ={})
    monkeypatch.setattr("pagetrace.commands.output.stdout_console", lambda: shown)
    code, _, err = cli(capsys, "simulate", "--requests", "4", "--timeline-rows", "1")
    assert code == 0, err
    lines = shown.file.getvalue().splitlines()
    assert lines[0].startswith("Step timeline: 1 of ") and sum(line.startswith("│") for line in lines[:lines.index(next(
        line for line in lines if line.startswith("ran: ")))]) == 1
    assert render_metric({"queries": 0, "hits": 0, "preempted_queries": 0, "preempted_hits": 0}) == "vLLM's prefix-cache metric: no request admitted"
