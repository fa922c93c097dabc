"""Terminal and diagram views of `pagetrace replay`."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .diagram import MappingView, SequenceMap
from .text import header


def mapping_view(manifest, step, summary) -> MappingView:
    """The step's real block tables; blocks in several tables are drawn shared, with their
    reference count; the traced request carries its attention mass per block."""
    sequences = []
    for r, (name, n, row) in enumerate(zip(step.requests, step.seq_lens, step.block_table)):
        table = row[: -(-n // manifest.block_size)]
        mass = summary.block_mass if r == summary.traced_request else None
        sequences.append(SequenceMap(f"req {name}", n, table, mass))
    return MappingView(manifest.block_size, manifest.num_blocks, sequences, highlight=(summary.traced_request, summary.traced_token))


def render_replay(manifest, step, layer: int, summary, limit: int) -> Group:
    head = Text(
        f"{manifest.engine_words} step {step.step} layer {layer} · layout {manifest.layout.name} · "
        f"block size {manifest.block_size} · {manifest.dtype} · backend {summary.backend}{'' if summary.kernel_ran else ' (no kernel ran)'}\n"
        f"cache read: {summary.cache_read}"
    )
    ran = "kernel" if summary.kernel_ran else "torch path"
    per_request = Table(title="requests", title_justify="left", box=None, pad_edge=False,
                        caption=f"vs contiguous, vs engine: the largest |{ran} - contiguous attention| and |{ran} - the engine's output|",
                        caption_justify="left")
    for col in ("request", "new", "seq_len", "block table", "vs contiguous", "vs engine", ""):
        header(per_request, col, justify="left" if col in ("request", "block table", "") else "right")
    for r in summary.requests:
        table = ",".join(f"{b}(x{summary.refcount[b]})" if summary.refcount[b] > 1 else str(b) for b in r.table)
        per_request.add_row(r.request, str(r.new_tokens), str(r.seq_len), table, f"{r.vs_contiguous:.2e}",
                            "-" if r.vs_engine is None else f"{r.vs_engine:.2e}", "equal" if r.passed else "DIFFERS")
    rows = Table(title=f"request {summary.traced_name}, token {summary.traced_token}: what it read (weights: mean over heads)", title_justify="left", box=None, pad_edge=False)
    for col in ("token", "logical", "offset", "physical", "slot", "ref", "score", "weight"):
        rows.add_column(col, justify="right")
    order = sorted(range(len(summary.rows)), key=lambda t: -summary.rows[t]["weight"])
    shown = set(order[: limit - 4]) | {0, len(summary.rows) - 1}
    previous = -1
    for t in sorted(shown):
        if t != previous + 1:
            rows.add_row("...")  # Rich leaves the other cells empty
        row = summary.rows[t]
        rows.add_row(*(str(row[k]) for k in ("token", "logical_block", "offset", "physical_block", "slot", "refcount")), f"{row['score']:.4f}", f"{row['weight']:.4f}")
        previous = t
    verdict = Text(
        f"passed: {summary.compared} (tolerance {summary.tolerance:g} x (1 + |x|))"
        if summary.passed else f"failed: replay differs beyond {summary.tolerance:g} x (1 + |x|)"
    )
    return Group(head, per_request, rows, verdict)
