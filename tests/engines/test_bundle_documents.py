"""The documents the bundle tools write and print, field by field: the manifest and step
tensors `export.write_bundle` writes, the violation records of `check`, the addresses of
`lookup --from`. A user's script reads these fields; each one is pinned here against a
value computed in this file."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_usage_error, cli
from safetensors.torch import load_file
from bundles import edit_step, engine_buffer, write_bundle as hand_bundle

from pagetrace.engines import flashinfer, sglang
from pagetrace.engines.export import write_bundle
from pagetrace.engines.views import verify, as_tensors
from pagetrace.errors import UsageError
from pagetrace.paging.layouts import make_geometry

NB, BS, H, D = 6, 4, 2, 8


def cache(layout="flashinfer", seed=0):
    torch.manual_seed(seed)
    return engine_buffer(layout, torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D))


def test_export_writes_the_documented_manifest_and_step_tensors(tmp_path):
    raw = cache("flashinfer")
    tables, lens, qlens = [[2, 0], [5]], [6, 3], [2, 1]  # request 0's second block is block 0: stored like any other
    path = write_bundle(tmp_path / "b", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=tables, seq_lens=lens, query_lens=qlens, engine_version="1.2")
    manifest = json.loads((path / "manifest.json").read_text())
    assert {k: manifest[k] for k in ("engine", "model", "kv_cache", "attention", "layers")} == {
        "engine": {"name": "mine", "version": "1.2"},
        "model": {"num_layers": 1, "num_heads": 4, "num_kv_heads": H, "head_dim": D},
        "kv_cache": {"dtype": "fp32", "layout": "flashinfer", "block_size": BS, "num_blocks": NB, "null_block": None,
                     "table_padding": 0, "slot_padding": -1, "sharing": "full-blocks"},
        "attention": {"scale": D**-0.5, "causal": True, "sliding_window": None},
        "layers": [{"index": 0, "name": "layer0"}],
    }
    t = load_file(str(path / "step-0000.safetensors"))
    assert {n: (t[n].dtype, t[n].tolist()) for n in ("query_start_loc", "seq_lens", "block_table", "block_counts", "slot_mapping", "positions", "blocks")} == {
        "query_start_loc": (torch.int32, [0, 2, 3]),
        "seq_lens": (torch.int32, [6, 3]),
        "block_table": (torch.int32, [[2, 0], [5, 0]]),  # padded with table_padding 0
        "block_counts": (torch.int32, [2, 1]),
        "slot_mapping": (torch.int64, [0 * BS + 0, 0 * BS + 1, 5 * BS + 2]),  # positions 4, 5 on block 0; 2 on block 5
        "positions": (torch.int64, [4, 5, 2]),
        "blocks": (torch.int64, [0, 2, 5]),
    }
    assert torch.equal(t["layer0.kv"], raw.index_select(0, torch.tensor([0, 2, 5])))
    path = write_bundle(tmp_path / "s", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4, tables=[[1]],
                        seq_lens=[1], scale=0.5, sliding_window=7)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["attention"] == {"scale": 0.5, "causal": True, "sliding_window": 7}


def test_export_stores_the_blocks_slots_name_even_past_the_tables():
    """A slot_mapping entry on block 0 (a padded token written to the null block's slot 0)
    stores block 0; a table entry equal to num_blocks is outside the pool, not stored."""
    import tempfile
    from pathlib import Path

    raw = cache("flashinfer")
    with tempfile.TemporaryDirectory() as tmp:
        path = write_bundle(Path(tmp) / "b", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                            tables=[[3, NB]], seq_lens=[6], slot_mapping=[0])
        assert load_file(str(path / "step-0000.safetensors"))["blocks"].tolist() == [0, 3]


def test_export_refusals_name_the_argument(tmp_path):
    raw = cache("flashinfer")
    common = dict(engine="mine", block_size=BS, num_heads=4, tables=[[1]], seq_lens=[1])

    def message(**kwargs):
        with pytest.raises(UsageError) as caught:
            write_bundle(tmp_path / "x", **{**common, **kwargs})
        return str(caught.value)

    assert message(layout="flashinferx", cache=raw).startswith("invalid value for layout: 'flashinferx': choose one of ")
    assert message(layout="flashinfer", cache=raw, sharing="some") == (
        "invalid value for sharing: 'some': choose one of none, full-blocks")
    assert message(layout="flashinfer", cache=raw.double()) == (
        "invalid value for cache: 'torch.float64': a bundle stores torch.float32, torch.float16, torch.bfloat16")
    assert message(layout="flashinfer", cache=raw[:, :1]) == (
        f"invalid value for cache: {(NB, 1, BS, H, D)}: is not a 'flashinfer' buffer ([num_blocks, 2, block_size, num_kv_heads, "
        f"head_dim], K and V in one tensor) with block size {BS}")


def test_export_finds_the_heads_of_every_layout(tmp_path):
    for layout in ("flashinfer", "vllm-cpu", "nhd", "flash-hnd"):
        raw = cache(layout)
        path = write_bundle(tmp_path / layout, engine="mine", layout=layout, cache=raw, block_size=BS, num_heads=4, tables=[[1]], seq_lens=[1])
        model = json.loads((path / "manifest.json").read_text())["model"]
        assert (model["num_kv_heads"], model["head_dim"]) == (H, D), layout


def test_engine_writers_pass_output_and_options_through(tmp_path):
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D)
    q, out = torch.randn(1, 4, D), torch.randn(1, 4, D)
    for as_tuple in (False, True):
        paged = (k, v) if as_tuple else torch.stack([k, v], dim=1).contiguous()
        path = flashinfer.write_bundle(tmp_path / f"fi{as_tuple}", [0, 2], [3, 1], [2], paged, kv_layout="NHD", page_size=BS,
                                       num_qo_heads=4, query=q, output=out, sliding_window=5)
        manifest = json.loads((path / "manifest.json").read_text())
        assert manifest["kv_cache"]["layout"] == ("nhd" if as_tuple else "flashinfer") and manifest["attention"]["sliding_window"] == 5
        assert manifest["engine"]["name"] == "flashinfer"
        assert torch.equal(load_file(str(path / "step-0000.safetensors"))["layer0.output"], out)
    k_buffer = torch.randn(8, H, D)
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    req_to_token[0, :2] = torch.tensor([3, 4])
    path = sglang.write_bundle(tmp_path / "sg", req_to_token, [0], [2], k_buffer, k_buffer, num_heads=4, sliding_window=2)
    assert json.loads((path / "manifest.json").read_text())["attention"]["sliding_window"] == 2


def test_verify_takes_any_float_dtype_and_names_the_layout_of_a_wrong_view():
    k, v = torch.randn(NB, BS, H, D, dtype=torch.float64), torch.randn(NB, BS, H, D, dtype=torch.float64)
    got_k, got_v = verify(k, v, (k, v), "nhd")
    assert got_k.element_size == 8 and got_v.strides == (BS * H * D, H * D, D, 1)
    raw = cache("vllm-cpu")
    key, value = as_tensors(raw, "vllm-cpu", BS, H, D)
    with pytest.raises(UsageError, match="the 'vllm-hnd' layout has"):
        verify(key, value, raw, "vllm-hnd")


# -- check's violation records --------------------------------------------------------------

def violations(capsys, path, *extra):
    code, out, err = cli(capsys, "check", str(path), "--json", *extra)
    return code, json.loads(out)["steps"][0]["violations"]


def test_violation_records_carry_step_slot_byte_and_layer(tmp_path, capsys):
    """The hand bundle (vllm-cpu, 6 blocks of 4, 2 KV heads, head_dim 8): a key's element 0 of
    KV head 0 at (block b, slot s) is element b * H * BS * 2D + s (K column-major in its page)."""
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["positions"].__setitem__(3, 7))  # request a's token 3 claims position 7
    code, found = violations(capsys, path, "--no-data")
    v = next(v for v in found if v["check"] == "position")
    assert {k: v[k] for k in ("step", "request", "token", "logical_block", "physical_block", "slot", "byte", "layer")} == {
        "step": 0, "request": "a", "token": 3, "logical_block": 0, "physical_block": 3, "slot": 3 * BS + 3,
        "byte": (3 * H * BS * 2 * D + 3) * 4, "layer": None}
    path = hand_bundle(tmp_path / "c")
    edit_step(path, lambda t: t["block_table"].__setitem__((1, 1), NB))  # b's logical block 1 on block 6 of 0..5
    code, found = violations(capsys, path, "--no-data")
    pool = next(v for v in found if v["check"] == "pool")
    assert (pool["physical_block"], pool["slot"], pool["byte"], pool["token"]) == (NB, NB * BS, None, 4)
    path = hand_bundle(tmp_path / "d", "vllm-cpu")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["kv_cache"]["layout"] = "vllm-hnd"
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, found = violations(capsys, path)
    assert found and all(v["check"] == "data" and v["layer"] == 0 and v["step"] == 0 for v in found)


def test_a_position_past_a_short_table_is_reported_not_crashed_on(tmp_path, capsys):
    """seq_len 9 needs 3 blocks of 4, the row has 2: the capacity violation, and a wrong
    position for the token in the missing block (logical block 2 = the row's length)."""
    raw = cache("flashinfer")
    path = write_bundle(tmp_path / "b", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=[[3, 5]], seq_lens=[9], slot_mapping=[5 * BS])
    edit_step(path, lambda t: t["positions"].__setitem__(0, 3))
    code, found = violations(capsys, path, "--no-data")
    assert code == 1 and {v["check"] for v in found} == {"capacity", "position"}, found
    position = next(v for v in found if v["check"] == "position")
    assert (position["token"], position["logical_block"], position["physical_block"], position["slot"]) == (8, 2, None, None)


def test_a_decode_and_a_chunk_with_a_window_each_judged_by_their_own_first_token(tmp_path, capsys):
    """Window 3, block size 4. Request 0 decodes at position 4; request 1 has 3 new tokens at
    8-10, the first seeing 6-8: its logical block 1 (tokens 4-7) on the null block is wrong."""
    raw = cache("flashinfer")
    path = write_bundle(tmp_path / "w", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=[[3, 5], [1, 0, 2]], seq_lens=[5, 11], query_lens=[1, 3], null_block=0, sliding_window=3)
    code, found = violations(capsys, path, "--no-data")
    assert [(v["check"], v["request"], v["logical_block"]) for v in found] == [("null", "1", 1)], found


# -- lookup --from ----------------------------------------------------------------------------

def test_lookup_from_the_first_token_the_last_head_and_block_zero(tmp_path, capsys):
    """FlashInfer has no null block: page 0 is a page like any other."""
    raw = cache("flashinfer")
    path = flashinfer.write_bundle(tmp_path / "fi", [0, 2], [0, NB - 1], [3], raw, kv_layout="NHD", page_size=BS, num_qo_heads=4)
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "0", "--head", str(H - 1), "--json")
    assert code == 0, err
    doc = json.loads(out)
    geom = make_geometry("flashinfer", NB, BS, H, D, "fp32")
    assert (doc["bundle"], doc["physical_block"], doc["slot"], doc["head"]) == (str(path), 0, 0, H - 1)
    for which, kv in (("key", 0), ("value", 1)):
        a = doc[which]
        first = geom.element(which, 0, 0, H - 1, 0)
        assert (a["which"], a["buffer"], a["formula"]) == (which, "kv", geom.formula(which))
        assert a["element_offset"] == first == ((0 * 2 + kv) * BS * H + H - 1) * D
        assert a["last_byte"] == (first + D - 1) * 4 + 3
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", str(BS + 2))
    assert code == 0 and f"physical block = block_table[1] = {NB - 1}" in out, err
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", str(BS + 3)), "--token")
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", str(BS + 3))
    assert f"request 0 holds tokens 0..{BS + 2} in step 0" in err
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "0", "--head", str(H))
    assert code == 2 and f"invalid value for --head: {H}: the cache has KV heads 0..{H - 1}" in err, err
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "-1"), "--token")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "0", "--head", "-1"), "--head")


