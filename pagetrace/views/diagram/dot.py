"""The block mapping as Graphviz DOT: HTML-like labels, one port per cell.

`build_graph` draws the `Cells` of a view: sequences left (the drawn ones, and one cell
summing up the others), the pool right, one arrow per drawn logical cell. Importing this
module loads no Graphviz; `build_graph` does.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .cells import layout_cells
from .model import Cells, LogicalCell, MappingView, PoolCell
from .style import (
    EMPTY_SLOT,
    FONT,
    FREE_FILL,
    FREE_TEXT,
    MASKED_FILL,
    MASKED_TEXT,
    MASS_DARK_FROM,
    MASS_FILL,
    MIXED_FILL,
    OTHERS_FILL,
    SHARED_FILL,
    SHARED_SLOT,
    SLOTS_PER_ROW,
    TRACE,
    drawn_colours,
    mass_class,
    percent,
    span,
)

if TYPE_CHECKING:
    import graphviz

MAX_NAMED = 8  # a tooltip names this many owners of a block, then counts the rest


def logical_tooltip(cell: LogicalCell, cells: Cells) -> str:
    view = cells.view
    name = view.sequences[cell.seq].name
    bs = view.block_size
    tokens = f"tokens {span(cell.first_token, cell.last_token)}"
    if cell.elided:
        text = f"{name}: logical blocks {span(cell.first, cell.last)} ({cell.blocks}) not drawn; {tokens}"
    elif cell.blocks == 1:
        text = f"{name}: logical block {cell.first} -> physical block {cell.physical}; {tokens} ({cell.fill}/{bs})"
    else:
        text = f"{name}: logical blocks {span(cell.first, cell.last)} -> physical blocks {span(cell.physical, cell.physical + cell.blocks - 1)}; {tokens}"
    if cell.mass is not None:
        text += f"; attention mass {cell.mass:.4f}"
    if cell.masked:
        text += f"; {cell.masked} of its {cell.tokens} keys masked for the shown query ({cell.causal} causal, {cell.window} window)"
    if cell.traced and cells.traced is not None:
        t = cells.traced
        text += f"; traced token {t.token} at offset {t.offset}"
    return text


def pool_tooltip(cell: PoolCell, cells: Cells) -> str:
    view = cells.view
    names = ", ".join(view.sequences[s].name for s in cell.owners[:MAX_NAMED])
    if len(cell.owners) > MAX_NAMED:
        names += f" and {len(cell.owners) - MAX_NAMED} more"
    where = f"physical block {cell.first}" if cell.blocks == 1 else f"physical blocks {span(cell.first, cell.last)} ({cell.blocks})"
    kind = cell.kind
    if kind == "free":
        return f"{where}: free"
    if kind == "mixed":
        return f"{where}: {cell.used} used, {cell.blocks - cell.used} free; no arrow points here"
    text = f"{where}: {names}" + (f" (shared, ref count {len(cell.owners)})" if kind == "shared" else "")
    if cell.fill is not None:
        text += f"; {cell.fill} of {view.block_size} slots hold tokens"
    if cell.traced_slot is not None:
        t = cells.traced
        text += f"; traced token {t.token} in slot {t.offset} (flat slot {cell.first * view.block_size + t.offset})"
    return text


# -- Graphviz -------------------------------------------------------------------


def _attrs(**attrs: object) -> str:
    return "".join(f' {k}="{html.escape(str(v), quote=True)}"' for k, v in attrs.items() if v is not None)


def _td(content: str, **attrs: object) -> str:
    return f"<td{_attrs(**attrs)}>{content}</td>"


def _text(text: str, size: int | None = None, colour: str | None = None, bold: bool = False) -> str:
    out = html.escape(text)
    if bold:
        out = f"<b>{out}</b>"
    if size is not None or colour is not None:
        out = f"<font{_attrs(**{'point-size': size, 'color': colour})}>{out}</font>"
    return out


def _table(rows: list[str], **attrs: object) -> str:
    base = {"border": 0, "cellborder": 1, "cellspacing": 0, "cellpadding": 4}
    base.update(attrs)
    return f"<table{_attrs(**base)}>" + "".join(f"<tr>{row}</tr>" for row in rows) + "</table>"


def _sequence_label(s: int, cells: Cells) -> str:
    view = cells.view
    seq = view.sequences[s]
    edge, _ = drawn_colours(cells.drawn, s)
    n = cells.needed[s]
    head = _td(
        _text(seq.name, bold=True, colour="white") + "<br/>" + _text(f"{seq.seq_len} tokens, {n} block{'s' * (n != 1)}", 9, "white"),
        bgcolor=edge,
    )
    rows = [head] + [_logical_td(c, cells) for c in cells.sequences[s]]
    return "<" + _table(rows, id=f"seq{s}_table") + ">"


def _others_label(cells: Cells) -> str:
    """The sequences not drawn, summed up in one cell: how many, their tokens and blocks."""
    h = cells.hidden
    lines = [
        _text(f"{h.count} more sequence{'s' * (h.count != 1)}", bold=True),
        _text(f"{h.tokens} tokens in {h.blocks} blocks", 9),
        _text(f"{h.shared} of them share blocks" if h.shared else "none shares a block", 9),
    ]
    title = f"{h.count} sequences not drawn: {h.tokens} tokens, {h.blocks} logical blocks; {h.shared} share a block with another sequence"
    return "<" + _table([_td("<br/>".join(lines), bgcolor=MIXED_FILL, style="dashed", title=title)], id="others_table") + ">"


def _logical_td(cell: LogicalCell, cells: Cells) -> str:
    view = cells.view
    bs = view.block_size
    _, fill = drawn_colours(cells.drawn, cell.seq)
    text_colour = None
    if cell.mass is not None and cells.max_block_mass is not None:
        shade = mass_class(cell.mass / cell.blocks, cells.max_block_mass)
        fill = MASS_FILL[shade]
        text_colour = "white" if shade >= MASS_DARK_FROM else None
    tokens = span(cell.first_token, cell.last_token)
    if cell.elided:
        lines = [_text(f"... {cell.blocks} blocks not drawn", 10, FREE_TEXT), _text(f"tokens {tokens}", 9, FREE_TEXT)]
        fill = "white" if cell.mass is None else fill
    elif cell.blocks == 1:
        full = f" ({cell.fill}/{bs})" if cell.fill < bs else ""
        lines = [_text(f"L{cell.first}", bold=True, colour=text_colour), _text(f"tokens {tokens}{full}", 9, text_colour)]
    else:
        phys = span(cell.physical, cell.physical + cell.blocks - 1)
        lines = [
            _text(f"L{span(cell.first, cell.last)}", bold=True, colour=text_colour),
            _text(f"tokens {tokens}", 9, text_colour),
            _text(f"-> blocks {phys}", 9, text_colour),
        ]
    if cell.masked == cell.tokens:  # the shown query sees none of these keys (their mass is 0: light text already)
        fill, what = MASKED_FILL, ("causal" if not cell.window else "window" if not cell.causal else "causal+window")
        lines.append(_text(f"masked ({what})", 9, MASKED_TEXT))
    else:
        if cell.mass is not None:
            lines.append(_text(f"attn {percent(cell.mass)}", 9, text_colour))
        if cell.masked:
            lines.append(_text(f"{cell.masked} masked", 9, text_colour))
    return _td(
        "<br/>".join(lines),
        port=cell.port,
        id=f"s{cell.seq}_{cell.port}",
        title=logical_tooltip(cell, cells),
        bgcolor=fill,
        border=3 if cell.traced else None,
        color=TRACE if cell.traced else None,
        style="dashed" if cell.elided else None,
    )


def _pool_label(cells: Cells) -> str:
    view = cells.view
    free = view.num_blocks - cells.used_blocks
    shared = f", {cells.shared_blocks} shared" if cells.shared_blocks else ""
    head = _td(
        _text("physical pool", bold=True) + "<br/>" + _text(f"{view.num_blocks} blocks: {cells.used_blocks} used, {free} free{shared}", 9),
        bgcolor="#dddddd",
    )
    return "<" + _table([head] + [_pool_td(c, cells) for c in cells.pool], id="pool_table") + ">"


def _pool_fill(cell: PoolCell, drawn: list[int]) -> str:
    return {"free": FREE_FILL, "mixed": MIXED_FILL, "shared": SHARED_FILL}.get(cell.kind) or drawn_colours(drawn, cell.owners[0])[1]


def _pool_td(cell: PoolCell, cells: Cells) -> str:
    kind = cell.kind
    blocks = span(cell.first, cell.last)
    if kind == "free":
        caption = _text(blocks if cell.blocks == 1 else f"blocks {blocks} free ({cell.blocks})", 10, FREE_TEXT)
    elif kind == "mixed":
        caption = _text(f"blocks {blocks}", 10) + "<br/>" + _text(f"{cell.used} used, {cell.blocks - cell.used} free", 9)
    else:
        who = f"ref {len(cell.owners)}" if kind == "shared" else cells.view.sequences[cell.owners[0]].name
        caption = _text(blocks if cell.blocks == 1 else f"blocks {blocks}", bold=True) + "  " + _text(who if cell.blocks == 1 else f"{who} ({cell.blocks})", 9)
    traced = cell.traced_slot is not None
    if cells.slots and cell.fill is not None:
        content = _table(["<td>" + caption + "</td>", "<td>" + _slots(cell, cells) + "</td>"], cellborder=0, cellpadding=1)
    else:
        content = caption
    return _td(
        content,
        port=cell.port,
        id=cell.port,
        title=pool_tooltip(cell, cells),
        bgcolor=_pool_fill(cell, cells.drawn),
        border=3 if traced else (2 if kind == "shared" else None),
        color=TRACE if traced else None,
    )


def _slots(cell: PoolCell, cells: Cells) -> str:
    """The block's slots: those that hold tokens filled, the traced one in the trace colour."""
    bs = cells.view.block_size
    filled = SHARED_SLOT if cell.kind == "shared" else drawn_colours(cells.drawn, cell.owners[0])[0]
    tds = []
    for offset in range(bs):
        if offset == cell.traced_slot:
            t = cells.traced
            tds.append(_td("", bgcolor=TRACE, width=7, height=7, id=f"p{cell.first}_slot{offset}", title=f"slot {offset}: token {t.token}"))
        else:
            tds.append(_td("", bgcolor=filled if offset < cell.fill else EMPTY_SLOT, width=7, height=7))
    rows = ["".join(tds[i : i + SLOTS_PER_ROW]) for i in range(0, bs, SLOTS_PER_ROW)]
    return _table(rows, cellborder=1, cellspacing=1, cellpadding=0, color="#777777")


