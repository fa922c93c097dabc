"""Mooncake's published traces (pagetrace/sim/mooncake.py), read as they are and simulated."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import assert_usage_error, cli

from pagetrace.sim.mooncake import BlockIdTokens, is_mooncake, parse_mooncake, read_mooncake
from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import simulate
from pagetrace.sim.scheduler import SchedulerConfig

CONVERSATION = Path(__file__).parent.parent / "data" / "mooncake" / "conversation_trace.jsonl.gz"


def write(tmp_path, rows, name="m.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def row(ts, plen, olen, ids):
    return {"timestamp": ts, "input_length": plen, "output_length": olen, "hash_ids": ids}


def test_tokens_follow_the_ids_block_by_block():
    ids = [7, 8, 3]
    p = BlockIdTokens(ids, 2 * 512 + 5)
    by_formula = [(1 << 48) + ids[i // 512] * 512 + i % 512 for i in range(len(p))]
    assert list(p[0:len(p)]) == by_formula
    assert p[511:514] == tuple(by_formula[511:514]) and p[-1] == by_formula[-1]
    assert p.run(0, 1024) == range(by_formula[0], by_formula[1023] + 1)  # ids 7, 8: consecutive
    assert p.run(1000, 1029) == tuple(by_formula[1000:1029])  # 8 then 3: not
    with pytest.raises(IndexError):
        p[len(p)]


def test_the_chain_is_the_simulators_own_hashing():
    """block_chain (the 512 fast path) equals SimRequest.update_hashes over the same tokens."""
    ids = [0, 5, 6, 9]
    fast = BlockIdTokens(ids, 4 * 512 - 1).block_chain()
    slow = SimRequest("x", BlockIdTokens(ids, 4 * 512 - 1), range(10, 20))
    slow.update_hashes(512)
    assert fast == slow.block_hashes and len(fast) == 3  # the partial fourth block is not hashed


def test_arrivals_are_timestamps_over_the_step_time():
    rows = [row(0, 10, 1, [0]), row(49.9, 10, 1, [1]), row(50, 10, 1, [2]), row(1001, 10, 1, [3])]
    trace = parse_mooncake("".join(json.dumps(r) + "\n" for r in rows), step_ms=50)
    assert [r.arrival for r in trace.requests] == [0, 0, 1, 20]
    assert trace.times["3"] == pytest.approx(1.001)
    assert [r.arrival for r in parse_mooncake(json.dumps(rows[3]), step_ms=1).requests] == [1001]


@pytest.mark.parametrize("block_size", [256, 512, 1024])
def test_shared_ids_hit_and_others_do_not(block_size):
    """B shares A's first two ids, C shares none: B hits A's first 1,024 tokens at any block
    size that divides them; C hits nothing."""
    rows = [row(0, 1536, 4, [1, 2, 3]), row(1000, 1200, 4, [1, 2, 9]), row(2000, 1536, 4, [4, 2, 3])]
    trace = parse_mooncake("\n".join(json.dumps(r) for r in rows), block_size=block_size)
    res = simulate(trace.requests, 64, block_size, SchedulerConfig(8192, 16, True), max_model_len=8192)
    hits = {r.request_id: r.num_cached_tokens for r in res.requests}
    assert hits == {"0": 0, "1": 1024, "2": 0}


def test_the_conversation_trace_reads_whole():
    rows = [json.loads(line) for line in gzip.open(CONVERSATION, "rt")]
    trace = read_mooncake(str(CONVERSATION))
    assert len(trace.requests) == len(rows) == 12_031
    assert sum(r.prompt_len for r in trace.requests) == sum(x["input_length"] for x in rows)
    assert sum(r.max_tokens for r in trace.requests) == sum(x["output_length"] for x in rows)
    assert trace.requests[-1].arrival == rows[-1]["timestamp"] // 50
    assert trace.header.block_size == 512 and trace.header.source["format"] == "mooncake"


def test_detection_reads_the_first_line():
    assert is_mooncake(json.dumps(row(0, 1, 1, [0])))
    assert not is_mooncake(json.dumps({"format": "pagetrace-trace", "version": 1}))
    assert not is_mooncake(json.dumps({"prompt": [1], "output_len": 1})) and not is_mooncake("not json")


def test_simulate_reads_it_without_flags(tmp_path, capsys):
    path = write(tmp_path, [row(0, 1536, 4, [1, 2, 3]), row(1000, 1200, 4, [1, 2, 9])], "m.jsonl.gz")
    Path(path).write_bytes(gzip.compress(Path(path).read_bytes()))
    code, out, err = cli(capsys, "simulate", "--trace", path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config"]["block_size"] == 512 and doc["config"]["trace_format"] == "mooncake" and doc["config"]["step_ms"] == 50
    assert [r["arrival"] for r in doc["requests"]] == [0, 20]
    assert [r["num_cached_tokens"] for r in doc["requests"]] == [0, 1024]
    code, out, _ = cli(capsys, "simulate", "--trace", path, "--json", "--step-ms", "1000")
    assert [r["arrival"] for r in json.loads(out)["requests"]] == [0, 1]


@pytest.mark.parametrize("rows, args, option, words", [
    ([row(0, 1025, 1, [1, 2])], (), "--trace", "2 hash_ids for input_length 1025; one per 512-token block is 3"),
    ([row(-1, 10, 1, [1])], (), "--trace", "'timestamp' must be"),
    ([row(0, 10, 0, [1])], (), "--trace", "'output_length' must be a positive integer"),
    ([row(0, 10, 1, [-1])], (), "--trace", "'hash_ids' must be a list of non-negative"),
    ([{"timestamp": 0, "input_length": 10, "hash_ids": [1]}], (), "--trace", "lacks 'output_length'"),
    ([row(0, 10, 1, [1])], ("--step-ms", "0"), "--step-ms", "positive"),
    ([row(0, 10, 1, [1])], ("--trace-format", "csv"), "--trace-format", "must be one of"),
    ([{"prompt": [1, 2], "output_len": 1}], ("--step-ms", "5"), "--step-ms", "arrivals are steps already"),
    ([{"prompt": [1, 2], "output_len": 1}], ("--trace-format", "mooncake"), "--trace", "lacks"),
])
def test_bad_mooncake_input_exits_2_naming_it(tmp_path, capsys, rows, args, option, words):
    result = cli(capsys, "simulate", "--trace", write(tmp_path, rows), *args)
    assert_usage_error(result, option)
    assert words in result[2]


def test_step_ms_needs_a_trace(capsys):
    assert_usage_error(cli(capsys, "simulate", "--step-ms", "5"), "--step-ms")
