"""KV events, the trace format and the predicted-vs-server comparison, without a server.

The engine's own classes are the reference: messages are encoded with vLLM's
`vllm.distributed.kv_events` structs (as its ZmqEventPublisher does: msgspec msgpack,
8-byte big-endian sequence number) and decoded by pagetrace; the positional (pre-vllm#42892)
encoding is built from the same classes' field list; block hashes are checked against vLLM's
`hash_block_tokens`. Those tests skip with the reason where vLLM is not installed.
"""

from __future__ import annotations

import json

import pytest
from conftest import cli
from test_sim_trace import sample_records, write

from pagetrace.sim import events as ev
from pagetrace.sim.run import simulate
from pagetrace.sim.trace import TraceHeader, TraceWriter
from pagetrace.sim.workload import read_trace

msgspec = pytest.importorskip("msgspec", reason="msgspec (vLLM's msgpack library, in the vllm extra) is not installed")


@pytest.fixture(scope="module")
def kv():
    return pytest.importorskip("vllm.distributed.kv_events", reason="vLLM is not installed: its event classes are the reference")


def frames(batch, seq: int, topic: bytes = b"kv-events") -> list[bytes]:
    """What ZmqEventPublisher._publisher_thread sends."""
    return [topic, seq.to_bytes(8, "big"), msgspec.msgpack.Encoder().encode(batch)]


def stored(kv, hashes, tokens, parent=None, size=4, **kw):
    return kv.BlockStored(block_hashes=hashes, parent_block_hash=parent, token_ids=tokens, block_size=size, lora_id=None,
                          medium="GPU", lora_name=None, **kw)


def test_field_lists_are_the_installed_engines(kv):
    for name, fields in ev.FIELDS.items():
        assert tuple(f.name for f in msgspec.structs.fields(getattr(kv, name))) == fields, name


def test_tagged_maps_from_vllms_classes(kv):
    batch = kv.KVEventBatch(ts=12.5, events=[
        stored(kv, [11, 22], list(range(8)), extra_keys=[None, None], group_idx=0, kv_cache_spec_kind="full_attention"),
        kv.BlockRemoved(block_hashes=[11], medium="GPU", group_idx=0),
        kv.AllBlocksCleared(),
    ], data_parallel_rank=0)
    raw = msgspec.msgpack.decode(frames(batch, 7)[2])
    assert isinstance(raw[1][0], dict) and raw[1][0]["type"] == "BlockStored"  # vLLM 0.32 sends maps tagged "type"
    got, problems = ev.decode_message(frames(batch, 7), "test")
    assert problems == [] and got.seq == 7 and got.ts == 12.5 and got.topic == b"kv-events" and got.data_parallel_rank == 0
    s, r, c = got.events
    assert (s.block_hashes, s.parent_block_hash, s.token_ids, s.block_size, s.medium, s.group_idx) == ([11, 22], None, list(range(8)), 4, "GPU", 0)
    assert (r.block_hashes, r.group_idx) == ([11], 0) and isinstance(c, ev.AllBlocksCleared)


def positional_classes(kv):
    """The encoding before vllm#42892: each event an array [tag, fields...], same field order."""
    out = {}
    for name in ev.FIELDS:
        cls = getattr(kv, name)
        fields = [(f.name, f.type, f.default) if f.default is not msgspec.NODEFAULT else (f.name, f.type) for f in msgspec.structs.fields(cls)]
        out[name] = msgspec.defstruct(name, fields, array_like=True, tag=True, omit_defaults=True)
    return out


def test_positional_arrays_from_vllms_field_list(kv):
    P = positional_classes(kv)
    s = P["BlockStored"](block_hashes=[b"\x01" * 32], parent_block_hash=None, token_ids=[5, 6, 7, 8], block_size=4,
                         lora_id=None, medium="GPU", lora_name=None)
    batch = kv.EventBatch(ts=1.0, events=[s, P["BlockRemoved"](block_hashes=[b"\x01" * 32], medium="GPU"), P["AllBlocksCleared"]()])
    raw = msgspec.msgpack.decode(frames(batch, 0)[2])
    assert raw[1][0][0] == "BlockStored" and isinstance(raw[1][0], list)
    got, problems = ev.decode_message(frames(batch, 0), "test")
    assert problems == []
    assert got.events[0].block_hashes == [b"\x01" * 32] and got.events[0].token_ids == [5, 6, 7, 8]
    assert isinstance(got.events[1], ev.BlockRemoved) and isinstance(got.events[2], ev.AllBlocksCleared)


