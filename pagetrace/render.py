"""Rich renderings of a token's lookup (used by `lookup` and by `run --token`)."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .layouts import VectorAddress
from .lookup import TokenTrace

HIGHLIGHT = "bold black on yellow"


STRIP_ENTRIES = 12  # a longer table shows its start, its end and the highlighted entry


def block_table_strip(table: list[int], highlight: int | None, title: str = "block table") -> Table:
    """The block table as one row of logical -> physical entries, one entry highlighted."""
    n = len(table)
    shown = set(range(n)) if n <= STRIP_ENTRIES else set(range(3)) | set(range(n - 3, n))
    if highlight is not None:
        shown |= {b for b in (highlight - 1, highlight, highlight + 1) if 0 <= b < n}
    strip = Table(title=title, title_justify="left", show_header=True, header_style="dim", box=None, padding=(0, 1))
    strip.add_column("logical", style="dim", justify="right")
    cells: list[Text] = []
    previous = -1
    for logical in sorted(shown):
        if logical != previous + 1:
            strip.add_column("…", justify="center")
            cells.append(Text(f"{logical - previous - 1} more", style="dim"))
        strip.add_column(str(logical), justify="right")
        cells.append(Text(str(table[logical]), style=HIGHLIGHT if logical == highlight else ""))
        previous = logical
    strip.add_row("physical", *cells)
    return strip


def _offset_sum(addr: VectorAddress) -> str:
    terms = [f"{i}×{s}" for i, s in zip(addr.index, addr.strides) if i]
    return " + ".join(terms) if terms else "0"


def vector_in_memory(addr: VectorAddress) -> str:
    """How the head_dim elements of one vector lie: one run, or chunks a fixed stride apart."""
    if addr.contiguous:
        return f"contiguous, {addr.chunks[0].elements} elements"
    n, size = len(addr.chunks), addr.chunks[0].elements
    what = f"{n} chunks of {size} elements" if size > 1 else f"{n} single elements"
    starts = ", ".join(str(c.element_offset) for c in addr.chunks[:4]) + (", ..." if n > 4 else "")
    return f"{what}, {addr.chunk_stride} elements ({addr.chunk_stride * addr.element_size} bytes) apart, at {starts}"


def address_table(trace: TokenTrace) -> Table:
    g = trace.geometry
    table = Table(title=f"addresses in the '{g.layout.name}' layout ({g.dtype}, {g.element_size} bytes/element)", title_justify="left")
    table.add_column("cache")
    table.add_column("shape")
    table.add_column("index: Σ index×stride")
    table.add_column("element", justify="right")
    table.add_column("byte", justify="right")
    table.add_column("the vector in memory", ratio=1)
    for addr in (trace.key, trace.value):
        shape = ", ".join(f"{a}={n}" for a, n in zip(addr.axes, addr.shape))
        table.add_row(
            addr.which,
            Text(f"[{shape}]"),
            Text(f"{tuple(addr.index)}: {_offset_sum(addr)}"),
            str(addr.element_offset),
            str(addr.byte_offset),
            vector_in_memory(addr),
        )
    return table


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
