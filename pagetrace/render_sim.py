"""Rich views of a simulation: the step timeline, the hit causes, the waste table."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from .sim.baselines import CATEGORIES
from .sim.scheduler import StepRecord
from .sim.summary import Summary


def pick_steps(steps: list[StepRecord], rows: int) -> list[StepRecord]:
    """Steps where something happened (admission, preemption, eviction, finish), evenly
    thinned to `rows`; every preemption step is kept while there is room."""
    events = [s for s in steps if s.admitted or s.preempted or s.evicted or s.finished]
    if len(events) <= rows:
        return events
    keep = {id(s) for s in events if s.preempted}
    if len(keep) >= rows:
        return [s for s in events if id(s) in keep][:rows]
    others = [s for s in events if id(s) not in keep]
    room = rows - len(keep)
    keep |= {id(others[round(i * (len(others) - 1) / max(room - 1, 1))]) for i in range(room)}
    return [s for s in events if id(s) in keep]


def _names(ids: list[str], limit: int = 4) -> str:
    return ", ".join(ids[:limit]) + (f" +{len(ids) - limit}" if len(ids) > limit else "")


def timeline(steps: list[StepRecord], rows: int, usable: int) -> Table:
    shown = pick_steps(steps, rows)
    t = Table(title=f"Step timeline ({len(shown)} of {len(steps)} steps: those with events)", title_justify="left",
              caption="ran: requests run; tok: tokens computed; hits: prefix-hit tokens; +blk: blocks allocated; "
              "evict: cached blocks reused", caption_justify="left")
    for col in ("step", "ran", "tok", "admitted", "hits", "+blk", "evict", "preempted", "finished", "free"):
        t.add_column(col, justify="right" if col not in ("admitted", "preempted", "finished") else "left")
    for s in shown:
        t.add_row(
            str(s.step), str(s.scheduled), str(s.tokens), _names(s.admitted), str(s.hit_tokens),
            str(s.allocated), str(s.evicted), f"[bold red]{_names(s.preempted)}[/]" if s.preempted else "",
            _names(s.finished), str(s.free_blocks),
        )
    return t


def causes_table(summary: Summary) -> Table:
    t = Table(title=f"Prompt tokens by prefix-cache outcome (hit rate {summary.hit_rate:.1%})", title_justify="left")
    t.add_column("outcome")
    t.add_column("tokens", justify="right")
    t.add_column("share", justify="right")
    for cause, n in summary.causes.items():
        t.add_row(cause, f"{n:,}", f"{n / summary.prompt_tokens:.1%}" if summary.prompt_tokens else "-")
    return t


def waste_table(summary: Summary) -> Table:
    t = Table(title="KV memory handed to requests, by use (Kwon et al. 2023, Fig. 2)", title_justify="left")
    t.add_column("system", no_wrap=True)
    for c in CATEGORIES:
        t.add_column(c.replace("fragmentation", "frag."), justify="right")
    t.add_column("steps", justify="right")
    t.add_column("peak run", justify="right")
    for w in summary.waste:
        t.add_row(w.system, *(f"{v:.1%}" for v in w.shares().values()), str(w.steps), str(w.peak_running))
    return t


def totals(summary: Summary) -> Table:
    t = Table(show_header=False, title="Summary", title_justify="left")
    t.add_row("KV cache", f"{summary.cache}, vLLM's scheduler")
    prefix = f" ({summary.prefix_requests:,} of them parallel-sampling prefix requests, SGLang's max_new_tokens=0 warm-up)" if summary.prefix_requests else ""
    t.add_row("requests", f"{summary.requests:,}{prefix}")
    t.add_row("steps", f"{summary.steps:,}")
    t.add_row("peak blocks in use", f"{summary.peak_used_blocks:,} of {summary.usable_blocks:,}")
    t.add_row("peak running requests", f"{summary.peak_running:,}")
    t.add_row("preemptions", f"{summary.preemptions:,} ({summary.preempted_requests:,} requests recomputed)")
    t.add_row("cached blocks evicted", f"{summary.evictions:,}")
    return t


def block_tables(step: int, tables: dict[str, list[int]]) -> Table:
    t = Table(title=f"Block tables after step {step}", title_justify="left")
    t.add_column("request")
    t.add_column("blocks")
    for rid, blocks in tables.items():
        shown = blocks if len(blocks) <= 12 else blocks[:9] + ["…"] + blocks[-2:]
        t.add_row(rid, ", ".join(map(str, shown)) + (f"  ({len(blocks)} blocks)" if len(blocks) > 12 else ""))
    return t


def render_simulation(summary: Summary, steps: list[StepRecord], rows: int, tables_at: dict) -> Group:
    parts = [timeline(steps, rows, summary.usable_blocks)] if rows > 0 else []
    parts += [block_tables(s, t) for s, t in tables_at.items()]
    parts += [totals(summary), causes_table(summary), waste_table(summary)]
    return Group(*parts)
