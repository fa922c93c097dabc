"""The routers of a fleet (fleet.py): which instance a request is sent to when it arrives.

Each router is a class with `name`, `needs` (what the workload must carry) and
`choose(req, instances) -> index`; it sees the instances as they stand at the request's
arrival step, after the earlier arrivals of that step were sent. Ties go to the lowest index.

- `round-robin`: 0, 1, ..., N-1, 0, ... in arrival order.
- `least-loaded`: the fewest requests running plus waiting.
- `prefix-aware`: the lowest cost in the manner of NVIDIA Dynamo's KV router
  (docs.nvidia.com/dynamo, "Routing Concepts": `cost = overlap_score_weight * prefill_blocks
  + decode_blocks`, the lowest cost wins, temperature 0 deterministic): `prefill_blocks` is
  the request's prompt tokens not in that instance's cache, in blocks; `decode_blocks` the
  blocks held by the instance's running requests plus its waiting requests' blocks plus the
  request's own ("potential active blocks"). llm-d's scheduler scores the same two things
  (a prefix-cache scorer and a queue or KV-utilisation scorer, weighted and summed, the
  highest score picked); the weight here plays the part of their ratio. The overlap is read
  from each instance's pool, what Dynamo's indexer learns from KV events; a huge weight is
  "the longest cached prefix, ties to the least loaded" (Mooncake's §5.3.2 set-up).
- `session`: every request of a session to one instance; a session's first request to the
  least-loaded instance (llm-d's session-affinity scorer keeps a session where it went).
- `as-recorded`: the instance a real router chose, read from which instance's trace the
  request came from.
"""

from __future__ import annotations

from ..paging.blocks import cdiv


class RoundRobin:
    name, needs = "round-robin", None

    def __init__(self) -> None:
        self.next = 0

    def choose(self, req, instances) -> int:
        i = self.next
        self.next = (i + 1) % len(instances)
        return i


def load(inst) -> int:
    """Requests running plus waiting on an instance."""
    return len(inst.sched.running) + len(inst.sched.waiting)


class LeastLoaded:
    name, needs = "least-loaded", None

    def choose(self, req, instances) -> int:
        best, best_load = 0, None
        for i, inst in enumerate(instances):
            n = len(inst.sched.running) + len(inst.sched.waiting)
            if best_load is None or n < best_load:
                best, best_load = i, n
                if n == 0:
                    break
        return best


def cached_prefix(inst, req) -> int:
    """Full blocks of `req`'s prompt cached in `inst`'s pool from the start (vLLM's lookup,
    without its last-token cap: a router asks how much is there, not how much will be reused)."""
    policy = inst.policy
    if not policy.enable_caching:
        return 0
    bs = policy.block_size
    req.update_hashes(bs)
    cached = policy.pool.cached
    n = 0
    for h in req.block_hashes[: req.prompt_len // bs]:
        if h not in cached:
            break
        n += 1
    return n


def active_blocks(inst) -> int:
    """Blocks the instance's running requests hold, plus the blocks its waiting requests will need."""
    pool, bs = inst.policy.pool, inst.policy.block_size
    held = pool.num_blocks - 1 - pool.num_free  # referenced blocks (a free cached block is in the free queue)
    return held + sum(cdiv(r.num_tokens, bs) for r in inst.sched.waiting)


class PrefixAware:
    name, needs = "prefix-aware", None

    def __init__(self, overlap_weight: float = 1.0) -> None:
        self.overlap_weight = overlap_weight

    def choose(self, req, instances) -> int:
        bs = instances[0].policy.block_size
        own = cdiv(req.prompt_len, bs)
        w = self.overlap_weight
        best, best_cost = 0, None
        for i, inst in enumerate(instances):
            overlap = cached_prefix(inst, req)
            prefill = (req.prompt_len - overlap * bs) / bs
            cost = w * prefill + active_blocks(inst) + own
            if best_cost is None or cost < best_cost:
                best, best_cost = i, cost
        return best


class Session:
    name, needs = "session", "session"

    def __init__(self, sessions: dict[str, str]) -> None:
        self.sessions = sessions  # request id -> session id
        self.home: dict[str, int] = {}
        self.fallback = LeastLoaded()

    def choose(self, req, instances) -> int:
        s = self.sessions[req.request_id]
        i = self.home.get(s)
        if i is None:
            i = self.home[s] = self.fallback.choose(req, instances)
        return i


class AsRecorded:
    name, needs = "as-recorded", "assignment"

    def __init__(self, assignment: dict[str, int]) -> None:
        self.assignment = assignment  # request id -> instance index

    def choose(self, req, instances) -> int:
        return self.assignment[req.request_id]


ROUTERS = ("round-robin", "least-loaded", "prefix-aware", "session", "as-recorded")


def make_router(name: str, overlap_weight: float = 1.0, sessions: dict[str, str] | None = None,
                assignment: dict[str, int] | None = None):
    """The router called `name`; ValueError when the workload lacks what it needs."""
    if name == "round-robin":
        return RoundRobin()
    if name == "least-loaded":
        return LeastLoaded()
    if name == "prefix-aware":
        return PrefixAware(overlap_weight)
    if name == "session":
        if not sessions:
            raise ValueError("routes by session: the workload gives no session id (a trace's 'session' field, or the synthetic conversations)")
        return Session(sessions)
    if name == "as-recorded":
        if assignment is None:
            raise ValueError("routes as a real router did: give one --trace per instance, each recorded by that instance")
        return AsRecorded(assignment)
    raise ValueError(f"unknown router {name!r}: one of {', '.join(ROUTERS)}")
