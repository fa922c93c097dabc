"""A sweep: one workload simulated at many settings (pool sizes, block sizes, policies), the points
in parallel processes.

A point is a `PointSpec`: plain, picklable data naming the workload (a trace file and how to read
it, or a synthetic spec) and the engine settings. `run_point(spec)` reads the workload in the
process it runs in (a run changes its requests, so each point reads its own), simulates it, and
returns a plain dict: the hit rate vLLM's metric would report, the peak blocks in use, the
preemptions and evictions, the steps. `run_points(specs, jobs)` runs them in a process pool (all
cores by default) and returns the dicts in the specs' order. Anything that can build a spec can
sweep with it (a fleet of instances: one spec per instance's trace).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from .workload import SyntheticSpec


@dataclass(frozen=True, slots=True)
class WorkloadSource:
    """Where a point's requests come from: `kind` "pagetrace" or "mooncake" (a trace at `path`;
    `step_ms`: Mooncake's clock) or "synthetic" (`synthetic`)."""

    kind: str
    path: str | None = None
    step_ms: float | None = None
    synthetic: SyntheticSpec | None = None


@dataclass(frozen=True, slots=True)
class PointSpec:
    workload: WorkloadSource
    num_blocks: int
    block_size: int
    policy: str = "vllm"
    max_num_batched_tokens: int = 4096
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: the longest request, at most the pool
    prefix_caching: bool = True
    chunked_prefill: bool = True
    label: str = ""

    @property
    def capacity_tokens(self) -> int:
        """The tokens the pool holds (block 0, the null block, holds none)."""
        return (self.num_blocks - 1) * self.block_size


_TEXT: dict[str, str] = {}  # a process's trace texts, read once: every point re-parses (a run changes its requests)


def load_requests(source: WorkloadSource, block_size: int):
    """The workload's requests, fresh."""
    if source.kind == "synthetic":
        from .workload import synthetic

        return synthetic(source.synthetic)
    from .mooncake import DEFAULT_STEP_MS, parse_mooncake, read_text

    text = _TEXT.get(source.path)
    if text is None:
        text = _TEXT[source.path] = read_text(source.path)
    if source.kind == "mooncake":
        return parse_mooncake(text, block_size, source.step_ms or DEFAULT_STEP_MS, source.path).requests
    from .workload import read_trace

    return read_trace(text, block_size, source.path).requests


def blocks_for_everything(requests, block_size: int) -> int:
    """A pool so large that nothing is ever evicted: every block of every request at once, plus the null block."""
    return sum(-(-(len(r.prompt) + len(r.output) - 1) // block_size) for r in requests) + 1


def run_point(spec: PointSpec) -> dict:
    """One point: the simulation's figures as a plain dict (the spec's settings included)."""
    from .run import simulate
    from .scheduler import SchedulerConfig

    start = time.perf_counter()
    requests = load_requests(spec.workload, spec.block_size)
    pool_tokens = spec.capacity_tokens
    longest = max(len(r.prompt) + len(r.output) - 1 for r in requests)
    mml = min(spec.max_model_len or max(2048, longest), pool_tokens)
    result = simulate(requests, spec.num_blocks, spec.block_size,
                      SchedulerConfig(spec.max_num_batched_tokens, spec.max_num_seqs, spec.chunked_prefill),
                      spec.prefix_caching, max_model_len=max(mml, longest), policy=spec.policy)
    reqs = result.requests
    queries = sum(r.prompt_len for r in reqs if r.first_scheduled is not None)
    hits = sum(r.num_cached_tokens or 0 for r in reqs)
    peak = max((s.used_blocks for s in result.steps), default=0)
    settings = asdict(spec)
    settings.pop("workload")
    return {**settings, "capacity_tokens": pool_tokens, "requests": len(reqs), "prompt_tokens": queries, "hit_tokens": hits,
            "hit_rate": hits / queries if queries else 0.0, "peak_used_blocks": peak,
            "peak_used_share": peak / max(spec.num_blocks - 1, 1), "preemptions": result.num_preemptions,
            "evictions": sum(s.evicted for s in result.steps), "steps": len(result.steps),
            "seconds": round(time.perf_counter() - start, 3)}


def default_jobs() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def run_points(specs: Sequence[PointSpec], jobs: int | None = None, on_done: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Every point, `jobs` processes at a time (default: all cores; 1: in this process), in the specs' order."""
    jobs = min(jobs or default_jobs(), len(specs)) or 1
    out: list[dict | None] = [None] * len(specs)
    if jobs == 1:
        for i, spec in enumerate(specs):
            out[i] = run_point(spec)
            if on_done is not None:
                on_done(i, out[i])
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_point, spec): i for i, spec in enumerate(specs)}
        for future in as_completed(futures):
            i = futures[future]
            out[i] = future.result()
            if on_done is not None:
                on_done(i, out[i])
    return out


def parse_tokens(text: str) -> float:
    """A token count: 3000000, 3M, 512K, 1.5G (powers of 1,000), or inf."""
    t = text.strip().lower()
    if t in ("inf", "infinite"):
        return math.inf
    scale = {"k": 1e3, "m": 1e6, "g": 1e9}.get(t[-1:], 1)
    number = t[:-1] if scale != 1 else t
    value = float(number)  # ValueError for the caller
    if not number.replace(".", "", 1).isdigit() or value <= 0:
        raise ValueError(text)
    return value * scale


__all__ = ["PointSpec", "WorkloadSource", "blocks_for_everything", "default_jobs", "load_requests", "parse_tokens", "run_point", "run_points"]
