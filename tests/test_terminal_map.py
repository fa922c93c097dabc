"""The terminal map and the diagram's labels, read as a person reads them.

Each test asserts what is printed or drawn (the physical row, the one highlighted block,
each pool cell's counts), against numbers written here or counted by brute force over
the tables, never against the cells model itself.
"""

from __future__ import annotations

import random
import re

import pytest
from rich.console import Console
from rich.style import Style

from pagetrace.views import diagram as dg
from pagetrace.views.diagram import MappingView, SequenceMap
from pagetrace.views.text import HIGHLIGHT


def worked_view() -> MappingView:
    return MappingView(16, 16, [SequenceMap("seq 0", 38, [7, 2, 15])], highlight=(0, 20))


def lines(view: MappingView, width: int = 120) -> list[list[tuple[str, Style | None]]]:
    """The terminal map as lines of (text, style) segments."""
    console = Console(width=width, color_system="truecolor", file=None, record=False)
    return [[(seg.text, seg.style) for seg in line] for line in console.render_lines(dg.terminal_mapping(view), pad=False)]


def text_of(line) -> str:
    return "".join(text for text, _ in line)


def highlighted(line) -> list[str]:
    target = Style.parse(HIGHLIGHT)
    return [text.strip() for text, style in line if style is not None and text.strip() and style + target == style and style.bgcolor == target.bgcolor]


def rows(view: MappingView, name: str, width: int = 120) -> list[list[str]]:
    return [text_of(line).split()[1:] for line in lines(view, width) if text_of(line).split()[:1] == [name]]


def test_the_worked_example_reads_7_2_15():
    assert rows(worked_view(), "physical") == [["7", "2", "15"]]
    assert rows(worked_view(), "logical") == [["0", "1", "2"]]
    assert rows(worked_view(), "tokens") == [["0-15", "16-31", "32-37", "(6/16)"]]


def test_exactly_one_block_is_highlighted():
    """Token 20 is in logical block 1, physical block 2: one column and one pool character."""
    out = lines(worked_view())
    marked = [(text_of(line).split()[0], highlighted(line)) for line in out if highlighted(line)]
    assert marked[:3] == [("logical", ["1"]), ("physical", ["2"]), ("tokens", ["16-31"])]
    pool = [line for line in out if re.match(r"\s+0 ", text_of(line))]
    assert len(pool) == 1 and highlighted(pool[0]) == ["■"]
    assert text_of(pool[0]).index("■", text_of(pool[0]).index("0 ") + 2) == text_of(pool[0]).index("0 ") + 2 + 2  # block 2
    assert len(marked) == 4


def scattered_view(rng: random.Random, pool: tuple[int, int], most: int, blocks: tuple[int, int], block_size: int) -> MappingView:
    """1..`most` full sequences of `blocks` blocks each, drawn at random from a pool of `pool` blocks."""
    nb = rng.randint(*pool)
    tables = [rng.sample(range(nb), rng.randint(*blocks)) for _ in range(rng.randint(1, most))]
    return MappingView(block_size, nb, [SequenceMap(f"seq {s}", block_size * len(t), t) for s, t in enumerate(tables)])


