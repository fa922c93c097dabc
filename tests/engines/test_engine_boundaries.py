"""Bundles, views and addresses at the boundaries a user hits first: sequence lengths that
are exact multiples of the block size, a sliding window, one KV head, FlashInfer's
preallocated kv_indices, the last byte of a vector, the slot one past the pool's end.

Every bundle here is written through `pagetrace.engines.export.write_bundle` from a pool
whose K/V were drawn per slot; the "engine's" output is attention written in this file
over the tokens each query sees (its own mask, not the package's)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_usage_error, cli
from bundles import engine_buffer
from test_engines import ENGINE_NAMES, encoded

from pagetrace.engines import flashinfer
from pagetrace.engines.export import write_bundle
from pagetrace.engines.views import as_tensors, describe, expected_view, geometry, verify
from pagetrace.paging.layouts import LAYOUTS

NB, BS, D = 8, 4, 8


def engine_output(q, k, v, tables, lens, qlens, window, scale):
    """[tokens, H, D]: each new token at position p over keys t <= p (and t > p - window)."""
    out, row = [], 0
    group = q.shape[1] // k.shape[2]
    for table, n, ql in zip(tables, lens, qlens):
        for p in range(n - ql, n):
            seen = [t for t in range(p + 1) if window is None or t > p - window]
            kk = torch.stack([k[table[t // BS], t % BS] for t in seen]).repeat_interleave(group, dim=1).double()
            vv = torch.stack([v[table[t // BS], t % BS] for t in seen]).repeat_interleave(group, dim=1).double()
            w = torch.softmax(torch.einsum("hd,thd->ht", q[row].double(), kk) * scale, -1)
            out.append(torch.einsum("ht,thd->hd", w, vv).float())
            row += 1
    return torch.stack(out)


def make_bundle(path, *, lens, qlens, tables, layout="nhd", kv_heads=2, window=None, null_block=0, seed=0, k=None, v=None):
    torch.manual_seed(seed)
    k = torch.randn(NB, BS, kv_heads, D) if k is None else k
    v = torch.randn(NB, BS, kv_heads, D) if v is None else v
    q = torch.randn(sum(qlens), 2 * kv_heads, D)
    out = engine_output(q, k, v, tables, lens, qlens, window, D**-0.5)
    raw = engine_buffer(layout, k, v)
    return write_bundle(path, engine="hand", layout=layout, cache=raw, block_size=BS, num_heads=2 * kv_heads, tables=tables,
                        seq_lens=lens, query_lens=qlens, query=q, output=out, null_block=null_block, sliding_window=window)


def check_json(capsys, path, *extra):
    code, out, err = cli(capsys, "check", str(path), "--json", *extra)
    assert code in (0, 1), err
    return code, json.loads(out)["steps"][0]["violations"]


def replay_json(capsys, path, *extra):
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json", *extra)
    assert code in (0, 1), err
    return code, json.loads(out)


# -- sequence lengths that are exact multiples of the block size ---------------------------

@pytest.mark.parametrize("layout", ["nhd", "vllm-cpu", "flashinfer-hnd"])
def test_replay_of_lengths_exactly_filling_their_blocks(tmp_path, capsys, layout):
    """A prefill of 8 tokens (2 full blocks), a decode at 12 (3 full blocks) and one at 13:
    every table row is exactly as long as its blocks; nothing past them is read."""
    tables = [[3, 5], [1, 2, 4], [1, 2, 4, 6]]  # request 2 shares request 1's three full blocks
    path = make_bundle(tmp_path / "b", lens=[8, 12, 13], qlens=[8, 1, 1], tables=tables, layout=layout)
    code, found = check_json(capsys, path)
    assert (code, found) == (0, [])
    for request, token in (("0", 7), ("1", 11), ("2", 12)):
        code, doc = replay_json(capsys, path, "--request", request)
        assert code == 0 and doc["passed"], doc
        assert doc["traced"]["token"] == token and len(doc["traced"]["tokens"]) == token + 1
    assert [r["block_table"] for r in doc["requests"]] == tables
    assert doc["shared_blocks"] == {"1": 2, "2": 2, "4": 2}


def test_a_table_one_block_short_of_an_exact_multiple_is_a_capacity_violation(tmp_path, capsys):
    path = make_bundle(tmp_path / "b", lens=[8], qlens=[1], tables=[[3, 5]])
    assert check_json(capsys, path) == (0, [])
    from bundles import edit_step

    edit_step(path, lambda t: (t.__setitem__("seq_lens", torch.tensor([9], dtype=torch.int32)),
                               t.__setitem__("positions", torch.tensor([8])),
                               t.__setitem__("slot_mapping", torch.tensor([5 * BS + 4]))))
    code, found = check_json(capsys, path, "--no-data")
    assert code == 1 and "capacity" in {v["check"] for v in found}, found


def test_lookup_from_the_last_token_of_a_full_block_and_its_last_byte(tmp_path, capsys):
    """Token 7 of an 8-token request sits at offset 3 of its second block. The last byte of
    each vector is found here by locating element (block, 3, head, D - 1) of a pool whose
    every element says where it belongs."""
    k, v = encoded(1, BS, D)[:, :, :2].contiguous(), encoded(2, BS, D)[:, :, :2].contiguous()
    k, v = torch.cat([k, k + 0.5]), torch.cat([v, v + 0.5])  # 12 blocks
    k, v = k[:NB].contiguous(), v[:NB].contiguous()
    for layout in ("vllm-cpu", "nhd", "flash-hnd"):
        path = make_bundle(tmp_path / layout, lens=[8], qlens=[1], tables=[[3, 5]], layout=layout, k=k, v=v)
        for head in (0, 1):
            code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "7", "--head", str(head), "--json")
            assert code == 0, err
            doc = json.loads(out)
            assert (doc["logical_block"], doc["offset"], doc["physical_block"], doc["slot"]) == (1, 3, 5, 23)
            raw = engine_buffer(layout, k, v)
            for which, tensor in (("key", k), ("value", v)):
                buf = raw if LAYOUTS[layout].combined else raw[0 if which == "key" else 1]
                flat = buf.reshape(-1)
                first = int((flat == tensor[5, 3, head, 0]).nonzero())
                last = int((flat == tensor[5, 3, head, D - 1]).nonzero())
                a = doc[which]
                assert a["element_offset"] == first and a["byte_offset"] == first * 4
                assert a["last_byte"] == last * 4 + 3, (layout, which, head)


# -- a sliding window ----------------------------------------------------------------------

WINDOW_TABLES = [[3, 5, 1], [0, 4, 2]]  # request 1's block 0 is the null block: outside its window


def test_check_and_replay_a_sliding_window_step(tmp_path, capsys):
    """Window 3, block size 4. Request 0 prefills 11 tokens; request 1 decodes its token 9,
    which sees tokens 7, 8, 9: its logical block 0 (tokens 0-3) may be the null block, as
    vLLM's sliding-window manager makes it."""
    path = make_bundle(tmp_path / "w", lens=[11, 10], qlens=[11, 1], tables=WINDOW_TABLES, window=3)
    assert check_json(capsys, path) == (0, [])
    for request in ("0", "1"):
        code, doc = replay_json(capsys, path, "--request", request)
        assert code == 0 and doc["passed"], doc
    weights = {row["token"]: row["weight"] for row in doc["traced"]["tokens"]}
    assert all(weights[t] == 0 for t in range(7)) and sum(weights[t] for t in (7, 8, 9)) == pytest.approx(1, abs=1e-5)
    # the same step read without its window differs from what the engine computed
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["attention"]["sliding_window"] = None
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, doc = replay_json(capsys, path)
    assert code == 1 and not doc["passed"]


