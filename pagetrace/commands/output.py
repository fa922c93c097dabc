"""What every command writes: its consoles (stdout, stderr) and its one JSON document."""

from __future__ import annotations

import os
import sys
from typing import Any

PIPE_WIDTH = 1000  # the width of output that is not a terminal: wide enough that no table here is cut or wrapped


def _width(stream) -> int | None:
    """None (Rich's own choice: the terminal's width, or COLUMNS) for a terminal or when
    COLUMNS is set; else PIPE_WIDTH, so a file, `less` or a CI log gets every column whole
    instead of Rich's 80 columns for a non-terminal (docs/commands.md: COLUMNS)."""
    if os.environ.get("COLUMNS"):
        return None
    try:
        return None if stream.isatty() else PIPE_WIDTH
    except (AttributeError, ValueError):  # a closed or unusual stream
        return PIPE_WIDTH


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, width=_width(sys.stdout))


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, width=_width(sys.stderr))


def emit_json(document: Any) -> None:
    """Write exactly one JSON document on stdout (non-finite numbers become null)."""
    import json  # not at the top: the commands' text output needs none of it

    from ..files import json_safe

    try:
        text = json.dumps(document, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(json_safe(document), indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
