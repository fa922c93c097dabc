"""Rich views of a fleet run (`pagetrace fleet`): per instance and fleet-wide, from its JSON document."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from .text import Fitted, header

BARS = " ▁▂▃▄▅▆▇█"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def sparkline(values: list[int], peak: int, width: int) -> str:
    """`values` squeezed to `width` cells (the max of each bucket), scaled to `peak`."""
    if not values:
        return ""
    if len(values) > width:
        k = len(values) / width
        values = [max(values[int(i * k): max(int((i + 1) * k), int(i * k) + 1)]) for i in range(width)]
    return "".join(BARS[min(8, -(-8 * v // peak))] if peak else BARS[0] for v in values)


def render_fleet(doc: dict, spark_width: int = 24) -> Group:
    fleet = doc["fleet"]
    cfg = doc["config"]
    title = (f"{cfg['instances']} instances, router {cfg['router']}, cache {cfg['cache']}"
             + (f" ({cfg['store_tokens']:,} tokens)" if cfg.get("store_tokens") else "")
             + f": {fleet['requests']:,} requests over {fleet['steps']:,} steps")
    t = Table(title=title, title_justify="left", box=None, padding=(0, 1), header_style="bold")
    header(t, "instance", justify="right", no_wrap=True)
    for name in ("requests", "prompt tokens", "local hit", "shared hit", "evicted", "first seen", "preempted"):
        header(t, name, justify="right")  # a two-word header may wrap; a number is never cut (min width: its own)
    samples = fleet["load"]["samples"]
    peak = max((max(row) for row in samples), default=0)
    load = Table(title="load over time (running + waiting requests)", title_justify="left", box=None, padding=(0, 1), header_style="bold")
    for name in ("instance", "mean", "peak"):
        header(load, name, justify="right", no_wrap=True)
    header(load, f"most in each {fleet['load']['stride']:,} steps", no_wrap=True)

    def row(name, d):
        p, o = d["prompt_tokens"], d["outcomes"]
        t.add_row(name, f"{d['requests']:,}", f"{p:,}", _pct(o["local hit"], p), _pct(o["shared hit"], p), _pct(o["evicted"], p),
                  _pct(o["first seen"], p), f"{d['preemptions']:,}")

    for inst in fleet["instances"]:
        row(str(inst["instance"]), inst)
        col = [r[inst["instance"]] for r in samples]
        load.add_row(str(inst["instance"]), f"{inst['mean_load']:.2f}", str(inst["peak_load"]), sparkline(col, peak, spark_width))
    row(Text("fleet", style="bold"), fleet)
    imb = fleet["imbalance"]
    parts = [Fitted(t), Fitted(load),
             Text(f"hit rate {100 * fleet['hit_rate']:.1f}% (local {100 * fleet['local_hit_rate']:.1f}%, shared {100 * fleet['shared_hit_rate']:.1f}%); "
                  f"imbalance (max / mean over instances): requests {imb['requests']:.2f}, prefill tokens {imb['prefill_tokens']:.2f}, "
                  f"load {imb['mean_load']:.2f}")]
    if "store" in fleet:
        s = fleet["store"]
        parts.append(Text(f"shared store: {s['held_blocks']:,} of {s['capacity_blocks']:,} blocks held at the end, "
                          f"{s['puts']:,} put (evicted from a pool), {s['hit_blocks']:,} read"))
    return Group(*parts)


def render_missed(missed: list[dict], rows: int = 10) -> Group:
    """--explain: the requests the router sent away from the instance holding their prefix."""
    if not missed:
        return Group(Text("explain: no request missed a prefix that another instance held when it was routed"))
    by_pair: dict[tuple[int, int], list[int]] = {}
    for m in missed:
        by_pair.setdefault((m["instance"], m["held_by"]), []).append(m["missed_tokens"])
    total = sum(m["missed_tokens"] for m in missed)
    t = Table(title=f"explain: {len(missed):,} requests missed {total:,} prompt tokens another instance held when they were routed",
              title_justify="left", box=None, padding=(0, 1), header_style="bold")
    for name in ("sent to", "held by", "requests", "tokens missed"):
        header(t, name, justify="right", no_wrap=True)
    for (sent, held), toks in sorted(by_pair.items(), key=lambda kv: -sum(kv[1]))[:rows]:
        t.add_row(str(sent), str(held), f"{len(toks):,}", f"{sum(toks):,}")
    first = Table(title="the first of them", title_justify="left", box=None, padding=(0, 1), header_style="bold")
    for name in ("request", "sent to", "its prefix there", "held by", "prefix there", "tokens missed"):
        header(first, name, justify="right", no_wrap=True)
    for m in missed[:rows]:
        first.add_row(m["request"], str(m["instance"]), f"{m['cached_blocks']} blocks", str(m["held_by"]), f"{m['held_blocks']} blocks",
                      f"{m['missed_tokens']:,}")
    return Group(Fitted(t), Fitted(first))


def render_verdicts(verdicts: list[dict]) -> Group:
    """Each instance's predicted KV events against its server's."""
    t = Table(title="each instance against its server's KV events", title_justify="left", box=None, padding=(0, 1), header_style="bold")
    for name in ("instance", "events file", "predicted", "server", "agree", "verdict"):
        header(t, name, justify="left" if name in ("events file", "verdict") else "right")
    for v in verdicts:
        ok = v["equal"] and not v["gaps"]
        t.add_row(str(v["instance"]), v["events"], f"{v['predicted_items']:,}", f"{v['server_items']:,}", f"{v['agree']:,}",
                  Text("block for block" if ok else "DIFFERS", style="green" if ok else "bold red"))
    lines = []
    for v in verdicts:
        d = v.get("first_divergence")
        if d and d.get("reason"):
            lines.append(Text(f"instance {v['instance']}: {d['reason']}"))
        for hint in v.get("likely", ()):
            lines.append(Text(f"instance {v['instance']}: likely {hint['setting']}: {hint['why']}"))
    return Group(Fitted(t), *lines)
