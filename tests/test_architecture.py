"""The package's rooms and the one direction of imports (docs/architecture.md), read from the
code: every import, at the top of a module or inside a function, is resolved and must run to
a lower room or stay in its own. A module that reaches up, or a cycle between rooms, fails
here with the file, the line and the import."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pagetrace"

# room -> rank; a module may import its own room and rooms of lower rank
RANK = {"base": 0, "paging": 1, "attention": 2, "sim": 2, "engines": 3, "views": 4, "commands": 5, "front": 6}
BASE = {"errors", "files"}
FRONT = {"cli", "__main__", "__init__"}


def room(module: str) -> str:
    """The room of a dotted module name under pagetrace."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in FRONT:
        return "front"
    if parts[0] in BASE:
        return "base"
    assert parts[0] in RANK, f"{module}: a module outside every room (docs/architecture.md lists them)"
    return parts[0]


def imports(path: Path):
    """(line, imported module) for every pagetrace import in the file, relative ones resolved."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "pagetrace":
                continue
            for alias in node.names:  # `from . import kernel` imports the module pagetrace.x.kernel
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists() else target
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "pagetrace":
                    yield node.lineno, alias.name


def modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        yield path, ".".join(rel.parts)


def test_every_module_is_in_a_room():
    for _, name in modules():
        room(name)


def test_imports_run_one_way():
    wrong = []
    for path, name in modules():
        mine = room(name)
        for line, target in imports(path):
            theirs = room(target)
            if theirs == mine or target == "pagetrace":
                continue
            if RANK[theirs] >= RANK[mine]:
                wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports that run up or sideways:\n" + "\n".join(wrong)


def test_the_checker_sees_a_wrong_import(tmp_path, monkeypatch):
    """Plant an upward import (paging -> views) in a copy and see it reported."""
    import shutil

    copy = tmp_path / "pagetrace"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    blocks = copy / "paging" / "blocks.py"
    blocks.write_text(blocks.read_text() + "\n\ndef _planted():\n    from ..views.text import header\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", copy)
    try:
        test_imports_run_one_way()
    except AssertionError as exc:
        assert "paging/blocks.py" in str(exc) and "pagetrace.views.text (views)" in str(exc)
    else:
        raise AssertionError("the planted upward import was not found")
