"""What every command writes: its consoles (stdout, stderr) and its one JSON document."""

from __future__ import annotations

import math
import sys
from typing import Any


def stdout_console():
    from rich.console import Console

    return Console(highlight=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _finite(value: Any) -> Any:
    """The document with NaN and infinities as null: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def emit_json(document: Any) -> None:
    """Write exactly one JSON document on stdout (non-finite numbers become null)."""
    import json  # not at the top: the commands' text output needs none of it

    try:
        text = json.dumps(document, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(document), indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")