def test_the_null_block_inside_a_prefills_window_is_a_violation(tmp_path, capsys):
    """Request 0 prefills 11 tokens with window 3: its first new token (position 0) sees
    block 0, so a null block there is wrong, though the last token's window (8-10) misses it
    (vLLM frees blocks by the window of the next token to compute, the first new one:
    single_type_kv_cache_manager.py `SlidingWindowManager.get_num_skipped_tokens`)."""
    path = make_bundle(tmp_path / "w", lens=[11, 10], qlens=[11, 1], tables=[[0, 5, 1], [0, 4, 2]], window=3)
    code, found = check_json(capsys, path, "--no-data")
    assert code == 1 and [(v["check"], v["request"], v["logical_block"]) for v in found] == [("null", "0", 0)], found
    # a chunk of 3 new tokens at positions 8-10: the first sees 6, 7, 8; block 1 (4-7) visible, block 0 not
    path = make_bundle(tmp_path / "c", lens=[11], qlens=[3], tables=[[0, 5, 1]], window=3)
    assert check_json(capsys, path, "--no-data") == (0, [])
    path = make_bundle(tmp_path / "d", lens=[11], qlens=[3], tables=[[3, 0, 1]], window=3)
    code, found = check_json(capsys, path, "--no-data")
    assert [(v["check"], v["logical_block"]) for v in found] == [("null", 1)], found
    # window 4 from position 8 reaches token 5 of block 1; window 3 from 9 (a 2-token chunk) starts at 7
    path = make_bundle(tmp_path / "e", lens=[11], qlens=[2], tables=[[3, 0, 1]], window=3)
    code, found = check_json(capsys, path, "--no-data")
    assert [(v["check"], v["logical_block"]) for v in found] == [("null", 1)], found
    path = make_bundle(tmp_path / "f", lens=[12], qlens=[1], tables=[[3, 0, 1]], window=4)
    assert check_json(capsys, path, "--no-data") == (0, [])  # position 11 sees 8..11: block 1 (4..7) not


