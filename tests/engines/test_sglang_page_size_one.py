"""SGLang's default page size, 1 (`--page-size`): every token is its
own page, so a request's slots may lie anywhere in the pool and in any order, and a layer's
k_buffer / v_buffer of [size + 1, H, D] is read as size + 1 pages of one slot."""

from __future__ import annotations

import torch

from pagetrace.engines import sglang

H, D = 2, 8


def test_block_tables_by_default_take_each_slot_as_a_page():
    req_to_token = torch.zeros(4, 16, dtype=torch.int32)
    req_to_token[2, :3] = torch.tensor([5, 2, 9])  # scattered and out of order: fine with pages of 1
    req_to_token[0, :2] = torch.tensor([7, 8])
    assert sglang.block_tables(req_to_token, [2, 0], [3, 2]) == [[5, 2, 9], [7, 8]]


def test_kv_views_by_default_read_one_slot_per_page():
    size = 9
    k_buffer = torch.arange((size + 1) * H * D, dtype=torch.float32).reshape(size + 1, H, D)
    v_buffer = -k_buffer
    key, value = sglang.kv_views(k_buffer, v_buffer)
    assert key.shape == value.shape == (size + 1, 1, H, D)
    for slot in (0, 5, size):
        assert torch.equal(key[slot, 0], k_buffer[slot]) and torch.equal(value[slot, 0], v_buffer[slot])
