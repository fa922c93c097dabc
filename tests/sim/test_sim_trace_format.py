"""The trace format line by line (pagetrace/sim/trace.py): the header and each request as a
recorder writes them, the header's refusals, and what `simulate --trace` reads back.

The expected lines are written out by hand from docs/simulate.md's format; the block hashes
of a hashes-only trace are held to vLLM's own `hash_block_tokens`
(vllm/v1/core/kv_cache_utils.py, vLLM 0.32) where vLLM is installed.
"""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli

from pagetrace.errors import UsageError
from pagetrace.sim.trace import FORMAT, VERSION, TraceHeader, TraceRecord, TraceWriter, header_from_json
from pagetrace.sim.workload import read_trace


def lines(writer: TraceWriter) -> list[dict]:
    text = writer.text()
    assert text.endswith("\n") and "\n\n" not in text and ": " not in text and ", " not in text  # compact, one per line
    return [json.loads(x) for x in text.splitlines()]


def test_the_header_line():
    assert (FORMAT, VERSION) == ("pagetrace-trace", 1)
    assert TraceHeader(block_size=16).to_json() == {"format": "pagetrace-trace", "version": 1, "block_size": 16,
                                                    "hashes_only": False, "hash": {"algo": "sha256", "seed": None}}
    h = TraceHeader(block_size=32, hashes_only=True, hash_seed="7", source={"recorder": "pagetrace record"})
    assert h.to_json() == {"format": "pagetrace-trace", "version": 1, "block_size": 32, "hashes_only": True,
                           "hash": {"algo": "sha256", "seed": "7"}, "source": {"recorder": "pagetrace record"}}
    assert TraceHeader().to_json()["block_size"] is None


@pytest.mark.parametrize("header", [TraceHeader(), TraceHeader(block_size=16), TraceHeader(block_size=4, hashes_only=True),
                                    TraceHeader(block_size=8, hash_algo="xxhash", hash_seed="0", source={"sequential": False})])
def test_a_header_reads_back_as_written(header):
    assert header_from_json(json.loads(json.dumps(header.to_json()))) == header


def test_a_header_of_the_fewest_fields():
    assert header_from_json({"format": "pagetrace-trace", "version": 1}) == TraceHeader(1, None, False, "sha256", None, {})
    h = header_from_json({"format": "pagetrace-trace", "version": 1, "hash": {"seed": "3"}, "hashes_only": 1, "block_size": 1})
    assert (h.hash_algo, h.hash_seed, h.hashes_only, h.block_size) == ("sha256", "3", True, 1)
    assert header_from_json({"format": "pagetrace-trace", "version": 1, "hash": None, "source": None}).source == {}


@pytest.mark.parametrize("fields, value, reason", [
    ({"format": "pagetrace"}, "pagetrace", "trace line 3: 'format' must be 'pagetrace-trace'"),
    ({"format": None}, None, "trace line 3: 'format' must be 'pagetrace-trace'"),
    ({"version": 0}, 0, "trace line 3: 'version' must be a positive integer"),
    ({"version": -1}, -1, "trace line 3: 'version' must be a positive integer"),
    ({"version": True}, True, "trace line 3: 'version' must be a positive integer"),
    ({"version": 1.0}, 1.0, "trace line 3: 'version' must be a positive integer"),
    ({"version": None}, None, "trace line 3: 'version' must be a positive integer"),
    ({"version": 2}, 2, "the trace is format version 2, written by a newer pagetrace; this one reads versions up to 1: upgrade pagetrace"),
    ({"block_size": 0}, 0, "trace line 3: 'block_size' must be a positive integer"),
    ({"block_size": True}, True, "trace line 3: 'block_size' must be a positive integer"),
    ({"block_size": "16"}, "16", "trace line 3: 'block_size' must be a positive integer"),
    ({"hash": "sha256"}, "sha256", "trace line 3: 'hash' must be an object {algo, seed}"),
    ({"hash": ["sha256", "0123456789012345678901234567890123456789xyz"]}, "['sha256', '0123456789012345678901234567",
     "trace line 3: 'hash' must be an object {algo, seed}"),
    ({"hashes_only": True}, None, "trace line 3: a hashes-only trace must give the 'block_size' of its hashes"),
])
def test_bad_headers_name_the_line_and_the_value(fields, value, reason):
    with pytest.raises(UsageError) as exc:
        header_from_json({"format": "pagetrace-trace", "version": 1, **fields}, line=3)
    assert (exc.value.option, exc.value.value, exc.value.reason) == ("--trace", value, reason)


