"""`pagetrace fleet-sweep`: many `fleet` runs, traces × routers × instances × caches × capacities,
in local processes or on a Ray cluster; one table and one chart; resumable."""

from __future__ import annotations

from typing import Annotated

import typer
from .options import FloatOption, IntOption

HELP = "Run a grid of fleet simulations (traces x routers x instance counts x caches x capacities) in local processes or as Ray tasks, and gather hit rate, preemptions and imbalance into one table and chart; re-running with the same --results resumes."
EPILOG = (
    "Example: pagetrace fleet-sweep --routers round-robin,prefix-aware --instances 2,4 --num-blocks 256,512,1024 --results sweep.jsonl --chart sweep.svg"
    "  |  pagetrace fleet-sweep --trace conversation_trace.jsonl --num-blocks 1000,5860,20000 --instances 10 --caches local,pooled --max-tokens 1 --ray auto"
)
MAX_POINTS = 10_000


def _ints(text: str, option: str, low: int, high: int) -> list[int]:
    from ..errors import UsageError

    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit() or len(part) > 12:
            raise UsageError(option, text, "give whole numbers separated by commas, like 2,4,8")
        value = int(part)
        if not low <= value <= high:
            raise UsageError(option, text, f"each must be {low:,} to {high:,}")
        out.append(value)
    return list(dict.fromkeys(out))


