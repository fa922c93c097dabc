"""Each layout's shape and strides, pinned from the engines' own documentation, not from
`pagetrace.paging.layouts.LAYOUTS`: a wrong entry in that table cannot agree with itself here.

Sources (the shapes written below by hand):
  blocks          the worked example: k_cache = torch.randn(num_blocks, block_size, head_dim)
  nhd             FlashAttention flash_attn_with_kvcache: k_cache (num_blocks, page_block_size, nheads_k, headdim);
                  FlashInfer NHD: (max_num_pages, page_size, num_heads, head_dim)
  hnd             FlashInfer HND: (max_num_pages, num_heads, page_size, head_dim)
  vllm            vLLM csrc/attention paged_attention_v1: key_cache [num_blocks, num_heads, head_size/x, block_size, x],
                  value_cache [num_blocks, num_heads, head_size, block_size], x = 16 bytes / element size
  flash(-hnd)     vLLM V1 flash_attn.py get_kv_cache_shape (2, num_blocks, block_size, num_kv_heads, head_size),
                  stride order (0,1,2,3,4) NHD / (0,1,3,2,4) HND
  flashinfer(-hnd) vLLM V1 flashinfer.py / triton_attn.py (num_blocks, 2, block_size, num_kv_heads, head_size),
                  same stride orders
The combined layouts are checked against a real allocation made the way vLLM's model
runner makes it: a contiguous tensor in stride order, permuted back to the logical shape.
"""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.paging.layouts import make_geometry
from pagetrace.paging.lookup import trace_token
from pagetrace.paging.where import where_byte

NB, BS, H, D = 5, 4, 3, 16  # blocks, block size, KV heads, head dim


def strides_of(shape):
    return tuple(torch.empty(shape).stride())


