"""Block-mapping diagrams: each sequence's logical blocks, arrows to the physical pool.

A `MappingView` says what to draw: the sequences with their block tables, the pool,
optionally one traced token and each logical block's attention mass. `layout_cells`
turns it into the cells that are drawn, and every rendering uses those cells:

    build_graph, dot_source   Graphviz DOT with HTML-like labels, one port per cell
    write_diagrams            SVG, PNG and DOT files, rendered by `find_engine()`
    check_output_paths        the file options, refused up front (before a long run)
    terminal_mapping          a compact Rich rendering for the terminal

Big inputs stay readable: in a big pool, runs of free blocks and runs of consecutive
logical blocks that map to consecutive physical blocks become one cell each; the middle
of a very long table is elided; and unreferenced stretches of a long pool are summed
up in one cell. The traced block and each sequence's last block always get a cell of
their own, so the traced path and how full a sequence's tail is stay exact.

Labels are ASCII on purpose: Graphviz measures text with per-font width tables, and
non-ASCII characters would be measured (and so laid out) differently by each engine.

The cells model lives in `diagram_cells` and is imported from here. Importing this module
loads no torch, Graphviz or subprocess; they are loaded when a diagram is rendered.
"""

from __future__ import annotations

import html
import math
import os
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .diagram_cells import (  # the cells model, public from here
    AUTO_SLOTS_BLOCK_SIZE,
    MAX_POOL_CELLS,
    MAX_SEQ_CELLS,
    MAX_SLOTS_BLOCK_SIZE,
    SEQ_TAIL_CELLS,
    SMALL,
    Cells,
    LogicalCell,
    MappingView,
    PoolCell,
    SequenceMap,
    Traced,
    UsedBlocks,
    block_mass,
    check_view,
    layout_cells,
)
from .errors import RuntimeFailure, UsageError

if TYPE_CHECKING:
    import graphviz

__all__ = [  # the public API, the cells model (diagram_cells) included
    "Cells", "LogicalCell", "MappingView", "PoolCell", "SequenceMap", "Traced", "block_mass", "build_graph",
    "check_output_paths", "check_view", "dot_source", "engine_candidates", "find_engine",
    "graphviz_pure_engine", "layout_cells", "logical_tooltip", "mass_class", "pool_tooltip", "render",
    "terminal_mapping", "UsedBlocks", "write_diagrams", "write_files",
    "AUTO_SLOTS_BLOCK_SIZE", "EMPTY_SLOT", "FONT", "FREE_FILL", "FREE_TEXT", "MASS_DARK_FROM", "MASS_FILL",
    "MAX_POOL_CELLS", "MAX_SEQ_CELLS", "MAX_SLOTS_BLOCK_SIZE", "MIXED_FILL", "PNG_DPI", "POOL_STRIP_BLOCKS",
    "POOL_STRIP_WIDTH", "RENDER_TIMEOUT_S", "SEQ_EDGE", "SEQ_FILL", "SEQ_TAIL_CELLS", "SHARED_FILL",
    "SHARED_SLOT", "SLOTS_PER_ROW", "SMALL", "TERMINAL_SEQ_CELLS", "TRACE",
]

# -- how it looks -------------------------------------------------------------

FONT = "Helvetica"
TRACE = "#d62728"  # the traced token's path: borders, arrow, slot
SEQ_EDGE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
SEQ_FILL = ["#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d"]
SHARED_FILL = "#d4b9da"
SHARED_SLOT = "#88419d"  # a shared block's slots that hold tokens
FREE_FILL = "#f0f0f0"
FREE_TEXT = "#9a9a9a"
MIXED_FILL = "#ffffff"
EMPTY_SLOT = "#ffffff"
# ColorBrewer "Blues", 9 classes: attention mass per block, low to high
MASS_FILL = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
MASS_DARK_FROM = 6  # classes from here on get white text
PNG_DPI = 144
RENDER_TIMEOUT_S = 120
SLOTS_PER_ROW = 16


# -- labels ---------------------------------------------------------------------


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def _percent(mass: float) -> str:
    if 0 < mass < 0.001:
        return "<0.1%"
    return f"{mass:.1%}"


def _seq_colours(s: int) -> tuple[str, str]:
    return SEQ_EDGE[s % len(SEQ_EDGE)], SEQ_FILL[s % len(SEQ_FILL)]