def test_lookup_from_a_table_entry_exactly_at_num_blocks_is_refused(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["block_table"].__setitem__((1, 1), NB))
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "5")
    assert code == 1 and f"= {NB} is outside the pool of {NB} blocks in step 0" in err, err


def test_lookup_from_prints_both_vectors(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b")
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "6")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("hand request b token 6 (step 0, 10 tokens) · layout vllm-cpu ")
    assert any(line.lstrip().startswith("key (KV head 0) at element") for line in lines)
    assert any(line.lstrip().startswith("value (KV head 0) at element") for line in lines)


def test_replay_refused_without_a_query_lists_no_violations(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t.pop("layer0.query"))
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["passed"] is False and doc["violations"] == [] and "stored no query" in doc["error"], doc


def test_data_violations_name_the_request_token_slot_and_which(tmp_path, capsys):
    """The hand bundle: request a's new tokens 0-10, then b's token 9 (table [3, 5, 4]: slot 4 x 4 + 1 = 17)."""
    path = hand_bundle(tmp_path / "b")

    def corrupt(t):
        t["layer0.new_value"][11] += 1.0  # b's token 9: its value one off everywhere
        t["layer0.new_key"][3, 0, 0] += 2.0  # a's token 3 (block 3, slot 12 + 3): its key, in one element

    edit_step(path, corrupt)
    code, found = violations(capsys, path)
    records = [{k: v[k] for k in ("check", "request", "token", "logical_block", "physical_block", "slot", "layer", "message")} for v in found]
    assert code == 1 and records == [
        {"check": "data", "request": "a", "token": 3, "logical_block": 0, "physical_block": 3, "slot": 15, "layer": 0,
         "message": "layer 0: the key written for this token is not at slot 15 through the 'vllm-cpu' layout (max |diff| 2)"},
        {"check": "data", "request": "b", "token": 9, "logical_block": 2, "physical_block": 4, "slot": 17, "layer": 0,
         "message": "layer 0: the value written for this token is not at slot 17 through the 'vllm-cpu' layout (max |diff| 1)"},
    ], records


