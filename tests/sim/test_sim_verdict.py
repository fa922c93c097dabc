"""The verdict of `simulate --events` (exit 1 on a divergence, a top-level `passed`) and what
likely differs (pagetrace/sim/likely.py), on the two-request workload of test_sim_compare.py:
A (tokens 1..8) at step 0, B (11..18) at step 5, block size 4; a pool of 4 blocks makes B's
allocation evict A's second block."""

from __future__ import annotations

import json

import pytest
from conftest import cli
from test_sim_compare import A, B, run, servers, stream, trace_text

from pagetrace.sim.compare import compare
from pagetrace.sim.events import BlockStored
from pagetrace.sim.vllm_hash import block_hashes

SETTINGS = {"num_blocks": 4, "max_num_batched_tokens": 4096, "max_num_seqs": 256}


def hints(c):
    return {h["setting"]: h for h in c.likely}


def test_equal_events_pass_with_no_hint():
    result, trace = run()
    c = compare(result, trace, stream(*servers()[0]), 4, SETTINGS)
    assert c.passed and c.likely == []


def test_a_server_that_evicts_where_the_simulation_had_room_has_a_smaller_pool():
    result, trace = run(num_blocks=8)  # no eviction here; the server (4 blocks) evicts A's second block
    c = compare(result, trace, stream(*servers()[0]), 4, {**SETTINGS, "num_blocks": 8})
    assert not c.passed and list(hints(c)) == ["num_blocks"]
    assert "the server evicted a cached block (message 1, event 0) where the simulated pool of 8 blocks" in hints(c)["num_blocks"]["why"]
    assert "likely smaller" in hints(c)["num_blocks"]["why"]


def test_a_simulation_that_evicts_where_the_server_did_not_has_a_smaller_pool():
    result, trace = run()  # evicts at step 5; the server kept A's block
    msgs, _, hb = servers()
    c = compare(result, trace, stream(msgs[0], msgs[2]), 4, SETTINGS)
    assert list(hints(c)) == ["num_blocks"] and "likely larger than 4 blocks" in hints(c)["num_blocks"]["why"]


def budget_case(server_budget):
    """A (4 prompt tokens, 5 out) and B (5, 4) at step 0, block size 4: the server's trace with
    its step lines and its events, as a server with `server_budget` runs them (the simulator
    standing in for it: its events in vLLM's hashes)."""
    from pagetrace.sim.run import simulate
    from pagetrace.sim.scheduler import SchedulerConfig
    from pagetrace.sim.workload import read_trace

    toks = {"A": (list(range(1, 5)), [50, 51, 52, 53, 54]), "B": (list(range(11, 16)), [60, 61, 62, 63])}
    lines = [{"id": rid, "prompt": p, "output": o} for rid, (p, o) in toks.items()]
    served = simulate(read_trace("".join(json.dumps(x) + "\n" for x in lines), 4).requests, 16, 4,
                      SchedulerConfig(server_budget, 16, True), record_events=True)
    hashes = {rid: block_hashes(p + o, 4) for rid, (p, o) in toks.items()}
    msgs = [[BlockStored([hashes[e[1]][i] for i in range(e[2], e[2] + len(e[3]))], None, [], 4) for e in log]
            for _, log in served.events if log]
    steps = [{"step": s.step, "tokens": s.tokens} for s in served.steps]
    return "".join(json.dumps(x) + "\n" for x in lines + steps), msgs


@pytest.mark.parametrize("server_budget, simulated, words", [(8, 16, "at step 0 the server scheduled 8 tokens where the simulation scheduled 9: "
                                                                          "the server admitted fewer tokens than the simulated budget allows (max_num_batched_tokens 16"),
                                                             (16, 8, "at step 0 the server scheduled 9 tokens where the simulation scheduled 8: "
                                                                     "the server admitted more tokens in one step")])
