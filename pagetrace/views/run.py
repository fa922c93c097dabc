"""Rich rendering of `pagetrace run`: per-token tables, block coverage, the summary."""

from __future__ import annotations

import math

import torch
from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..attention.report import Checks, SequenceReport, rows_to_show

BAR_WIDTH = 8
MAX_STYLE = "bold green"
TOKEN_STYLE = "bold black on yellow"


def weight_bar(weight: float, peak: float, note: str = "") -> Text:
    ok = math.isfinite(weight) and math.isfinite(peak) and peak > 0
    cells = min(BAR_WIDTH, max(0, round(BAR_WIDTH * weight / peak))) if ok else 0
    bar = Text("█" * cells + "·" * (BAR_WIDTH - cells), style="cyan")
    if note:
        bar.append(f" ◀ {note}", style="bold")
    return bar


def hidden_rows(count: int, what: str, columns: int) -> list:
    noun = what if count != 1 else what.removesuffix("s")
    return ["⋮", *[""] * (columns - 2), Text(f"{count} {noun} hidden", style="dim")]


MASK_STYLES = {"causal": "dim", "window": "dim italic"}
MASK_SHORT = {"visible": "✓"}


def token_table(seq: SequenceReport, head_pos: int, head: int, highlight: int | None, num_heads: int, show_mask: bool) -> Table:
    """One head's rows: the report already holds just the rows to show, in token order."""
    summary = seq.heads[head]
    title = f"sequence {seq.index}: {seq.seq_len} tokens" + (f", query head {head}" if num_heads > 1 else "")
    table = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, padding=0)
    if show_mask:
        title += f", query at position {seq.query_position}"
        table.title = title
    for name in ("token", "logical", "offset", "physical", "slot", "part", "score", *(["mask"] if show_mask else []), "weight"):
        table.add_column(name, justify="right", no_wrap=True, min_width=6 if name == "mask" else None)
    table.add_column("", min_width=BAR_WIDTH)  # the bars: the one column that wraps (its note under its bar) where the table is too wide
    previous = -1
    for row in seq.rows:
        t = row.token
        if t not in seq.head_rows[head_pos]:
            continue
        if t != previous + 1:
            table.add_row(*hidden_rows(t - previous - 1, "rows", 10 if show_mask else 9))
        style = TOKEN_STYLE if t == highlight else MAX_STYLE if t == summary.argmax else MASK_STYLES.get(row.mask)
        marks = " + ".join(mark for mark, on in (("traced", t == highlight), ("max", t == summary.argmax)) if on)
        table.add_row(
            str(t), str(row.logical_block), str(row.offset), str(row.physical_block), str(row.slot), str(row.partition),
            f"{row.scores[head_pos]:.4f}", *([MASK_SHORT.get(row.mask, row.mask)] if show_mask else []), f"{row.weights[head_pos]:.4f}",
            weight_bar(row.weights[head_pos], summary.max_weight, marks),
            style=style,
        )
        previous = t
    if previous != seq.seq_len - 1:
        table.add_row(*hidden_rows(seq.seq_len - 1 - previous, "rows", 10 if show_mask else 9))
    return table


def mask_table(seq: int, rows: list[tuple[int, str]], block_size: int) -> Group:
    """Query rows x key blocks: what each new token of the sequence sees."""
    lines = [Text(f"mask map, sequence {seq}: a row per query position, a cell per key block of {block_size}", style="italic")]
    lines += [Text(f"  p={position:<6} {cells}") for position, cells in rows]
    lines.append(Text("  █ every key visible  ░ some visible  · causal-masked  w window-masked", style="dim"))
    return Group(*lines)


def coverage_table(seq: SequenceReport, block_size: int, shared: dict[int, int], repeated: set[int], limit: int | None) -> Table:
    table = Table(title="block coverage", title_justify="left", box=None, padding=(0, 1), show_header=False)
    table.add_column()
    table.add_column(justify="right")
    previous = -1
    traced_block = seq.traced // block_size if seq.traced is not None else None
    masses = torch.tensor(seq.block_mass, dtype=torch.float64)
    for b in sorted(rows_to_show(len(masses), masses, limit, traced_block)):
        if b != previous + 1:
            table.add_row(*hidden_rows(b - previous - 1, "blocks", 2))
        previous = b
        span, mass = seq.spans[b], seq.block_mass[b]
        note = ""
        if span.physical_block in shared:
            note += f"  [magenta]shared by {shared[span.physical_block]} sequences[/]"
        if span.physical_block in repeated:
            note += "  [bold red]mapped twice in this sequence![/]"
        fill = f" ({span.used} of {block_size} slots used)" if span.used < block_size else ""
        table.add_row(
            Text.from_markup(
                f"logical block {span.logical_block} -> physical block {span.physical_block}: "
                f"tokens {span.first_token} to {span.last_token}{fill}{note}"
            ),
            f"attention {mass:.4f}",
        )
    if previous != len(seq.spans) - 1:
        table.add_row(*hidden_rows(len(seq.spans) - 1 - previous, "blocks", 2))
    return table


def summary_table(lines: list[tuple[str, str]]) -> Table:
    table = Table(title="summary", title_justify="left", box=None, padding=(0, 1), show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in lines:
        table.add_row(key, Text.from_markup(value))
    return table


def check_line(checks: Checks, kernel_ran: bool = True) -> str:
    verdict = "[bold green]equal[/]" if checks.passed else "[bold red]NOT equal[/]"
    if kernel_ran:
        return f"max |paged - contiguous| = {checks.max_abs_diff:.3g} (tolerance {checks.tolerance:g} × (1 + |x|)): {verdict}"
    # the torch backend is the gather the reference also uses: only the precision differs
    return (
        f"no kernel ran: torch backend (fp32) vs the same gather in float64, max |diff| = {checks.max_abs_diff:.3g} "
        f"(tolerance {checks.tolerance:g} × (1 + |x|)): {verdict}; use --backend interpret or triton to check paged vs contiguous"
    )


def render_run(
    header: str,
    block_size: int,
    sequences: list[SequenceReport],
    shown_heads: list[int],
    num_heads: int,
    limit: int | None,
    highlight: tuple[int, int] | None,
    shared: dict[int, int],
    repeated: list[set[int]],
    summary: list[tuple[str, str]],
    show_mask: bool = False,
    mask_rows: list[tuple[int, str]] | None = None,
    mask_seq: int = 0,
) -> Group:
    parts: list = [Text.from_markup(header)]
    for seq in sequences:
        token = highlight[1] if highlight and highlight[0] == seq.index else None
        for pos, head in enumerate(shown_heads):
            parts.append(token_table(seq, pos, head, token, num_heads, show_mask))
        if mask_rows and seq.index == mask_seq:
            parts.append(mask_table(mask_seq, mask_rows, block_size))
        parts.append(coverage_table(seq, block_size, shared, repeated[seq.index], limit))
    parts.append(summary_table(summary))
    return Group(*parts)