def test_a_header_names_line_one_unless_told():
    with pytest.raises(UsageError) as exc:
        header_from_json({"format": "x"})
    assert exc.value.reason.startswith("trace line 1: ")


def test_a_hashes_only_writer_needs_a_block_size():
    with pytest.raises(ValueError) as exc:
        TraceWriter(TraceHeader(hashes_only=True))
    assert str(exc.value) == "a hashes-only trace needs the block size of its hashes"
    TraceWriter(TraceHeader(hashes_only=True, block_size=1))
    TraceWriter(TraceHeader())


def test_request_lines_with_tokens():
    w = TraceWriter(TraceHeader(block_size=4))
    w.add(TraceRecord("a", [1, 2, 3], 8, arrival=2, time=0.12345649, outputs=[[7, 8]]))
    w.add(TraceRecord("b", [4, 5], 3, outputs=[[9], [10, 11, 12]], n=2, cache_salt="s", lora_name="sql", priority=-1,
                      seq=5, client_id="cmpl-b"))
    w.add(TraceRecord("c", [6], 5, time=0.0))  # not answered: no output, output_len its max_tokens
    w.add(TraceRecord("d", [6], 5, outputs=[]))
    head, a, b, c, d = lines(w)
    assert head == TraceHeader(block_size=4).to_json()
    assert a == {"id": "a", "arrival": 2, "time": 0.123456, "prompt": [1, 2, 3], "output": [7, 8], "output_len": 2, "max_tokens": 8}
    assert b == {"id": "b", "arrival": 0, "prompt": [4, 5], "outputs": [[9], [10, 11, 12]], "output_len": 3, "max_tokens": 3,
                 "seq": 5, "client_id": "cmpl-b", "n": 2, "cache_salt": "s", "lora_name": "sql", "priority": -1}
    assert c == {"id": "c", "arrival": 0, "time": 0.0, "prompt": [6], "output_len": 5, "max_tokens": 5}
    assert d == {"id": "d", "arrival": 0, "prompt": [6], "output_len": 5, "max_tokens": 5}
    assert lines(TraceWriter(TraceHeader())) == [TraceHeader().to_json()]  # no request: the header alone


def test_a_tokens_trace_reads_back_as_its_requests():
    w = TraceWriter(TraceHeader(block_size=4))
    w.add(TraceRecord("a", [1, 2, 3, 4, 5], 8, arrival=1, outputs=[[7, 8]]))
    w.add(TraceRecord("b", [1, 2, 3, 4, 6], 3, outputs=[[9], [10, 11, 12]], n=2, cache_salt="s", seq=0))
    trace = read_trace(w.text(), 4)
    assert trace.header == TraceHeader(block_size=4)
    got = [(r.request_id, r.arrival, list(r.prompt), list(r.output), r.cache_salt) for r in trace.requests]
    assert got == [("b.0", 0, [1, 2, 3, 4, 6], [9], "s"), ("b.1", 0, [1, 2, 3, 4, 6], [10, 11, 12], "s"),
                   ("a", 1, [1, 2, 3, 4, 5], [7, 8], None)]


