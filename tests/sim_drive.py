"""Step a bare `Scheduler` through requests as they arrive: `simulate`'s loop without its
checks or recording, for tests that hold the scheduler and policy themselves."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from pagetrace.sim.request import SimRequest
from pagetrace.sim.scheduler import Scheduler, StepRecord


def drive(sched: Scheduler, requests: Iterable[SimRequest], max_steps: int) -> Iterator[StepRecord]:
    """Each step's record, until every request has finished (asserting within `max_steps`)."""
    pending = sorted(requests, key=lambda r: r.arrival)
    nxt = 0
    while nxt < len(pending) or sched.waiting or sched.running:
        while nxt < len(pending) and pending[nxt].arrival <= sched.step_count:
            sched.add(pending[nxt])
            nxt += 1
        yield sched.step()
        assert sched.step_count < max_steps
