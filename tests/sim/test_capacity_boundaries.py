"""`capacity` at its boundaries: lengths that do not divide by the block size, the null
block, exact block multiples of memory, decimal against binary units. Every expected
figure is computed here from vLLM's formula written out."""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli

from pagetrace.sim.capacity import ModelDims, capacity, device_budget, parse_memory

DIMS = ModelDims(num_layers=2, num_kv_heads=1, head_dim=4, dtype="fp16")  # 2 x 1 x (4 + 4) x 2 = 32 bytes a token


@pytest.mark.parametrize(("length", "blocks_each"), [(15, 1), (16, 1), (17, 2), (31, 2), (32, 2), (33, 3), (1, 1)])
def test_request_length_not_dividing_by_the_block_size_rounds_up(length, blocks_each):
    """A 16-token block is 512 bytes; 10 blocks of memory hold 9 usable (block 0 is null)."""
    cap = capacity(DIMS, 10 * 512, block_size=16, length=length)
    assert cap.bytes_per_token == 32 and cap.bytes_per_block == 512 and cap.bytes_per_block_per_layer == 256
    assert (cap.num_blocks, cap.usable_blocks, cap.tokens) == (10, 9, 9 * 16)
    assert cap.blocks_per_request == blocks_each
    assert cap.requests == 9 // blocks_each
    assert cap.requests_closed_form == pytest.approx(10 * 512 / (32 * length))


def test_memory_one_byte_short_of_a_block_drops_it():
    assert capacity(DIMS, 3 * 512 - 1, 16).num_blocks == 2
    assert capacity(DIMS, 3 * 512, 16).num_blocks == 3
    with pytest.raises(Exception, match="at least 2"):
        capacity(DIMS, 2 * 512 - 1, 16)
    assert capacity(DIMS, 2 * 512, 16).usable_blocks == 1


@pytest.mark.parametrize(("text", "bytes_"), [("1MB", 10**6), ("1MiB", 2**20), ("1 mib", 2**20), ("1.5GiB", 3 * 2**29),
                                              ("2GB", 2 * 10**9), ("1kB", 1000), ("1KiB", 1024), ("1TB", 10**12),
                                              ("1TiB", 2**40), ("512", 512), ("1e3", 1000), ("7b", 7)])
def test_units_decimal_and_binary(text, bytes_):
    assert parse_memory(text) == bytes_


def test_mib_against_mb_on_the_command_line(capsys):
    """1 MiB holds 2,048 blocks of 512 bytes; 1 MB holds 1,953 (1,000,000 // 512)."""
    args = ["capacity", "--layers", "2", "--kv-heads", "1", "--head-dim", "4", "--dtype", "fp16", "--length", "17", "--json"]
    code, out, err = cli(capsys, *args, "--memory", "1MiB")
    assert code == 0, err
    mib = json.loads(out)
    code, out, err = cli(capsys, *args, "--memory", "1MB")
    mb = json.loads(out)
    assert (mib["memory_bytes"], mib["num_blocks"], mib["requests"]) == (2**20, 2048, 2047 // 2)
    assert (mb["memory_bytes"], mb["num_blocks"], mb["requests"]) == (10**6, 1953, 1952 // 2)


def test_memory_units_refused_by_name(capsys):
    for bad in ("1MiBs", "1 M", "-1GB", "0.5"):
        assert_usage_error(cli(capsys, "capacity", "--memory", bad), "--memory")


def test_device_budget_rounds_the_share_up_and_needs_a_positive_remainder():
    b = device_budget(1001, 0.5, 100, "w", 50, "a", 0)
    assert b.requested_bytes == 501 and b.kv_cache_bytes == 351  # ceil(500.5)
    assert device_budget(1000, 1.0, 0, "w", 0, "a", 0).kv_cache_bytes == 1000
    with pytest.raises(Exception, match="leaves nothing"):
        device_budget(1000, 0.5, 400, "w", 100, "a", 0)  # exactly 0 left
    for bad in (0.0, 1.0000001, float("nan")):
        with pytest.raises(Exception, match="gpu-memory-utilization"):
            device_budget(1000, bad, 0, "w", 0, "a", 0)


def test_the_layer_limit_is_inclusive(capsys):
    args = ["capacity", "--memory", "1TiB", "--json"]
    code, out, err = cli(capsys, *args, "--layers", "4096")
    assert code == 0, err
    assert json.loads(out)["bytes_per_block"] == 4096 * 8 * 2 * 128 * 2 * 16
    assert_usage_error(cli(capsys, *args, "--layers", "4097"), "--layers")
