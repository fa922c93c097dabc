"""The metadata ring: every step's index tensors and request ids, no pages, kept always.

A server with `PAGETRACE_PAGES=flagged` keeps the cache pages of the steps the guard flags
(and of the step after SIGUSR1) only; every step goes into this ring, so a fault at step
40,000 comes with the tables, slots and requests of the steps before it. The ring must hold
about 100,000 steps of a batch of 256 in 256 MiB, about 2.6 kB a step, where the tensors
themselves are about 20 kB, so a step is stored as its difference from the step before:

- vLLM keeps its batch persistent (v1/worker/gpu_input_batch.py `InputBatch`: a request keeps
  its row from step to step until the batch is condensed), so row r of this step is mostly
  row r of the last one: seq_lens + 1, slots + 1, positions + 1, request ids unchanged;
- a table row grows by one entry every block_size tokens: only the changed entries of the
  used part of the table (j < ceil(seq_len / block_size)) are stored, as (index, value);
- a step's differences and changed entries are stored together in the smallest integer type
  that holds them all, and the records of a segment go through one zlib stream (its history
  spans steps).

A segment is SEGMENT_STEPS steps (fewer when its bytes reach an eighth of the bound); its
first step is stored whole, so each segment decodes alone. A closed segment is handed to
`sink` (the server plugin writes it into the bundle as `ring-NNNNNN.bin`) and only its size
stays in memory; the oldest segments leave while the ring is over its bound. What is kept is
exactly what `statement()` says: steps first..last, their count, their bytes.

Reading (`read_segment`, `RingSteps`) is NumPy only: `check` and `lookup --from` never import
torch. The unused part of a table row (j >= ceil(seq_len / block_size)) is not kept: a
decoded row is zero there (vLLM's table padding), and its width is the step's widest row.
"""

from __future__ import annotations

import zlib

import numpy as np

MAGIC = b"PTRING1\n"
SEGMENT_STEPS = 1024
HEADER = 9  # int64 fields: step, rows, width, slots, positions, changes, id bytes, the values' integer type, block size
VALUES = ("rows", "query_start_loc", "seq_lens", "slot_mapping", "positions")  # each stored as its difference from the last step's
DTYPES = (np.int8, np.int16, np.int32, np.int64)
_LIMITS = [(int(np.iinfo(dt).min), int(np.iinfo(dt).max)) for dt in DTYPES]
SEP = b"\0"


def _view(t) -> np.ndarray:
    """A tensor's values as NumPy sees them, without a copy where they are on the host (a torch
    tensor on any device, or an array)."""
    if hasattr(t, "numpy"):
        try:
            return t.numpy()
        except (TypeError, RuntimeError):  # on a device, or a tensor that needs grad: brought to the host
            return t.detach().cpu().numpy()
    return np.asarray(t)


def _aligned(prev: np.ndarray, n: int) -> np.ndarray:
    """`prev` cut or zero-padded to n entries (the last step's values, row by row)."""
    if prev.shape[0] >= n:
        return prev[:n]
    return np.concatenate([prev, np.zeros(n - prev.shape[0], dtype=np.int64)])


def _narrow(a: np.ndarray) -> tuple[int, np.ndarray]:
    """The smallest of int8/16/32/64 that holds every value of `a`: (its code, `a` in it)."""
    if a.size == 0:
        return 0, a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for code, (low, high) in enumerate(_LIMITS):
        if low <= lo and hi <= high:
            return code, a.astype(DTYPES[code])
    return 3, a


def _carried(prev: np.ndarray, rows: int, width: int) -> np.ndarray:
    """The last step's table cut or zero-padded to rows x width: what this step differs from."""
    base = np.zeros((rows, width), dtype=np.int64)
    r, w = min(rows, prev.shape[0]), min(width, prev.shape[1])
    base[:r, :w] = prev[:r, :w]
    return base