def _legend_label(cells: Cells) -> str:
    view = cells.view
    swatch = lambda colour, **kw: _td("", bgcolor=colour, width=14, height=10, **kw)  # noqa: E731
    rows = [_td(_text("legend", bold=True), colspan=2, align="left")]
    for s in cells.drawn:
        rows.append(swatch(drawn_colours(cells.drawn, s)[1]) + _td(_text(view.sequences[s].name, 9), align="left"))
    if cells.hidden:  # their pool blocks are grey: say so, or they read as free
        h = cells.hidden
        rows.append(swatch(OTHERS_FILL) + _td(_text(f"blocks of the {h.count} sequences not drawn", 9), align="left"))
    if cells.shared_blocks:
        rows.append(swatch(SHARED_FILL, border=2) + _td(_text("shared by several sequences (ref count)", 9), align="left"))
    if cells.used_blocks < view.num_blocks:
        rows.append(swatch(FREE_FILL) + _td(_text("free", 9, FREE_TEXT), align="left"))
    if any(c.kind == "mixed" for c in cells.pool):
        rows.append(swatch(MIXED_FILL, border=1) + _td(_text("blocks no arrow points to, summed up", 9), align="left"))
    if cells.traced is not None:
        rows.append(swatch("white", border=3, color=TRACE) + _td(_text(f"traced token {cells.traced.token}", 9), align="left"))
    if any(c.masked for cells_of_seq in cells.sequences for c in cells_of_seq):
        rows.append(swatch(MASKED_FILL, border=1) + _td(_text("keys the shown query does not see (causal mask, sliding window)", 9, MASKED_TEXT), align="left"))
    if cells.max_block_mass is not None:
        top = cells.max_block_mass
        rows.append(_td(_text("attention mass per logical block (sum of its tokens' weights)", 9), colspan=2, align="left"))
        scale = _td(_text("0%", 9)) + "".join(swatch(colour, border=1) for colour in MASS_FILL) + _td(_text(percent(top), 9))
        rows.append(_td(_table([scale], cellborder=0, cellspacing=0, cellpadding=1), colspan=2, align="left"))
    return "<" + _table(rows, cellborder=0, cellspacing=2, cellpadding=1, id="legend_table") + ">"


