"""Write one step of any engine's paged metadata and cache as a capture bundle.

The vLLM `capture` helper writes bundles from a live engine; this does it from tensors you
already hold (FlashInfer's CSR page table, SGLang's req_to_token, your own engine's), so
`pagetrace check`, `replay` and `lookup --from` work on them too.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..errors import UsageError
from ..paging.layouts import CacheGeometry, get_layout
from .bundle import DTYPES, SHARING, BundleWriter

TORCH_DTYPES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


def write_bundle(
    path: str | Path,
    *,
    engine: str,
    layout: str,
    cache,  # the engine's whole pool for one layer: one raw buffer, or a (key, value) pair
    block_size: int,
    num_heads: int,
    tables: list[list[int]],
    seq_lens: list[int],
    query_lens: list[int] | None = None,  # new tokens per request (default: 1, a decode step)
    slot_mapping: list[int] | None = None,  # default: the block-table arithmetic
    query=None,  # [tokens, num_heads, head_dim]
    output=None,  # the engine's attention output, same shape
    scale: float | None = None,
    sliding_window: int | None = None,  # w: a token at position p sees keys p - w + 1..p (None: all)
    null_block: int | None = None,
    sharing: str = "full-blocks",
    request_ids: list[str] | None = None,
    engine_version: str = "",
) -> Path:
    import torch

    lay = get_layout(layout, "layout")
    layout = lay.name
    if sharing not in SHARING:
        raise UsageError("sharing", sharing, f"choose one of {', '.join(SHARING)}")
    buffers = (cache,) if lay.combined else tuple(cache)
    dtype = TORCH_DTYPES.get(str(buffers[0].dtype))
    if dtype not in DTYPES:
        raise UsageError("cache", str(buffers[0].dtype), f"a bundle stores {', '.join(TORCH_DTYPES)}")
    block_axis = lay.block_axis
    num_blocks = int(buffers[0].shape[block_axis])
    shape = tuple(buffers[0].shape)

    def fits(h: int, d: int) -> bool:
        return CacheGeometry(lay, num_blocks, block_size, h, d, dtype).raw_shape("key") == shape

    # the raw shape fixes H and D: H x D elements per slot (twice that in one K-and-V buffer),
    # split among the head counts that divide it (vLLM's split key keeps D in two axes: D/x, x)
    slots = num_blocks * block_size * (2 if lay.combined else 1)
    if slots <= 0:
        raise UsageError("cache", shape, f"holds no '{layout}' block of {block_size} slots")
    per_slot = math.prod(shape) // slots
    dims = next(((h, per_slot // h) for h in range(1, 4097) if per_slot % h == 0 and fits(h, per_slot // h)), None)
    if dims is None:
        raise UsageError("cache", shape, f"is not a '{layout}' buffer ({lay.summary}) with block size {block_size}")
    num_kv_heads, head_dim = dims
    qlens = query_lens or [1] * len(tables)
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    positions = [p for n, q in zip(seq_lens, qlens) for p in range(n - q, n)]
    owners = [r for r, q in enumerate(qlens) for _ in range(q)]
    if slot_mapping is None:
        slot_mapping = [tables[r][p // block_size] * block_size + p % block_size for r, p in zip(owners, positions)]
    counts = [-(-n // block_size) for n in seq_lens]
    blocks = sorted({b for row, c in zip(tables, counts) for b in row[:c] if 0 <= b < num_blocks} | {s // block_size for s in slot_mapping if s >= 0})
    width = max(len(row) for row in tables)
    ids = torch.tensor(blocks, dtype=torch.int64)
    tensors = {
        "query_start_loc": torch.tensor(qsl, dtype=torch.int32),
        "seq_lens": torch.tensor(seq_lens, dtype=torch.int32),
        "block_table": torch.tensor([row + [0] * (width - len(row)) for row in tables], dtype=torch.int32),
        "block_counts": torch.tensor(counts, dtype=torch.int32),
        "slot_mapping": torch.tensor(slot_mapping, dtype=torch.int64),
        "positions": torch.tensor(positions, dtype=torch.int64),
        "blocks": ids,
    }
    if lay.combined:
        tensors["layer0.kv"] = cache.index_select(block_axis, ids).cpu()
    else:
        tensors["layer0.key"], tensors["layer0.value"] = (b.index_select(block_axis, ids).cpu() for b in buffers)
    if query is not None:
        tensors["layer0.query"] = query.cpu()
    if output is not None:
        tensors["layer0.output"] = output.cpu()
    writer = BundleWriter(path, {
        "engine": {"name": engine, "version": engine_version},
        "model": {"num_layers": 1, "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_dim": head_dim},
        "kv_cache": {"dtype": dtype, "layout": layout, "block_size": block_size, "num_blocks": num_blocks, "null_block": null_block,
                     "table_padding": 0, "slot_padding": -1, "sharing": sharing},
        "attention": {"scale": head_dim**-0.5 if scale is None else scale, "causal": True, "sliding_window": sliding_window},
        "layers": [{"index": 0, "name": "layer0"}],
    })
    try:
        writer.add_step(0, request_ids or [str(r) for r in range(len(tables))], [0], tensors)
        return writer.close()
    except BaseException:
        writer.abort()
        raise