def test_bad_messages_are_named_and_skipped(kv):
    good = frames(kv.KVEventBatch(ts=1.0, events=[kv.AllBlocksCleared()]), 0)
    truncated = good[:2] + [good[2][:-3]]
    with pytest.raises(ev.EventError, match=r"sequence number 0\): the payload of \d+ bytes is not a whole msgpack"):
        ev.decode_message(truncated, "message 0")
    unknown = [b"", (1).to_bytes(8, "big"), msgspec.msgpack.encode([2.0, [{"type": "BlockMoved", "block_hashes": [1]}, {"type": "AllBlocksCleared"}]])]
    batch, problems = ev.decode_message(unknown, "message 1")
    assert len(batch.events) == 1 and problems == ["message 1 (sequence number 1), event 0: unknown event type 'BlockMoved' "
                                                   "(this reader knows BlockStored, BlockRemoved, AllBlocksCleared); skipped"]
    with pytest.raises(ev.EventError, match="3 frames"):
        ev.decode_message(good[:2], "m")
    mismatch = [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([0.0, [{"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [1, 2, 3], "block_size": 4}]])]
    assert "2 block hashes of 4 tokens but 3 token ids" in ev.decode_message(mismatch, "m")[1][0]
    # a sliding-window group's: the tokens of the blocks the call covered, the hashes of those it cached
    sliding = [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([0.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4, "group_idx": 1}]])]
    batch, problems = ev.decode_message(sliding, "m")
    assert problems == [] and batch.events[0].block_hashes == [1] and batch.events[0].group_idx == 1
    fewer = [b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([0.0, [{"type": "BlockStored", "block_hashes": [1, 2, 3], "parent_block_hash": None, "token_ids": list(range(8)), "block_size": 4}]])]
    assert "3 block hashes of 4 tokens but 8 token ids" in ev.decode_message(fewer, "m")[1][0]


def test_sequence_gaps_are_reported_and_reading_goes_on(kv):
    msgs = [(f"m{s}", frames(kv.KVEventBatch(ts=float(s), events=[kv.AllBlocksCleared()]), s)) for s in (1, 2, 5, 6)]
    stream = ev.read_messages(msgs, "test")
    assert [b.seq for b in stream.batches] == [1, 2, 5, 6]
    assert stream.gaps == [(0, 0), (3, 4)]
    assert "messages 0..0 missing, sent before this subscriber was connected" in stream.problems[0]
    assert "messages 3..4 missing, dropped (the publisher's high-water mark" in stream.problems[1]


def test_recorded_file_round_trip_truncation_and_versions(kv, tmp_path):
    msgs = [frames(kv.KVEventBatch(ts=float(s), events=[kv.BlockRemoved(block_hashes=[s], medium=None)]), s) for s in range(3)]
    data = ev.file_bytes((m, 0.5) for m in msgs)
    path = tmp_path / "e.kvev"
    path.write_bytes(data)
    stream = ev.read_file(str(path))
    assert [b.events[0].block_hashes for b in stream.batches] == [[0], [1], [2]] and stream.problems == []
    path.write_bytes(data[:-5])
    stream = ev.read_file(str(path))
    assert len(stream.batches) == 2 and len(stream.problems) == 1
    assert "message 2 at byte" in stream.problems[0] and "truncated" in stream.problems[0]
    path.write_bytes(b"pagetrace-kv-events 2\n" + data[len(ev.FILE_MAGIC):])
    with pytest.raises(ev.EventError, match="another version .*upgrade pagetrace"):
        ev.read_file(str(path))


def test_block_hashes_are_vllms(kv):
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as u

    from pagetrace.sim.vllm_hash import block_hashes

    tokens = list(range(1000, 1070))
    for seed in (None, "7"):
        if seed is None:
            pytest.MonkeyPatch().delenv("PYTHONHASHSEED", raising=False)
        with pytest.MonkeyPatch.context() as mp:
            if seed is not None:
                mp.setenv("PYTHONHASHSEED", seed)
            else:
                mp.delenv("PYTHONHASHSEED", raising=False)
            u.init_none_hash(sha256)
            for salt in (None, "s"):
                parent, want = None, []
                for i in range(2):
                    extra = (("cache_salt", salt),) if salt and i == 0 else None
                    parent = u.hash_block_tokens(sha256, parent, tokens[i * 32:(i + 1) * 32], extra)
                    want.append(u.maybe_convert_block_hash(parent))
                assert block_hashes(tokens, 32, salt, seed) == want
    # the hashes a real server published for this prompt (docs/simulate.md, the investigation)
    assert block_hashes(tokens, 32) == [15055828968291616402, 5204843658281419474]


# -- predicted against the server's events --

def predicted_messages(kv, result, trace, block_size, lose=None, swap=None):
    """The simulation's own events, encoded with vLLM's classes as a server would publish them."""
    from pagetrace.sim.compare import predicted_items

    items = predicted_items(result, trace, block_size, "hash")
    by_step: dict[str, list] = {}
    for it in items:
        by_step.setdefault(it.where, []).append(it)
    msgs = []
    steps = list(by_step.items())
    if swap is not None:  # the server ran two steps' work the other way round
        steps[swap], steps[swap + 1] = steps[swap + 1], steps[swap]
    for seq, (where, its) in enumerate(steps):
        evs = [kv.BlockRemoved(block_hashes=[i.key], medium="GPU", group_idx=0) if i.kind == "removed" else
               stored(kv, [i.key], [0] * block_size, size=block_size, group_idx=0) for i in its]
        if seq != lose:
            msgs.append((frames(kv.KVEventBatch(ts=float(seq), events=evs), seq), 0.0))
    return ev.file_bytes(msgs)


def test_compare_equal_gap_and_divergence(kv, tmp_path, capsys):
    w = TraceWriter(TraceHeader(block_size=4))
    for r in sample_records():
        w.add(r)
    # a pool of 5 usable blocks: the later requests evict the earlier ones' blocks
    path = str(tmp_path / "t.jsonl")
    w.write(path)
    trace = read_trace(open(path).read(), 4, path)
    result = simulate(trace.requests, 6, 4, record_events=True)
    data = predicted_messages(kv, result, trace, 4)
    (tmp_path / "e.kvev").write_bytes(data)
    assert any(e[0] == "removed" for _, log in result.events for e in log)  # the pool was small enough to evict
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "6", "--events", str(tmp_path / "e.kvev"), "--json")
    doc = json.loads(out)["events"]
    assert code == 0 and doc["equal"] and doc["mode"] == "hash" and doc["agree"] == doc["server_items"] > 0, doc

    (tmp_path / "gap.kvev").write_bytes(predicted_messages(kv, result, trace, 4, lose=1))
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "6", "--events", str(tmp_path / "gap.kvev"), "--json")
    doc = json.loads(out)["events"]
    assert code == 1 and not doc["equal"] and doc["gaps"] == [[1, 1]] and "sequence gap" in doc["first_divergence"]["reason"]
    assert "messages 1..1 missing" in err

    (tmp_path / "swap.kvev").write_bytes(predicted_messages(kv, result, trace, 4, swap=0))
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "6", "--events", str(tmp_path / "swap.kvev"), "--json")
    doc = json.loads(out)["events"]
    assert code == 1 and not doc["equal"] and doc["same_items_any_order"] and doc["agree"] == 0
    assert "depended on timing" in doc["first_divergence"]["reason"]
    first = doc["first_divergence"]
    assert first["pagetrace"]["where"] == "step 0" and first["server"]["where"] == "message 0, event 0"
    assert first["pagetrace"]["hash"] != first["server"]["hash"] and first["server"]["request"] == "a"

    # the same trace simulated with a bigger pool: nothing is evicted, the server's first BlockRemoved is the divergence
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "64", "--events", str(tmp_path / "e.kvev"))
    assert code == 1, err
    assert "first divergence" in out and "server: BlockRemoved" in out
    assert "likely: num_blocks: the server evicted a cached block" in out and "pool of 64 blocks" in out


