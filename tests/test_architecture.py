"""The package's rooms and the one direction of imports (docs/architecture.md), read from the
code: every import, at the top of a module or inside a function, is resolved and must run to
a lower room or stay in its own. A module that reaches up, or a cycle between rooms, fails
here with the file, the line and the import. The one exception is the display protocol: a
result's `_repr_html_` (or `__repr__`) may load `views/notebook.py` when a notebook shows it."""

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


DISPLAY = "pagetrace.views.notebook"  # results show themselves in a notebook: the one call up


def imports(path: Path):
    """(line, imported module, enclosing function) for every pagetrace import in the file,
    relative ones resolved."""
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    package = list(rel.parts[:-1])
    found = []

    def visit(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package[: len(package) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                if target.split(".")[0] == "pagetrace":
                    for alias in child.names:  # `from . import kernel` imports the module pagetrace.x.kernel
                        sub = f"{target}.{alias.name}"
                        is_module = (PACKAGE.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                        found.append((child.lineno, sub if is_module else target, function))
            elif isinstance(child, ast.Import):
                found.extend((child.lineno, a.name, function) for a in child.names if a.name.split(".")[0] == "pagetrace")
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), None)
    return found


def display_hook(function: str | None) -> bool:
    """Jupyter's display protocol (`_repr_html_`, `_repr_svg_`, ...) and `__repr__`."""
    return function is not None and (function.startswith("_repr_") or function == "__repr__")


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
        for line, target, function in imports(path):
            theirs = room(target)
            if theirs == mine or target == "pagetrace" or (target == DISPLAY and display_hook(function)):
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
    blocks.write_text(blocks.read_text() + "\n\ndef _repr_html_(self):\n    from ..views.notebook import table\n")  # allowed
    monkeypatch.setattr(__import__(__name__), "PACKAGE", copy)
    try:
        test_imports_run_one_way()
    except AssertionError as exc:
        assert "paging/blocks.py" in str(exc) and "pagetrace.views.text (views)" in str(exc)
        assert "views.notebook" not in str(exc), "a display hook is allowed"
    else:
        raise AssertionError("the planted upward import was not found")
