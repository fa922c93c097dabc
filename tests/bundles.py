"""Bundles written by hand for the engine, check, replay and bad-input tests: K and V laid out
exactly as each engine writes them (from the engines' own code, not pagetrace's layout table),
and a two-request step whose tables share blocks."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file

from pagetrace.engines.bundle import BundleWriter
from pagetrace.engines.views import geometry
from pagetrace.paging.layouts import LAYOUTS

NB, BS, H, D = 6, 4, 2, 8


def engine_buffer(name: str, k: torch.Tensor, v: torch.Tensor):
    """The raw buffer exactly as each engine lays K and V out (written from the engines' code, not the layout table)."""
    NB, BS, H, D = k.shape  # noqa: N806 - the sizes, as above
    if name == "vllm-cpu":  # per (block, head) page: K column-major (d * bs + s), then V row-major
        kk = k.permute(0, 2, 3, 1).reshape(NB, H, D * BS)
        vv = v.permute(0, 2, 1, 3).reshape(NB, H, BS * D)
        return torch.cat([kk, vv], -1).reshape(NB, H, BS, 2 * D).contiguous()
    if name == "vllm-hnd":  # logical [B, H, N, 2D], K | V in the last axis
        return torch.cat([k, v], -1).transpose(1, 2).contiguous()
    if name == "vllm-nhd":
        return torch.cat([k, v], -1).contiguous()
    if name == "vllm-cpu-amx":  # vLLM's amx pages, from the formula in csrc/cpu/cpu_attn_amx.hpp (fp32: p = 1)
        page = torch.empty(NB, H, 2 * BS * D)
        for s_ in range(BS):
            for d_ in range(D):
                page[:, :, (s_ // 16) * 16 * D + d_ * 16 + s_ % 16] = k[:, s_, :, d_]
                page[:, :, BS * D + (d_ // 16) * 16 * BS + s_ * 16 + d_ % 16] = v[:, s_, :, d_]
        return page.reshape(NB, H, BS, 2 * D)
    if name == "flash":
        return torch.stack([k, v]).contiguous()
    if name == "flash-hnd":
        return torch.stack([k.transpose(1, 2), v.transpose(1, 2)]).contiguous()
    if name == "flashinfer":
        return torch.stack([k, v], dim=1).contiguous()
    if name == "flashinfer-hnd":
        return torch.stack([k.transpose(1, 2), v.transpose(1, 2)], dim=1).contiguous()
    if name == "nhd":
        return (k.contiguous(), v.contiguous())
    return (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())


SHARED = 8  # two full blocks of 4 shared by both requests


def write_bundle(path, layout: str = "vllm-cpu", sharing: str = "full-blocks", tables=None):
    """Step 0: request a prefills 11 tokens, b decodes its token 9; tables share blocks 3, 5
    (`tables`: others, e.g. one block each when a block of BS slots holds all 11 tokens: a
    partly filled block is never shared)."""
    torch.manual_seed(1)
    k, v = torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D)
    tables = tables or [[3, 5, 1], [3, 5, 4]]
    lens, qlens = [11, 10], [11, 1]
    qsl = [0, 11, 12]
    positions = list(range(11)) + [9]
    slots = [tables[0][p // BS] * BS + p % BS for p in range(11)] + [tables[1][9 // BS] * BS + 9 % BS]
    # new K/V: what the layer wrote at those slots
    new_k = torch.stack([k[s // BS, s % BS] for s in slots])
    new_v = torch.stack([v[s // BS, s % BS] for s in slots])
    raw = engine_buffer(layout, k, v)
    blocks = torch.tensor([1, 3, 4, 5])
    lay = LAYOUTS[layout]
    axis = geometry(lay, NB, BS, H, D, "fp32").block_axis
    store = {"kv": raw.index_select(axis, blocks)} if lay.combined else {"key": raw[0][blocks], "value": raw[1][blocks]}
    writer = BundleWriter(path, {
        "engine": {"name": "hand", "version": "0"},
        "model": {"num_layers": 1, "num_heads": 4, "num_kv_heads": H, "head_dim": D},
        "kv_cache": {"dtype": "fp32", "layout": layout, "block_size": BS, "num_blocks": NB, "null_block": 0,
                     "table_padding": 0, "slot_padding": -1, "sharing": sharing},
        "attention": {"scale": D**-0.5, "causal": True, "sliding_window": None},
        "layers": [{"index": 0, "name": "layers.0.attn"}],
    })
    tensors = {
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32), "seq_lens": torch.tensor(lens, dtype=torch.int32),
        "block_table": torch.tensor([t + [0] for t in tables], dtype=torch.int32), "block_counts": torch.tensor([len(t) for t in tables], dtype=torch.int32),
        "slot_mapping": torch.tensor(slots + [-1, -1], dtype=torch.int64), "positions": torch.tensor(positions, dtype=torch.int64),
        "blocks": blocks, "layer0.query": torch.randn(12, 4, D) * 3, "layer0.new_key": new_k, "layer0.new_value": new_v,
        **{f"layer0.{n}": t for n, t in store.items()},
    }
    # the "engine's" output: attention written here, each new token over its request's tokens 0..p
    query, outputs = tensors["layer0.query"], []
    for i, (r, p) in enumerate([(0, p) for p in range(11)] + [(1, 9)]):
        idx = [(tables[r][t // BS], t % BS) for t in range(p + 1)]
        kk = torch.stack([k[b, o] for b, o in idx]).repeat_interleave(2, dim=1)
        vv = torch.stack([v[b, o] for b, o in idx]).repeat_interleave(2, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", query[i], kk) * D**-0.5, -1)
        outputs.append(torch.einsum("ht,thd->hd", w, vv))
    tensors["layer0.output"] = torch.stack(outputs)
    writer.add_step(0, ["a", "b"], [0], tensors)
    return writer.close()


def edit_step(path, edit):
    file = path / "step-0000.safetensors"
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))