@pytest.mark.parametrize("window, accepted", [(0, False), (-1, False), (1, True)])
def test_a_manifest_window_of_zero_is_refused_by_every_command(tmp_path, capsys, window, accepted):
    path = make_bundle(tmp_path / "w", lens=[5], qlens=[1], tables=[[3, 5]])
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["attention"]["sliding_window"] = window
    (path / "manifest.json").write_text(json.dumps(manifest))
    commands = (["check", str(path)], ["replay", str(path), "--backend", "torch"], ["lookup", "--from", str(path), "--request", "0", "--token", "4"])
    for command, code in zip(commands, (0, 1, 0)):
        result = cli(capsys, *command)
        if accepted:  # replay differs: the engine's output was computed without a window
            assert result[0] == code and "internal error" not in result[2], result
        else:
            assert_usage_error(result, "manifest.json: attention.sliding_window")


# -- one KV head ---------------------------------------------------------------------------

@pytest.mark.parametrize("name, bs, dims", [(n, BS, D) for n in ENGINE_NAMES if n != "vllm-cpu-amx"] + [("vllm-cpu-amx", 32, 32)])
def test_one_kv_head_reads_back_what_the_engine_wrote(name, bs, dims):
    k = encoded(1, bs, dims)[:, :, :1].contiguous()
    v = encoded(2, bs, dims)[:, :, :1].contiguous()
    raw = engine_buffer(name, k, v)
    key, value = as_tensors(raw, name, bs, 1, dims)
    assert key.shape == (6, bs, 1, dims) and torch.equal(key, k) and torch.equal(value, v)
    if not LAYOUTS[name].tiled:
        verify(key, value, raw, name)
        # an engine's own view of a one-head cache may give the head axis any stride
        # (unsqueeze, or a reshape that drops it): the check looks only at axes longer than 1
        kbuf = raw if LAYOUTS[name].combined else raw[0]
        geom = geometry(name, 6, bs, 1, dims, "fp32")
        shape, strides = key.shape, list(key.stride())
        strides[2] = 12345
        bent = torch.as_strided(key, shape, strides, key.storage_offset())
        got = describe(bent, kbuf, "key", buffer=expected_view(geom, "key").buffer)
        from pagetrace.engines.views import check_view

        check_view(got, expected_view(geom, "key"), name)  # a one-long head axis: its stride reads nothing


def test_one_kv_head_replay_and_check(tmp_path, capsys):
    """Multi-query attention (one KV head, two query heads) through check and replay."""
    path = make_bundle(tmp_path / "b", lens=[9, 4], qlens=[9, 1], tables=[[3, 5, 1], [2]], layout="vllm-cpu", kv_heads=1)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["model"]["num_kv_heads"] == 1
    assert check_json(capsys, path) == (0, [])
    code, doc = replay_json(capsys, path, "--request", "0")
    assert code == 0 and doc["passed"], doc


