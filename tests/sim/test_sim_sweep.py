"""The capacity sweep (pagetrace/sim/sweep.py, `simulate --sweep`) and the shape of Mooncake's
Figure 9 on its conversation trace: with nothing evicted the hit rate is the trace's own
theoretical maximum, computed here from `hash_ids` alone; a 3 M-token cache stays below half of it."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import pytest
from conftest import assert_usage_error, cli

from pagetrace.sim.sweep import PointSpec, WorkloadSource, parse_tokens, run_point, run_points
from pagetrace.sim.workload import SyntheticSpec

CONVERSATION = Path(__file__).parent.parent / "data" / "mooncake" / "conversation_trace.jsonl.gz"


def theoretical_max(path) -> float:
    """Prompt tokens whose 512-token block was a full block of an earlier request, over all prompt
    tokens: each prompt hits its leading blocks whose id was seen before, up to the block holding
    its last token (that token is computed again: vLLM's lookup stops at num_tokens - 1)."""
    seen: set[int] = set()
    hit = total = 0
    for line in gzip.open(path, "rt"):
        r = json.loads(line)
        length, ids = r["input_length"], r["hash_ids"]
        n = 0
        for h in ids[: (length - 1) // 512]:
            if h not in seen:
                break
            n += 1
        hit, total = hit + n * 512, total + length
        seen.update(ids[: length // 512])  # full blocks only are cached
    return hit / total


def test_figure_9_on_the_conversation_trace(capsys, tmp_path):
    best = theoretical_max(CONVERSATION)
    assert 0.37 < best < 0.38
    chart = tmp_path / "sweep.svg"
    code, out, err = cli(capsys, "simulate", "--trace", str(CONVERSATION), "--max-num-batched-tokens", "8192",
                         "--sweep", "capacity=3M,inf", "--jobs", "2", "--json", "--sweep-chart", str(chart))
    assert code == 0, err
    small, everything = json.loads(out)["points"]
    assert everything["label"] == "inf (nothing evicted)" and everything["evictions"] == 0
    assert everything["hit_rate"] == pytest.approx(best, abs=1e-12)
    assert small["capacity_tokens"] >= 3_000_000 and small["num_blocks"] == 5861 and small["hit_rate"] < best / 2
    assert small["evictions"] > 0 and small["hit_rate"] > 0.05
    svg = chart.read_text()
    assert svg.startswith("<svg") and "nothing evicted: 37.3%" in svg and "13.6%" in svg


def spec(**kw):
    base = dict(workload=WorkloadSource("synthetic", synthetic=SyntheticSpec(60, (64, 128), (4, 16), 256, 1, 1.0, 3)),
                num_blocks=200, block_size=16)
    return PointSpec(**{**base, **kw})


def test_a_point_is_plain_data_in_and_out():
    s = spec(label="x")
    assert pickle.loads(pickle.dumps(s)) == s
    point = run_point(s)
    assert json.loads(json.dumps(point)) == point
    assert point["label"] == "x" and point["capacity_tokens"] == 199 * 16 and 0 < point["hit_rate"] < 1
    # 256 shared tokens = 16 blocks; every request after the first hits them once they are cached
    assert point["hit_tokens"] >= 40 * 256


def test_points_in_processes_equal_points_in_this_one():
    specs = [spec(num_blocks=n) for n in (40, 80, 400)]
    here = run_points(specs, jobs=1)
    there = run_points(specs, jobs=2)
    strip = lambda ps: [{k: v for k, v in p.items() if k != "seconds"} for p in ps]  # noqa: E731
    assert strip(here) == strip(there)
    assert [p["num_blocks"] for p in there] == [40, 80, 400]
    assert here[0]["hit_rate"] <= here[2]["hit_rate"] and here[0]["peak_used_share"] >= here[2]["peak_used_share"]


def test_parse_tokens():
    assert [parse_tokens(t) for t in ("3000000", "3M", "512K", "1.5G")] == [3e6, 3e6, 512e3, 1.5e9]
    assert parse_tokens("inf") == float("inf")
    for bad in ("-1", "0", "3X", "M", ""):
        with pytest.raises(ValueError):
            parse_tokens(bad)


def test_the_sweep_table_and_grid(capsys):
    code, out, err = cli(capsys, "simulate", "--requests", "40", "--shared-prefix", "64", "--sweep", "num-blocks=64,inf",
                         "--sweep", "block-size=16,32", "--jobs", "1", "--json")
    assert code == 0, err
    points = json.loads(out)["points"]
    assert [(p["block_size"], p["label"]) for p in points] == [(16, "64 blocks, block size 16"), (16, "inf (nothing evicted), block size 16"),
                                                              (32, "64 blocks, block size 32"), (32, "inf (nothing evicted), block size 32")]
    code, out, err = cli(capsys, "simulate", "--requests", "40", "--sweep", "capacity=2K,8K", "--jobs", "1")
    assert code == 0 and "2K tokens" in out and "8K tokens" in out and "sweep: 2/2" in err


@pytest.mark.parametrize("args, option, words", [
    (("--sweep", "capacity"), "--sweep", "give KEY=V1,V2"),
    (("--sweep", "size=1,2"), "--sweep", "a key of: capacity"),
    (("--sweep", "capacity=3Q"), "--sweep", "token counts"),
    (("--sweep", "num-blocks=1"), "--sweep", "at least 2"),
    (("--sweep", "policy=lru"), "--sweep", "one of vllm, sglang"),
    (("--sweep", "capacity=1M", "--sweep", "num-blocks=10"), "--sweep", "one axis"),
    (("--sweep", "num-blocks=8"), "--sweep", "a request stores"),
    (("--sweep", "num-blocks=80", "--svg", "x.svg"), "--sweep", "drop --svg"),
    (("--jobs", "2"), "--jobs", "belongs to --sweep"),
    (("--sweep", "num-blocks=80", "--jobs", "0"), "--jobs", "at least 1"),
])
def test_bad_sweeps_exit_2_naming_the_option(capsys, args, option, words):
    result = cli(capsys, "simulate", "--requests", "10", *args)
    assert_usage_error(result, option)
    assert words in result[2]
