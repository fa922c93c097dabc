"""Pictures of a simulation, written directly (no Graphviz): the pool over time, the waste chart.

- `occupancy_svg` / `occupancy_png`: one picture in two formats: one row per step, one
  column per block, each block coloured by its state (free, free but still cached, used by
  one request, shared by several); beside it each step's blocks by state as a bar, and a
  tick where the step preempted or evicted; title, axes and legend in words.
- `waste_svg`: Figure 2 of the vLLM paper (Kwon et al., SOSP 2023) for this workload: one
  stacked bar per system, the four shares of the KV memory handed to requests.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from html import escape

from ..sim.baselines import CATEGORIES, Waste
from ..sim.run import CACHED, FREE

# The pool over time, by state: what a reader wants to see is how full the pool is, how much of
# it is cached for later hits, where blocks are shared, and when the engine evicted or preempted.
# Okabe-Ito colours (safe for the common colour-vision deficiencies); the legend says each in words.
FREE_STATE, CACHED_STATE, USED_STATE, SHARED_STATE = 0, 1, 2, 3
STATES = (  # state -> (name, colour)
    ("free", (255, 255, 255)),
    ("free, still cached (a later prompt can hit it)", (187, 187, 187)),
    ("used by one request", (0, 114, 178)),
    ("shared by several requests (prefix caching)", (230, 159, 0)),
)
PREEMPT, EVICT, INK = (213, 94, 0), (0, 0, 0), (0, 0, 0)
BAR_W, EVENT_W, GAP = 160, 18, 14


def block_states(rows: list[list[int]], shared: list[list[int]]) -> list[bytes]:
    """Per step, each block's state (FREE_STATE .. SHARED_STATE)."""
    out = []
    for row, marks in zip(rows, shared):
        line = bytearray(CACHED_STATE if v == CACHED else FREE_STATE if v == FREE else USED_STATE for v in row)
        for b in marks:
            line[b] = SHARED_STATE
        out.append(bytes(line))
    return out


