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


def test_prefill_diagram_shades_masked_keys(capsys, tmp_path):
    """Query 2 of 6 in a 38-token sequence sits at p = 34; with a window of 9 it sees keys 26..34.
    Each drawn logical block says how many of its keys that query does not see, and a block it
    sees none of is drawn in the masked colour, not by its (zero) attention mass."""
    import re

    from pagetrace.views.diagram.style import MASKED_FILL

    dot = tmp_path / "m.dot"
    code, _, err = cli(capsys, "run", "--tokens", "38,20", "--query-len", "6,1", "--sliding-window", "9", "--query", "2", "--dot", str(dot))
    assert code == 0, err
    cells = {m["id"]: m for m in (dict(re.findall(r'(\w+)="([^"]*)"', td)) for td in re.findall(r"<td [^>]*>", dot.read_text())) if "id" in m}
    p, w = 34, 9
    for b, (first, last) in enumerate([(0, 15), (16, 31), (32, 37)]):
        keys = range(first, last + 1)
        causal = sum(t > p for t in keys)
        window = sum(t <= p - w for t in keys)
        cell = cells[f"s0_l{b}"]
        if causal + window:
            assert f"{causal + window} of its {len(keys)} keys masked for the shown query ({causal} causal, {window} window)" in cell["title"]
        else:
            assert "masked" not in cell["title"]
        assert (cell["bgcolor"] == MASKED_FILL) == (causal + window == len(keys)), cell
    # seq 1 decodes its last token at p = 19: keys 0..10 fall outside the window
    assert "11 of its 16 keys masked for the shown query (0 causal, 11 window)" in cells["s1_l0"]["title"]
    assert "masked" not in cells["s1_l1"]["title"]
    assert "keys the shown query does not see" in dot.read_text()
    code, _, err = cli(capsys, "run", "--tokens", "38", "--dot", str(dot))  # decode: nothing is masked, no legend line
    assert code == 0, err
    assert "masked" not in dot.read_text()


def test_json_coverage_counts_masked_keys_per_block(capsys):
    doc = run_json(capsys, "--tokens", "38", "--query-len", "6", "--query", "2", "--sliding-window", "9")
    p, w = 34, 9
    for block in doc["sequences"][0]["coverage"]:
        keys = range(block["first_token"], block["last_token"] + 1)
        assert block["causal_masked"] == sum(t > p for t in keys)
        assert block["window_masked"] == sum(t <= p - w for t in keys)
