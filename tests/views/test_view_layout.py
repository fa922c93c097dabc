"""The terminal views' layout by meaning, whatever Rich's version (tests/views/test_golden.py
compares whole renderings under the recorded major version): no table is cut at 80 columns,
numbers end under their header, titles start flush left, the highlighted entry is styled."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from conftest import cli
from pagetrace.views.text import Fitted

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
