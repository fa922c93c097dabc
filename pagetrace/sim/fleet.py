"""A fleet: N instances behind a router, fed by one workload, on one clock.

Each instance is today's simulator for one server: vLLM's scheduler (scheduler.py) over its
own pool and cache policy (vLLM's block manager or SGLang's radix tree). The fleet steps
them in lockstep: at step t the requests arriving at t are sent, one by one in arrival order,
to the instance the router (router.py) picks, then every instance with work takes its step t,
in index order. An idle instance waits for its next request as `simulate` does (its step
count jumps to the arrival), so an instance's run is exactly `simulate` over the requests it
was sent: with local caches and the as-recorded router the fleet is N independent servers.

Caches (`cache`):
- `local`: each instance reads only its own pool.
- `store`: a shared store of `store_blocks` blocks that every instance reads. A block an
  instance's pool evicts is put there (least recently used out first); at admission, the
  blocks past the local prefix hit that the store holds count as computed, as vLLM counts a
  KV connector's external hits (`get_num_new_matched_tokens`: the request is allocated
  blocks for them, fills them without computing, and caches them locally).
- `pooled`: every instance reads every other instance's pool, as Mooncake's global cache
  pools the nodes' caches (FAST'25 §5.3.2: "can share caches across all nodes"); a block
  read from a peer is copied into the reader's pool as above.
A hit from the store or a peer is a "shared hit", counted apart from a local hit.

Per request, at its first admission, its prompt tokens are split by outcome: local hit,
shared hit, partial block, evicted, different extra key, first seen (causes.py; "evicted"
and "first seen" by what that instance cached before). With `explain`, each request also
keeps, from its routing, the instance holding the longest cached prefix when it was longer
than the chosen instance's: a miss there was the router's doing.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..errors import RuntimeFailure
from .causes import CAUSES
from .policy import VllmPrefixCaching
from .radix import SglangRadixCache
from .request import SimRequest
from .router import cached_prefix
from .scheduler import Scheduler, SchedulerConfig

MAX_INSTANCES = 1024  # a fleet's instances at most: each holds its own per-block lists
MAX_STEPS = 10_000_000
CACHES = ("local", "store", "pooled")
OUTCOMES = ("local hit", "shared hit", *[c for c in CAUSES if c != "hit"])  # a prompt token is exactly one


class SharedStore:
    """Block hashes in least-recently-used order, `capacity` blocks at most."""

    __slots__ = ("capacity", "blocks", "puts", "hits")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.puts = 0
        self.hits = 0

    def __contains__(self, h: int) -> bool:
        return h in self.blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def put(self, h: int) -> None:
        blocks = self.blocks
        if h in blocks:
            blocks.move_to_end(h)
            return
        blocks[h] = None
        self.puts += 1
        if len(blocks) > self.capacity:
            blocks.popitem(last=False)

    def read(self, hashes: list[int]) -> None:
        """A request read these: they become the most recently used."""
        blocks = self.blocks
        for h in hashes:
            if h in blocks:  # (a put of the same step may have pushed it out since)
                blocks.move_to_end(h)
        self.hits += len(hashes)


class SharedReadPolicy(VllmPrefixCaching):
    """vLLM's block manager whose lookup goes on past the local hit into a shared tier.

    `remote(h)` says whether the shared tier (the store, or a peer's pool) holds block hash
    h. The extra blocks are returned as hit tokens without hit blocks: `allocate_slots` then
    allocates them and caches them as computed, as it does a KV connector's external tokens
    (kv_cache_manager.py `allocate_slots(num_new_computed_tokens, num_external_computed_tokens)`)."""

    def __init__(self, *args, remote=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.remote = remote
        self.external: dict[str, list[int]] = {}  # request id -> hashes its last lookup read from the shared tier

    def lookup(self, req: SimRequest) -> tuple[list[int], int]:
        hits, num_hit = super().lookup(req)
        if not self.enable_caching:
            return hits, num_hit
        bs = self.block_size
        limit = (req.prompt_len + req.num_generated - 1) // bs
        hashes = req.block_hashes
        k = len(hits)
        remote = self.remote
        got = []
        while k < limit and remote(hashes[k]):
            got.append(hashes[k])
            k += 1
        self.external[req.request_id] = got
        return hits, num_hit + len(got) * bs


@dataclass(slots=True)
class Instance:
    index: int
    policy: object
    sched: Scheduler
    requests: int = 0  # routed to it
    prompt_tokens: int = 0
    outcomes: dict = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    busy_steps: int = 0
    load_sum: int = 0  # running + waiting, summed over the fleet's steps
    peak_load: int = 0
    peak_blocks: int = 0
    evicted_blocks: int = 0

    def load(self) -> int:
        return len(self.sched.running) + len(self.sched.waiting)

    def to_json(self, steps: int) -> dict:
        return {"instance": self.index, "requests": self.requests, "prompt_tokens": self.prompt_tokens,
                "outcomes": dict(self.outcomes), "hit_rate": hit_rate(self.outcomes, self.prompt_tokens),
                "local_hit_rate": _ratio(self.outcomes["local hit"], self.prompt_tokens),
                "shared_hit_rate": _ratio(self.outcomes["shared hit"], self.prompt_tokens),
                "preemptions": self.sched.num_preemptions, "busy_steps": self.busy_steps,
                "mean_load": round(self.load_sum / steps, 3) if steps else 0.0, "peak_load": self.peak_load,
                "peak_blocks": self.peak_blocks, "evicted_blocks": self.evicted_blocks}


def _ratio(a: int, b: int) -> float:
    return round(a / b, 6) if b else 0.0


def hit_rate(outcomes: dict, prompt_tokens: int) -> float:
    return _ratio(outcomes["local hit"] + outcomes["shared hit"], prompt_tokens)


@dataclass(slots=True)
class Missed:
    """A request sent away from the instance holding its longest cached prefix (explain)."""

    request_id: str
    instance: int  # where the router sent it
    cached_blocks: int  # its prefix cached there, at routing
    holder: int  # the instance holding the longest prefix
    holder_blocks: int
    missed_tokens: int = 0  # prompt tokens it then computed (not hit) that the holder had cached

    def to_json(self) -> dict:
        return {"request": self.request_id, "instance": self.instance, "cached_blocks": self.cached_blocks,
                "held_by": self.holder, "held_blocks": self.holder_blocks, "missed_tokens": self.missed_tokens}


@dataclass(slots=True)
class InstanceRun:
    """One instance's run in the shape `compare.compare` reads (a `SimResult`'s requests, events, policy)."""

    requests: list[SimRequest]
    events: list
    policy: object
    steps: list  # its StepRecords


@dataclass(slots=True)
class FleetResult:
    instances: list[Instance]
    steps: int  # the fleet's clock at the end
    requests: int
    assignment: list[int]  # request index (arrival order) -> instance
    request_ids: list[str]
    load_stride: int
    load: list[list[int]]  # per window of `load_stride` steps, per instance: the most running + waiting requests at a step's start
    missed: list[Missed]
    store: SharedStore | None
    cache: str
    events: list[list] | None = None  # per instance: its (step, that step's KV events), when recorded
    per_request: list[dict] | None = None  # per request (arrival order): instance and outcomes, when kept
    step_records: list[list] | None = None  # per instance: its StepRecords, when events are recorded

    def instance_run(self, k: int, requests: list[SimRequest]) -> InstanceRun:
        """Instance k's run for a comparison with that server's KV events (`requests`: the
        workload as given; those routed to k are taken)."""
        mine = {rid for rid, i in zip(self.request_ids, self.assignment) if i == k}
        return InstanceRun([r for r in requests if r.request_id in mine], self.events[k], self.instances[k].policy, self.step_records[k])

    def outcomes(self) -> dict:
        total = dict.fromkeys(OUTCOMES, 0)
        for inst in self.instances:
            for k, v in inst.outcomes.items():
                total[k] += v
        return total

    def prompt_tokens(self) -> int:
        return sum(i.prompt_tokens for i in self.instances)

    def imbalance(self) -> dict:
        """Max over mean across instances (1.0: even) of requests, of prefill work (prompt
        tokens not hit) and of the time-averaged load."""
        def ratio(values):
            mean = sum(values) / len(values)
            return round(max(values) / mean, 4) if mean else 1.0

        insts = self.instances
        work = [i.prompt_tokens - i.outcomes["local hit"] - i.outcomes["shared hit"] for i in insts]
        return {"requests": ratio([i.requests for i in insts]), "prefill_tokens": ratio(work),
                "mean_load": ratio([i.load_sum for i in insts])}

    def to_json(self) -> dict:
        out = self.outcomes()
        p = self.prompt_tokens()
        doc = {"requests": self.requests, "steps": self.steps, "prompt_tokens": p, "outcomes": out,
               "hit_rate": hit_rate(out, p), "local_hit_rate": _ratio(out["local hit"], p),
               "shared_hit_rate": _ratio(out["shared hit"], p),
               "preemptions": sum(i.sched.num_preemptions for i in self.instances),
               "imbalance": self.imbalance(), "instances": [i.to_json(self.steps) for i in self.instances],
               "load": {"stride": self.load_stride, "samples": self.load}}
        if self.store is not None:
            doc["store"] = {"capacity_blocks": self.store.capacity, "held_blocks": len(self.store),
                            "puts": self.store.puts, "hit_blocks": self.store.hits}
        return doc


def make_instances(n: int, num_blocks: int, block_size: int, config: SchedulerConfig, policy: str = "vllm",
                   enable_caching: bool = True, max_model_len: int = 1 << 30, cache: str = "local",
                   store: SharedStore | None = None) -> list[Instance]:
    insts: list[Instance] = []
    for i in range(n):
        if cache == "local":
            cls = VllmPrefixCaching if policy == "vllm" else SglangRadixCache
            pol = cls(num_blocks, block_size, enable_caching, max_model_len)
        else:
            if cache == "store":
                remote = store.__contains__
            else:
                def remote(h, me=i):
                    return any(h in other.policy.pool.cached for other in insts if other.index != me)
            pol = SharedReadPolicy(num_blocks, block_size, enable_caching, max_model_len, remote=remote)
            if cache == "store":
                pol.pool.event_log = []  # its evictions ("removed", hash, request), for the store
        insts.append(Instance(i, pol, Scheduler(pol, config)))
    return insts


def run_fleet(
    requests: Iterable[SimRequest],
    router,
    instances: int,
    num_blocks: int,
    block_size: int,
    config: SchedulerConfig | None = None,
    policy: str = "vllm",
    enable_caching: bool = True,
    max_model_len: int = 1 << 30,
    cache: str = "local",
    store_blocks: int = 0,
    explain: bool = False,
    load_stride: int = 1,
    max_steps: int = MAX_STEPS,
    record_events: bool = False,
    keep_requests: bool = False,
    release: bool = False,
) -> FleetResult:
    """Run the requests (sorted by arrival, ties in the given order) through the fleet.

    `record_events` keeps each instance's vLLM KV events as `simulate` does (the check
    against a real fleet); it runs every step explicitly (no cruising), as `simulate` does then.
    `release` drops a finished request's block hashes and causes (memory at a million requests).
    """
    if not 1 <= instances <= MAX_INSTANCES:
        raise ValueError(f"a fleet has 1 to {MAX_INSTANCES} instances, not {instances}")
    if cache not in CACHES:
        raise ValueError(f"unknown cache {cache!r}: one of {', '.join(CACHES)}")
    if cache != "local" and policy != "vllm":
        raise ValueError(f"a shared cache ({cache}) is modelled for the vllm policy only")
    store = None
    if cache == "store":
        if store_blocks < 1:
            raise ValueError("the shared store holds no block")
        store = SharedStore(store_blocks)
    paused = gc.isenabled()
    gc.disable()  # as simulate does: the simulator makes no cycles (run.py)
    try:
        insts = make_instances(instances, num_blocks, block_size, config or SchedulerConfig(), policy, enable_caching,
                               max_model_len, cache, store)
        return _run(sorted(requests, key=lambda r: r.arrival), router, insts, store, cache, explain, load_stride,
                    max_steps, record_events, keep_requests, release)
    finally:
        if paused:
            gc.enable()


def _run(pending, router, insts, store, cache, explain, load_stride, max_steps, record_events, keep_requests, release) -> FleetResult:
    n = len(insts)
    logs = None
    if record_events:
        logs = []
        for inst in insts:
            if not hasattr(inst.policy, "record_events"):
                raise ValueError("the sglang cache publishes no vLLM KV events")
            logs.append(inst.policy.record_events())
            if store is not None:  # the store reads the removals from the same log
                inst.policy.pool.event_log = logs[-1]
            inst.sched.cruise = False
    events = [[] for _ in insts] if record_events else None
    step_records = [[] for _ in insts] if record_events else None
    assignment: list[int] = []
    ids: list[str] = []
    order: dict[str, int] = {}
    inflight: dict[str, SimRequest] = {}
    missed_by_id: dict[str, Missed] = {}
    per_request: list[dict] | None = [] if keep_requests else None
    load: list[list[int]] = []
    busy: set[int] = set()
    shared = cache != "local"
    t = nxt = 0
    total = len(pending)
    while nxt < total or busy:
        if t >= max_steps:
            raise RuntimeFailure(f"the fleet did not finish within {max_steps:,} steps")
        while nxt < total and pending[nxt].arrival <= t:
            req = pending[nxt]
            nxt += 1
            i = router.choose(req, insts)
            inst = insts[i]
            if explain:
                here = cached_prefix(inst, req)
                best, best_blocks = i, here
                for other in insts:
                    b = cached_prefix(other, req)
                    if b > best_blocks:
                        best, best_blocks = other.index, b
                if best != i:
                    missed_by_id[req.request_id] = Missed(req.request_id, i, here, best, best_blocks)
            if i not in busy:
                inst.sched.step_count = t  # idle until now, as simulate's idle jump
                busy.add(i)
            inst.sched.add(req)
            inst.requests += 1
            inst.prompt_tokens += req.prompt_len
            if per_request is not None:
                order[req.request_id] = len(ids)
            ids.append(req.request_id)
            assignment.append(i)
            inflight[req.request_id] = req
            if per_request is not None:
                per_request.append({"id": req.request_id, "instance": i})
        if not busy:  # every instance idle until the next arrival
            t = pending[nxt].arrival
            continue
        w = t // load_stride
        while len(load) <= w:
            load.append([0] * n)
        window = load[w]
        for i in sorted(busy):
            inst = insts[i]
            sched = inst.sched
            n_load = len(sched.running) + len(sched.waiting)  # as sampled: at the start of the step
            inst.load_sum += n_load
            if n_load > inst.peak_load:
                inst.peak_load = n_load
            if n_load > window[i]:
                window[i] = n_load
            rec = sched.step()
            inst.busy_steps += 1
            if step_records is not None:
                step_records[i].append(rec)
            inst.evicted_blocks += rec.evicted
            if rec.used_blocks > inst.peak_blocks:
                inst.peak_blocks = rec.used_blocks
            for rid in rec.admitted:
                req = inflight[rid]
                if req.first_scheduled != t:
                    continue  # a preempted request admitted again
                got = inst.policy.external.pop(rid, ()) if shared else ()
                if got and store is not None:
                    store.read(got)
                why = req.why
                out = inst.outcomes
                ext = len(got) * inst.policy.block_size
                out["local hit"] += why["hit"] - ext
                out["shared hit"] += ext
                for c in CAUSES[1:]:
                    out[c] += why[c]
                m = missed_by_id.get(rid)
                if m is not None:
                    hit_blocks = (why["hit"]) // inst.policy.block_size
                    m.missed_tokens = max(0, min(m.holder_blocks, (req.prompt_len - 1) // inst.policy.block_size) - hit_blocks) * inst.policy.block_size
                if per_request is not None:
                    d = per_request[order[rid]]
                    d["local_hit"], d["shared_hit"] = why["hit"] - ext, ext
                    d.update({c: why[c] for c in CAUSES[1:]})
            if shared:
                for rid in rec.admitted:
                    inst.policy.external.pop(rid, None)
            if logs is not None:
                log = logs[i]
                if log:
                    if store is not None:
                        for e in log:
                            if e[0] == "removed":
                                store.put(e[1])
                    events[i].append((t, list(log)))
                    log.clear()
            elif store is not None:
                log = inst.policy.pool.event_log
                if log:
                    for e in log:
                        store.put(e[1])
                    log.clear()
            for rid in rec.finished:
                done = inflight.pop(rid)
                if release:  # its chain of hashes is the bulk of a finished request's memory
                    done.block_hashes = []
                    done.content_hashes = []
                    done.why = None
            if not rec.scheduled and not sched.running and sched.waiting:
                head = sched.waiting[0]
                raise ValueError(f"request {head.request_id} needs {head.num_tokens} tokens of KV cache, more than an "
                                 f"instance's pool holds")
            if not sched.waiting and not sched.running:
                busy.discard(i)
        t += 1
    while len(load) * load_stride < t:  # the windows up to the end
        load.append([0] * n)
    missed = [m for m in missed_by_id.values() if m.missed_tokens > 0]
    return FleetResult(insts, t, len(ids), assignment, ids, load_stride, load, missed, store, cache, events, per_request, step_records)