def test_a_token_written_to_slot_zero_is_checked(tmp_path, capsys):
    """FlashInfer has no null block: a new token at slot 0 (page 0, offset 0) is read back too."""
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D)
    raw = torch.stack([k, v], dim=1).contiguous()
    path = write_bundle(tmp_path / "b", engine="flashinfer", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=[[0]], seq_lens=[1])

    def add_new(t):
        t["layer0.new_key"] = k[0, 0][None].clone() + 1  # not what is at slot 0
        t["layer0.new_value"] = v[0, 0][None].clone()

    edit_step(path, add_new)
    code, found = violations(capsys, path)
    assert code == 1 and [(v["check"], v["slot"], v["token"]) for v in found] == [("data", 0, 0)], found


def test_replay_json_rows_block_mass_and_fields(tmp_path, capsys):
    """Request b (10 tokens, table [3, 5, 4]) is shorter than a (11): its traced token 9's
    rows are tokens 0-9 and the mass of its last block counts tokens 8 and 9 only."""
    path = hand_bundle(tmp_path / "b")
    code, out, err = cli(capsys, "replay", str(path), "--request", "b", "--backend", "torch", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["bundle"], doc["layer"], doc["backend"], doc["dtype"], doc["passed"]) == (str(path), 0, "torch", "fp32", True)
    assert [(r["request"], r["new_tokens"], r["seq_len"], r["block_table"], r["passed"]) for r in doc["requests"]] == [
        ("a", 11, 11, [3, 5, 1], True), ("b", 1, 10, [3, 5, 4], True)]
    assert all(r["max_diff_contiguous"] < 1e-5 and r["max_diff_engine"] < 1e-5 for r in doc["requests"])
    traced = doc["traced"]
    assert (traced["request"], traced["token"]) == ("b", 9)
    table = [3, 5, 4]
    assert [(r["token"], r["logical_block"], r["offset"], r["physical_block"], r["slot"], r["refcount"]) for r in traced["tokens"]] == [
        (t, t // BS, t % BS, table[t // BS], table[t // BS] * BS + t % BS, 2 if t < 8 else 1) for t in range(10)]
    weights = [r["weight"] for r in traced["tokens"]]
    assert sum(weights) == pytest.approx(1, abs=1e-5)
    from pagetrace.engines.bundle import read_layer, read_manifest, read_step
    from pagetrace.engines.replay import replay_layer, summarize

    manifest = read_manifest(path)
    st = read_step(path, manifest, None)
    summary = summarize(manifest, st, replay_layer(manifest, st, read_layer(manifest, st, 0), backend="torch"), 1, 9)
    assert summary.block_mass == pytest.approx([sum(weights[0:4]), sum(weights[4:8]), sum(weights[8:10])], abs=1e-6)
    edit_step(path, lambda t: t.pop("layer0.output"))
    code, out, err = cli(capsys, "replay", str(path), "--request", "a", "--token", "9", "--backend", "torch", "--json")
    doc = json.loads(out)
    assert code == 0 and all(r["max_diff_engine"] is None for r in doc["requests"]) and doc["traced"]["token"] == 9


def test_replay_uses_the_manifests_scale_and_a_query_of_another_dtype(tmp_path, capsys):
    """Scale 0.5 (not 1/sqrt(head_dim)); a bf16 cache with the query stored in fp32."""
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, H, D).bfloat16(), torch.randn(NB, BS, H, D).bfloat16()
    q = torch.randn(1, 4, D) * 2
    kk = torch.stack([k[3, t] for t in range(3)]).float().repeat_interleave(2, dim=1)
    vv = torch.stack([v[3, t] for t in range(3)]).float().repeat_interleave(2, dim=1)
    out = torch.einsum("ht,thd->hd", torch.softmax(torch.einsum("hd,thd->ht", q[0].bfloat16().float(), kk) * 0.5, -1), vv)[None]
    path = write_bundle(tmp_path / "b", engine="mine", layout="nhd", cache=(k, v), block_size=BS, num_heads=4, tables=[[3]],
                        seq_lens=[3], query=q, output=out, scale=0.5)
    code, out_text, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    doc = json.loads(out_text)
    assert code == 0 and doc["passed"] and doc["dtype"] == "bf16", doc


# every check's record, word for word: the hand bundle (vllm-cpu, blocks of 4, tables a [3, 5, 1], b [3, 5, 4];
# a prefills tokens 0-10 (rows 0-10), b decodes token 9 (row 11) at slot 4 x 4 + 1 = 17). A key's element 0 of
# KV head 0 at slot s lies at element (s // 4) x 128 + s % 4: byte 4 x that.
def byte_of(slot):
    return (slot // BS * H * BS * 2 * D + slot % BS) * 4


FIELDS = ("check", "request", "token", "logical_block", "physical_block", "slot", "byte", "message")
RECORDS = {
    "query_start_loc starts at 1": (lambda t: t["query_start_loc"].__setitem__(0, 1), [
        ("query", None, None, None, None, None, None, "query_start_loc starts at 1, not 0")]),
    "query_start_loc decreases": (lambda t: t["query_start_loc"].__setitem__(1, 13), [
        ("query", "a", None, None, None, None, None, "13 new tokens but seq_len 11"),
        ("query", "b", None, None, None, None, None, "query_start_loc decreases at request 1: 13 then 12")]),
    "more new tokens than tokens": (lambda t: t.update(query_start_loc=torch.tensor([0, 1, 12], dtype=torch.int32)), [
        ("query", "b", None, None, None, None, None, "11 new tokens but seq_len 10")]),
    "a padding row writes": (lambda t: t["slot_mapping"].__setitem__(12, 7), [
        ("query", None, None, None, None, 7, byte_of(7), "slot_mapping[12] = 7 past the 12 real tokens; padding is -1")]),
    "a short block count": (lambda t: t["block_counts"].__setitem__(0, 2), [
        ("capacity", "a", 10, 2, -1, None, None, "seq_len 11 needs 3 blocks of 4; the row has 4 entries, 2 counted")]),
    "an entry past the pool": (lambda t: t["block_table"].__setitem__((1, 1), 6), [
        ("pool", "b", 4, 1, 6, 24, None, "logical block 1 maps to physical block 6, outside the pool 0..5")]),
    "a block not stored": (lambda t: t["block_table"].__setitem__((1, 2), 2), [
        ("stored", "b", 8, 2, 2, 8, byte_of(8), "logical block 2 maps to physical block 2, whose page the bundle did not store"),
        ("slot", "b", 9, 2, 2, 17, byte_of(17), "slot_mapping[11] = 17; block table gives 2 x 4 + 1 = 9")]),
    "a wrong slot": (lambda t: t["slot_mapping"].__setitem__(11, 18), [
        ("slot", "b", 9, 2, 4, 18, byte_of(18), "slot_mapping[11] = 18; block table gives 4 x 4 + 1 = 17")]),
    "two writers": (lambda t: t["slot_mapping"].__setitem__(11, 20), [
        ("slot", "b", 9, 2, 4, 20, byte_of(20), "slot_mapping[11] = 20; block table gives 4 x 4 + 1 = 17"),
        ("collision", "b", 9, 2, 5, 20, byte_of(20), "slot 20 is written by request a token 4 too")]),
    "one block twice in a table": (lambda t: t["block_table"].__setitem__((1, 2), 3), [
        ("slot", "b", 9, 2, 3, 17, byte_of(17), "slot_mapping[11] = 17; block table gives 3 x 4 + 1 = 13"),
        ("sharing", "b", 8, 2, 3, 12, byte_of(12), "physical block 3 is logical blocks 0 and 2 of one request")]),
    "a partial block shared": (lambda t: t["block_table"].__setitem__((1, 2), 1), [
        ("slot", "b", 9, 2, 1, 17, byte_of(17), "slot_mapping[11] = 17; block table gives 1 x 4 + 1 = 5"),
        ("sharing", "a", 8, 2, 1, 4, byte_of(4), "physical block 1 is logical block 2 of request b and 2 of request a: only full "
         "blocks are shared, and request a fills 3 of 4 slots"),
        ("sharing", "b", 8, 2, 1, 4, byte_of(4), "physical block 1 is logical block 2 of request b and 2 of request a: only full "
         "blocks are shared, and request b fills 2 of 4 slots")]),
    "the null block where a token sees it": (lambda t: t["block_table"].__setitem__((0, 2), 0), [
        ("stored", "a", 8, 2, 0, 0, byte_of(0), "logical block 2 maps to physical block 0, whose page the bundle did not store"),
        ("null", "a", 8, 2, 0, 0, byte_of(0), "logical block 2 (tokens 8..10) is on the null block 0"),
        ("slot", "a", 8, 2, 0, 4, byte_of(4), "slot_mapping[8] = 4; block table gives 0 x 4 + 0 = 0"),
        ("slot", "a", 9, 2, 0, 5, byte_of(5), "slot_mapping[9] = 5; block table gives 0 x 4 + 1 = 1"),
        ("slot", "a", 10, 2, 0, 6, byte_of(6), "slot_mapping[10] = 6; block table gives 0 x 4 + 2 = 2")]),
    "shared at another logical block": (lambda t: t["block_table"].__setitem__((1, 1), 3), [
        ("sharing", "b", 4, 1, 3, 12, byte_of(12), "physical block 3 is logical blocks 0 and 1 of one request")]),
}


@pytest.mark.parametrize("fault", list(RECORDS))
def test_each_checks_record_word_for_word(tmp_path, capsys, fault):
    edit, want = RECORDS[fault]
    path = hand_bundle(tmp_path / "b")
    edit_step(path, edit)
    code, found = violations(capsys, path, "--no-data")
    got = [tuple(v[k] for k in FIELDS) for v in found]
    assert code == 1 and got == want, got
    assert all(v["step"] == 0 and v["layer"] is None for v in found)
    assert all(type(v[k]) in (int, type(None)) for v in found for k in ("slot", "byte", "physical_block", "token"))


def test_sharing_with_an_engine_that_shares_nothing_and_across_logical_blocks(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b", sharing="none")
    code, found = violations(capsys, path, "--no-data")
    assert [tuple(v[k] for k in FIELDS) for v in found] == [
        ("sharing", "b", 0, 0, 3, 12, byte_of(12), "physical block 3 is logical block 0 of request b and 0 of request a, but this engine shares no blocks (no prefix caching)"),
        ("sharing", "b", 4, 1, 5, 20, byte_of(20), "physical block 5 is logical block 1 of request b and 1 of request a, but this engine shares no blocks (no prefix caching)")]
    path = hand_bundle(tmp_path / "c")
    edit_step(path, lambda t: (t["block_table"].__setitem__((1, 0), 5), t["block_table"].__setitem__((1, 1), 3)))
    code, found = violations(capsys, path, "--no-data")
    sharing = [tuple(v[k] for k in FIELDS) for v in found if v["check"] == "sharing"]
    assert sharing == [
        ("sharing", "b", 4, 1, 3, 12, byte_of(12), "physical block 3 is logical block 1 of request b and 0 of request a: a prefix-cached block is the same logical block in every request"),
        ("sharing", "b", 0, 0, 5, 20, byte_of(20), "physical block 5 is logical block 0 of request b and 1 of request a: a prefix-cached block is the same logical block in every request")], sharing


WHY = ("replay cannot judge attention here: its contiguous reference reads the pages through the same block tables and "
       "slots as the kernel, so both read the same wrong pages and agree; `pagetrace check` lists every violation")


@pytest.mark.parametrize("fault, message", [
    ("query_start_loc decreases", "step 0: 2 violations: query: request a: 13 new tokens but seq_len 11; query: request b: "
                                  "query_start_loc decreases at request 1: 13 then 12; " + WHY),
    ("query_start_loc starts at 1", "step 0: 1 violation: query: query_start_loc starts at 1, not 0; " + WHY),
    ("an entry past the pool", "step 0: 1 violation: pool: request b token 4: logical block 1 maps to physical block 6, outside the pool 0..5; " + WHY),
    # a slot or a collision: the tables read fine, but the reference reads the same wrong page as the kernel (it used to pass)
    ("a wrong slot", "step 0: 1 violation: slot: request b token 9: slot_mapping[11] = 18; block table gives 4 x 4 + 1 = 17; " + WHY),
    ("two writers", "step 0: 2 violations: slot: request b token 9: slot_mapping[11] = 20; block table gives 4 x 4 + 1 = 17; "
                    "collision: request b token 9: slot 20 is written by request a token 4 too; " + WHY),
])
def test_replay_refuses_a_broken_step_in_one_line(tmp_path, capsys, fault, message):
    path = hand_bundle(tmp_path / "b")
    edit_step(path, RECORDS[fault][0])
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch")
    assert code == 1 and err.strip() == f"pagetrace: {message}", err
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    doc = json.loads(out)
    assert doc["error"] == message and [v["check"] for v in doc["violations"]] == [r[0] for r in RECORDS[fault][1]]
