"""simulate's pool picture: one picture in SVG and PNG (same frame, colours, ticks and words),
blocks coloured by state, small enough to mail, every pixel where the frame says."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.views import sim_pictures as pic
from pagetrace.sim.run import CACHED, FREE
from pagetrace.sim.scheduler import StepRecord


def step(n: int, **events) -> StepRecord:
    fields = dict(scheduled=1, tokens=1, allocated=0, hit_tokens=0, evicted=0, preempted=[], admitted=[], finished=[],
                  free_blocks=0, used_blocks=0, waiting=0, running=1, empty_slots=0)
    fields.update(events)
    return StepRecord(n, **fields)


# 3 steps x 6 blocks: block 0 null (free); request 0 on 1-2, request 1 on 2 (shared) and 3; 4 cached; 5 free
ROWS = [[FREE, 0, 0, FREE, CACHED, FREE], [FREE, 0, 0, 1, CACHED, FREE], [FREE, FREE, CACHED, 1, 1, FREE]]
SHARED = [[], [2], []]
STEPS = [step(0), step(1, preempted=["0"]), step(2, evicted=1)]


def test_states_by_hand():
    assert pic.block_states(ROWS, SHARED) == [bytes([0, 2, 2, 0, 1, 0]), bytes([0, 2, 3, 2, 1, 0]), bytes([0, 0, 1, 2, 2, 0])]


def pixel(rows: list[bytes], x: int, y: int) -> tuple[int, int, int]:
    return tuple(rows[y][4 * x : 4 * x + 3])


def test_png_is_the_svg_picture_pixel_for_pixel_where_they_draw_the_same():
    svg = pic.occupancy_svg(ROWS, SHARED, "t", STEPS)
    png = pic.occupancy_png(ROWS, SHARED, "t", STEPS)
    root = ET.fromstring(svg)
    w, h, rows = pic.decode_png(png)
    assert (w, h) == (int(root.get("width")), int(root.get("height")))
    f = pic.frame_of(pic.block_states(ROWS, SHARED))
    colours = {k: c for k, (_, c) in enumerate(pic.STATES)}
    for s, line in enumerate(pic.block_states(ROWS, SHARED)):
        for b, state in enumerate(line):  # the centre of each cell has its state's colour
            assert pixel(rows, f.left + b * f.cw + f.cw // 2, f.top + s * f.ch + f.ch // 2) == colours[state], (s, b)
    # the preemption of step 1 and the eviction of step 2 as ticks in the events column
    assert pixel(rows, f.events_x + 1, f.top + f.ch + f.ch // 2) == pic.PREEMPT
    assert pixel(rows, f.events_x + 1, f.top + 2 * f.ch + f.ch // 2) == pic.EVICT
    assert pixel(rows, f.events_x + 1, f.top + f.ch // 2) == (255, 255, 255)  # step 0: nothing happened
    # the SVG's embedded pool raster is the PNG's pool, cell for cell
    href = root.find("{http://www.w3.org/2000/svg}image").get("href")
    _, _, raster = pic.decode_png(base64.b64decode(href.split(",", 1)[1]))
    for y in range(f.pool_h):
        assert raster[y] == rows[f.top + y][4 * f.left : 4 * (f.left + f.pool_w)]


def test_the_bars_count_blocks_by_state():
    line = bytes([pic.USED_STATE] * 3 + [pic.SHARED_STATE] + [pic.CACHED_STATE] * 4 + [pic.FREE_STATE] * 8)
    runs = pic._bar_runs(line, 16)
    assert [(w, state) for _, w, state in runs] == [(30, pic.USED_STATE), (10, pic.SHARED_STATE), (40, pic.CACHED_STATE), (80, pic.FREE_STATE)]
    assert sum(w for _, w, _ in runs) == pic.BAR_W


def test_the_words_are_in_both_and_the_png_has_them_drawn():
    svg = pic.occupancy_svg(ROWS, SHARED, "pool occupancy: 6 blocks x 3 steps", STEPS)
    for words in ("pool occupancy: 6 blocks x 3 steps", "free, still cached", "shared by several requests", "preemption", "eviction", "step 2", "block 5"):
        assert words in svg
    from pagetrace.views.diagram.engines import find_engine

    if find_engine() is None:
        pytest.skip("no Graphviz engine draws the PNG's text here (graphviz-pure is a dependency)")
    w, h, rows = pic.decode_png(pic.occupancy_png(ROWS, SHARED, "pool occupancy", STEPS))
    f = pic.frame_of(pic.block_states(ROWS, SHARED))
    title = [pixel(rows, x, y) for y in range(4, 20) for x in range(f.left, f.left + 100)]
    assert sum(1 for p in title if p != (255, 255, 255)) > 50  # ink where the title is


def test_decode_undoes_every_filter():
    import struct
    import zlib

    width, height = 3, 5
    rgba = [bytes((x * 40 + y, y * 30, (x + y) * 20, 255)) for y in range(height) for x in range(width)]
    lines = [b"".join(rgba[y * width : (y + 1) * width]) for y in range(height)]
    raw, prev = b"", bytes(width * 4)
    for kind, line in enumerate(lines):  # filter types 0..4, one per row, encoded here by the book
        out = bytearray()
        for i in range(len(line)):
            a = line[i - 4] if i >= 4 else 0
            b, c = prev[i], prev[i - 4] if i >= 4 else 0
            p = a + b - c
            pred = [0, a, b, (a + b) // 2, a if abs(p - a) <= abs(p - b) and abs(p - a) <= abs(p - c) else b if abs(p - b) <= abs(p - c) else c][kind]
            out.append((line[i] - pred) & 255)
        raw += bytes([kind]) + bytes(out)
        prev = line

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    assert pic.decode_png(png) == (width, height, lines)


def test_the_default_run_makes_a_picture_to_mail(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["simulate", "--svg", "pool.svg", "--png", "pool.png", "--shared-prefix", "64"])
    assert result.exit_code == 0, result.output
    svg, png = (tmp_path / "pool.svg").read_bytes(), (tmp_path / "pool.png").read_bytes()
    assert len(svg) < 200_000 and len(png) < 200_000, (len(svg), len(png))
    w, h, rows = pic.decode_png(png)
    assert (w, h) == tuple(int(v) for v in re.search(rb'width="(\d+)" height="(\d+)"', svg).groups())
