"""What the engine adapters say when handed the wrong thing, word for word, and what they
hand back when it is right: a user who passes a wrong view, a req_to_token row that is not
page-aligned or a CSR table that does not add up reads one message naming the argument,
its value and what the engine's convention wants."""

from __future__ import annotations

import json

import pytest
import torch
from bundles import engine_buffer
from test_engines import encoded

from pagetrace.engines import flashinfer, sglang
from pagetrace.engines.views import KVView, as_tensors, check_view, describe, expected_view, geometry, verify
from pagetrace.errors import UsageError

NB, BS, H, D = 6, 4, 2, 8


def message(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as caught:
        call(*args, **kwargs)
    return str(caught.value)


# -- views -------------------------------------------------------------------------------

def test_check_view_names_shape_stride_and_offset():
    geom = geometry("vllm-cpu", NB, BS, H, D, "fp32")
    want = expected_view(geom, "key")
    assert want == KVView("key", (NB, BS, H, D), (H * BS * 2 * D, 1, BS * 2 * D, BS), 0, 4, "kv")
    short = KVView("key", (NB, BS, H, D - 1), want.strides, 0, 4)
    assert message(check_view, short, want, "vllm-cpu") == (
        f"invalid value for key view: {[NB, BS, H, D - 1]}: the 'vllm-cpu' layout gives shape {[NB, BS, H, D]} (block, slot, head, dim)")
    # a head axis of exactly 2 with the wrong stride reads other memory
    bent = KVView("key", want.shape, (want.strides[0], 1, 7, BS), 0, 4)
    assert message(check_view, bent, want, "vllm-cpu") == (
        f"invalid value for key view: {[want.strides[0], 1, 7, BS]}: its head stride is 7 elements; the 'vllm-cpu' layout has "
        f"{BS * 2 * D} (strides {list(want.strides)})")
    moved = KVView("value", want.shape, want.strides, 3, 4)
    assert message(check_view, moved, want, "vllm-cpu") == (
        "invalid value for value view: 3: starts 3 elements into the buffer; the 'vllm-cpu' layout starts it at 0")


def test_verify_returns_both_views_and_names_a_bad_layout():
    raw = engine_buffer("vllm-cpu", encoded(1), encoded(2))
    key, value = as_tensors(raw, "vllm-cpu", BS, H, D)
    got = verify(key, value, raw, "vllm-cpu")
    geom = geometry("vllm-cpu", NB, BS, H, D, "fp32")
    assert got == (expected_view(geom, "key"), expected_view(geom, "value"))
    assert got[1].offset == BS * D and got[1].which == "value"
    assert got == (describe(key, raw, "key"), describe(value, raw, "value"))
    assert message(verify, key, value, raw, "vllm-cpux").startswith("invalid value for layout: 'vllm-cpux': choose one of ")
    amx = engine_buffer("vllm-cpu-amx", encoded(1, 32, 32)[:1].repeat(NB, 1, 1, 1), encoded(2, 32, 32)[:1].repeat(NB, 1, 1, 1))
    k, v = as_tensors(amx, "vllm-cpu-amx", 32, H, 32)
    assert message(verify, k, v, amx, "vllm-cpu-amx") == (
        "invalid value for layout: 'vllm-cpu-amx': is tiled: no strided view reads it; take K and V from "
        "pagetrace.engines.views.as_tensors (a copy)")


def test_verify_reads_the_dtype_of_the_tensors():
    """vLLM's split-key layout splits head_dim into runs of 16 bytes: 8 fp16 elements, so a
    head_dim of 8 is one run (a plain stride) in fp16 and two runs (no stride reads it) in fp32."""
    k16, v16 = encoded(1).half(), encoded(2).half()
    key_raw = k16.view(NB, BS, H, 1, 8).permute(0, 2, 3, 1, 4).contiguous()  # [block, head, dim/x, slot, x]
    value_raw = v16.permute(0, 2, 3, 1).contiguous()  # [block, head, dim, slot]
    key, value = as_tensors((key_raw, value_raw), "vllm", BS, H, D)
    assert torch.equal(key, k16) and torch.equal(value, v16)
    k_view, v_view = verify(key, value, (key_raw, value_raw), "vllm")
    assert k_view.element_size == 2 and k_view.buffer == "key" and v_view.buffer == "value"


def test_as_tensors_names_a_wrong_shape_and_a_strided_buffer():
    raw = engine_buffer("flashinfer", encoded(1), encoded(2))
    assert message(as_tensors, raw, "flashinfer", BS, H, D + 1).startswith(
        f"invalid value for kv_cache: {tuple(raw.shape)}: the 'flashinfer' layout with block size {BS}, {H} KV heads, head_dim {D + 1} has shape")
    assert message(as_tensors, raw.transpose(0, 1), "flashinfer", BS, H, D).endswith("the 'flashinfer' layout reads a contiguous buffer")
    assert message(as_tensors, raw, "nhd", BS, H, D) == (
        "invalid value for kv_cache: 'Tensor': the 'nhd' layout keeps K and V in two tensors: pass a (key, value) pair")


# -- SGLang --------------------------------------------------------------------------------

def test_sglang_refusals_name_the_request_token_and_slot():
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_to_token[1, :6] = torch.tensor([8, 9, 10, 11, 20, 21])  # pages 2 and 5 of 4
    assert sglang.block_tables(req_to_token, [1], [6], 4) == [[2, 5]]
    req_to_token[1, 4] = 22  # a page starting at slot 22
    assert message(sglang.block_tables, req_to_token, [1], [6], 4) == (
        "invalid value for req_to_token: 22: request 0 token 4 starts a page at slot 22, not a multiple of page_size 4")
    req_to_token[1, 4], req_to_token[1, 5] = 20, 23
    assert message(sglang.block_tables, req_to_token, [1], [6], 4) == (
        "invalid value for req_to_token: 23: request 0 token 5: expected slot 21 in page 5")
    req_to_token[1, 5] = 21
    req_to_token[1, 3] = 12
    assert message(sglang.block_tables, req_to_token, [1], [6], 4) == (
        "invalid value for req_to_token: 12: request 0 token 3: expected slot 11 in page 2")
    k = torch.zeros(18, H, D)
    assert message(sglang.kv_views, k, k, 4) == "invalid value for page_size: 4: the buffers hold 18 slots, not a whole number of pages"


@pytest.mark.parametrize("page_size", [1, 2])
def test_sglang_bundle_records_the_engine_pages_query_output_and_null_page(tmp_path, page_size):
    from safetensors.torch import load_file

    torch.manual_seed(0)
    k_buffer, v_buffer = torch.randn(16, H, D), torch.randn(16, H, D)
    req_to_token = torch.zeros(2, 8, dtype=torch.int32)
    req_to_token[1, :3] = torch.tensor([4, 5, 6])  # pages 2 and 3 of 2 (or slots 4..6)
    q, out = torch.randn(1, 4, D), torch.randn(1, 4, D)
    path = sglang.write_bundle(tmp_path / "sg", req_to_token, [1], [3], k_buffer, v_buffer, num_heads=4, page_size=page_size,
                               out_cache_loc=[6], query=q, output=out)
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["engine"]["name"] == "sglang"
    assert manifest["kv_cache"]["block_size"] == page_size and manifest["kv_cache"]["null_block"] == 0
    assert manifest["kv_cache"]["layout"] == "nhd" and manifest["model"]["num_heads"] == 4
    tensors = load_file(str(path / "step-0000.safetensors"))
    assert torch.equal(tensors["layer0.query"], q) and torch.equal(tensors["layer0.output"], out)
    assert tensors["slot_mapping"].tolist() == [6]
    want = [[4, 5, 6]] if page_size == 1 else [[2, 3]]
    assert tensors["block_table"].tolist() == want
    path = sglang.write_bundle(tmp_path / "sg2", req_to_token, [1], [3], k_buffer, v_buffer, num_heads=4, page_size=page_size)
    assert load_file(str(path / "step-0000.safetensors"))["slot_mapping"].tolist() == [6]  # from the table when not given


# -- FlashInfer ------------------------------------------------------------------------------

def test_flashinfer_refusals_name_the_argument():
    assert message(flashinfer.block_tables, [0, 3], [1, 2, 3], [2, 2], 4) == (
        "invalid value for kv_indptr: [0, 3]: needs batch + 1 = 3 offsets from 0 to at most len(kv_indices) = 3")
    assert message(flashinfer.block_tables, [1, 3], [1, 2, 3], [2], 4).startswith("invalid value for kv_indptr: [1, 3]: needs batch + 1 = 2")
    assert message(flashinfer.block_tables, [0, 3, 3], [1, 2, 3], [2, 2], 4) == "invalid value for kv_indptr: [0, 3, 3]: request 1 has no pages"
    assert message(flashinfer.block_tables, [0, 2, 3], [1, 2, 3], [2, 5], 4) == (
        "invalid value for kv_last_page_len: [2, 5]: request 1: the last page holds 1..4 tokens")
    assert flashinfer.block_tables([0, 2, 3], [1, 2, 3], [4, 1], 4) == ([[1, 2], [3]], [8, 1])
    cache = torch.zeros(NB, 2, BS, H, D)
    assert message(flashinfer.cache_layout, cache, "nhd") == "invalid value for kv_layout: 'nhd': FlashInfer's layouts are NHD and HND"
    assert flashinfer.cache_layout(cache, "HND").name == "flashinfer-hnd" and flashinfer.cache_layout((cache, cache), "HND").name == "hnd"


def test_as_tensors_names_a_bad_layout_a_strided_buffer_and_takes_any_float():
    raw = engine_buffer("flashinfer", encoded(1), encoded(2))
    assert message(as_tensors, raw, "flashinferx", BS, H, D).startswith("invalid value for layout: 'flashinferx': choose one of ")
    assert message(geometry, "nhdx", NB, BS, H, D, "fp32").startswith("invalid value for layout: 'nhdx': choose one of ")
    strided = raw.transpose(2, 3)
    assert message(as_tensors, strided, "flashinfer", BS, H, D) == (
        f"invalid value for kv_cache: {tuple(strided.stride())}: the 'flashinfer' layout reads a contiguous buffer")
    k64, v64 = encoded(1).double(), encoded(2).double()
    key, value = as_tensors((k64, v64), "nhd", BS, H, D)  # no pagetrace dtype: read as elements all the same
    assert torch.equal(key, k64) and torch.equal(value, v64)
    assert message(as_tensors, (k64, v64, v64), "nhd", BS, H, D) == (
        "invalid value for kv_cache: 'tuple': the 'nhd' layout keeps K and V in two tensors: pass a (key, value) pair")
    flat = torch.zeros(4)
    assert message(as_tensors, flat, "flashinfer", BS, H, D).startswith("invalid value for kv_cache: (4,): the 'flashinfer' layout")
