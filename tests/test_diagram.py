"""Block-mapping diagrams: the cells a table implies, the DOT, the SVG graphviz-pure renders,
atomic files, the CLI's errors, and the committed examples."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import random
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pagetrace.views import diagram as dg
from pagetrace import files
from pagetrace.views.diagram import engines
from pagetrace.cli import run_cli
from pagetrace.views.diagram import MappingView, SequenceMap
from pagetrace.errors import RuntimeFailure, UsageError

ROOT = Path(__file__).resolve().parents[1]
SVG_NS = "{http://www.w3.org/2000/svg}"
XLINK_TITLE = "{http://www.w3.org/1999/xlink}title"


def worked_view(**kw) -> MappingView:
    return MappingView(16, 16, [SequenceMap("seq 0", 38, [7, 2, 15])], highlight=(0, 20), **kw)


def shared_view() -> MappingView:
    # blocks 3 and 9 are a prompt all three sequences share; block 5 is shared by two
    return MappingView(
        16, 24,
        [SequenceMap("seq 0", 40, [3, 9, 1]), SequenceMap("seq 1", 48, [3, 9, 5]), SequenceMap("seq 2", 50, [3, 9, 5, 12])],
        highlight=(1, 20),
    )


def big_view(shuffled: bool = True) -> MappingView:
    """The bench's big case: 4,096 blocks, 8 sequences of 32,768 tokens sharing a 1,792-block prefix."""
    return load_script("bench", "bench_diagram").big_case(fragmented=shuffled)


def load_script(folder: str, name: str):
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def engine():
    found = dg.graphviz_pure_engine()
    assert found is not None, "graphviz-pure (a dependency of pagetrace) is not installed in this environment"
    return found