def mass_class(mass_per_block: float, max_block_mass: float) -> int:
    """Which of the 9 shades a block (or the mean block of a run) gets; NaN gets none."""
    if not (math.isfinite(mass_per_block) and math.isfinite(max_block_mass)) or max_block_mass <= 0:
        return 0
    return max(0, min(len(MASS_FILL) - 1, int(mass_per_block / max_block_mass * len(MASS_FILL))))


def logical_tooltip(cell: LogicalCell, cells: Cells) -> str:
    view = cells.view
    name = view.sequences[cell.seq].name
    bs = view.block_size
    tokens = f"tokens {_span(cell.first_token, cell.last_token)}"
    if cell.elided:
        text = f"{name}: logical blocks {_span(cell.first, cell.last)} ({cell.blocks}) not drawn; {tokens}"
    elif cell.blocks == 1:
        text = f"{name}: logical block {cell.first} -> physical block {cell.physical}; {tokens} ({cell.fill}/{bs})"
    else:
        text = f"{name}: logical blocks {_span(cell.first, cell.last)} -> physical blocks {_span(cell.physical, cell.physical + cell.blocks - 1)}; {tokens}"
    if cell.mass is not None:
        text += f"; attention mass {cell.mass:.4f}"
    if cell.traced and cells.traced is not None:
        t = cells.traced
        text += f"; traced token {t.token} at offset {t.offset}"
    return text


def pool_tooltip(cell: PoolCell, cells: Cells) -> str:
    view = cells.view
    names = ", ".join(view.sequences[s].name for s in cell.owners)
    where = f"physical block {cell.first}" if cell.blocks == 1 else f"physical blocks {_span(cell.first, cell.last)} ({cell.blocks})"
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
    edge, _ = _seq_colours(s)
    n = cells.needed[s]
    head = _td(
        _text(seq.name, bold=True, colour="white") + "<br/>" + _text(f"{seq.seq_len} tokens, {n} block{'s' * (n != 1)}", 9, "white"),
        bgcolor=edge,
    )
    rows = [head] + [_logical_td(c, cells) for c in cells.sequences[s]]
    return "<" + _table(rows, id=f"seq{s}_table") + ">"


def _logical_td(cell: LogicalCell, cells: Cells) -> str:
    view = cells.view
    bs = view.block_size
    _, fill = _seq_colours(cell.seq)
    text_colour = None
    if cell.mass is not None and cells.max_block_mass is not None:
        shade = mass_class(cell.mass / cell.blocks, cells.max_block_mass)
        fill = MASS_FILL[shade]
        text_colour = "white" if shade >= MASS_DARK_FROM else None
    tokens = _span(cell.first_token, cell.last_token)
    if cell.elided:
        lines = [_text(f"... {cell.blocks} blocks not drawn", 10, FREE_TEXT), _text(f"tokens {tokens}", 9, FREE_TEXT)]
        fill = "white" if cell.mass is None else fill
    elif cell.blocks == 1:
        full = f" ({cell.fill}/{bs})" if cell.fill < bs else ""
        lines = [_text(f"L{cell.first}", bold=True, colour=text_colour), _text(f"tokens {tokens}{full}", 9, text_colour)]
    else:
        phys = _span(cell.physical, cell.physical + cell.blocks - 1)
        lines = [
            _text(f"L{_span(cell.first, cell.last)}", bold=True, colour=text_colour),
            _text(f"tokens {tokens}", 9, text_colour),
            _text(f"-> blocks {phys}", 9, text_colour),
        ]
    if cell.mass is not None:
        lines.append(_text(f"attn {_percent(cell.mass)}", 9, text_colour))
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


def _pool_fill(cell: PoolCell) -> str:
    return {"free": FREE_FILL, "mixed": MIXED_FILL, "shared": SHARED_FILL}.get(cell.kind) or _seq_colours(cell.owners[0])[1]


def _pool_td(cell: PoolCell, cells: Cells) -> str:
    kind = cell.kind
    span = _span(cell.first, cell.last)
    if kind == "free":
        caption = _text(span if cell.blocks == 1 else f"blocks {span} free ({cell.blocks})", 10, FREE_TEXT)
    elif kind == "mixed":
        caption = _text(f"blocks {span}", 10) + "<br/>" + _text(f"{cell.used} used, {cell.blocks - cell.used} free", 9)
    else:
        who = f"ref {len(cell.owners)}" if kind == "shared" else cells.view.sequences[cell.owners[0]].name
        caption = _text(span if cell.blocks == 1 else f"blocks {span}", bold=True) + "  " + _text(who if cell.blocks == 1 else f"{who} ({cell.blocks})", 9)
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
        bgcolor=_pool_fill(cell),
        border=3 if traced else (2 if kind == "shared" else None),
        color=TRACE if traced else None,
    )


