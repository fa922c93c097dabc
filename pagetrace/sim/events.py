"""vLLM's KV cache events: decode the publisher's messages, read them live or from a file.

vllm/distributed/kv_events.py, vLLM 0.32: `ZmqEventPublisher` sends each step's events as a
ZMQ multipart message `[topic, sequence number (8 bytes, big-endian), payload]`, the payload
being msgpack of `EventBatch` (array-like: `[ts, events, data_parallel_rank]`). The events
are `BlockStored`, `BlockRemoved` and `AllBlocksCleared`. vLLM 0.32 encodes each event as a
map tagged `"type"` (`KVCacheEvent(tag=True)`, not array-like; vllm#42892); earlier releases
sent a positional array `["BlockStored", block_hashes, parent_block_hash, ...]`. Both are
read here, by the field order of the installed engine's classes (`FIELDS`, checked against
`msgspec.structs.fields` of vLLM's own classes in tests/sim/test_sim_events.py).

A recorded file holds the multipart messages as received (`write_message`, `read_file`);
`listen` takes them live from a SUB socket, with timeouts. A problem in one message (a
truncated payload, an unknown event type) is reported with the message's sequence number
and the event's index, and the reading goes on; so does a sequence-number gap (messages
dropped under the publisher's high-water mark, or sent before the subscriber joined).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

# The field order of each event class (vllm/distributed/kv_events.py, vLLM 0.32). A
# positional event has these after its tag; an older engine's shorter array leaves the
# trailing fields unset. REQUIRED: the fields without which an event says nothing.
FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                    "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
                    "ownership", "session_id"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx", "locality", "ownership"),
    "AllBlocksCleared": (),
}
REQUIRED = {"BlockStored": 4, "BlockRemoved": 1, "AllBlocksCleared": 0}
FILE_MAGIC = b"pagetrace-kv-events 1\n"  # a recorded file: this line, then one record per message
SEQ_BYTES = 8


class EventError(ValueError):
    """A message or event that cannot be read; the text names what and where."""


@dataclass(slots=True)
class BlockStored:
    block_hashes: list  # int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default) or digest bytes
    parent_block_hash: object
    token_ids: list[int]
    block_size: int
    lora_name: str | None = None
    medium: str | None = None
    group_idx: int | None = None
    extra_keys: list | None = None


@dataclass(slots=True)
class BlockRemoved:
    block_hashes: list
    medium: str | None = None
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    pass


@dataclass(slots=True)
class Batch:
    """One message: one engine step's events."""

    seq: int
    ts: float
    events: list
    data_parallel_rank: int | None = None
    topic: bytes = b""


@dataclass(slots=True)
class EventStream:
    """Every message read, in order, and what was wrong on the way."""

    batches: list[Batch] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each: what and where
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (first, last) sequence numbers missing
    source: str = ""
    settings: dict = field(default_factory=dict)  # a recorded file's server settings (SETTINGS_TOPIC), where its recorder knew them

    @property
    def num_events(self) -> int:
        return sum(len(b.events) for b in self.batches)


_decoder = None


def _load_decoder():
    global _decoder
    try:
        import msgspec
    except ImportError:  # msgspec comes with vLLM and the vllm extra
        from ..errors import RuntimeFailure

        raise RuntimeFailure("reading KV events needs msgspec: pip install 'pagetrace[vllm]' (or pip install msgspec)") from None
    _decoder = msgspec.msgpack.Decoder()
    return _decoder


def _hashes(value, name: str) -> list:
    if type(value) is not list or not all(type(h) is int or type(h) is bytes for h in value):
        raise EventError(f"field {name!r} must be a list of block hashes (integers or bytes)")
    return value