def _title(cells: Cells) -> str:
    view = cells.view
    n = len(view.sequences)
    drawn = f" ({len(cells.drawn)} drawn)" if cells.hidden is not None else ""
    text = f"block mapping: {n} sequence{'s' * (n != 1)}{drawn}, block size {view.block_size}, pool of {view.num_blocks} blocks"
    t = cells.traced
    if t is not None:
        bs = view.block_size
        text += (
            f"\\ltoken {t.token} of {view.sequences[t.seq].name}: logical block {t.token} // {bs} = {t.logical},"
            f" offset {t.token} % {bs} = {t.offset} -> physical block {t.physical}, slot {t.physical} x {bs} + {t.offset} = {t.physical * bs + t.offset}"
        )
    return text + "\\l"


def build_graph(view: MappingView) -> graphviz.Digraph:
    """The block mapping as a Graphviz digraph: sequences left, the pool right, one arrow
    per drawn logical cell. Node and port names: seq<S>:l<i> (or l<i>_<j> for a run),
    pool:p<b> (or p<b>_<c>); every cell's SVG id is that port name with `a_` in front."""
    import graphviz

    cells = layout_cells(view)
    g = _digraph_class()(
        "pagetrace",
        graph_attr={
            "rankdir": "LR",
            "nodesep": "0.25",
            "ranksep": "1.4",
            "fontname": FONT,
            "fontsize": "12",
            "label": _title(cells),
            "labelloc": "t",
            "labeljust": "l",
        },
        node_attr={"shape": "plain", "fontname": FONT, "fontsize": "11"},
        edge_attr={"arrowsize": "0.6", "penwidth": "1.2"},
    )
    left = [f"seq{s}" for s in cells.drawn] + (["others"] if cells.hidden else []) + ["legend"]
    with g.subgraph(name="sequences") as sub:
        sub.attr(rank="same")
        for s in cells.drawn:
            sub.node(f"seq{s}", label=_sequence_label(s, cells), id=f"seq{s}")
        if cells.hidden is not None:
            sub.node("others", label=_others_label(cells), id="others")
        sub.node("legend", label=_legend_label(cells), id="legend")
        for above, below in zip(left, left[1:]):  # keep the sequences in order, top to bottom
            sub.edge(above, below, style="invis")
    g.node("pool", label=_pool_label(cells), id="pool")
    for cell, target in cells.edges:
        colour, _ = drawn_colours(cells.drawn, cell.seq)
        attrs = {"id": f"e_s{cell.seq}_{cell.port}", "color": colour, "tooltip": logical_tooltip(cell, cells)}
        if cell.traced:
            attrs.update({"color": TRACE, "penwidth": "3", "class": "traced"})
        g.edge(f"seq{cell.seq}:{cell.port}:e", f"pool:{target.port}:w", **attrs)
    return g


def _digraph_class():
    """graphviz.Digraph, shown in a notebook through pagetrace's engines (the system's dot, else
    graphviz-pure): graphviz's own display runs `dot` and fails where only graphviz-pure is."""
    global _Digraph
    if _Digraph is None:
        import graphviz

        class Digraph(graphviz.Digraph):
            def _repr_mimebundle_(self, include=None, exclude=None, **_):
                from ..notebook import digraph_mimebundle

                return digraph_mimebundle(self)

        _Digraph = Digraph
    return _Digraph


_Digraph = None


def dot_source(view: MappingView) -> str:
    return build_graph(view).source