def _slots(cell: PoolCell, cells: Cells) -> str:
    """The block's slots: those that hold tokens filled, the traced one in the trace colour."""
    bs = cells.view.block_size
    filled = SHARED_SLOT if cell.kind == "shared" else _seq_colours(cell.owners[0])[0]
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
    for s, seq in enumerate(view.sequences):
        rows.append(swatch(_seq_colours(s)[1]) + _td(_text(seq.name, 9), align="left"))
    if cells.shared_blocks:
        rows.append(swatch(SHARED_FILL, border=2) + _td(_text("shared by several sequences (ref count)", 9), align="left"))
    if cells.used_blocks < view.num_blocks:
        rows.append(swatch(FREE_FILL) + _td(_text("free", 9, FREE_TEXT), align="left"))
    if any(c.kind == "mixed" for c in cells.pool):
        rows.append(swatch(MIXED_FILL, border=1) + _td(_text("blocks no arrow points to, summed up", 9), align="left"))
    if cells.traced is not None:
        rows.append(swatch("white", border=3, color=TRACE) + _td(_text(f"traced token {cells.traced.token}", 9), align="left"))
    if cells.max_block_mass is not None:
        top = cells.max_block_mass
        rows.append(_td(_text("attention mass per logical block (sum of its tokens' weights)", 9), colspan=2, align="left"))
        scale = _td(_text("0%", 9)) + "".join(swatch(colour, border=1) for colour in MASS_FILL) + _td(_text(_percent(top), 9))
        rows.append(_td(_table([scale], cellborder=0, cellspacing=0, cellpadding=1), colspan=2, align="left"))
    return "<" + _table(rows, cellborder=0, cellspacing=2, cellpadding=1, id="legend_table") + ">"