# (layout, dtype, key shape, key strides, value shape, value strides), by hand
PINNED = [
    ("blocks", "fp32", (NB, BS, D), (BS * D, D, 1), (NB, BS, D), (BS * D, D, 1)),
    ("nhd", "fp32", (NB, BS, H, D), (BS * H * D, H * D, D, 1), (NB, BS, H, D), (BS * H * D, H * D, D, 1)),
    ("hnd", "fp32", (NB, H, BS, D), (H * BS * D, BS * D, D, 1), (NB, H, BS, D), (H * BS * D, BS * D, D, 1)),
    # fp16: x = 8; key [NB, H, D/8, BS, 8], value [NB, H, D, BS]
    ("vllm", "fp16", (NB, H, D // 8, BS, 8), (H * D * BS, D * BS, BS * 8, 8, 1), (NB, H, D, BS), (H * D * BS, D * BS, BS, 1)),
    ("vllm", "fp32", (NB, H, D // 4, BS, 4), (H * D * BS, D * BS, BS * 4, 4, 1), (NB, H, D, BS), (H * D * BS, D * BS, BS, 1)),
    # combined: one tensor, its logical shape and the strides of vLLM's allocation
    ("flash", "fp16", (2, NB, BS, H, D), (NB * BS * H * D, BS * H * D, H * D, D, 1)) + ((2, NB, BS, H, D), (NB * BS * H * D, BS * H * D, H * D, D, 1)),
    ("flash-hnd", "fp16", (2, NB, BS, H, D), (NB * H * BS * D, H * BS * D, D, BS * D, 1)) + ((2, NB, BS, H, D), (NB * H * BS * D, H * BS * D, D, BS * D, 1)),
    ("flashinfer", "bf16", (NB, 2, BS, H, D), (2 * BS * H * D, BS * H * D, H * D, D, 1)) + ((NB, 2, BS, H, D), (2 * BS * H * D, BS * H * D, H * D, D, 1)),
    ("flashinfer-hnd", "bf16", (NB, 2, BS, H, D), (2 * H * BS * D, H * BS * D, D, BS * D, 1)) + ((NB, 2, BS, H, D), (2 * H * BS * D, H * BS * D, D, BS * D, 1)),
]


@pytest.mark.parametrize("layout, dtype, key_shape, key_strides, value_shape, value_strides", PINNED, ids=[p[0] + "-" + p[1] for p in PINNED])
def test_documented_shape_and_strides(layout, dtype, key_shape, key_strides, value_shape, value_strides):
    heads = 1 if layout == "blocks" else H
    t = trace_token(0, [0], block_size=BS, head_dim=D, kv_heads=heads, dtype=dtype, layout=layout, num_blocks=NB)
    assert (tuple(t.key.shape), tuple(t.key.strides)) == (key_shape, key_strides)
    assert (tuple(t.value.shape), tuple(t.value.strides)) == (value_shape, value_strides)


def vllm_allocation(layout):
    """The combined cache as vLLM allocates it, every element encoding (kv, block, slot, head, dim)."""
    logical = (2, NB, BS, H, D) if layout.startswith("flash-") or layout == "flash" else (NB, 2, BS, H, D)
    order = (0, 1, 3, 2, 4) if layout.endswith("-hnd") else (0, 1, 2, 3, 4)
    inverse = [order.index(i) for i in range(5)]
    physical = torch.arange(2 * NB * BS * H * D).reshape([logical[i] for i in order])
    tensor = physical.permute(*inverse)  # logical view over the stride-ordered memory
    assert tuple(tensor.shape) == logical
    kv, block, slot, head, dim = torch.meshgrid(*(torch.arange(n) for n in (2, NB, BS, H, D)), indexing="ij")
    code = (((kv * 100 + block) * 100 + slot) * 100 + head) * 100 + dim
    if logical[0] != 2:
        code = code.permute(1, 0, 2, 3, 4)
    filled = torch.empty_like(physical).permute(*inverse)
    filled.copy_(code)
    memory = filled.permute(*order).contiguous().reshape(-1)  # its bytes in memory order
    return tensor, memory


@pytest.mark.parametrize("layout", ["flash", "flash-hnd", "flashinfer", "flashinfer-hnd"])
def test_combined_offsets_hit_a_real_allocation(layout):
    tensor, memory = vllm_allocation(layout)
    for token, table in ((0, [0]), (6, [3, 1]), (BS * 2 - 1, [4, 2])):
        for head in range(H):
            t = trace_token(token, table, block_size=BS, head_dim=D, kv_heads=H, head=head, dtype="fp16", layout=layout, num_blocks=NB)
            assert tuple(t.key.strides) == tuple(tensor.stride())  # the view's strides, as torch reports them
            block, slot = table[token // BS], token % BS
            for kv, addr in enumerate((t.key, t.value)):
                got = torch.cat([memory[c.element_offset : c.element_offset + c.elements] for c in addr.chunks])
                want = torch.tensor([(((kv * 100 + block) * 100 + slot) * 100 + head) * 100 + d for d in range(D)])
                assert torch.equal(got, want), (layout, kv, addr)
                assert addr.byte_offset == addr.element_offset * 2
                # the block's part of this cache starts at its (slot 0, head 0, dim 0)
                assert int(memory[addr.block_base]) == ((kv * 100 + block) * 100) * 100 * 100


@settings(max_examples=200, deadline=None)
@given(
    layout=st.sampled_from(["blocks", "nhd", "hnd", "vllm", "flash", "flash-hnd", "flashinfer", "flashinfer-hnd"]),
    dtype=st.sampled_from(["fp32", "fp16", "bf16", "fp8_e4m3"]),
    data=st.data(),
)
def test_where_inverts_lookup(layout, dtype, data):
    """Every byte of a traced key or value vector decodes back to its block, offset, head, dim and side."""
    size = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1}[dtype]
    heads = 1 if layout == "blocks" else data.draw(st.integers(1, 4))
    head_dim = (16 // size) * data.draw(st.integers(1, 3))
    bs = data.draw(st.integers(1, 9))
    table = data.draw(st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True))
    token = data.draw(st.integers(0, len(table) * bs - 1))
    head = data.draw(st.integers(0, heads - 1))
    t = trace_token(token, table, block_size=bs, head_dim=head_dim, kv_heads=heads, head=head, dtype=dtype, layout=layout)
    geom = make_geometry(layout, t.geometry.num_blocks, bs, heads, head_dim, dtype)
    for addr in (t.key, t.value):
        chunk = data.draw(st.sampled_from(addr.chunks))
        k = data.draw(st.integers(0, chunk.elements - 1))
        byte = (chunk.element_offset + k) * size + data.draw(st.integers(0, size - 1))
        place = where_byte(geom, byte, None if geom.layout.combined else addr.which, [table])
        assert (place.which, place.block, place.offset, place.head, place.dim) == (addr.which, table[token // bs], token % bs, head, chunk.first_dim + k)
        assert [(o.sequence, o.token) for o in place.owners] == [(0, token)]


def test_where_cli_json_worked_example():
    result = CliRunner().invoke(app, ["where", "--byte", "1155", "--table", "7,2,15", "--table", "2,9", "--json"])
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["physical_block"], doc["offset"], doc["slot"], doc["cache"], doc["dim"], doc["byte_in_element"]) == (2, 4, 36, "key", 0, 3)
    assert doc["owners"] == [{"sequence": 0, "logical_block": 1, "token": 20}, {"sequence": 1, "logical_block": 0, "token": 4}]


def test_lookup_json_chunk_byte_offsets():
    """Bytes, not only elements: fp16 vllm key chunks at elements 1312 and 1440 are bytes 2624 and 2880."""
    result = CliRunner().invoke(app, ["lookup", "--layout", "vllm", "--dtype", "fp16", "--head-dim", "16", "--kv-heads", "2", "--head", "1", "--json"])
    doc = json.loads(result.stdout)
    assert [(c["element_offset"], c["byte_offset"]) for c in doc["key"]["chunks"]] == [(1312, 2624), (1440, 2880)]
    assert doc["key"]["byte_offset"] == 2624 and doc["key"]["block_base_byte"] == 2 * 512 * 2
    assert [c["byte_offset"] for c in doc["value"]["chunks"][:3]] == [2 * (1024 + 256 + 4), 2 * (1024 + 256 + 4 + 16), 2 * (1024 + 256 + 4 + 32)]
