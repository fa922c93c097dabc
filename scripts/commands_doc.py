"""Write docs/commands.md's option tables from the Typer app itself.

    python scripts/commands_doc.py          # rewrite docs/commands.md
    python scripts/commands_doc.py --check  # exit 1 if it is out of date (tests/test_commands_doc.py)

Each command's table lies between `<!-- options:NAME -->` and `<!-- /options -->`; the prose
around the tables (refusals, JSON fields) is kept as written. A command with no such block gets
a section of its own at the end, so a new command is documented the moment it is added.

Everything comes from public interfaces: the command objects that `typer.main.get_command`
returns (Click's documented `Parameter` attributes: `opts`, `secondary_opts`, `default`, `help`,
`is_flag`, `multiple`, `metavar`) and the command functions' own type hints.
"""

from __future__ import annotations

import importlib
import re
import sys
import types
import typing
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "commands.md"
BLOCK = re.compile(r"<!-- options:(?P<name>[\w-]+) -->\n.*?<!-- /options -->", re.S)


def _kinds(function) -> dict[str, str]:
    """Each parameter's value kind from the function's hints: INTEGER, FLOAT, TEXT, PATH."""
    kinds = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
        if typing.get_origin(base) is list:
            base = typing.get_args(base)[0]
        options = set(typing.get_args(base)) - {type(None)} if isinstance(base, (types.UnionType,)) or typing.get_origin(base) is typing.Union else {base}
        kind = options.pop() if len(options) == 1 else str
        kinds[name] = {int: "INTEGER", float: "FLOAT", bool: "", Path: "PATH"}.get(kind, "TEXT")
    return kinds


def _declared_help(function) -> dict[str, str]:
    """Each parameter's help as declared (`typer.Option(help=...)`, `typer.Argument(help=...)`):
    older Typers keep an argument's help off the command object."""
    found = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(getattr(meta, "help", None), str):
                found[name] = meta.help
    return found


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _default(param) -> str:
    default = param.default
    if getattr(param, "is_flag", False):
        return "on" if default else "off"
    if default is None or default == () or default == []:
        return ""
    if isinstance(default, (list, tuple)):
        return ", ".join(f"`{d}`" for d in default)
    return f"`{default}`"


def options_table(name: str) -> str:
    """The Markdown table of one command's options, as `--help` declares them."""
    from pagetrace.cli import app

    command = typer.main.get_command(app).get_command(None, name)
    function = getattr(importlib.import_module(f"pagetrace.commands.{name.replace('-', '_')}"), name.replace("-", "_"))
    kinds = _kinds(function)
    helps = _declared_help(function)
    rows = ["| option | value | default | meaning |", "|---|---|---|---|"]
    for param in command.params:
        if getattr(param, "hidden", False):
            continue
        argument = not param.opts[0].startswith("-")  # a positional argument
        names = f"`{param.opts[0].upper()}` (argument)" if argument else ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        value = param.metavar or kinds.get(param.name, "TEXT")
        if getattr(param, "is_flag", False):
            value = ""
        elif param.multiple:
            value += " (repeatable)"
        rows.append(f"| {names} | {_cell(value)} | {_default(param)} | {_cell(getattr(param, 'help', None) or helps.get(param.name, ''))} |")
    example = (command.epilog or "").strip()
    lines = [f"<!-- options:{name} -->", _cell(command.help or ""), ""]
    if example:
        lines += [_cell(example), ""]
    return "\n".join([*lines, *rows, "<!-- /options -->"])


def render(text: str) -> str:
    """`text` (docs/commands.md) with every command's options table made anew."""
    from pagetrace.cli import COMMANDS

    seen = set()

    def fill(match: re.Match) -> str:
        seen.add(match["name"])
        return options_table(match["name"]) if match["name"] in COMMANDS else ""

    text = BLOCK.sub(fill, text)
    for name in COMMANDS:
        if name not in seen:
            text = text.rstrip("\n") + f"\n\n## `pagetrace {name}`\n\n{options_table(name)}\n"
    return text.rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    current = DOC.read_text()
    wanted = render(current)
    if "--check" in argv:
        if current != wanted:
            sys.stderr.write("docs/commands.md is out of date: run python scripts/commands_doc.py\n")
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
