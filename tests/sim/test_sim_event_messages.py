"""KV events messages at their edges, without vLLM: what a server's stream can hold that the
round trips in test_sim_events.py do not (a field left out, one field too many, a gap of one,
a publisher restart, a file cut at each part of a record).

The messages are built by hand in vLLM 0.32's wire form (vllm/distributed/kv_events.py:
`[topic, sequence number as 8 big-endian bytes, msgpack EventBatch [ts, events, rank]]`, each
event a map tagged "type", or before vllm#42892 an array `[type, fields...]` in the classes'
field order); test_sim_events.py holds that form to vLLM's own classes.
"""

from __future__ import annotations

import gc

import pytest

from pagetrace.sim import events as ev

msgspec = pytest.importorskip("msgspec", reason="msgspec (vLLM's msgpack library, in the vllm extra) is not installed")


def message(seq: int, events: list, ts=1.0, *rest, topic: bytes = b"kv-events") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big", signed=True), msgspec.msgpack.encode([ts, events, *rest])]


def stored(hashes, tokens, size=4, parent=None, **fields) -> dict:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": size, **fields}


def decode(event):
    """One event through a whole message: (the event or None, the problems)."""
    batch, problems = ev.decode_message(message(3, [event]), "m")
    return (batch.events[0] if batch.events else None), problems


def problem(event) -> str:
    got, problems = decode(event)
    assert got is None and len(problems) == 1, problems
    assert problems[0].startswith("m (sequence number 3), event 0: ") and problems[0].endswith("; skipped")
    return problems[0][len("m (sequence number 3), event 0: "):-len("; skipped")]


# -- one event --

def test_the_four_required_fields_suffice_and_the_optional_ones_pass_through():
    got, problems = decode(stored([7], [1, 2, 3, 4]))
    assert problems == [] and isinstance(got, ev.BlockStored)
    assert (got.block_hashes, got.parent_block_hash, got.token_ids, got.block_size) == ([7], None, [1, 2, 3, 4], 4)
    assert (got.lora_name, got.medium, got.group_idx, got.extra_keys) == (None, None, None, None)
    got, _ = decode(stored([7], [1, 2, 3, 4], parent=6, lora_name="sql", medium="CPU", group_idx=2, extra_keys=[["salt"]]))
    assert (got.parent_block_hash, got.lora_name, got.medium, got.group_idx, got.extra_keys) == (6, "sql", "CPU", 2, [["salt"]])
    got, problems = decode({"type": "BlockRemoved", "block_hashes": [7, 8]})
    assert problems == [] and (got.block_hashes, got.medium, got.group_idx) == ([7, 8], None, None)
    got, _ = decode({"type": "BlockRemoved", "block_hashes": [b"\x01" * 32], "medium": "GPU", "group_idx": 1})
    assert (got.block_hashes, got.medium, got.group_idx) == ([b"\x01" * 32], "GPU", 1)
    got, problems = decode({"type": "AllBlocksCleared"})
    assert problems == [] and isinstance(got, ev.AllBlocksCleared)


@pytest.mark.parametrize("left_out", ["block_hashes", "parent_block_hash", "token_ids", "block_size"])
def test_a_block_stored_without_a_required_field_is_named(left_out):
    event = stored([7], [1, 2, 3, 4])
    del event[left_out]
    assert problem(event) == f"a BlockStored lacks {left_out}"


def test_a_block_removed_without_hashes_is_named():
    assert problem({"type": "BlockRemoved", "medium": "GPU"}) == "a BlockRemoved lacks block_hashes"


def test_positional_events_by_the_field_order():
    # [type, block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx]
    got, problems = decode(["BlockStored", [7, 8], 6, list(range(8)), 4, None, "GPU", "sql", [None, ["s"]], 1])
    assert problems == []
    assert (got.block_hashes, got.parent_block_hash, got.token_ids, got.block_size) == ([7, 8], 6, list(range(8)), 4)
    assert (got.medium, got.lora_name, got.extra_keys, got.group_idx) == ("GPU", "sql", [None, ["s"]], 1)
    got, _ = decode(["BlockRemoved", [7], "CPU", 3])
    assert (got.block_hashes, got.medium, got.group_idx) == ([7], "CPU", 3)
    assert isinstance(decode(["AllBlocksCleared"])[0], ev.AllBlocksCleared)
    # an older engine's shorter array: the trailing fields unset; one too short to say anything
    assert problem(["BlockStored", [7], None, [1, 2, 3, 4]]) == "a BlockStored lacks block_size"
    assert problem(["BlockRemoved"]) == "a BlockRemoved lacks block_hashes"