class Encoder:
    """The differences of one segment's steps, each from the step before."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.last_requests: list[str] | None = None
        self.rows = _EMPTY
        self.values, self.sizes = _EMPTY, (0, 0, 0, 0, 0)  # the last step's rows, query_start_loc, seq_lens, slot_mapping, positions, end to end
        self.table = np.zeros((0, 0), dtype=np.int64)  # the last step's table: its used entries, and before that what each row held

    def encode(self, step: int, requests: list[str], query_start_loc, seq_lens, block_table, slot_mapping, positions, block_size: int) -> bytes:
        new_ids = []
        if requests == self.last_requests:  # a decode step of an unchanged batch: one list compare
            rows = self.rows
        else:
            ids = self.ids
            for name in requests:
                if name not in ids:
                    ids[name] = len(ids)
                    new_ids.append(name)
            rows = self.rows = np.fromiter((ids[name] for name in requests), dtype=np.int64, count=len(requests))
            self.last_requests = list(requests)
        num = len(requests)
        qsl, lens, slots = _view(query_start_loc)[: num + 1], _view(seq_lens)[:num], _view(slot_mapping)
        pos = _EMPTY if positions is None else _view(positions)
        sizes = (num, qsl.shape[0], num, slots.shape[0], pos.shape[0])
        # this step's values, one int64 copy (vLLM fills the same buffers again at the next step)
        current = np.concatenate([rows, qsl, lens, slots, pos], dtype=np.int64)
        if sizes == self.sizes:  # the usual decode step: one subtraction
            delta = current - self.values
        else:
            ends = np.cumsum(sizes)
            old = np.split(self.values, np.cumsum(self.sizes)[:-1])
            delta = np.concatenate([a - _aligned(p, a.shape[0]) for a, p in zip(np.split(current, ends[:-1]), old)])
        self.values, self.sizes = current, sizes
        lens = current[num + sizes[1]: 2 * num + sizes[1]]
        counts = (lens + block_size - 1) // block_size
        width = max(int(counts.max()), 0) if num else 0
        table = _view(block_table[:num, :width]) if width else np.zeros((num, 0), dtype=np.int64)
        width = table.shape[1]  # a row narrower than its count (a bad seq_len): what there is
        base = self.table if self.table.shape == (num, width) else _carried(self.table, num, width)
        used = _COLUMNS[:, :width] < counts[:, None] if width <= _COLUMNS.shape[1] else np.arange(width)[None, :] < counts[:, None]
        table = np.where(used, table, base)  # past a row's count: not kept, not changed (int64: base is)
        change = np.flatnonzero(table != base)
        self.table = table
        code, values = _narrow(np.concatenate([delta, change, table.reshape(-1)[change]]))
        id_bytes = SEP.join(n.encode() for n in new_ids)
        head = np.array([step, num, width, sizes[3], sizes[4], change.shape[0], len(id_bytes), code, block_size], dtype=np.int64)
        return head.tobytes() + id_bytes + values.tobytes()


_EMPTY = np.zeros(0, dtype=np.int64)
_COLUMNS = np.arange(4096)[None, :]


class Decoder:
    """The steps of one segment, in order, from its records."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0
        self.ids: list[str] = []
        self.prev = [np.zeros(0, dtype=np.int64) for _ in VALUES]
        self.table = np.zeros((0, 0), dtype=np.int64)

    def _take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ValueError(f"a record runs past the segment's end (byte {self.at} + {n} of {len(self.data)})")
        out = self.data[self.at: self.at + n]
        self.at += n
        return out

    def __iter__(self):
        while self.at < len(self.data):
            yield self.next()

    def next(self) -> dict:
        head = np.frombuffer(self._take(8 * HEADER), dtype=np.int64)
        step, num, width, nslots, npos, nchange, nid, code, block_size = (int(x) for x in head)
        if min(num, width, nslots, npos, nchange, nid) < 0 or not 0 <= code < len(DTYPES):
            raise ValueError(f"step {step}: a negative size or an unknown integer type in its record")
        if nid:
            self.ids += [b.decode() for b in self._take(nid).split(SEP)]
        sizes = [num, num + 1 if num else 0, num, nslots, npos, nchange, nchange]
        dt = np.dtype(DTYPES[code])
        flat = np.frombuffer(self._take(sum(sizes) * dt.itemsize), dtype=dt).astype(np.int64)
        got = np.split(flat, np.cumsum(sizes)[:-1])
        out = [d + _aligned(p, d.shape[0]) for d, p in zip(got[:5], self.prev)]
        self.prev = out
        rows, qsl, lens, slots, pos = out
        base = _carried(self.table, num, width)
        cells = base.reshape(-1)
        index = got[5]
        if index.size and (index.min() < 0 or index.max() >= cells.size):
            raise ValueError(f"step {step}: a table change outside its {num} x {width} table")
        cells[index] = got[6]
        self.table = base
        if rows.size and (rows.min() < 0 or rows.max() >= len(self.ids)):
            raise ValueError(f"step {step}: a request index outside the segment's {len(self.ids)} ids")
        counts = np.clip((lens + block_size - 1) // block_size, 0, None)
        used = np.arange(width)[None, :] < counts[:, None]
        return {
            "step": step,
            "requests": [self.ids[k] for k in rows.tolist()],
            "query_start_loc": qsl if num else np.zeros(1, dtype=np.int64),
            "seq_lens": lens,
            "block_table": np.where(used, base, 0),  # 0 past each row's count: vLLM's padding
            "block_counts": counts,
            "slot_mapping": slots,
            "positions": pos,
            "block_size": block_size,
        }


class MetaRing:
    """The ring in the worker: `add` each step; closed segments go to `sink(name, data, info,
    dropped_names)`; `flush()` hands over the open segment as it is (at a fault, or a signal)."""

    def __init__(self, bound_bytes: int, block_size: int, sink=None, segment_steps: int = SEGMENT_STEPS) -> None:
        self.bound, self.block_size, self.sink, self.segment_steps = int(bound_bytes), int(block_size), sink, segment_steps
        self.segments: list[dict] = []  # closed: {"file", "first", "last", "steps", "bytes"}, oldest first
        self.serial = 0
        self.dtypes: dict[str, str] = {}  # index tensor -> its dtype as the engine holds it (the ring stores values only)
        self._open()

    def _open(self) -> None:
        self.encoder = Encoder()
        self.zip = zlib.compressobj(1)
        self.chunks: list[bytes] = [MAGIC]
        self.open_bytes = len(MAGIC)
        self.open_first: int | None = None
        self.open_last: int | None = None
        self.open_steps = 0

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.segments) + self.open_bytes

    def add(self, step: int, requests: list[str], query_start_loc, seq_lens, block_table, slot_mapping, positions=None) -> None:
        if not self.dtypes:
            named = {"query_start_loc": query_start_loc, "seq_lens": seq_lens, "block_table": block_table, "slot_mapping": slot_mapping, "positions": positions}
            self.dtypes = {k: str(v.dtype).replace("torch.", "") for k, v in named.items() if v is not None}
        record = self.encoder.encode(step, requests, query_start_loc, seq_lens, block_table, slot_mapping, positions, self.block_size)
        out = self.zip.compress(record)
        if out:
            self.chunks.append(out)
            self.open_bytes += len(out)
        if self.open_first is None:
            self.open_first = step
        self.open_last = step
        self.open_steps += 1
        if self.open_steps >= self.segment_steps or self.open_bytes >= self.bound // 8:
            self.close_segment()
        else:
            dropped = self._over_bound()
            if dropped and self.sink is not None:
                self.sink(None, b"", self.index(), dropped)

    def _over_bound(self) -> list[str]:
        """The oldest closed segments leave while the ring (closed and open) is over its bound."""
        dropped = []
        while self.segments and self.bytes > self.bound:
            dropped.append(self.segments.pop(0)["file"])
        return dropped

    def _take_open(self, final: bool) -> dict | None:
        if not self.open_steps:
            return None
        self.chunks.append(self.zip.flush(zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH))
        data = b"".join(self.chunks)
        self.chunks, self.open_bytes = [data], len(data)
        info = {"file": f"ring-{self.serial:06d}.bin", "first": self.open_first, "last": self.open_last, "steps": self.open_steps, "bytes": len(data)}
        return info

    def close_segment(self) -> None:
        info = self._take_open(final=True)
        if info is None:
            return
        data = self.chunks[0]
        self.serial += 1
        self.segments.append(info)
        self._open()
        dropped = self._over_bound()
        if self.sink is not None:
            self.sink(info["file"], data, self.index(), dropped)

    def flush(self) -> tuple[dict | None, bytes, list[str]]:
        """The open segment as it is (still open: later steps go on into it), for a bundle about to
        close, and the closed segments that leave to keep the whole within the bound."""
        info = self._take_open(final=False)
        if info is None:
            return None, b"", []
        return info, self.chunks[0], self._over_bound()

    def reset(self) -> None:
        """A new bundle: the ring starts again, empty (the closed bundle keeps what was)."""
        self.segments = []
        self._open()

    def index(self, open_segment: dict | None = None) -> dict:
        """The manifest's `ring` entry: what the ring holds, in steps and bytes, and its files."""
        segments = self.segments + ([open_segment] if open_segment else [])
        held = sum(s["steps"] for s in segments)
        return {"format": 1, "bound_bytes": self.bound, "dtypes": self.dtypes, "bytes": sum(s["bytes"] for s in segments), "steps": held,
                "first": segments[0]["first"] if segments else None, "last": segments[-1]["last"] if segments else None,
                "segments": segments}

    def statement(self) -> str:
        ix = self.index()
        if not ix["steps"] and not self.open_steps:
            return "metadata ring empty"
        first = ix["first"] if ix["first"] is not None else self.open_first
        steps = ix["steps"] + self.open_steps
        last = self.open_last if self.open_steps else ix["last"]
        gaps = "" if steps == last - first + 1 else f", the others not seen (paused by SIGUSR2, or the ring restarted)"
        held = f"{self.bytes / (1 << 20):.2f} MiB" if self.bytes >= 1 << 20 else f"{self.bytes / 1024:.1f} KiB"
        return f"metadata ring: steps {first}..{last} ({steps} steps{gaps}) in {held} of {self.bound / (1 << 20):g} MiB"


def read_segment(data: bytes) -> list[dict]:
    """Every step of one segment file, decoded (ValueError: not a ring segment, or damaged)."""
    if not data.startswith(MAGIC):
        raise ValueError("not a pagetrace metadata ring segment (its first bytes are not PTRING1)")
    raw = zlib.decompressobj().decompress(data[len(MAGIC):])  # a flushed, unfinished stream reads too
    return list(Decoder(raw))
