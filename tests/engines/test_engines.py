"""Engine adapters without an engine: layouts built as the engines build them, bundles
written by hand, and the check, replay and lookup commands on them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bundles import BS, D, H, NB, edit_step, engine_buffer, write_bundle
from conftest import KERNEL_BACKEND, assert_usage_error, cli
from pagetrace.engines import flashinfer, sglang
from pagetrace.engines.views import as_tensors, check_view, describe, expected_view, geometry
from pagetrace.paging.layouts import LAYOUTS
from pagetrace.errors import UsageError


def encoded(which: int, bs: int = BS, dims: int = D) -> torch.Tensor:
    """[NB, bs, H, dims] whose every element says where it belongs: which, then its index."""
    return (which * 1_000_000 + torch.arange(NB * bs * H * dims).reshape(NB, bs, H, dims)).float()


ENGINE_NAMES = ["flash", "flash-hnd", "flashinfer", "flashinfer-hnd", "hnd", "nhd", "vllm-cpu", "vllm-cpu-amx", "vllm-hnd", "vllm-nhd"]


def test_the_engine_names_are_the_table():
    assert set(ENGINE_NAMES) == {n for n, lay in LAYOUTS.items() if lay.combined or n in ("nhd", "hnd")}


# amx pages group 16 slots and 16 dims: that entry runs at the larger dims only
@pytest.mark.parametrize("name, bs, dims", [(n, BS, D) for n in ENGINE_NAMES if n != "vllm-cpu-amx"] + [(n, 32, 32) for n in ENGINE_NAMES])
def test_every_layout_reads_back_what_the_engine_wrote(name, bs, dims):
    k, v = encoded(1, bs, dims), encoded(2, bs, dims)
    raw = engine_buffer(name, k, v)
    key, value = as_tensors(raw, name, bs, H, dims)
    assert torch.equal(key, k) and torch.equal(value, v)
    # the addresses agree with the tensor: element (3, 2, 1, 5) of K at geom.element(...)
    geom = geometry(name, NB, bs, H, dims, "fp32")
    kbuf, vbuf = raw if isinstance(raw, tuple) else (raw, raw)
    assert kbuf.reshape(-1)[geom.element("key", 3, 2, 1, 5)] == k[3, 2, 1, 5]
    assert vbuf.reshape(-1)[geom.element("value", 3, bs - 1, 1, 5)] == v[3, bs - 1, 1, 5]
    kview = expected_view(geom, "key")
    if LAYOUTS[name].tiled:
        assert kview is None  # no strided view reads it: as_tensors copied
    else:
        assert describe(key, kbuf, "key", buffer=kview.buffer) == kview


def test_a_wrong_view_of_the_right_shape_is_refused():
    from pagetrace.engines.views import verify

    raw = engine_buffer("vllm-cpu", encoded(1), encoded(2))
    good_k, good_v = as_tensors(raw, "vllm-cpu", BS, H, D)
    verify(good_k, good_v, raw, "vllm-cpu")
    with pytest.raises(UsageError, match="key view.*slot stride"):  # the right tensors claimed as another layout
        verify(good_k, good_v, raw, "vllm-hnd")
    row_major = raw.view(NB, H, 2 * BS, D)[:, :, :BS].permute(0, 2, 1, 3)  # vLLM's Python view of the CPU cache
    geom = geometry("vllm-cpu", NB, BS, H, D, "fp32")
    kview, vview = expected_view(geom, "key"), expected_view(geom, "value")
    with pytest.raises(UsageError, match=f"slot stride is {D} elements; the 'vllm-cpu' layout has 1"):
        check_view(describe(row_major, raw, "key"), kview, "vllm-cpu")
    value = raw.view(NB, H, 2 * BS, D)[:, :, BS:].permute(0, 2, 1, 3)
    check_view(describe(value, raw, "value"), vview, "vllm-cpu")  # V is row-major: this one is right
    with pytest.raises(UsageError, match="starts 0 elements into the buffer"):
        check_view(describe(raw.view(NB, H, 2 * BS, D)[:, :, :BS].permute(0, 2, 1, 3), raw, "value"), vview, "vllm-cpu")


def test_flashinfer_csr_from_its_batch_decode_example():
    # flashinfer's BatchDecodeWithPagedKVCacheWrapper example: 7 requests over 128 pages of 16
    indptr = [0, 17, 29, 44, 48, 66, 100, 128]
    indices = list(range(128))
    last = [1, 7, 14, 4, 3, 1, 16]
    tables, lens = flashinfer.block_tables(indptr, indices, last, 16)
    assert lens == [(17 - 1) * 16 + 1, (12 - 1) * 16 + 7, (15 - 1) * 16 + 14, 3 * 16 + 4, 17 * 16 + 3, 33 * 16 + 1, 27 * 16 + 16]
    assert tables[1] == list(range(17, 29))
    with pytest.raises(UsageError, match="kv_last_page_len"):
        flashinfer.block_tables(indptr, indices, [0, 7, 14, 4, 3, 1, 16], 16)


@pytest.mark.parametrize("kv_layout,as_tuple", [("NHD", False), ("HND", False), ("NHD", True), ("HND", True)])
def test_flashinfer_cache_through_the_kernel(kv_layout, as_tuple):
    from pagetrace import paged_attention

    torch.manual_seed(0)
    pages, ps = 12, 4
    k, v = torch.randn(pages, ps, H, D), torch.randn(pages, ps, H, D)
    if kv_layout == "HND":
        k_, v_ = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    else:
        k_, v_ = k, v
    cache = (k_, v_) if as_tuple else torch.stack([k_, v_], dim=1).contiguous()
    indptr, indices, last = [0, 3, 5], [7, 2, 9, 11, 4], [2, 4]
    tables, lens = flashinfer.block_tables(indptr, indices, last, ps)
    key, value = flashinfer.kv_views(cache, kv_layout, ps, H, D)
    q = torch.randn(2, 4, D)
    bt = torch.tensor([t + [-1] * (3 - len(t)) for t in tables], dtype=torch.int32)
    out = paged_attention(q, key, value, bt, torch.tensor(lens, dtype=torch.int32), layout="nhd", backend=KERNEL_BACKEND)
    for r in range(2):  # attention written here, over the tokens in CSR order
        slots = [(indices[indptr[r] + t // ps], t % ps) for t in range(lens[r])]
        kk = torch.stack([k[p, o] for p, o in slots]).repeat_interleave(2, dim=1)
        vv = torch.stack([v[p, o] for p, o in slots]).repeat_interleave(2, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q[r], kk) / D**0.5, -1)
        torch.testing.assert_close(out[r], torch.einsum("ht,thd->hd", w, vv), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 4])
def test_sglang_req_to_token(page_size):
    size = 32
    req_to_token = torch.zeros(8, 64, dtype=torch.int32)  # ReqToTokenPool: zeros, one row per request slot
    # the allocator hands out pages (slot 0's page is the padding page); request rows 3 and 5
    pages = {3: [2, 5, 1], 5: [4, 6]}
    lens = {3: 2 * page_size + 1, 5: page_size + 1}
    for row, pp in pages.items():
        for t in range(lens[row]):
            req_to_token[row, t] = pp[t // page_size] * page_size + t % page_size
    tables = sglang.block_tables(req_to_token, [3, 5], [lens[3], lens[5]], page_size)
    assert tables == [[2, 5, 1][: -(-lens[3] // page_size)], [4, 6][: -(-lens[5] // page_size)]]
    k_buffer = torch.randn(size + page_size, H, D)
    v_buffer = torch.randn(size + page_size, H, D)
    key, value = sglang.kv_views(k_buffer, v_buffer, page_size)
    for t in range(lens[3]):
        slot = int(req_to_token[3, t])
        assert torch.equal(key[tables[0][t // page_size], t % page_size], k_buffer[slot])
        assert torch.equal(value[tables[0][t // page_size], t % page_size], v_buffer[slot])
    if page_size > 1:
        req_to_token[5, 1] += 1  # a token outside its page
        with pytest.raises(UsageError, match="request 1 token 1"):
            sglang.block_tables(req_to_token, [3, 5], [lens[3], lens[5]], page_size)


# -- bundles written by hand (tests/bundles.py) -----------------------------------------

def violations(capsys, path, *extra):
    code, out, err = cli(capsys, "check", str(path), "--json", *extra)
    doc = json.loads(out)
    return code, doc["steps"][0]["violations"]


@pytest.mark.parametrize("layout", ["vllm-cpu", "flash", "flashinfer-hnd", "nhd"])
def test_check_and_replay_a_clean_bundle(tmp_path, capsys, layout):
    path = write_bundle(tmp_path / "b", layout)
    code, found = violations(capsys, path)
    assert code == 0 and found == []
    code, out, err = cli(capsys, "replay", str(path), "--request", "b", "--backend", KERNEL_BACKEND, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], doc
    assert doc["shared_blocks"] == {"3": 2, "5": 2}
    assert [r["new_tokens"] for r in doc["requests"]] == [11, 1]
    assert doc["traced"]["token"] == 9 and len(doc["traced"]["tokens"]) == 10


@pytest.mark.parametrize(
    "edit,want",
    [
        (lambda t: t["block_table"].__setitem__((1, 1), 9), ("pool", "b", 4, 1, 9)),
        (lambda t: t["block_table"].__setitem__((0, 2), 0), ("null", "a", 8, 2, 0)),
        (lambda t: t["slot_mapping"].__setitem__(11, 4 * 4 + 2), ("slot", "b", 9, 2, 4)),
        (lambda t: t["positions"].__setitem__(3, 7), ("position", "a", 3, 0, 3)),
        (lambda t: t["block_table"].__setitem__((1, 2), 1), ("sharing", "a", 8, 2, 1)),
    ],
)
def test_check_names_each_injected_fault(tmp_path, capsys, edit, want):
    path = write_bundle(tmp_path / "b")
    edit_step(path, edit)
    code, found = violations(capsys, path, "--no-data")
    assert code == 1 and found, found
    got = {(v["check"], v["request"], v["token"], v["logical_block"], v["physical_block"]) for v in found}
    assert want in got, found
    v = next(v for v in found if v["check"] == want[0])
    if v["slot"] is not None and 0 <= v["slot"] < NB * BS:  # key element 0, KV head 0 at the record's slot; vllm-cpu: column-major K
        assert v["byte"] == (v["slot"] // BS * H * BS * 2 * D + v["slot"] % BS) * 4


def test_check_finds_collisions_dtypes_and_unshared_engines(tmp_path, capsys):
    path = write_bundle(tmp_path / "b", sharing="none")
    edit_step(path, lambda t: t.update(block_table=t["block_table"].to(torch.int64)))
    code, found = violations(capsys, path, "--no-data")
    assert {v["check"] for v in found} == {"dtype", "sharing"}
    path = write_bundle(tmp_path / "c")
    edit_step(path, lambda t: t["slot_mapping"].__setitem__(11, t["slot_mapping"][4]))  # b writes a's slot
    code, found = violations(capsys, path, "--no-data")
    assert "collision" in {v["check"] for v in found}


def test_check_data_catches_a_wrong_layout_claim(tmp_path, capsys):
    path = write_bundle(tmp_path / "b", "vllm-cpu")
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["kv_cache"]["layout"] = "vllm-hnd"
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, found = violations(capsys, path)
    assert code == 1 and {v["check"] for v in found} == {"data"} and len(found) == 12
    code, out, err = cli(capsys, "check", str(path))
    assert code == 1 and "data" in out and "failed: 12 violations" in out


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda m: m["kv_cache"].pop("block_size"), "manifest.json: kv_cache.block_size"),
        (lambda m: m["kv_cache"].update(layout="nhdx"), "manifest.json: kv_cache.layout"),
        (lambda m: m["model"].update(num_heads="4"), "manifest.json: model.num_heads"),
        (lambda m: m.update(steps=[]), "manifest.json: steps"),
        (lambda m: m["steps"][0].update(layers=[3]), "manifest.json: steps[0].layers[0]"),
        (lambda m: m.update(version=7), "manifest.json: version"),
    ],
)
def test_a_malformed_manifest_names_the_file_and_field(tmp_path, capsys, edit, field):
    path = write_bundle(tmp_path / "b")
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    for command in (["check", str(path)], ["replay", str(path)], ["lookup", "--from", str(path), "--request", "a"]):
        assert_usage_error(cli(capsys, *command), field)


@pytest.mark.parametrize(
    "edit,field",
    [
        (lambda t: t.pop("slot_mapping"), "step-0000.safetensors: slot_mapping"),
        (lambda t: t.update(seq_lens=torch.tensor([11], dtype=torch.int32)), "step-0000.safetensors: seq_lens"),
        (lambda t: t.update(block_table=torch.zeros(2, dtype=torch.int32)), "step-0000.safetensors: block_table"),
        (lambda t: t.update({"layer0.kv": t["layer0.kv"][:2]}), "step-0000.safetensors: layer0.kv"),
    ],
)
def test_a_malformed_step_file_names_the_file_and_field(tmp_path, capsys, edit, field):
    path = write_bundle(tmp_path / "b")
    edit_step(path, edit)
    assert_usage_error(cli(capsys, "check", str(path)), field)


def test_unreadable_bundles(tmp_path, capsys):
    assert_usage_error(cli(capsys, "check", str(tmp_path / "none")), "BUNDLE")
    (tmp_path / "e").mkdir()
    assert_usage_error(cli(capsys, "check", str(tmp_path / "e")), "manifest.json")
    path = write_bundle(tmp_path / "b")
    (path / "step-0000.safetensors").write_bytes(b"not safetensors")
    assert_usage_error(cli(capsys, "check", str(path)), "step-0000.safetensors: file")
    with pytest.raises(UsageError, match="already exists"):
        write_bundle(path)


def test_lookup_from_a_bundle_imports_no_torch(tmp_path):
    path = write_bundle(tmp_path / "b")
    code = (
        "import sys, json; from pagetrace.cli import run_cli; "
        f"rc = run_cli(['lookup', '--from', {str(path)!r}, '--request', 'b', '--token', '6', '--json']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["logical_block"], doc["offset"], doc["physical_block"], doc["slot"]) == (1, 2, 5, 22)
    page = 5 * H * BS * 2 * D  # vllm-cpu: block 5's first page, K column-major, V after K
    assert doc["key"]["element_offset"] == page + 2 and doc["key"]["byte_offset"] == (page + 2) * 4
    assert doc["value"]["element_offset"] == page + BS * D + 2 * D
    assert not doc["key"]["contiguous"] and doc["value"]["contiguous"]


def test_lookup_from_refuses_bad_requests_and_tokens(tmp_path, capsys):
    path = write_bundle(tmp_path / "b")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "zz"), "--request")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "10"), "--token")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path)), "--request")
    assert_usage_error(cli(capsys, "replay", str(path), "--request", "a", "--token", "40"), "--token")


def test_replay_refuses_a_wrong_layout_and_draws_shared_blocks(tmp_path, capsys):
    path = write_bundle(tmp_path / "b", "vllm-hnd")
    svg = tmp_path / "t.svg"
    code, out, err = cli(capsys, "replay", str(path), "--request", "a", "--token", "5", "--backend", "torch", "--svg", str(svg))
    assert code == 0 and "3(x2),5(x2),1" in out, out
    assert "ref count 2" in svg.read_text()
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["kv_cache"]["layout"] = "vllm-cpu"  # the same raw shape, read another way
    (path / "manifest.json").write_text(json.dumps(manifest))
    code, out, err = cli(capsys, "replay", str(path), "--json", "--backend", "torch")
    doc = json.loads(out)
    assert code == 1 and not doc["passed"] and min(r["max_diff_engine"] for r in doc["requests"]) > 0.1


def test_vllm_metadata_to_step_tensors_without_vllm():
    """`step_tensors` on an object shaped like vLLM's CPUAttentionMetadata (cpu_attn.py)."""
    from types import SimpleNamespace

    from pagetrace.engines.vllm import _window, capture, detect_layout, layer_index, step_tensors

    md = SimpleNamespace(
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32), seq_lens=torch.tensor([3, 6], dtype=torch.int32),
        block_table=torch.tensor([[2, 0, 0], [3, 5, 0]], dtype=torch.int32), slot_mapping=torch.tensor([8, 9, 10, 21, -1, -1]),
    )
    t = step_tensors(md, 4)
    assert t["positions"].tolist() == [0, 1, 2, 5] and t["block_counts"].tolist() == [1, 2] and t["blocks"].tolist() == [2, 3, 5]
    t = step_tensors(md, 4, positions=torch.tensor([0, 1, 2, 5, 0, 0]))
    assert t["positions"].tolist() == [0, 1, 2, 5]
    assert layer_index("model.layers.3.self_attn.attn") == 3
    assert (_window(-1), _window(None), _window((127, 0)), _window(64)) == (None, None, 128, 64)
    assert detect_layout("CPU_ATTN", torch.zeros(2, 2, 32, 64)) == "vllm-cpu"
    assert detect_layout("FLASH_ATTN", torch.zeros(2, 2, 32, 64)) == "vllm-hnd"
    assert detect_layout("FLASH_ATTN", torch.zeros(2, 32, 2, 64).transpose(1, 2)) == "vllm-nhd"
    assert detect_layout("FLASH_ATTN", torch.zeros(2, 5, 32, 2, 64)) == "flash"
    assert detect_layout("CPU_ATTN", torch.zeros(2, 2, 32, 64), "amx") == "vllm-cpu-amx"
    assert detect_layout("CPU_ATTN", torch.zeros(2, 2, 32, 64), "vec16") == "vllm-cpu"
    os_env = __import__("os").environ
    saved = os_env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    try:
        from pagetrace.errors import RuntimeFailure

        with pytest.raises(RuntimeFailure, match="VLLM_ENABLE_V1_MULTIPROCESSING=0"):
            capture(None, "x.bundle")
    finally:
        if saved is not None:
            os_env["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def attention_by_slots(q, k_rows, v_rows, scale):
    """[H, D] attention of one query over [n, Hkv, D] keys and values, written here."""
    group = q.shape[0] // k_rows.shape[1]
    kk, vv = k_rows.repeat_interleave(group, dim=1), v_rows.repeat_interleave(group, dim=1)
    return torch.einsum("ht,thd->hd", torch.softmax(torch.einsum("hd,thd->ht", q, kk) * scale, -1), vv)


def test_a_flashinfer_decode_step_as_a_bundle(tmp_path, capsys):
    # flashinfer's BatchDecodeWithPagedKVCacheWrapper example, smaller heads: 7 requests over 128 pages of 16
    indptr = torch.tensor([0, 17, 29, 44, 48, 66, 100, 128], dtype=torch.int32)
    indices = torch.arange(128).int()
    last = torch.tensor([1, 7, 14, 4, 3, 1, 16], dtype=torch.int32)
    torch.manual_seed(0)
    cache = torch.randn(128, 2, 16, 2, 16)  # [max_num_pages, 2, page_size, num_kv_heads, head_dim], NHD
    q = torch.randn(7, 4, 16)
    outs = []
    for r in range(7):
        n = (int(indptr[r + 1] - indptr[r]) - 1) * 16 + int(last[r])
        pages = [int(indices[indptr[r] + t // 16]) for t in range(n)]
        k_rows = torch.stack([cache[p, 0, t % 16] for t, p in enumerate(pages)])
        v_rows = torch.stack([cache[p, 1, t % 16] for t, p in enumerate(pages)])
        outs.append(attention_by_slots(q[r], k_rows, v_rows, 16**-0.5))
    path = flashinfer.write_bundle(tmp_path / "fi.bundle", indptr, indices, last, cache, kv_layout="NHD", page_size=16,
                                   num_qo_heads=4, query=q, output=torch.stack(outs))
    assert violations(capsys, path) == (0, [])
    code, out, err = cli(capsys, "replay", str(path), "--request", "6", "--backend", "torch", "--json")
    assert code == 0 and json.loads(out)["passed"]
    # one entry of kv_indices pointing into another request's pages is named
    bad = indices.clone()
    bad[17 + 3] = 5  # request 1's logical page 3 -> request 0's page 5 (its logical page 5)
    path = flashinfer.write_bundle(tmp_path / "bad.bundle", indptr, bad, last, cache, kv_layout="NHD", page_size=16, num_qo_heads=4)
    code, found = violations(capsys, path, "--no-data")
    assert code == 1 and [(v["check"], v["request"], v["token"], v["logical_block"], v["physical_block"]) for v in found] == [("sharing", "1", 48, 3, 5)]


def test_an_sglang_decode_step_as_a_bundle(tmp_path, capsys):
    torch.manual_seed(0)
    size, page = 64, 1
    k_buffer, v_buffer = torch.randn(size + page, H, D), torch.randn(size + page, H, D)  # slot 0: the padding slot
    req_to_token = torch.zeros(4, 32, dtype=torch.int32)
    req_to_token[2, :5] = torch.tensor([7, 8, 30, 31, 12])
    req_to_token[0, :3] = torch.tensor([40, 41, 3])
    lens, rows = [5, 3], [2, 0]
    out_cache_loc = [12, 3]  # the new (last) token of each request
    path = sglang.write_bundle(tmp_path / "sg.bundle", req_to_token, rows, lens, k_buffer, v_buffer, num_heads=4, out_cache_loc=out_cache_loc)
    assert violations(capsys, path) == (0, [])
    path = sglang.write_bundle(tmp_path / "bad.bundle", req_to_token, rows, lens, k_buffer, v_buffer, num_heads=4, out_cache_loc=[12, 41])
    code, found = violations(capsys, path, "--no-data")
    assert code == 1 and [(v["check"], v["request"], v["token"], v["physical_block"], v["slot"]) for v in found] == [("slot", "1", 2, 3, 41)], found


def test_a_broken_query_start_loc_is_reported_not_crashed_on(tmp_path, capsys):
    """The per-token and data checks index rows through query_start_loc: with it broken,
    check lists the query violations (data check on, its default) and replay refuses."""
    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["query_start_loc"].__setitem__(1, 50))
    code, out, err = cli(capsys, "check", str(path), "--json")
    assert code == 1, err
    found = json.loads(out)["steps"][0]["violations"]
    assert found and {v["check"] for v in found} == {"query"}, found
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch")
    assert code == 1 and "new tokens but seq_len" in err, err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("entry", [-5, 9])
def test_lookup_from_refuses_a_table_entry_outside_the_pool(tmp_path, capsys, entry):
    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["block_table"].__setitem__((1, 1), entry))
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "5")
    assert code == 1 and out == "" and f"= {entry} is outside the pool" in err, err


def test_lookup_from_options_that_would_be_ignored_are_refused(tmp_path, capsys):
    path = write_bundle(tmp_path / "b")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "5", "--svg", str(tmp_path / "x.svg")), "--svg")
    assert not (tmp_path / "x.svg").exists()
    assert_usage_error(cli(capsys, "lookup", "--request", "b"), "--request")
    assert_usage_error(cli(capsys, "lookup", "--from", str(path), "--token", "5"), "--request")


def test_check_header_has_no_gaps_and_counts_in_words(tmp_path, capsys):
    """A bundle without version or backend (FlashInfer's, SGLang's) prints no empty fields;
    one request, one token and one layer are said in the singular."""
    from pagetrace.engines.flashinfer import write_bundle as flashinfer_bundle

    k = torch.randn(NB, 2, BS, H, D)
    path = flashinfer_bundle(tmp_path / "fi", [0, 2], [3, 1], [2], k, kv_layout="NHD", page_size=BS, num_qo_heads=4,
                             query=torch.randn(1, 4, D), null_block=None)
    code, out, err = cli(capsys, "check", str(path))
    assert code == 0, out + err
    first = out.splitlines()[0]
    assert f"{path}: flashinfer · layout flashinfer · " in first and "  " not in first
    assert "step 0: 1 request, 1 new token: clean" in out
