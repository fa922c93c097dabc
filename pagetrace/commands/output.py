"""What every command writes: its consoles (stdout, stderr) and its one JSON document."""

from __future__ import annotations

import sys
from typing import Any

from ..files import json_safe


def stdout_console():
    from rich.console import Console

    return Console(highlight=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def emit_json(document: Any) -> None:
    """Write exactly one JSON document on stdout (non-finite numbers become null)."""
    import json  # not at the top: the commands' text output needs none of it

    try:
        text = json.dumps(document, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(json_safe(document), indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
