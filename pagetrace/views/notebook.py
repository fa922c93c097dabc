"""How the Python API's results show themselves in a notebook (Jupyter's `_repr_html_`, `_repr_svg_`).

Each result's class has a one-line method that calls a builder here, so nothing of this
module loads until a notebook displays something. Small HTML: no script, no style sheet
(inline styles only), never a whole tensor: long sequences show their first and last rows.

A token's lookup (`TokenTrace`) also carries the interactive `--html` page, inline: an iframe whose
`srcdoc` is the page `pagetrace lookup --html` writes (its script runs inside the sandboxed frame,
its Content-Security-Policy still forbids any request). Where a viewer drops iframes or scripts
(GitHub's, nbviewer's static render), the static table before it is what shows.
"""

from __future__ import annotations

from html import escape

EDGE_ROWS = 6  # rows shown at each end of a long table
_TABLE = 'style="border-collapse:collapse;font-family:monospace;font-size:12px"'
_CELL = 'style="padding:1px 8px;text-align:right;border-bottom:1px solid #ddd"'
_HEAD = 'style="padding:1px 8px;text-align:right;border-bottom:2px solid #888"'
_TRACE = "background:#E69F00"  # Okabe-Ito orange, as the --html page marks the traced token


def table(headers: list[str], rows: list[list], caption: str = "", marked: set[int] | None = None) -> str:
    marked = marked or set()
    out = [f"<table {_TABLE}>"]
    if caption:
        out.append(f'<caption style="text-align:left;font-weight:bold">{escape(caption)}</caption>')
    out.append("<tr>" + "".join(f"<th {_HEAD}>{escape(str(h))}</th>" for h in headers) + "</tr>")
    for i, row in enumerate(rows):
        style = f' style="{_TRACE}"' if i in marked else ""
        out.append(f"<tr{style}>" + "".join(f"<td {_CELL}>{escape(str(c))}</td>" for c in row) + "</tr>")
    out.append("</table>")
    return "".join(out)


def shown(n: int, keep: int = EDGE_ROWS, also: tuple[int, ...] = ()) -> list[int | None]:
    """Indices 0..n-1, or the first and last `keep` and those in `also`, with None for each gap."""
    if n <= 2 * keep + 1:
        return list(range(n))
    picked = sorted({*range(keep), *range(n - keep, n), *(i for i in also if 0 <= i < n)})
    out: list[int | None] = []
    for i in picked:
        if out and out[-1] is not None and i != out[-1] + 1:
            out.append(None)
        out.append(i)
    return out


# ---------------------------------------------------------------- TokenTrace: the four-step lookup


def token_trace_html(t) -> str:
    g, loc = t.geometry, t.location
    bs = g.block_size
    steps = [
        ["1. logical block", f"{loc.token} // {bs}", loc.logical_block],
        ["2. offset in the block", f"{loc.token} % {bs}", loc.offset],
        ["3. physical block", f"block_table[{loc.logical_block}]", loc.physical_block],
        ["4. slot in the pool", f"{loc.physical_block} × {bs} + {loc.offset}", loc.slot],
        ["key: element, byte", f"layout {g.layout.name}, KV head {t.head}", f"{t.key.element_offset:,}, {t.key.byte_offset:,}"],
        ["value: element, byte", f"{g.dtype}, {g.element_size} B each", f"{t.value.element_offset:,}, {t.value.byte_offset:,}"],
    ]
    title = f"token {loc.token}, block table {list(t.table)}, block size {bs}"
    return table(["step", "arithmetic", "result"], steps, caption=title) + inline_page("lookup", t.to_json(), f"pagetrace lookup: token {loc.token}", 760)


def inline_page(kind: str, doc: dict, title: str, height: int = 720) -> str:
    """The `--html` page of `doc` inside an iframe (`srcdoc`, scripts allowed in its sandbox, nothing else)."""
    from .page import page_bytes

    page = page_bytes(kind, doc, title).decode("utf-8")
    return (f'<iframe class="pagetrace-page" title="{escape(title)} (interactive)" sandbox="allow-scripts" '
            f'style="width:100%;height:{height}px;border:1px solid #bbb;margin-top:8px" srcdoc="{escape(page, quote=True)}"></iframe>')