def fleet_sweep(
    trace: Annotated[list[str] | None, typer.Option(metavar="FILE", help="A trace (simulate's or Mooncake's format); repeat: each is one value of the sweep. Default: the synthetic conversations of `fleet`.")] = None,
    routers: Annotated[str, typer.Option(metavar="LIST", help="Routers, comma-separated (those of `fleet --router`, but as-recorded).")] = "round-robin,prefix-aware",
    instances: Annotated[str, typer.Option(metavar="LIST", help="Instance counts, comma-separated.")] = "4",
    num_blocks: Annotated[str, typer.Option(metavar="LIST", help="Blocks in each instance's pool, comma-separated: the chart's x axis (as tokens).")] = "256,512,1024",
    caches: Annotated[str, typer.Option(metavar="LIST", help="Caches, comma-separated: local, pooled, store:TOKENS.")] = "local",
    sessions: Annotated[int, IntOption(help="Synthetic conversations: sessions.")] = 100,
    turns: Annotated[int, IntOption(help="Synthetic: turns per session.")] = 4,
    seed: Annotated[int, IntOption(help="Synthetic: random seed.")] = 0,
    block_size: Annotated[int | None, IntOption(help="Tokens per block (default 16; 512 for Mooncake traces).")] = None,
    max_num_batched_tokens: Annotated[int, IntOption(help="Each instance's token budget per step.")] = 4096,
    max_num_seqs: Annotated[int, IntOption(help="Each instance's running requests at most.")] = 256,
    overlap_weight: Annotated[float, FloatOption(help="prefix-aware: Dynamo's overlap_score_weight.")] = 1.0,
    max_tokens: Annotated[int | None, IntOption(help="Cap every request's output at this many tokens.")] = None,
    step_ms: Annotated[float | None, FloatOption(help="A Mooncake trace's milliseconds per step (default 50).")] = None,
    results: Annotated[str | None, typer.Option(metavar="PATH", help="Append each finished point here (JSON Lines); points already in it are not run again (resume).")] = None,
    chart: Annotated[str | None, typer.Option(metavar="PATH", help="Write hit rate against capacity per instance, one line per series, as SVG.")] = None,
    workers: Annotated[int | None, IntOption(help="Local processes (default: every core; 1: in this process).")] = None,
    ray: Annotated[str | None, typer.Option("--ray", metavar="ADDRESS", help="Run the points as Ray tasks on this cluster (ray.init(address=...): auto, ray://HOST:10001, or local to start one here); needs the ray extra.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document and nothing else on stdout.")] = False,
) -> None:
    from ..errors import RuntimeFailure, UsageError
    from ..files import check_outputs
    from ..paging.blocks import MAX_BLOCK_SIZE, MAX_SEQS, MAX_TOKENS
    from ..sim.fleet import MAX_INSTANCES
    from ..sim.fleet_sweep import Settings, grid, run_sweep
    from ..sim.router import ROUTERS
    from .output import emit_json, stderr_console, stdout_console
    from .simulate import MAX_BLOCKS

    router_list = [r.strip() for r in routers.split(",") if r.strip()]
    for r in router_list:
        if r not in ROUTERS or r == "as-recorded":
            raise UsageError("--routers", routers, f"each must be one of: {', '.join(x for x in ROUTERS if x != 'as-recorded')}")
    if not router_list:
        raise UsageError("--routers", routers, "name at least one router")
    counts = _ints(instances, "--instances", 1, MAX_INSTANCES)
    sizes = _ints(num_blocks, "--num-blocks", 2, MAX_BLOCKS)
    cache_list: list[tuple[str, int]] = []
    for part in (c.strip() for c in caches.split(",")):
        name, _, size = part.partition(":")
        if name in ("local", "pooled") and not size:
            cache_list.append((name, 0))
        elif name == "store" and size:
            tokens = _ints(size, "--caches", 1, 1 << 40)[0]
            cache_list.append((name, tokens))
        else:
            raise UsageError("--caches", caches, "each must be local, pooled or store:TOKENS")
    traces = trace or ["synthetic"]
    for option, value, low, high in (("--sessions", sessions, 1, 1_000_000), ("--turns", turns, 1, 1000),
                                     ("--max-num-batched-tokens", max_num_batched_tokens, 1, MAX_TOKENS), ("--max-num-seqs", max_num_seqs, 1, MAX_SEQS),
                                     ("--block-size", block_size or 1, 1, MAX_BLOCK_SIZE), ("--max-tokens", max_tokens or 1, 1, MAX_TOKENS),
                                     ("--workers", workers or 1, 1, 1024)):
        if value < low or value > high:
            raise UsageError(option, value, f"must be {low:,} to {high:,}")
    if not overlap_weight >= 0 or overlap_weight == float("inf"):
        raise UsageError("--overlap-weight", overlap_weight, "must be a finite number >= 0")
    if step_ms is not None and not (step_ms > 0 and step_ms < float("inf")):
        raise UsageError("--step-ms", step_ms, "must be a positive number of milliseconds")
    for name, tokens in cache_list:
        smallest = block_size or 16
        if name == "store" and tokens < smallest:
            raise UsageError("--caches", caches, f"a store must hold at least one block ({smallest} tokens)")
    for t in traces:
        if t != "synthetic":
            from ..sim.mooncake import read_text

            read_text(t)  # unreadable: one line, exit 2, before any point runs
    points = grid(traces, router_list, counts, sizes, cache_list)
    if len(points) > MAX_POINTS:
        raise UsageError("--num-blocks", num_blocks, f"the sweep has {len(points):,} points; at most {MAX_POINTS:,}")
    if ray is not None:
        try:
            import ray as _ray  # noqa: F401
        except ImportError:
            raise UsageError("--ray", ray, "needs Ray: pip install 'pagetrace[ray]'") from None
    check_outputs({o: p for o, p in (("--chart", chart),) if p is not None}, stdout_taken_by="--json" if json_output else "the report")
    settings = Settings(block_size, max_num_batched_tokens, max_num_seqs, overlap_weight, max_tokens, step_ms,
                        {"sessions": sessions, "turns": turns, "seed": seed})
    err = stderr_console()

    def progress(row, k, n):
        p = row["point"]
        err.print(f"[{k}/{n}] {p['router']}, {p['instances']} instances, {p['num_blocks']:,} blocks, {p['cache']}: "
                  f"hit rate {100 * row['hit_rate']:.1f}% ({row['seconds']:.1f} s)", markup=False, soft_wrap=True)

    try:
        rows = run_sweep(points, settings, results, workers, ray, progress)
    except (ValueError, OSError) as exc:
        raise RuntimeFailure(f"a sweep point failed: {exc}") from None
    written = []
    if chart:
        from ..files import write_outputs
        from ..views.fleet_sweep import sweep_svg

        written = write_outputs([(chart, sweep_svg(rows).encode())])
    if json_output:
        emit_json({"points": rows, "written": written, "results": results})
        return
    from ..views.fleet_sweep import render_sweep

    stdout_console().print(render_sweep(rows))
    for path in written:
        err.print(f"wrote {path}", markup=False, soft_wrap=True)