def test_block_size_of_other_events_is_named(kv, tmp_path, capsys):
    path = write(tmp_path, [{"prompt": list(range(1, 10)), "output_len": 2}])
    msg = frames(kv.KVEventBatch(ts=0.0, events=[stored(kv, [1], list(range(16)), size=16)]), 0)
    (tmp_path / "e.kvev").write_bytes(ev.file_bytes([(msg, 0.0)]))
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--events", str(tmp_path / "e.kvev"), "--json")
    doc = json.loads(out)["events"]
    assert code == 1 and doc["server_events_skipped"] == 1
    assert "message 0, event 0: a BlockStored of 16-token blocks; the simulation's blocks hold 4" in doc["notes"][0]
    assert doc["likely"][0]["setting"] == "block_size" and doc["likely"][0]["server"] == 16


def test_live_listen_times_out_and_reads_a_publisher(kv):
    zmq = pytest.importorskip("zmq")
    import socket
    import threading
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    endpoint = f"tcp://127.0.0.1:{port}"
    start = time.monotonic()
    assert ev.listen(endpoint, idle_timeout=0.3) == []  # nothing there: the timeout ends it
    assert time.monotonic() - start < 3
    # vLLM's own publisher with a non-wildcard endpoint connects: the listener binds
    pub = kv.ZmqEventPublisher(0, endpoint=endpoint, topic="kv-events")
    try:
        def send():
            time.sleep(0.8)
            for _ in range(3):
                pub.publish(kv.KVEventBatch(ts=time.time(), events=[kv.AllBlocksCleared()]))
        threading.Thread(target=send, daemon=True).start()
        got = ev.listen(endpoint, bind=True, idle_timeout=1.5, first_timeout=5)
    finally:
        pub.shutdown()
    stream = ev.read_live(got, endpoint)
    assert [b.seq for b in stream.batches] == [0, 1, 2] and stream.gaps == []
    del zmq


