"""Rich views of a simulation: the step timeline, the hit causes, the waste table."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from ..sim.baselines import CATEGORIES
from ..sim.scheduler import StepRecord
from ..sim.summary import Summary
from .text import Fitted, header

ANCHORS = (  # (what, the step it picks) in the order the title names them
    ("the first admission", lambda steps: next((s for s in steps if s.admitted), None)),
    ("the first prefix hit", lambda steps: next((s for s in steps if s.hit_tokens), None)),
    ("the first eviction", lambda steps: next((s for s in steps if s.evicted), None)),
    ("the first preemption", lambda steps: next((s for s in steps if s.preempted), None)),
    ("the last step", lambda steps: steps[-1] if steps else None),
)


def _spread(candidates: list[StepRecord], n: int) -> list[StepRecord]:
    """`n` of `candidates`, evenly spaced over the list (first and last included)."""
    if n <= 0 or not candidates:
        return []
    if n >= len(candidates):
        return list(candidates)
    if n == 1:
        return [candidates[len(candidates) // 2]]
    return [candidates[round(i * (len(candidates) - 1) / (n - 1))] for i in range(n)]


def pick_steps(steps: list[StepRecord], rows: int) -> tuple[list[StepRecord], str]:
    """The run's story in at most `rows` steps, and how they were chosen, in words.

    Every step with an event (admission, preemption, eviction, finish) when they fit.
    Otherwise: the first admission, first prefix hit, first eviction, first preemption and
    the last step; then up to half the remaining rows of preemption steps, spread over all
    of them; then steps with events spread evenly over the whole run."""
    events = [s for s in steps if s.admitted or s.preempted or s.evicted or s.finished]
    if len(events) <= rows:
        return events, "every step with an event"
    chosen: dict[int, StepRecord] = {}
    named = []
    for what, find in ANCHORS:
        s = find(steps)
        if s is not None and len(chosen) < rows:
            if s.step not in chosen:
                chosen[s.step] = s
            named.append(what)
    preempting = [s for s in events if s.preempted and s.step not in chosen]
    for s in _spread(preempting, (rows - len(chosen)) // 2):
        chosen[s.step] = s
    from_preempt = len(chosen)
    rest = [s for s in events if s.step not in chosen]
    for s in _spread(rest, rows - len(chosen)):
        chosen[s.step] = s
    how = ", ".join(named)
    if from_preempt > len(named):
        how += "; preemptions spread over the run"
    how += "; the other steps with events spread evenly"
    return [chosen[k] for k in sorted(chosen)], how


def _names(ids: list[str], limit: int = 4) -> str:
    return ", ".join(ids[:limit]) + (f" +{len(ids) - limit}" if len(ids) > limit else "")


TIMELINE = ("step", "ran", "tok", "admit", "hits", "+blk", "evict", "preempt", "done", "free")


def timeline(steps: list[StepRecord], rows: int) -> Table:
    shown, how = pick_steps(steps, rows)
    t = Table(title=f"Step timeline: {len(shown)} of {len(steps)} steps ({how})", title_justify="left",
              caption="ran: requests run; tok: tokens computed; admit: requests admitted; hits: prefix-hit tokens; "
              "+blk: blocks allocated; evict: cached blocks reused; preempt: requests preempted; done: requests finished; "
              "free: free blocks after the step", caption_justify="left")
    for col in TIMELINE:
        header(t, col, justify="left" if col in ("admit", "preempt", "done") else "right")
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
        t.add_row(cause, f"{n:,}", f"{n / summary.prompt_tokens:.1%}")  # every request has a prompt token (--prompt-len, a trace: at least 1)
    return t


def waste_table(summary: Summary) -> Table:
    t = Table(title="KV memory handed to requests, by use (Kwon et al. 2023, Fig. 2)", title_justify="left")
    header(t, "system", no_wrap=True)
    for c in CATEGORIES:
        header(t, c.replace("fragmentation", "frag."), justify="right")
    header(t, "steps", justify="right")
    header(t, "peak run", justify="right")
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
    parts = [timeline(steps, rows)] if rows > 0 else []
    parts += [block_tables(s, t) for s, t in tables_at.items()]
    parts += [totals(summary), causes_table(summary), Fitted(waste_table(summary))]
    return Group(*parts)


def render_groups(groups: list[dict], usable: int) -> Fitted:
    """simulate --layers: each KV cache group's blocks (one block table per request, one pool)."""
    table = Table(title=f"KV cache groups: one pool of {usable:,} usable blocks, a block table per group", title_justify="left")
    for col in ("group", "attention", "layers", "peak blocks", "mean blocks", "peak share"):
        header(table, col, justify="left" if col == "attention" else "right")
    for g in groups:
        kind = "full" if g["window"] is None else f"sliding, window {g['window']:,}"
        table.add_row(str(g["group"]), kind, str(g["layers"]), f"{g['peak_blocks']:,}", f"{g['mean_blocks']:,.1f}",
                      f"{g['peak_blocks'] / usable:.1%}")
    return Fitted(table)


