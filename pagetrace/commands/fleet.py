"""`pagetrace fleet`: N simulated vLLM (or SGLang) instances behind a router, fed by one workload.

A command of its own rather than a mode of `simulate`: simulate's outputs are one server's
(its pool pictures, block tables at a step, the --html step slider, the waste table against
Orca), none of which has one meaning for N pools, and the fleet's own options (instances,
router, shared cache, per-instance traces and events) mean nothing for one server.
"""

from __future__ import annotations

from typing import Annotated

import typer
from .options import FloatOption, IntOption

HELP = "Simulate a fleet of vLLM instances behind a router (round-robin, least-loaded, prefix-aware, session, as-recorded), each with its own pool, their caches local, shared through a store, or pooled; hit rate by outcome, load and imbalance per instance."
EPILOG = (
    "Example: pagetrace fleet --instances 4 --router prefix-aware --sessions 200 --turns 4 --num-blocks 800"
    "  |  pagetrace fleet --instances 4 --router session --cache store --store-tokens 200000 --explain"
    "  |  pagetrace fleet --router as-recorded --trace a.trace.jsonl --trace b.trace.jsonl --block-size 32"
)
MAX_STORE_TOKENS = 1 << 40


def fleet(
    instances: Annotated[int | None, IntOption(help="Instances in the fleet (default 4; as-recorded: one per --trace).")] = None,
    router: Annotated[str, typer.Option(metavar="NAME", help="round-robin, least-loaded (fewest running + waiting), prefix-aware (Dynamo's cost: overlap weight x uncached prompt blocks + active blocks), session (a session stays where it started), as-recorded (the instance whose --trace holds the request).")] = "round-robin",
    trace: Annotated[list[str] | None, typer.Option(metavar="FILE", help="A trace (simulate's format; a 'session' field per line for the session router); repeat for one per instance.")] = None,
    sessions: Annotated[int, IntOption(help="Synthetic conversations: sessions.")] = 100,
    turns: Annotated[int, IntOption(help="Synthetic: turns per session (each resends the session's history).")] = 4,
    system_prompt: Annotated[int, IntOption(help="Synthetic: tokens of a system prompt every session starts with.")] = 256,
    user_len: Annotated[str, typer.Option(help="Synthetic: tokens of each user message, fixed or low:high.")] = "32:256",
    output_len: Annotated[str, typer.Option(help="Synthetic: tokens of each reply, fixed or low:high.")] = "16:128",
    session_rate: Annotated[float, FloatOption(help="Synthetic: sessions starting per step (Poisson); 0 = all at step 0.")] = 0.5,
    turn_gap: Annotated[int, IntOption(help="Synthetic: steps between a session's turns.")] = 40,
    seed: Annotated[int, IntOption(help="Synthetic: random seed.")] = 0,
    step_ms: Annotated[float | None, FloatOption(help="A Mooncake trace's clock: milliseconds per step (arrival step = floor(timestamp / step-ms)). Default: 50.")] = None,
    max_tokens: Annotated[int | None, IntOption(help="Cap every request's output at this many tokens (Mooncake's §5.3.2 set-up: 1).")] = None,
    num_blocks: Annotated[int | None, IntOption(help="Blocks in each instance's pool, block 0 included (default: the recordings' server's, else 1024).")] = None,
    block_size: Annotated[int | None, IntOption(help="Tokens per block (default 16; 512 for Mooncake traces, the size of their hash ids).")] = None,
    max_num_batched_tokens: Annotated[int | None, IntOption(help="Each instance's token budget per step (default: the recordings' server's, else 4096).")] = None,
    max_num_seqs: Annotated[int | None, IntOption(help="Each instance's running requests at most (default: the recordings' server's, else 256).")] = None,
    policy: Annotated[str, typer.Option(metavar="vllm|sglang", help="Each instance's KV cache: vLLM's block manager or SGLang's radix tree.")] = "vllm",
    no_prefix_caching: Annotated[bool, typer.Option("--no-prefix-caching", help="Turn prefix caching off on every instance.")] = False,
    cache: Annotated[str, typer.Option(metavar="local|store|pooled", help="local: each instance reads its own pool; store: also a shared store of --store-tokens holding the blocks pools evict; pooled: also every other instance's pool (Mooncake's global cache).")] = "local",
    store_tokens: Annotated[int | None, IntOption(help="--cache store: the shared store's capacity in tokens (whole blocks).")] = None,
    overlap_weight: Annotated[float, FloatOption(help="prefix-aware: Dynamo's overlap_score_weight (its default 1; large: longest prefix first).")] = 1.0,
    max_model_len: Annotated[int | None, IntOption(help="Each instance's longest request (default: its pool's tokens).")] = None,
    events: Annotated[list[str] | None, typer.Option(metavar="FILE", help="A recorded KV events file (.kvev) per --trace, in the same order (as-recorded): each instance's predicted events are compared with its server's, block for block; a divergence exits 1.")] = None,
    load_samples: Annotated[int, IntOption(help="Load over time: samples of each instance's running + waiting requests over the run.")] = 60,
    explain: Annotated[bool, typer.Option("--explain", help="Name, for each miss, the instance that held the prefix when the router sent the request elsewhere.")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON document and nothing else on stdout.")] = False,
) -> None:
    from ..errors import UsageError
    from ..paging.blocks import MAX_BLOCK_SIZE, MAX_SEQS, MAX_TOKENS
    from ..sim.fleet import CACHES, MAX_INSTANCES, run_fleet
    from ..sim.router import ROUTERS, make_router
    from ..sim.run import POLICIES
    from ..sim.scheduler import SchedulerConfig
    from .output import emit_json, stdout_console
    from .simulate import MAX_BLOCKS, parse_range

    # -- every option checked before any work --
    traces = trace or []
    texts = []
    if traces:
        from ..sim.mooncake import MOONCAKE_BLOCK, is_mooncake, read_text

        texts = [read_text(path) for path in traces]
        kinds = {is_mooncake(next((ln for ln in t.splitlines() if ln.strip()), "")) for t in texts}
    streams = []
    for path in events or []:
        from ..sim import events as ev

        try:
            streams.append(ev.read_file(path))
        except OSError as exc:
            raise UsageError("--events", path, exc.strerror or str(exc)) from None
        except ev.EventError as exc:
            raise UsageError("--events", path, str(exc)) from None
    # the settings: the flags, else the recording servers' (each trace's header, each events file's), else the defaults
    resolved = _settings(texts, traces, streams, events or [], {"num_blocks": num_blocks, "block_size": block_size,
                         "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs, "max_model_len": max_model_len,
                         "prefix_caching": False if no_prefix_caching else None, "chunked_prefill": None},
                         bool(texts) and kinds == {True})
    v = resolved.values
    num_blocks, block_size, max_num_batched_tokens, max_num_seqs = v["num_blocks"], v["block_size"], v["max_num_batched_tokens"], v["max_num_seqs"]
    server_model_len = v["max_model_len"] if "max_model_len" in resolved.taken or max_model_len is not None else None
    no_prefix_caching, chunked_prefill = not v["prefix_caching"], v["chunked_prefill"]
    if step_ms is not None and not (step_ms > 0 and step_ms < float("inf")):
        raise UsageError("--step-ms", step_ms, "must be a positive number of milliseconds")
    if max_tokens is not None and max_tokens < 1:
        raise UsageError("--max-tokens", max_tokens, "must be at least 1")
    if router not in ROUTERS:
        raise UsageError("--router", router, f"must be one of: {', '.join(ROUTERS)}")
    if policy not in POLICIES:
        raise UsageError("--policy", policy, f"must be one of: {', '.join(POLICIES)}")
    if cache not in CACHES:
        raise UsageError("--cache", cache, f"must be one of: {', '.join(CACHES)}")
    if router == "as-recorded":
        if not traces:
            raise UsageError("--router", router, "sends each request where a real router did: give one --trace per instance, each recorded by that instance")
        if instances is not None and instances != len(traces):
            raise UsageError("--instances", instances, f"as-recorded runs one instance per --trace: {len(traces)} given")
        instances = len(traces)
    if instances is None:
        instances = 4
    if instances < 1 or instances > MAX_INSTANCES:
        raise UsageError("--instances", instances, f"must be 1 to {MAX_INSTANCES:,} (each instance holds its own pool in memory)")
    for option, value, low, high in (("--num-blocks", num_blocks, 2, MAX_BLOCKS), ("--block-size", block_size, 1, MAX_BLOCK_SIZE),
                                     ("--max-num-batched-tokens", max_num_batched_tokens, 1, MAX_TOKENS), ("--max-num-seqs", max_num_seqs, 1, MAX_SEQS),
                                     ("--sessions", sessions, 1, 1_000_000), ("--turns", turns, 1, 1000), ("--system-prompt", system_prompt, 0, MAX_TOKENS),
                                     ("--turn-gap", turn_gap, 0, 1_000_000), ("--load-samples", load_samples, 1, 10_000)):
        if value < low or value > high:
            raise UsageError(option, value, f"must be {low:,} to {high:,}")
    if instances * num_blocks > 40_000_000:
        raise UsageError("--num-blocks", num_blocks, f"{instances} instances of {num_blocks:,} blocks: more than the 40,000,000 blocks a fleet holds in memory")
    if not session_rate >= 0 or session_rate == float("inf"):
        raise UsageError("--session-rate", session_rate, "must be a finite number >= 0")
    if not overlap_weight >= 0 or overlap_weight == float("inf"):
        raise UsageError("--overlap-weight", overlap_weight, "must be a finite number >= 0")
    if cache == "store":
        if store_tokens is None:
            raise UsageError("--cache", cache, "a shared store needs its capacity: give --store-tokens")
        if store_tokens < block_size:
            raise UsageError("--store-tokens", store_tokens, f"the store must hold at least one block of {block_size} tokens")
        if store_tokens > MAX_STORE_TOKENS:
            raise UsageError("--store-tokens", store_tokens, f"must be at most {MAX_STORE_TOKENS:,}")
    elif store_tokens is not None:
        raise UsageError("--store-tokens", store_tokens, "sizes the shared store: give --cache store")
    if policy != "vllm":
        for option, value, given in (("--cache", cache, cache != "local"), ("--router", router, router == "prefix-aware"), ("--explain", True, explain)):
            if given:
                raise UsageError(option, value, "reads the instances' vLLM block hashes: run it with --policy vllm")
    if no_prefix_caching and cache != "local":
        raise UsageError("--cache", cache, "shares cached blocks; drop --no-prefix-caching")

    event_files = events or []
    if event_files:
        if router != "as-recorded":
            raise UsageError("--events", event_files[0], "compares each instance with the server it stands for: route --router as-recorded")
        if len(event_files) != len(traces):
            raise UsageError("--events", event_files[0], f"give one --events per --trace ({len(traces)} traces, {len(event_files)} events files)")
        if policy != "vllm" or cache != "local" or no_prefix_caching:
            raise UsageError("--events", event_files[0], "vLLM's KV events are compared with --policy vllm, --cache local and prefix caching on")
    if max_model_len is not None and max_model_len < 1:
        raise UsageError("--max-model-len", max_model_len, "must be at least 1")

    # -- the workload --
    if traces:
        from ..sim.fleet_workload import read_fleet_traces

        work = read_fleet_traces(texts, block_size, traces, step_ms)
        reqs, sess, assignment = work.requests, work.sessions, work.assignment
        workload = {"traces": traces}
    else:
        from ..sim.conversation import ConversationSpec, conversations

        spec = ConversationSpec(sessions, turns, system_prompt, parse_range(user_len, "--user-len"), parse_range(output_len, "--output-len"),
                                session_rate, turn_gap, seed)
        reqs, sess = conversations(spec)
        assignment = None
        workload = {"synthetic": "conversations", "sessions": sessions, "turns": turns, "system_prompt": system_prompt,
                    "user_len": user_len, "output_len": output_len, "session_rate": session_rate, "turn_gap": turn_gap, "seed": seed}
    if max_tokens is not None:
        from ..sim.fleet_workload import cap_outputs

        cap_outputs(reqs, max_tokens)
    try:
        route = make_router(router, overlap_weight, sess, assignment)
    except ValueError as exc:
        raise UsageError("--router", router, str(exc)) from None
    if router == "session" and traces and len(sess) < len(reqs):
        missing = next(r.request_id for r in reqs if r.request_id not in sess)
        raise UsageError("--router", router, f"routes by session: request {missing} has no 'session' field in its trace")
    pool_tokens = (num_blocks - 1) * block_size
    longest = max(len(r.prompt) + len(r.output) - 1 for r in reqs)
    if longest > pool_tokens:
        raise UsageError("--num-blocks", num_blocks, f"a request stores {longest:,} tokens; {num_blocks - 1:,} usable blocks of {block_size} hold {pool_tokens:,}")
    max_model_len = server_model_len
    if max_model_len is None:
        max_model_len = pool_tokens
    elif longest > max_model_len:
        raise UsageError("--max-model-len", max_model_len, f"a request stores {longest:,} tokens; raise it to at least that")
    given = list(reqs)  # compare reads the requests as given
    span = max(r.arrival for r in reqs) + 1
    config = SchedulerConfig(max_num_batched_tokens, max_num_seqs, chunked_prefill)
    if resolved.line():  # every option checked: the flags that contradict the recordings, in one line
        from .output import stderr_console

        stderr_console().print(resolved.line(), markup=False, emoji=False, soft_wrap=True)
    try:
        result = run_fleet(reqs, route, instances, num_blocks, block_size, config, policy, not no_prefix_caching,
                           max_model_len=max_model_len, cache=cache, store_blocks=(store_tokens or 0) // block_size,
                           explain=explain, load_stride=max(1, -(-span // load_samples)), release=not streams,
                           record_events=bool(streams))
    except ValueError as exc:
        from ..errors import RuntimeFailure

        raise RuntimeFailure(str(exc)) from None
    doc = {"config": {"instances": instances, "router": router, "cache": cache, "store_tokens": store_tokens,
                      "overlap_weight": overlap_weight, "policy": policy, "num_blocks": num_blocks, "block_size": block_size,
                      "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs,
                      "prefix_caching": not no_prefix_caching, "chunked_prefill": chunked_prefill, "max_model_len": max_model_len,
                      "max_tokens": max_tokens, "step_ms": step_ms, "workload": workload,
                      "from_server": resolved.taken, "overridden": resolved.overridden},
           "fleet": result.to_json()}
    if explain:
        doc["explain"] = [m.to_json() for m in result.missed]
    verdicts = []
    if streams:
        from ..sim.compare import compare

        for k, (stream, path) in enumerate(zip(streams, event_files)):
            c = compare(result.instance_run(k, given), work.traces[k], stream, block_size,
                        {"num_blocks": num_blocks, "max_num_batched_tokens": max_num_batched_tokens, "max_num_seqs": max_num_seqs})
            verdicts.append({"instance": k, "trace": traces[k], "events": path, **c.to_json(), "gaps": [list(g) for g in stream.gaps],
                             "problems": stream.problems})
        doc["events"] = verdicts
        doc["passed"] = all(v["equal"] and not v["gaps"] for v in verdicts)
    if json_output:
        emit_json(doc)
        _verdict(verdicts)
        return
    from ..views.fleet import render_fleet, render_missed

    out = stdout_console()
    out.print(render_fleet(doc))
    if explain:
        out.print(render_missed(doc["explain"]))
    if verdicts:
        from ..views.fleet import render_verdicts

        out.print(render_verdicts(verdicts))
    _verdict(verdicts)


def _settings(texts: list[str], traces: list[str], streams: list, event_files: list[str], given: dict, mooncake: bool):
    """sim/settings.py `resolve` over every recording: each trace's header, then each events
    file's settings. A fleet's instances share one setting: recordings that disagree on one the
    flags leave open are refused, naming it."""
    from ..errors import UsageError
    from ..sim.mooncake import MOONCAKE_BLOCK
    from ..sim.settings import OPTIONS, header_settings, resolve, show

    sources = []
    for text, path in zip(texts, traces):
        recorded = header_settings(text)
        if recorded is not None:
            sources.append((f"{path}'s header", recorded))
    sources += [(f"{path}'s settings", stream.settings) for stream, path in zip(streams, event_files) if stream.settings]
    for key in OPTIONS:
        seen = {(name, s[key]) for name, s in sources if s.get(key) is not None}
        values = {value for _, value in seen}
        if given.get(key) is None and len(values) > 1:
            ordered = sorted(seen, key=lambda x: str(x[1]))
            (a, va), (b, vb) = ordered[0], ordered[-1]
            raise UsageError(OPTIONS[key], None, f"the recordings' servers differ ({a}: {show(va)}, {b}: {show(vb)}); "
                                                 f"a fleet's instances share one setting: give {OPTIONS[key]}")
    return resolve(given, sources, {"block_size": MOONCAKE_BLOCK} if mooncake else None)


def _verdict(verdicts: list[dict]) -> None:
    """Exit 1 when an instance's predicted events differ from its server's."""
    bad = [v for v in verdicts if not v["equal"] or v["gaps"]]
    if bad:
        from ..errors import RuntimeFailure

        v = bad[0]
        raise RuntimeFailure(f"instance {v['instance']}'s predicted KV events differ from {v['events']}: they agree on the first "
                             f"{v['agree']} of {v['server_items']}" + (f" ({len(bad)} instances differ)" if len(bad) > 1 else ""))
