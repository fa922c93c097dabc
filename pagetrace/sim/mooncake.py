"""Mooncake's published request traces, read as they are (kvcache-ai/Mooncake, FAST25-release/traces/).

One JSON object per line: `timestamp` (ms since the trace began), `input_length`,
`output_length` (tokens) and `hash_ids`: one id per 512-token block of the prompt, the last,
partial block included (so `len(hash_ids) == ceil(input_length / 512)`). The ids are remapped
prefix hashes: two requests with equal ids at block i have equal prompts up to the end of
block i (checked on the conversation trace: an id always sits at one position after one parent).
No token id is published.

Here block i of a prompt becomes the token ids `TOKEN_BASE + id * 512 + j`, j = 0..511 (a
partial block: its first j), so the simulator's own block hashes (request.py) are equal exactly
where Mooncake's ids are, at any `--block-size`; at 512 the prompt's chain is computed once
here, from one `range` per block, instead of from 145 M token ids. Outputs are ids no other
request has. Arrivals are wall-clock: request k arrives at step `floor(timestamp / step_ms)`,
a fixed step time (`DEFAULT_STEP_MS`) unless the caller gives another.
"""

from __future__ import annotations

import gzip
import json
import math

from ..errors import UsageError
from .request import SimRequest
from .trace import TraceHeader
from .workload import UNIQUE_STRIDE, Trace

MOONCAKE_BLOCK = 512  # tokens per hash id (Mooncake's README: "The block size is 512 tokens")
DEFAULT_STEP_MS = 50.0  # ms per simulated step: a round decode step of a large model, the converted run's
TOKEN_BASE = 1 << 48  # prompt token ids start here: above every output id (UNIQUE_STRIDE x requests < 2**41)
KEYS = ("timestamp", "input_length", "output_length", "hash_ids")