def render_metric(metric: dict) -> str:
    q, h = metric["queries"], metric["hits"]
    line = (f"vLLM's prefix-cache metric would read {h:,} hits of {q:,} queried tokens ({h / q:.1%}), the hits above: "
            f"it counts each request at its first admission, as pagetrace does" if q else "vLLM's prefix-cache metric: no request admitted")
    if metric["preempted_queries"]:
        line += (f"; preempted requests' lookups apart (preempted_hits {metric['preempted_hits']:,} of "
                 f"{metric['preempted_queries']:,}: recomputation served from the cache)")
    return line


def render_explained(requests, explained: list[dict]) -> Fitted:
    table = Table(title="prefix-cache outcome per request (prompt tokens)", title_justify="left")
    for col in ("request", "prompt", "hit", "partial block", "evicted", "other key", "first seen", "why"):
        header(table, col, justify="left" if col in ("request", "why") else "right", no_wrap=col == "request")
    for req, doc in zip(requests, explained):
        why = doc["prompt_tokens_by_cause"]
        if why is None:
            continue
        notes = {}
        for e in doc.get("evicted_blocks", []):
            if e["step"] is not None:
                key = f"evicted at step {e['step']} by {e['by']}"
                notes[key] = notes.get(key, 0) + 1
        writers = list(dict.fromkeys(e["by"] for e in doc.get("hit_while_written", [])))
        parts = [k + (f" (x{n})" if n > 1 else "") for k, n in notes.items()]
        if writers:
            parts.append(f"hit while written by {', '.join(writers)}")
        if doc.get("recomputed_hit_tokens"):
            parts.append(f"{doc['recomputed_hit_tokens']} tokens hit again after preemption")
        by = "; ".join(parts)
        table.add_row(req.request_id, str(req.prompt_len), str(why["hit"]), str(why["partial block"]), str(why["evicted"]),
                      str(why["different extra key"]), str(why["first seen"]), by)
    return Fitted(table)


def render_comparison(cmp, stream, source: str) -> str:
    lines = [f"KV events: pagetrace predicts {cmp.predicted:,} block events, {source} holds {cmp.server:,} "
             f"({len(stream.batches):,} messages); compared by {cmp.mode}"]
    if cmp.first_divergence is None:
        lines.append(f"  equal: every BlockStored and BlockRemoved, hash by hash, in order ({cmp.agree:,})")
    else:
        d = cmp.first_divergence
        lines.append(f"  agree on the first {cmp.agree:,}; first divergence at event {d['item']:,}:")
        for who in ("pagetrace", "server"):
            s = d[who]
            extra = "".join(f", {k} {s[k]}" for k in ("request", "block") if k in s)
            lines.append(f"    {who}: {s['did']}" + (f" {s['hash']} ({s['where']}{extra})" if "hash" in s else ""))
        if "reason" in d:
            lines.append(f"  why: {d['reason']}")
        for hint in cmp.likely:
            lines.append(f"  likely: {hint['setting']}: {hint['why']}")
    if stream.gaps:
        lines.append("  sequence gaps: " + ", ".join(f"{a}..{b}" for a, b in stream.gaps))
    lines += [f"  note: {n}" for n in cmp.notes]
    return "\n".join(lines)


