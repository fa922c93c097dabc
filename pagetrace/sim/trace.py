"""The trace format: a recorded workload that `simulate --trace` reads (docs/simulate.md).

JSON Lines. The first line is the header,
`{"format": "pagetrace-trace", "version": 1, "block_size": 32, "hash": {"algo": "sha256", "seed": null}, ...}`
(a recorder inside the server adds `"server": {...}`, its scheduler's settings: `SERVER_INTS`, `SERVER_BOOLS`,
the hashing, vLLM's version, the model), then one request per line:
`{"id": "r0", "arrival": 0, "time": 0.0, "prompt": [token ids], "output_len": 16,
"output": [token ids], "n": 1, "cache_salt": null, "lora_name": null, "priority": 0}`.
A private trace (`hashes_only: true` in the header) has no token ids: `prompt_len` and
`block_hashes`, vLLM's own hashes of every full block of the prompt followed by the output
(vllm_hash.py), of the header's `block_size`. A file without a header is a version-0 trace
(the older hand-written form: `prompt` or `prompt_len` + `shared_prefix`, no `time`).

`TraceWriter` is what a recorder calls (record.py): one `add` per request, `write` at the end,
the file written whole or not at all. The hook inside `vllm serve` (engines/vllm_trace.py)
appends `line`s one by one as requests finish, each with `seq` (the order the engine received
them in; the reader orders a step's arrivals by it) and `client_id`, and one line per engine step,
`{"step": 4, "time": 0.52, "tokens": 2048, "requests": 3, "prefill_tokens": 2046, "decode_requests": 2,
"context_tokens": 812}`: what the server's scheduler ran (workload.py `STEP_FIELDS`), read into `Trace.steps`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .vllm_hash import block_hashes as vllm_block_hashes

FORMAT = "pagetrace-trace"
VERSION = 1  # the newest version this pagetrace reads and writes


@dataclass(slots=True)
class TraceHeader:
    version: int = VERSION
    block_size: int | None = None  # required by a hashes-only trace
    hashes_only: bool = False
    hash_algo: str = "sha256"  # the server's prefix_caching_hash_algo
    hash_seed: str | None = None  # the server's PYTHONHASHSEED (None: unset, vLLM's default seed)
    source: dict = field(default_factory=dict)  # free-form: who recorded it, from what server
    server: dict = field(default_factory=dict)  # the recording server's scheduler settings (SERVER_SETTINGS), where known

    def to_json(self) -> dict:
        doc = {"format": FORMAT, "version": self.version, "block_size": self.block_size, "hashes_only": self.hashes_only,
               "hash": {"algo": self.hash_algo, "seed": self.hash_seed}}
        if self.source:
            doc["source"] = self.source
        if self.server:
            doc["server"] = self.server
        return doc


# The settings a recorder inside the server writes in the header's "server" object (engines/vllm_trace.py),
# named as `simulate --json`'s config names them; the integers and booleans `simulate --trace` takes as its defaults.
SERVER_INTS = ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len")
SERVER_BOOLS = ("chunked_prefill", "prefix_caching")


def server_settings(obj, where: str, option: str = "--trace") -> dict:
    """A header's "server" object, its integers and booleans checked (other keys kept as they are)."""
    from ..errors import UsageError

    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise UsageError(option, str(obj)[:40], f"{where}: 'server' must be an object of the server's settings")
    for key in SERVER_INTS:
        v = obj.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise UsageError(option, v, f"{where}: 'server.{key}' must be a positive integer")
    for key in SERVER_BOOLS:
        v = obj.get(key)
        if v is not None and not isinstance(v, bool):
            raise UsageError(option, v, f"{where}: 'server.{key}' must be true or false")
    return dict(obj)