# -- the committed recording of a real server (examples/README.md) --

EXAMPLE = ["--num-blocks", "16", "--block-size", "32", "--max-num-batched-tokens", "2048", "--max-num-seqs", "16", "--max-model-len", "448"]


def test_the_recorded_server_is_predicted(capsys, tmp_path):
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples"
    for trace in ("server_trace.jsonl", "server_trace_private.jsonl"):
        code, out, err = cli(capsys, "simulate", "--trace", str(ex / trace), "--events", str(ex / "server_events.kvev"), *EXAMPLE, "--json")
        assert code == 0, err
        doc = json.loads(out)
        assert doc["events"]["equal"] and doc["events"]["agree"] == 29 and doc["events"]["messages"] == 7
    by_id = {r["id"]: r for r in doc["requests"]}
    assert by_id["again"]["evicted_blocks"] == [{"block": 0, "step": 296, "by": "long"}, {"block": 1, "step": 296, "by": "long"}]
    assert by_id["samples.1"]["hit_while_written"] == [{"block": 2, "by": "samples.0"}]
    data = (ex / "server_events.kvev").read_bytes()
    (tmp_path / "cut.kvev").write_bytes(data[:3000])
    code, out, err = cli(capsys, "simulate", "--trace", str(ex / "server_trace.jsonl"), "--events", str(tmp_path / "cut.kvev"), *EXAMPLE, "--json")
    doc = json.loads(out)["events"]
    assert code == 1 and doc["agree"] == 22 and "message 4 at byte 2879: truncated" in err
    assert doc["first_divergence"]["reason"].startswith("the server's events end early")


def test_live_events_on_the_command_line(kv, tmp_path, capsys):
    """`--events tcp://... --events-bind` against vLLM's own ZmqEventPublisher, which connects
    to an endpoint without a wildcard; and a silent endpoint ends with exit 1 after the timeout."""
    import socket
    import threading
    import time

    from pagetrace.sim.compare import predicted_items

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    endpoint = f"tcp://127.0.0.1:{port}"
    path = write(tmp_path, [{"prompt": list(range(1, 10)), "output": [50, 51, 52, 53]}])  # 12 tokens computed: 3 blocks
    trace = read_trace(open(path).read(), 4, path)
    result = simulate(trace.requests, 8, 4, record_events=True)
    hashes = [i.key for i in predicted_items(result, trace, 4, "hash")]
    pub = kv.ZmqEventPublisher(0, endpoint=endpoint, topic="kv-events")
    try:
        def send():
            time.sleep(1.0)  # the listener binds, the publisher reconnects
            pub.publish(kv.KVEventBatch(ts=time.time(), events=[stored(kv, hashes[:2], list(range(1, 9)), group_idx=0)]))
            pub.publish(kv.KVEventBatch(ts=time.time(), events=[stored(kv, hashes[2:], [9, 50, 51, 52], parent=hashes[1], group_idx=0)]))
        threading.Thread(target=send, daemon=True).start()
        code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "8", "--events", endpoint,
                             "--events-bind", "--events-timeout", "3", "--json")
    finally:
        pub.shutdown()
    assert code == 0, err
    doc = json.loads(out)["events"]
    assert doc["equal"] and doc["messages"] == 2 and doc["agree"] == 3
    start = time.monotonic()
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "8", "--events", endpoint, "--events-timeout", "0.5")
    lines = err.strip().splitlines()
    assert code == 1 and out == "" and len(lines) == 2 and lines[0].startswith("listening on ")  # the status, then the failure
    assert "no KV events message within 0.5 s" in lines[1] and "--events-bind" in err and time.monotonic() - start < 10


def test_a_concurrent_recording_diverges_for_timing_and_says_so(capsys):
    """The same seven requests sent at once to the same server (examples/README.md): they all
    arrive at step 0 in the trace, while the server's first step took only the first one."""
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples"
    code, out, err = cli(capsys, "simulate", "--trace", str(ex / "server_concurrent_trace.jsonl"),
                         "--events", str(ex / "server_concurrent_events.kvev"), *EXAMPLE, "--json")
    assert code == 1, err  # a divergence fails the run
    doc = json.loads(out)["events"]
    first = doc["first_divergence"]
    assert not doc["equal"] and doc["agree"] == 2  # the first request's two prefix blocks
    assert first["pagetrace"]["request"] == "salted" and first["server"]["request"] == "shares"
    assert "sent concurrently" in first["reason"] and "agree on the first 2 events" in first["reason"]
