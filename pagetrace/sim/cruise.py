"""Cruising: how the scheduler skips the decode steps that change nothing (speed, not vLLM's logic).

When every running request is decoding and the budget covers them all, a request's step
changes the pool only when its token starts a new block (one block off the free queue's
head), fills a block (which gets cached), or is its last (the request finishes and frees its
blocks). Each of these falls on a step known in advance: a new block every `block_size`
steps, a full block every `block_size` steps, the last token `max_tokens` after the first.
So a cruising request is filed in three calendars (step -> requests, in running order), and
each calendar step does its requests' pool work in one batch; the request's counters advance
with the step number (`synced`) and are brought up to date when it finishes or cruising stops.

A batch has the same effect as vLLM's request-by-request order (the same blocks, the same
order of cache entries) unless a request would be preempted (fewer free blocks than new ones)
or a filled block's hash is already cached (then the order of the cache's entries depends on
how evictions and fills interleave). Then `run` does nothing and the scheduler runs that step
explicitly. The whole observable behaviour (steps, tables, requests, pool) is pinned by
digests taken before cruising existed (tests/sim/test_sim_digest.py), with cruising on and off.

Lists stay in running order without sorting: a request files its first new block and first
fill within `block_size` steps of joining, and each later one `block_size` steps ahead, before
that step's admissions; so everything filed for a step comes in admission order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import SimRequest


def sync(req: SimRequest, step: int) -> None:
    """Bring a cruising request's counters to the start of `step`."""
    d = step - req.synced
    req.num_computed += d
    req.num_generated += d
    req.synced = step


def _add(calendar: dict[int, list[SimRequest]], step: int, reqs: list[SimRequest]) -> None:
    filed = calendar.get(step)
    if filed is None:
        calendar[step] = reqs
    else:
        filed.extend(reqs)


@dataclass(slots=True)
class Calendar:
    """When each cruising request takes a new block, fills a block, and samples its last token.

    A policy with `decode_blocks(reqs)` (one new block each, off the queue's head, in order),
    `decode_hashes(reqs)` (the hash of the block each one fills, or None when one is already
    cached) and `decode_cache(reqs, hashes)` does the batches. Any other policy (SGLang's
    radix cache caches nothing while a request decodes) gets `allocate_slots(req, 1)` from
    each request that takes a block, in order, and no fills.
    """

    policy: object
    new_block: dict[int, list[SimRequest]] = field(default_factory=dict)
    fill: dict[int, list[SimRequest]] = field(default_factory=dict)
    last: dict[int, list[SimRequest]] = field(default_factory=dict)
    batched: bool = False

    def __post_init__(self) -> None:
        self.batched = hasattr(self.policy, "decode_blocks")

    def fits(self, req: SimRequest) -> bool:
        """Every decode step of this request is the plain one-token `allocate_slots`: it never
        reaches `max_model_len` (where allocation and caching are capped)."""
        return req.prompt_len + req.max_tokens - 1 <= self.policy.max_model_len

    def file(self, req: SimRequest, step: int) -> None:
        """File a decoding request whose counters hold at the start of `step`."""
        policy = self.policy
        bs = policy.block_size
        c = req.num_computed
        last = req.last_step = step + req.max_tokens - req.num_generated - 1
        when = [(self.last, last), (self.new_block, step + len(policy.block_ids(req.request_id)) * bs - c)]
        if self.batched and policy.enable_caching:
            when.append((self.fill, step + (bs - (c + 1) % bs) % bs))  # the step its token fills a block
        for calendar, t in when:
            if t <= last:
                filed = calendar.get(t)
                if filed is None:
                    calendar[t] = [req]
                else:
                    filed.append(req)

    def clear(self) -> None:
        self.new_block.clear()
        self.fill.clear()
        self.last.clear()

    def run(self, step: int) -> tuple[int, list[SimRequest]] | None:
        """The pool's side of a cruising step: (blocks allocated, requests sampling their last
        token, in running order); None, with nothing done, when the step must run explicitly."""
        policy = self.policy
        takers = self.new_block.get(step)
        if takers and len(takers) > policy.pool.num_free:  # someone would be preempted
            return None
        fillers = self.fill.get(step)
        hashes = None
        if fillers:
            hashes = policy.decode_hashes(fillers)
            if hashes is None:
                return None
        bs = policy.block_size
        after = step + bs
        if takers:
            del self.new_block[step]
            if self.batched:
                policy.decode_blocks(takers)
            else:
                for req in takers:
                    sync(req, step)
                    policy.allocate_slots(req, 1)
            more = [r for r in takers if r.last_step >= after]
            if more:
                _add(self.new_block, after, more)
        if fillers:
            del self.fill[step]
            policy.decode_cache(fillers, hashes)
            more = [r for r in fillers if r.last_step >= after]
            if more:
                _add(self.fill, after, more)
        return (len(takers) if takers else 0), self.last.pop(step, [])
