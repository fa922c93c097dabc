"""Where KV memory goes: vLLM's paged pool against Orca-style contiguous reservation.

The split of Kwon et al. (SOSP 2023, Figure 2), measured after every step and summed
over the run (slot-steps), as shares of the memory the system has handed to requests:

- token states: slots holding a token's K/V;
- reservation: slots reserved for tokens the request will produce later;
- internal fragmentation: slots reserved that the request will never use;
- external fragmentation: free slots that the next waiting request cannot use because
  no single contiguous hole is large enough, although in total there is room.

Contiguous baselines (Orca) reserve, at admission, one contiguous range of slots (first
fit in a pool of the same number of slots as the paged pool) of size:
Max = the model's maximum length; Pow2 = the final length rounded up to a power of two
(at most the maximum length);
Oracle = exactly the final length. The final length is prompt + output - 1 stored tokens
(the last sampled token is never written). Each step a running request stores its prompt
(first step) or one token; it frees its range when it finishes.

The paged pool (vLLM) reserves nothing ahead and has no external fragmentation: any free
block serves any request. Its only waste is the empty tail of each request's last block.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass

from .request import SimRequest
from .scheduler import StepRecord

CATEGORIES = ("token states", "reservation", "internal fragmentation", "external fragmentation")


@dataclass(slots=True)
class Waste:
    system: str
    token_states: int = 0
    reservation: int = 0
    internal: int = 0
    external: int = 0
    steps: int = 0
    peak_running: int = 0

    @property
    def total(self) -> int:
        return self.token_states + self.reservation + self.internal + self.external

    def shares(self) -> dict[str, float]:
        total = self.total or 1
        values = (self.token_states, self.reservation, self.internal, self.external)
        return {name: v / total for name, v in zip(CATEGORIES, values)}

    def to_json(self) -> dict:
        return {
            "system": self.system,
            "slot_steps": dict(zip(CATEGORIES, (self.token_states, self.reservation, self.internal, self.external))),
            "shares": self.shares(),
            "steps": self.steps,
            "peak_running": self.peak_running,
        }


def paged_waste(steps: list[StepRecord], block_size: int, system: str = "vLLM (paged)") -> Waste:
    w = Waste(system)
    for s in steps:
        w.token_states += s.used_blocks * block_size - s.empty_slots
        w.internal += s.empty_slots
        w.peak_running = max(w.peak_running, s.running)
    w.steps = len(steps)
    return w


class FirstFit:
    """A contiguous pool of `capacity` slots: holes kept sorted by start, merged on free."""

    def __init__(self, capacity: int) -> None:
        self.starts = [0]
        self.sizes = [capacity]

    def allocate(self, size: int) -> int | None:
        for i, hole in enumerate(self.sizes):
            if hole >= size:
                start = self.starts[i]
                if hole == size:
                    del self.starts[i], self.sizes[i]
                else:
                    self.starts[i] += size
                    self.sizes[i] -= size
                return start
        return None

    def free(self, start: int, size: int) -> None:
        i = bisect.bisect(self.starts, start)
        if i and self.starts[i - 1] + self.sizes[i - 1] == start:  # merge with the hole before
            i -= 1
            self.sizes[i] += size
        else:
            self.starts.insert(i, start)
            self.sizes.insert(i, size)
        if i + 1 < len(self.starts) and self.starts[i] + self.sizes[i] == self.starts[i + 1]:
            self.sizes[i] += self.sizes.pop(i + 1)
            del self.starts[i + 1]

    @property
    def free_slots(self) -> int:
        return sum(self.sizes)


def reservation_size(mode: str, final_len: int, max_model_len: int) -> int:
    if mode == "max":
        return max_model_len
    if mode == "pow2":  # never more than the longest request can use
        return min(1 << (final_len - 1).bit_length(), max_model_len)
    return final_len


def contiguous_waste(
    requests: list[SimRequest], capacity: int, mode: str, max_model_len: int, max_num_seqs: int = 256
) -> Waste:
    """Orca-style serving of the same requests (arrival steps, lengths) with `mode` reservations."""
    name = {"max": "Orca (Max)", "pow2": "Orca (Pow2)", "oracle": "Orca (Oracle)"}[mode]
    w = Waste(name)
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    waiting: deque = deque()
    running: list[list[int]] = []  # [start, reserved, stored, final]
    pool = FirstFit(capacity)
    step = 0
    while pending or waiting or running:
        while pending and pending[0].arrival <= step:
            r = pending.popleft()
            final = len(r.prompt) + len(r.output) - 1
            size = reservation_size(mode, final, max_model_len)
            if size > capacity or final > max_model_len:
                raise ValueError(f"request {r.request_id} needs {size} contiguous slots; the pool has {capacity}")
            waiting.append((len(r.prompt), final, size))
        blocked = False
        while waiting and len(running) < max_num_seqs:
            prompt, final, size = waiting[0]
            start = pool.allocate(size)
            if start is None:
                blocked, blocked_free = True, pool.free_slots
                break
            waiting.popleft()
            running.append([start, size, 0, final, prompt])
        if not running and not waiting:  # idle until the next arrival
            step = pending[0].arrival
            continue
        if running and all(req[2] for req in running):  # every request decoding: leap to the next change
            leap = min(req[3] - req[2] for req in running) - 1  # steps before the first finish
            if pending:
                leap = min(leap, pending[0].arrival - step)  # and before the next arrival
            if leap > 1:  # nothing changes for `leap` steps (no admission, arrival or finish): sum them at once
                tri = leap * (leap + 1) // 2
                for req in running:
                    start, size, stored, final, _ = req
                    w.token_states += leap * stored + tri
                    w.reservation += leap * (final - stored) - tri
                    w.internal += leap * (size - final)
                    req[2] = stored + leap
                if blocked and blocked_free >= waiting[0][2]:
                    w.external += leap * blocked_free
                w.peak_running = max(w.peak_running, len(running))
                step += leap
                w.steps += leap
                continue
        for req in running:  # prompt in one step, then one token per step
            req[2] = req[4] if req[2] == 0 else req[2] + 1
        for req in [req for req in running if req[2] >= req[3]]:
            running.remove(req)
            pool.free(req[0], req[1])
        # measured after the step's frees, as the paged pool's StepRecord is
        for start, size, stored, final, _ in running:
            w.token_states += stored
            w.reservation += final - stored
            w.internal += size - final
        if blocked and blocked_free >= waiting[0][2]:
            w.external += blocked_free
        w.peak_running = max(w.peak_running, len(running))
        step += 1
        w.steps += 1
    return w