def decode_event(raw) -> BlockStored | BlockRemoved | AllBlocksCleared:
    """One event, a map tagged "type" (vLLM 0.32) or a positional array (earlier releases)."""
    if isinstance(raw, dict):
        tag, values = raw.get("type"), raw
    elif isinstance(raw, list) and raw:
        tag = raw[0]
        names = FIELDS.get(tag) if isinstance(tag, str) else None
        if names is not None and len(raw) - 1 > len(names):
            raise EventError(f"a positional {tag} has {len(raw) - 1} fields; this reader knows {len(names)} ({', '.join(names)})")
        values = dict(zip(names or (), raw[1:]))
    else:
        raise EventError(f"an event must be a map tagged 'type' or an array starting with its type, not {type(raw).__name__}")
    if not isinstance(tag, str) or tag not in FIELDS:  # (a list or map tag is unhashable: no `in` on it)
        raise EventError(f"unknown event type {tag!r} (this reader knows {', '.join(FIELDS)})")
    missing = [n for n in FIELDS[tag][: REQUIRED[tag]] if n not in values]
    if missing:
        raise EventError(f"a {tag} lacks {', '.join(missing)}")
    if tag == "BlockStored":
        tokens, size = values["token_ids"], values["block_size"]
        if type(tokens) is not list or not all(type(t) is int for t in tokens):  # (a bool's type is bool)
            raise EventError("field 'token_ids' must be a list of integers")
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise EventError(f"field 'block_size' must be a positive integer, not {size!r}")
        hashes = _hashes(values["block_hashes"], "block_hashes")
        # A sliding-window group's BlockStored carries the token ids of every block the call
        # covered but the hashes of only the blocks it cached (block_pool.py cache_full_blocks:
        # masked and null blocks are left out of block_hashes, not of token_ids).
        if len(tokens) % size or len(tokens) < len(hashes) * size:
            raise EventError(f"{len(hashes)} block hashes of {size} tokens but {len(tokens)} token ids")
        return BlockStored(hashes, values["parent_block_hash"], tokens, size, values.get("lora_name"), values.get("medium"),
                           values.get("group_idx"), values.get("extra_keys"))
    if tag == "BlockRemoved":
        return BlockRemoved(_hashes(values["block_hashes"], "block_hashes"), values.get("medium"), values.get("group_idx"))
    return AllBlocksCleared()


def decode_message(frames: list[bytes], where: str) -> tuple[Batch, list[str]]:
    """`[topic, seq, payload]` -> the batch and a line per event that could not be read
    (those events are left out). Raises EventError when the message itself is unreadable."""
    if len(frames) != 3:
        raise EventError(f"{where}: a message has 3 frames [topic, sequence number, payload], this one {len(frames)}")
    topic, seq_bytes, payload = frames
    if len(seq_bytes) != SEQ_BYTES:
        raise EventError(f"{where}: the sequence number is {len(seq_bytes)} bytes, not {SEQ_BYTES}")
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    where = f"{where} (sequence number {seq})"
    decoder = _decoder or _load_decoder()  # outside the try: a missing msgspec is no bad message
    try:
        obj = decoder.decode(payload)
    except Exception as exc:  # msgspec.DecodeError: truncated or not msgpack
        raise EventError(f"{where}: the payload of {len(payload)} bytes is not a whole msgpack EventBatch ({exc})") from None
    if (not isinstance(obj, list) or len(obj) < 2 or isinstance(obj[0], bool) or not isinstance(obj[0], (int, float))
            or not isinstance(obj[1], list)):
        raise EventError(f"{where}: the payload is not an EventBatch [ts, events, data_parallel_rank]")
    events, problems = [], []
    for k, raw in enumerate(obj[1]):
        try:
            events.append(decode_event(raw))
        except EventError as exc:
            problems.append(f"{where}, event {k}: {exc}; skipped")
    rank = obj[2] if len(obj) > 2 and isinstance(obj[2], int) else None
    return Batch(seq, float(obj[0]), events, rank, bytes(topic)), problems


