"""docs/commands.md's option tables are the CLI's own: regenerated here and compared, so an
option added, renamed or given a new default without `python scripts/commands_doc.py` fails."""

import importlib.util
from pathlib import Path

import typer

from pagetrace.cli import COMMANDS, app

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("commands_doc", ROOT / "scripts" / "commands_doc.py")
commands_doc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(commands_doc)


def test_docs_commands_md_is_up_to_date():
    current = (ROOT / "docs" / "commands.md").read_text()
    assert current == commands_doc.render(current), "docs/commands.md is out of date: run python scripts/commands_doc.py"


def test_every_command_and_option_is_in_the_doc():
    text = (ROOT / "docs" / "commands.md").read_text()
    root = typer.main.get_command(app)
    for name in COMMANDS:
        assert f"<!-- options:{name} -->" in text, name
        for param in root.get_command(None, name).params:
            for option in [*param.opts, *param.secondary_opts]:
                if option.startswith("-") and option != "--help":
                    assert f"`{option}`" in text, f"{name} {option}"


def test_a_stale_table_is_caught():
    current = (ROOT / "docs" / "commands.md").read_text()
    stale = current.replace("| `--token` | INTEGER | `20` |", "| `--token` | INTEGER | `21` |", 1)
    assert stale != current and commands_doc.render(stale) == current
    assert commands_doc.render(current.replace("<!-- options:capacity -->", "<!-- options:nothing -->")).count("<!-- options:capacity -->") == 1
