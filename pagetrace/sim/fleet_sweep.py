"""A sweep of fleet runs: traces × routers × instance counts × caches × capacities, each point one
`run_fleet`, run in local processes (all cores by default) or as Ray tasks on a cluster.

Every finished point is appended at once to the results file, one JSON line written whole
(`write` + `flush` + `fsync`), keyed by its settings; a sweep started again with the same
results file runs only the points not in it, so an interrupted sweep keeps what it finished
(a last line cut by a crash mid-write is not JSON and is run again). The results are gathered
into one table whichever way the points ran.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from itertools import product


@dataclass(frozen=True, slots=True)
class Point:
    trace: str  # a trace file, or "synthetic"
    router: str
    instances: int
    num_blocks: int  # per instance
    cache: str = "local"
    store_tokens: int = 0  # cache "store"

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True, slots=True)
class Settings:
    """What every point shares."""

    block_size: int | None = None  # None: 512 for a Mooncake trace, else 16
    max_num_batched_tokens: int = 4096
    max_num_seqs: int = 256
    overlap_weight: float = 1.0
    max_tokens: int | None = None
    step_ms: float | None = None
    synthetic: dict = field(default_factory=dict)  # conversation.ConversationSpec fields, for trace "synthetic"

    def __hash__(self) -> int:  # (the dict field)
        return hash(json.dumps(asdict(self), sort_keys=True))


def grid(traces: Iterable[str], routers: Iterable[str], instances: Iterable[int], num_blocks: Iterable[int],
         caches: Iterable[tuple[str, int]]) -> list[Point]:
    return [Point(t, r, n, b, c, s) for t, r, n, b, (c, s) in product(traces, routers, instances, num_blocks, caches)]


def run_point(point: Point, settings: Settings, text: str | None = None) -> dict:
    """One fleet run: the point's settings and the fleet's figures (no per-request data).
    `text`: the trace's text, when the caller has read it (a Ray task gets it from the object store)."""
    import time

    from .fleet import run_fleet
    from .fleet_workload import cap_outputs, read_fleet_traces
    from .router import make_router
    from .scheduler import SchedulerConfig

    start = time.perf_counter()
    if point.trace == "synthetic":
        from .conversation import ConversationSpec, conversations

        reqs, sessions = conversations(ConversationSpec(**settings.synthetic))
        bs = settings.block_size or 16
    else:
        from .mooncake import MOONCAKE_BLOCK, is_mooncake, read_text

        text = read_text(point.trace) if text is None else text
        bs = settings.block_size or (MOONCAKE_BLOCK if is_mooncake(next((ln for ln in text.splitlines() if ln.strip()), "")) else 16)
        work = read_fleet_traces([text], bs, [point.trace], settings.step_ms)
        reqs, sessions = work.requests, work.sessions
    if settings.max_tokens is not None:
        cap_outputs(reqs, settings.max_tokens)
    router = make_router(point.router, settings.overlap_weight, sessions)
    r = run_fleet(reqs, router, point.instances, point.num_blocks, bs,
                  SchedulerConfig(settings.max_num_batched_tokens, settings.max_num_seqs),
                  max_model_len=(point.num_blocks - 1) * bs, cache=point.cache, store_blocks=point.store_tokens // bs,
                  load_stride=1 << 30, release=True)
    doc = r.to_json()
    return {"point": asdict(point), "block_size": bs, "capacity_tokens": (point.num_blocks - 1) * bs,
            "requests": doc["requests"], "steps": doc["steps"], "hit_rate": doc["hit_rate"],
            "local_hit_rate": doc["local_hit_rate"], "shared_hit_rate": doc["shared_hit_rate"],
            "preemptions": doc["preemptions"], "imbalance": doc["imbalance"],
            "peak_load": max(i["peak_load"] for i in doc["instances"]), "seconds": round(time.perf_counter() - start, 3)}


def read_results(path: str) -> dict[str, dict]:
    """The points already done: key -> result (a line that is not whole JSON is skipped)."""
    done: dict[str, dict] = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue
                if isinstance(row, dict) and isinstance(row.get("point"), dict):
                    try:
                        done[Point(**row["point"]).key()] = row
                    except TypeError:
                        continue
    except FileNotFoundError:
        pass
    return done


def _append(path: str, row: dict) -> None:
    """One result line, written whole: a line, then flushed to disk. After a line cut by a crash
    (no newline at the end), a newline first, so the cut line stays alone and unread."""
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        cut = False
        if f.tell():
            f.seek(-1, os.SEEK_END)
            cut = f.read(1) != b"\n"
        f.write((("\n" if cut else "") + json.dumps(row, separators=(",", ":")) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


def run_sweep(points: list[Point], settings: Settings, results: str | None = None, workers: int | None = None,
              ray_address: str | None = None, on_result: Callable[[dict, int, int], None] | None = None) -> list[dict]:
    """Every point's result, in the order of `points`; those in `results` already are not run again.

    `workers`: local processes (default: all cores; 1 runs in this process). `ray_address`: run
    the points as Ray tasks on that cluster (`ray.init(address=...)`; a Ray already initialised
    in this process is used as it is)."""
    done = read_results(results) if results else {}
    todo = [p for p in dict.fromkeys(points) if p.key() not in done]
    count = [len(points) - len(todo)]

    def finished(row: dict) -> None:
        done[Point(**row["point"]).key()] = row
        if results:
            _append(results, row)
        count[0] += 1
        if on_result is not None:
            on_result(row, count[0], len(points))

    if todo:
        if ray_address is not None:
            _run_ray(todo, settings, ray_address, finished)
        elif (workers or os.cpu_count() or 1) <= 1 or len(todo) == 1:
            for p in todo:
                finished(run_point(p, settings))
        else:
            from concurrent.futures import ProcessPoolExecutor, as_completed

            with ProcessPoolExecutor(max_workers=min(workers or os.cpu_count() or 1, len(todo))) as pool:
                futures = [pool.submit(run_point, p, settings) for p in todo]
                for fut in as_completed(futures):
                    finished(fut.result())
    return [done[p.key()] for p in points]


def _run_ray(todo: list[Point], settings: Settings, address: str, finished) -> None:
    import ray  # the `ray` extra (pyproject.toml)

    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address)  # "local": start a Ray here
    from .mooncake import read_text

    task = ray.remote(run_point)
    # each trace read once here and put in the object store: the cluster's nodes need no copy of the file
    texts = {t: ray.put(read_text(t)) for t in {p.trace for p in todo} if t != "synthetic"}
    pending = [task.remote(p, settings, texts.get(p.trace)) for p in todo]
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        for ref in ready:
            finished(ray.get(ref))
