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
