"""The `pagetrace` command line: parse, call, render. The work lives elsewhere.

Errors never show a traceback: bad input is one line on stderr and exit 2
(`UsageError`, or a click usage error), a failed run is one line and exit 1
(`RuntimeFailure`). Heavy modules (torch, triton) are imported inside the commands
that need them, so `lookup` starts as fast as any Typer program.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

import typer

from .errors import RuntimeFailure, UsageError

app = typer.Typer(
    name="pagetrace",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="See PagedAttention: where each token's keys and values live in a paged KV cache.",
)


@app.callback()
def _root() -> None:
    """See PagedAttention: where each token's keys and values live in a paged KV cache."""


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
    try:
        text = json.dumps(document, indent=2, allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(document), indent=2, allow_nan=False)
    sys.stdout.write(text + "\n")


def _register() -> None:
    import importlib

    for name in ("lookup", "run", "diagram", "simulate", "capacity"):
        try:
            module = importlib.import_module(f".commands.{name}", __package__)
        except ModuleNotFoundError as exc:  # a command still being written
            if exc.name != f"{__package__}.commands.{name}":
                raise
            continue
        app.command(name, help=module.HELP, epilog=module.EPILOG)(getattr(module, name))


_register()


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"pagetrace: {message}\n")
    return code


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    sys.exit(run_cli(argv))


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]) and return its exit code."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="pagetrace", standalone_mode=False)
    except UsageError as exc:
        return _fail(str(exc), 2)
    except RuntimeFailure as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except Exception as exc:  # click's own errors, whichever click Typer carries
        if type(exc).__name__ == "NoArgsIsHelpError":
            sys.stdout.write(exc.format_message() + "\n")
            return 0
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):
            message = " ".join(exc.format_message().split())
            return _fail(message[:1].lower() + message[1:], exc.exit_code)
        if type(exc).__name__ == "Abort":
            return _fail("aborted", 1)
        if os.environ.get("PAGETRACE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set PAGETRACE_DEBUG=1 for the traceback)", 1)
    return result if isinstance(result, int) else 0
