"""`replay_layer` and `summarize` as a Python user calls them: some of the step's requests
only, the default backend, and the traced token's attention row against softmax computed
here in float64 from the keys the block table names; `replay --json`'s cache and tolerance."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cli
from safetensors.torch import load_file
from test_engine_boundaries import BS, D, NB, make_bundle

from bundles import write_bundle as hand_bundle
from pagetrace.engines.bundle import read_layer, read_manifest, read_step
from pagetrace.engines.replay import ReplayRefused, TokenQuery, replay_layer, summarize

TABLES = [[3, 5, 1], [3, 5, 4]]  # a prefills 11 tokens, b decodes its token 9; blocks 3 and 5 shared


def loaded(path):
    manifest = read_manifest(path)
    st = read_step(path, manifest, None)
    return manifest, st, read_layer(manifest, st, 0)


def test_replay_of_one_request_of_the_step(tmp_path):
    manifest, st, tensors = loaded(hand_bundle(tmp_path / "b"))
    engine = tensors["output"]
    for requests, rows, traced in (([1], [11], (1, 9)), ([0], list(range(11)), (0, 10))):
        result = replay_layer(manifest, st, tensors, requests=requests, backend="torch")
        r = requests[0]
        first = st.seq_lens[r] - len(rows)
        assert result.queries == [TokenQuery(r, i, first + k) for k, i in enumerate(rows)]
        torch.testing.assert_close(result.output, engine[rows], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result.reference, engine[rows], rtol=1e-5, atol=1e-5)
        summary = summarize(manifest, st, result, *traced)
        assert [(q.request, q.new_tokens, q.seq_len, q.table, q.passed) for q in summary.requests] == [
            (st.requests[r], len(rows), st.seq_lens[r], TABLES[r], True)]
        assert summary.to_json("b", 0)["traced"]["request"] == st.requests[r]
    with pytest.raises(ReplayRefused) as caught:
        replay_layer(manifest, st, tensors, requests=[], backend="torch")
    assert str(caught.value) == "step 0 has no new tokens to replay for the chosen requests"


def test_replay_layer_by_default_picks_a_backend_that_runs_here(tmp_path):
    """backend "auto": on the CPU, the interpreter for a step this small."""
    manifest, st, tensors = loaded(hand_bundle(tmp_path / "b"))
    result = replay_layer(manifest, st, tensors, requests=[1])
    assert result.backend == "interpret"
    torch.testing.assert_close(result.output, tensors["output"][[11]], rtol=1e-5, atol=1e-5)


def test_the_traced_tokens_row_is_its_own_softmax(tmp_path, capsys):
    """Request 1 decodes its token 9 (table [3, 5, 4]); request 0's token 9 sees the same
    positions through the same first blocks, but its own query: the rows must be request 1's."""
    torch.manual_seed(3)
    k, v = torch.randn(NB, BS, 2, D), torch.randn(NB, BS, 2, D)
    path = make_bundle(tmp_path / "b", lens=[11, 10], qlens=[11, 1], tables=TABLES, k=k, v=v)
    code, out, err = cli(capsys, "replay", str(path), "--request", "1", "--backend", "torch", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["traced"]["request"], doc["traced"]["token"]) == ("1", 9)
    q = load_file(str(path / "step-0000.safetensors"))["layer0.query"][11].double()  # [4 heads, D]
    table = TABLES[1]
    keys = torch.stack([k[table[t // BS], t % BS] for t in range(10)]).double().repeat_interleave(2, dim=1)  # [10, 4, D]
    logits = torch.einsum("hd,thd->ht", q, keys) * D**-0.5
    weights = torch.softmax(logits, -1)
    rows = doc["traced"]["tokens"]
    assert [r["token"] for r in rows] == list(range(10))
    assert [r["weight"] for r in rows] == pytest.approx(weights.mean(0).tolist(), abs=1e-5)
    assert [r["score"] for r in rows] == pytest.approx(logits.mean(0).tolist(), abs=1e-4)


def test_replay_json_says_how_the_cache_was_read_and_its_tolerance(tmp_path, capsys):
    """fp32: 1e-5 x (1 + |x|) (docs/engines.md); nhd is read through strided views."""
    path = make_bundle(tmp_path / "b", lens=[5], qlens=[1], tables=[[3, 5]])
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["cache_read"], doc["tolerance"], doc["dtype"]) == ("strided views of the stored pages, no copy ('nhd' layout)", 1e-5, "fp32")


def test_a_step_whose_first_request_has_no_new_tokens(tmp_path, capsys):
    """Request 0 sits in the batch with nothing to compute (query_start_loc 0, 0, 1); request 1
    decodes its token 2 (table [1]). The report lists request 1 alone and traces it by name."""
    torch.manual_seed(1)
    k, v = torch.randn(NB, BS, 2, D), torch.randn(NB, BS, 2, D)
    path = make_bundle(tmp_path / "b", lens=[6, 3], qlens=[0, 1], tables=[[3, 5], [1]], k=k, v=v)
    code, out, err = cli(capsys, "replay", str(path), "--request", "1", "--backend", "torch", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [(r["request"], r["new_tokens"], r["seq_len"], r["block_table"], r["passed"]) for r in doc["requests"]] == [("1", 1, 3, [1], True)]
    assert (doc["traced"]["request"], doc["traced"]["token"], doc["passed"]) == ("1", 2, True)
    code, out, err = cli(capsys, "replay", str(path), "--request", "1", "--backend", "torch")
    assert code == 0 and "request 1, token 2: what it read" in out, err
