"""`pagetrace run`: the real paged-attention kernel, traced token by token and checked.

Three steps: `prepare` checks every option (nothing is allocated until it has passed),
`execute` builds the cache, runs the kernel and checks it against contiguous attention,
and `run` prints the result (or one JSON document) before it reports a failed check.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..blocks import MAX_HEADS, check_size, parse_int_list
from ..cli_types import DEVICE, AliasChoice, dtype_choice, layout_choice
from ..errors import RuntimeFailure, UsageError
from ..plan import Plan
from .diagram import DotOption, PngOption, SvgOption, report_console, save_diagrams

HELP = (
    "Run the Triton paged-attention kernel and show, for every token, its logical block, offset, "
    "physical block, slot and attention weight, checked against contiguous attention."
)
EPILOG = (
    "Example: pagetrace run --tokens 38   (the worked example); pagetrace run --tokens 38,100 --heads 8 --kv-heads 2 --head-dim 64; "
    "pagetrace run --tokens 38 --query-len 6   (a prefill of its last 6 tokens)"
)

WORKED_EXAMPLE_TOKEN = 20
DEFAULT_ROWS = 40
MAX_SCALE = 1e6  # larger scales overflow fp32 logits
KERNEL_MAX_HEAD_DIM = 512  # K and V tiles must fit a GPU's shared memory
BACKEND_NAMES = {"triton": "Triton kernel, compiled", "interpret": "Triton kernel, interpreter", "torch": "torch (gather + softmax)"}


def parse_rows(text: str) -> int | None:
    if text == "all":
        return None
    if re.fullmatch(r"[0-9]{1,9}", text) and int(text) >= 1:
        return int(text)
    raise UsageError("--rows", text, "give a number of rows >= 1, or 'all'")


def parse_heads(text: str, num_heads: int) -> list[int]:
    if text == "all":
        return list(range(num_heads))
    heads = parse_int_list(text, "--show-heads")
    for h in heads:
        if not 0 <= h < num_heads:
            raise UsageError("--show-heads", text, f"query heads are 0..{num_heads - 1}")
    return list(dict.fromkeys(heads))


def pick_device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::([0-9]+))?", text)
    if not match:
        raise UsageError("--device", text, "use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError("--device", text, "no CUDA device is available here; use --device cpu")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise UsageError("--device", text, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


@dataclass
class RunSetup:
    """Every option of a run, checked."""

    tokens_text: str
    plan: Plan
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    layout: str
    seed: int
    scale: float
    token: int | None
    seq: int
    limit: int | None
    shown_heads: list[int]
    device: Any  # torch.device
    backend: str
    memory_option: tuple[str, object]
    query_lens: list[int] | None = None  # new tokens per sequence; None: decode (one each)
    query: int | None = None  # which of --seq's new tokens the tables show (None: the last)
    sliding_window: int | None = None
    soft_cap: float | None = None
    alibi: bool = False
    k_scale: float = 1.0
    v_scale: float = 1.0
    partition_size: int | None = None

    @property
    def prefill(self) -> bool:
        return self.query_lens is not None and max(self.query_lens) > 1


def prepare(
    tokens: str, table: list[str] | None, block_size: int, head_dim: int, heads: int, kv_heads: int,
    num_blocks: int | None, dtype: str, layout: str | None, seed: int, scale: float | None, token: int | None,
    seq: int, rows: str, show_heads: str | None, backend: str, device: str, json_rows: bool = False,
    variant: "Variant | None" = None,
) -> RunSetup:
    from ..layouts import make_geometry
    from ..plan import plan_tables

    seq_lens = parse_int_list(tokens, "--tokens")
    tables = [parse_int_list(t, "--table") for t in table] if table else None
    limit = parse_rows(rows)
    if not 0 <= seed < 2**63:
        raise UsageError("--seed", seed, "must be in 0..2**63-1")
    if scale is not None and not (math.isfinite(scale) and abs(scale) <= MAX_SCALE):
        raise UsageError("--scale", scale, f"must be a finite number with |scale| <= {MAX_SCALE:g}")
    check_size("--heads", heads, MAX_HEADS)
    plan = plan_tables(seq_lens, tables, block_size, num_blocks, seed)
    if layout is None:
        layout = "blocks" if kv_heads == 1 else "nhd"
    geom = make_geometry(layout, plan.num_blocks, block_size, kv_heads, head_dim, dtype)
    if dtype == "fp8":
        raise UsageError("--dtype", dtype, "the kernel reads fp8_e4m3 or fp8_e5m2 caches; name one (plain fp8 is for lookup's addresses)")
    variant = variant or Variant()
    query_lens = variant.check(seq_lens, seq, dtype)
    if heads % kv_heads:
        raise UsageError("--heads", heads, f"must be a multiple of --kv-heads ({kv_heads})")
    if not 0 <= seq < len(seq_lens):
        raise UsageError("--seq", seq, f"sequences are 0..{len(seq_lens) - 1}")
    if token is None:
        token = WORKED_EXAMPLE_TOKEN if seq_lens[seq] > WORKED_EXAMPLE_TOKEN else None
    elif not 0 <= token < seq_lens[seq]:
        raise UsageError("--token", token, f"sequence {seq} has tokens 0..{seq_lens[seq] - 1}")
    shown_heads = parse_heads(show_heads if show_heads is not None else ("all" if heads <= 4 else "0"), heads)

    from ..attention import resolve_backend

    dev = pick_device(device)
    chosen = resolve_backend(backend, dev, seq_lens, heads, kv_heads, query_lens)
    if chosen != "torch" and head_dim > KERNEL_MAX_HEAD_DIM:
        raise UsageError("--head-dim", head_dim, f"the kernel takes head_dim up to {KERNEL_MAX_HEAD_DIM}; use --backend torch")
    from ..workload import check_memory, run_extra_bytes

    memory_option = ("--num-blocks", num_blocks) if num_blocks is not None else ("--tokens", tokens)
    num_query_tokens = sum(query_lens) if query_lens else None
    check_memory(geom, dev, *memory_option, extra=run_extra_bytes(seq_lens, heads, kv_heads, head_dim, json_rows, num_query_tokens))
    return RunSetup(
        tokens_text=tokens, plan=plan, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, layout=layout,
        seed=seed, scale=head_dim**-0.5 if scale is None else scale, token=token, seq=seq, limit=limit,
        shown_heads=shown_heads, device=dev, backend=chosen, memory_option=memory_option,
        query_lens=query_lens, query=variant.query, sliding_window=variant.sliding_window, soft_cap=variant.soft_cap,
        alibi=variant.alibi, k_scale=variant.k_scale or 1.0, v_scale=variant.v_scale or 1.0, partition_size=variant.partition_size,
    )


BIG_CACHE_BYTES = 256 << 20  # from here on, `run` says what it is about to allocate before it does


def cache_size(setup: RunSetup) -> str:
    from ..dtypes import ELEMENT_SIZES
    from ..plan import cache_bytes, human_bytes

    p = setup.plan
    need = cache_bytes(p.num_blocks, p.block_size, setup.kv_heads, setup.head_dim, ELEMENT_SIZES[setup.dtype])
    return f"{human_bytes(need)} ({p.num_blocks:,} blocks x {p.block_size} tokens x {setup.kv_heads} KV head(s) x {setup.head_dim} x {ELEMENT_SIZES[setup.dtype]} bytes, keys and values)"


def memory_note(setup: RunSetup) -> str | None:
    """For a large cache, a line saying what it takes and what is available (the refusal
    in `workload.check_memory` already follows the machine's available memory)."""
    from ..dtypes import ELEMENT_SIZES
    from ..plan import available_memory_bytes, cache_bytes, human_bytes

    p = setup.plan
    if cache_bytes(p.num_blocks, p.block_size, setup.kv_heads, setup.head_dim, ELEMENT_SIZES[setup.dtype]) < BIG_CACHE_BYTES:
        return None
    free = available_memory_bytes()
    where = f"; {human_bytes(free)} of memory available" if free is not None else ""
    return f"note: the KV cache takes {cache_size(setup)}{where}"


@dataclass
class Variant:
    """The prefill and attention-variant options of a run, as given."""

    query_len: str | None = None
    query: int | None = None
    sliding_window: int | None = None
    soft_cap: float | None = None
    alibi: bool = False
    k_scale: float | None = None
    v_scale: float | None = None
    partition_size: int | None = None

    def check(self, seq_lens: list[int], seq: int, dtype: str) -> list[int] | None:
        """Refuse what cannot run; returns new tokens per sequence (None: decode)."""
        query_lens = None
        if self.query_len is not None:
            query_lens = parse_int_list(self.query_len, "--query-len")
            if len(query_lens) == 1:
                query_lens = query_lens * len(seq_lens)
            if len(query_lens) != len(seq_lens):
                raise UsageError("--query-len", self.query_len, f"give one count, or one per sequence ({len(seq_lens)})")
            for q, n in zip(query_lens, seq_lens):
                if not 1 <= q <= n:
                    raise UsageError("--query-len", self.query_len, f"each sequence's new tokens must be 1..its length (--tokens counts them too), got {q} for {n}")
        if self.query is not None and not 0 <= self.query < (query_lens[seq] if query_lens else 1):
            raise UsageError("--query", self.query, f"sequence {seq} has new (query) tokens 0..{(query_lens[seq] if query_lens else 1) - 1}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise UsageError("--sliding-window", self.sliding_window, "must be at least 1 token")
        if self.soft_cap is not None and not (math.isfinite(self.soft_cap) and 0 < self.soft_cap <= MAX_SCALE):
            raise UsageError("--soft-cap", self.soft_cap, f"must be a finite number in (0, {MAX_SCALE:g}]")
        for option, value in (("--k-scale", self.k_scale), ("--v-scale", self.v_scale)):
            if value is None:
                continue
            if not dtype.startswith("fp8"):
                raise UsageError(option, value, "scales apply to fp8 caches: use --dtype fp8_e4m3 or fp8_e5m2")
            if not (math.isfinite(value) and 1e-6 <= value <= MAX_SCALE):
                raise UsageError(option, value, f"must be a finite number in [1e-6, {MAX_SCALE:g}]")
        if self.partition_size is not None and (self.partition_size < 16 or self.partition_size % 16 or self.partition_size > 2**20):
            raise UsageError("--partition-size", self.partition_size, "must be a multiple of 16 tokens, 16..1048576")
        return query_lens

    @property
    def block_n(self) -> int | None:
        """Key tile for --partition-size: the largest power of two up to 128 dividing it."""
        if self.partition_size is None:
            return None
        return min(128, self.partition_size & -self.partition_size)


@dataclass
class RunResult:
    setup: RunSetup
    elapsed: float
    partition_size: int
    reports: list  # [SequenceReport]
    checks: Any  # Checks
    key_norm: float | None
    mask_rows: list = None  # [(query position, one character per key block)] for --seq, prefill or a window only


def execute(setup: RunSetup, all_rows: bool, status) -> RunResult:
    import torch

    from ..attention import paged_attention
    from ..reference import gather, reference_attention
    from ..report import Checks, build_report, check_slots, compare, mask_map
    from ..workload import make_workload

    plan = setup.plan
    from ..workload import alibi_slopes

    with status(f"building the KV cache: {cache_size(setup)} ..."):
        work = make_workload(
            plan, num_heads=setup.heads, num_kv_heads=setup.kv_heads, head_dim=setup.head_dim, dtype=setup.dtype,
            layout=setup.layout, seed=setup.seed, device=setup.device, memory_option=setup.memory_option,
            query_lens=setup.query_lens, k_scale=setup.k_scale, v_scale=setup.v_scale,
        )
    fp8 = setup.dtype.startswith("fp8")
    variants = dict(
        sliding_window=setup.sliding_window, soft_cap=setup.soft_cap,
        alibi_slopes=alibi_slopes(setup.heads).to(setup.device) if setup.alibi else None,
    )
    with status(f"running the {BACKEND_NAMES[setup.backend]} on {setup.device} ..."):
        start = time.perf_counter()
        output, trace = paged_attention(
            work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens,
            query_start_loc=work.query_start_loc if setup.query_lens else None,
            layout=setup.layout, scale=setup.scale, trace=True, backend=setup.backend,
            k_scale=setup.k_scale if fp8 else None, v_scale=setup.v_scale if fp8 else None,
            partition_size=setup.partition_size, block_n=Variant(partition_size=setup.partition_size).block_n, **variants,
        )
        if setup.device.type == "cuda":
            torch.cuda.synchronize(setup.device)
        elapsed = time.perf_counter() - start
    with status("checking against contiguous attention ..."):
        ref = reference_attention(
            work.query, work.key_cache, work.value_cache, plan.tables, plan.seq_lens,
            layout=setup.layout, block_size=plan.block_size, scale=setup.scale, compute_dtype=torch.float64,
            query_lens=setup.query_lens, k_scale=setup.k_scale if fp8 else 1.0, v_scale=setup.v_scale if fp8 else 1.0, **variants,
        )
        max_diff, tol, passed = compare(output, ref.output, setup.dtype)
        got, want = trace.logits.double().cpu(), ref.logits.cpu()
        both = ~torch.isnan(want)
        passed = passed and bool(torch.equal(trace.mask.cpu(), ref.mask.cpu())) and bool(torch.equal(both, ~torch.isnan(got)))
        logit_diff = float((got[both] - want[both]).abs().nan_to_num(nan=math.inf).max()) if bool(both.any()) else 0.0
        checks = Checks(max_diff, tol, passed, check_slots(plan, trace.slots), logit_diff)
        traced = (setup.seq, setup.token) if setup.token is not None else None
        queries = [setup.query if s == setup.seq else None for s in range(len(plan.seq_lens))]
        reports = build_report(plan, trace, output, setup.shown_heads, setup.limit, all_rows=all_rows, traced=traced, queries=queries)
        mask_rows = mask_map(trace, setup.seq, plan.seq_lens[setup.seq], plan.block_size) if setup.prefill or setup.sliding_window else []
    key_norm = None
    if setup.token is not None:
        keys = gather(work.key_cache, setup.layout, "key", plan.tables[setup.seq], plan.seq_lens[setup.seq], plan.block_size)
        key_norm = float(keys[setup.token, 0].float().norm())
    return RunResult(setup, elapsed, trace.partition_size, reports, checks, key_norm, mask_rows)


def run(
    tokens: Annotated[str, typer.Option(help="Tokens in each sequence, comma-separated: 38 or 38,100.")] = "38",
    table: Annotated[list[str] | None, typer.Option(help="Block table of a sequence (repeat once per sequence): 7,2,15. Default: the worked example's 7,2,15 for sequence 0, then seeded free blocks.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per block.")] = 16,
    head_dim: Annotated[int, typer.Option(help="Elements per head vector.")] = 8,
    heads: Annotated[int, typer.Option(help="Query heads.")] = 1,
    kv_heads: Annotated[int, typer.Option(help="KV heads (heads must be a multiple: GQA, MQA).")] = 1,
    num_blocks: Annotated[int | None, typer.Option(help="Physical blocks in the pool (default: 16, grown as the tokens need).")] = None,
    dtype: Annotated[str, typer.Option(click_type=dtype_choice(), help="Cache and query dtype, any case: fp32 (float32, float), fp16 (float16, half) or bf16 (bfloat16); or an fp8 cache, fp8_e4m3 (fp8) or fp8_e5m2 (fp16 queries).")] = "fp32",
    layout: Annotated[str | None, typer.Option(click_type=layout_choice(kernel_only=True), help="Cache layout, any case (default: blocks for one KV head, else nhd).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for the cache, the query and the drawn block tables.")] = 0,
    scale: Annotated[float | None, typer.Option(help="Score scale (default: 1/sqrt(head_dim)).")] = None,
    token: Annotated[int | None, typer.Option(help="Highlight this token and print its lookup (default: 20, as in the worked example, when sequence 0 has it).")] = None,
    seq: Annotated[int, typer.Option(help="The sequence --token belongs to.")] = 0,
    rows: Annotated[str, typer.Option(help="Rows per table: a number, or 'all'. Long sequences show the first, the last and the heaviest rows.")] = str(DEFAULT_ROWS),
    show_heads: Annotated[str | None, typer.Option(help="Query heads to tabulate, comma-separated, or 'all' (default: all up to 4 heads, else head 0).")] = None,
    backend: Annotated[str, typer.Option(click_type=AliasChoice(("auto", *BACKEND_NAMES)), help="auto, triton (compiled, CUDA), interpret (Triton's interpreter, CPU) or torch.")] = "auto",
    device: Annotated[str, typer.Option(click_type=DEVICE, help="auto, cpu, cuda or cuda:N (a string, not a fixed list: N is any device index).")] = "auto",
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document with every row and nothing else on stdout.")] = False,
    query_len: Annotated[str | None, typer.Option(help="New (query) tokens per sequence, the last ones of --tokens: 6, or per sequence 6,1,1 (a prefill or mixed batch). Default: decode, one each.")] = None,
    query: Annotated[int | None, typer.Option(help="Which new token of --seq the tables show, 0-based (default: the last).")] = None,
    sliding_window: Annotated[int | None, typer.Option(help="A query at position p sees keys j > p - W only.")] = None,
    soft_cap: Annotated[float | None, typer.Option(help="Soft-cap the scores: c * tanh(score / c), before the mask.")] = None,
    alibi: Annotated[bool, typer.Option("--alibi", help="Add ALiBi biases, slope_h * (j - p), with the standard slopes per head.")] = False,
    k_scale: Annotated[float | None, typer.Option(help="fp8 key cache scale (value = stored x scale; default 1).")] = None,
    v_scale: Annotated[float | None, typer.Option(help="fp8 value cache scale (default 1).")] = None,
    partition_size: Annotated[int | None, typer.Option(help="Split-K partition in tokens, a multiple of 16 (default: 4096 on the CPU, by SM count on a GPU).")] = None,
) -> None:
    from ..cli import emit_json, stderr_console
    from ..diagram import MappingView, SequenceMap, check_output_paths

    check_output_paths(svg, png, dot, json=json_output)  # before any work
    variant = Variant(query_len, query, sliding_window, soft_cap, alibi, k_scale, v_scale, partition_size)
    setup = prepare(tokens, table, block_size, head_dim, heads, kv_heads, num_blocks, dtype, layout, seed, scale, token, seq, rows, show_heads, backend, device, json_output, variant)
    err = stderr_console()
    for warning in setup.plan.warnings:
        err.print(f"warning: {warning}", style="bold red", markup=False, emoji=False, soft_wrap=True)
    note = memory_note(setup)
    if note:
        err.print(note, markup=False, emoji=False, soft_wrap=True)
    result = execute(setup, all_rows=json_output, status=err.status)

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
    if json_output:
        document = run_json(result)
        if svg or png or dot:
            document["diagrams"] = saved["written"] if saved else []
        emit_json(document)
    else:
        console = report_console(svg, png, dot)
        console.print(render(result))
        if saved is None and diagram_failure is None:
            from ..diagram import terminal_mapping

            console.print(terminal_mapping(view))
        if setup.token is not None:
            from ..lookup import trace_token
            from ..render import render_lookup

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
    from ..render_run import check_line, render_run

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


def run_json(result: RunResult) -> dict:
    s, plan, checks = result.setup, result.setup.plan, result.checks
    return {
        "config": {
            "tokens": plan.seq_lens, "block_size": plan.block_size, "head_dim": s.head_dim, "heads": s.heads,
            "kv_heads": s.kv_heads, "num_blocks": plan.num_blocks, "dtype": s.dtype, "layout": s.layout, "seed": s.seed,
            "scale": s.scale, "device": str(s.device), "backend": s.backend, "partition_size": result.partition_size,
            "query_lens": s.query_lens or [1] * len(plan.seq_lens), "sliding_window": s.sliding_window, "soft_cap": s.soft_cap,
            "alibi": s.alibi, "k_scale": s.k_scale if s.dtype.startswith("fp8") else None, "v_scale": s.v_scale if s.dtype.startswith("fp8") else None,
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
                     "last_token": sp.last_token, "attention_mass": m}
                    for sp, m in zip(r.spans, r.block_mass)
                ],
                "heads": [vars(h) for h in r.heads],
                "rows": [vars(row) for row in r.rows],
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