def token_trace_text(t) -> str:
    loc = t.location
    return (f"TokenTrace(token {loc.token}: logical block {loc.logical_block}, offset {loc.offset}, physical block {loc.physical_block}, "
            f"slot {loc.slot}; key at element {t.key.element_offset} (byte {t.key.byte_offset}), layout {t.geometry.layout.name})")


# ---------------------------------------------------------------- Trace: the kernel's record


def trace_text(tr) -> str:
    q, h, n = tr.logits.shape
    return (f"Trace(backend={tr.backend!r}, {q} query token(s), {tr.slots.shape[0]} sequence(s), {h} head(s), "
            f"up to {n} keys, partitions of {tr.partition_size})")


def trace_checks(tr) -> list[tuple[str, str]]:
    """What a reader checks at a glance: the softmax of every row sums to one over the visible keys,
    and every key the kernel read has a slot (none past the end)."""
    import torch

    w = tr.weights
    visible = tr.mask[:, None, :] == 0
    sums = torch.where(visible, w, torch.zeros_like(w)).sum(-1)
    worst = float((sums - 1).abs().max()) if sums.numel() else 0.0
    read = tr.slots >= 0
    return [
        ("softmax rows sum to 1", f"max |sum - 1| = {worst:.2e}"),
        ("keys read", f"{int(read.sum()):,} slots over {tr.slots.shape[0]} sequence(s); {int((tr.partitions >= 0).sum()):,} with a partition"),
        ("masked", f"{int((tr.mask == 1).sum()):,} causal, {int((tr.mask == 2).sum()):,} window (query x key pairs)"),
    ]


def trace_html(tr, max_sequences: int = 4) -> str:
    parts = [f"<p><code>{escape(trace_text(tr))}</code></p>"]
    mask_words = {0: "visible", 1: "causal", 2: "window", -1: "-"}
    for s in range(min(tr.slots.shape[0], max_sequences)):
        rows = tr.rows_of(s)
        if not len(rows):
            continue
        r = rows[-1]
        n = int((tr.slots[s] >= 0).sum())
        w = tr.weights[r, 0]
        best = int(w[:n].argmax()) if n else -1
        body = []
        marked = set()
        for t in shown(n, also=(best,)):
            if t is None:
                body.append(["⋮", "", "", "", ""])
                continue
            if t == best:
                marked.add(len(body))
            body.append([t, int(tr.slots[s, t]), int(tr.partitions[s, t]), mask_words.get(int(tr.mask[r, t]), "?"), f"{float(w[t]):.4f}"])
        caption = f"sequence {s}: {n} keys; its last new token (row {r}), head 0" + (f"; max weight {float(w[best]):.4f} at {best}" if best >= 0 else "")
        parts.append(table(["token", "slot", "partition", "mask", "weight"], body, caption=caption, marked=marked))
    if tr.slots.shape[0] > max_sequences:
        parts.append(f"<p>… {tr.slots.shape[0] - max_sequences} more sequence(s)</p>")
    parts.append(table(["check", "result"], [list(c) for c in trace_checks(tr)], caption="checks"))
    return "".join(parts)


# ---------------------------------------------------------------- diagrams


def render_svg(source: str) -> str | None:
    """DOT source rendered to SVG by the system's `dot` or graphviz-pure; None when neither runs."""
    from .diagram.engines import find_engine, render

    engine = find_engine()
    if engine is None:
        return None
    return render(source, "svg", engine).decode("utf-8")


def digraph_mimebundle(graph) -> dict:
    svg = render_svg(graph.source)
    bundle = {"text/plain": f"<pagetrace diagram: {len(graph.body)} statements of DOT; no Graphviz engine ran>" if svg is None else "<pagetrace diagram>"}
    if svg is not None:
        bundle["image/svg+xml"] = svg
    return bundle