def cell_size(num_blocks: int, steps: int) -> tuple[int, int]:
    """Pixels per block and per step: the pool stays within about 1200 x 1200."""
    return max(1, min(12, 1200 // max(num_blocks, 1))), max(1, min(12, 1200 // max(steps, 1)))


@dataclass(frozen=True, slots=True)
class Frame:
    """Where each part of the picture goes, in pixels: one geometry for the SVG and the PNG."""

    blocks: int
    steps: int
    cw: int
    ch: int
    left: int = 64
    top: int = 58

    @property
    def pool_w(self) -> int:
        return self.blocks * self.cw

    @property
    def pool_h(self) -> int:
        return self.steps * self.ch

    @property
    def bars_x(self) -> int:
        return self.left + self.pool_w + GAP

    @property
    def events_x(self) -> int:
        return self.bars_x + BAR_W + GAP

    @property
    def legend_y(self) -> int:
        return self.top + self.pool_h + 34

    @property
    def width(self) -> int:
        return max(self.events_x + EVENT_W + 110, self.left + 520)

    @property
    def height(self) -> int:
        return self.legend_y + 18 * (len(STATES) + 2) + 8


def frame_of(states: list[bytes]) -> Frame:
    steps, blocks = len(states), len(states[0]) if states else 0
    return Frame(blocks, steps, *cell_size(blocks, steps))


def _counts(line: bytes) -> list[int]:
    return [line.count(k) for k in range(len(STATES))]


def _bar_runs(line: bytes, blocks: int) -> list[tuple[int, int, int]]:
    """(x offset, width, state) of one step's occupancy bar: used, shared, cached, free."""
    out, x = [], 0
    for state in (USED_STATE, SHARED_STATE, CACHED_STATE, FREE_STATE):
        w = round(BAR_W * line.count(state) / max(blocks, 1))
        if w:
            out.append((x, min(w, BAR_W - x), state))
            x += w
    return out


def _labels(f: Frame, title: str, evictions: int, preemptions: int) -> list[tuple[int, int, str, int, bool, str]]:
    """(x, y of the baseline, text, size, bold, anchor) of every text in the picture."""
    last_step, last_block = max(f.steps - 1, 0), max(f.blocks - 1, 0)
    out = [
        (f.left, 18, title, 14, True, "start"),
        (f.left, 36, "one row per step, top to bottom; one column per block (block 0, the null block, stays free)", 11, False, "start"),
        (f.left - 6, f.top + 10, "step 0", 10, False, "end"),
        (f.left - 6, f.top + f.pool_h, f"step {last_step}", 10, False, "end"),
        (f.left, f.top + f.pool_h + 14, "block 0", 10, False, "start"),
        (f.left + f.pool_w, f.top + f.pool_h + 14, f"block {last_block}", 10, False, "end"),
        (f.bars_x, f.top - 6, "blocks by state", 10, True, "start"),
        (f.bars_x, f.top + f.pool_h + 14, "0", 10, False, "start"),
        (f.bars_x + BAR_W, f.top + f.pool_h + 14, f"{f.blocks}", 10, False, "end"),
        (f.events_x, f.top - 6, "events", 10, True, "start"),
    ]
    y = f.legend_y
    for k, (name, _) in enumerate(STATES):
        out.append((f.left + 20, y + 18 * k + 11, name, 11, False, "start"))
    k = len(STATES)
    out.append((f.left + 20, y + 18 * k + 11, f"preemption (a request freed to be recomputed): {preemptions} steps", 11, False, "start"))
    out.append((f.left + 20, y + 18 * (k + 1) + 11, f"eviction (a cached block reused; longer: more blocks): {evictions} steps", 11, False, "start"))
    return out


def _event_marks(f: Frame, steps) -> list[tuple[int, int, int, tuple[int, int, int]]]:
    """(x, y, width, colour) of each step's event tick: preemptions full width, evictions by count."""
    out = []
    for i, s in enumerate(steps[: f.steps]):
        y = f.top + i * f.ch
        if s.preempted:
            out.append((f.events_x, y, EVENT_W, PREEMPT))
        elif s.evicted:
            out.append((f.events_x, y, max(2, min(EVENT_W - 4, 2 + s.evicted)), EVICT))
    return out


def _swatches(f: Frame) -> list[tuple[int, int, tuple[int, int, int]]]:
    colours = [colour for _, colour in STATES] + [PREEMPT, EVICT]
    return [(f.left, f.legend_y + 18 * k + 1, colour) for k, colour in enumerate(colours)]


def occupancy_svg(rows: list[list[int]], shared: list[list[int]], title: str, steps=()) -> str:
    """The pool over time as SVG: the state raster embedded as a PNG (small at any size), the
    occupancy bars, the event ticks, title, axes and legend as vector elements."""
    import base64

    states = block_states(rows, shared)
    f = frame_of(states)
    marks = _event_marks(f, steps)
    raster = encode_png(f.pool_w, f.pool_h, _pool_pixels(states, f))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{f.width}" height="{f.height}" font-family="Arimo, Arial, sans-serif" font-size="11">',
        f'<rect width="{f.width}" height="{f.height}" fill="white"/>',
        f'<image x="{f.left}" y="{f.top}" width="{f.pool_w}" height="{f.pool_h}" style="image-rendering:pixelated" '
        f'href="data:image/png;base64,{base64.b64encode(raster).decode()}"><title>blocks by state, step by step</title></image>',
        f'<rect x="{f.left}" y="{f.top}" width="{f.pool_w}" height="{f.pool_h}" fill="none" stroke="black"/>',
    ]
    bars = encode_png(BAR_W, f.pool_h, _bar_pixels(states, f))
    out.append(f'<image x="{f.bars_x}" y="{f.top}" width="{BAR_W}" height="{f.pool_h}" style="image-rendering:pixelated" '
               f'href="data:image/png;base64,{base64.b64encode(bars).decode()}"/>')
    out.append(f'<rect x="{f.bars_x}" y="{f.top}" width="{BAR_W}" height="{f.pool_h}" fill="none" stroke="black"/>')
    for x, y, w, colour in marks:
        out.append(f'<rect x="{x}" y="{y}" width="{w}" height="{f.ch}" fill="{_hex(colour)}"/>')
    out.append(f'<rect x="{f.events_x}" y="{f.top}" width="{EVENT_W}" height="{f.pool_h}" fill="none" stroke="#999"/>')
    for x, y, colour in _swatches(f):
        out.append(f'<rect x="{x}" y="{y}" width="14" height="12" fill="{_hex(colour)}" stroke="#777"/>')
    evictions, preemptions = sum(1 for s in steps if s.evicted), sum(1 for s in steps if s.preempted)
    for x, y, text, size, bold, anchor in _labels(f, title, evictions, preemptions):
        weight = ' font-weight="bold"' if bold else ""
        out.append(f'<text x="{x}" y="{y}" font-size="{size}"{weight} text-anchor="{anchor}">{escape(text)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _pool_pixels(states: list[bytes], f: Frame) -> list[bytes]:
    palette = [bytes(colour) for _, colour in STATES]
    rows = []
    for line in states:
        px = b"".join(palette[v] * f.cw for v in line)
        rows.extend([px] * f.ch)
    return rows


def _bar_pixels(states: list[bytes], f: Frame) -> list[bytes]:
    palette = [bytes(colour) for _, colour in STATES]
    rows = []
    for line in states:
        px = bytearray(palette[FREE_STATE] * BAR_W)
        for x, w, state in _bar_runs(line, f.blocks):
            px[3 * x : 3 * (x + w)] = palette[state] * w
        rows.extend([bytes(px)] * f.ch)
    return rows


def encode_png(width: int, height: int, rows: list[bytes]) -> bytes:
    """RGB rows (3 bytes a pixel) as a PNG, encoded here with zlib."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + row for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, RGBA rows) of an 8-bit RGB or RGBA, non-interlaced PNG (what
    graphviz-pure writes): the five scanline filters undone."""
    pos, width, height, channels, idat = 8, 0, 0, 4, b""
    while pos < len(data):
        (n,), kind = struct.unpack(">I", data[pos : pos + 4]), data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            if depth != 8 or colour not in (2, 6) or body[12] != 0:
                raise ValueError(f"an 8-bit RGB(A) PNG without interlacing, got depth {depth}, colour type {colour}")
            channels = 4 if colour == 6 else 3
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line) if channels == 4 else b"".join(bytes(line[k : k + 3]) + b"\xff" for k in range(0, stride, 3)))
        prev = line
    return width, height, rows