class BlockIdTokens:
    """A prompt known by its blocks' ids: token `p` is `TOKEN_BASE + ids[p // 512] * 512 + p % 512`,
    computed when asked for, never stored."""

    __slots__ = ("ids", "length")

    def __init__(self, ids: list[int], length: int) -> None:
        self.ids, self.length = ids, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index):
        if isinstance(index, int):
            if index < 0:
                index += self.length
            if not 0 <= index < self.length:
                raise IndexError(index)
            b, j = divmod(index, MOONCAKE_BLOCK)
            return TOKEN_BASE + self.ids[b] * MOONCAKE_BLOCK + j
        start, stop, step = index.indices(self.length)
        if step != 1:
            return tuple(self[i] for i in range(start, stop, step))
        out: list[int] = []
        for piece in self._pieces(start, stop):
            out.extend(piece)
        return tuple(out)

    def _pieces(self, start: int, stop: int):
        """start..stop as one range per block (consecutive blocks of consecutive ids merged)."""
        pos = start
        while pos < stop:
            b, j = divmod(pos, MOONCAKE_BLOCK)
            end = min(stop, (b + 1) * MOONCAKE_BLOCK)
            first = TOKEN_BASE + self.ids[b] * MOONCAKE_BLOCK + j
            yield range(first, first + end - pos)
            pos = end

    def run(self, start: int, stop: int) -> range | tuple[int, ...]:
        """The ids start..stop as one `range` when they are consecutive, else a tuple (request.py `_run`)."""
        pieces = list(self._pieces(start, stop))
        if all(a.stop == b.start for a, b in zip(pieces, pieces[1:])):
            return range(pieces[0].start, pieces[-1].stop) if pieces else range(0)
        out: list[int] = []
        for piece in pieces:
            out.extend(piece)
        return tuple(out)

    def block_chain(self) -> list[int]:
        """The simulator's hashes of the prompt's full 512-token blocks, as `SimRequest.update_hashes`
        computes them from these ids (one `range` key per block, no extra key)."""
        out: list[int] = []
        parent = None
        for i in range(self.length // MOONCAKE_BLOCK):
            first = TOKEN_BASE + self.ids[i] * MOONCAKE_BLOCK
            parent = hash((parent, range(first, first + MOONCAKE_BLOCK), None))  # request.hash_block(parent, key, None)
            out.append(parent)
        return out


def is_mooncake(first_line: str) -> bool:
    """Whether a trace's first line is a Mooncake request (its four keys, no pagetrace header)."""
    try:
        obj = json.loads(first_line)
    except ValueError:
        return False
    return isinstance(obj, dict) and "format" not in obj and all(k in obj for k in ("timestamp", "input_length", "hash_ids"))


def read_text(path: str) -> str:
    """A trace file's text, gunzipped when it ends in .gz; an unreadable file is a usage error."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return f.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise UsageError("--trace", path, getattr(exc, "strerror", None) or str(exc)) from None


def read_mooncake(path: str, block_size: int = MOONCAKE_BLOCK, step_ms: float = DEFAULT_STEP_MS,
                  limit: int | None = None) -> Trace:
    """Mooncake's trace file (plain or .gz) as the simulator's `Trace`: see `parse_mooncake`."""
    return parse_mooncake(read_text(path), block_size, step_ms, path, limit)


def parse_mooncake(text: str, block_size: int = MOONCAKE_BLOCK, step_ms: float = DEFAULT_STEP_MS,
                   source: str = "", limit: int | None = None) -> Trace:
    """The requests of a Mooncake trace, in file order: request k (0-based line of a request)
    has id `str(k)`, arrives at step `floor(timestamp / step_ms)`, and its wall-clock time in
    seconds is `Trace.times[id]`. `limit`: the first that many requests only. The header
    (`Trace.header`) names the trace's 512-token blocks; `block_size` is the simulator's."""
    if not step_ms > 0 or step_ms == math.inf:
        raise UsageError("--step-ms", step_ms, "must be a positive number of milliseconds")
    out: list[SimRequest] = []
    times: dict[str, float] = {}
    chain = block_size == MOONCAKE_BLOCK
    for line_no, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            obj = json.loads(raw)
        except ValueError as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc).split(";")[0]
            raise UsageError("--trace", raw[:40], f"Mooncake trace line {line_no} is not JSON ({reason})") from None
        if not isinstance(obj, dict):
            raise UsageError("--trace", raw[:40], f"Mooncake trace line {line_no} is not a JSON object")
        missing = [k for k in KEYS if k not in obj]
        if missing:
            raise UsageError("--trace", raw[:40], f"Mooncake trace line {line_no} lacks {', '.join(map(repr, missing))}")
        t, plen, olen, ids = (obj[k] for k in KEYS)
        where = f"Mooncake trace line {line_no}"
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < math.inf:
            raise UsageError("--trace", t, f"{where}, field 'timestamp' must be a number of milliseconds >= 0")
        for key, value in (("input_length", plen), ("output_length", olen)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UsageError("--trace", value, f"{where}, field {key!r} must be a positive integer")
        if not isinstance(ids, list) or not all(type(h) is int and h >= 0 for h in ids):
            raise UsageError("--trace", str(ids)[:40], f"{where}, field 'hash_ids' must be a list of non-negative integers")
        if len(ids) != -(-plen // MOONCAKE_BLOCK):
            raise UsageError("--trace", len(ids), f"{where}: {len(ids)} hash_ids for input_length {plen}; "
                                                  f"one per {MOONCAKE_BLOCK}-token block is {-(-plen // MOONCAKE_BLOCK)}")
        rid = str(len(out))
        prompt = BlockIdTokens(ids, plen)
        start = (len(out) + 1) * UNIQUE_STRIDE + UNIQUE_STRIDE // 2  # as workload.synthetic's outputs
        req = SimRequest(rid, prompt, range(start, start + olen), arrival=int(t // step_ms))
        if chain:
            req.block_hashes = prompt.block_chain()
        out.append(req)
        times[rid] = t / 1000
    if not out:
        raise UsageError("--trace", source, "the Mooncake trace holds no request")
    out.sort(key=lambda r: r.arrival)  # stable: file order within a step
    header = TraceHeader(block_size=MOONCAKE_BLOCK, source={"format": "mooncake", "step_ms": step_ms})
    return Trace(out, header, {}, {}, {}, times)


__all__ = ["DEFAULT_STEP_MS", "MOONCAKE_BLOCK", "BlockIdTokens", "is_mooncake", "parse_mooncake", "read_mooncake", "read_text"]
