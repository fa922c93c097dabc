"""`pagetrace run`: the real paged-attention kernel, traced token by token and checked.

`pagetrace.attention.traced_run` checks the options (`prepare`) and runs and checks the kernel
(`execute`); this module parses, then prints the result (or one JSON document) before it
reports a failed check.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ..attention.traced_run import (
    BACKEND_NAMES,
    RunResult,
    Variant,
    execute,
    memory_note,
    prepare,
)
from ..errors import RuntimeFailure
from .diagram import DotOption, HtmlOption, PngOption, SvgOption, report_console, save_diagrams, save_page
from .options import DEVICE, AliasChoice, ChoiceOption, FloatOption, IntOption, dtype_choice, layout_choice

HELP = (
    "Run the Triton paged-attention kernel and show, for every token, its logical block, offset, "
    "physical block, slot and attention weight, checked against contiguous attention."
)
EPILOG = (
    "Example: pagetrace run --tokens 38   (the worked example); pagetrace run --tokens 38,100 --heads 8 --kv-heads 2 --head-dim 64; "
    "pagetrace run --tokens 38 --query-len 6   (a prefill of its last 6 tokens)"
)

DEFAULT_ROWS = 40


def run(
    tokens: Annotated[str, typer.Option(help="Tokens in each sequence, comma-separated: 38 or 38,100.")] = "38",
    table: Annotated[list[str] | None, typer.Option(help="Block table of a sequence (repeat once per sequence): 7,2,15. Default: the worked example's 7,2,15 for sequence 0, then seeded free blocks.")] = None,
    block_size: Annotated[int, IntOption(help="Tokens per block.")] = 16,
    head_dim: Annotated[int, IntOption(help="Elements per head vector.")] = 8,
    heads: Annotated[int, IntOption(help="Query heads.")] = 1,
    kv_heads: Annotated[int, IntOption(help="KV heads (heads must be a multiple: GQA, MQA).")] = 1,
    num_blocks: Annotated[int | None, IntOption(help="Physical blocks in the pool (default: 16, grown as the tokens need).")] = None,
    dtype: Annotated[str, ChoiceOption(dtype_choice(), help="Cache and query dtype, any case: fp32 (float32, float), fp16 (float16, half) or bf16 (bfloat16); or an fp8 cache, fp8_e4m3 (fp8) or fp8_e5m2 (fp16 queries).")] = "fp32",
    layout: Annotated[str | None, ChoiceOption(layout_choice(kernel_only=True), help="Cache layout, any case (default: blocks for one KV head, else nhd).")] = None,
    seed: Annotated[int, IntOption(help="Seed for the cache, the query and the drawn block tables.")] = 0,
    scale: Annotated[float | None, FloatOption(help="Score scale (default: 1/sqrt(head_dim)).")] = None,
    token: Annotated[int | None, IntOption(help="Highlight this token and print its lookup (default: 20, as in the worked example, when sequence 0 has it).")] = None,
    seq: Annotated[int, IntOption(help="The sequence --token belongs to.")] = 0,
    rows: Annotated[str, typer.Option(help="Rows per table: a number, or 'all'. Long sequences show the first, the last and the heaviest rows.")] = str(DEFAULT_ROWS),
    show_heads: Annotated[str | None, typer.Option(help="Query heads to tabulate, comma-separated, or 'all' (default: all up to 4 heads, else head 0).")] = None,
    backend: Annotated[str, ChoiceOption(AliasChoice(("auto", *BACKEND_NAMES)), help="auto, triton (compiled, CUDA), interpret (Triton's interpreter, CPU) or torch.")] = "auto",
    device: Annotated[str, ChoiceOption(DEVICE, help="auto, cpu, cuda or cuda:N (a string, not a fixed list: N is any device index).")] = "auto",
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document with every row and nothing else on stdout.")] = False,
    html: HtmlOption = None,
    query_len: Annotated[str | None, typer.Option(help="New (query) tokens per sequence, the last ones of --tokens: 6, or per sequence 6,1,1 (a prefill or mixed batch). Default: decode, one each.")] = None,
    query: Annotated[int | None, IntOption(help="Which new token of --seq the tables show, 0-based (default: the last).")] = None,
    sliding_window: Annotated[int | None, IntOption(help="A query at position p sees keys j > p - W only.")] = None,
    soft_cap: Annotated[float | None, FloatOption(help="Soft-cap the scores: c * tanh(score / c), before the mask.")] = None,
    alibi: Annotated[bool, typer.Option("--alibi", help="Add ALiBi biases, slope_h * (j - p), with the standard slopes per head.")] = False,
    k_scale: Annotated[float | None, FloatOption(help="fp8 key cache scale (value = stored x scale; default 1).")] = None,
    v_scale: Annotated[float | None, FloatOption(help="fp8 value cache scale (default 1).")] = None,
    partition_size: Annotated[int | None, IntOption(help="Split-K partition in tokens, a multiple of 16 (default: 4096 on the CPU, by SM count on a GPU).")] = None,
) -> None:
    from ..views.diagram import MappingView, SequenceMap, check_output_paths
    from ..views.diagram.outputs import requested_outputs
    from ..views.page import check_page_path
    from .output import emit_json, stderr_console

    check_output_paths(svg, png, dot, json=json_output)  # before any work
    check_page_path(html, requested_outputs(svg, png, dot), json_output)
    variant = Variant(query_len, query, sliding_window, soft_cap, alibi, k_scale, v_scale, partition_size)
    setup = prepare(tokens, table, block_size, head_dim, heads, kv_heads, num_blocks, dtype, layout, seed, scale, token, seq, rows, show_heads, backend, device, json_output, variant)
    err = stderr_console()
    for warning in setup.plan.warnings:
        err.print(f"warning: {warning}", style="bold red", markup=False, emoji=False, soft_wrap=True)
    note = memory_note(setup)
    if note:
        err.print(note, markup=False, emoji=False, soft_wrap=True)
    result = execute(setup, all_rows=json_output or html is not None, status=err.status)

    view = MappingView(
        block_size=setup.plan.block_size,
        num_blocks=setup.plan.num_blocks,
        sequences=[SequenceMap(f"seq {r.index}", r.seq_len, r.table, attention_mass=r.block_mass,
                               masked=r.block_masked if any(c or w for c, w in r.block_masked) else None) for r in result.reports],
        highlight=(setup.seq, setup.token) if setup.token is not None else None,
    )
    saved, diagram_failure = None, None
    try:
        saved = save_diagrams(view, svg, png, dot, quiet=json_output)
    except RuntimeFailure as exc:  # the run's result is still worth printing
        diagram_failure = exc
    document = run_json(result) if json_output or html is not None else None
    if html is not None and diagram_failure is None:
        try:
            from ..views.page import fixed_bytes
            from ..views.page.run_data import run_page_doc, run_title

            save_page(html, "run", run_page_doc(document, fixed_bytes()), run_title(setup.plan.seq_lens, setup.plan.block_size), quiet=json_output)
        except RuntimeFailure as exc:
            diagram_failure = exc
    if json_output:
        if svg or png or dot:
            document["diagrams"] = saved["written"] if saved else []
        emit_json(document)
    else:
        console = report_console(svg, png, dot, html)
        console.print(render(result))
        if saved is None and diagram_failure is None:
            from ..views.diagram import terminal_mapping

            console.print(terminal_mapping(view))
        if setup.token is not None:
            from ..paging.lookup import trace_token
            from ..views.text import render_lookup

            console.print(render_lookup(trace_token(
                setup.token, setup.plan.tables[setup.seq], block_size=setup.plan.block_size, head_dim=setup.head_dim,
                kv_heads=setup.kv_heads, head=0, dtype=setup.dtype, layout=setup.layout, num_blocks=setup.plan.num_blocks,
                allow_repeats=True,
            )))
    checks = result.checks
    if not checks.slots_match:
        raise RuntimeFailure("the kernel read slots that the block table does not give: " + "; ".join(checks.slot_mismatches))
    if not checks.passed:
        what = "paged attention differs from contiguous attention" if setup.backend != "torch" else "the torch backend's result differs from float64 attention"
        raise RuntimeFailure(f"{what}: max |diff| {checks.max_abs_diff:.3g} is over the {setup.dtype} tolerance {checks.tolerance:g}")
    if diagram_failure is not None:
        raise diagram_failure


def render(result: RunResult):
    from ..views.run import check_line, render_run

    s, plan, checks = result.setup, result.setup.plan, result.checks
    name = BACKEND_NAMES[s.backend]
    several = len(plan.seq_lens) > 1
    header = (
        f"[bold]pagetrace run[/] · {len(plan.seq_lens)} sequence(s) · tokens {s.tokens_text} · block size {plan.block_size} · "
        f"head_dim {s.head_dim} · {s.heads} head(s) / {s.kv_heads} KV head(s) · {s.dtype} · layout {s.layout} · "
        f"pool {plan.num_blocks} blocks · backend [bold]{s.backend}[/] ({name}) on {s.device}"
    )
    extras = [f"{k} {v}" for k, v in (("sliding window", s.sliding_window), ("soft cap", s.soft_cap), ("k_scale", s.k_scale if s.dtype.startswith("fp8") else None),
                                        ("v_scale", s.v_scale if s.dtype.startswith("fp8") else None)) if v is not None]
    extras += ["ALiBi"] * s.alibi
    if s.query_lens:
        extras.insert(0, "new tokens " + ",".join(map(str, s.query_lens)))
    if extras:
        header += " · " + " · ".join(extras)
    repeated = [repeated_blocks(r.table) for r in result.reports]
    shown = result.reports[s.seq]
    first = shown.heads[0]
    summary = []
    if s.query_lens:
        summary.append(("query", f"new token {shown.query} of {s.query_lens[s.seq]} in sequence {s.seq}, at position {shown.query_position}: the tables show its scores, mask and weights"))
    if s.token is not None:
        where = f" (sequence {s.seq}, KV head 0)" if several or s.kv_heads > 1 else ""
        summary.append((f"key vector norm at token {s.token}", f"{result.key_norm:.4f}{where}"))
    where = f" (sequence {s.seq}, head {first.head})" if several or s.heads > 1 else ""
    summary += [
        ("max attention weight", f"{first.max_weight:.4f} at position {first.argmax}{where}"),
        ("output vector norm", f"{first.output_norm:.4f}{where}"),
        ("check", check_line(checks, kernel_ran=s.backend != "torch")),
        ("slots", slots_line(checks, kernel_ran=s.backend != "torch")),
        ("backend", f"{s.backend} ({name}) on {s.device}, {result.elapsed * 1000:.1f} ms, partitions of {result.partition_size} tokens"),
    ]
    highlight = (s.seq, s.token) if s.token is not None else None
    return render_run(header, plan.block_size, result.reports, s.shown_heads, s.heads, s.limit, highlight, plan.shared, repeated, summary,
                      show_mask=bool(result.mask_rows), mask_rows=result.mask_rows, mask_seq=s.seq)


def repeated_blocks(table: list[int]) -> set[int]:
    """Physical blocks a table maps more than once (one pass: a count per block would be quadratic)."""
    from collections import Counter

    return {p for p, n in Counter(table).items() if n > 1}


def slots_line(checks, kernel_ran: bool) -> str:
    if not checks.slots_match:
        return "[bold red]" + "; ".join(checks.slot_mismatches) + "[/]"
    if kernel_ran:
        return "every slot the kernel read matches the block table"
    return "not checked: no kernel ran (the torch backend gathers by the block table's own slots)"


def row_addresses(geom, rows) -> list[dict]:
    """Where each row's key and value vectors start in the cache's layout, per KV head."""
    from ..paging.layouts import start_addresses

    return start_addresses(geom, [row.physical_block for row in rows], [row.offset for row in rows])


def run_json(result: RunResult) -> dict:
    from ..paging.layouts import make_geometry

    s, plan, checks = result.setup, result.setup.plan, result.checks
    geom = make_geometry(s.layout, plan.num_blocks, plan.block_size, s.kv_heads, s.head_dim, s.dtype)
    return {
        "config": {
            "tokens": plan.seq_lens, "block_size": plan.block_size, "head_dim": s.head_dim, "heads": s.heads,
            "kv_heads": s.kv_heads, "num_blocks": plan.num_blocks, "dtype": s.dtype, "layout": s.layout, "seed": s.seed,
            "scale": s.scale, "device": str(s.device), "backend": s.backend, "partition_size": result.partition_size,
            "query_lens": s.query_lens or [1] * len(plan.seq_lens), "sliding_window": s.sliding_window, "soft_cap": s.soft_cap,
            "alibi": s.alibi, "element_size": geom.element_size, "k_scale": s.k_scale if s.dtype.startswith("fp8") else None, "v_scale": s.v_scale if s.dtype.startswith("fp8") else None,
        },
        "mask_map": [{"position": p, "blocks": cells} for p, cells in (result.mask_rows or [])],
        "shown_heads": s.shown_heads,
        "shared_blocks": {str(k): v for k, v in plan.shared.items()},
        "warnings": plan.warnings,
        "token": None if s.token is None else {"sequence": s.seq, "token": s.token, "key_norm": result.key_norm},
        "sequences": [
            {
                "index": r.index,
                "seq_len": r.seq_len,
                "query": {"index": r.query, "position": r.query_position, "row": r.query_row},
                "block_table": r.table,
                "coverage": [
                    {"logical_block": sp.logical_block, "physical_block": sp.physical_block, "first_token": sp.first_token,
                     "last_token": sp.last_token, "attention_mass": m, "causal_masked": c, "window_masked": w}
                    for sp, m, (c, w) in zip(r.spans, r.block_mass, r.block_masked)
                ],
                "heads": [vars(h) for h in r.heads],
                "rows": [{**vars(row), **address} for row, address in zip(r.rows, row_addresses(geom, r.rows))],
                **({"queries": r.choices} if r.choices else {}),
            }
            for r in result.reports
        ],
        "checks": {
            "max_abs_diff": checks.max_abs_diff,
            "tolerance": checks.tolerance,
            "passed": checks.passed,
            "compared": "kernel vs contiguous float64 attention" if s.backend != "torch" else "torch backend fp32 vs the same gather in float64 (no kernel ran)",
            "slots_checked": s.backend != "torch",
            "slots_match": checks.slots_match,
            "slot_mismatches": checks.slot_mismatches,
            "logit_max_abs_diff": checks.logit_max_abs_diff,
        },
        "time_s": result.elapsed,
    }
