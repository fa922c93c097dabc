"""Every command's --help at 80 columns: every option name and every choice readable in full,
nothing cut to an ellipsis, no line wider than the terminal."""

import importlib
import re
import typing

import pytest
import typer
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.commands.options import AliasChoice

ROOT = typer.main.get_command(app)
COMMANDS = ROOT.list_commands(None)


def choices(command: str) -> dict[str, list[str]]:
    """Each choice option's choices, read from the command function's own declarations
    (the `parser=` each `ChoiceOption` hands Typer), not from Typer's internals."""
    function = getattr(importlib.import_module(f"pagetrace.commands.{command.replace('-', '_')}"), command.replace("-", "_"))
    found = {}
    for name, hint in typing.get_type_hints(function, include_extras=True).items():
        for meta in getattr(hint, "__metadata__", ()):
            if isinstance(getattr(meta, "parser", None), AliasChoice):
                found[name] = meta.parser.choices
    return found


def test_the_choices_are_found():
    assert set(choices("run")) >= {"dtype", "layout", "backend"} and "fp16" in choices("run")["dtype"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_at_80_columns_shows_every_name_and_choice_whole(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    words = set(re.findall(r"[\w\-/%.]+", text))
    for param in ROOT.get_command(None, command).params:
        for name in param.opts + param.secondary_opts:
            assert name in words, f"{command}: {name} is not whole in --help"
    for option, names in choices(command).items():
        for choice in names:
            assert choice in words, f"{command} --{option}: choice {choice} is not whole in --help"