@pytest.mark.parametrize("seed", range(6))
def test_every_pool_character_matches_a_brute_force_count(seed):
    """In a big pool each character stands for a bucket of blocks: empty, some, half or all used."""
    view = scattered_view(random.Random(seed), (300, 3000), 4, (1, 200), block_size=4)
    nb, tables = view.num_blocks, [seq.table for seq in view.sequences]
    owners: dict[int, set[int]] = {}
    for s, t in enumerate(tables):
        for p in t:
            owners.setdefault(p, set()).add(s)
    bucket = -(-nb // dg.POOL_STRIP_BLOCKS)
    expected = []
    for start in range(0, nb, bucket):
        blocks = min(start + bucket, nb) - start
        n = sum(1 for b in range(start, start + blocks) if b in owners)
        if blocks == 1 and n == 1:
            expected.append("■" if len(owners[start]) == 1 else str(len(owners[start])))
        else:
            expected.append("·" if n == 0 else "█" if n == blocks else "▓" if 2 * n >= blocks else "░")
    pool = [text_of(line) for line in lines(view) if re.match(r"\s*\d+ [·█▓░]", text_of(line))]
    assert "".join(line.split()[1] for line in pool) == "".join(expected)


def test_wide_tables_wrap_whole_cells_at_80_columns():
    """Six-digit blocks at 80 columns: every number is printed whole, no line is wider."""
    table = [100_001 + 7 * i for i in range(14)]
    view = MappingView(16, 100_093, [SequenceMap("seq 0", 16 * 14, table)], highlight=(0, 100))
    out = [text_of(line) for line in lines(view, width=80)]
    assert all(len(line) <= 80 for line in out)
    physical = [n for row in rows(view, "physical", 80) for n in row]
    assert len(rows(view, "physical", 80)) >= 2  # wrapped
    drawn = [n for n in physical if n != "…"]
    assert drawn and all(int(n) in table for n in drawn)
    assert drawn[:7] == [str(p) for p in table[:7]] and drawn[-2:] == [str(p) for p in table[-2:]]


def test_many_sequences_are_summed_up():
    """10,000 sequences: the traced, the largest and the sharing ones drawn, the rest in one line."""
    rng = random.Random(0)
    prompt = [0, 1]
    sequences = []
    nb = 40_000
    free = iter(rng.sample(range(2, nb), 30_000))
    for s in range(10_000):
        n = 1 + (s % 3)
        table = (prompt if s in (5, 9) else []) + [next(free) for _ in range(n)]
        sequences.append(SequenceMap(f"seq {s}", 16 * len(table) - (s == 7777), table))
    sequences[4321].table += [next(free) for _ in range(5)]
    sequences[4321].seq_len = 16 * len(sequences[4321].table)
    view = MappingView(16, nb, sequences, highlight=(7777, 3))
    cells = dg.layout_cells(view)
    assert {5, 9, 4321, 7777} <= set(cells.drawn) and len(cells.drawn) == dg.MAX_SEQUENCES
    hidden = [s for s in range(10_000) if s not in cells.drawn]
    assert cells.hidden.count == len(hidden) and cells.hidden.tokens == sum(sequences[s].seq_len for s in hidden)
    assert cells.hidden.blocks == sum(-(-sequences[s].seq_len // 16) for s in hidden) and cells.hidden.shared == 0
    text = "\n".join(text_of(line) for line in lines(view))
    assert f"… {len(hidden)} more sequences · {cells.hidden.tokens} tokens in {cells.hidden.blocks} blocks" in text
    source = dg.dot_source(view)
    assert f"{len(hidden)} more sequences" in source and source.count("_table") == dg.MAX_SEQUENCES + 3  # + others, pool, legend


# -- the same, in the diagram's labels ---------------------------------------------------


def labels(source: str, prefix: str) -> dict[str, str]:
    """port -> the cell's text (tags dropped) for every cell whose port starts with `prefix`."""
    out = {}
    for port, body in re.findall(r'<td[^>]* port="([^"]+)"[^>]*>(.*?)</td>', source):
        if port.startswith(prefix):
            out[port] = re.sub(r"<[^>]+>", " ", body)
    return out


def test_the_worked_example_diagram_reads_7_2_15():
    source = dg.dot_source(worked_view())
    arrows = re.findall(r'seq0:(l\d+):e -> pool:p(\d+):w', source)
    assert arrows == [("l0", "7"), ("l1", "2"), ("l2", "15")]
    traced = re.findall(r'<td[^>]* port="([^"]+)"[^>]* border="3"[^>]* color="#d62728"', source)
    assert traced == ["l1", "p2"]  # one logical cell and one pool cell: the traced block


@pytest.mark.parametrize("seed", range(6))
def test_every_summed_up_pool_cell_says_its_counts(seed):
    """A big scattered pool: every "N used, M free" caption against a brute-force count."""
    view = scattered_view(random.Random(seed), (2_000, 20_000), 3, (50, 400), block_size=16)
    tables = [seq.table for seq in view.sequences]
    used = {p for t in tables for p in t}
    pool = labels(dg.dot_source(view), "p")
    mixed = 0
    for port, text in pool.items():
        first, _, last = port[1:].partition("_")
        first, last = int(first), int(last or first)
        n = sum(1 for b in range(first, last + 1) if b in used)
        if m := re.search(r"(\d+) used, (\d+) free", text):
            mixed += 1
            assert (int(m.group(1)), int(m.group(2))) == (n, last - first + 1 - n), (port, text)
        elif "free" in text:
            assert n == 0, (port, text)
        else:
            assert n == last - first + 1, (port, text)
    assert mixed > 0


def runs_view() -> MappingView:
    """Runs of consecutive blocks in a big pool: each run is one cell, in both renderings."""
    table = [*range(100, 106), 7, *range(300, 310), 40]
    return MappingView(16, 5000, [SequenceMap("seq 0", 16 * len(table) - 3, table)], highlight=(0, 16 * 6 + 2))


def test_each_run_reads_its_first_and_last_physical_block():
    view = runs_view()
    table = view.sequences[0].table
    [logical] = rows(view, "logical")
    [physical] = rows(view, "physical")
    assert physical == ["100-105", "7", "300-309", "40"]
    for lg, ph in zip(logical, physical):
        a, _, b = lg.partition("-")
        assert ph == (f"{table[int(a)]}-{table[int(b)]}" if b else str(table[int(a)]))
    source = dg.dot_source(view)
    logical_labels = labels(source, "l")
    assert sorted(logical_labels) == ["l0_5", "l17", "l6", "l7_16"]
    assert "-&gt; blocks 100-105" in logical_labels["l0_5"] or "-> blocks 100-105" in logical_labels["l0_5"]
    assert re.search(r"-(&gt;|>) blocks 300-308\b", logical_labels["l7_16"]) is None
    assert re.search(r"-(&gt;|>) blocks 300-309\b", logical_labels["l7_16"])
