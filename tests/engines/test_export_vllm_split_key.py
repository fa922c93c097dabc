"""`export.write_bundle` on vLLM's paged-attention layout, where the key's head_dim is split
in two axes (vllm/attention/ops/paged_attn.py `get_kv_cache_shape`, csrc reshape_and_cache):
key [num_blocks, num_kv_heads, head_dim / x, block_size, x] with x = 16 bytes / element size,
value [num_blocks, num_kv_heads, head_dim, block_size]. The last axis of the key is x, not
head_dim: the heads and head_dim are found from the whole shape. Then the search's edges:
the smallest pool, an empty one, a table entry one past the pool with nothing written."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cli
from test_engine_boundaries import engine_output

from pagetrace.engines.export import write_bundle
from pagetrace.errors import UsageError

NB, BS, H, D = 8, 4, 2, 16


def vllm_buffers(k, v, x):
    """K and V ([NB, BS, H, D]) laid out as vLLM's kernels write them."""
    key = k.view(NB, BS, H, D // x, x).permute(0, 2, 3, 1, 4).contiguous()
    value = v.permute(0, 2, 3, 1).contiguous()
    return key, value


@pytest.mark.parametrize("dtype, x", [(torch.float32, 4), (torch.float16, 8)])
def test_a_vllm_split_key_cache_exports_checks_and_replays(tmp_path, capsys, dtype, x):
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, H, D).to(dtype), torch.randn(NB, BS, H, D).to(dtype)
    tables, lens, qlens = [[3, 5, 1], [6, 2]], [11, 5], [3, 1]
    q = torch.randn(sum(qlens), 2 * H, D).to(dtype)
    out = engine_output(q.float(), k.float(), v.float(), tables, lens, qlens, None, D**-0.5)
    key, value = vllm_buffers(k, v, x)
    assert key.shape == (NB, H, D // x, BS, x)
    path = write_bundle(tmp_path / "b", engine="vllm", layout="vllm", cache=(key, value), block_size=BS, num_heads=2 * H,
                        tables=tables, seq_lens=lens, query_lens=qlens, query=q, output=out.to(dtype))
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["model"]["num_kv_heads"], manifest["model"]["head_dim"]) == (H, D)
    code, text, err = cli(capsys, "check", str(path), "--json")
    assert code == 0 and json.loads(text)["steps"][0]["violations"] == [], text
    for request in ("0", "1"):
        code, text, err = cli(capsys, "replay", str(path), "--backend", "torch", "--request", request, "--json")
        assert code == 0 and json.loads(text)["passed"], text


def test_export_finds_integer_dims_and_refuses_an_empty_pool(tmp_path, capsys):
    """The smallest pool, one block of one slot (SGLang's page size 1), still fixes H and D;
    a pool of no block fixes nothing and is refused; the manifest's sizes are integers."""
    one = (torch.randn(1, 1, H, D), torch.randn(1, 1, H, D))
    path = write_bundle(tmp_path / "one", engine="mine", layout="nhd", cache=one, block_size=1, num_heads=2 * H, tables=[[0]], seq_lens=[1])
    model = json.loads((path / "manifest.json").read_text())["model"]
    assert [(model[k], type(model[k])) for k in ("num_kv_heads", "head_dim")] == [(H, int), (D, int)]
    empty = (torch.randn(0, BS, H, D), torch.randn(0, BS, H, D))
    with pytest.raises(UsageError) as caught:
        write_bundle(tmp_path / "empty", engine="mine", layout="nhd", cache=empty, block_size=BS, num_heads=2 * H, tables=[[0]], seq_lens=[1])
    assert str(caught.value) == f"invalid value for cache: {(0, BS, H, D)}: holds no 'nhd' block of {BS} slots"


def test_a_table_one_past_the_pool_with_nothing_written(tmp_path, capsys):
    """A snapshot of tables, no new token (query_lens 0): request 0's only entry is block NB,
    one past the pool, so no page is stored and no slot written; check names the entry."""
    cache = (torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D))
    path = write_bundle(tmp_path / "b", engine="mine", layout="nhd", cache=cache, block_size=BS, num_heads=2 * H,
                        tables=[[NB]], seq_lens=[3], query_lens=[0])
    code, text, err = cli(capsys, "check", str(path), "--json", "--no-data")
    found = json.loads(text)["steps"][0]["violations"]
    assert code == 1 and [(v["check"], v["physical_block"], v["message"]) for v in found] == [
        ("pool", NB, f"logical block 0 maps to physical block {NB}, outside the pool 0..{NB - 1}")], (found, err)
