"""Run a workload through the scheduler and the policy, step by step, and keep what happened."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import RuntimeFailure, plural
from .parallel import split_parallel_groups
from .policy import KVCachePolicy, VllmPrefixCaching
from .radix import SglangRadixCache
from .request import SimRequest
from .scheduler import Scheduler, SchedulerConfig, StepRecord

FREE, CACHED = -1, -2  # occupancy cells that belong to no request: free, free but still cached


@dataclass(slots=True)
class SimResult:
    requests: list[SimRequest]
    steps: list[StepRecord]
    policy: KVCachePolicy
    num_preemptions: int
    causes: dict[str, int] = field(default_factory=dict)  # prompt tokens by hit/miss cause
    tables_at: dict[int, dict[str, list[int]]] = field(default_factory=dict)  # step -> request -> blocks
    occupancy: list[list[int]] | None = None  # step -> block -> request index, FREE or CACHED
    shared: list[list[int]] | None = None  # step -> blocks referenced by more than one request
    occupancy_cut: bool = False  # recording stopped at `max_cells` cells: the first steps only
    prefix_requests: int = 0  # SGLang's parallel-sampling prefix requests among `requests` (parallel.py)
    preempted_queries: int = 0  # tokens looked up again by preempted requests (vLLM's preempted_queries)
    preempted_hits: int = 0  # and their hits: recomputation served by the cache (vllm#25780)
    events: list[tuple[int, list]] | None = None  # (step, that step's KV events), steps with events only (record_events)
    history: object = None  # history.TableHistory when asked for (simulate --html)
    group_blocks: list[list[int]] | None = None  # hybrid models: step -> real blocks each KV cache group holds

    def __repr__(self) -> str:
        from ..views.notebook import sim_result_text

        return sim_result_text(self)

    def _repr_html_(self) -> str:  # the summary and a chart of the blocks in use, in a notebook
        from ..views.notebook import sim_result_html

        return sim_result_html(self)


def occupancy_row(policy: KVCachePolicy, index: dict[str, int]) -> tuple[list[int], list[int]]:
    pool = policy.pool
    row = [FREE] * pool.num_blocks
    for b in range(1, pool.num_blocks):
        if pool.ref_cnt[b] == 0 and pool.block_hash[b] is not None:
            row[b] = CACHED
    for rid, blocks in policy.req_to_blocks.items():
        k = index[rid]
        for b in blocks:
            if row[b] < 0:
                row[b] = k
    shared = [b for b in range(1, pool.num_blocks) if pool.ref_cnt[b] > 1]
    return row, shared


MAX_STEPS = 10_000_000  # a bound on the step count, so a run always ends
POLICIES = {"vllm": VllmPrefixCaching, "sglang": SglangRadixCache}  # --policy: the cache; the scheduler is vLLM's


def simulate(
    requests: Iterable[SimRequest],
    num_blocks: int,
    block_size: int,
    config: SchedulerConfig | None = None,
    enable_caching: bool = True,
    tables_at: Iterable[int] = (),
    record_occupancy: bool = False,
    max_steps: int = MAX_STEPS,
    max_model_len: int = 1 << 30,
    max_cells: int = 4_000_000,
    on_step: Callable[[StepRecord], None] | None = None,
    policy: str = "vllm",
    record_events: bool = False,
    record_history: bool = False,
    keep_steps: int = 1000,
    groups: list | None = None,
    retention: int | None = 0,
) -> SimResult:
    """Feed requests in as they arrive; step until every request has finished.

    Python's cyclic garbage collector is paused for the run: the simulator makes no cycles,
    and on 100,000 requests the collector's passes over every live request cost a fifth of
    the time (bench/README.md). `policy` names the cache (`POLICIES`): vLLM's block manager
    or SGLang's radix tree, under the same (vLLM's) scheduler. `groups` (sim/hybrid.py
    `kv_cache_groups`) makes a hybrid model's KV cache groups share the pool (vLLM's policy
    only; `retention`: vLLM's prefix_cache_retention_interval, 0 by default there).
    """
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        return _simulate(requests, num_blocks, block_size, config, enable_caching, tables_at, record_occupancy,
                         max_steps, max_model_len, max_cells, on_step, policy, record_history, keep_steps, record_events,
                         groups, retention)
    finally:
        if paused:
            gc.enable()


def _simulate(requests, num_blocks, block_size, config, enable_caching, tables_at, record_occupancy,
              max_steps, max_model_len, max_cells, on_step, policy_name="vllm", record_history=False, keep_steps=1000,
              record_events=False, groups=None, retention=0) -> SimResult:
    pending = sorted(requests, key=lambda r: r.arrival)
    usable = num_blocks - 1
    config = config or SchedulerConfig()
    if groups:
        from .hybrid import HybridVllmPrefixCaching

        if policy_name != "vllm":
            raise ValueError(f"the {policy_name} cache has no KV cache groups; hybrid models run with the vllm policy")
        hybrid = HybridVllmPrefixCaching(groups, num_blocks, block_size, enable_caching, max_model_len,
                                         config.max_num_batched_tokens, retention)
    for r in pending:  # the last output token is sampled, never stored
        need = -(-(len(r.prompt) + len(r.output) - 1) // block_size)
        if groups:  # every group holds its blocks; a sliding one at most its admission cap
            need = sum(need if cap is None else min(need, cap) for cap in hybrid.caps)
        if need > usable:
            raise ValueError(
                f"request {r.request_id} needs {need} blocks of {block_size} tokens at its longest, "
                f"more than the {plural(usable, 'usable block')} of the pool"
            )
        if len(r.prompt) + len(r.output) - 1 > max_model_len:  # it would wait for a slot it can never get
            raise ValueError(
                f"request {r.request_id} stores {len(r.prompt) + len(r.output) - 1} tokens at its longest, "
                f"more than max_model_len={max_model_len}"
            )
    if policy_name not in POLICIES:
        raise ValueError(f"unknown cache policy {policy_name!r}: one of {', '.join(POLICIES)}")
    policy = hybrid if groups else POLICIES[policy_name](num_blocks, block_size, enable_caching, max_model_len)
    sched = Scheduler(policy, config)
    log = None
    if record_events:
        if not hasattr(policy, "record_events"):
            raise ValueError(f"the {policy_name} cache publishes no vLLM KV events")
        log = policy.record_events()
        # vLLM publishes one step's events request by request; cruising batches a step's
        # allocations and fills, which keeps the pool exact but not the events' order within the step
        sched.cruise = False
    held: dict[str, list[SimRequest]] = {}  # a prefix request's samples, sent once it finishes
    everyone = pending
    if policy_name == "sglang" and any(r.group is not None for r in pending):
        pending, held = split_parallel_groups(pending)
        everyone = [x for r in pending for x in (r, *held.get(r.request_id, ()))]
    index = {r.request_id: i for i, r in enumerate(everyone)}
    want_tables = set(tables_at)
    result = SimResult(everyone, [], policy, 0, occupancy=[] if record_occupancy else None, shared=[] if record_occupancy else None,
                       prefix_requests=len(held), events=[] if record_events else None, group_blocks=[] if groups else None)
    if record_history:
        from .history import TableHistory

        result.history = TableHistory(index, keep=keep_steps)
    nxt = 0
    while nxt < len(pending) or sched.waiting or sched.running:
        step = sched.step_count
        if step >= max_steps:
            raise RuntimeFailure(f"the simulation did not finish within {max_steps:,} steps")
        while nxt < len(pending) and pending[nxt].arrival <= step:
            sched.add(pending[nxt])
            nxt += 1
        if not sched.waiting and not sched.running:  # idle until the next arrival
            sched.step_count = pending[nxt].arrival
            continue
        record = sched.step()
        result.steps.append(record)
        if log:
            result.events.append((step, list(log)))
            log.clear()
        if held:
            for rid in record.finished:
                for sample in held.pop(rid, ()):
                    sched.add(sample)
        if step in want_tables:
            result.tables_at[step] = {rid: list(b) for rid, b in policy.req_to_blocks.items()}
        if record_history:
            result.history.record(policy)
        if groups:
            result.group_blocks.append(policy.held_by_group())
        if record_occupancy and (len(result.occupancy) + 1) * num_blocks > max_cells:
            record_occupancy, result.occupancy_cut = False, True
        if record_occupancy:
            row, shared = occupancy_row(policy, index)
            result.occupancy.append(row)
            result.shared.append(shared)
        if on_step is not None:
            on_step(record)
        if not record.scheduled and not sched.running and sched.waiting:
            head = sched.waiting[0]
            if not config.enable_chunked_prefill and head.num_tokens > config.max_num_batched_tokens:
                # (the CLI refuses such a budget up front, as vLLM does: simulate.py)
                raise ValueError(
                    f"request {head.request_id} needs {head.num_tokens} tokens in one step with chunked prefill off, "
                    f"more than max_num_batched_tokens={config.max_num_batched_tokens}"
                )
            raise ValueError(
                f"request {head.request_id} needs {head.num_tokens} tokens of KV cache, more than the "
                f"{plural(num_blocks - 1, 'usable block')} of {block_size} tokens hold"
            )
    if record_history:
        result.history.close(policy)  # the last step counted too, so the page's slider reaches it
    result.num_preemptions = sched.num_preemptions
    result.preempted_queries, result.preempted_hits = sched.preempted_queries, sched.preempted_hits
    result.causes = dict(sched.causes)
    return result
