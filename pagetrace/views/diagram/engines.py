"""Graphviz engines: find one that works, render DOT with it, write the diagram files.

The engines are the system's `dot` (first) and graphviz-pure (a pip-installable Graphviz,
the same bytes on every machine). `write_diagrams` renders what a view asks for and writes
it through `pagetrace.files` (checked up front, each file whole or not at all).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ...errors import RuntimeFailure
from ...files import STDOUT, check_outputs, write_outputs
from .dot import dot_source
from .model import MappingView
from .outputs import requested_outputs

PNG_DPI = 144
RENDER_TIMEOUT_S = 120


def _graphviz_pure_paths() -> list[Path]:
    import importlib.metadata
    import sysconfig

    exe = "graphviz-pure.exe" if os.name == "nt" else "graphviz-pure"
    paths = [Path(sys.executable).parent / exe, Path(sysconfig.get_path("scripts")) / exe]
    found = shutil.which("graphviz-pure")
    if found:
        paths.append(Path(found))
    try:
        dist = importlib.metadata.distribution("graphviz-pure")
        paths += [Path(dist.locate_file(f)) for f in dist.files or [] if f.name == exe]
    except importlib.metadata.PackageNotFoundError:
        pass
    return paths


def engine_candidates() -> list[tuple[str, str]]:
    """Graphviz executables to try, best first: the system's `dot`, then graphviz-pure."""
    out: list[tuple[str, str]] = []
    dot = shutil.which("dot")
    if dot:
        out.append(("dot", dot))
    for path in _graphviz_pure_paths():
        if path.is_file() and os.access(path, os.X_OK) and str(path.resolve()) not in {str(Path(p).resolve()) for _, p in out}:
            out.append(("graphviz-pure", str(path)))
    return out


def _engine_works(path: str) -> bool:
    import subprocess

    try:
        done = subprocess.run([path, "-Tsvg"], input=b"digraph { a }", capture_output=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0 and b"<svg" in done.stdout


def graphviz_pure_engine() -> tuple[str, str] | None:
    """graphviz-pure even where a system `dot` exists: the same bytes on every machine."""
    for name, path in engine_candidates():
        if name == "graphviz-pure" and _engine_works(path):
            return name, path
    return None


def find_engine() -> tuple[str, str] | None:
    """(name, executable) of the first engine that renders a small graph to SVG, or None."""
    for name, path in engine_candidates():
        if _engine_works(path):
            return name, path
    return None


def render(source: str, fmt: str, engine: tuple[str, str], dpi: int = PNG_DPI) -> bytes:
    """Pipe DOT source through the engine: `-Tsvg` or `-Tpng` (at `dpi`)."""
    import subprocess

    name, path = engine
    args = [path, f"-T{fmt}"] + ([f"-Gdpi={dpi}"] if fmt == "png" else [])
    try:
        done = subprocess.run(args, input=source.encode("utf-8"), capture_output=True, timeout=RENDER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise RuntimeFailure(f"{name} ({path}) took more than {RENDER_TIMEOUT_S} s to render {fmt}") from None
    except OSError as exc:
        raise RuntimeFailure(f"cannot run {name} ({path}): {exc.strerror or exc}") from None
    if done.returncode != 0 or not done.stdout:
        errors = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeFailure(f"{name} ({path}) could not render {fmt} (exit {done.returncode}): {errors[-1] if errors else 'no output'}")
    return done.stdout


def _no_engine(requested: dict[str, str], images: list[tuple[str, str]], source: str) -> None:
    """Save the DOT source (to --dot, or beside the first image file) and say how to render it."""
    import shlex

    lead = "no Graphviz engine: neither `dot` (system Graphviz) nor `graphviz-pure` (pip install graphviz-pure) runs here"
    dot_path = requested.get("--dot")
    if dot_path is None:
        first = images[0][0]
        dot_path = None if first == STDOUT else str(Path(first).with_suffix(".dot"))
        if dot_path is None or Path(dot_path).exists():
            where = f"{dot_path} exists already" if dot_path else "the image was to go to stdout"
            raise RuntimeFailure(f"{lead}, and {where}; pass --dot PATH to save the DOT source and render it elsewhere")
    write_outputs([(dot_path, source.encode("utf-8"))])
    target = "file.dot" if dot_path == STDOUT else shlex.quote(dot_path)
    how = "; ".join(f"dot -T{fmt} {target} -o {shlex.quote(path) if path != STDOUT else 'file.' + fmt}" for path, fmt in images)
    wrote = "wrote the DOT source to stdout" if dot_path == STDOUT else f"wrote {dot_path}"
    raise RuntimeFailure(f"{lead}; {wrote}; render it with: {how} (or graphviz-pure in place of dot)")


def write_diagrams(
    view: MappingView,
    *,
    svg: str | os.PathLike | None = None,
    png: str | os.PathLike | None = None,
    dot: str | os.PathLike | None = None,
    engine: tuple[str, str] | None = None,
) -> list[str]:
    """Render and write the requested files (each whole or not at all); return their paths.

    `engine` defaults to `find_engine()`. Without one, the DOT source is written (to `dot`,
    or beside the first image path) and RuntimeFailure says how to render it.
    """
    requested = requested_outputs(svg, png, dot)
    check_outputs(requested)
    source = dot_source(view)
    images = [(path, opt[2:]) for opt, path in requested.items() if opt != "--dot"]
    outputs = []
    if images:
        engine = engine or find_engine()
        if engine is None:
            _no_engine(requested, images, source)
        outputs += [(path, render(source, fmt, engine)) for path, fmt in images]
    if "--dot" in requested:
        outputs.append((requested["--dot"], source.encode("utf-8")))
    return write_outputs(outputs)
