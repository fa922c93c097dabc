"""Pictures of a simulation, written directly (no Graphviz): the pool over time, the waste chart.

- `occupancy_svg` / `occupancy_png`: one row per step, one column per block; a block is
  coloured by the request holding it, pale grey when free but still cached, white when
  free; a black bar marks a block shared by two or more requests.
- `waste_svg`: Figure 2 of the vLLM paper (Kwon et al., SOSP 2023) for this workload: one
  stacked bar per system, the four shares of the KV memory handed to requests.
"""

from __future__ import annotations

import colorsys
import struct
import zlib
from html import escape

from .baselines import CATEGORIES, Waste
from .run import CACHED, FREE

WHITE, PALE = (255, 255, 255), (222, 222, 222)


def request_colour(k: int) -> tuple[int, int, int]:
    """A distinct, stable colour per request index (golden-ratio hues)."""
    h = (k * 0.618033988749895) % 1.0
    r, g, b = colorsys.hls_to_rgb(h, 0.55 + 0.15 * ((k // 7) % 2), 0.65)
    return int(r * 255), int(g * 255), int(b * 255)


def cell_colour(v: int) -> tuple[int, int, int]:
    return WHITE if v == FREE else PALE if v == CACHED else request_colour(v)


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


def cell_size(num_blocks: int, steps: int) -> tuple[int, int]:
    """Pixels per block and per step: the picture stays within about 1600 x 1600."""
    return max(1, min(12, 1600 // max(num_blocks, 1))), max(1, min(12, 1600 // max(steps, 1)))


def occupancy_svg(rows: list[list[int]], shared: list[list[int]], title: str) -> str:
    steps, blocks = len(rows), len(rows[0]) if rows else 0
    cw, ch = cell_size(blocks, steps)
    top, left = 40, 50
    width, height = left + blocks * cw + 10, top + steps * ch + 30
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16">{escape(title)}</text>',
        f'<text x="{left}" y="32" font-size="10">x: block id 0..{blocks - 1}  y: step 0..{steps - 1} (down); '
        "colour: request; grey: free, still cached; white: free; black bar: shared</text>",
    ]
    for b in range(blocks):  # one rect per block per run of steps with the same holder
        x = left + b * cw
        s = 0
        while s < steps:
            v, e = rows[s][b], s + 1
            while e < steps and rows[e][b] == v:
                e += 1
            if v != FREE:
                out.append(f'<rect x="{x}" y="{top + s * ch}" width="{cw}" height="{(e - s) * ch}" fill="{_hex(cell_colour(v))}"/>')
            s = e
    marks = [set(m) for m in shared]
    for b in sorted(set().union(*marks)) if marks else ():  # shared: a black bar down the middle of the block
        s = 0
        while s < steps:
            if b not in marks[s]:
                s += 1
                continue
            e = s + 1
            while e < steps and b in marks[e]:
                e += 1
            w = max(cw / 3, 0.5)
            out.append(f'<rect x="{left + b * cw + (cw - w) / 2:.2f}" y="{top + s * ch}" width="{w:.2f}" height="{(e - s) * ch}" fill="black"/>')
            s = e
    out.append(f'<rect x="{left}" y="{top}" width="{blocks * cw}" height="{steps * ch}" fill="none" stroke="black"/>')
    out.append(f'<text x="{left - 4}" y="{top + 10}" text-anchor="end" font-size="10">0</text>')
    out.append(f'<text x="{left - 4}" y="{top + steps * ch}" text-anchor="end" font-size="10">{steps - 1}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def occupancy_png(rows: list[list[int]], shared: list[list[int]]) -> bytes:
    """The same picture as a PNG (RGB, 8 bits), encoded here with zlib."""
    steps, blocks = len(rows), len(rows[0]) if rows else 0
    cw, ch = cell_size(blocks, steps)
    raw = bytearray()
    for s, row in enumerate(rows):
        marks = set(shared[s])
        line = bytearray()
        for b, v in enumerate(row):
            rgb = cell_colour(v)
            px = bytes(rgb) * cw
            if b in marks and cw >= 3:
                mid = cw // 2
                px = bytes(rgb) * mid + b"\x00\x00\x00" + bytes(rgb) * (cw - mid - 1)
            line += px
        for _ in range(ch):
            raw += b"\x00" + line
    width, height = blocks * cw, steps * ch

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(bytes(raw), 6)) + chunk(b"IEND", b"")


CATEGORY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#bab0ac")


def waste_svg(systems: list[Waste], title: str) -> str:
    """Stacked bars, 0-100 %, one per system; each segment labelled with its share."""
    bar, gap, left, top, plot_h = 90, 40, 60, 50, 300
    width = left + len(systems) * (bar + gap) + 190
    height = top + plot_h + 60
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for pct in range(0, 101, 20):
        y = top + plot_h - plot_h * pct / 100
        out.append(f'<line x1="{left - 4}" y1="{y}" x2="{left + len(systems) * (bar + gap)}" y2="{y}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y + 4}" text-anchor="end">{pct}%</text>')
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
