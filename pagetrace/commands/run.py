"""`pagetrace run`: the real paged-attention kernel, traced token by token and checked."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from ..blocks import parse_int_list
from ..errors import RuntimeFailure, UsageError
from .diagram import DotOption, PngOption, SvgOption, save_diagrams

HELP = (
    "Run the Triton paged-attention kernel and show, for every token, its logical block, offset, "
    "physical block, slot and attention weight, checked against contiguous attention."
)
EPILOG = "Example: pagetrace run --tokens 38   (the worked example); pagetrace run --tokens 38,100 --heads 8 --kv-heads 2 --head-dim 64"

WORKED_EXAMPLE_TOKEN = 20
DEFAULT_ROWS = 40


def parse_rows(text: str) -> int | None:
    if text == "all":
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise UsageError("--rows", text, "give a number of rows >= 1, or 'all'")


def parse_heads(text: str, num_heads: int) -> list[int]:
    if text == "all":
        return list(range(num_heads))
    heads = parse_int_list(text, "--show-heads")
    for h in heads:
        if not 0 <= h < num_heads:
            raise UsageError("--show-heads", text, f"query heads are 0..{num_heads - 1}")
    return heads


def pick_device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("--device", text, "no CUDA device is available here; use --device cpu")
        try:
            return torch.device(text)
        except RuntimeError:
            raise UsageError("--device", text, "not a device name; use auto, cpu, cuda or cuda:N") from None
    raise UsageError("--device", text, "use auto, cpu, cuda or cuda:N")


def run(
    tokens: Annotated[str, typer.Option(help="Tokens in each sequence, comma-separated: 38 or 38,100.")] = "38",
    table: Annotated[list[str] | None, typer.Option(help="Block table of a sequence (repeat once per sequence): 7,2,15. Default: the worked example's 7,2,15 for sequence 0, then seeded free blocks.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per block.")] = 16,
    head_dim: Annotated[int, typer.Option(help="Elements per head vector.")] = 8,
    heads: Annotated[int, typer.Option(help="Query heads.")] = 1,
    kv_heads: Annotated[int, typer.Option(help="KV heads (heads must be a multiple: GQA, MQA).")] = 1,
    num_blocks: Annotated[int | None, typer.Option(help="Physical blocks in the pool (default: 16, grown as the tokens need).")] = None,
    dtype: Annotated[str, typer.Option(help="Cache and query dtype: fp32, fp16 or bf16.")] = "fp32",
    layout: Annotated[str | None, typer.Option(help="Cache layout: blocks, nhd, hnd or vllm (default: blocks for one KV head, else nhd).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for the cache, the query and the drawn block tables.")] = 0,
    scale: Annotated[float | None, typer.Option(help="Score scale (default: 1/sqrt(head_dim)).")] = None,
    token: Annotated[int | None, typer.Option(help="Highlight this token and print its lookup (default: 20, as in the worked example, when sequence 0 has it).")] = None,
    seq: Annotated[int, typer.Option(help="The sequence --token belongs to.")] = 0,
    rows: Annotated[str, typer.Option(help="Rows per table: a number, or 'all'. Long sequences show the first, the last and the heaviest rows.")] = str(DEFAULT_ROWS),
    show_heads: Annotated[str | None, typer.Option(help="Query heads to tabulate, comma-separated, or 'all' (default: all up to 4 heads, else head 0).")] = None,
    backend: Annotated[str, typer.Option(help="auto, triton (compiled, CUDA), interpret (Triton's interpreter, CPU) or torch.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document with every row and nothing else on stdout.")] = False,
) -> None:
    from ..cli import emit_json, stderr_console, stdout_console
    from ..plan import plan_tables

    seq_lens = parse_int_list(tokens, "--tokens")
    tables = [parse_int_list(t, "--table") for t in table] if table else None
    limit = parse_rows(rows)
    plan = plan_tables(seq_lens, tables, block_size, num_blocks, seed)
    if layout is None:
        layout = "blocks" if kv_heads == 1 else "nhd"
    if scale is not None and not scale == scale:
        raise UsageError("--scale", scale, "must be a number")
    if not 0 <= seq < len(seq_lens):
        raise UsageError("--seq", seq, f"sequences are 0..{len(seq_lens) - 1}")
    if token is None:
        token = WORKED_EXAMPLE_TOKEN if seq_lens[seq] > WORKED_EXAMPLE_TOKEN else None
    elif not 0 <= token < seq_lens[seq]:
        raise UsageError("--token", token, f"sequence {seq} has tokens 0..{seq_lens[seq] - 1}")
    shown_heads = parse_heads(show_heads or ("all" if heads <= 4 else "0"), max(heads, 1))
    from ..layouts import make_geometry

    make_geometry(layout, plan.num_blocks, block_size, kv_heads, head_dim, dtype)  # usage errors before torch loads
    if dtype == "fp8":
        raise UsageError("--dtype", dtype, "the kernel runs on fp32, fp16 or bf16 caches (fp8 is for lookup's addresses)")

    err = stderr_console()
    for warning in plan.warnings:
        err.print(f"[bold red]warning:[/] {warning}")

    import torch

    from ..attention import paged_attention, resolve_backend
    from ..reference import reference_attention
    from ..report import Checks, build_report, check_slots, compare
    from ..workload import make_workload

    dev = pick_device(device)
    chosen = resolve_backend(backend, dev, seq_lens, heads, kv_heads)
    memory_option = ("--num-blocks", num_blocks) if num_blocks is not None else ("--tokens", tokens)
    work = make_workload(
        plan, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, layout=layout,
        seed=seed, device=dev, memory_option=memory_option,
    )
    scale_value = head_dim**-0.5 if scale is None else scale
    names = {"triton": "Triton kernel, compiled", "interpret": "Triton kernel, interpreter", "torch": "torch (gather + softmax)"}
    with err.status(f"running the {names[chosen]} on {dev} ..."):
        start = time.perf_counter()
        output, trace = paged_attention(
            work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens,
            layout=layout, scale=scale_value, trace=True, backend=chosen,
        )
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - start
    with err.status("checking against contiguous attention ..."):
        ref = reference_attention(
            work.query, work.key_cache, work.value_cache, plan.tables, seq_lens,
            layout=layout, block_size=block_size, scale=scale_value, compute_dtype=torch.float64,
        )
        max_diff, tol, passed = compare(output, ref.output, dtype)
        logit_diff = max(
            float((trace.logits[s, :, :n].double().cpu() - ref.logits[s].cpu()).abs().max()) for s, n in enumerate(seq_lens)
        )
        checks = Checks(max_diff, tol, passed, check_slots(plan, trace.slots), logit_diff)
        reports = build_report(plan, trace, output, shown_heads)

    key_norm = None
    if token is not None:
        from ..reference import gather

        keys = gather(work.key_cache, layout, "key", plan.tables[seq], seq_lens[seq], block_size)
        key_norm = float(keys[token, 0].float().norm())

    config = {
        "tokens": seq_lens, "block_size": block_size, "head_dim": head_dim, "heads": heads, "kv_heads": kv_heads,
        "num_blocks": plan.num_blocks, "dtype": dtype, "layout": layout, "seed": seed, "scale": scale_value,
        "device": str(dev), "backend": chosen, "partition_size": trace.partition_size,
    }
    from ..diagram import MappingView, SequenceMap

    view = MappingView(
        block_size=block_size,
        num_blocks=plan.num_blocks,
        sequences=[SequenceMap(f"seq {r.index}", r.seq_len, r.table, attention_mass=r.block_mass) for r in reports],
        highlight=(seq, token) if token is not None else None,
    )
    saved = save_diagrams(view, svg, png, dot, quiet=json_output)
    if json_output:
        document = run_json(config, reports, shown_heads, plan, checks, token, seq, key_norm, elapsed)
        if saved is not None:
            document["diagrams"] = saved["written"]
        emit_json(document)
    else:
        from ..render_run import check_line, render_run

        out = stdout_console()
        header = (
            f"[bold]pagetrace run[/] · {len(seq_lens)} sequence(s) · tokens {tokens} · block size {block_size} · "
            f"head_dim {head_dim} · {heads} head(s) / {kv_heads} KV head(s) · {dtype} · layout {layout} · "
            f"pool {plan.num_blocks} blocks · backend [bold]{chosen}[/] ({names[chosen]}) on {dev}"
        )
        repeated = [{p for p in t[: len(r.spans)] if t[: len(r.spans)].count(p) > 1} for t, r in zip(plan.tables, reports)]
        first = reports[seq].heads[0]
        summary = []
        if token is not None:
            summary.append((f"key vector norm at token {token}", f"{key_norm:.4f}" + (f" (sequence {seq}, KV head 0)" if len(seq_lens) > 1 or kv_heads > 1 else "")))
        summary += [
            ("max attention weight", f"{first.max_weight:.4f} at position {first.argmax}" + (f" (sequence {seq}, head 0)" if len(seq_lens) > 1 or heads > 1 else "")),
            ("output vector norm", f"{first.output_norm:.4f}"),
            ("check", check_line(checks)),
            ("slots", "every slot the kernel read matches the block table" if checks.slots_match else "[bold red]" + "; ".join(checks.slot_mismatches) + "[/]"),
            ("backend", f"{chosen} ({names[chosen]}) on {dev}, {elapsed * 1000:.1f} ms, partitions of {trace.partition_size} tokens"),
        ]
        out.print(render_run(header, block_size, reports, shown_heads, heads, limit, (seq, token) if token is not None else None, plan.shared, repeated, summary))
        if saved is None:
            from ..diagram import terminal_mapping

            out.print(terminal_mapping(view))
        if token is not None:
            from ..lookup import trace_token
            from ..render import render_lookup

            out.print(render_lookup(trace_token(
                token, plan.tables[seq], block_size=block_size, head_dim=head_dim, kv_heads=kv_heads, head=0,
                dtype=dtype, layout=layout, num_blocks=plan.num_blocks,
            )))
    if not checks.slots_match:
        raise RuntimeFailure("the kernel read slots that the block table does not give: " + "; ".join(checks.slot_mismatches))
    if not checks.passed:
        raise RuntimeFailure(
            f"paged attention differs from contiguous attention: max |diff| {checks.max_abs_diff:.3g} is over the {dtype} tolerance {checks.tolerance:g}"
        )


def run_json(config, reports, shown_heads, plan, checks, token, seq, key_norm, elapsed) -> dict:
    return {
        "config": config,
        "shown_heads": shown_heads,
        "shared_blocks": {str(k): v for k, v in plan.shared.items()},
        "warnings": plan.warnings,
        "token": None if token is None else {"sequence": seq, "token": token, "key_norm": key_norm},
        "sequences": [
            {
                "index": r.index,
                "seq_len": r.seq_len,
                "block_table": r.table,
                "coverage": [
                    {"logical_block": s.logical_block, "physical_block": s.physical_block, "first_token": s.first_token,
                     "last_token": s.last_token, "attention_mass": m}
                    for s, m in zip(r.spans, r.block_mass)
                ],
                "heads": [vars(h) for h in r.heads],
                "rows": [vars(row) for row in r.rows],
            }
            for r in reports
        ],
        "checks": {
            "max_abs_diff": checks.max_abs_diff,
            "tolerance": checks.tolerance,
            "passed": checks.passed,
            "slots_match": checks.slots_match,
            "slot_mismatches": checks.slot_mismatches,
            "logit_max_abs_diff": checks.logit_max_abs_diff,
        },
        "time_s": elapsed,
    }
