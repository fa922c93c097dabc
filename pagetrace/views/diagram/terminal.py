"""The block mapping in the terminal: each drawn sequence as a strip of logical -> physical
cells, then the pool as a strip of characters coloured by sequence.

What `lookup` and `run` print without file options. It loads Rich, never Graphviz.
"""

from __future__ import annotations

from .cells import layout_cells
from .model import Cells, MappingView
from .style import OTHERS_EDGE, SHARED_FILL, drawn_colours, percent, span

TERMINAL_SEQ_CELLS = 10
POOL_STRIP_BLOCKS = 256  # pools up to this size: one character per block
POOL_STRIP_WIDTH = 64


def terminal_mapping(view: MappingView):
    """A compact Rich rendering: each sequence's table as a strip of logical -> physical
    cells (runs collapsed, long tables elided, the traced block highlighted), then the pool
    as a strip of characters coloured by sequence."""
    from rich.console import Group
    from rich.text import Text

    from ..text import HIGHLIGHT

    cells = layout_cells(view, max_seq_cells=TERMINAL_SEQ_CELLS)
    parts: list = []
    for s in cells.drawn:
        seq, seq_cells = view.sequences[s], cells.sequences[s]
        edge, _ = drawn_colours(cells.drawn, s)
        n = cells.needed[s]
        parts.append(Text.assemble((seq.name, f"bold {edge}"), f" · {seq.seq_len} tokens in {n} block{'s' * (n != 1)} of {view.block_size}"))
        rows: dict[str, list[Text]] = {"logical": [], "physical": [], "tokens": []}
        if seq.attention_mass is not None:
            rows["attn"] = []
        for c in seq_cells:
            style = HIGHLIGHT if c.traced else ("dim" if c.elided else "")
            full = f" ({c.fill}/{view.block_size})" if c.fill < view.block_size else ""
            rows["logical"].append(Text(span(c.first, c.last), style=style))
            physical = "…" if c.elided else span(c.physical, c.physical + c.blocks - 1)
            rows["physical"].append(Text(physical, style=style or edge))
            rows["tokens"].append(Text(span(c.first_token, c.last_token) + full, style=style))
            if c.mass is not None:
                rows["attn"].append(Text(percent(c.mass), style=style))
        parts.append(_Strip(rows))
    h = cells.hidden
    if h is not None:
        shared = f", {h.shared} of them sharing blocks" if h.shared else ""
        parts.append(Text(f"… {h.count} more sequences · {h.tokens} tokens in {h.blocks} blocks{shared}", style="dim"))
    parts.append(_pool_strip(cells, Text, HIGHLIGHT))
    return Group(*parts)


class _Strip:
    """A sequence's rows (logical, physical, tokens, attn) of cells, one column per cell,
    wrapped at whole cells to the console's width: a number is never cut."""

    def __init__(self, rows: dict):
        self.rows = rows

    def __rich_console__(self, console, options):
        from rich.text import Text

        names = list(self.rows)
        columns = list(zip(*self.rows.values()))
        label = max(len(name) for name in names)
        widths = [max(text.cell_len for text in column) for column in columns]
        chunks: list[list[int]] = [[]]
        used = label
        for i, w in enumerate(widths):  # each column takes its width and one space before it
            if chunks[-1] and used + 1 + w > options.max_width:
                chunks.append([])
                used = label
            chunks[-1].append(i)
            used += 1 + w
        for chunk in chunks:
            for r, name in enumerate(names):
                line = Text(no_wrap=True, overflow="ignore")
                line.append(name.rjust(label), style="dim")
                for i in chunk:
                    text = columns[i][r]
                    line.append(" " * (1 + widths[i] - text.cell_len))
                    line.append_text(text)
                yield line


def _pool_strip(cells: Cells, Text, highlight: str):
    """One character per block (or per bucket of blocks in a big pool)."""
    view = cells.view
    bucket = -(-view.num_blocks // POOL_STRIP_BLOCKS) if view.num_blocks > POOL_STRIP_BLOCKS else 1
    traced = cells.traced.physical if cells.traced is not None else None
    free = view.num_blocks - cells.used_blocks
    out = Text(f"pool · {view.num_blocks} blocks · {cells.used_blocks} used · {free} free", style="bold")
    if cells.shared_blocks:
        out.append(f" · {cells.shared_blocks} shared", style="bold")
    if bucket > 1:
        out.append(f"  (1 character = {bucket} blocks)", style="dim")
    chars_per_row = POOL_STRIP_WIDTH
    width = max(6, len(str(view.num_blocks - 1)))  # row labels: the first block of each row
    for i, start in enumerate(range(0, view.num_blocks, bucket)):
        if i % chars_per_row == 0:
            out.append(f"\n{start:>{width}} ", style="dim")
        stop = min(start + bucket, view.num_blocks)
        # the owners of this bucket's used blocks, found by bisection: free blocks cost nothing
        owners = cells.owners.owner_counts(start, stop)
        out.append(*_pool_char(stop - start, owners, traced is not None and start <= traced < stop, highlight, cells.drawn))
    out.append("\n" + " " * (width + 1))
    for s in cells.drawn:
        out.append("■", style=drawn_colours(cells.drawn, s)[0])
        out.append(f" {view.sequences[s].name}  ")
    if cells.hidden is not None:
        out.append("■", style=OTHERS_EDGE)
        out.append(f" {cells.hidden.count} others  ")
    if cells.shared_blocks:
        out.append("2", style=f"bold {SHARED_FILL}")
        out.append(" shared (the digit is the ref count)  ")
    if free:
        out.append("·", style="dim")
        out.append(" free")
    return out


def _pool_char(blocks: int, owners: dict[tuple[int, ...], int], traced: bool, highlight: str, drawn: list[int]) -> tuple[str, str]:
    """The character for `blocks` blocks, `owners` counting the used ones by their owners."""
    if not owners:
        char, style = "·", "dim"
    else:
        used = sum(owners.values())
        key = max(sorted(owners), key=owners.__getitem__)  # the commonest owners; ties: the first
        if blocks == 1:
            char = "■" if len(key) == 1 else (str(len(key)) if len(key) < 10 else "+")
        else:
            char = "█" if used == blocks else ("▓" if 2 * used >= blocks else "░")
        if len(key) > 1:
            style = f"bold {SHARED_FILL}"
        else:
            style = drawn_colours(drawn, key[0])[0]
    if traced:
        style = highlight
    return char, style