class Svg:
    """A rendered SVG, parsed: Graphviz nodes, edges and HTML-label cells by id."""

    def __init__(self, data: bytes):
        self.root = ET.fromstring(data)
        self.by_id = {g.get("id"): g for g in self.root.iter(f"{SVG_NS}g") if g.get("id")}

    def ids(self, cls: str) -> set[str]:
        return {g.get("id") for g in self.root.iter(f"{SVG_NS}g") if cls in (g.get("class") or "").split()}

    def cell(self, cell_id: str) -> ET.Element:
        return self.by_id[f"a_{cell_id}"]

    def texts(self, cell_id: str) -> list[str]:
        return ["".join(t.itertext()).replace("\xa0", " ").strip() for t in self.cell(cell_id).iter(f"{SVG_NS}text")]

    def tooltip(self, cell_id: str) -> str:
        return next(self.cell(cell_id).iter(f"{SVG_NS}a")).get(XLINK_TITLE)

    def fills(self, cell_id: str) -> list[str]:
        return [p.get("fill") for p in self.cell(cell_id).iter(f"{SVG_NS}polygon")]

    def strokes(self, cell_id: str) -> list[tuple[str, str | None]]:
        return [(p.get("stroke"), p.get("stroke-width")) for p in self.cell(cell_id).iter(f"{SVG_NS}polygon")]

    def box(self, cell_id: str) -> tuple[float, float, float, float]:
        """x0, x1, y0, y1 of the cell's first polygon."""
        poly = next(self.cell(cell_id).iter(f"{SVG_NS}polygon"))
        pts = [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        return min(xs), max(xs), min(ys), max(ys)

    def arrow_tip(self, edge_id: str) -> tuple[float, float]:
        poly = next(self.by_id[edge_id].iter(f"{SVG_NS}polygon"))
        pts = [tuple(map(float, p.split(","))) for p in poly.get("points").split()]
        return max(pts)  # edges run left to right: the tip has the largest x

    def lands_in(self, edge_id: str, cell_id: str) -> bool:
        x, y = self.arrow_tip(edge_id)
        x0, x1, y0, y1 = self.box(cell_id)
        return abs(x - x0) < 8 and y0 <= y <= y1


def render_svg(view: MappingView, engine) -> Svg:
    return Svg(dg.render(dg.dot_source(view), "svg", engine))


# -- the cells a table implies ------------------------------------------------------


def test_worked_example_cells():
    cells = dg.layout_cells(worked_view())
    seq = cells.sequences[0]
    assert [(c.first, c.last, c.physical) for c in seq] == [(0, 0, 7), (1, 1, 2), (2, 2, 15)]
    assert [(c.first_token, c.last_token, c.fill) for c in seq] == [(0, 15, 16), (16, 31, 16), (32, 37, 6)]
    assert [c.traced for c in seq] == [False, True, False]
    assert [(c.first, c.last) for c in cells.pool] == [(b, b) for b in range(16)]
    kinds = {c.first: c.kind for c in cells.pool}
    assert {b for b, k in kinds.items() if k == "used"} == {2, 7, 15}
    assert {b for b, k in kinds.items() if k == "free"} == set(range(16)) - {2, 7, 15}
    by_block = {c.first: c for c in cells.pool}
    assert by_block[2].traced_slot == 4 and by_block[7].traced_slot is None
    assert (by_block[7].fill, by_block[15].fill) == (16, 6)
    assert [(c.port, p.port) for c, p in cells.edges] == [("l0", "p7"), ("l1", "p2"), ("l2", "p15")]
    assert cells.slots and (cells.used_blocks, cells.shared_blocks) == (3, 0)


def test_shared_blocks_get_their_ref_count():
    cells = dg.layout_cells(shared_view())
    by_block = {c.first: c for c in cells.pool}
    assert by_block[3].owners == (0, 1, 2) and by_block[3].kind == "shared"
    assert by_block[9].owners == (0, 1, 2)
    assert by_block[5].owners == (1, 2)
    assert by_block[1].kind == "used" and by_block[0].kind == "free"
    assert cells.shared_blocks == 3
    # the fullest user decides a shared block's fill: seq 2 fills block 5, seq 1 only 16 of it
    assert by_block[5].fill == 16 and by_block[12].fill == 2


def test_big_pool_collapses_runs_and_stays_small():
    view = big_view(shuffled=False)
    cells = dg.layout_cells(view)
    for s, seq in enumerate(cells.sequences):
        # unshuffled: the prefix and the private run are one cell each, the last block its own
        if s != 3:
            assert [(c.first, c.last) for c in seq] == [(0, 1791), (1792, 2046), (2047, 2047)]
    traced = [c for c in cells.sequences[3] if c.traced]
    assert [(c.first, c.physical) for c in traced] == [(1875, view.sequences[3].table[1875])]
    assert cells.pool[0].port == "p0_1791" and cells.pool[0].owners == tuple(range(8))
    assert cells.pool[-1].kind == "free" and cells.pool[-1].last == 4095
    assert len(cells.pool) < 40 and len(cells.edges) < 40


def test_shuffled_big_pool_elides_and_sums_up():
    cells = dg.layout_cells(big_view())
    for seq in cells.sequences:
        assert len(seq) <= dg.MAX_SEQ_CELLS + 3
        assert any(c.elided for c in seq)
    assert any(c.kind == "mixed" for c in cells.pool)
    assert len(cells.pool) <= 2 * len(cells.edges) + 2


def test_free_runs_and_consecutive_runs_are_labelled(engine):
    view = MappingView(16, 200, [SequenceMap("seq 0", 640, list(range(100, 140)))])
    cells = dg.layout_cells(view)
    assert [(c.first, c.last, c.physical) for c in cells.sequences[0]] == [(0, 38, 100), (39, 39, 139)]
    assert [(c.first, c.last, c.kind) for c in cells.pool] == [(0, 99, "free"), (100, 139, "used"), (140, 199, "free")]
    svg = render_svg(view, engine)
    assert svg.texts("p0_99") == ["blocks 0-99 free (100)"]
    assert svg.texts("s0_l0_38") == ["L0-38", "tokens 0-623", "-> blocks 100-138"]
    assert svg.lands_in("e_s0_l0_38", "p100_139") and svg.lands_in("e_s0_l39", "p100_139")


def huge_pool_view(num_blocks: int = 2**22) -> MappingView:
    """A few short sequences spread over a pool of `num_blocks` (the CLI's largest is 2**22)."""
    last = num_blocks - 1
    return MappingView(
        16, num_blocks,
        [SequenceMap("seq 0", 38, [7, 2, 3_000_000]), SequenceMap("seq 1", 100, [last, 5, 6, 7, 8, 9, 10])],
        highlight=(0, 20),
    )


def draw_timed(view):
    """(cells, DOT source, terminal text, seconds) for one view: what every command builds."""
    from rich.console import Console

    console = Console(width=120, record=True, color_system=None, file=io.StringIO())
    start = time.perf_counter()
    cells = dg.layout_cells(view)
    console.print(dg.terminal_mapping(view))
    source = dg.dot_source(view)
    return cells, source, console.export_text(), time.perf_counter() - start


def test_a_pool_of_2_22_blocks_draws_at_once(engine):
    """The work grows with the used blocks and the drawn cells, not with the pool: free
    runs are stepped over whole, in the cells and in the terminal's pool strip."""
    cells, source, text, elapsed = draw_timed(huge_pool_view())
    assert elapsed < 1.0, f"a pool of 2**22 blocks with 9 used took {elapsed:.2f} s"
    assert [(c.first, c.last, c.owners) for c in cells.pool] == [
        (0, 1, ()), (2, 2, (0,)), (3, 4, ()), (5, 6, (1,)), (7, 7, (0, 1)), (8, 10, (1,)),
        (11, 2_999_999, ()), (3_000_000, 3_000_000, (0,)), (3_000_001, 4_194_302, ()), (4_194_303, 4_194_303, (1,)),
    ]
    assert (cells.used_blocks, cells.shared_blocks) == (9, 1)
    assert "blocks 11-2999999 free (2999989)" in source and "blocks 3000001-4194302 free (1194302)" in source
    svg = Svg(dg.render(source, "svg", engine))
    assert svg.texts("p11_2999999") == ["blocks 11-2999999 free (2999989)"]
    assert svg.texts("p3000001_4194302") == ["blocks 3000001-4194302 free (1194302)"]
    assert svg.tooltip("p3000001_4194302") == "physical blocks 3000001-4194302 (1194302): free"
    assert svg.lands_in("e_s0_l2", "p3000000") and svg.lands_in("e_s1_l0", "p4194303") and svg.ids("traced") == {"e_s0_l1"}
    assert "pool · 4194304 blocks · 9 used · 4194295 free · 1 shared  (1 character = 16384 blocks)" in text
    rows = [line for line in text.splitlines() if re.match(r"^ *\d+ [·░▓█]", line)]
    assert [line[:8] for line in rows] == ["      0 ", "1048576 ", "2097152 ", "3145728 "]  # aligned
    strip = "".join(line.split()[1] for line in rows)
    # buckets 0 (blocks 2 and 5-10), 183 (block 3,000,000) and 255 (the last block) hold used blocks
    assert len(strip) == 256 and [i for i, ch in enumerate(strip) if ch != "·"] == [0, 183, 255]
    assert set(strip[:1] + strip[183] + strip[255]) == {"░"}


def test_cells_do_not_walk_the_pool():
    """A pool far past any real one still draws at once: only a walk over every block would notice its size."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from test_diagram import huge_pool_view; from pagetrace.views import diagram as dg;"
        " from rich.console import Console; view = huge_pool_view(10**15); dg.dot_source(view);"
        " Console(file=open(__import__('os').devnull, 'w')).print(dg.terminal_mapping(view));"
        " print(dg.layout_cells(view).pool[-2].port)"
    )
    done = subprocess.run([sys.executable, "-c", code, str(ROOT / "tests")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == f"p3000001_{10**15 - 2}", done.stderr


@st.composite
def views(draw):
    block_size = draw(st.sampled_from([1, 4, 16]))
    num_blocks = draw(st.integers(1, 300))
    sequences = []
    for s in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 90))
        blocks = -(-n // block_size)
        if draw(st.booleans()):  # a run of consecutive blocks, wrapped round the pool
            start = draw(st.integers(0, num_blocks - 1))
            table = [(start + i) % num_blocks for i in range(blocks)]
        else:
            table = draw(st.lists(st.integers(0, num_blocks - 1), min_size=blocks, max_size=blocks))
        sequences.append(SequenceMap(f"seq {s}", n, table + [0] * draw(st.integers(0, 2))))
    s = draw(st.integers(0, len(sequences) - 1))
    highlight = draw(st.none() | st.integers(0, sequences[s].seq_len - 1).map(lambda t: (s, t)))
    return MappingView(block_size, num_blocks, sequences, highlight=highlight)


def brute_force_pool(view: MappingView) -> dict[int, set[int]]:
    """Used physical block -> the sequences that map it, counted entry by entry."""
    owners: dict[int, set[int]] = {}
    for s, seq in enumerate(view.sequences):
        for p in seq.table[: -(-seq.seq_len // view.block_size)]:
            owners.setdefault(p, set()).add(s)
    return owners


def assert_pool_counts(view: MappingView, cells) -> None:
    """Every pool cell against a brute-force count over the tables: its used and free
    blocks, its owners, and a one-block cell's fill."""
    import bisect

    owners = brute_force_pool(view)
    used = sorted(owners)
    bs = view.block_size
    for cell in cells.pool:
        inside = used[bisect.bisect_left(used, cell.first) : bisect.bisect_right(used, cell.last)]
        assert cell.used == len(inside), (cell, len(inside))
        if cell.kind in ("used", "shared"):
            assert all(owners[b] == set(cell.owners) for b in range(cell.first, cell.last + 1)), cell
        if cell.kind == "mixed":
            assert len(inside) < cell.blocks or len({tuple(sorted(owners[b])) for b in inside}) > 1, cell
        if cell.fill is not None:
            fills = [
                min(bs, seq.seq_len - i * bs)
                for seq in view.sequences
                for i, p in enumerate(seq.table[: -(-seq.seq_len // bs)])
                if p == cell.first
            ]
            assert cell.fill == max(fills), cell
    assert cells.used_blocks == len(owners) and cells.shared_blocks == sum(len(o) > 1 for o in owners.values())
    assert dict(cells.owners) == {b: tuple(sorted(o)) for b, o in owners.items()}


@settings(max_examples=120, deadline=None)
@given(view=views())
def test_cells_partition_the_table_and_the_pool(view):
    cells = dg.layout_cells(view)
    assert_pool_counts(view, cells)
    assert cells.pool[0].first == 0 and cells.pool[-1].last == view.num_blocks - 1
    assert all(a.last + 1 == b.first for a, b in zip(cells.pool, cells.pool[1:]))
    for s, seq in enumerate(cells.sequences):
        n = cells.needed[s]
        table = view.sequences[s].table
        assert seq[0].first == 0 and seq[-1].last == n - 1 and seq[-1].first == n - 1
        assert all(a.last + 1 == b.first for a, b in zip(seq, seq[1:]))
        for c in seq:
            assert c.first_token == c.first * view.block_size
            if not c.elided:
                assert table[c.first : c.last + 1] == list(range(c.physical, c.physical + c.blocks))
    for c, target in cells.edges:
        assert target.first <= c.physical and c.physical + c.blocks - 1 <= target.last
        assert c.seq in target.owners or target.kind == "mixed"
    assert len(cells.edges) == sum(not c.elided for seq in cells.sequences for c in seq)
    if view.highlight is not None:
        s, token = view.highlight
        [c] = [c for c in cells.sequences[s] if c.traced]
        assert c.blocks == 1 and c.first == token // view.block_size and c.physical == view.sequences[s].table[c.first]
        [p] = [p for p in cells.pool if p.traced_slot is not None]
        assert (p.first, p.last, p.traced_slot) == (c.physical, c.physical, token % view.block_size)


def random_big_view(rng: random.Random) -> MappingView:
    """Up to 5 sequences of up to 3,000 blocks: runs, scattered blocks, repeats and shared prefixes, some with attention mass."""
    bs = rng.choice([1, 16])
    nb = rng.choice([rng.randint(2_000, 9_000), 2**22])
    tables: list[list[int]] = []
    sequences = []
    for s in range(rng.randint(1, 5)):
        n = rng.randint(1, 3_000)
        mode = rng.randrange(4)
        if mode == 0:
            start = rng.randrange(nb)
            table = [(start + i) % nb for i in range(n)]
        elif mode == 1 and tables:
            prefix = rng.choice(tables)[: rng.randint(0, n)]
            table = prefix + rng.sample(range(nb), n - len(prefix))
        elif mode == 2:
            table = [rng.randrange(nb) for _ in range(n)]
        else:
            table = rng.sample(range(nb), n)
        tables.append(table)
        mass = [rng.random() for _ in range(n)] if rng.random() < 0.3 else None
        sequences.append(SequenceMap(f"seq {s}", n * bs - rng.randrange(bs), table, attention_mass=mass))
    s = rng.randrange(len(sequences))
    highlight = (s, rng.randrange(sequences[s].seq_len)) if rng.random() < 0.7 else None
    return MappingView(bs, nb, sequences, highlight=highlight, show_slots=rng.choice([None, True]))


@pytest.mark.parametrize("seed", range(12))
def test_big_tables_pool_cells_match_a_brute_force_count(seed):
    view = random_big_view(random.Random(seed))
    cells = dg.layout_cells(view)
    assert_pool_counts(view, cells)
    assert cells.pool[0].first == 0 and cells.pool[-1].last == view.num_blocks - 1


def test_the_bench_cases_pool_cells_match_a_brute_force_count():
    bench = load_script("bench", "bench_diagram")
    for view in (bench.big_case(False), bench.big_case(True), bench.huge_case()):
        assert_pool_counts(view, dg.layout_cells(view))


def test_owners_is_a_read_only_mapping():
    view = shared_view()
    view.num_blocks = 100  # a big picture
    owners = dg.layout_cells(view).owners
    assert dict(owners) == {3: (0, 1, 2), 9: (0, 1, 2), 1: (0,), 5: (1, 2), 12: (2,)}
    assert list(owners) == [1, 3, 5, 9, 12] and len(owners) == 5 and 5 in owners and 4 not in owners and "x" not in owners
    with pytest.raises(KeyError):
        owners[4]
    assert owners.count(0, 6) == 3 and owners.owner_counts(0, 10) == {(0,): 1, (0, 1, 2): 2, (1, 2): 1}


def scattered_million_view() -> MappingView:
    """As `pagetrace diagram --tokens 8388608 --num-blocks 1048576`: 524,288 blocks drawn at random from 1,048,576."""
    table = random.Random(0).sample(range(2**20), 2**19)
    return MappingView(16, 2**20, [SequenceMap("seq 0", 2**23, table)], highlight=(0, 5_000_000))


def test_a_scattered_table_of_half_a_million_blocks_draws_in_seconds():
    """Cells are made for what is drawn only: each table is scanned once."""
    view = scattered_million_view()
    cells, source, text, elapsed = draw_timed(view)
    assert elapsed < 30.0, f"a scattered table of 524,288 blocks took {elapsed:.2f} s"  # three linear scans, about 1 s each; a quadratic one takes hours
    table = view.sequences[0].table
    seq = cells.sequences[0]
    assert [(c.first, c.physical) for c in seq[:6]] == [(i, table[i]) for i in range(6)]
    assert [c.first for c in seq if c.traced] == [5_000_000 // 16] and [c.first for c in seq[-2:]] == [2**19 - 2, 2**19 - 1]
    assert sum(c.elided for c in seq) == 2 and len(seq) <= dg.MAX_SEQ_CELLS + 3
    assert (cells.used_blocks, cells.shared_blocks) == (2**19, 0)
    assert cells.pool[0].first == 0 and cells.pool[-1].last == 2**20 - 1 and sum(p.used for p in cells.pool) == 2**19
    assert len(cells.pool) <= 2 * len(cells.edges) + 2 and len(cells.edges) == len(seq) - 2
    assert source.count(" -> pool:") == len(cells.edges)
    assert "pool · 1048576 blocks · 524288 used · 524288 free  (1 character = 4096 blocks)" in text


# -- DOT ---------------------------------------------------------------------------


def test_dot_source_structure():
    source = dg.dot_source(worked_view())
    assert source.startswith("digraph pagetrace {")
    assert "rankdir=LR" in source and "rank=same" in source
    edges = re.findall(r"^\s*(\S+) -> (\S+) \[(.*)\]$", source, re.M)
    drawn = [(t, h) for t, h, attrs in edges if "invis" not in attrs]
    assert drawn == [("seq0:l0:e", "pool:p7:w"), ("seq0:l1:e", "pool:p2:w"), ("seq0:l2:e", "pool:p15:w")]
    traced = [attrs for t, h, attrs in edges if "class=traced" in attrs]
    assert len(traced) == 1 and "id=e_s0_l1" in traced[0] and "penwidth=3" in traced[0]
    assert re.findall(r'port="(p\d+)"', source) == [f"p{b}" for b in range(16)]
    assert re.findall(r'port="(l\d+)"', source) == ["l0", "l1", "l2"]
    assert re.search(r'id="p2_slot4"', source) and source.count('id="p2_slot') == 1
    assert all(ord(ch) < 128 for ch in source)  # engines measure non-ASCII text differently
    assert dg.dot_source(worked_view()) == source


# -- SVG, rendered by graphviz-pure -------------------------------------------------


def test_worked_example_svg(engine):
    svg = render_svg(worked_view(), engine)
    assert svg.ids("node") == {"seq0", "pool", "legend"}
    assert svg.ids("edge") == {"e_s0_l0", "e_s0_l1", "e_s0_l2"}
    assert svg.ids("traced") == {"e_s0_l1"}
    for logical, physical, tokens in ((0, 7, "tokens 0-15"), (1, 2, "tokens 16-31"), (2, 15, "tokens 32-37 (6/16)")):
        assert svg.texts(f"s0_l{logical}") == [f"L{logical}", tokens]
        assert svg.lands_in(f"e_s0_l{logical}", f"p{physical}")
        assert svg.texts(f"p{physical}") == [str(physical), "", "seq 0"]
        assert svg.fills(f"p{physical}")[0] == dg.SEQ_FILL[0]
    # the traced path: logical block 1, its arrow, physical block 2 and its slot 4
    assert (dg.TRACE, "3") in svg.strokes("s0_l1") and (dg.TRACE, "3") in svg.strokes("p2")
    assert (dg.TRACE, "3") not in svg.strokes("s0_l0") + svg.strokes("p7")
    path = next(svg.by_id["e_s0_l1"].iter(f"{SVG_NS}path"))
    assert (path.get("stroke"), path.get("stroke-width")) == (dg.TRACE, "3")
    assert svg.fills("p2_slot4")[0] == dg.TRACE and svg.tooltip("p2_slot4") == "slot 4: token 20"
    assert "flat slot 36" in svg.tooltip("p2")
    # block 15 holds 6 tokens: 6 filled slots, 10 empty
    slot_fills = svg.fills("p15")[2::2]
    assert (slot_fills.count(dg.SEQ_EDGE[0]), slot_fills.count(dg.EMPTY_SLOT)) == (6, 10)
    # free blocks are greyed
    for free in set(range(16)) - {2, 7, 15}:
        assert svg.fills(f"p{free}")[0] == dg.FREE_FILL
        assert svg.tooltip(f"p{free}") == f"physical block {free}: free"
        assert [t.get("fill") for t in svg.cell(f"p{free}").iter(f"{SVG_NS}text")] == [dg.FREE_TEXT]


def test_shared_blocks_svg(engine):
    svg = render_svg(shared_view(), engine)
    assert svg.texts("p3") == ["3", "", "ref 3"] and svg.texts("p5") == ["5", "", "ref 2"]
    assert svg.fills("p3")[0] == dg.SHARED_FILL and svg.fills("p1")[0] == dg.SEQ_FILL[0]
    assert "shared, ref count 3" in svg.tooltip("p9")
    for s in range(3):
        assert svg.lands_in(f"e_s{s}_l0", "p3") and svg.lands_in(f"e_s{s}_l1", "p9")
    assert svg.ids("traced") == {"e_s1_l1"} and svg.fills("p9_slot4")[0] == dg.TRACE


def test_attention_mass_shading_and_legend(engine):
    mass = [0.05, 0.15, 0.8]
    view = MappingView(16, 16, [SequenceMap("seq 0", 38, [7, 2, 15], attention_mass=mass)])
    svg = render_svg(view, engine)
    for logical, m in enumerate(mass):
        assert svg.fills(f"s0_l{logical}")[0] == dg.MASS_FILL[dg.mass_class(m, 0.8)]
        assert f"attn {m:.1%}" in svg.texts(f"s0_l{logical}")
    assert svg.fills("s0_l2")[0] == dg.MASS_FILL[-1] and svg.fills("s0_l0")[0] == dg.MASS_FILL[0]
    legend = " ".join("".join(t.itertext()) for t in svg.by_id["legend"].iter(f"{SVG_NS}text"))
    assert "attention mass per logical block" in legend and "80.0%" in legend
    assert dg.block_mass([0.1] * 38, 16) == pytest.approx([1.6, 1.6, 0.6])


def test_big_pool_renders_fast(engine):
    view = big_view()
    start = time.perf_counter()
    svg = render_svg(view, engine)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"4,096 blocks x 8 sequences took {elapsed:.1f} s"
    cells = dg.layout_cells(view)
    assert svg.ids("edge") == {f"e_s{c.seq}_{c.port}" for c, _ in cells.edges}
    assert svg.texts("s0_l0_1791")[:2] == ["L0-1791", "tokens 0-28671"]
    assert svg.texts("p0_1791") == ["blocks 0-1791", "", "ref 8 (1792)"]
    assert svg.ids("traced") == {"e_s3_l1875"}


def test_slots_follow_the_option():
    assert not dg.layout_cells(worked_view(show_slots=False)).slots
    assert 'id="p2_slot4"' not in dg.dot_source(worked_view(show_slots=False))
    assert not dg.layout_cells(MappingView(32, 16, [SequenceMap("s", 40, [1, 2])])).slots
    assert dg.layout_cells(MappingView(32, 16, [SequenceMap("s", 40, [1, 2])], show_slots=True)).slots
    with pytest.raises(UsageError, match="--slots"):
        dg.layout_cells(MappingView(512, 4, [SequenceMap("s", 40, [1])], show_slots=True))


# -- files and engines --------------------------------------------------------------


def test_write_diagrams_writes_all_three(tmp_path, engine):
    paths = dict(svg=tmp_path / "m.svg", png=tmp_path / "m.png", dot=tmp_path / "m.dot")
    written = dg.write_diagrams(worked_view(), engine=engine, **paths)
    assert written == [str(paths["svg"]), str(paths["png"]), str(paths["dot"])]
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths["dot"].read_text() == dg.dot_source(worked_view())
    assert Svg(paths["svg"].read_bytes()).ids("traced") == {"e_s0_l1"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.dot", "m.png", "m.svg"]


def test_unwritable_path_leaves_nothing(tmp_path, engine):
    ok = tmp_path / "ok.svg"
    with pytest.raises(UsageError, match="does not exist"):
        dg.write_diagrams(worked_view(), svg=ok, png=tmp_path / "missing" / "m.png", engine=engine)
    (tmp_path / "adir").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        dg.write_diagrams(worked_view(), svg=ok, dot=tmp_path / "adir", engine=engine)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"]
    assert list((tmp_path / "adir").iterdir()) == []


def test_failed_write_keeps_the_old_file_whole(tmp_path, monkeypatch):
    target = tmp_path / "m.dot"
    target.write_text("old")

    def broken_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", broken_fsync)
    with pytest.raises(RuntimeFailure, match="No space left"):
        dg.write_diagrams(worked_view(), dot=target)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["m.dot"]


def test_no_engine_writes_the_dot_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "engine_candidates", lambda: [])
    assert dg.find_engine() is None
    with pytest.raises(RuntimeFailure) as err:
        dg.write_diagrams(worked_view(), svg=tmp_path / "m.svg", png=tmp_path / "m.png")
    dot = tmp_path / "m.dot"
    assert f"dot -Tsvg {dot} -o {tmp_path / 'm.svg'}" in str(err.value) and "pip install graphviz-pure" in str(err.value)
    assert dot.read_text() == dg.dot_source(worked_view())
    assert [p.name for p in tmp_path.iterdir()] == ["m.dot"]


def test_system_dot_first_then_graphviz_pure(tmp_path, monkeypatch):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\ncat >/dev/null\necho '<svg/>'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert dg.find_engine() == ("dot", str(fake))
    fake.write_text("#!/bin/sh\necho 'Format: \"svg\" not recognized' >&2\nexit 1\n")
    name, path = dg.find_engine()
    assert name == "graphviz-pure" and Path(path).name.startswith("graphviz-pure")


def test_engine_failure_is_a_runtime_failure(tmp_path):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(RuntimeFailure, match="could not render svg .*syntax error"):
        dg.write_diagrams(worked_view(), svg=tmp_path / "m.svg", engine=("dot", str(fake)))
    assert [p.name for p in tmp_path.iterdir()] == ["dot"]


def test_diagram_module_needs_no_torch():
    code = "import sys; sys.modules['torch'] = None; import pagetrace.views.diagram, pagetrace.commands.diagram; print('ok')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    code = "import sys, pagetrace.views.diagram; print(sorted({'torch', 'graphviz', 'subprocess'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_cells_model_is_public_from_pagetrace_diagram():
    from pagetrace.views.diagram import cells, model

    for name in dg.__all__:
        assert hasattr(dg, name), name
    for name in ("MappingView", "SequenceMap", "LogicalCell", "PoolCell", "Traced", "Cells", "block_mass"):
        assert getattr(dg, name) is getattr(model, name) and name in dg.__all__
    for name in ("layout_cells", "check_view"):
        assert getattr(dg, name) is getattr(cells, name) and name in dg.__all__


def test_lookup_prints_its_terminal_map_without_the_graphviz_side():
    """`lookup` with no file option loads the cells and the terminal view only: no graphviz, no DOT, no engines."""
    code = (
        "import sys; from pagetrace.cli import run_cli; code = run_cli(['lookup', '--token', '20']);"
        " loaded = [m for m in ('graphviz', 'pagetrace.views.diagram.dot', 'pagetrace.views.diagram.engines', 'numpy', 'torch') if m in sys.modules];"
        " print(code, loaded, 'pagetrace.views.diagram.terminal' in sys.modules, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stderr.strip() == "0 [] True", done.stderr


# -- the CLI --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, option, value",
    [
        (["--tokens", "38,x"], "--tokens", "38,x"),
        (["--tokens", "38", "--table", "7,2"], "--table", "7,2"),
        (["--token", "38"], "--token", "38"),
        (["--token", "3", "--seq", "1"], "--seq", "1"),
        (["--seq", "1"], "--seq", "1"),
        (["--block-size", "0"], "--block-size", "0"),
        (["--tokens", "40", "--block-size", "512", "--slots"], "--slots", "512"),
        (["--table", "7,2,99", "--num-blocks", "16"], "--table", "7,2,99"),
    ],
)
def test_diagram_usage_errors(capsys, tmp_path, args, option, value):
    out = tmp_path / "m.svg"
    assert run_cli(["diagram", *args, "--svg", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"pagetrace: invalid value for {option}: "), captured.err
    assert value in lines[0] and "Traceback" not in captured.err and captured.out == ""
    assert not out.exists()


def test_diagram_same_path_twice(capsys, tmp_path):
    path = str(tmp_path / "m")
    assert run_cli(["diagram", "--svg", path, "--png", path]) == 2
    assert "--png" in capsys.readouterr().err and not (tmp_path / "m").exists()


@pytest.mark.parametrize("option", ["--svg", "--png", "--dot"])
def test_diagram_path_in_a_missing_directory_is_a_usage_error(capsys, tmp_path, option):
    path = str(tmp_path / "no" / "m.out")
    assert run_cli(["diagram", option, path]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert err == [f"pagetrace: invalid value for {option}: {path!r}: directory {str(tmp_path / 'no')!r} does not exist"]
    assert captured.out == "" and list(tmp_path.iterdir()) == []


def test_diagram_svg_under_a_nonexistent_root_directory(capsys):
    assert run_cli(["diagram", "--svg", "/nonexistent/x.svg"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pagetrace: invalid value for --svg: '/nonexistent/x.svg': ")
    assert "does not exist" in err[0]


def test_diagram_unwritable_directory_is_a_usage_error(capsys, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # root may write anywhere, so the refusal is simulated, not made with chmod
    monkeypatch.setattr(files.os, "access", lambda p, mode, **kw: False if Path(p) == locked and mode & os.W_OK else real_access(p, mode, **kw))
    svg = str(tmp_path / "ok.svg")
    assert run_cli(["diagram", "--svg", svg, "--png", str(locked / "m.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pagetrace: invalid value for --png: ") and "is not writable" in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["locked"] and list(locked.iterdir()) == []


@pytest.mark.parametrize(
    "make, option, reason",
    [
        (lambda d: dict(svg=""), "--svg", "is empty"),
        (lambda d: dict(svg=d / "m", png=d / "m"), "--png", "is the same file as --svg"),
        (lambda d: dict(dot=d / "missing" / "m.dot"), "--dot", "does not exist"),
        (lambda d: dict(png=d / "afile" / "m.png"), "--png", "is not a directory"),
        (lambda d: dict(svg=d / "adir"), "--svg", "is a directory"),
    ],
)
def test_check_output_paths(tmp_path, make, option, reason):
    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    paths = dict(svg=None, png=None, dot=None) | make(tmp_path)
    with pytest.raises(UsageError) as err:
        dg.check_output_paths(**paths)
    assert err.value.option == option and reason in err.value.reason
    dg.check_output_paths(tmp_path / "m.svg", str(tmp_path / "m.png"), "m.dot")  # a bare name is in the working directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile"]


def test_paths_are_checked_before_any_rendering(tmp_path, monkeypatch):
    from pagetrace.commands.diagram import save_diagrams

    def no_engine():
        raise AssertionError("looked for an engine before checking the paths")

    monkeypatch.setattr(engines, "find_engine", no_engine)
    with pytest.raises(UsageError, match="--dot"):
        save_diagrams(worked_view(), str(tmp_path / "m.svg"), None, str(tmp_path / "no" / "m.dot"))
    assert list(tmp_path.iterdir()) == []


def test_stderr_lines_are_not_wrapped_or_marked_up(capsys, tmp_path):
    """Rich wraps at 80 columns when stderr is not a terminal: each message stays one line, as written."""
    folder = tmp_path / ("a-long-folder-name-" * 5 + "[bold]:smile:")
    folder.mkdir()
    dot = str(folder / "m.dot")
    assert run_cli(["diagram", "--tokens", "100", "--table", "1,1,1,1,1,1,1", "--dot", dot]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(len(line) > 80 for line in err)
    assert err[0].startswith("warning: sequence 0 maps physical block(s) [1] more than once") and err[0].endswith("in the cache")
    assert err[1] == f"wrote {dot}"


def test_diagram_no_engine_exits_1(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(engines, "engine_candidates", lambda: [])
    assert run_cli(["diagram", "--png", str(tmp_path / "m.png")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no Graphviz engine" in err[0] and "dot -Tpng" in err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["m.dot"]


def test_diagram_json_and_files(capsys, tmp_path, engine):
    svg, png, dot = (str(tmp_path / f"m.{ext}") for ext in ("svg", "png", "dot"))
    assert run_cli(["diagram", "--token", "20", "--svg", svg, "--png", png, "--dot", dot, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["written"] == [svg, png, dot] and doc["engine"]["name"] in ("dot", "graphviz-pure")
    assert doc["tables"] == [[7, 2, 15]] and doc["num_blocks"] == 16
    assert doc["highlight"] == {"seq": 0, "token": 20, "logical_block": 1, "physical_block": 2, "offset": 4}
    assert (doc["edges"], doc["nodes"]) == (3, {"logical_cells": 3, "pool_cells": 16})
    assert Path(dot).read_text() == dg.dot_source(worked_view())


def test_diagram_in_the_terminal(capsys):
    assert run_cli(["diagram", "--tokens", "38,20", "--token", "20"]) == 0
    out = capsys.readouterr().out
    assert "seq 0 · 38 tokens in 3 blocks of 16" in out and "seq 1 · 20 tokens in 2 blocks of 16" in out
    assert "32-37 (6/16)" in out and "16-19 (4/16)" in out
    assert "pool · 16 blocks · 5 used · 11 free" in out


def test_terminal_mapping_of_a_big_pool():
    from rich.console import Console

    console = Console(width=120, record=True, color_system=None)
    console.print(dg.terminal_mapping(big_view(shuffled=False)))
    text = console.export_text()
    assert "(1 character = 16 blocks)" in text and "1792 shared" in text
    assert "0-1791" in text and len(text.splitlines()) < 60


def test_lookup_shows_the_mapping(capsys):
    assert run_cli(["lookup", "--token", "20", "--table", "7,2,15"]) == 0
    out = capsys.readouterr().out
    assert "pool · 16 blocks · 3 used · 13 free" in out and "32-47" in out


def test_lookup_json_lists_the_diagrams(capsys, tmp_path, engine):
    svg = str(tmp_path / "l.svg")
    assert run_cli(["lookup", "--token", "20", "--json", "--svg", svg]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["diagrams"] == [svg] and doc["physical_block"] == 2
    drawn = Svg(Path(svg).read_bytes())
    assert drawn.ids("traced") == {"e_s0_l1"} and drawn.texts("s0_l2") == ["L2", "tokens 32-47"]


def test_lookup_with_a_bad_path(capsys, tmp_path):
    assert run_cli(["lookup", "--dot", str(tmp_path / "no" / "l.dot")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pagetrace: invalid value for --dot: ") and "does not exist" in err[0]


# -- the committed examples ------------------------------------------------------------


@pytest.mark.parametrize("name", ["worked_example", "gqa_shared_prefix"])
def test_committed_example_svgs_are_in_sync(name, engine):
    """graphviz-pure writes the same bytes on every machine, so the check is byte for byte."""
    view = load_script("examples", name).build_view()
    committed = (ROOT / "examples" / f"{name}.svg").read_bytes()
    assert dg.render(dg.dot_source(view), "svg", engine) == committed, f"run: python examples/{name}.py"


def test_gqa_example_shares_its_prompt(engine):
    view = load_script("examples", "gqa_shared_prefix").build_view()
    svg = Svg((ROOT / "examples" / "gqa_shared_prefix.svg").read_bytes())
    assert svg.texts("p3") == ["3", "", "ref 3"] and svg.texts("p9") == ["9", "", "ref 3"]
    assert svg.ids("traced") == {"e_s1_l1"} and svg.lands_in("e_s1_l1", "p9")
    for seq in view.sequences:
        assert sum(seq.attention_mass) == pytest.approx(1.0, abs=1e-3)


def test_a_warning_and_a_usage_error_give_one_line(capsys):
    from pagetrace.cli import run_cli

    code = run_cli(["diagram", "--tokens", "38", "--table", "7,7,7", "--token", "40"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "--token" in err


def test_a_directory_path_is_refused_up_front(capsys, tmp_path):
    from pagetrace.cli import run_cli

    code = run_cli(["lookup", "--svg", str(tmp_path / "newdir") + "/"])
    err = capsys.readouterr().err
    assert code == 2 and "--svg" in err and len(err.strip().splitlines()) == 1


def test_the_blocks_of_sequences_not_drawn_have_a_legend_entry():
    """Past MAX_SEQUENCES the rest are summed up and their pool blocks drawn grey: the legend
    says what the grey is, or those blocks read as free."""
    many = [dg.SequenceMap(f"seq {i}", 20, [2 * i + 1, 2 * i + 2]) for i in range(dg.MAX_SEQUENCES + 2)]
    source = dg.dot_source(dg.MappingView(16, 24, many))
    assert "blocks of the 2 sequences not drawn" in source
    few = dg.dot_source(dg.MappingView(16, 24, many[: dg.MAX_SEQUENCES]))
    assert "sequences not drawn" not in few  # all drawn: no entry for nothing
