"""Hybrid models without vLLM: vLLM's grouping of layers, the sliding window's arithmetic by
hand, and the options' bad input. (tests/sim/test_sim_hybrid_vllm.py holds the same policy
to vLLM's own coordinator, step by step.)"""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli
from sim_drive import drive

from pagetrace.sim.capacity import ModelDims, capacity
from pagetrace.sim.hybrid import FULL, SLIDING, HybridVllmPrefixCaching, KVGroup, LayerKind, kv_cache_groups, parse_layers
from pagetrace.sim.request import SimRequest
from pagetrace.sim.scheduler import Scheduler, SchedulerConfig

F, S = LayerKind(FULL), LayerKind(SLIDING, 40)


def test_groups_as_vllm_makes_them():
    # Gemma 3's 5:1: 10 sliding + 2 full -> group size 2 (the smaller bucket), 5 sliding groups and 1 full
    groups, size = kv_cache_groups(([S] * 5 + [F]) * 2)
    assert size == 2 and [(g.kind, g.layers) for g in groups] == [(S, 2)] * 5 + [(F, 2)]
    # gpt-oss-20b + a drafter: 12 sliding + 13 full, 13 < 1.5 x 12 -> group size 13, one group each (the sliding one padded)
    groups, size = kv_cache_groups([S, F] * 12 + [F])
    assert size == 13 and [(g.kind, g.layers) for g in groups] == [(S, 12), (F, 13)]
    # one kind only: one group of every layer
    assert kv_cache_groups([F] * 4) == ([KVGroup(F, 4)], 4)
    # 3 full + 7 sliding: 7 >= 4.5 -> group size 3, sliding split in cdiv(7, 3) = 3 groups of 3, 2, 2 (layer i to group i % 3)
    groups, size = kv_cache_groups([F] * 3 + [S] * 7)
    assert size == 3 and [g.layers for g in groups] == [3, 3, 2, 2]


def test_parse_layers():
    assert parse_layers("full:1,sliding:40:2") == [F, S, S]
    for bad in ("sliding:0:3", "full:0", "sliding:40:0", "full", "sliding:40", "local:3", "full:x", "full:\u0663", "full:-1"):
        with pytest.raises(ValueError):
            parse_layers(bad)


def _run(retention):
    """One full and one sliding (window 40) group, block size 16, 24 blocks; a 100-token prompt
    with 3 output tokens, then the same prompt again."""
    policy = HybridVllmPrefixCaching([KVGroup(F, 1), KVGroup(S, 1)], 24, 16, retention=retention)
    sched = Scheduler(policy, SchedulerConfig(4096, 8, True))
    prompt = list(range(1000, 1100))
    reqs = [SimRequest("a", prompt, [1, 2, 3]), SimRequest("b", prompt, [4, 5], arrival=5)]
    tables, orders = [], []
    for rec in drive(sched, reqs, 100):
        tables.append({r.request_id: policy.group_tables(r.request_id) for r in sched.running})
        orders.append((policy.pool.queue.order(), rec))
    return tables, reqs, orders


def test_sliding_window_frees_and_hits_by_hand():
    tables, (a, b), orders = _run(0)
    # step 0: cdiv(100, 16) = 7 blocks per group, the full group first: 1..7, then 8..14
    assert tables[0] == {"a": [[1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14]]}
    # step 1 (100 computed): 100 - 40 + 1 = 61 tokens left the window, 61 // 16 = 3 blocks -> null
    assert tables[1] == {"a": [[1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 11, 12, 13, 14]]}
    # the replay boundary is token 99 (block 6): the sliding group cached the cdiv(39, 16) = 3 blocks
    # before it (idx 3..5 = 11, 12, 13); 8, 9, 10 left uncached, so they went to the front of the queue
    assert orders[1][0][:4] == [10, 9, 8, 15]
    # empty slots after step 0: each group's 7 blocks hold 112 slots for 100 tokens: 2 x 12;
    # after step 1 (101 tokens) 2 x 11; blocks in use 14, then 11 (3 left the window)
    assert [(rec.empty_slots, rec.used_blocks) for _, rec in orders[:2]] == [(24, 14), (22, 11)]
    # b: at most 99 tokens hit -> 6 blocks; the full group's 1..6, the sliding group's last 3 (cached);
    # 96 - 39 = 57 tokens skipped -> 3 nulls first
    assert b.num_cached_tokens == 96
    assert tables[5]["b"][0][:6] == [1, 2, 3, 4, 5, 6] and tables[5]["b"][1][:6] == [0, 0, 0, 11, 12, 13]