def vllm_hashes(tokens, block_size, salt=None, seed=None):
    """vLLM's own chain (kv_cache_utils.hash_block_tokens over vllm.utils.hashing.sha256), in
    the form its events carry (maybe_convert_block_hash)."""
    u = pytest.importorskip("vllm.v1.core.kv_cache_utils", reason="vLLM is not installed: its hash_block_tokens is the reference")
    from vllm.utils.hashing import sha256

    with pytest.MonkeyPatch.context() as mp:
        if seed is None:
            mp.delenv("PYTHONHASHSEED", raising=False)
        else:
            mp.setenv("PYTHONHASHSEED", seed)
        u.init_none_hash(sha256)
        parent, out = None, []
        for i in range(len(tokens) // block_size):
            extra = (("cache_salt", salt),) if salt and i == 0 else None
            parent = u.hash_block_tokens(sha256, parent, tokens[i * block_size:(i + 1) * block_size], extra)
            out.append(u.maybe_convert_block_hash(parent))
    return out


def test_a_hashes_only_trace_holds_vllms_hashes_and_no_token():
    prompt, output = list(range(100, 110)), [200, 201, 202]  # 13 tokens: 3 full blocks of 4
    w = TraceWriter(TraceHeader(block_size=4, hashes_only=True, hash_seed="7"))
    w.add(TraceRecord("a", prompt, 3, time=1.5, outputs=[output], cache_salt="s"))
    w.add(TraceRecord("b", prompt, 4, outputs=[output, [203, 204, 205, 206]], n=2))
    w.add(TraceRecord("c", prompt[:8], 2))  # no output: the prompt's 2 blocks
    w.add(TraceRecord("h", prompt, 3, outputs=[output], block_hashes=[11, 12, 13], seq=0))  # a hook's own hashes
    _, a, b, c, h = lines(w)
    assert a == {"id": "a", "arrival": 0, "time": 1.5, "prompt_len": 10, "block_hashes": vllm_hashes(prompt + output, 4, "s", "7"),
                 "output_len": 3, "max_tokens": 3}  # the salt: inside the first hash, not written
    assert len(a["block_hashes"]) == 3
    assert b == {"id": "b", "arrival": 0, "prompt_len": 10, "block_hashes": [vllm_hashes(prompt + output, 4, None, "7"),
                                                                             vllm_hashes(prompt + [203, 204, 205, 206], 4, None, "7")],
                 "output_lens": [3, 4], "output_len": 4, "max_tokens": 4, "n": 2}
    assert [len(x) for x in b["block_hashes"]] == [3, 3]
    assert c == {"id": "c", "arrival": 0, "prompt_len": 8, "block_hashes": vllm_hashes(prompt[:8], 4, None, "7"), "output_len": 2, "max_tokens": 2}
    assert h == {"id": "h", "arrival": 0, "prompt_len": 10, "block_hashes": [11, 12, 13], "output_len": 3, "max_tokens": 3, "seq": 0}
    assert '"prompt"' not in w.text() and "[100," not in w.text() and '"s"' not in w.text()
    # read back: the hashes given per request and sample
    trace = read_trace(w.text(), 4)
    assert trace.given_hashes == {"a": a["block_hashes"], "b.0": b["block_hashes"][0], "b.1": b["block_hashes"][1],
                                  "c": c["block_hashes"], "h": [11, 12, 13]}
    assert {r.request_id: (r.prompt_len, len(r.output)) for r in trace.requests} == {"a": (10, 3), "b.0": (10, 3), "b.1": (10, 4),
                                                                                      "c": (8, 2), "h": (10, 3)}


@pytest.mark.parametrize("lens", [[3], [3, 4, 5], [0, 3], [True, 3], "3,4", [3, 4.0]])
def test_bad_output_lens(tmp_path, capsys, lens):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"prompt": [1, 2, 3], "output_len": 4, "n": 2, "output_lens": lens}) + "\n")
    result = cli(capsys, "simulate", "--trace", str(path), "--block-size", "4")
    assert_usage_error(result, "--trace")
    assert "trace line 1, field 'output_lens' must hold one positive integer per sample (n=2)" in result[2]


def test_output_lens_without_token_ids():
    trace = read_trace(json.dumps({"prompt_len": 5, "output_len": 4, "n": 2, "output_lens": [1, 4]}), 4)
    assert [(r.request_id, r.prompt_len, len(r.output)) for r in trace.requests] == [("0.0", 5, 1), ("0.1", 5, 4)]


def test_the_default_seed_is_vllms_default():
    w = TraceWriter(TraceHeader(block_size=4, hashes_only=True))
    w.add(TraceRecord("a", list(range(8)), 1))
    assert lines(w)[1]["block_hashes"] == vllm_hashes(list(range(8)), 4)


def test_write_puts_the_text_in_the_file(tmp_path, capsys):
    w = TraceWriter(TraceHeader(block_size=4))
    w.add(TraceRecord("a", list(range(1, 9)), 2, outputs=[[50, 51]]))
    path = tmp_path / "t.jsonl"
    assert w.write(str(path)) == str(path)
    assert path.read_text() == w.text()
    code, out, err = cli(capsys, "simulate", "--trace", str(path), "--block-size", "4", "--num-blocks", "8", "--json")
    assert code == 0, err
    assert [(r["id"], r["prompt_tokens"], r["output_tokens"]) for r in json.loads(out)["requests"]] == [("a", 8, 2)]


def test_the_newest_version_is_read_and_the_next_refused(tmp_path, capsys):
    ok = tmp_path / "ok.jsonl"
    ok.write_text(json.dumps({"format": "pagetrace-trace", "version": VERSION}) + "\n" + json.dumps({"prompt": [1, 2], "output_len": 1}) + "\n")
    assert cli(capsys, "simulate", "--trace", str(ok), "--block-size", "4")[0] == 0
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"format": "pagetrace-trace", "version": VERSION + 1}) + "\n" + json.dumps({"prompt": [1, 2], "output_len": 1}) + "\n")
    result = cli(capsys, "simulate", "--trace", str(newer), "--block-size", "4")
    assert_usage_error(result, "--trace")
    assert f"invalid value for --trace: {VERSION + 1}: the trace is format version {VERSION + 1}" in result[2]