def header_from_json(obj: dict, line: int = 1) -> TraceHeader:
    """The header line; a trace from a newer writer is refused with the versions named."""
    from ..errors import UsageError

    version = obj.get("version")
    if obj.get("format") != FORMAT:
        raise UsageError("--trace", obj.get("format"), f"trace line {line}: 'format' must be {FORMAT!r}")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise UsageError("--trace", version, f"trace line {line}: 'version' must be a positive integer")
    if version > VERSION:
        raise UsageError("--trace", version, f"the trace is format version {version}, written by a newer pagetrace; "
                                             f"this one reads versions up to {VERSION}: upgrade pagetrace")
    size = obj.get("block_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise UsageError("--trace", size, f"trace line {line}: 'block_size' must be a positive integer")
    hashing = obj.get("hash") or {}
    if not isinstance(hashing, dict):
        raise UsageError("--trace", str(hashing)[:40], f"trace line {line}: 'hash' must be an object {{algo, seed}}")
    hashes_only = obj.get("hashes_only", False)
    if hashes_only and size is None:
        raise UsageError("--trace", None, f"trace line {line}: a hashes-only trace must give the 'block_size' of its hashes")
    return TraceHeader(version, size, bool(hashes_only), str(hashing.get("algo", "sha256")), hashing.get("seed"),
                       obj.get("source") or {}, server_settings(obj.get("server"), f"trace line {line}"))


@dataclass(slots=True)
class TraceRecord:
    """One request as sent and as answered."""

    id: str
    prompt: list[int]
    max_tokens: int
    arrival: int = 0  # the step it arrives at (the simulator's clock)
    time: float | None = None  # seconds since the recording started
    outputs: list[list[int]] | None = None  # the token ids generated, one list per sample
    n: int = 1
    cache_salt: str | None = None
    lora_name: str | None = None
    priority: int = 0
    block_hashes: list[int] | None = None  # the engine's own hashes of prompt + output (a hook has them); else computed
    seq: int | None = None  # the order the engine received it in (a hook writes at each request's end, not in this order)
    client_id: str | None = None  # the client's request id, where the engine made its own from it


class TraceWriter:
    """Collects requests and writes a versioned trace; `hashes_only` keeps no token id."""

    def __init__(self, header: TraceHeader) -> None:
        if header.hashes_only and header.block_size is None:
            raise ValueError("a hashes-only trace needs the block size of its hashes")
        self.header = header
        self.records: list[TraceRecord] = []

    def add(self, record: TraceRecord) -> None:
        self.records.append(record)

    def line(self, r: TraceRecord) -> dict:
        doc: dict = {"id": r.id, "arrival": r.arrival}
        if r.time is not None:
            doc["time"] = round(r.time, 6)
        outputs = r.outputs or []
        output_len = max((len(o) for o in outputs), default=r.max_tokens)
        if self.header.hashes_only:
            doc["prompt_len"] = len(r.prompt)
            samples = outputs or [[]]
            if r.block_hashes is not None:
                doc["block_hashes"] = [list(r.block_hashes)]
            else:
                doc["block_hashes"] = [vllm_block_hashes(r.prompt + o, self.header.block_size, r.cache_salt, self.header.hash_seed)
                                       for o in samples]
            if len(samples) == 1:
                doc["block_hashes"] = doc["block_hashes"][0]
            doc["output_lens"] = [len(o) for o in outputs] if len(outputs) > 1 else None
        else:
            doc["prompt"] = list(r.prompt)
            if len(outputs) == 1:
                doc["output"] = outputs[0]
            elif outputs:
                doc["outputs"] = outputs
        doc["output_len"] = output_len
        doc["max_tokens"] = r.max_tokens
        for key, value, default in (("seq", r.seq, None), ("client_id", r.client_id, None), ("n", r.n, 1), ("cache_salt", r.cache_salt, None), ("lora_name", r.lora_name, None),
                                    ("priority", r.priority, 0)):
            if value != default:
                doc[key] = value
        if self.header.hashes_only:
            doc.pop("cache_salt", None)  # private too: it is in the first block's hash
            if doc.get("output_lens") is None:
                doc.pop("output_lens")
        return doc

    def text(self) -> str:
        lines = [self.header.to_json()] + [self.line(r) for r in self.records]
        return "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines)

    def write(self, path: str) -> str:
        from ..files import write_outputs

        return write_outputs([(path, self.text().encode())])[0]