def test_a_positional_event_of_every_field_is_read_and_one_more_refused():
    full = ["BlockStored", [7], None, [1, 2, 3, 4], 4] + [None] * 10  # the 14 fields of vLLM 0.32
    assert decode(full)[1] == []
    assert problem(full + [None]) == ("a positional BlockStored has 15 fields; this reader knows 14 (" + ", ".join(ev.FIELDS["BlockStored"]) + ")")
    assert decode(["BlockRemoved", [7], None, None, None, None])[1] == []
    assert problem(["BlockRemoved", [7], None, None, None, None, None]).startswith("a positional BlockRemoved has 6 fields; this reader knows 5 (")
    assert problem(["AllBlocksCleared", None]) == "a positional AllBlocksCleared has 1 fields; this reader knows 0 ()"


@pytest.mark.parametrize("raw, text", [
    ([], "an event must be a map tagged 'type' or an array starting with its type, not list"),
    (5, "an event must be a map tagged 'type' or an array starting with its type, not int"),
    ("BlockStored", "an event must be a map tagged 'type' or an array starting with its type, not str"),
    ({"block_hashes": [1]}, "unknown event type None (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    ({"type": "BlockMoved"}, "unknown event type 'BlockMoved' (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    ([5, [1]], "unknown event type 5 (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    ([[1], 2], "unknown event type [1] (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    ({"type": [1]}, "unknown event type [1] (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    ({"type": {"a": 1}}, "unknown event type {'a': 1} (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
    (["BlockMoved", [1], None, [1, 2, 3, 4], 4], "unknown event type 'BlockMoved' (this reader knows BlockStored, BlockRemoved, AllBlocksCleared)"),
])
def test_events_that_are_no_event(raw, text):
    assert problem(raw) == text


@pytest.mark.parametrize("field, value, text", [
    ("token_ids", [1, 2, True, 4], "field 'token_ids' must be a list of integers"),
    ("token_ids", [1, 2, 3.0, 4], "field 'token_ids' must be a list of integers"),
    ("token_ids", "abcd", "field 'token_ids' must be a list of integers"),
    ("block_size", 0, "field 'block_size' must be a positive integer, not 0"),
    ("block_size", -4, "field 'block_size' must be a positive integer, not -4"),
    ("block_size", True, "field 'block_size' must be a positive integer, not True"),
    ("block_size", 4.0, "field 'block_size' must be a positive integer, not 4.0"),
    ("block_size", "4", "field 'block_size' must be a positive integer, not '4'"),
    ("block_hashes", [7, "8"], "field 'block_hashes' must be a list of block hashes (integers or bytes)"),
    ("block_hashes", [True], "field 'block_hashes' must be a list of block hashes (integers or bytes)"),
    ("block_hashes", 7, "field 'block_hashes' must be a list of block hashes (integers or bytes)"),
])
def test_bad_field_values_are_named(field, value, text):
    event = stored([7], [1, 2, 3, 4])
    event[field] = value
    assert problem(event) == text


def test_bad_removed_hashes_are_named():
    assert problem({"type": "BlockRemoved", "block_hashes": [None]}) == "field 'block_hashes' must be a list of block hashes (integers or bytes)"
    assert problem({"type": "BlockRemoved", "block_hashes": b"\x01" * 32}) == "field 'block_hashes' must be a list of block hashes (integers or bytes)"


def test_token_ids_against_hashes_at_the_block_boundaries():
    assert decode(stored([7, 8], list(range(8))))[1] == []  # exactly two blocks
    assert decode(stored([7], [5], size=1))[1] == []  # one-token blocks
    assert decode(stored([], list(range(8))))[1] == []  # a sliding group's call that cached none of its blocks
    assert decode(stored([7, b"\x02" * 32], list(range(8))))[1] == []  # ints and digests: either form
    assert problem(stored([7, 8], list(range(9)))) == "2 block hashes of 4 tokens but 9 token ids"  # one past a block
    assert problem(stored([7, 8], list(range(7)))) == "2 block hashes of 4 tokens but 7 token ids"
    assert problem(stored([7, 8, 9], list(range(8)))) == "3 block hashes of 4 tokens but 8 token ids"
    assert problem(stored([7], list(range(3)))) == "1 block hashes of 4 tokens but 3 token ids"


# -- one message --

def test_the_batch_fields():
    batch, problems = ev.decode_message(message(9, [{"type": "AllBlocksCleared"}], 3, 2, topic=b"t"), "m")
    assert problems == [] and (batch.seq, batch.ts, batch.data_parallel_rank, batch.topic) == (9, 3.0, 2, b"t")
    assert type(batch.ts) is float and type(batch.topic) is bytes
    assert ev.decode_message(message(0, []), "m")[0].data_parallel_rank is None  # [ts, events]: no rank
    assert ev.decode_message(message(0, [], 1.0, None), "m")[0].data_parallel_rank is None
    assert ev.decode_message(message(0, [], 1.0, "0"), "m")[0].data_parallel_rank is None
    assert ev.decode_message(message(0, [], 1.0, 0), "m")[0].data_parallel_rank == 0


def test_only_the_bad_events_of_a_message_are_left_out():
    batch, problems = ev.decode_message(message(4, [{"type": "AllBlocksCleared"}, {"type": "BlockMoved"},
                                                    {"type": "BlockRemoved", "block_hashes": [1]}, 7]), "file, message 2")
    assert [type(e).__name__ for e in batch.events] == ["AllBlocksCleared", "BlockRemoved"]
    assert [p.split(":")[0] for p in problems] == ["file, message 2 (sequence number 4), event 1",
                                                   "file, message 2 (sequence number 4), event 3"]


@pytest.mark.parametrize("frames, text", [
    ([b"", (0).to_bytes(8, "big")], "m: a message has 3 frames [topic, sequence number, payload], this one 2"),
    ([b"", (0).to_bytes(8, "big"), b"\x90", b""], "m: a message has 3 frames [topic, sequence number, payload], this one 4"),
    ([b"", (0).to_bytes(7, "big"), msgspec.msgpack.encode([1.0, []])], "m: the sequence number is 7 bytes, not 8"),
    ([b"", (0).to_bytes(9, "big"), msgspec.msgpack.encode([1.0, []])], "m: the sequence number is 9 bytes, not 8"),
])
def test_unreadable_frames(frames, text):
    with pytest.raises(ev.EventError) as exc:
        ev.decode_message(frames, "m")
    assert str(exc.value) == text


@pytest.mark.parametrize("payload", [{"ts": 1.0}, [1.0], [True, []], ["1.0", []], [None, []], [1.0, {}], [1.0, None], 5])
def test_payloads_that_are_no_event_batch(payload):
    with pytest.raises(ev.EventError) as exc:
        ev.decode_message([b"", (5).to_bytes(8, "big"), msgspec.msgpack.encode(payload)], "m")
    assert str(exc.value) == "m (sequence number 5): the payload is not an EventBatch [ts, events, data_parallel_rank]"


def test_a_truncated_payload_names_its_length():
    frames = message(5, [stored([7], [1, 2, 3, 4])])
    cut = frames[2][:-1]
    with pytest.raises(ev.EventError) as exc:
        ev.decode_message(frames[:2] + [cut], "m")
    assert str(exc.value).startswith(f"m (sequence number 5): the payload of {len(cut)} bytes is not a whole msgpack EventBatch (")


def test_the_sequence_number_is_big_endian():
    assert ev.decode_message([b"", b"\x00" * 7 + b"\x01", msgspec.msgpack.encode([1.0, []])], "m")[0].seq == 1
    assert ev.decode_message([b"", b"\x01" + b"\x00" * 7, msgspec.msgpack.encode([1.0, []])], "m")[0].seq == 1 << 56


# -- a stream of messages --

def read(seqs_or_frames) -> ev.EventStream:
    msgs = [(f"m{i}", f if isinstance(f, list) else message(f, [{"type": "AllBlocksCleared"}])) for i, f in enumerate(seqs_or_frames)]
    return ev.read_messages(msgs, "src")


def test_a_gap_of_exactly_one_message():
    stream = read([0, 2, 3])
    assert [b.seq for b in stream.batches] == [0, 2, 3] and stream.gaps == [(1, 1)] and stream.source == "src"
    assert stream.problems == ["m1: sequence gap after sequence number 0: messages 1..1 missing, dropped (the publisher's "
                               "high-water mark, `hwm`) or lost; going on"]


def test_a_stream_from_zero_has_no_gap_and_one_from_one_has_a_gap_of_one():
    assert read([0, 1, 2]).gaps == [] and read([0, 1, 2]).problems == []
    stream = read([1, 2])
    assert stream.gaps == [(0, 0)]
    assert stream.problems == ["m0: sequence gap the first message read: messages 0..0 missing, sent before this subscriber "
                               "was connected (ZMQ drops a PUB message no subscriber is connected for); going on"]


def test_a_publisher_restart():
    stream = read([0, 1, 2, 0, 1])
    assert [b.seq for b in stream.batches] == [0, 1, 2, 0, 1] and stream.gaps == []
    assert stream.problems == ["m3: sequence number 0 after 2: the publisher restarted; going on"]
    assert read([0, 1, 1]).problems == ["m2: sequence number 1 after 1: the publisher restarted; going on"]


def test_an_unreadable_message_with_its_sequence_number_is_no_gap():
    bad_payload = [b"", (1).to_bytes(8, "big"), b"\xc1"]  # 0xc1: never used in msgpack
    stream = read([0, bad_payload, 2])
    assert [b.seq for b in stream.batches] == [0, 2] and stream.gaps == []
    assert len(stream.problems) == 1 and stream.problems[0].startswith("m1 (sequence number 1): the payload of 1 bytes")
    assert stream.problems[0].endswith("; message skipped")
    # without a readable sequence number the next message is judged against the last good one
    short_seq = [b"", (1).to_bytes(7, "big"), msgspec.msgpack.encode([1.0, []])]
    stream = read([0, short_seq, 1])
    assert stream.gaps == [] and stream.problems == ["m1: the sequence number is 7 bytes, not 8; message skipped"]
    two_frames = [b"", (1).to_bytes(8, "big")]
    stream = read([0, two_frames, 1])
    assert stream.gaps == [] and len(stream.problems) == 1
    stream = read([0, two_frames, 2])
    assert stream.gaps == [(1, 1)]


def test_num_events_counts_every_batch():
    msgs = [("a", message(0, [{"type": "AllBlocksCleared"}] * 2)), ("b", message(1, [])), ("c", message(2, [{"type": "AllBlocksCleared"}]))]
    assert ev.read_messages(msgs).num_events == 3


def test_the_collector_is_left_as_it_was():
    assert gc.isenabled()
    read([0, 1])
    assert gc.isenabled()
    gc.disable()
    try:
        read([0, 1])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_read_live_names_the_endpoint_and_the_message():
    msgs = [(message(0, []), 10.0), ([b"", (1).to_bytes(8, "big"), b"\xc1"], 11.0), (message(2, []), 12.0)]
    stream = ev.read_live(msgs, "tcp://127.0.0.1:5557")
    assert stream.source == "tcp://127.0.0.1:5557" and [b.seq for b in stream.batches] == [0, 2]
    assert stream.problems[0].startswith("tcp://127.0.0.1:5557, message 1 (sequence number 1): the payload of 1 bytes")


# -- recorded files --

def test_a_recorded_file_byte_for_byte():
    """The layout the module docstring gives: the magic line, then b"M", f64 receive time,
    u8 frame count, and (u32 length, bytes) per frame, all big-endian."""
    data = ev.file_bytes([([b"kv", b"\x00" * 7 + b"\x05", b"\x92\x01\x90"], 0.5)])
    assert data == (b"pagetrace-kv-events 1\n" + b"M" + bytes.fromhex("3fe0000000000000") + b"\x03"
                    + b"\x00\x00\x00\x02kv" + b"\x00\x00\x00\x08" + b"\x00" * 7 + b"\x05" + b"\x00\x00\x00\x03\x92\x01\x90")
    assert ev.file_bytes([]) == b"pagetrace-kv-events 1\n"


def two_messages():
    first, second = message(0, [{"type": "AllBlocksCleared"}]), message(1, [{"type": "BlockRemoved", "block_hashes": [9]}])
    data = ev.file_bytes([(first, 1.0), (second, 2.0)])
    start = len(ev.FILE_MAGIC) + 10 + sum(4 + len(f) for f in first)  # the second record's offset
    return data, start, second


def test_a_file_cut_in_each_part_of_a_record(tmp_path):
    data, start, second = two_messages()
    path = tmp_path / "e.kvev"
    payload_at = start + 10 + 4 + len(second[0]) + 4 + 8 + 4  # the second record's payload
    cuts = {
        start + 5: f"{path}, message 1 at byte {start}: truncated or corrupt record header",
        start + 9: f"{path}, message 1 at byte {start}: truncated or corrupt record header",  # one byte short of the header
        start + 12: f"{path}, message 1 at byte {start}: truncated (the file ends inside a frame length)",
        start + 10 + 4 + 1: f"{path}, message 1 at byte {start}: truncated (a frame of {len(second[0])} bytes, 1 left in the file)",
        payload_at + 2: f"{path}, message 1 at byte {start}: truncated (a frame of {len(second[2])} bytes, 2 left in the file)",
        len(data) - 1: f"{path}, message 1 at byte {start}: truncated (a frame of {len(second[2])} bytes, {len(second[2]) - 1} left in the file)",
    }
    for cut, text in cuts.items():
        path.write_bytes(data[:cut])
        stream = ev.read_file(str(path))
        assert [b.seq for b in stream.batches] == [0], cut
        assert stream.problems == [text + "; reading stopped there"], cut
    path.write_bytes(data[:start])  # cut exactly between two records: nothing wrong
    stream = ev.read_file(str(path))
    assert [b.seq for b in stream.batches] == [0] and stream.problems == []
    path.write_bytes(data)
    assert [b.seq for b in ev.read_file(str(path)).batches] == [0, 1]
    path.write_bytes(data[:start] + b"X" + data[start + 1:])
    assert ev.read_file(str(path)).problems == [f"{path}, message 1 at byte {start}: truncated or corrupt record header; reading stopped there"]


def test_records_that_end_exactly_at_the_end_of_the_file(tmp_path):
    path = tmp_path / "e.kvev"
    # a record of no frame is a whole record: read, then refused as a message
    path.write_bytes(ev.file_bytes([([], 1.0)]))
    stream = ev.read_file(str(path))
    assert stream.batches == [] and stream.problems == [
        f"{path}, message 0 at byte {len(ev.FILE_MAGIC)}: a message has 3 frames [topic, sequence number, payload], this one 0; message skipped"]
    # an empty last frame: its length field ends the file
    path.write_bytes(ev.file_bytes([([b"", (0).to_bytes(8, "big"), b""], 1.0)]))
    stream = ev.read_file(str(path))
    assert len(stream.problems) == 1 and "(sequence number 0): the payload of 0 bytes is not a whole msgpack" in stream.problems[0]
    assert "reading stopped" not in stream.problems[0]


def test_problems_in_messages_come_before_the_cut(tmp_path):
    data, start, _ = two_messages()
    bad = ev.file_bytes([([b"", (0).to_bytes(8, "big"), b"\xc1"], 0.0)])
    path = tmp_path / "e.kvev"
    path.write_bytes(bad + data[len(ev.FILE_MAGIC):len(data) - 1])  # a bad message, a good one, a cut one
    stream = ev.read_file(str(path))
    assert [b.seq for b in stream.batches] == [0]
    assert stream.problems[0].endswith("; message skipped") and "message 0 at byte 22 (sequence number 0)" in stream.problems[0]
    assert stream.problems[-1].endswith("; reading stopped there") and "message 2 at byte" in stream.problems[-1]
    # the good message 0 after the bad message 0 is a restart, not a gap
    assert len(stream.problems) == 3 and "the publisher restarted" in stream.problems[1]


@pytest.mark.parametrize("head, text", [
    (b"pagetrace-kv-events 2\n", "a KV events file of another version (pagetrace-kv-events 2); this pagetrace reads "
                                 "pagetrace-kv-events 1: upgrade pagetrace"),
    (b"pagetrace-kv-events 10\n", "a KV events file of another version (pagetrace-kv-events 10); this pagetrace reads "
                                  "pagetrace-kv-events 1: upgrade pagetrace"),
    (b"hello", "not a pagetrace KV events file (it does not start with 'pagetrace-kv-events 1')"),
    (b"", "not a pagetrace KV events file (it does not start with 'pagetrace-kv-events 1')"),
    (b"pagetrace-kv-events 100\n", "a KV events file of another version (pagetrace-kv-events 100); this pagetrace reads "
                                   "pagetrace-kv-events 1: upgrade pagetrace"),
    (b"pagetrace-kv-events 1", "the file ends inside its first line ('pagetrace-kv-events 1'): truncated"),  # cut before its newline
])
def test_files_of_another_kind_or_version(tmp_path, head, text):
    path = tmp_path / "e.kvev"
    path.write_bytes(head)
    with pytest.raises(ev.EventError) as exc:
        ev.read_file(str(path))
    assert str(exc.value) == f"{path}: {text}"


def test_a_file_of_only_the_magic_line_holds_nothing(tmp_path):
    path = tmp_path / "e.kvev"
    path.write_bytes(ev.FILE_MAGIC)
    stream = ev.read_file(str(path))
    assert stream.batches == [] and stream.problems == [] and stream.gaps == [] and stream.source == str(path)



# -- what the first runs of mutmut found untested --

def test_a_block_stored_lacking_two_fields_names_both():
    assert problem({"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None}) == "a BlockStored lacks token_ids, block_size"


def test_the_decoder_is_made_on_first_use(monkeypatch):
    monkeypatch.setattr(ev, "_decoder", None)
    batch, problems = ev.decode_message(message(0, [{"type": "AllBlocksCleared"}]), "m")
    assert problems == [] and len(batch.events) == 1 and ev._decoder is not None


def test_without_msgspec_the_reader_says_what_to_install(monkeypatch):
    import sys

    from pagetrace.errors import RuntimeFailure

    monkeypatch.setattr(ev, "_decoder", None)
    monkeypatch.setitem(sys.modules, "msgspec", None)  # what `import msgspec` meets where it is not installed
    with pytest.raises(RuntimeFailure) as exc:
        ev.decode_message(message(0, []), "m")
    assert str(exc.value) == "reading KV events needs msgspec: pip install 'pagetrace[vllm]' (or pip install msgspec)"


def test_sequence_numbers_are_signed_as_vllms_end_marker():
    """kv_events.py ZmqEventPublisher: the replay socket ends with END_SEQ = (-1).to_bytes(8, "big", signed=True)
    and an empty payload; a recording that holds it reads -1, and the stream goes on from 0 with no restart."""
    end = [b"", (-1).to_bytes(8, "big", signed=True), b""]
    with pytest.raises(ev.EventError, match=r"^m \(sequence number -1\): the payload of 0 bytes"):
        ev.decode_message(end, "m")
    stream = read([end, 0, 1])
    assert [b.seq for b in stream.batches] == [0, 1] and stream.gaps == [] and len(stream.problems) == 1


def test_read_messages_names_no_source_unless_told():
    assert ev.read_messages([]).source == "" and ev.read_messages([]).batches == []


def test_a_record_of_many_frames(tmp_path):
    """A multipart message of 200 frames (another publisher's) is recorded whole and refused as a message."""
    path = tmp_path / "e.kvev"
    path.write_bytes(ev.file_bytes([([b"x"] * 200, 1.0), (message(0, []), 2.0)]))
    stream = ev.read_file(str(path))
    assert [b.seq for b in stream.batches] == [0]
    assert stream.problems == [f"{path}, message 0 at byte 22: a message has 3 frames [topic, sequence number, payload], this one 200; message skipped"]


@pytest.mark.parametrize("data, shown", [
    (b"pagetrace-kv-events 2\nx\nM", "pagetrace-kv-events 2"),  # the first line only
    (b"pagetrace-kv-events " + b"9" * 80 + b"\n", "pagetrace-kv-events " + "9" * 44),  # at most 64 bytes of it
    (b"pagetrace-kv-events \xff\n", "pagetrace-kv-events \ufffd"),  # not UTF-8: replaced, not raised
])
def test_another_versions_first_line_as_shown(tmp_path, data, shown):
    path = tmp_path / "e.kvev"
    path.write_bytes(data)
    with pytest.raises(ev.EventError) as exc:
        ev.read_file(str(path))
    assert str(exc.value) == f"{path}: a KV events file of another version ({shown}); this pagetrace reads pagetrace-kv-events 1: upgrade pagetrace"
