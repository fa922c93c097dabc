"""Workloads for the simulator: synthetic (seeded) or a JSONL trace, expanded into requests.

A request with n > 1 parallel samples becomes n requests with the same prompt, as vLLM V1
fans a parallel-sampling request out into child requests (vllm/v1/engine/parallel_sampling.py).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from ..errors import UsageError
from .request import SimRequest
from .trace import TraceHeader, header_from_json

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


@dataclass(slots=True)
class Trace:
    """A parsed trace: the requests (n expanded) and what a comparison with a server needs."""

    requests: list[SimRequest]
    header: TraceHeader | None  # None: a version-0 trace (no header line)
    given_hashes: dict[str, list[int]]  # request id -> vLLM's hashes of its full blocks (hashes-only traces)
    lora: dict[str, str]  # request id -> LoRA name, where one was used
    priority: dict[str, int]  # request id -> priority, where not 0 (read, not simulated)
    times: dict[str, float] = field(default_factory=dict)  # request id -> arrival, seconds since the trace began (where known)
    steps: dict[int, dict] = field(default_factory=dict)  # a server hook's step lines: step -> {"tokens", "time", ...} (trace.py)


def parse_trace(text: str, block_size: int, source: str = "") -> list[SimRequest]:
    """The requests of `read_trace`."""
    return read_trace(text, block_size, source).requests


def _surrogate(hashes: list[int], length: int, block_size: int, base: int) -> list[int]:
    """Token ids that stand for a private request: full block i is (hashes[i], -1, -1, ...),
    so two blocks are equal in the simulator exactly when vLLM's hashes of them (which cover
    the whole prefix) are; the rest are ids no other request has (negative, below -1)."""
    out = []
    for pos in range(length):
        b, j = divmod(pos, block_size)
        out.append((hashes[b] if j == 0 else -1) if b < len(hashes) else -(base + pos + 2))
    return out


def _hash_list(value, where: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in value):
        raise UsageError("--trace", str(value)[:40], f"{where} must be a list of non-negative integer block hashes")
    return value


LORA_KEY = "\x00lora:"  # between a LoRA request's salt and its adapter's name in its cache key


def lora_key(salt: str | None, name: str) -> str:
    """The cache key of a LoRA request: its salt (if any) and its adapter, in one string."""
    return f"{salt or ''}{LORA_KEY}{name}"


def salt_of_lora_key(key: str) -> str | None:
    """The salt `lora_key` was given."""
    return key.rpartition(LORA_KEY)[0] or None


STEP_FIELDS = ("tokens", "requests", "prefill_tokens", "decode_requests", "context_tokens")  # a step line's counts (trace.py)


def read_trace(text: str, block_size: int, source: str = "") -> Trace:
    """`source` is the trace's file name, for the error of a trace with no request.
    The first line may be a header (trace.py: format, version, block size, hashing); then one
    JSON object per line: `prompt` (token ids), `prompt_len` with `block_hashes` (a
    hashes-only trace) or with an optional `shared_prefix` (that many leading tokens common
    to all requests), `output_len` (or `output`: token ids; `outputs`: one list per sample),
    `max_tokens`, `output_lens` (one length per sample, without `outputs`), `arrival` (step,
    default 0), `time` (seconds), `n` (default 1), `cache_salt`, `lora_name`, `priority`, `id`."""
    out: list[SimRequest] = []
    order: dict[str, int] = {}  # within a step: `seq` (the order a server hook saw them in) or file order
    ids: set[str] = set()
    header: TraceHeader | None = None
    given: dict[str, list[int]] = {}
    lora: dict[str, str] = {}
    priority: dict[str, int] = {}
    steps: dict[int, dict] = {}
    first = True
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
        if first and "format" in obj:
            header = header_from_json(obj, line_no)
            first = False
            if header.hashes_only and header.block_size != block_size:
                raise UsageError("--block-size", block_size, f"the trace holds hashes of {header.block_size}-token blocks "
                                                             f"(hashes only, no token ids); simulate it with --block-size {header.block_size}")
            continue
        first = False
        if "format" in obj:
            raise UsageError("--trace", raw[:40], f"trace line {line_no}: a header line ('format') is allowed only as the first line")
        if "step" in obj:  # a server step (engines/vllm_trace.py): what its scheduler ran, not a request
            k = _field(obj, "step", line_no, int, minimum=0)
            for key in STEP_FIELDS:
                if key in obj:
                    _field(obj, key, line_no, int, minimum=0)
            t = obj.get("time")
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0):
                raise UsageError("--trace", t, f"trace line {line_no}, field 'time' must be a number of seconds >= 0")
            steps[k] = {key: obj[key] for key in (*STEP_FIELDS, "time") if key in obj}
            continue
        rid = str(obj.get("id", len(ids)))
        if rid in ids:
            raise UsageError("--trace", rid, f"trace line {line_no}, field 'id' repeats an earlier request id")
        ids.add(rid)
        base = (line_no + 1) * UNIQUE_STRIDE
        hashes_only = header is not None and header.hashes_only
        n = _field(obj, "n", line_no, int, 1, minimum=1)
        if len(out) + n > MAX_REQUESTS:
            raise UsageError("--trace", n, f"trace line {line_no}: the trace makes more than {MAX_REQUESTS:,} requests (n included), more than the simulator runs")
        hashes = None
        if hashes_only:
            if "prompt" in obj:
                raise UsageError("--trace", raw[:40], f"trace line {line_no} has 'prompt' token ids in a hashes-only trace")
            if "block_hashes" not in obj:
                raise UsageError("--trace", raw[:40], f"trace line {line_no} needs 'block_hashes' (the trace is hashes only)")
            value = obj["block_hashes"]
            per_sample = isinstance(value, list) and bool(value) and isinstance(value[0], list)
            hashes = [_hash_list(v, f"trace line {line_no}, field 'block_hashes'") for v in (value if per_sample else [value])]
            if per_sample and len(hashes) != n:
                raise UsageError("--trace", len(hashes), f"trace line {line_no}, field 'block_hashes' has {len(hashes)} lists for n={n} samples")
        elif "block_hashes" in obj:
            raise UsageError("--trace", raw[:40], f"trace line {line_no} has 'block_hashes' but the header does not say hashes_only")
        if "prompt" in obj:
            prompt = _field(obj, "prompt", line_no, list, minimum=1)
        else:
            plen = _field(obj, "prompt_len", line_no, int, minimum=1)
            if plen is None:
                raise UsageError("--trace", raw[:40], f"trace line {line_no} needs 'prompt' or 'prompt_len'")
            shared = _field(obj, "shared_prefix", line_no, int, 0, minimum=0)
            if shared > plen:
                raise UsageError("--trace", shared, f"trace line {line_no}, field 'shared_prefix' exceeds prompt_len {plen}")
            prompt = None if hashes_only else SyntheticTokens(shared, base, plen)
        outputs = None
        if "outputs" in obj:
            outputs = obj["outputs"]
            if not isinstance(outputs, list) or len(outputs) != n:
                raise UsageError("--trace", str(outputs)[:40], f"trace line {line_no}, field 'outputs' must hold one list of token ids per sample (n={n})")
            outputs = [_field({"outputs": o}, "outputs", line_no, list, minimum=1) for o in outputs]
        elif "output" in obj:
            outputs = [_field(obj, "output", line_no, list, minimum=1)] * n
        olen = _field(obj, "output_len", line_no, int, minimum=1)
        if olen is None:
            olen = _field(obj, "max_tokens", line_no, int, minimum=1)
        if olen is None and outputs is None:
            raise UsageError("--trace", raw[:40], f"trace line {line_no} needs 'output_len' or 'output'")
        olens = obj.get("output_lens")  # a private trace's samples of several lengths (trace.py TraceWriter.line)
        if olens is not None and (not isinstance(olens, list) or len(olens) != n
                                  or not all(type(x) is int and x >= 1 for x in olens)):
            raise UsageError("--trace", str(olens)[:40], f"trace line {line_no}, field 'output_lens' must hold one positive integer per sample (n={n})")
        arrival = _field(obj, "arrival", line_no, int, 0, minimum=0)
        seq = _field(obj, "seq", line_no, int, line_no, minimum=0)
        t = obj.get("time")
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0):
            raise UsageError("--trace", t, f"trace line {line_no}, field 'time' must be a number of seconds >= 0")
        salt = _field(obj, "cache_salt", line_no, str)
        if salt == "":  # vLLM's API rejects it (validate_cache_salt); SGLang would read it as no salt
            raise UsageError("--trace", salt, f"trace line {line_no}, field 'cache_salt' must be a non-empty string if given (vLLM rejects an empty salt)")
        name = _field(obj, "lora_name", line_no, str)
        prio = _field(obj, "priority", line_no, int, 0)
        key = salt
        if name:  # LoRA is an extra key of every block (kv_cache_utils.py _gen_lora_extra_hash_keys); as the
            # chain carries the first block's keys into every later hash, one key on block 0 is the same equality
            key = lora_key(salt, name)
        for k in range(n):
            sid = rid if n == 1 else f"{rid}.{k}"
            sample = outputs[k] if outputs is not None else None
            p = prompt
            if hashes_only:
                own = hashes[k if len(hashes) > 1 else 0]
                length = plen + (len(sample) if sample is not None else olens[k] if olens else olen)
                tokens = _surrogate(own, length, block_size, base + k * (UNIQUE_STRIDE // 64))
                p, sample = tokens[:plen], tokens[plen:]
                given[sid] = own
                key = None  # the salt is inside the hashes
            elif sample is None:
                start = base + UNIQUE_STRIDE // 2 + k * (UNIQUE_STRIDE // 64)
                sample = range(start, start + (olens[k] if olens else olen))
            if name:
                lora[sid] = name
            if prio:
                priority[sid] = prio
            out.append(SimRequest(sid, p, sample, arrival=arrival, cache_salt=key, group=None if n == 1 else rid))
            order[sid] = seq
    if not out:
        what = "is empty" if not text else ("holds only its header" if header is not None else "holds only blank lines")
        raise UsageError("--trace", source, f"the file {what}: a trace has one JSON request per line")
    out.sort(key=lambda r: (r.arrival, order[r.request_id]))  # stable: a request's samples stay in order
    return Trace(out, header, given, lora, priority, steps=steps)