# -- FlashInfer's preallocated kv_indices ---------------------------------------------------

def test_flashinfer_kv_indices_longer_than_indptr_end(tmp_path, capsys):
    """FlashInfer users pass a preallocated kv_indices buffer, only kv_indptr[-1] entries of
    it meaningful (its wrapper's `paged_kv_indices_buffer`); what lies past them is not read."""
    indptr, last = [0, 3, 5], [2, 4]
    indices = [7, 2, 5, 6, 4] + [99, -1, 3]  # three junk entries past indptr[-1] = 5
    tables, lens = flashinfer.block_tables(indptr, indices, last, BS)
    assert tables == [[7, 2, 5], [6, 4]] and lens == [2 * BS + 2, BS + 4]
    with pytest.raises(Exception, match="kv_indptr"):
        flashinfer.block_tables([0, 3, 9], indices, last, BS)  # past the buffer: refused
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, 2, D), torch.randn(NB, BS, 2, D)
    cache = torch.stack([k, v], dim=1).contiguous()
    q = torch.randn(2, 4, D)
    out = engine_output(q, k, v, tables, lens, [1, 1], None, D**-0.5)
    path = flashinfer.write_bundle(tmp_path / "fi", torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
                                   torch.tensor(last, dtype=torch.int32), cache, kv_layout="NHD", page_size=BS, num_qo_heads=4,
                                   query=q, output=out)
    assert check_json(capsys, path) == (0, [])
    code, doc = replay_json(capsys, path)
    assert code == 0 and doc["passed"] and [r["block_table"] for r in doc["requests"]] == [[7, 2, 5], [6, 4]]


# -- `where`: the last slot and byte, and one past them --------------------------------------

def test_where_last_slot_and_one_past_the_pool(capsys):
    """Table 7,2,15: the pool defaults to 16 blocks of 16, slots 0..255."""
    code, out, err = cli(capsys, "where", "--slot", "255", "--table", "7,2,15", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["physical_block"], doc["offset"], doc["num_blocks"]) == (15, 15, 16)
    assert doc["owners"] == [{"sequence": 0, "logical_block": 2, "token": 47}]
    assert_usage_error(cli(capsys, "where", "--slot", "256", "--table", "7,2,15"), "--slot")
    assert_usage_error(cli(capsys, "where", "--slot", "-1"), "--slot")
    code, out, _ = cli(capsys, "where", "--slot", "0", "--json")
    assert code == 0 and json.loads(out)["owners"] is None


def test_where_last_byte_and_one_past_it(capsys):
    """nhd-like blocks, fp16, 16 blocks x 16 slots x 1 head x 8 dims: 4,096 bytes per cache."""
    code, out, err = cli(capsys, "where", "--byte", str(16 * 16 * 8 * 2 - 1), "--dtype", "fp16", "--cache", "value", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["physical_block"], doc["offset"], doc["dim"], doc["byte_in_element"], doc["cache"]) == (15, 15, 7, 1, "value")
    assert doc["element"] == 16 * 16 * 8 - 1 and doc["slot"] == 255
    assert_usage_error(cli(capsys, "where", "--byte", str(16 * 16 * 8 * 2), "--dtype", "fp16"), "--byte")
    assert_usage_error(cli(capsys, "where", "--byte", "-1"), "--byte")


def test_where_a_block_shared_by_two_tables_and_a_free_block(capsys):
    code, out, err = cli(capsys, "where", "--slot", str(2 * 16 + 5), "--table", "7,2,15", "--table", "2,9", "--num-blocks", "16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["owners"] == [{"sequence": 0, "logical_block": 1, "token": 21}, {"sequence": 1, "logical_block": 0, "token": 5}]
    code, out, _ = cli(capsys, "where", "--slot", str(3 * 16), "--table", "7,2,15", "--json")
    assert json.loads(out)["owners"] == []
    code, out, _ = cli(capsys, "where", "--slot", str(3 * 16), "--table", "7,2,15")
    assert "no table maps block 3: a free block" in out
    assert_usage_error(cli(capsys, "where", "--slot", "1", "--table", "7,2,15", "--num-blocks", "15"), "--table")
