"""Every layout's reported address must land on the right element of a real tensor.

Each element of the test cache encodes where it belongs: block, slot, head and dim
packed into one integer. The element at the offset pagetrace reports, in a flat view
of the tensor, must decode to the token's own (block, slot, head, dim).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagetrace.errors import UsageError
from pagetrace.paging.layouts import KERNEL_LAYOUTS, make_geometry, vector_address
from pagetrace.paging.lookup import trace_token
from pagetrace.attention.reference import canonical_cache, layout_cache


def encoded_cache(num_blocks, block_size, heads, head_dim):
    """Canonical [block, slot, head, dim] tensor whose elements encode their own index."""
    b, s, h, d = torch.meshgrid(
        torch.arange(num_blocks), torch.arange(block_size), torch.arange(heads), torch.arange(head_dim), indexing="ij"
    )
    return ((b * 1000 + s) * 100 + h) * 1000 + d  # int64, unique per element


geometries = st.fixed_dictionaries(
    {
        "layout": st.sampled_from(sorted(KERNEL_LAYOUTS)),
        "dtype": st.sampled_from(["fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]),
        "num_blocks": st.integers(1, 12),
        "block_size": st.integers(1, 20),
        "kv_heads": st.integers(1, 4),
        "chunks": st.integers(1, 6),
    }
)


@settings(max_examples=150, deadline=None)
@given(geometries, st.data())
def test_reported_offsets_hit_the_right_elements(g, data):
    kv_heads = 1 if g["layout"] == "blocks" else g["kv_heads"]
    x = 16 // {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}[g["dtype"]] if g["layout"] == "vllm" else 1
    head_dim = g["chunks"] * x if g["layout"] == "vllm" else data.draw(st.integers(1, 24))
    geom = make_geometry(g["layout"], g["num_blocks"], g["block_size"], kv_heads, head_dim, g["dtype"])
    canon = encoded_cache(g["num_blocks"], g["block_size"], kv_heads, head_dim)
    block = data.draw(st.integers(0, g["num_blocks"] - 1))
    slot = data.draw(st.integers(0, g["block_size"] - 1))
    head = data.draw(st.integers(0, kv_heads - 1))
    for which in ("key", "value"):
        tensor = layout_cache(canon, g["layout"], which, geom.x)
        assert tuple(tensor.shape) == geom.shape(which)
        # torch leaves the stride of a size-1 dim arbitrary; every other one must be row-major
        for size, got, want in zip(tensor.shape, tensor.stride(), torch.empty(geom.shape(which)).stride()):
            assert size == 1 or got == want
        addr = vector_address(geom, which, block, slot, head)
        flat = tensor.reshape(-1)
        got = torch.cat([flat[c.element_offset : c.element_offset + c.elements] for c in addr.chunks])
        want = canon[block, slot, head]
        assert torch.equal(got, want), (which, addr)
        assert addr.byte_offset == addr.element_offset * geom.element_size
        assert sum(c.elements for c in addr.chunks) == head_dim
        # the round trip back to canonical is the reference's gather path
        assert torch.equal(canonical_cache(tensor, g["layout"], which), canon)


def test_worked_example_addresses():
    t = trace_token(20, [7, 2, 15])
    assert (t.location.slot, t.key.element_offset, t.key.byte_offset, t.key.block_base) == (36, 288, 1152, 256)
    assert t.key.contiguous and t.value.contiguous


def test_vllm_key_is_chunked_and_value_strided():
    t = trace_token(20, [7, 2, 15], layout="vllm", head_dim=16, kv_heads=2, head=1, dtype="fp16")
    # key [16, 2, 2, 16, 8]: two chunks of x = 8 elements, block_size * x = 128 apart
    assert [(c.element_offset, c.elements) for c in t.key.chunks] == [(1312, 8), (1440, 8)]
    assert t.key.chunk_stride == 128
    # value [16, 2, 16, 16]: 16 single elements, block_size apart
    assert len(t.value.chunks) == 16 and t.value.chunk_stride == 16


@pytest.mark.parametrize(
    "kwargs, option",
    [
        ({"layout": "vllm", "head_dim": 12, "dtype": "fp16"}, "--head-dim"),
        ({"layout": "blocks", "kv_heads": 2}, "--kv-heads"),
        ({"layout": "nope"}, "--layout"),
        ({"dtype": "int4"}, "--dtype"),
        ({"block_size": 0}, "--block-size"),
        ({"head_dim": 0}, "--head-dim"),
    ],
)
def test_geometry_refusals(kwargs, option):
    args = {"layout": "nhd", "num_blocks": 16, "block_size": 16, "num_kv_heads": 1, "head_dim": 8, "dtype": "fp32"}
    args.update({k if k != "kv_heads" else "num_kv_heads": v for k, v in kwargs.items()})
    with pytest.raises(UsageError) as err:
        make_geometry(**args)
    assert err.value.option == option


def test_head_dim_is_bounded():
    from pagetrace.paging.blocks import MAX_HEAD_DIM

    with pytest.raises(UsageError) as err:
        make_geometry("nhd", 16, 16, 1, MAX_HEAD_DIM + 1, "fp32")
    assert err.value.option == "--head-dim"
