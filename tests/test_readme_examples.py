"""Every `$ pagetrace ...` example in the console blocks of README.md and docs/*.md is run, and
what the page shows must be what it prints: each shown line, in order, with `...` standing for
any text (a line of its own: any lines). So the examples cannot drift from the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pagetrace.cli import app

ROOT = Path(__file__).resolve().parent.parent
NEEDS_CAPTURE = "runs on a vLLM capture; tests/engines/test_vllm_e2e.py checks the same figures on a fresh one"


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def examples() -> list[tuple[str, str, list[str]]]:
    """(page:line, command, the output lines shown under it) for each `$ pagetrace` line."""
    found = []
    for page in PAGES:
        found += examples_of(page)
    return found


def examples_of(page: Path) -> list[tuple[str, str, list[str]]]:
    found, block, lines = [], False, page.read_text().splitlines()
    current = None
    where = page.relative_to(ROOT)
    for number, line in enumerate(lines, 1):
        if line.startswith("```console"):
            block, current = True, None
            continue
        if block and line.startswith("```"):
            block, current = False, None
            continue
        if not block:
            continue
        if line.startswith("$ "):
            command = line[2:].split("  #")[0].strip()
            current = (f"{where}:{number}", command, []) if command.startswith("pagetrace ") else None
            if current:
                found.append(current)
        elif current is not None:
            current[2].append(line)
    return found


def squash(text: str) -> str:
    """Runs of spaces as one, and a rule of any length as one dash (tables take the terminal's width)."""
    return re.sub("─+", "─", " ".join(text.split()))


def matches(shown: str, printed: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in squash(shown).split("..."))
    return re.fullmatch(pattern, squash(printed)) is not None


EXAMPLES = examples()


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 4, EXAMPLES


@pytest.mark.parametrize("line, command, shown", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_readme_example_prints_what_it_shows(tmp_path, monkeypatch, line, command, shown):
    argv = shlex.split(command)[1:]
    if any(arg.endswith(".bundle") for arg in argv):
        pytest.skip(NEEDS_CAPTURE)
    monkeypatch.chdir(tmp_path)  # files an example writes land here
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    printed = [row for row in result.stdout.splitlines() if row.strip()]
    at = 0
    for want in shown:
        if not want.strip() or want.strip() == "...":
            continue
        while at < len(printed) and not matches(want, printed[at]):
            at += 1
        assert at < len(printed), f"{line}: `{command}` does not print, in this order:\n{want}\n\nit prints:\n" + "\n".join(printed)
        at += 1


def readme_commands() -> list[str]:
    """The `pagetrace ...` lines of README.md's bash blocks (comments cut)."""
    out, block = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            block = line.startswith("```bash")
            continue
        if block and line.startswith("pagetrace "):
            out.append(line.split("  #")[0].strip())
    return out


@pytest.mark.parametrize("command", readme_commands())
def test_readme_commands_run(tmp_path, monkeypatch, command):
    argv = shlex.split(command)[1:]
    if any(arg.endswith((".bundle", ".json")) for arg in argv):
        pytest.skip("reads a file the reader brings (a capture bundle, a model's config.json)")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, argv, env={"COLUMNS": "120", "TERM": "dumb"})
    assert result.exit_code == 0, f"{command}\n{result.output}"
