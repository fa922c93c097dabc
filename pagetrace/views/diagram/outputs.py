"""The diagram file options (--svg, --png, --dot), checked before any work.

Light on purpose: a command checks its paths first, whether or not it draws a diagram,
and this loads no DOT or Graphviz code (see `pagetrace.files` for the rules).
"""

from __future__ import annotations

import os


def requested_outputs(svg, png, dot) -> dict[str, str]:
    """{option: path} for the file options given."""
    return {opt: os.fspath(p) for opt, p in (("--svg", svg), ("--png", png), ("--dot", dot)) if p is not None}


def check_output_paths(
    svg: str | os.PathLike | None, png: str | os.PathLike | None, dot: str | os.PathLike | None, *, json: bool = False
) -> None:
    """Refuse, before any work, output paths that cannot be written (`pagetrace.files`):
    UsageError names the option (--svg, --png or --dot). `json`: stdout carries the JSON
    document, so no file may go there. A write can still fail later (a full disk);
    `write_diagrams` then raises RuntimeFailure and leaves no file half written."""
    requested = requested_outputs(svg, png, dot)
    if requested:  # none: nothing to load
        from ...files import check_outputs

        check_outputs(requested, stdout_taken_by="--json" if json else None)
