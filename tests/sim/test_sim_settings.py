"""A recording's settings as simulate's defaults (pagetrace/sim/settings.py): the trace's header
`server` object, then an events file's, then pagetrace's own; a contradicting flag is used and named."""

from __future__ import annotations

import json

from conftest import cli

from pagetrace.sim.settings import DEFAULTS, resolve

SERVER = {"block_size": 8, "num_blocks": 40, "max_num_batched_tokens": 64, "max_num_seqs": 3, "max_model_len": 96,
          "chunked_prefill": True, "prefix_caching": True, "hash_algo": "sha256", "vllm": "0.32.0", "model": "tiny"}


def write(tmp_path, server=None, block_size=8):
    header = {"format": "pagetrace-trace", "version": 1, "block_size": block_size, **({"server": server} if server else {})}
    lines = [header] + [{"id": f"r{i}", "prompt": list(range(1, 33)) + [100 + i], "output_len": 4, "arrival": i} for i in range(6)]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_resolve_prefers_the_flag_then_the_header_then_the_events_then_the_default():
    r = resolve({"num_blocks": 12, "block_size": None}, [("the trace's header", {"num_blocks": 40, "max_num_seqs": 3}),
                                                        ("the events file", {"max_num_seqs": 9, "block_size": 32})])
    assert r.values["num_blocks"] == 12 and r.values["max_num_seqs"] == 3 and r.values["block_size"] == 32
    assert r.values["max_num_batched_tokens"] == DEFAULTS["max_num_batched_tokens"]
    assert r.taken == {"block_size": "the events file", "max_num_seqs": "the trace's header"}
    assert r.overridden == {"num_blocks": {"given": 12, "server": 40, "source": "the trace's header"}}
    assert r.line() == "note: simulating with --num-blocks 12 (the server's: 40, the trace's header), as given"
    assert resolve({"num_blocks": 40}, [("h", {"num_blocks": 40})]).line() is None  # the same value is no contradiction
    assert resolve({"chunked_prefill": False}, [("h", {"chunked_prefill": True})]).line() == \
        "note: simulating with --no-chunked-prefill (the server's: on, h), as given"


def test_the_header_is_the_default_and_a_flag_is_named(tmp_path, capsys):
    path = write(tmp_path, SERVER)
    code, out, err = cli(capsys, "simulate", "--trace", path, "--json")
    config = json.loads(out)["config"]
    assert code == 0 and err == ""
    assert {k: config[k] for k in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len")} == \
        {"block_size": 8, "num_blocks": 40, "max_num_batched_tokens": 64, "max_num_seqs": 3, "max_model_len": 96}
    assert set(config["from_server"]) == {"block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                                          "chunked_prefill", "prefix_caching"} and config["overridden"] == {}
    code, out, err = cli(capsys, "simulate", "--trace", path, "--json", "--num-blocks", "20", "--max-num-seqs", "3")
    assert code == 0 and json.loads(out)["config"]["num_blocks"] == 20
    assert err.strip().splitlines() == ["note: simulating with --num-blocks 20 (the server's: 40, the trace's header), as given"]


def test_an_older_header_gives_its_block_size(tmp_path, capsys):
    """The issue's first finding: a header saying block_size 32 was simulated at 16."""
    code, out, err = cli(capsys, "simulate", "--trace", write(tmp_path, None, block_size=32), "--json")
    assert code == 0 and json.loads(out)["config"]["block_size"] == 32


def test_a_bad_server_object_exits_2(tmp_path, capsys):
    from conftest import assert_usage_error

    result = cli(capsys, "simulate", "--trace", write(tmp_path, {**SERVER, "num_blocks": "many"}))
    assert_usage_error(result, "--trace")
    assert "'server.num_blocks' must be a positive integer" in result[2]


def test_pagetrace_events_is_refused_in_one_line_where_it_cannot_be_written(tmp_path):
    import pytest

    from pagetrace.engines import vllm_plugin

    taken = tmp_path / "e.kvev"
    taken.write_bytes(b"")
    for env, words in (({"PAGETRACE_EVENTS": str(taken)}, "invalid value for PAGETRACE_EVENTS"),
                       ({"PAGETRACE_EVENTS": str(tmp_path / "no" / "e.kvev")}, "does not exist"),
                       ({"PAGETRACE_EVENTS": str(tmp_path / "x"), "PAGETRACE_TRACE": str(tmp_path / "x")}, "name the same file")):
        with pytest.raises(SystemExit) as exc:
            vllm_plugin._trace_from_env(env)
        assert str(exc.value).startswith("pagetrace: refusing to start vLLM: ") and words in str(exc.value)
    vllm_plugin.PATCHES.pop("vllm.v1.core.sched.scheduler", None)