def test_dense_retention_caches_every_sliding_block():
    _, (a, b), orders = _run(None)
    assert b.num_cached_tokens == 96
    # with every block cached, the three that left the window are cached and go to the back of the queue
    assert orders[1][0][:1] == [15] and orders[1][0][-3:] == [10, 9, 8]


def test_capacity_splits_the_pool_by_group():
    # 12 layers (5 sliding of window 1024, 1 full, twice), 4 KV heads x 256, bf16, block size 16:
    # a page is 16 x 4 x 2 x 256 x 2 = 65,536 bytes per layer; group size 2 -> 131,072 bytes a block;
    # 1 GiB -> 8,192 blocks. A 4,096-token request: each sliding group cdiv(1023, 16) + 1 = 65
    # blocks, the full group 256: 5 x 65 + 256 = 581; 8,191 // 581 = 14 requests.
    kinds = ([LayerKind(SLIDING, 1024)] * 5 + [F]) * 2
    cap = capacity(ModelDims(12, 4, 256, "bf16"), 2**30, 16, 4096, kinds)
    assert (cap.bytes_per_block, cap.num_blocks, cap.blocks_per_request, cap.requests) == (131_072, 8192, 581, 14)
    assert [g["blocks_per_request"] for g in cap.groups] == [65] * 5 + [256]
    assert cap.tokens == (8191 - 5 * 65) * 16  # one sequence: the full group holds every token


def _config(tmp_path, **fields):
    cfg = {"num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 128,
           "torch_dtype": "bfloat16", "sliding_window": 64,
           "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"], **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_capacity_command_hybrid_config(tmp_path, capsys):
    code, out, _ = cli(capsys, "capacity", "--config", _config(tmp_path), "--memory", "1MiB", "--length", "256", "--json")
    doc = json.loads(out)
    # 3 sliding + 1 full: 3 >= 1.5 -> group size 1; a block 16 x 2 x 2 x 32 x 2 = 4,096 bytes; 256 blocks
    assert code == 0 and doc["num_blocks"] == 256 and len(doc["groups"]) == 4
    assert [g["blocks_per_request"] for g in doc["groups"]] == [5, 5, 5, 16]  # cdiv(63, 16) + 1 = 5


def test_simulate_layers_shows_groups(capsys):
    code, out, _ = cli(capsys, "simulate", "--requests", "20", "--layers", "full:1,sliding:64:2", "--num-blocks", "600", "--json")
    doc = json.loads(out)
    groups = doc["summary"]["kv_cache_groups"]
    # 1 full + 2 sliding: 2 >= 1.5 x 1 -> group size 1, three groups
    assert code == 0 and [g["window"] for g in groups] == [None, 64, 64]
    assert groups[1]["peak_blocks"] < groups[0]["peak_blocks"]


@pytest.mark.parametrize("args,option", [
    (["--layers", "sliding:0:3"], "--layers"),
    (["--layers", "full:0"], "--layers"),
    (["--layers", "full:2,sliding:64:0"], "--layers"),
    (["--layers", "banana"], "--layers"),
    (["--layers", "full:1,sliding:64:1", "--policy", "sglang"], "--layers"),
])
def test_simulate_bad_layers(capsys, args, option):
    assert_usage_error(cli(capsys, "simulate", "--requests", "5", *args), option)


@pytest.mark.parametrize("fields", [{"sliding_window": 0}, {"layer_types": ["sliding_attention"] * 5},
                                    {"layer_types": ["sliding_attention", "mamba", "full_attention", "full_attention"]},
                                    {"layer_types": []}])
def test_bad_hybrid_config(tmp_path, capsys, fields):
    path = _config(tmp_path, **fields)
    assert_usage_error(cli(capsys, "simulate", "--requests", "5", "--config", path), "--config")
    assert_usage_error(cli(capsys, "capacity", "--config", path), "--config")


@pytest.mark.parametrize("spec", ["sliding:0:2,full:1", "full:1,sliding:64:0", "full:2,banana:3", "sliding:64"])
def test_capacity_bad_layers(capsys, spec):
    assert_usage_error(cli(capsys, "capacity", "--layers", spec), "--layers")


def test_capacity_layers_spec_equals_config(tmp_path, capsys):
    by_spec = json.loads(cli(capsys, "capacity", "--layers", "sliding:64:3,full:1", "--kv-heads", "2", "--head-dim", "32",
                             "--memory", "1MiB", "--length", "256", "--json")[1])
    by_config = json.loads(cli(capsys, "capacity", "--config", _config(tmp_path), "--memory", "1MiB", "--length", "256", "--json")[1])
    assert by_spec["groups"] == by_config["groups"] and by_spec["num_blocks"] == by_config["num_blocks"] == 256
