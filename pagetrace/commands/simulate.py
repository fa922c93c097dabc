"""`pagetrace simulate`: vLLM V1's block manager over a workload, and what it saves over Orca."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import FloatOption, IntOption

HELP = "Simulate vLLM V1's KV block manager step by step (allocation, prefix hits, eviction, preemption) and compare its memory use with Orca's contiguous reservation."
EPILOG = (
    "Example: pagetrace simulate --requests 200 --num-blocks 1024 --block-size 16 --shared-prefix 64 --chart waste.svg --svg pool.svg"
    "  |  pagetrace simulate --trace requests.jsonl --num-blocks 4096 --at 10 --tables-svg tables.svg"
    "  |  pagetrace simulate --trace recorded.jsonl --events recorded.kvev --num-blocks 16 --block-size 32"
)
PAGE_STEPS = 1000  # --html: the steps the slider holds at most (pagetrace/views/page/sim_data.py MAX_STEPS); the pool is counted at 500 to 1,000 of them
MAX_BLOCKS = 4_000_000  # the simulator's per-block lists: about 200 MB at this size


def parse_range(text: str, option: str) -> tuple[int, int]:
    """`64:512` (uniform, inclusive) or `128` (fixed)."""
    from ..errors import UsageError

    parts = text.split(":")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None:
        raise UsageError(option, text, "give a length like 128 or a range like 64:512")
    if lo < 1 or hi < lo:
        raise UsageError(option, text, "lengths must be at least 1 and the range low:high with low <= high")
    return lo, hi


def simulate(
    requests: Annotated[int | None, IntOption(help="Synthetic workload: number of requests (default 200).")] = None,
    trace: Annotated[str | None, typer.Option(metavar="FILE", help="JSONL trace (plain or .gz), one request per line: pagetrace's (prompt or prompt_len, output_len, arrival, n, cache_salt) or Mooncake's published form (timestamp, input_length, output_length, hash_ids), told apart by the first line.")] = None,
    trace_format: Annotated[str, typer.Option(metavar="FORMAT", help="The --trace file's form: auto (told apart by the first line), pagetrace or mooncake.")] = "auto",
    step_ms: Annotated[float | None, FloatOption(help="A Mooncake trace's clock: milliseconds per simulated step; request arrival step = floor(timestamp / step-ms). Default: 50.")] = None,
    num_blocks: Annotated[int | None, IntOption(help="Blocks in the pool, block 0 (the null block) included. Default: the recording server's (a trace's header, an events file), else 1024.")] = None,
    block_size: Annotated[int | None, IntOption(help="Tokens per block. Default: the recording server's (a trace's header), 512 for a Mooncake trace (its hash_ids' blocks), else 16.")] = None,
    prompt_len: Annotated[str, typer.Option(help="Synthetic: prompt tokens of each request's own, fixed or low:high (uniform).")] = "64:512",
    output_len: Annotated[str, typer.Option(help="Synthetic: output tokens, fixed or low:high (uniform).")] = "16:256",
    shared_prefix: Annotated[int, IntOption(help="Synthetic: tokens of a system prompt every request starts with.")] = 0,
    n: Annotated[int, IntOption("--n", help="Synthetic: parallel samples per request (n > 1 shares the prompt's blocks; --policy sglang prefills the prompt alone first, as SGLang does).")] = 1,
    arrival_rate: Annotated[float, FloatOption(help="Synthetic: requests arriving per step (Poisson); 0 = all at step 0.")] = 2.0,
    seed: Annotated[int, IntOption(help="Synthetic: random seed.")] = 0,
    max_num_batched_tokens: Annotated[int | None, IntOption(help="Tokens per step (the scheduler's token budget). Default: the recording server's, else 4096.")] = None,
    max_num_seqs: Annotated[int | None, IntOption(help="Running requests at most. Default: the recording server's, else 256.")] = None,
    max_model_len: Annotated[int | None, IntOption(help="Longest request: Orca (Max) reserves this much for every request. Default: the recording server's, else 2048 (or the longest request), at most the pool's tokens.")] = None,
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching", help="Turn automatic prefix caching off (default: the recording server's, else on, vLLM's default).")] = False,
    no_chunked_prefill: Annotated[bool, typer.Option("--no-chunked-prefill", help="Never split a prompt longer than the token budget (default: the recording server's, else split, vLLM's default).")] = False,
    at: Annotated[int | None, IntOption(help="Show every request's block table after this step.")] = None,
    timeline_rows: Annotated[int, IntOption(help="Rows of the step timeline: every step with an event when they fit, else the first admission, hit, eviction and preemption, the last step, and the rest spread over the run; 0 hides it.")] = 30,
    svg: Annotated[str | None, typer.Option("--svg", metavar="PATH", help="Write the pool occupancy over time (step x block) as SVG.")] = None,
    png: Annotated[str | None, typer.Option("--png", metavar="PATH", help="Write the pool occupancy over time as PNG.")] = None,
    chart: Annotated[str | None, typer.Option(metavar="PATH", help="Write the waste chart (stacked bars like Figure 2 of the vLLM paper) as SVG.")] = None,
    tables_svg: Annotated[str | None, typer.Option(metavar="PATH", help="Write the block tables at --at STEP as a mapping diagram (SVG).")] = None,
    tables_png: Annotated[str | None, typer.Option(metavar="PATH", help="Write the block tables at --at STEP as a mapping diagram (PNG).")] = None,
    layers: Annotated[str | None, typer.Option(metavar="SPEC", help="A hybrid model's layers: full:N,sliding:W:M (N full-attention layers, M sliding-window layers of W tokens; items repeat in model order). vLLM groups them into KV cache groups, each with its own block table over the one pool.")] = None,
    config_json: Annotated[str | None, typer.Option("--config", metavar="PATH", help="A Hugging Face config.json: the layers' kinds from its layer_types and sliding_window (as --layers).")] = None,
    policy: Annotated[str, typer.Option(metavar="vllm|sglang", help="The KV cache: vLLM's block manager or SGLang's radix tree (same scheduler, vLLM's).")] = "vllm",
    events: Annotated[str | None, typer.Option(metavar="SOURCE", help="The server's KV events, a recorded file or tcp://HOST:PORT (live, from vLLM's ZMQ publisher): compare them with the blocks the simulation stores and removes. Needs --trace.")] = None,
    events_bind: Annotated[bool, typer.Option("--events-bind", help="Bind the --events endpoint instead of connecting: vLLM's publisher connects when its endpoint has no wildcard (tcp://127.0.0.1:5557).")] = False,
    events_timeout: Annotated[float, FloatOption(help="Live --events: stop listening after this many seconds without a message.")] = 10.0,
    what_if: Annotated[list[str] | None, typer.Option("--what-if", metavar="SPEC", help="KEY=VALUE,...: run the same workload again with other settings (num-blocks, block-size, policy, prefix-caching=on|off, max-num-batched-tokens, max-num-seqs) and compare hit rate, blocks in use and preemptions in one table; repeat for more.")] = None,
    what_if_chart: Annotated[str | None, typer.Option(metavar="PATH", help="Write the blocks in use over time of each --what-if run (and the run as given) as SVG.")] = None,
    explain: Annotated[bool, typer.Option("--explain", help="Explain each request's prefix-cache misses (with --json: per request, evictions with their step and request).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document and nothing else on stdout.")] = False,
    html: Annotated[str | None, typer.Option("--html", metavar="PATH", help="Write an interactive page: a step slider over the run (one self-contained HTML file; no network).")] = None,
    step_model: Annotated[str | None, typer.Option(metavar="TRACE", help="A trace recorded inside vllm serve (its step lines): fit seconds per step to what a step runs, and estimate TTFT and end-to-end latency percentiles of this run with it.")] = None,
    step_model_check: Annotated[str | None, typer.Option(metavar="TRACE", help="A second recording of the same server: the --step-model's error on its steps.")] = None,
    sweep: Annotated[list[str] | None, typer.Option("--sweep", metavar="KEY=V,V,...", help="Run the workload at each value instead of once and print hit rate and peak use per point: capacity (tokens: 1M, 3M, inf), num-blocks (inf: nothing evicted), block-size, policy; repeat for a grid.")] = None,
    jobs: Annotated[int | None, IntOption(help="--sweep: points run at once, in processes (default: every core).")] = None,
    sweep_chart: Annotated[str | None, typer.Option(metavar="PATH", help="--sweep: write hit rate against capacity in tokens as SVG.")] = None,
) -> None:
    from ..errors import UsageError, plural
    from ..files import check_outputs
    from ..sim.run import MAX_STEPS, POLICIES
    from ..sim.run import simulate as run_simulation
    from ..sim.scheduler import SchedulerConfig
    from ..sim.summary import summarize
    from ..sim.workload import MAX_REQUESTS, SyntheticSpec, read_trace, synthetic
    from .output import emit_json, stderr_console, stdout_console

    # -- check every option before any work --
    if policy not in POLICIES:
        raise UsageError("--policy", policy, f"must be one of: {', '.join(POLICIES)}")
    groups = _hybrid_groups(layers, config_json, policy, events, explain, what_if)
    trace_text, trace_kind = _trace_source(trace, trace_format, step_ms)
    if events is not None:
        if trace is None:
            raise UsageError("--events", events, "compares a recorded workload with the server's events; give its --trace")
        if policy != "vllm":
            raise UsageError("--policy", policy, "--events are vLLM's; compare them with --policy vllm")
    elif events_bind:
        raise UsageError("--events-bind", True, "binds the --events endpoint; give --events tcp://HOST:PORT")
    if not events_timeout > 0 or events_timeout > 3600:
        raise UsageError("--events-timeout", events_timeout, "must be a number of seconds in (0, 3600]")
    live = events is not None and events.startswith(("tcp://", "ipc://"))
    if events_bind and not live:
        raise UsageError("--events-bind", True, "binds a tcp:// or ipc:// endpoint, not a file")
    stream = None
    if events is not None and not live:
        stream = _read_events(events, events_bind, events_timeout, quiet=json_output)  # a file: its settings are defaults too
    resolved = _settings(trace_text, trace_kind, stream, {"num_blocks": num_blocks, "block_size": block_size,
                                                          "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                                                          "max_model_len": max_model_len, "chunked_prefill": False if no_chunked_prefill else None,
                                                          "prefix_caching": False if no_prefix_caching else None})
    v = resolved.values
    num_blocks, block_size, max_num_batched_tokens, max_num_seqs = v["num_blocks"], v["block_size"], v["max_num_batched_tokens"], v["max_num_seqs"]
    prefix_caching, chunked_prefill = v["prefix_caching"], v["chunked_prefill"]
    server_model_len = v["max_model_len"] if "max_model_len" in resolved.taken else None
    if trace is not None and requests is not None:
        raise UsageError("--requests", requests, "describes a synthetic workload; drop it or --trace")
    for option, value, low in (("--num-blocks", num_blocks, 2), ("--block-size", block_size, 1), ("--n", n, 1),
                               ("--max-num-batched-tokens", max_num_batched_tokens, 1), ("--max-num-seqs", max_num_seqs, 1),
                               ("--max-model-len", max_model_len or 1, 1), ("--timeline-rows", timeline_rows, 0), ("--shared-prefix", shared_prefix, 0)):
        if value < low:
            raise UsageError(option, value, f"must be at least {low}")
    if num_blocks > MAX_BLOCKS:
        raise UsageError("--num-blocks", num_blocks, f"more blocks than the simulator holds in memory (at most {MAX_BLOCKS:,})")
    from ..paging.blocks import MAX_BLOCK_SIZE, MAX_SEQS, MAX_TOKENS

    for option, value, limit in (("--block-size", block_size, MAX_BLOCK_SIZE), ("--max-num-seqs", max_num_seqs, MAX_SEQS),
                                 ("--max-num-batched-tokens", max_num_batched_tokens, MAX_TOKENS), ("--max-model-len", max_model_len or 1, MAX_TOKENS),
                                 ("--shared-prefix", shared_prefix, MAX_TOKENS)):
        if value > limit:  # the README's size limits, as every command applies them
            raise UsageError(option, value, f"must be at most {limit:,}")
    if requests is not None and requests < 1:
        raise UsageError("--requests", requests, "must be at least 1")
    if trace is None and (requests or 200) * n > MAX_REQUESTS:
        option, value = ("--n", n) if n > 1 and (requests or 200) <= MAX_REQUESTS else ("--requests", requests)
        raise UsageError(option, value, f"the workload would hold {(requests or 200) * n:,} requests (--requests x --n); the simulator runs at most {MAX_REQUESTS:,}")
    if not arrival_rate >= 0 or arrival_rate == float("inf"):
        raise UsageError("--arrival-rate", arrival_rate, "must be a finite number >= 0")
    if at is not None and at < 0:
        raise UsageError("--at", at, "must be a step >= 0")
    if (tables_svg or tables_png) and at is None:
        raise UsageError("--tables-svg" if tables_svg else "--tables-png", tables_svg or tables_png, "draws the tables at --at STEP; give --at")
    if events is not None and not prefix_caching:
        raise UsageError("--no-prefix-caching", True, "vLLM publishes KV events only with prefix caching on")
    from ..sim.whatif import Setting, parse_what_if

    base_setting = Setting(num_blocks, block_size, policy, prefix_caching, max_num_batched_tokens, max_num_seqs)
    settings = [parse_what_if(spec, base_setting, POLICIES) for spec in what_if or ()]
    for st in settings:
        if st.num_blocks > MAX_BLOCKS or st.block_size > MAX_BLOCK_SIZE or st.max_num_seqs > MAX_SEQS or st.max_num_batched_tokens > MAX_TOKENS:
            raise UsageError("--what-if", st.label(base_setting), "a value past the simulator's limits (those of --num-blocks, --block-size, --max-num-seqs, --max-num-batched-tokens)")
    if what_if_chart and not settings:
        raise UsageError("--what-if-chart", what_if_chart, "draws the --what-if runs; give at least one --what-if")
    files = {"--svg": svg, "--png": png, "--chart": chart, "--tables-svg": tables_svg, "--tables-png": tables_png, "--what-if-chart": what_if_chart,
             "--html": html}
    check_outputs({option: path for option, path in files.items() if path is not None}, stdout_taken_by="--json" if json_output else "the report")

    if trace_kind == "mooncake":
        from ..sim.mooncake import DEFAULT_STEP_MS, parse_mooncake

        step = DEFAULT_STEP_MS if step_ms is None else step_ms
        trace_doc = parse_mooncake(trace_text, block_size, step, trace)
        workload = trace_doc.requests
        fresh = lambda bs: parse_mooncake(trace_text, bs, step, trace).requests  # noqa: E731 - a run changes its requests
    elif trace is not None:
        trace_doc = read_trace(trace_text, block_size, trace)
        workload = trace_doc.requests
        fresh = lambda bs: read_trace(trace_text, bs, trace).requests  # noqa: E731 - a run changes its requests
    else:
        spec = SyntheticSpec(requests or 200, parse_range(prompt_len, "--prompt-len"), parse_range(output_len, "--output-len"),
                             shared_prefix, n, arrival_rate, seed)
        workload = synthetic(spec)
        fresh = lambda bs: synthetic(spec)  # noqa: E731
    last = max(r.arrival for r in workload)
    if last >= MAX_STEPS:
        option, value = ("--trace", trace) if trace is not None else ("--arrival-rate", arrival_rate)
        raise UsageError(option, value, f"a request arrives at step {last:,}; the simulator runs at most {MAX_STEPS:,} steps")
    if sweep or jobs is not None or sweep_chart:
        from ..sim.sweep import WorkloadSource

        source = (WorkloadSource(trace_kind, trace, trace_doc.header.source.get("step_ms") if trace_kind == "mooncake" else None)
                  if trace is not None else WorkloadSource("synthetic", synthetic=spec))
        others = {"--events": events, "--what-if": what_if, "--html": html, "--svg": svg, "--png": png, "--chart": chart,
                  "--tables-svg": tables_svg, "--tables-png": tables_png, "--at": at, "--explain": explain or None,
                  "--layers": layers, "--config": config_json, "--step-model": step_model}
        return _sweep(sweep, jobs, sweep_chart, others, source, workload, resolved, policy, max_model_len, json_output)
    pool_tokens = (num_blocks - 1) * block_size
    longest = max(len(r.prompt) + len(r.output) - 1 for r in workload)
    if longest > pool_tokens:
        raise UsageError("--num-blocks", num_blocks, f"a request stores {longest} tokens; {plural(num_blocks - 1, 'usable block')} of {block_size} hold {pool_tokens}")
    if max_model_len is None and server_model_len is not None:  # the server's: Orca (Max) reserves at most the pool
        max_model_len = min(server_model_len, pool_tokens)
        if longest > max_model_len:
            raise UsageError("--trace", trace, f"a request stores {longest} tokens, more than the server's max_model_len {max_model_len}")
    elif max_model_len is None:
        max_model_len = min(max(2048, longest), pool_tokens)
    elif max_model_len > pool_tokens:
        raise UsageError("--max-model-len", max_model_len, f"Orca (Max) could not reserve it: the pool holds {pool_tokens} tokens")
    elif longest > max_model_len:
        raise UsageError("--max-model-len", max_model_len, f"a request stores {longest} tokens; raise it to at least that")
    if not chunked_prefill and max_num_batched_tokens < max_model_len:
        # vLLM refuses this configuration (SchedulerConfig.verify_max_model_len, vllm/config/scheduler.py):
        # without chunking, a prompt (or a preempted request's recompute) must fit one step's budget
        raise UsageError("--max-num-batched-tokens", max_num_batched_tokens,
                         f"with --no-chunked-prefill it must be at least the model length, {max_model_len} (vLLM refuses it too)")

    if step_model_check is not None and step_model is None:
        raise UsageError("--step-model-check", step_model_check, "checks a --step-model; give the recording to fit")
    model = _step_model(step_model, step_model_check) if step_model is not None else None
    if resolved.line():  # every option checked: the flags that contradict the recording, in one line
        stderr_console().print(resolved.line(), markup=False, emoji=False, soft_wrap=True)
    config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, chunked_prefill)
    runs = len(workload) + (len({r.group for r in workload} - {None}) if policy == "sglang" else 0)  # + prefix requests
    progress = _progress(runs, quiet=json_output)
    try:
        with progress or _nothing():
            task = progress.add_task("simulating", total=runs) if progress else None
            on_step = (lambda rec: progress.advance(task, len(rec.finished))) if progress else None
            result = run_simulation(workload, num_blocks, block_size, config, prefix_caching, () if at is None else [at],
                                    record_occupancy=bool(svg or png), max_model_len=max_model_len, on_step=on_step,
                                    policy=policy, record_history=html is not None, keep_steps=PAGE_STEPS // 2,
                                    record_events=(events is not None or (explain and not groups)) and policy == "vllm" and prefix_caching,
                                    groups=groups)
    except ValueError as exc:
        raise UsageError("--num-blocks", num_blocks, str(exc)) from None
    if at is not None and at not in result.tables_at:
        raise UsageError("--at", at, f"the run has steps 0..{len(result.steps) - 1} (idle steps have no tables)")
    summary = summarize(result, result.causes, block_size, max_model_len, max_num_seqs)
    comparison = None
    if events is not None:
        if stream is None:  # live: listened to after the simulation
            stream = _read_events(events, events_bind, events_timeout, quiet=json_output)
        from ..sim.compare import compare

        comparison = compare(result, trace_doc, stream, block_size,
                             {"num_blocks": num_blocks, "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                              "overridden": resolved.overridden})
    explained = None
    if explain or json_output or html is not None:
        from ..sim.explain import explain_requests

        explained = explain_requests(result, block_size)
    outcomes = _what_ifs(result, base_setting, settings, fresh, max_model_len, chunked_prefill, json_output) if settings else []
    written = _write_pictures(result, summary, at, svg, png, chart, tables_svg, tables_png, block_size, num_blocks)
    if what_if_chart:
        from ..files import write_outputs
        from ..views.sim_pictures import what_if_svg

        written += write_outputs([(what_if_chart, what_if_svg(outcomes).encode())])
    config = {"policy": policy, "num_blocks": num_blocks, "block_size": block_size, "max_num_batched_tokens": max_num_batched_tokens,
              "max_num_seqs": max_num_seqs, "max_model_len": max_model_len, "prefix_caching": prefix_caching,
              "chunked_prefill": chunked_prefill, "workload": trace or "synthetic"}
    if trace_kind == "mooncake":
        config["trace_format"], config["step_ms"] = "mooncake", trace_doc.header.source["step_ms"]
    if resolved.taken or resolved.overridden:
        config["from_server"] = resolved.taken  # setting -> where it came from (the trace's header, the events file)
        config["overridden"] = resolved.overridden  # flags that contradict the recording: {given, server, source}
    group_doc = _group_memory(result) if groups else None
    if groups:
        config["kv_cache_groups"] = [{"kind": g.kind.kind, "window": g.kind.window, "layers": g.layers} for g in groups]
    doc = simulate_json(config, result, summary, written, explained) if json_output or html is not None else None
    if doc is not None and group_doc is not None:
        doc["summary"]["kv_cache_groups"] = group_doc
    step_doc = None
    if model is not None:
        from ..sim.steptime import latencies

        step_doc = {"model": model[0].to_json(), "check": model[1],
                    "latency": latencies(result, model[0], block_size, max_num_batched_tokens)}
    if doc is not None:
        doc["summary"]["vllm_metric"] = _metric(result)
        if step_doc is not None:
            doc["step_model"] = step_doc
        if outcomes:
            doc["what_if"] = [o.to_json() for o in outcomes]
        if comparison is not None:
            doc = {"passed": comparison.passed, **doc}
            doc["events"] = {**comparison.to_json(), "source": events, "messages": len(stream.batches),
                             "server_events": stream.num_events, "gaps": [list(g) for g in stream.gaps], "problems": stream.problems}
    if html is not None:
        from ..views.page import write_page
        from ..views.page.sim_data import simulate_page_doc

        title = f"pagetrace simulate: {summary.requests:,} requests, {num_blocks:,} blocks of {block_size} ({policy})"
        write_page(html, "simulate", simulate_page_doc(doc, result.history), title)
        if html != "-":
            written.append(html)
            if not json_output:
                stderr_console().print(f"wrote {html}", markup=False, emoji=False, soft_wrap=True)
    verdict = 0 if comparison is None or comparison.passed else 1  # a prediction that diverges fails the run
    if json_output:
        emit_json(doc)
        return verdict
    from ..views.sim import render_simulation

    err = stderr_console()
    for path in written:
        if path == html:
            continue
        err.print(f"wrote {path}", markup=False, emoji=False, soft_wrap=True)
    out = stderr_console() if html == "-" else stdout_console()
    out.print(render_simulation(summary, result.steps, timeline_rows, result.tables_at))
    from ..views.sim import render_comparison, render_explained, render_metric, render_what_if

    out.print(render_metric(_metric(result)))
    if group_doc is not None:
        from ..views.sim import render_groups

        out.print(render_groups(group_doc, num_blocks - 1))
    if explain:
        out.print(render_explained(result.requests, explained))
    if comparison is not None:
        out.print(render_comparison(comparison, stream, events))
    if outcomes:
        out.print(render_what_if(outcomes))
    if step_doc is not None:
        from ..views.sim import render_step_model

        out.print(render_step_model(step_doc), markup=False, soft_wrap=True)
    if comparison is not None:
        from ..views.sim import render_verdict

        out.print(render_verdict(comparison), markup=False, soft_wrap=True)
    return verdict


TRACE_FORMATS = ("auto", "pagetrace", "mooncake")
SWEEP_KEYS = ("capacity", "num-blocks", "block-size", "policy")


def _sweep(sweep, jobs, chart, others, source, workload, resolved, policy, max_model_len, json_output) -> int:
    """--sweep: the points (the product of each --sweep's values, the rest as the run would be set),
    run in processes (sim/sweep.py), one row each; --json: {"config", "points"}."""
    import itertools
    import math

    from ..errors import UsageError
    from ..paging.blocks import MAX_BLOCK_SIZE
    from ..sim.run import POLICIES
    from ..sim.sweep import PointSpec, blocks_for_everything, parse_tokens, run_points
    from .output import emit_json, stderr_console, stdout_console

    if not sweep:
        raise UsageError("--jobs" if jobs is not None else "--sweep-chart", jobs if jobs is not None else chart, "belongs to --sweep; give one")
    for option, value in others.items():
        if value:
            raise UsageError("--sweep", sweep[0], f"runs many points and reports each in one row; drop {option}")
    if jobs is not None and jobs < 1:
        raise UsageError("--jobs", jobs, "must be at least 1")
    axes: dict[str, list] = {}
    for text in sweep:
        key, sep, values = text.partition("=")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or key not in SWEEP_KEYS or not parts:
            raise UsageError("--sweep", text, f"give KEY=V1,V2,... with a key of: {', '.join(SWEEP_KEYS)}")
        if key in axes or (key in ("capacity", "num-blocks") and {"capacity", "num-blocks"} & set(axes)):
            raise UsageError("--sweep", text, f"{key} is swept twice (capacity and num-blocks are one axis)")
        try:
            if key == "policy":
                if any(p not in POLICIES for p in parts):
                    raise ValueError
                axes[key] = parts
            elif key == "capacity":
                axes[key] = [parse_tokens(p) for p in parts]
            else:
                axes[key] = [math.inf if key == "num-blocks" and p == "inf" else int(p) for p in parts]
                low = 2 if key == "num-blocks" else 1
                if any(v < low or (key == "block-size" and v > MAX_BLOCK_SIZE) for v in axes[key]):
                    raise ValueError
        except ValueError:
            what = {"policy": f"one of {', '.join(POLICIES)}", "capacity": "token counts like 3000000, 3M or inf",
                    "num-blocks": "integers of at least 2, or inf", "block-size": f"integers 1..{MAX_BLOCK_SIZE:,}"}[key]
            raise UsageError("--sweep", text, f"{key} values are {what}") from None
    v = resolved.values
    sizes = axes.get("block-size", [v["block_size"]])
    pools = axes.get("capacity") or axes.get("num-blocks") or [v["num_blocks"]]
    by_capacity = "capacity" in axes
    from ..sim.sweep import load_requests

    everything = {}
    for bs in sizes:  # read here once per block size: a trace that cannot be read at one is refused before any point runs
        try:
            everything[bs] = blocks_for_everything(load_requests(source, bs) if bs != v["block_size"] else workload, bs)
        except UsageError as exc:
            raise UsageError("--sweep", f"block-size={bs}", str(exc).split(": ", 2)[-1]) from None
    longest = max(len(r.prompt) + len(r.output) - 1 for r in workload)
    specs = []
    texts = dict(zip(pools, next((t.partition("=")[2].split(",") for t in sweep if t.startswith(("capacity=", "num-blocks="))), [])))
    for bs, pool, pol in itertools.product(sizes, pools, axes.get("policy", [policy])):
        if pool == math.inf:
            blocks, label = everything[bs], "inf (nothing evicted)"
        else:
            blocks = math.ceil(pool / bs) + 1 if by_capacity else int(pool)
            label = f"{texts.get(pool, pool).strip()} tokens" if by_capacity else f"{blocks:,} blocks"
        label += "".join(part for key, part in (("block-size", f", block size {bs}"), ("policy", f", {pol}")) if key in axes)
        if (blocks - 1) * bs < longest:
            raise UsageError("--sweep", label, f"a request stores {longest:,} tokens; {blocks - 1:,} usable blocks of {bs} hold {(blocks - 1) * bs:,}")
        specs.append(PointSpec(source, blocks, bs, pol, v["max_num_batched_tokens"], v["max_num_seqs"], max_model_len or (
            v["max_model_len"] if "max_model_len" in resolved.taken else None), v["prefix_caching"], v["chunked_prefill"], label))
    err = stderr_console()
    done = [0]

    def tell(i, point):
        done[0] += 1
        if not json_output:
            err.print(f"sweep: {done[0]}/{len(specs)} {point['label']}: hit rate {point['hit_rate']:.1%} ({point['seconds']:.1f} s)",
                      markup=False, emoji=False, soft_wrap=True)

    if resolved.line():
        err.print(resolved.line(), markup=False, emoji=False, soft_wrap=True)
    try:
        points = run_points(specs, jobs, on_done=tell)
    except ValueError as exc:
        raise UsageError("--sweep", sweep[0], str(exc)) from None
    written = []
    if chart:
        from ..files import write_outputs
        from ..views.sim_pictures import sweep_svg

        name = source.path or "synthetic workload"
        written = write_outputs([(chart, sweep_svg(points, f"prefix-cache hit rate against capacity: {name}").encode())])
    doc = {"config": {"workload": source.path or "synthetic", "trace_format": source.kind, "policy": policy,
                      "max_num_batched_tokens": v["max_num_batched_tokens"], "max_num_seqs": v["max_num_seqs"],
                      "prefix_caching": v["prefix_caching"], "chunked_prefill": v["chunked_prefill"],
                      "jobs": jobs, "sweep": sweep}, "points": points, "written": written}
    if json_output:
        emit_json(doc)
        return 0
    from ..views.sim import render_sweep

    for path in written:
        err.print(f"wrote {path}", markup=False, emoji=False, soft_wrap=True)
    stdout_console().print(render_sweep(points))
    return 0


def _settings(trace_text, trace_kind, stream, given: dict):
    """The run's settings: the flags, else the recording's (the trace's header, then the events
    file's), else the defaults (a flag that contradicts the recording: `Resolved.line`)."""
    from ..sim.settings import header_settings, resolve

    sources = []
    recorded = header_settings(trace_text) if trace_kind == "pagetrace" else None
    if recorded is not None:
        sources.append(("the trace's header", recorded))
    if stream is not None and stream.settings:
        sources.append(("the events file", stream.settings))
    from ..sim.mooncake import MOONCAKE_BLOCK

    resolved = resolve(given, sources, {"block_size": MOONCAKE_BLOCK} if trace_kind == "mooncake" else None)
    return resolved


def _trace_source(trace: str | None, trace_format: str, step_ms: float | None) -> tuple[str | None, str | None]:
    """The --trace file's text and its form ("pagetrace" or "mooncake"; None without --trace)."""
    from ..errors import UsageError

    if trace_format not in TRACE_FORMATS:
        raise UsageError("--trace-format", trace_format, f"must be one of: {', '.join(TRACE_FORMATS)}")
    if step_ms is not None and not (step_ms > 0 and step_ms < float("inf")):
        raise UsageError("--step-ms", step_ms, "must be a positive number of milliseconds")
    if trace is None:
        if trace_format != "auto":
            raise UsageError("--trace-format", trace_format, "names the form of a --trace file; give one")
        if step_ms is not None:
            raise UsageError("--step-ms", step_ms, "maps a Mooncake trace's timestamps to steps; give its --trace")
        return None, None
    from ..sim.mooncake import is_mooncake, read_text

    text = read_text(trace)
    kind = trace_format
    if kind == "auto":
        first = next((line for line in text.splitlines() if line.strip()), "")
        kind = "mooncake" if is_mooncake(first) else "pagetrace"
    if step_ms is not None and kind != "mooncake":
        raise UsageError("--step-ms", step_ms, "maps a Mooncake trace's timestamps to steps; this trace's arrivals are steps already")
    return text, kind


def _step_model(path: str, check: str | None):
    """(the model fitted on `path`'s step lines, its error on `check`'s or None)."""
    from ..errors import UsageError
    from ..sim import steptime

    def steps_of(option: str, p: str) -> dict:
        import json

        from ..sim.mooncake import read_text
        from ..sim.workload import read_trace

        try:
            text = read_text(p)
            first = next((line for line in text.splitlines() if line.strip()), "{}")
            try:
                size = json.loads(first).get("block_size") or 16
            except (ValueError, AttributeError):
                size = 16
            return read_trace(text, size, p).steps
        except UsageError as exc:
            raise UsageError(option, p, str(exc).split(": ", 2)[-1]) from None

    try:
        model = steptime.fit(steps_of("--step-model", path), path)
    except ValueError as exc:
        raise UsageError("--step-model", path, str(exc)) from None
    result = None
    if check is not None:
        try:
            result = steptime.evaluate(model, steps_of("--step-model-check", check), check)
        except ValueError as exc:
            raise UsageError("--step-model-check", check, str(exc)) from None
    return model, result


def _hybrid_groups(layers, config_json, policy, events, explain, what_if):
    """The KV cache groups of --layers or --config (None: one full-attention group)."""
    from ..errors import UsageError

    if layers is None and config_json is None:
        return None
    if layers is not None and config_json is not None:
        raise UsageError("--layers", layers, "gives the layers; so does --config: give one")
    from ..sim.hybrid import kv_cache_groups, layers_from_config, parse_layers

    if layers is not None:
        option, value = "--layers", layers
        try:
            kinds = parse_layers(layers)
        except ValueError as exc:
            raise UsageError("--layers", layers, str(exc)) from None
    else:
        from ..sim.capacity import read_config

        option, value = "--config", config_json
        try:
            kinds = layers_from_config(read_config(config_json))
        except ValueError as exc:
            raise UsageError("--config", config_json, str(exc)) from None
        if kinds is None:
            raise UsageError("--config", config_json, "has no sliding-window layer (no layer_types / sliding_window): drop it")
    for other, given in (("--policy", policy != "vllm"), ("--explain", explain), ("--what-if", bool(what_if))):
        if given:
            raise UsageError(option, value, f"hybrid models run with vLLM's policy, without {other} (not modelled for KV cache groups)")
    if all(k.window is None for k in kinds):  # every layer full: one group, the usual policy
        return None
    return kv_cache_groups(kinds)[0]


def _group_memory(result) -> list[dict]:
    """Each KV cache group's blocks over the run: peak, mean, at the end."""
    rows = result.group_blocks or [[0] * len(result.policy.groups)]
    out = []
    for i, g in enumerate(result.policy.groups):
        col = [r[i] for r in rows]
        out.append({"group": i, "kind": g.kind.kind, "window": g.kind.window, "layers": g.layers,
                    "peak_blocks": max(col), "mean_blocks": round(sum(col) / len(col), 2)})
    return out


def simulate_json(config: dict, result, summary, written: list[str], explained: list[dict] | None = None) -> dict:
    """`simulate --json`'s document (and the data of the --html page); `explained`: each
    request's misses (sim/explain.py), merged into its entry."""
    return {
        "config": config,
        "summary": summary.to_json(),
        "requests": [{"id": r.request_id, "arrival": r.arrival, "prompt_tokens": len(r.prompt), "output_tokens": len(r.output),
                      "num_cached_tokens": r.num_cached_tokens, "first_scheduled": r.first_scheduled,
                      "finished": r.finished_step, "preemptions": r.num_preemptions, **(explained[i] if explained else {})}
                     for i, r in enumerate(result.requests)],
        "steps": [_step_json(s) for s in result.steps],
        "tables_at": {str(s): t for s, t in result.tables_at.items()},
        "written": written,
    }


def _what_ifs(result, base, settings, fresh, max_model_len, chunked_prefill, quiet):
    """The run as given, then each --what-if setting on a fresh copy of the workload."""
    from ..errors import UsageError
    from ..sim.run import simulate as run_simulation
    from ..sim.scheduler import SchedulerConfig
    from ..sim.whatif import outcome

    out = [outcome("as given", base, result)]
    for st in settings:
        label = st.label(base)
        pool_tokens = (st.num_blocks - 1) * st.block_size
        try:
            reqs = fresh(st.block_size)
        except UsageError as exc:
            raise UsageError("--what-if", label, str(exc).split(": ", 2)[-1]) from None
        mml = min(max_model_len, pool_tokens)
        longest = max(len(r.prompt) + len(r.output) - 1 for r in reqs)
        if longest > mml:
            raise UsageError("--what-if", label, f"a request stores {longest} tokens; {st.num_blocks - 1} usable blocks of {st.block_size} hold {pool_tokens}")
        config = SchedulerConfig(st.max_num_batched_tokens, st.max_num_seqs, chunked_prefill)
        try:
            r = run_simulation(reqs, st.num_blocks, st.block_size, config, st.prefix_caching, max_model_len=mml, policy=st.policy)
        except ValueError as exc:
            raise UsageError("--what-if", label, str(exc)) from None
        out.append(outcome(label, st, r))
    return out


def _metric(result) -> dict:
    """What vLLM's prefix-cache counters report for this run (vllm/v1/metrics/stats.py
    PrefixCacheStats.record, called at admission): new requests' queries and hits, which are
    pagetrace's prompt tokens and hits; a preempted request's lookups counted apart."""
    reqs = result.requests
    queries = sum(r.prompt_len for r in reqs if r.first_scheduled is not None)
    hits = sum(r.num_cached_tokens or 0 for r in reqs)
    return {"queries": queries, "hits": hits, "preempted_queries": result.preempted_queries, "preempted_hits": result.preempted_hits}


def _read_events(source: str, bind: bool, timeout: float, quiet: bool):
    from .output import stderr_console
    from ..errors import RuntimeFailure, UsageError
    from ..sim import events as ev

    err = stderr_console()
    try:
        if source.startswith(("tcp://", "ipc://")):
            if not quiet:
                err.print(f"listening on {source} ({'bound' if bind else 'connected'}) until {timeout:g} s pass without a message", markup=False, soft_wrap=True)
            stream = ev.read_live(ev.listen(source, bind=bind, idle_timeout=timeout), source)
        else:
            stream = ev.read_file(source)
    except OSError as exc:
        raise UsageError("--events", source, exc.strerror or str(exc)) from None
    except ev.EventError as exc:
        raise UsageError("--events", source, str(exc)) from None
    if stream.batches == [] and not stream.problems:
        raise RuntimeFailure(f"{source}: no KV events message" + (f" within {timeout:g} s (a publisher with a non-wildcard endpoint connects: try --events-bind)" if source.startswith("tcp://") and not bind else ""))
    for line in stream.problems:
        err.print(f"warning: {line}", markup=False, emoji=False, soft_wrap=True)
    return stream


def _nothing():
    from contextlib import nullcontext

    return nullcontext()


def _progress(total: int, quiet: bool):
    """A progress bar on stderr for long runs in a terminal."""
    from .output import stderr_console

    console = stderr_console()
    if quiet or total < 2000 or not console.is_terminal:
        return None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _step_json(s) -> dict:
    return {"step": s.step, "scheduled": s.scheduled, "tokens": s.tokens, "allocated": s.allocated, "hit_tokens": s.hit_tokens,
            "evicted": s.evicted, "admitted": s.admitted, "preempted": s.preempted, "finished": s.finished,
            "free_blocks": s.free_blocks, "used_blocks": s.used_blocks, "waiting": s.waiting, "running": s.running}


def _write_pictures(result, summary, at, svg, png, chart, tables_svg, tables_png, block_size, num_blocks) -> list[str]:
    from ..files import write_outputs
    from ..views import sim_pictures as pictures

    outputs: list[tuple[str, bytes]] = []
    if svg or png:
        steps = len(result.occupancy)
        title = f"pool occupancy: {num_blocks} blocks x {steps} steps" + (" (first steps only)" if result.occupancy_cut else "")
        if svg:
            outputs.append((svg, pictures.occupancy_svg(result.occupancy, result.shared, title, result.steps).encode()))
        if png:
            outputs.append((png, pictures.occupancy_png(result.occupancy, result.shared, title, result.steps)))
    if chart:
        title = f"KV memory use, {summary.requests} requests ({num_blocks} blocks of {block_size})"
        outputs.append((chart, pictures.waste_svg(summary.waste, title).encode()))
    written = write_outputs(outputs) if outputs else []
    if tables_svg or tables_png:
        from ..views.diagram import MappingView, SequenceMap, write_diagrams

        tables = result.tables_at[at]
        by_id = {r.request_id: r for r in result.requests}
        seqs = [SequenceMap(rid, min(by_id[rid].num_computed, len(b) * block_size), b) for rid, b in tables.items() if b]
        if not seqs:
            from ..errors import UsageError

            raise UsageError("--at", at, "no request holds blocks after that step; pick another")
        view = MappingView(block_size=block_size, num_blocks=num_blocks, sequences=seqs)
        written += write_diagrams(view, svg=tables_svg, png=tables_png)
    return written