def render_verdict(cmp) -> str:
    """The last line of `simulate --events`: passed, or failed with the first thing that likely differs."""
    if cmp.passed:
        return f"passed: the server's {cmp.server:,} block events are predicted one for one, in order"
    first = f" ({cmp.likely[0]['setting']} likely differs)" if cmp.likely else ""
    return f"failed: the prediction diverges from the server's events at event {cmp.agree:,}{first}"


def render_sweep(points: list[dict]) -> Fitted:
    """One row per --sweep point: capacity, hit rate (vLLM's metric), peak blocks in use."""
    t = Table(title="sweep: the same workload at each point", title_justify="left")
    t.add_column("point", no_wrap=True, min_width=min(max(len(p["label"]) for p in points), 30))
    for col in ("capacity", "hit rate", "peak use", "preempted", "evicted"):
        header(t, col, justify="right")
    for p in points:
        t.add_row(p["label"], f"{p['capacity_tokens']:,}", f"{p['hit_rate']:.1%}", f"{p['peak_used_share']:.0%}",
                  f"{p['preemptions']:,}", f"{p['evictions']:,}")
    t.caption = ("capacity: tokens the pool holds; hit rate: prompt tokens served from the cache at admission, as vLLM's "
                 "prefix-cache metric counts them; peak use: blocks in use after a step, of the pool's usable blocks")
    t.caption_justify = "left"
    return Fitted(t)


def render_step_model(doc: dict) -> str:
    """The fitted step-time model, its error on a second recording, and the latency estimates."""
    m, c = doc["model"]["coefficients"], doc["check"]
    lat = doc["latency"]
    lines = [f"step time, fitted on {doc['model']['source']} ({doc['model']['steps_fitted']:,} steps, "
             f"{doc['model']['steps_left_out']:,} left out as idle gaps or outliers): seconds = {m['c0']:.3g} + {m['c1']:.3g} x tokens "
             f"+ {m['c2']:.3g} x requests + {m['c3']:.3g} x K/V tokens read; mean error {doc['model']['mae_seconds'] * 1000:.2f} ms a step"]
    if c is not None:
        lines.append(f"  on {c['source']} ({c['steps']:,} steps, {c['mean_step_seconds'] * 1000:.2f} ms each on average): mean error "
                     f"{c['mae_seconds'] * 1000:.2f} ms a step; total {c['predicted_total_seconds']:.2f} s predicted, "
                     f"{c['total_seconds']:.2f} s measured ({c['total_relative_error']:+.1%})")
    t, e = lat["ttft_seconds"], lat["e2e_seconds"]
    lines.append(f"  estimates of this model for this run ({lat['requests']:,} requests, {lat['total_seconds']:.2f} s of steps): "
                 f"TTFT p50 {t['p50']:.3f} s, p90 {t['p90']:.3f} s, p99 {t['p99']:.3f} s; end-to-end p50 {e['p50']:.3f} s, "
                 f"p90 {e['p90']:.3f} s, p99 {e['p99']:.3f} s")
    return "\n".join(lines)


def render_what_if(outcomes) -> Fitted:
    t = Table(title="what if: the same workload under other settings", title_justify="left")
    t.add_column("setting", no_wrap=True, min_width=min(max(len(o.label) for o in outcomes), 40))
    for col in ("hit rate", "peak use", "mean use", "preempted", "steps", "evicted"):
        header(t, col, justify="right")
    for o in outcomes:
        usable = o.setting.num_blocks - 1
        t.add_row(o.label, f"{o.hit_rate:.1%}", f"{o.peak_used / usable:.0%}", f"{o.mean_used_share:.0%}",
                  f"{o.preemptions:,}", f"{o.steps:,}", f"{o.evictions:,}")
    t.caption = "use: blocks in use after a step, as a share of the run's pool; preempted: preemptions; evicted: cached blocks reused"
    t.caption_justify = "left"
    return Fitted(t)
