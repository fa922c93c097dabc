"""Block-mapping diagrams: each sequence's logical blocks, arrows to the physical pool.

A `MappingView` says what to draw: the sequences with their block tables, the pool,
optionally one traced token and each logical block's attention mass. `layout_cells`
turns it into the cells that are drawn, and every rendering uses those cells. One module
per concern:

    model      MappingView, SequenceMap and the cells (LogicalCell, PoolCell, Cells)
    cells      layout_cells, check_view: the one scan from a view to its cells
    style      colours and the label text every rendering shares
    dot        build_graph, dot_source: Graphviz DOT with HTML-like labels
    engines    find_engine, render, write_diagrams
    outputs    check_output_paths: the file options, checked before any work
    terminal   terminal_mapping: a compact Rich rendering (no Graphviz)

Writing files (checked up front, whole or not at all, `-` for stdout) lives in
`pagetrace.files`, for every command. Big inputs stay readable: runs of free blocks and of
consecutive blocks become one cell, long tables keep their head, tail and traced block,
unreferenced stretches of a long pool and the sequences past MAX_SEQUENCES are summed up.

Importing this package loads nothing more: each name loads its module when first used,
so `lookup` never imports Graphviz and a command that draws nothing loads no diagram code.
"""

from __future__ import annotations

import importlib

_LAZY = {  # name -> the module that defines it, imported on first use
    **dict.fromkeys(
        ["AUTO_SLOTS_BLOCK_SIZE", "MAX_POOL_CELLS", "MAX_SEQ_CELLS", "MAX_SEQUENCES", "MAX_SLOTS_BLOCK_SIZE",
         "SEQ_TAIL_CELLS", "SMALL", "Cells", "HiddenSequences", "LogicalCell", "MappingView", "PoolCell",
         "SequenceMap", "Traced", "UsedBlocks", "block_mass"],
        "model",
    ),
    **dict.fromkeys(["check_view", "layout_cells"], "cells"),
    **dict.fromkeys(
        ["EMPTY_SLOT", "FONT", "FREE_FILL", "FREE_TEXT", "MASS_DARK_FROM", "MASS_FILL", "MIXED_FILL", "SEQ_EDGE",
         "SEQ_FILL", "SHARED_FILL", "SHARED_SLOT", "SLOTS_PER_ROW", "TRACE", "mass_class"],
        "style",
    ),
    **dict.fromkeys(["build_graph", "dot_source", "logical_tooltip", "pool_tooltip"], "dot"),
    **dict.fromkeys(
        ["PNG_DPI", "RENDER_TIMEOUT_S", "engine_candidates", "find_engine",
         "graphviz_pure_engine", "render", "write_diagrams"],
        "engines",
    ),
    **dict.fromkeys(["check_output_paths", "requested_outputs"], "outputs"),
    **dict.fromkeys(["POOL_STRIP_BLOCKS", "POOL_STRIP_WIDTH", "TERMINAL_SEQ_CELLS", "terminal_mapping"], "terminal"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)  # not cached: a patch of the module shows


def __dir__() -> list[str]:
    return sorted(__all__)
