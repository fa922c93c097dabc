"""`views.as_tensors` handed a buffer with fewer axes than its layout's block axis (one
layer's pool flattened, as an allocator hands it out), and `coordinate_grid` on the device
it is asked for (the tiled layouts gather through it; `meta` here: no memory, no GPU)."""

from __future__ import annotations

import pytest
import torch

from pagetrace.engines.views import as_tensors, coordinate_grid
from pagetrace.errors import UsageError


def test_a_flat_buffer_is_refused_with_the_shape_the_layout_needs():
    """flash keeps blocks on axis 1 ([2, num_blocks, ...]): a 1-D buffer has no axis 1, so no
    blocks are counted; flashinfer keeps them on axis 0: 768 "blocks" of the wrong shape."""
    flat = torch.zeros(2 * 6 * 4 * 2 * 8)
    for layout, want in (("flash", (2, 0, 4, 2, 8)), ("flashinfer", (768, 2, 4, 2, 8))):
        with pytest.raises(UsageError) as caught:
            as_tensors(flat, layout, 4, 2, 8)
        assert str(caught.value) == f"invalid value for kv_cache: (768,): the '{layout}' layout with block size 4, 2 KV heads, head_dim 8 has shape {want}"


def test_coordinate_grid_lies_on_the_device_asked_for():
    grid = coordinate_grid(2, 3, 1, 4, device="meta")
    assert [g.device.type for g in grid] == ["meta"] * 4
    assert [tuple(g.shape) for g in grid] == [(2, 1, 1, 1), (1, 3, 1, 1), (1, 1, 1, 1), (1, 1, 1, 4)]
    cpu = coordinate_grid(2, 3, 1, 4)
    assert [g.flatten().tolist() for g in cpu] == [[0, 1], [0, 1, 2], [0], [0, 1, 2, 3]]


def test_an_fp8_cache_vllm_keeps_in_uint8_is_read_with_one_byte_elements():
    """vLLM allocates an fp8 KV cache as torch.uint8 (vllm/utils/torch_utils.py). Its split key
    [N, H, D/x, bs, x] then has x = 16 one-byte elements; read as 4-byte elements (x = 4) the
    buffer had the wrong shape and was refused. Each byte here is its own offset mod 251 (prime,
    so no two neighbours in any axis repeat); int8 caches alike. The views read key [b, s, h, d] at
    [b, h, d // 16, s, d % 16] and value [b, s, h, d] at [b, h, d, s]."""
    nb, bs, h, d = 3, 16, 2, 32
    b, s, hh, dd = torch.meshgrid(*(torch.arange(n) for n in (nb, bs, h, d)), indexing="ij")
    for dtype in (torch.uint8, torch.int8):
        key_raw = (torch.arange(nb * h * (d // 16) * bs * 16) % 251 - 120).to(dtype).view(nb, h, d // 16, bs, 16)
        value_raw = ((torch.arange(nb * h * d * bs) + 7) % 251 - 120).to(dtype).view(nb, h, d, bs)
        key, value = as_tensors((key_raw, value_raw), "vllm", bs, h, d)
        assert torch.equal(key, key_raw[b, hh, dd // 16, s, dd % 16])
        assert torch.equal(value, value_raw[b, hh, dd, s])

