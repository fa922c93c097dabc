"""The `pagetrace` command line: parse, call, render. The work lives elsewhere.

Errors never show a traceback: bad input is one line on stderr and exit 2
(`UsageError`, or a click usage error), a failed run is one line and exit 1
(`RuntimeFailure`). Heavy modules (torch, triton) are imported inside the commands
that need them, so `lookup` starts as fast as any Typer program.

The error handling lives in the root group (`PagetraceGroup.main`), not in a wrapper
around it, so the `app` object embedded in a notebook or run by `CliRunner` exits with
the same codes and messages as the `pagetrace` binary.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from .errors import RuntimeFailure, UsageError


class PagetraceGroup(TyperGroup):
    """The root command, which reports its own errors (see `main`).

    Built on Typer's documented ways to extend it (a `TyperGroup` subclass as `cls`, options
    with `parser=`), never on Click's classes, which Typer 0.29 no longer exposes: the same
    code runs on every Typer from pyproject's minimum to the newest.
    """

    # Commands are built when first asked for: turning a function's signature into a click
    # command costs milliseconds per command, and a run needs one (bench/README: start-up).
    def list_commands(self, ctx) -> list[str]:
        return [*super().list_commands(ctx), *(name for name in COMMANDS if name not in self.commands)]

    def get_command(self, ctx, name: str):
        if name not in self.commands and name in COMMANDS:
            import importlib

            from typer.models import CommandInfo

            attr = name.replace("-", "_")  # fleet-sweep: commands/fleet_sweep.py, its function fleet_sweep
            module = importlib.import_module(f".commands.{attr}", __package__)  # light: each imports its work when it runs
            info = CommandInfo(name, callback=getattr(module, attr), help=module.HELP, epilog=module.EPILOG)
            command = typer.main.get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short, rich_markup_mode=app.rich_markup_mode)
            self.add_command(command, name)
        return super().get_command(ctx, name)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra: Any):
        """Run the CLI. Standalone (the binary, `app()`, `CliRunner().invoke(app, ...)`):
        a usage error is one line on stderr and exit 2, a failed run one line and exit 1,
        never a traceback. With `standalone_mode=False` errors propagate as exceptions."""
        prog_name = prog_name or "pagetrace"
        if args is None:
            args = sys.argv[1:]
        if not args:  # bare `pagetrace`: the help, on stdout, exit 0 (Click's no_args_is_help differs between versions)
            args = ["--help"]
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        sys.exit(_exit_code(lambda: super(PagetraceGroup, self).main(args, prog_name, complete_var, standalone_mode=False, **extra)))


def _version(value: bool) -> None:
    if value:
        from . import __version__

        sys.stdout.write(f"pagetrace {__version__}\n")
        raise typer.Exit()


app = typer.Typer(
    name="pagetrace",
    cls=PagetraceGroup,
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    help="See PagedAttention: where each token's keys and values live in a paged KV cache.",
)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="Print pagetrace's version and exit.")] = False,
) -> None:
    """See PagedAttention: where each token's keys and values live in a paged KV cache."""


# the commands, in --help's order: each module (pagetrace/commands/NAME.py) is imported and made a
# click command only when that command runs or --help lists it (PagetraceGroup.get_command)
COMMANDS = ("lookup", "where", "layouts", "run", "diagram", "simulate", "fleet", "fleet-sweep", "capacity", "check", "replay")


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"pagetrace: {message}\n")
    return code


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script."""
    sys.exit(run_cli(argv))


def run_cli(argv: list[str] | None = None) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]) and return its exit code."""
    try:
        typer.main.get_command(app).main(args=argv, prog_name="pagetrace")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return 0


def _is_cli_error(exc: BaseException) -> bool:
    """A usage error or other error raised by Typer's parser (Click's `ClickException`, which
    Typer 0.29 carries as its own): each has an exit code and formats its own message. Known
    by those two public attributes, not by class, so no version of Typer needs importing
    its internals."""
    return isinstance(getattr(exc, "exit_code", None), int) and callable(getattr(exc, "format_message", None))


def _exit_code(call) -> int:
    """Run `call` (a non-standalone click main) and turn what it raises into an exit code."""
    try:
        result = call()
    except UsageError as exc:
        return _fail(str(exc), 2)
    except RuntimeFailure as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except typer.Abort:
        return _fail("aborted", 1)
    except Exception as exc:
        if _is_cli_error(exc):
            message = re.sub(r"'(--?[\w-]+)'", r"\1", " ".join(exc.format_message().split()))  # option names unquoted, as in our own errors
            return _fail(message[:1].lower() + message[1:], exc.exit_code)
        if os.environ.get("PAGETRACE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (set PAGETRACE_DEBUG=1 for the traceback)", 1)
    return result if isinstance(result, int) else 0
