"""Workloads for the simulator: synthetic (seeded) or a JSONL trace, expanded into requests.

A request with n > 1 parallel samples becomes n requests with the same prompt, as vLLM V1
fans a parallel-sampling request out into child requests (vllm/v1/engine/parallel_sampling.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from ..errors import UsageError
from .request import SimRequest

UNIQUE_STRIDE = 1 << 24  # token ids of one request's own text: [(i + 1) * UNIQUE_STRIDE, ...)
MAX_REQUESTS = 100_000  # requests after n-fold expansion: 100,000 take 9.4-13 s (bench/README.md); a typo of 10**9 is refused at once


class SyntheticTokens:
    """A shared system prompt followed by text of the request's own, without storing it.

    Token ids 1..shared are the system prompt, common to every request; each request's
    own tokens are a run of ids that no other request uses.
    """

    __slots__ = ("shared", "base", "length")

    def __init__(self, shared: int, base: int, length: int) -> None:
        self.shared, self.base, self.length = shared, base, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: slice) -> tuple[int, ...]:
        start, stop, _ = index.indices(self.length)
        s = self.shared
        head = tuple(range(1 + start, 1 + min(stop, s))) if start < s else ()
        tail = tuple(range(self.base + max(start, s) - s, self.base + stop - s)) if stop > s else ()
        return head + tail

    def run(self, start: int, stop: int) -> range | tuple[int, ...]:
        """The ids start..stop as a `range` when they lie in one part (consecutive ids), else a tuple."""
        s = self.shared
        if stop <= s:
            return range(1 + start, 1 + stop)
        if start >= s:
            return range(self.base + start - s, self.base + stop - s)
        return self[start:stop]


@dataclass(slots=True)
class SyntheticSpec:
    requests: int = 200
    prompt_len: tuple[int, int] = (64, 512)
    output_len: tuple[int, int] = (16, 256)
    shared_prefix: int = 0  # tokens of system prompt every request starts with
    n: int = 1  # parallel samples per request
    arrival_rate: float = 0.0  # requests per step (Poisson); 0 = all at step 0
    seed: int = 0


def synthetic(spec: SyntheticSpec) -> list[SimRequest]:
    """Requests with uniform prompt and output lengths, Poisson arrivals, a seed."""
    rng = random.Random(spec.seed)
    out: list[SimRequest] = []
    t = 0.0
    for i in range(spec.requests):
        if spec.arrival_rate > 0:
            t += rng.expovariate(spec.arrival_rate)
        own = rng.randint(*spec.prompt_len)
        output_len = rng.randint(*spec.output_len)
        base = (i + 1) * UNIQUE_STRIDE
        prompt = SyntheticTokens(spec.shared_prefix, base, spec.shared_prefix + own)
        for k in range(spec.n):
            start = base + UNIQUE_STRIDE // 2 + k * (UNIQUE_STRIDE // 64)
            rid = str(i) if spec.n == 1 else f"{i}.{k}"
            out.append(SimRequest(rid, prompt, range(start, start + output_len), arrival=int(t), group=None if spec.n == 1 else str(i)))
    return out


def _field(obj: dict, key: str, line: int, kind: type, default=None, minimum: int | None = None):
    value = obj.get(key, default)
    where = f"trace line {line}, field {key!r}"
    if value is None:
        if default is None and key in obj:
            raise UsageError("--trace", None, f"{where} is null")
        return default
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UsageError("--trace", value, f"{where} must be an integer")
    if kind is str and not isinstance(value, str):
        raise UsageError("--trace", value, f"{where} must be a string")
    if kind is list:
        if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
            raise UsageError("--trace", str(value)[:40], f"{where} must be a list of integer token ids")
    if minimum is not None and (len(value) if kind is list else value) < minimum:
        what = "length" if kind is list else "value"
        raise UsageError("--trace", value if kind is int else len(value), f"{where}: {what} must be at least {minimum}")
    return value


def parse_trace(text: str, block_size: int, source: str = "") -> list[SimRequest]:
    """`source` is the trace's file name, for the error of a trace with no request.
    One JSON object per line: `prompt` (token ids) or `prompt_len` (with an optional
    `shared_prefix`: that many leading tokens common to all requests), `output_len` (or
    `output`: token ids), `arrival` (step, default 0), `n` (default 1), `cache_salt`, `id`."""
    out: list[SimRequest] = []
    ids: set[str] = set()
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError as exc:  # not JSON, or a number past Python's 4,300 digits
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0]
            raise UsageError("--trace", raw[:40], f"trace line {line_no} is not JSON ({reason})") from None
        if not isinstance(obj, dict):
            raise UsageError("--trace", raw[:40], f"trace line {line_no} is not a JSON object")
        rid = str(obj.get("id", len(ids)))
        if rid in ids:
            raise UsageError("--trace", rid, f"trace line {line_no}, field 'id' repeats an earlier request id")
        ids.add(rid)
        base = (line_no + 1) * UNIQUE_STRIDE
        if "prompt" in obj:
            prompt = _field(obj, "prompt", line_no, list, minimum=1)
        else:
            plen = _field(obj, "prompt_len", line_no, int, minimum=1)
            if plen is None:
                raise UsageError("--trace", raw[:40], f"trace line {line_no} needs 'prompt' or 'prompt_len'")
            shared = _field(obj, "shared_prefix", line_no, int, 0, minimum=0)
            if shared > plen:
                raise UsageError("--trace", shared, f"trace line {line_no}, field 'shared_prefix' exceeds prompt_len {plen}")
            prompt = SyntheticTokens(shared, base, plen)
        if "output" in obj:
            output = _field(obj, "output", line_no, list, minimum=1)
        else:
            olen = _field(obj, "output_len", line_no, int, minimum=1)
            if olen is None:
                raise UsageError("--trace", raw[:40], f"trace line {line_no} needs 'output_len' or 'output'")
            output = None
        arrival = _field(obj, "arrival", line_no, int, 0, minimum=0)
        n = _field(obj, "n", line_no, int, 1, minimum=1)
        if len(out) + n > MAX_REQUESTS:
            raise UsageError("--trace", n, f"trace line {line_no}: the trace makes more than {MAX_REQUESTS:,} requests (n included), more than the simulator runs")
        salt = _field(obj, "cache_salt", line_no, str)
        if salt == "":  # vLLM's API rejects it (validate_cache_salt); SGLang would read it as no salt
            raise UsageError("--trace", salt, f"trace line {line_no}, field 'cache_salt' must be a non-empty string if given (vLLM rejects an empty salt)")
        for k in range(n):
            sample = output
            if sample is None:
                start = base + UNIQUE_STRIDE // 2 + k * (UNIQUE_STRIDE // 64)
                sample = range(start, start + olen)
            out.append(SimRequest(rid if n == 1 else f"{rid}.{k}", prompt, sample, arrival=arrival, cache_salt=salt,
                                  group=None if n == 1 else rid))
    if not out:
        what = "is empty" if not text else "holds only blank lines"
        raise UsageError("--trace", source, f"the file {what}: a trace has one JSON request per line")
    out.sort(key=lambda r: r.arrival)  # stable: file order within a step
    return out
