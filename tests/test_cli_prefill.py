"""`pagetrace run` on prefill and mixed batches: the per-query table, the mask, the variants."""

import json

import pytest
from conftest import assert_usage_error, cli


def run_json(capsys, *args):
    code, out, err = cli(capsys, "run", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_prefill_of_the_worked_example(capsys):
    doc = run_json(capsys, "--tokens", "38", "--query-len", "6", "--query", "0")
    seq = doc["sequences"][0]
    assert doc["checks"]["passed"] and doc["config"]["query_lens"] == [6]
    assert seq["query"] == {"index": 0, "position": 32, "row": 0}
    masks = [row["mask"] for row in seq["rows"]]
    assert masks == ["visible"] * 33 + ["causal"] * 5  # query 0 of 6 sits at position 32
    assert all(row["weights"][0] == 0 for row in seq["rows"][33:])
    # the mask map: rows p = 32..37, blocks of 16 keys: 0-15, 16-31 seen whole, 32-37 in part until the last query
    assert [(m["position"], m["blocks"]) for m in doc["mask_map"]] == [(p, "██░") for p in range(32, 37)] + [(37, "███")]


def test_prefill_table_and_mask_map_in_the_terminal(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38", "--query-len", "6", "--sliding-window", "20")
    assert code == 0, err
    assert "mask map, sequence 0" in out and "p=35" in out and "w█░" in out
    assert "window" in out and "new token 5 of 6 in sequence 0, at position 37" in out


@pytest.mark.parametrize("extra", [
    ["--dtype", "fp8_e4m3", "--k-scale", "0.5", "--v-scale", "2"],
    ["--dtype", "fp8_e5m2", "--soft-cap", "3", "--alibi", "--heads", "4", "--kv-heads", "2", "--layout", "vllm", "--head-dim", "16"],
])
def test_variants_are_checked_against_the_reference(capsys, extra):
    doc = run_json(capsys, "--tokens", "40,7", "--query-len", "9,1", "--partition-size", "16", *extra)
    assert doc["checks"]["passed"] and doc["checks"]["slots_match"]
    parts = [row["partition"] for row in doc["sequences"][0]["rows"]]
    assert parts == [t // 16 for t in range(40)]


@pytest.mark.parametrize("args, option", [
    (["--query-len", "39"], "--query-len"),
    (["--query-len", "0"], "--query-len"),
    (["--query-len", "1,2"], "--query-len"),
    (["--query-len", "6", "--query", "6"], "--query"),
    (["--sliding-window", "0"], "--sliding-window"),
    (["--soft-cap", "nan"], "--soft-cap"),
    (["--k-scale", "2"], "--k-scale"),
    (["--dtype", "fp8_e4m3", "--v-scale", "0"], "--v-scale"),
    (["--partition-size", "24"], "--partition-size"),
])
def test_bad_prefill_options(capsys, args, option):
    assert_usage_error(cli(capsys, "run", "--tokens", "38", *args), option)
