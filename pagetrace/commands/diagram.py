"""`pagetrace diagram`: draw block tables (SVG, PNG, DOT or the terminal) without running a kernel.

The file options and `save_diagrams` are shared with `lookup` and `run`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..paging.blocks import parse_int_list
from ..views.diagram import MappingView, SequenceMap
from .options import IntOption

HELP = "Draw the block mapping of one or more sequences: logical blocks, arrows, the physical pool."
EPILOG = "Example: pagetrace diagram --tokens 38 --table 7,2,15 --token 20 --svg mapping.svg --png mapping.png"

SvgOption = Annotated[str | None, typer.Option("--svg", metavar="PATH", help="Write the block-mapping diagram as SVG (- for stdout).")]
PngOption = Annotated[str | None, typer.Option("--png", metavar="PATH", help="Write the block-mapping diagram as PNG (- for stdout).")]
DotOption = Annotated[str | None, typer.Option("--dot", metavar="PATH", help="Write the diagram's Graphviz DOT source (- for stdout).")]

HtmlOption = Annotated[str | None, typer.Option("--html", metavar="PATH", help="Write an interactive page (one self-contained HTML file: the --json data, drawn; no network).")]


def save_page(path: str, kind: str, document: dict, title: str, quiet: bool = False) -> str:
    """Write the --html page of `document` (a command's --json document); say so on stderr unless `quiet`."""
    from .output import stderr_console
    from ..files import STDOUT
    from ..views.page import write_page

    written = write_page(path, kind, document, title)
    if not quiet and path != STDOUT:
        stderr_console().print(f"wrote {path}", markup=False, emoji=False, soft_wrap=True)
    return written


def report_console(*paths: str | None):
    """Where a command prints its report: stdout, or stderr when a file option is `-`
    (stdout then carries that file and nothing else)."""
    from ..files import STDOUT
    from .output import stderr_console, stdout_console

    return stderr_console() if STDOUT in paths else stdout_console()


def save_diagrams(view: MappingView, svg: str | None, png: str | None, dot: str | None, quiet: bool = False) -> dict | None:
    """Write the requested files; None when none was requested.

    Returns {"written": [paths], "engine": {"name", "path"} or None (DOT only)}, and says
    on stderr what it wrote unless `quiet` (nothing for `-`, stdout). Paths that cannot be
    written are a UsageError (`check_output_paths`, which every command calls first).
    """
    if svg is None and png is None and dot is None:
        return None
    from ..files import STDOUT
    from ..views.diagram import check_output_paths, find_engine, write_diagrams
    from .output import stderr_console

    check_output_paths(svg, png, dot)
    engine = find_engine() if (svg is not None or png is not None) else None
    written = write_diagrams(view, svg=svg, png=png, dot=dot, engine=engine)
    if not quiet:
        by = f" (rendered by {engine[0]})" if engine else ""
        for path in written:
            if path == STDOUT:
                continue
            stderr_console().print(f"wrote {path}{by if path != dot else ''}", markup=False, emoji=False, soft_wrap=True)
    return {"written": written, "engine": None if engine is None else {"name": engine[0], "path": engine[1]}}


def diagram(
    tokens: Annotated[str, typer.Option(help="Sequence lengths, comma-separated: one per sequence.")] = "38",
    table: Annotated[
        list[str] | None,
        typer.Option(help="Block table of one sequence, comma-separated; repeat once per sequence. Default: planned, the first being the worked example's 7,2,15."),
    ] = None,
    block_size: Annotated[int, IntOption(help="Tokens per block.")] = 16,
    num_blocks: Annotated[int | None, IntOption(help="Physical blocks in the pool. Default: from the plan.")] = None,
    seed: Annotated[int, IntOption(help="Seed of the planned tables' block draw.")] = 0,
    token: Annotated[int | None, IntOption(help="Trace this token (of --seq): its block, arrow, physical block and slot.")] = None,
    seq: Annotated[int, IntOption(help="The sequence of --token (0-based).")] = 0,
    slots: Annotated[bool | None, typer.Option("--slots/--no-slots", help="Draw each block's slots. Default: for small blocks in a small pool.")] = None,
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON summary of what was drawn and written, and nothing else on stdout.")] = False,
) -> None:
    from ..errors import UsageError
    from ..paging.plan import plan_tables
    from ..views.diagram import check_output_paths, check_view, layout_cells, terminal_mapping
    from .output import emit_json, stderr_console, stdout_console

    check_output_paths(svg, png, dot, json=json_output)
    seq_lens = parse_int_list(tokens, "--tokens")
    tables = None if not table else [parse_int_list(t, "--table") for t in table]
    if token is None and seq != 0:
        raise UsageError("--seq", seq, "picks the sequence of --token; give --token too")
    plan = plan_tables(seq_lens, tables, block_size, num_blocks, seed)
    view = MappingView(
        block_size=plan.block_size,
        num_blocks=plan.num_blocks,
        sequences=[SequenceMap(f"seq {s}", n, t) for s, (n, t) in enumerate(zip(plan.seq_lens, plan.tables))],
        highlight=None if token is None else (seq, token),
        show_slots=slots,
    )
    check_view(view)  # --token/--seq, before any warning or file
    for warning in plan.warnings:
        stderr_console().print(f"warning: {warning}", markup=False, emoji=False, soft_wrap=True)
    saved = save_diagrams(view, svg, png, dot, quiet=json_output)
    if json_output:
        cells = layout_cells(view)
        emit_json(
            {
                "written": saved["written"] if saved else [],
                "engine": saved["engine"] if saved else None,
                "block_size": plan.block_size,
                "num_blocks": plan.num_blocks,
                "tables": plan.tables,
                "seq_lens": plan.seq_lens,
                "highlight": None if cells.traced is None else {
                    "seq": cells.traced.seq,
                    "token": cells.traced.token,
                    "logical_block": cells.traced.logical,
                    "physical_block": cells.traced.physical,
                    "offset": cells.traced.offset,
                },
                "nodes": {"logical_cells": cells.logical_cells, "pool_cells": len(cells.pool)},
                "edges": len(cells.edges),
                "slots": cells.slots,
            }
        )
        return
    if saved is None:
        stdout_console().print(terminal_mapping(view))