# ---------------------------------------------------------------- simulate


def used_chart(steps, usable: int, width: int = 480, height: int = 120) -> str:
    """Blocks in use per step, a line over the run (an inline SVG)."""
    if not steps:
        return ""
    n = len(steps)
    stride = max(1, n // width)
    points = []
    for i in range(0, n, stride):
        x = 40 + (width - 50) * i / max(1, n - 1)
        y = 10 + (height - 30) * (1 - steps[i].used_blocks / max(1, usable))
        points.append(f"{x:.1f},{y:.1f}")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" aria-label="blocks in use per step">'
            f'<rect x="40" y="10" width="{width - 50}" height="{height - 30}" fill="#f5f5f2" stroke="#999"/>'
            f'<polyline fill="none" stroke="#0072B2" stroke-width="1.5" points="{" ".join(points)}"/>'
            f'<text x="0" y="16" font-size="10" font-family="monospace">{usable}</text><text x="0" y="{height - 20}" font-size="10" font-family="monospace">0</text>'
            f'<text x="40" y="{height - 4}" font-size="10" font-family="monospace">blocks in use (blue), step 0 to {steps[-1].step} of the run</text></svg>')


def sim_result_rows(result) -> list[list]:
    steps = result.steps
    prompt = sum(len(r.prompt) for r in result.requests)
    hits = sum(s.hit_tokens for s in steps)
    usable = result.policy.pool.num_blocks - 1
    return [
        ["cache", result.policy.label],
        ["requests", f"{len(result.requests):,}"],
        ["steps", f"{len(steps):,}"],
        ["preemptions", f"{result.num_preemptions:,}"],
        ["prefix-cache hit tokens", f"{hits:,} of {prompt:,} prompt tokens ({hits / prompt if prompt else 0:.1%})"],
        ["peak blocks in use", f"{max((s.used_blocks for s in steps), default=0):,} of {usable:,}"],
        ["peak running", f"{max((s.running for s in steps), default=0):,}"],
        ["evictions", f"{result.policy.pool.evictions:,}"],
    ]


def sim_result_html(result) -> str:
    usable = result.policy.pool.num_blocks - 1
    return table(["", ""], sim_result_rows(result), caption="simulate") + used_chart(result.steps, usable)


def sim_result_text(result) -> str:
    return (f"SimResult({result.policy.label}: {len(result.requests):,} requests, {len(result.steps):,} steps, "
            f"{result.num_preemptions:,} preemptions)")


# ---------------------------------------------------------------- replay


def replay_html(summary) -> str:
    rows = [[r.request, r.new_tokens, r.seq_len, ",".join(map(str, r.table)), f"{r.vs_contiguous:.2e}",
             "-" if r.vs_engine is None else f"{r.vs_engine:.2e}", "equal" if r.passed else "DIFFERS"] for r in summary.requests]
    verdict = f"passed: {summary.compared}" if summary.passed else "failed: the replay differs"
    return (table(["request", "new", "seq_len", "block table", "vs contiguous", "vs engine", ""], rows, caption=f"replay ({summary.backend}, {summary.dtype})")
            + f"<p>{escape(verdict)} (tolerance {summary.tolerance:g} × (1 + |x|))</p>")


def violations_html(violations) -> str:
    """`check_step`'s findings: one row per violation, with where it is (request, token, blocks, byte)."""
    if not violations:
        return "<p>passed: every invariant holds</p>"
    dash = lambda x: "-" if x is None else x  # noqa: E731
    rows = [[v.check, v.step, dash(v.request), dash(v.token), dash(v.logical_block), dash(v.physical_block), dash(v.slot), dash(v.byte), v.message]
            for v in violations[:200]]
    more = f"<p>… {len(violations) - 200} more</p>" if len(violations) > 200 else ""
    return table(["check", "step", "request", "token", "logical", "physical", "slot", "byte", "what"], rows,
                 caption=f"{len(violations)} violation(s)") + more