def read_messages(messages: Iterable[tuple[str, list[bytes]]], source: str = "") -> EventStream:
    """Decode messages (each with where it came from), checking the sequence numbers.

    Python's cyclic collector is paused meanwhile: the events make no cycles, and its passes
    over every token list kept so far cost most of the time (bench/README.md)."""
    import gc

    paused = gc.isenabled()
    gc.disable()
    try:
        return _read_messages(messages, source)
    finally:
        if paused:
            gc.enable()


def _read_messages(messages, source: str) -> EventStream:
    stream = EventStream(source=source)
    expected = 0
    for where, frames in messages:
        try:
            batch, problems = decode_message(frames, where)
        except EventError as exc:
            stream.problems.append(f"{exc}; message skipped")
            if len(frames) == 3 and len(frames[1]) == SEQ_BYTES:
                expected = int.from_bytes(frames[1], "big", signed=True) + 1
            continue
        stream.problems.extend(problems)
        if batch.seq > expected:
            stream.gaps.append((expected, batch.seq - 1))
            first = "the first message read" if not stream.batches else f"after sequence number {expected - 1}"
            why = ("sent before this subscriber was connected (ZMQ drops a PUB message no subscriber is connected for)"
                   if not stream.batches else "dropped (the publisher's high-water mark, `hwm`) or lost")
            stream.problems.append(f"{where}: sequence gap {first}: messages {expected}..{batch.seq - 1} missing, {why}; going on")
        elif batch.seq < expected:
            stream.problems.append(f"{where}: sequence number {batch.seq} after {expected - 1}: the publisher restarted; going on")
        expected = batch.seq + 1
        stream.batches.append(batch)
    return stream


# -- recorded files: the magic line, then per message: b"M", f64 receive time, u8 frames, (u32 length, bytes) per frame --

def encode_record(frames: list[bytes], received: float) -> bytes:
    parts = [b"M", struct.pack(">dB", received, len(frames))]
    for f in frames:
        parts += [struct.pack(">I", len(f)), bytes(f)]
    return b"".join(parts)


def check_magic(data: bytes, source: str) -> None:
    if not data.startswith(FILE_MAGIC):
        head = data[:64].split(b"\n", 1)[0]  # the first line, whole: "pagetrace-kv-events 100" is version 100
        if head == FILE_MAGIC.strip():
            raise EventError(f"{source}: the file ends inside its first line ({head.decode()!r}): truncated")
        if head.startswith(b"pagetrace-kv-events "):
            raise EventError(f"{source}: a KV events file of another version ({head.strip().decode(errors='replace')}); "
                             f"this pagetrace reads {FILE_MAGIC.strip().decode()}: upgrade pagetrace")
        raise EventError(f"{source}: not a pagetrace KV events file (it does not start with {FILE_MAGIC.strip().decode()!r})")


def iter_file(data: bytes, source: str) -> Iterator[tuple[str, list[bytes]]]:
    """The messages of a recorded file; a truncated record stops the file with an EventError
    naming the record and byte offset (the messages before it are kept by the caller)."""
    pos, n = len(FILE_MAGIC), 0
    while pos < len(data):
        where = f"{source}, message {n} at byte {pos}"
        if data[pos:pos + 1] != b"M" or pos + 10 > len(data):
            raise EventError(f"{where}: truncated or corrupt record header")
        _, count = struct.unpack_from(">dB", data, pos + 1)
        pos += 10
        frames = []
        for _ in range(count):
            if pos + 4 > len(data):
                raise EventError(f"{where}: truncated (the file ends inside a frame length)")
            (length,) = struct.unpack_from(">I", data, pos)
            pos += 4
            if pos + length > len(data):
                raise EventError(f"{where}: truncated (a frame of {length} bytes, {len(data) - pos} left in the file)")
            frames.append(data[pos:pos + length])
            pos += length
        yield where, frames
        n += 1


# A recorder that knows the server's settings (engines/vllm_trace.py) writes them as the file's first
# record: frames [SETTINGS_TOPIC, b"", JSON object]. Not a message (no sequence number): an older
# reader skips it as a bad message and goes on.
SETTINGS_TOPIC = b"\x00pagetrace-settings"


