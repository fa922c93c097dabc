"""A fleet's workload from traces: one trace sent through a router, or one per instance.

Several traces are one workload: their requests keep their arrival steps, and each request
id is prefixed with its trace's index (`0:r3`) so ids from different recordings never meet.
With one trace per instance (each recorded by one server behind a real router), the trace a
request came from is the instance the real router chose: the `as-recorded` assignment.

A request's session is the `session` field of its trace line, when the trace has one (the
session router needs it); the trace reader (workload.py) reads the rest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .request import SimRequest
from .workload import read_trace


@dataclass(slots=True)
class FleetWorkload:
    requests: list[SimRequest]  # sorted by arrival (stable: per trace, then the trace's order)
    sessions: dict[str, str]  # request id -> session id, where the traces give one
    assignment: dict[str, int]  # request id -> the trace (instance) it came from
    traces: list  # workload.Trace per file


def _sessions_of(text: str) -> dict[str, str]:
    """Line id -> its `session` (as read_trace numbers lines without an id)."""
    out: dict[str, str] = {}
    k = 0
    for raw in text.splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue  # read_trace has refused such a line already
        if not isinstance(obj, dict) or "format" in obj:
            continue
        s = obj.get("session")
        if s is not None:
            out[str(obj.get("id", k))] = str(s)
        k += 1
    return out


def cap_outputs(requests: list[SimRequest], max_tokens: int) -> None:
    """Every request generates at most `max_tokens` tokens (a client's max_tokens; Mooncake's
    §5.3.2 set-up restricts outputs to 1 to look at prefill alone)."""
    for r in requests:
        if r.max_tokens > max_tokens:
            r.output = r.output[:max_tokens]
            r.max_tokens = max_tokens


def read_fleet_traces(texts: list[str], block_size: int, names: list[str], step_ms: float | None = None) -> FleetWorkload:
    """Each text is simulate's trace format or Mooncake's (told apart by its first line,
    mooncake.py); a Mooncake trace's arrivals are `floor(timestamp / step_ms)`."""
    from .mooncake import DEFAULT_STEP_MS, is_mooncake, parse_mooncake

    many = len(texts) > 1
    requests: list[SimRequest] = []
    sessions: dict[str, str] = {}
    assignment: dict[str, int] = {}
    traces = []
    for k, (text, name) in enumerate(zip(texts, names)):
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        if is_mooncake(first):
            trace = parse_mooncake(text, block_size, DEFAULT_STEP_MS if step_ms is None else step_ms, name)
            line_sessions = {}
        else:
            trace = read_trace(text, block_size, name)
            line_sessions = _sessions_of(text)
        traces.append(trace)
        if many:  # the trace's own per-request maps follow its ids (compare.py reads them by request id)
            for attr in ("given_hashes", "lora", "priority"):
                setattr(trace, attr, {f"{k}:{rid}": v for rid, v in getattr(trace, attr).items()})
        for r in trace.requests:
            own = line_sessions.get(r.request_id) or (line_sessions.get(r.group) if r.group is not None else None)
            if many:
                r.request_id = f"{k}:{r.request_id}"
                if r.group is not None:
                    r.group = f"{k}:{r.group}"
            if own is not None:
                sessions[r.request_id] = f"{k}:{own}" if many else own
            assignment[r.request_id] = k
            requests.append(r)
    requests.sort(key=lambda r: r.arrival)
    return FleetWorkload(requests, sessions, assignment, traces)