def test_a_step_that_ran_other_tokens_on_the_server_names_the_budget(server_budget, simulated, words):
    """The events diverge (B's second block fills before A's on one side only); the trace's
    step lines say where: step 0, where the chunk of B's prompt differs."""
    from pagetrace.sim.run import simulate
    from pagetrace.sim.scheduler import SchedulerConfig
    from pagetrace.sim.workload import read_trace

    text, msgs = budget_case(server_budget)
    trace = read_trace(text, 4)
    assert sorted(trace.steps) == list(range(len(trace.steps))) and trace.steps[0] == {"tokens": min(9, server_budget)}
    result = simulate(trace.requests, 16, 4, SchedulerConfig(simulated, 16, True), record_events=True)
    c = compare(result, trace, stream(*msgs), 4, {**SETTINGS, "max_num_batched_tokens": simulated, "max_num_seqs": 16})
    assert not c.passed and list(hints(c)) == ["max_num_batched_tokens"], c.likely
    assert words in hints(c)["max_num_batched_tokens"]["why"] and hints(c)["max_num_batched_tokens"]["step"] == 0
    same = simulate(read_trace(text, 4).requests, 16, 4, SchedulerConfig(server_budget, 16, True), record_events=True)
    assert compare(same, trace, stream(*msgs), 4, SETTINGS).passed  # at the server's own budget: equal


def test_another_block_size_is_named_from_the_events_and_the_header():
    result, trace = run()
    c = compare(result, trace, stream([BlockStored(block_hashes(A, 8), None, A, 8)]), 4, SETTINGS)
    assert hints(c)["block_size"] == {"setting": "block_size", "simulated": 4, "server": 8,
                                      "why": "the server's BlockStored events hold 8-token blocks; the simulation's hold 4"}
    result, trace = run(trace_text({"block_size": 8}))
    c = compare(result, trace, stream(), 4, SETTINGS)
    assert hints(c)["block_size"]["server"] == 8 and "the trace's header says" in hints(c)["block_size"]["why"]


def kvev(tmp_path, msgs):
    msgspec = pytest.importorskip("msgspec", reason="msgspec (vLLM's msgpack library, in the vllm extra) is not installed")
    from pagetrace.sim import events as ev

    def event(e):
        if isinstance(e, BlockStored):
            return {"type": "BlockStored", "block_hashes": e.block_hashes, "parent_block_hash": e.parent_block_hash,
                    "token_ids": e.token_ids, "block_size": e.block_size}
        return {"type": "BlockRemoved", "block_hashes": e.block_hashes}

    frames = [[b"kv-events", k.to_bytes(8, "big"), msgspec.msgpack.encode([float(k), [event(e) for e in m]])] for k, m in enumerate(msgs)]
    path = tmp_path / "e.kvev"
    path.write_bytes(ev.file_bytes([(f, 1.0) for f in frames]))
    return str(path)


@pytest.mark.parametrize("num_blocks, code", [("4", 0), ("8", 1)])
def test_the_exit_code_and_passed_are_the_verdict(tmp_path, capsys, num_blocks, code):
    (tmp_path / "t.jsonl").write_text(trace_text())
    events = kvev(tmp_path, servers()[0])
    args = ("simulate", "--trace", str(tmp_path / "t.jsonl"), "--events", events, "--block-size", "4", "--num-blocks", num_blocks)
    got, out, err = cli(capsys, *args, "--json")
    doc = json.loads(out)
    assert got == code and doc["passed"] is (code == 0) and list(doc)[0] == "passed", err
    assert [h["setting"] for h in doc["events"]["likely"]] == ([] if code == 0 else ["num_blocks"])
    got, out, _ = cli(capsys, *args)
    assert got == code
    last = out.strip().splitlines()[-1]
    assert last.startswith("passed: the server's 5 block events") if code == 0 else \
        last == "failed: the prediction diverges from the server's events at event 2 (num_blocks likely differs)"
    if code:
        assert "likely: num_blocks: the server evicted a cached block" in out
