"""A fleet sweep's table (Rich) and chart (SVG): hit rate against each instance's capacity,
one line per trace, router, instance count and cache."""

from __future__ import annotations

from html import escape

from rich.table import Table

from .text import Fitted, header

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def series_label(p: dict) -> str:
    cache = p["cache"] + (f" {p['store_tokens']:,}" if p["cache"] == "store" else "")
    trace = p["trace"].rsplit("/", 1)[-1]
    return f"{trace} · {p['router']} · {p['instances']} inst. · {cache}"


def render_sweep(rows: list[dict]) -> Fitted:
    t = Table(title=f"fleet sweep: {len(rows)} points", title_justify="left", box=None, padding=(0, 1), header_style="bold")
    many = len({r["point"]["trace"] for r in rows}) > 1
    for name in ("run", "tokens each", "hit rate", "shared", "preempted", "imbalance", "seconds"):
        header(t, name, justify="left" if name == "run" else "right", no_wrap=name == "run")
    for r in rows:
        p = r["point"]
        cache = p["cache"] + (f" {p['store_tokens']:,}" if p["cache"] == "store" else "")
        run = (p["trace"].rsplit("/", 1)[-1] + " " if many else "") + f"{p['router']} x{p['instances']} {cache}"
        t.add_row(run, f"{r['capacity_tokens']:,}", f"{100 * r['hit_rate']:.1f}%", f"{100 * r['shared_hit_rate']:.1f}%",
                  f"{r['preemptions']:,}", f"{r['imbalance']['requests']:.2f}", f"{r['seconds']:.1f}")
    return Fitted(t)


def sweep_svg(rows: list[dict], title: str = "fleet sweep: hit rate against each instance's capacity") -> str:
    """Hit rate (y, 0-100 %) against capacity per instance in tokens (x, log scale when it spans
    more than a factor of 10), one polyline per series."""
    import math

    series: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        series.setdefault(series_label(r["point"]), []).append((r["capacity_tokens"], r["hit_rate"]))
    xs = [x for pts in series.values() for x, _ in pts] or [1]
    lo, hi = min(xs), max(xs)
    log = hi > 10 * lo
    W, H, L, R, T, B = 720, 420, 60, 20, 40, 60
    legend_h = 16 * len(series)
    H += legend_h

    def fx(x):
        if hi == lo:
            return L + (W - L - R) / 2
        a, b, v = (math.log10(lo), math.log10(hi), math.log10(x)) if log else (lo, hi, x)
        return L + (v - a) / (b - a) * (W - L - R)

    def fy(y):
        return T + (1 - y) * (H - legend_h - T - B)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>', f'<text x="{L}" y="22" font-size="14">{escape(title)}</text>']
    for k in range(0, 11, 2):  # y grid
        y = fy(k / 10)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{k * 10}%</text>')
    for x in sorted(set(xs)):
        out.append(f'<text x="{fx(x):.1f}" y="{fy(0) + 18:.1f}" text-anchor="middle">{x:,}</text>')
    out.append(f'<text x="{(L + W - R) / 2:.1f}" y="{fy(0) + 38:.1f}" text-anchor="middle">KV cache per instance (tokens{", log scale" if log else ""})</text>')
    for i, (name, pts) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = sorted(pts)
        path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" stroke-width="2"/>')
        out.extend(f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="3" fill="{colour}"><title>{escape(name)}: {100 * y:.1f}% at {x:,}</title></circle>'
                   for x, y in pts)
        ly = H - legend_h + 16 * i + 4
        out.append(f'<rect x="{L}" y="{ly - 9}" width="12" height="3" fill="{colour}"/>')
        out.append(f'<text x="{L + 18}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