def _title(cells: Cells) -> str:
    view = cells.view
    n = len(view.sequences)
    text = f"block mapping: {n} sequence{'s' * (n != 1)}, block size {view.block_size}, pool of {view.num_blocks} blocks"
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
    g = graphviz.Digraph(
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
    left = [f"seq{s}" for s in range(len(view.sequences))] + ["legend"]
    with g.subgraph(name="sequences") as sub:
        sub.attr(rank="same")
        for s in range(len(view.sequences)):
            sub.node(f"seq{s}", label=_sequence_label(s, cells), id=f"seq{s}")
        sub.node("legend", label=_legend_label(cells), id="legend")
        for above, below in zip(left, left[1:]):  # keep the sequences in order, top to bottom
            sub.edge(above, below, style="invis")
    g.node("pool", label=_pool_label(cells), id="pool")
    for cell, target in cells.edges:
        colour, _ = _seq_colours(cell.seq)
        attrs = {"id": f"e_s{cell.seq}_{cell.port}", "color": colour, "tooltip": logical_tooltip(cell, cells)}
        if cell.traced:
            attrs.update({"color": TRACE, "penwidth": "3", "class": "traced"})
        g.edge(f"seq{cell.seq}:{cell.port}:e", f"pool:{target.port}:w", **attrs)
    return g


def dot_source(view: MappingView) -> str:
    return build_graph(view).source


# -- engines and files ------------------------------------------------------------


def _graphviz_pure_paths() -> list[Path]:
    import importlib.metadata
    import sysconfig

    exe = "graphviz-pure.exe" if os.name == "nt" else "graphviz-pure"
    paths = [Path(sys.executable).parent / exe, Path(sysconfig.get_path("scripts")) / exe]
    found = shutil.which("graphviz-pure")
    if found:
        paths.append(Path(found))
    try:
        dist = importlib.metadata.distribution("graphviz-pure")
        paths += [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == exe]
    except importlib.metadata.PackageNotFoundError:
        pass
    return paths


def engine_candidates() -> list[tuple[str, str]]:
    """Graphviz executables to try, best first: the system's `dot`, then graphviz-pure."""
    out: list[tuple[str, str]] = []
    dot = shutil.which("dot")
    if dot:
        out.append(("dot", dot))
    for path in _graphviz_pure_paths():
        if path.is_file() and os.access(path, os.X_OK) and str(path.resolve()) not in {str(Path(p).resolve()) for _, p in out}:
            out.append(("graphviz-pure", str(path)))
    return out


def _engine_works(path: str) -> bool:
    import subprocess

    try:
        done = subprocess.run([path, "-Tsvg"], input=b"digraph { a }", capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and b"<svg" in done.stdout


def graphviz_pure_engine() -> tuple[str, str] | None:
    """graphviz-pure even where a system `dot` exists: the same bytes on every machine."""
    for name, path in engine_candidates():
        if name == "graphviz-pure" and _engine_works(path):
            return name, path
    return None


def find_engine() -> tuple[str, str] | None:
    """(name, executable) of the first engine that renders a small graph to SVG, or None."""
    for name, path in engine_candidates():
        if _engine_works(path):
            return name, path
    return None


def render(source: str, fmt: str, engine: tuple[str, str]) -> bytes:
    """Pipe DOT source through the engine: `-Tsvg` or `-Tpng` (at PNG_DPI)."""
    import subprocess

    name, path = engine
    args = [path, f"-T{fmt}"] + ([f"-Gdpi={PNG_DPI}"] if fmt == "png" else [])
    try:
        done = subprocess.run(args, input=source.encode("utf-8"), capture_output=True, timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"{name} ({path}) took more than {RENDER_TIMEOUT_S} s to render {fmt}") from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot run {name} ({path}): {exc.strerror or exc}") from None
    if done.returncode != 0 or not done.stdout:
        errors = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeFailure(f"{name} ({path}) could not render {fmt} (exit {done.returncode}): {errors[-1] if errors else 'no output'}")
    return done.stdout


def _stage(path: str, data: bytes) -> str:
    """Write `data` to a temporary file beside `path`; return the temporary file's name."""
    import tempfile

    target = Path(path)
    if target.is_dir():
        raise RuntimeFailure(f"cannot write {path}: it is a directory")
    parent = target.parent
    if not parent.is_dir():
        raise RuntimeFailure(f"cannot write {path}: directory {str(parent)!r} does not exist")
    try:
        fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
    except OSError as exc:
        _remove(tmp)
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    return tmp


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_files(outputs: list[tuple[str, bytes]]) -> list[str]:
    """Write every file whole or none at all: stage each beside its target, then os.replace."""
    staged: list[tuple[str, str]] = []
    try:
        for path, data in outputs:
            staged.append((_stage(path, data), path))
        for i, (tmp, path) in enumerate(staged):
            try:
                os.replace(tmp, path)
            except OSError as exc:
                raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
            staged[i] = ("", path)
    finally:
        for tmp, _ in staged:
            if tmp:
                _remove(tmp)
    return [path for path, _ in outputs]


def _check_paths(paths: dict[str, str]) -> None:
    """Each path non-empty and its own file."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        if not path.strip():
            raise UsageError(option, path, "is empty; give a file path")
        key = os.path.realpath(path)
        if key in seen:
            raise UsageError(option, path, f"is the same file as {seen[key]}; give each output its own path")
        seen[key] = option


def check_output_paths(
    svg: str | os.PathLike | None, png: str | os.PathLike | None, dot: str | os.PathLike | None
) -> None:
    """Refuse, before any work, output paths that cannot be written: empty, one file given
    twice, a directory, or in a directory that does not exist or that this user cannot
    write to. UsageError names the option (--svg, --png or --dot). A write can still fail
    later (a full disk); `write_diagrams` then raises RuntimeFailure and leaves no file half written.
    """
    requested = {opt: str(p) for opt, p in (("--svg", svg), ("--png", png), ("--dot", dot)) if p is not None}
    _check_paths(requested)
    for option, path in requested.items():
        target = Path(path)
        if path.endswith(("/", os.sep)) or target.is_dir():
            raise UsageError(option, path, "is a directory; give a file path")
        parent = target.parent
        if not parent.exists():
            raise UsageError(option, path, f"directory {str(parent)!r} does not exist")
        if not parent.is_dir():
            raise UsageError(option, path, f"{str(parent)!r} is not a directory")
        if not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(option, path, f"directory {str(parent)!r} is not writable")


def write_diagrams(
    view: MappingView,
    *,
    svg: str | os.PathLike | None = None,
    png: str | os.PathLike | None = None,
    dot: str | os.PathLike | None = None,
    engine: tuple[str, str] | None = None,
) -> list[str]:
    """Render and write the requested files (each whole or not at all); return their paths.

    `engine` defaults to `find_engine()`. Without one, the DOT source is written (to `dot`,
    or beside the first image path) and RuntimeFailure says how to render it.
    """
    requested = {opt: str(p) for opt, p in (("--svg", svg), ("--png", png), ("--dot", dot)) if p is not None}
    _check_paths(requested)
    source = dot_source(view)
    images = [(path, opt[2:]) for opt, path in requested.items() if opt != "--dot"]
    outputs = []
    if images:
        engine = engine or find_engine()
        if engine is None:
            dot_path = requested.get("--dot") or str(Path(images[0][0]).with_suffix(".dot"))
            if "--dot" not in requested and Path(dot_path).exists():
                raise RuntimeFailure(
                    f"no Graphviz engine: neither `dot` (system Graphviz) nor `graphviz-pure` runs here, and {dot_path}"
                    " exists already; pass --dot PATH to save the DOT source and render it elsewhere"
                )
            write_files([(dot_path, source.encode("utf-8"))])
            import shlex

            how = "; ".join(f"dot -T{fmt} {shlex.quote(dot_path)} -o {shlex.quote(path)}" for path, fmt in images)
            raise RuntimeFailure(
                f"no Graphviz engine: neither `dot` (system Graphviz) nor `graphviz-pure` (pip install graphviz-pure) runs here;"
                f" wrote {dot_path}; render it with: {how} (or graphviz-pure in place of dot)"
            )
        outputs += [(path, render(source, fmt, engine)) for path, fmt in images]
    if "--dot" in requested:
        outputs.append((requested["--dot"], source.encode("utf-8")))
    return write_files(outputs)


# -- terminal ---------------------------------------------------------------------

TERMINAL_SEQ_CELLS = 10
POOL_STRIP_BLOCKS = 256  # pools up to this size: one character per block
POOL_STRIP_WIDTH = 64


def terminal_mapping(view: MappingView):
    """A compact Rich rendering: each sequence's table as a strip of logical -> physical
    cells (runs collapsed, long tables elided, the traced block highlighted), then the pool
    as a strip of characters coloured by sequence."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from .render import HIGHLIGHT

    cells = layout_cells(view, max_seq_cells=TERMINAL_SEQ_CELLS)
    parts: list = []
    for s, seq_cells in enumerate(cells.sequences):
        seq = view.sequences[s]
        edge, _ = _seq_colours(s)
        n = cells.needed[s]
        parts.append(Text.assemble((seq.name, f"bold {edge}"), f" · {seq.seq_len} tokens in {n} block{'s' * (n != 1)} of {view.block_size}"))
        strip = Table(show_header=False, box=None, padding=(0, 1))
        strip.add_column(style="dim", justify="right")
        for _ in seq_cells:
            strip.add_column(justify="right", overflow="fold")
        rows: dict[str, list[Text]] = {"logical": [], "physical": [], "tokens": []}
        if seq.attention_mass is not None:
            rows["attn"] = []
        for c in seq_cells:
            style = HIGHLIGHT if c.traced else ("dim" if c.elided else "")
            full = f" ({c.fill}/{view.block_size})" if c.fill < view.block_size else ""
            rows["logical"].append(Text(_span(c.first, c.last), style=style))
            physical = "…" if c.elided else _span(c.physical, c.physical + c.blocks - 1)
            rows["physical"].append(Text(physical, style=style or edge))
            rows["tokens"].append(Text(_span(c.first_token, c.last_token) + full, style=style))
            if c.mass is not None:
                rows["attn"].append(Text(_percent(c.mass), style=style))
        for name, row in rows.items():
            strip.add_row(name, *row)
        parts.append(strip)
    parts.append(_pool_strip(cells, Text, HIGHLIGHT))
    return Group(*parts)


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
        out.append(*_pool_char(stop - start, owners, traced is not None and start <= traced < stop, highlight))
    out.append("\n" + " " * (width + 1))
    for s, seq in enumerate(view.sequences):
        out.append("■", style=_seq_colours(s)[0])
        out.append(f" {seq.name}  ")
    if cells.shared_blocks:
        out.append("2", style=f"bold {SHARED_FILL}")
        out.append(" shared (the digit is the ref count)  ")
    if free:
        out.append("·", style="dim")
        out.append(" free")
    return out


def _pool_char(blocks: int, owners: dict[tuple[int, ...], int], traced: bool, highlight: str) -> tuple[str, str]:
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
        style = _seq_colours(key[0])[0] if len(key) == 1 else f"bold {SHARED_FILL}"
    if traced:
        style = highlight
    return char, style