def _text_png(text: str, size: int, bold: bool, engine) -> tuple[int, int, list[bytes]]:
    """One line of text rendered by the Graphviz engine the diagrams use (its own font, at 72
    dpi: a point is a pixel, as in the SVG)."""
    from .diagram.engines import render

    label = f"<<B>{escape(text)}</B>>" if bold else f"<{escape(text)}>"
    source = (f'digraph{{graph[margin=0 pad=0 bgcolor=white]; node[shape=plaintext margin=0 width=0 height=0 '
              f'fontname="Arimo" fontsize={size}]; t[label={label}]}}')
    return decode_png(render(source, "png", engine, dpi=72))


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


def occupancy_png(rows: list[list[int]], shared: list[list[int]], title: str = "", steps=(), engine=None) -> bytes:
    """The same picture as `occupancy_svg`, as a PNG: the same frame, colours and ticks; the text
    drawn by the Graphviz engine the diagrams use (without one, the picture has no text)."""
    from .diagram.engines import find_engine

    states = block_states(rows, shared)
    f = frame_of(states)
    canvas = [bytearray(b"\xff" * (3 * f.width)) for _ in range(f.height)]

    def blit(x: int, y: int, pixels: list[bytes]) -> None:
        for dy, row in enumerate(pixels):
            if 0 <= y + dy < f.height:
                canvas[y + dy][3 * x : 3 * x + len(row)] = row[: 3 * (f.width - x)]

    def box(x: int, y: int, w: int, h: int, colour) -> None:
        blit(x, y, [bytes(colour) * w] * h)

    def frame(x: int, y: int, w: int, h: int, colour=INK) -> None:
        box(x, y, w, 1, colour), box(x, y + h - 1, w, 1, colour), box(x, y, 1, h, colour), box(x + w - 1, y, 1, h, colour)

    blit(f.left, f.top, _pool_pixels(states, f))
    frame(f.left - 1, f.top - 1, f.pool_w + 2, f.pool_h + 2)
    blit(f.bars_x, f.top, _bar_pixels(states, f))
    frame(f.bars_x - 1, f.top - 1, BAR_W + 2, f.pool_h + 2)
    for x, y, w, colour in _event_marks(f, steps):
        box(x, y, w, f.ch, colour)
    frame(f.events_x - 1, f.top - 1, EVENT_W + 2, f.pool_h + 2, (153, 153, 153))
    for x, y, colour in _swatches(f):
        box(x, y, 14, 12, colour)
        frame(x, y, 14, 12, (119, 119, 119))
    engine = engine or find_engine()
    if engine is not None:
        evictions, preemptions = sum(1 for s in steps if s.evicted), sum(1 for s in steps if s.preempted)
        for x, y, text, size, bold, anchor in _labels(f, title, evictions, preemptions):
            w, h, rgba = _text_png(text, size, bold, engine)
            x0 = x - w if anchor == "end" else x
            pixels = [bytes(_over_white(row)) for row in rgba]
            blit(max(0, x0), max(0, y - h + 3), pixels)
    return encode_png(f.width, f.height, [bytes(row) for row in canvas])


