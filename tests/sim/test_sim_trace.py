"""The trace format (pagetrace/sim/trace.py) and `simulate --what-if`: plain Python, no vLLM,
no msgspec (tests/sim/test_sim_events.py has the KV events)."""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli

from pagetrace.sim.trace import TraceHeader, TraceRecord, TraceWriter


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_newer_trace_version_is_refused(tmp_path, capsys):
    path = write(tmp_path, [{"format": "pagetrace-trace", "version": 2}, {"prompt": [1, 2], "output_len": 2}])
    result = cli(capsys, "simulate", "--trace", path)
    assert_usage_error(result, "--trace")
    assert "version 2, written by a newer pagetrace" in result[2] and "upgrade pagetrace" in result[2]


@pytest.mark.parametrize("lines, words", [
    ([{"format": "other", "version": 1}, {"prompt": [1], "output_len": 1}], "'format' must be 'pagetrace-trace'"),
    ([{"format": "pagetrace-trace", "version": "1"}], "'version' must be a positive integer"),
    ([{"format": "pagetrace-trace", "version": 1}], "holds only its header"),
    ([{"format": "pagetrace-trace", "version": 1, "hashes_only": True}], "must give the 'block_size'"),
    ([{"format": "pagetrace-trace", "version": 1, "hashes_only": True, "block_size": 16}, {"prompt": [1, 2], "output_len": 1}], "'prompt' token ids in a hashes-only trace"),
    ([{"prompt": [1, 2], "output_len": 1, "time": -1}], "'time' must be a number"),
    ([{"prompt": [1, 2], "output_len": 1}, {"format": "pagetrace-trace", "version": 1}], "only as the first line"),
    ([{"prompt": [1, 2], "n": 2, "outputs": [[1]]}], "one list of token ids per sample"),
])
def test_bad_traces_exit_2_with_one_line(tmp_path, capsys, lines, words):
    result = cli(capsys, "simulate", "--trace", write(tmp_path, lines), "--block-size", "16")
    assert_usage_error(result, "--trace")
    assert words in result[2]


def test_events_bad_input(tmp_path, capsys):
    path = write(tmp_path, [{"prompt": [1, 2, 3, 4, 5], "output_len": 2}])
    assert_usage_error(cli(capsys, "simulate", "--events", "x.kvev"), "--events")
    assert_usage_error(cli(capsys, "simulate", "--trace", path, "--events", str(tmp_path / "missing")), "--events")
    (tmp_path / "junk").write_bytes(b"hello")
    result = cli(capsys, "simulate", "--trace", path, "--events", str(tmp_path / "junk"))
    assert_usage_error(result, "--events")
    assert "not a pagetrace KV events file" in result[2]
    assert_usage_error(cli(capsys, "simulate", "--trace", path, "--events", "x", "--policy", "sglang"), "--policy")
    assert_usage_error(cli(capsys, "simulate", "--trace", path, "--events-bind"), "--events-bind")
    assert_usage_error(cli(capsys, "simulate", "--trace", path, "--events", "x", "--events-timeout", "0"), "--events-timeout")



def test_what_if_runs_each_setting_on_the_same_trace(tmp_path, capsys):
    path = write(tmp_path, [{"prompt": list(range(1, 41)) + [100 + i], "output_len": 6, "arrival": i} for i in range(12)])
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "8", "--num-blocks", "24", "--json",
                         "--what-if", "num-blocks=12", "--what-if", "block-size=16", "--what-if", "prefix-caching=off",
                         "--what-if", "policy=sglang,num-blocks=40", "--what-if-chart", str(tmp_path / "w.svg"))
    assert code == 0, err
    rows = {r["label"]: r for r in json.loads(out)["what_if"]}
    assert list(rows) == ["as given", "num-blocks=12", "block-size=16", "prefix-caching=off", "num-blocks=40,policy=sglang"]
    assert rows["as given"]["hit_tokens"] == 11 * 40  # 5 blocks of 8 shared by every request after the first
    assert rows["block-size=16"]["hit_tokens"] == 11 * 32  # 2 whole blocks of 16
    assert rows["prefix-caching=off"]["hit_tokens"] == 0
    assert rows["num-blocks=12"]["peak_used_blocks"] <= 11
    svg = (tmp_path / "w.svg").read_text()
    assert svg.count("<polyline") == 5 and "prefix-caching=off: hit rate 0.0%" in svg
    code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "8", "--num-blocks", "24", "--what-if", "num-blocks=12")
    assert code == 0 and "what if" in out and "num-blocks=12" in out


@pytest.mark.parametrize("spec, words", [
    ("num-blocks", "key=value"), ("colour=red", "keys: num-blocks"), ("policy=orca", "policy must be one of"),
    ("prefix-caching=maybe", "on or off"), ("block-size=0", "positive integer"), ("num-blocks=2", "a request stores"),
])
def test_bad_what_if(tmp_path, capsys, spec, words):
    path = write(tmp_path, [{"prompt": list(range(1, 41)), "output_len": 6}])
    result = cli(capsys, "simulate", "--trace", path, "--block-size", "8", "--num-blocks", "24", "--what-if", spec)
    assert_usage_error(result, "--what-if")
    assert words in result[2]




def sample_records():
    shared = list(range(1, 9))  # two blocks of 4
    return [
        TraceRecord("a", shared + [100, 101], 3, arrival=0, outputs=[[200, 201, 202]]),
        TraceRecord("b", shared + [110], 3, arrival=10, outputs=[[210, 211, 212]]),
        TraceRecord("c", shared + [120, 121, 122], 2, arrival=20, outputs=[[220, 221], [230, 231]], n=2),
        TraceRecord("d", shared + [130], 2, arrival=30, outputs=[[240, 241]], cache_salt="s"),
    ]


def test_hashes_only_trace_simulates_like_the_tokens(tmp_path, capsys):
    docs = {}
    for hashes_only in (False, True):
        w = TraceWriter(TraceHeader(block_size=4, hashes_only=hashes_only))
        for r in sample_records():
            w.add(r)
        path = str(tmp_path / f"t{hashes_only}.jsonl")
        w.write(path)
        text = open(path).read()
        assert ('"prompt":' in text) != hashes_only and ("cache_salt" in text) != hashes_only
        code, out, err = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "12", "--json")
        assert code == 0, err
        docs[hashes_only] = json.loads(out)
    strip = lambda d: [(r["id"], r["num_cached_tokens"], r["first_scheduled"], r["finished"]) for r in d["requests"]]
    assert strip(docs[False]) == strip(docs[True])
    assert [r["num_cached_tokens"] for r in docs[True]["requests"]] == [0, 8, 8, 8, 0]  # d: another salt
    result = cli(capsys, "simulate", "--trace", str(tmp_path / "tTrue.jsonl"), "--block-size", "8")
    assert_usage_error(result, "--block-size")
    assert "hashes of 4-token blocks" in result[2]
