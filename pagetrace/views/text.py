"""Rich renderings of a token's lookup (used by `lookup` and by `run --token`)."""

from __future__ import annotations

from copy import copy
from dataclasses import replace

from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..paging.layouts import VectorAddress, runs_text
from ..paging.lookup import TokenTrace

HIGHLIGHT = "bold black on yellow"


STRIP_ENTRIES = 12  # a longer table shows its start, its end and the highlighted entry


def strip_priority(n: int, highlight: int | None) -> list[int]:
    """Entries of an n-entry table, most wanted first: the highlighted one and its
    neighbours, then the two ends inwards."""
    order: list[int] = []
    if highlight is not None:
        order += [b for b in (highlight, highlight - 1, highlight + 1) if 0 <= b < n]
    for i in range(n):
        order += [i, n - 1 - i]
    return list(dict.fromkeys(order))


def strip_columns(table: list[int], shown: list[int]) -> list[tuple[str, str]]:
    """(header, cell) per column: the shown entries, with an 'N more' column in each gap."""
    columns: list[tuple[str, str]] = []
    previous = -1
    for logical in shown:
        if logical != previous + 1:
            columns.append(("…", f"{logical - previous - 1} more"))
        columns.append((str(logical), str(table[logical])))
        previous = logical
    if previous != len(table) - 1:
        columns.append(("…", f"{len(table) - 1 - previous} more"))
    return columns


class BlockTableStrip:
    """The block table as one row of logical -> physical entries, one entry highlighted.

    It fits the width it is rendered at by leaving out whole entries (an 'N more'
    column stands for them), never by cutting a block number."""

    def __init__(self, table: list[int], highlight: int | None, title: str) -> None:
        self.table, self.highlight, self.title = table, highlight, title

    def shown(self, width: int) -> list[int]:
        n = len(self.table)
        priority = strip_priority(n, self.highlight)[:STRIP_ENTRIES]
        for count in range(len(priority), 0, -1):
            shown = sorted(priority[:count])
            columns = [("logical", "physical"), *strip_columns(self.table, shown)]
            if sum(max(len(a), len(b)) + 2 for a, b in columns) <= width:
                return shown
        return sorted(priority[:1])

    def __rich_console__(self, console, options):
        shown = self.shown(options.max_width)
        strip = Table(title=self.title, title_justify="left", show_header=True, header_style="dim", box=None, padding=(0, 1))
        strip.add_column("logical", style="dim", justify="right", no_wrap=True)
        cells: list[Text] = []
        for header, cell in strip_columns(self.table, shown):
            strip.add_column(header, justify="center" if header == "…" else "right", no_wrap=True, min_width=max(len(header), len(cell)))
            highlighted = header != "…" and int(header) == self.highlight
            cells.append(Text(cell, style=HIGHLIGHT if highlighted else "dim" if header == "…" else ""))
        strip.add_row("physical", *cells)
        yield strip


def block_table_strip(table: list[int], highlight: int | None, title: str = "block table") -> BlockTableStrip:
    return BlockTableStrip(table, highlight, title)


def _offset_sum(addr: VectorAddress) -> str:
    terms = [f"{i}×{s}" for i, s in zip(addr.index, addr.strides) if i]
    return " + ".join(terms) if terms else "0"


def header(t: Table, name: str, **options) -> None:
    """A column whose header is never cut: at least as wide as the longest word of its name
    (a header of two words may wrap between them; the cells wrap)."""
    t.add_column(name, min_width=max((len(word) for word in name.split()), default=0), **options)


UNBOUNDED = 100_000  # a width no table here reaches: Rich measures a table at most as wide as it is given