def _over_white(rgba: bytes) -> bytearray:
    out = bytearray()
    for k in range(0, len(rgba), 4):
        r, g, b, a = rgba[k : k + 4]
        out += bytes((255 - (255 - v) * a // 255) if a < 255 else v for v in (r, g, b))
    return out


CATEGORY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#bab0ac")


def _percent_chart(width: int, height: int, title: str, left: int, top: int, plot_h: int, right: float) -> list[str]:
    """The opening of a 0-100 % chart: the SVG, its white ground, the title and the gridlines."""
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for pct in range(0, 101, 20):
        y = top + plot_h - plot_h * pct / 100
        out.append(f'<line x1="{left - 4}" y1="{y}" x2="{right}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{pct}%</text>')
    return out


def waste_svg(systems: list[Waste], title: str) -> str:
    """Stacked bars, 0-100 %, one per system; each segment labelled with its share."""
    bar, gap, left, top, plot_h = 90, 40, 60, 50, 300
    width = left + len(systems) * (bar + gap) + 190
    height = top + plot_h + 60
    out = _percent_chart(width, height, title, left, top, plot_h, left + len(systems) * (bar + gap))
    for i, w in enumerate(systems):
        x = left + gap / 2 + i * (bar + gap)
        y = top + plot_h
        for (name, share), colour in zip(w.shares().items(), CATEGORY_COLOURS):
            h = plot_h * share
            y -= h
            if h > 0:
                out.append(f'<rect x="{x}" y="{y:.2f}" width="{bar}" height="{h:.2f}" fill="{colour}"><title>{escape(name)}: {share:.1%}</title></rect>')
            if h >= 14:
                fill = "white" if colour != CATEGORY_COLOURS[3] else "black"
                out.append(f'<text x="{x + bar / 2}" y="{y + h / 2 + 4:.2f}" text-anchor="middle" fill="{fill}">{share:.1%}</text>')
        out.append(f'<text x="{x + bar / 2}" y="{top + plot_h + 18}" text-anchor="middle">{escape(w.system)}</text>')
    lx = left + len(systems) * (bar + gap) + 10
    for k, (name, colour) in enumerate(zip(CATEGORIES, CATEGORY_COLOURS)):
        y = top + 10 + k * 22
        out.append(f'<rect x="{lx}" y="{y}" width="14" height="14" fill="{colour}"/>')
        out.append(f'<text x="{lx + 20}" y="{y + 12}">{escape(name)}</text>')
    out.append(f'<text x="{left}" y="{height - 12}" font-size="10">shares of the KV slot-steps each system handed to requests (after each step, summed over the run)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


WHAT_IF_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def what_if_svg(outcomes, title: str = "blocks in use over time, as given and under each --what-if") -> str:
    """One line per run: blocks in use after each step, as a share of its pool's usable blocks."""
    left, top, plot_w, plot_h = 60, 50, 640, 300
    legend_h = 20 * len(outcomes)
    width, height = left + plot_w + 30, top + plot_h + 50 + legend_h
    longest = max((len(o.used_over_time) for o in outcomes), default=1) or 1
    out = _percent_chart(width, height, title, left, top, plot_h, left + plot_w)
    out.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 32}" text-anchor="middle">step (of {longest:,})</text>')
    for k in range(0, 5):
        x = left + plot_w * k / 4
        out.append(f'<text x="{x}" y="{top + plot_h + 16}" text-anchor="middle">{round((longest - 1) * k / 4):,}</text>')
    for i, o in enumerate(outcomes):
        colour = WHAT_IF_COLOURS[i % len(WHAT_IF_COLOURS)]
        used, usable = o.used_over_time, max(o.setting.num_blocks - 1, 1)
        stride = max(1, len(used) // 1000)
        points = " ".join(f"{left + plot_w * j / max(longest - 1, 1):.1f},{top + plot_h - plot_h * min(used[j] / usable, 1):.1f}"
                          for j in range(0, len(used), stride))
        dash = ' stroke-dasharray="6 3"' if i % 2 else ""  # a run that matches another stays visible
        out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"{dash}><title>{escape(o.label)}</title></polyline>')
        y = top + plot_h + 50 + 20 * i
        out.append(f'<rect x="{left}" y="{y - 10}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{left + 20}" y="{y - 4}">{escape(o.label)}: hit rate {o.hit_rate:.1%}, peak {o.peak_used:,}/{usable:,} blocks, {o.preemptions:,} preemptions</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def sweep_svg(points: list[dict], title: str) -> str:
    """Hit rate against capacity in tokens (log scale), one line per block size and policy, as
    Mooncake's Figure 9 draws it; a point whose pool holds everything (nothing evicted) is drawn
    at the right edge and marked "inf"."""
    import math

    left, top, plot_w, plot_h = 60, 50, 640, 300
    series: dict[str, list[dict]] = {}
    for p in points:
        series.setdefault(f"block size {p['block_size']}, {p['policy']}", []).append(p)
    legend_h = 20 * len(series)
    width, height = left + plot_w + 40, top + plot_h + 50 + legend_h
    finite = [p["capacity_tokens"] for p in points if not p["label"].startswith("inf")]
    lo = min(finite or [p["capacity_tokens"] for p in points])
    hi = max(p["capacity_tokens"] for p in points)
    lo_l, hi_l = math.log10(max(lo, 1)), math.log10(max(hi, 2))
    if hi_l - lo_l < 1e-9:
        lo_l, hi_l = lo_l - 0.5, hi_l + 0.5
    top_rate = max(max(p["hit_rate"] for p in points), 0.01)
    scale = min(1.0, math.ceil(top_rate * 10 + 0.5) / 10)

    def x_of(tokens):
        return left + plot_w * (math.log10(max(tokens, 1)) - lo_l) / (hi_l - lo_l)

    def y_of(rate):
        return top + plot_h - plot_h * rate / scale

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
           f'font-family="sans-serif" font-size="12">', f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="24" font-size="15" font-weight="bold">{escape(title)}</text>']
    for k in range(0, 6):
        rate = scale * k / 5
        y = y_of(rate)
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{rate:.0%}</text>')
    for e in range(math.floor(lo_l), math.ceil(hi_l) + 1):
        if lo_l - 1e-9 <= e <= hi_l + 1e-9:
            x = x_of(10 ** e)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + plot_h}" stroke="#eee"/>')
            label = f"{10 ** e:,.0f}" if e < 6 else f"{10 ** (e - 6):,.0f}M" if e < 9 else f"{10 ** (e - 9):,.0f}G"
            out.append(f'<text x="{x:.1f}" y="{top + plot_h + 16}" text-anchor="middle">{label}</text>')
    out.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#333"/>')
    out.append(f'<text x="{left + plot_w / 2}" y="{top + plot_h + 34}" text-anchor="middle">KV cache capacity (tokens, log scale)</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">prefix-cache hit rate</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = WHAT_IF_COLOURS[i % len(WHAT_IF_COLOURS)]
        pts = sorted(pts, key=lambda p: p["capacity_tokens"])
        coords = [(x_of(p["capacity_tokens"]), y_of(p["hit_rate"]), p) for p in pts]
        out.append(f'<polyline points="{" ".join(f"{x:.1f},{y:.1f}" for x, y, _ in coords)}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for x, y, p in coords:
            tip = f"{p['label']}: hit rate {p['hit_rate']:.1%}, peak {p['peak_used_blocks']:,} of {p['num_blocks'] - 1:,} blocks"
            out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"><title>{escape(tip)}</title></circle>')
            if p["label"].startswith("inf"):
                out.append(f'<text x="{x:.1f}" y="{y - 8:.1f}" text-anchor="end">nothing evicted: {p["hit_rate"]:.1%}</text>')
            else:
                out.append(f'<text x="{x + 5:.1f}" y="{y + 14:.1f}">{p["hit_rate"]:.1%}</text>')
        y = top + plot_h + 50 + 20 * i
        out.append(f'<rect x="{left}" y="{y - 10}" width="14" height="4" fill="{colour}"/>')
        out.append(f'<text x="{left + 20}" y="{y - 4}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
