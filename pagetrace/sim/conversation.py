"""A synthetic multi-turn workload for a fleet: sessions whose turns resend their history.

Turn k of a session sends the system prompt (common to every session), then the session's
earlier turns (each user message followed by the reply generated for it), then its new user
message; its reply is `output_len` tokens of its own. So turn k + 1's prompt starts with
turn k's whole prompt and reply: a router that keeps a session on one instance finds them
cached there (the reply's full blocks too: vLLM caches decoded blocks).

Sessions start at Poisson arrivals (`session_rate` per step); a session's turns are
`turn_gap` steps apart (open loop: a turn is sent even if the previous reply is not done).
Token ids: 1..system are the system prompt; every user message and reply is a run of ids
of its own, so only what a session resends can hit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .request import SimRequest
from .workload import UNIQUE_STRIDE


class Segments:
    """Token ids as consecutive runs (ranges), without storing them; `run` gives a range
    when the slice lies in one run (request.py's fast hashing path)."""

    __slots__ = ("runs", "starts", "length")

    def __init__(self, runs: list[range]) -> None:
        self.runs = runs
        self.starts = []
        n = 0
        for r in runs:
            self.starts.append(n)
            n += len(r)
        self.length = n

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, int):
            index += self.length if index < 0 else 0
            return self.run(index, index + 1)[0]
        start, stop, _ = index.indices(self.length)
        return tuple(self.run(start, stop)) if stop > start else ()

    def __iter__(self):
        for r in self.runs:
            yield from r

    def run(self, start: int, stop: int):
        out: list[int] = []
        for r, s in zip(self.runs, self.starts):
            e = s + len(r)
            if e <= start or s >= stop:
                continue
            piece = r[max(start - s, 0) : min(stop, e) - s]
            if s <= start and stop <= e:
                return piece
            out.extend(piece)
        return tuple(out)


@dataclass(slots=True)
class ConversationSpec:
    sessions: int = 50
    turns: int = 4
    system_prompt: int = 256  # tokens every session starts with
    user_len: tuple[int, int] = (32, 256)  # tokens of each new user message (uniform, inclusive)
    output_len: tuple[int, int] = (16, 128)
    session_rate: float = 0.5  # sessions starting per step (Poisson); 0 = all at step 0
    turn_gap: int = 40  # steps between a session's turns
    seed: int = 0


def conversations(spec: ConversationSpec) -> tuple[list[SimRequest], dict[str, str]]:
    """The requests (sorted by arrival) and each request's session id."""
    rng = random.Random(spec.seed)
    out: list[SimRequest] = []
    sessions: dict[str, str] = {}
    system = [range(1, 1 + spec.system_prompt)] if spec.system_prompt else []
    t = 0.0
    for s in range(spec.sessions):
        if spec.session_rate > 0:
            t += rng.expovariate(spec.session_rate)
        history: list[range] = list(system)
        base = (s + 1) * UNIQUE_STRIDE
        for k in range(spec.turns):
            user = rng.randint(*spec.user_len)
            reply = rng.randint(*spec.output_len)
            offset = base + k * (UNIQUE_STRIDE // spec.turns if spec.turns else 0)
            msg = range(offset, offset + user)
            answer = range(offset + user, offset + user + reply)
            rid = f"s{s}.t{k}"
            prompt = Segments(history + [msg])
            out.append(SimRequest(rid, prompt, answer, arrival=int(t) + k * spec.turn_gap))
            sessions[rid] = f"s{s}"
            history = history + [msg, answer]
    out.sort(key=lambda r: r.arrival)
    return out, sessions