class Fitted:
    """A table that fits the terminal whenever its columns' minimum widths do.

    Rich narrows a table wider than the terminal by taking its widest wrappable columns down
    evenly, past a column's `min_width` (`header`'s), which it then restores: the table comes
    out wider than the terminal and the console cuts its last columns off (`simulate`'s waste
    table at 80 columns lost "peak run"). Here each column gets its minimum width and the
    width left over goes to the columns that want more, the least wanting first."""

    def __init__(self, table: Table) -> None:
        self.table = table

    def __rich_console__(self, console, options):
        table = self.table
        unbounded = options.update_width(UNBOUNDED)
        overall = Measurement.get(console, unbounded, table).maximum  # Rich's measure never exceeds the width it is given
        if overall <= options.max_width:
            yield table
            return
        lows, highs = [], []
        for column in table.columns:
            sizes = [Measurement.get(console, unbounded, cell) for cell in (column.header, *column.cells)]
            low = max(column.min_width or 0, *(m.minimum for m in sizes))
            high = max(low, *(m.maximum for m in sizes))
            lows.append(high if column.no_wrap else low)
            highs.append(high)
        room = options.max_width - (overall - sum(highs))  # less the borders and padding
        if sum(lows) > room:  # nothing fits: Rich's own narrowing
            yield table
            return
        widths, spare = list(lows), room - sum(lows)
        order = sorted(range(len(widths)), key=lambda i: highs[i] - lows[i])
        for k, i in enumerate(order):
            grant = min(highs[i] - lows[i], spare // (len(order) - k))
            widths[i] += grant
            spare -= grant
        fitted = copy(table)
        fitted.columns = [replace(c, width=w) for c, w in zip(table.columns, widths)]
        yield fitted


def vector_in_memory(addr: VectorAddress) -> str:
    """How the head_dim elements of one vector lie: one run, chunks a fixed stride apart, or groups of them."""
    return runs_text([(c.element_offset, c.elements) for c in addr.chunks], addr.element_size)


def address_table(trace: TokenTrace) -> Table:
    g = trace.geometry
    table = Table(title=f"addresses in the '{g.layout.name}' layout ({g.dtype}, {g.element_size} bytes/element)", title_justify="left")
    rows = []
    for addr in (trace.key, trace.value):
        shape = ", ".join(f"{a}={n}" for a, n in zip(addr.axes, addr.shape))
        index = ", ".join(map(str, addr.index))
        rows.append((addr.which, f"[{shape}]", f"({index}): {_offset_sum(addr)}", str(addr.element_offset), str(addr.byte_offset)))
    headers = ("cache", "shape", "index: Σ index×stride", "element", "byte")
    for i, header in enumerate(headers):
        # wide enough for the longest word of the column: numbers wrap between words, never inside one
        longest = max(len(word) for row in rows for word in row[i].split())
        table.add_column(header, justify="right" if header in ("element", "byte") else "left", min_width=longest, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    # how each vector lies in memory, as wrapped text below the table (a sixth column would not fit 80 columns)
    memory = Table(show_header=False, box=None, padding=(0, 1))
    memory.add_column(style="bold", no_wrap=True)
    memory.add_column()
    for addr in (trace.key, trace.value):
        memory.add_row(f"{addr.which} in memory", vector_in_memory(addr))
    return Group(table, memory)


def render_lookup(trace: TokenTrace) -> Group:
    g = trace.geometry
    loc = trace.location
    t, bs = loc.token, g.block_size
    steps = Table(show_header=False, box=None, padding=(0, 1))
    steps.add_column(style="bold cyan")
    steps.add_column()
    steps.add_row("1", f"logical block = {t} // {bs} = [bold]{loc.logical_block}[/]    offset = {t} % {bs} = [bold]{loc.offset}[/]")
    steps.add_row("2", f"physical block = block_table[{loc.logical_block}] = [bold]{loc.physical_block}[/]")
    steps.add_row("3", f"slot = {loc.physical_block} × {bs} + {loc.offset} = [bold]{loc.slot}[/]")
    for addr in (trace.key, trace.value):
        steps.add_row(
            "",
            f"{addr.which} at element [bold]{addr.element_offset}[/] = block {loc.physical_block} base {addr.block_base}"
            f" + {addr.element_offset - addr.block_base}; byte [bold]{addr.byte_offset}[/]",
        )
    steps.add_row("4", f"score = q · k[{t}] / √{g.head_dim} (× {trace.scale:.6g}); softmax over all scores; output = Σ weight × v")
    head = f" · KV head {trace.head} of {g.num_kv_heads}" if g.num_kv_heads > 1 else ""
    title = f"[bold]token {t}[/] · block size {bs} · head_dim {g.head_dim}{head} · {g.dtype} · pool of {g.num_blocks} blocks"
    return Group(Text.from_markup(title), steps, block_table_strip(trace.table, loc.logical_block), address_table(trace))
