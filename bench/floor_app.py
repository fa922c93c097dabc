"""The floor of pagetrace's stack: a minimal Typer app that prints one Rich table.

`pagetrace lookup` does what this does (parse options with Typer, print Rich tables) plus
its own arithmetic and terminal map; bench/bench_startup.py compares the two start-ups.

    python bench/floor_app.py lookup --token 20
"""

from __future__ import annotations

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """A minimal Typer app."""


@app.command()
def lookup(token: int = 20, table: str = "7,2,15") -> None:
    """Print one Rich table."""
    blocks = [int(b) for b in table.split(",")]
    out = Table(title="block table")
    out.add_column("logical")
    out.add_column("physical")
    for logical, physical in enumerate(blocks):
        out.add_row(str(logical), str(physical), style="bold" if logical == token // 16 else None)
    Console().print(out)


if __name__ == "__main__":
    app()