def settings_record(settings: dict, received: float) -> bytes:
    import json

    return encode_record([SETTINGS_TOPIC, b"", json.dumps(settings, separators=(",", ":")).encode()], received)


def read_file(path: str) -> EventStream:
    import json

    with open(path, "rb") as f:
        data = f.read()
    check_magic(data, path)
    messages: list[tuple[str, list[bytes]]] = []
    settings: dict = {}
    stopped = None
    try:
        for item in iter_file(data, path):
            frames = item[1]
            if len(frames) == 3 and frames[0] == SETTINGS_TOPIC and frames[1] == b"":
                try:
                    settings = json.loads(frames[2])
                except ValueError:
                    settings = {}
                if not isinstance(settings, dict):
                    settings = {}
                continue
            messages.append(item)
    except EventError as exc:
        stopped = f"{exc}; reading stopped there"
    read = read_messages(messages, path)
    read.settings = settings
    if stopped:
        read.problems.append(stopped)
    return read


def file_bytes(messages: Iterable[tuple[list[bytes], float]]) -> bytes:
    """A recorded file of (frames, receive time) messages."""
    return FILE_MAGIC + b"".join(encode_record(frames, t) for frames, t in messages)


# -- live: a SUB socket --

def listen(endpoint: str, *, bind: bool = False, topic: bytes = b"", idle_timeout: float = 10.0, max_seconds: float = 600.0,
           first_timeout: float | None = None, on_message: Callable[[list[bytes], float], None] | None = None,
           stop: Callable[[], bool] | None = None, on_ready: Callable[[], None] | None = None) -> list[tuple[list[bytes], float]]:
    """Messages from vLLM's publisher until none came for `idle_timeout` seconds (or
    `first_timeout` before the first), `max_seconds` passed, or `stop()` is true.

    The publisher binds when its endpoint has a wildcard (`tcp://*:5557`, the default) and
    CONNECTS otherwise (kv_events.py `_is_bind_endpoint`): a server started with
    `"endpoint": "tcp://127.0.0.1:5557"` reaches only a subscriber that binds that address
    (`bind=True`); two connecting sides never meet and every message is dropped.
    """
    try:
        import zmq
    except ImportError:  # pragma: no cover - pyzmq comes with vLLM and the vllm extra
        from ..errors import RuntimeFailure

        raise RuntimeFailure("listening for KV events needs pyzmq: pip install 'pagetrace[vllm]' (or pip install pyzmq)") from None
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    out: list[tuple[list[bytes], float]] = []
    try:
        sub.setsockopt(zmq.SUBSCRIBE, topic)
        sub.setsockopt(zmq.RCVHWM, 0)
        try:
            (sub.bind if bind else sub.connect)(endpoint)
        except zmq.ZMQError as exc:
            from ..errors import RuntimeFailure

            raise RuntimeFailure(f"cannot {'bind' if bind else 'connect to'} {endpoint}: {exc}") from None
        if on_ready is not None:
            on_ready()
        start = last = time.monotonic()
        while True:
            now = time.monotonic()
            wait = (first_timeout if first_timeout is not None and not out else idle_timeout) - (now - last)
            wait = min(wait, max_seconds - (now - start))
            if wait <= 0 or (stop is not None and stop()):
                break
            if sub.poll(int(min(wait, 0.2) * 1000) + 1):
                frames = sub.recv_multipart()
                received = time.time()
                out.append((frames, received))
                if on_message is not None:
                    on_message(frames, received)
                last = time.monotonic()
    finally:
        sub.close(linger=0)
    return out


def read_live(messages: list[tuple[list[bytes], float]], endpoint: str) -> EventStream:
    return read_messages(((f"{endpoint}, message {i}", frames) for i, (frames, _) in enumerate(messages)), endpoint)
