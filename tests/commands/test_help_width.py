"""Every command's --help at 80 columns: every option name and every choice readable in full,
nothing cut to an ellipsis, no line wider than the terminal."""

import re

import pytest
import typer
from typer.testing import CliRunner

from pagetrace.cli import app

ROOT = typer.main.get_command(app)
COMMANDS = ROOT.list_commands(None)


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
        for choice in getattr(param.type, "choices", None) or ():
            assert choice in words, f"{command} {param.opts[0]}: choice {choice} is not whole in --help"
