"""One token traced through a paged KV cache: block table, then the layout's addresses.

`trace_token` is what `pagetrace lookup` computes, and what `run --token` prints.
Plain Python: no torch here.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..errors import UsageError
from .blocks import TokenLocation, check_table, locate
from .layouts import CacheGeometry, VectorAddress, make_geometry, vector_address


class TokenTrace(NamedTuple):
    table: list[int]
    geometry: CacheGeometry
    head: int
    location: TokenLocation
    key: VectorAddress
    value: VectorAddress

    def __repr__(self) -> str:
        from ..views.notebook import token_trace_text

        return token_trace_text(self)

    def _repr_html_(self) -> str:  # the four-step lookup, in a notebook
        from ..views.notebook import token_trace_html

        return token_trace_html(self)

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.geometry.head_dim)

    def to_json(self) -> dict:
        g = self.geometry
        loc = self.location
        return {
            "token": loc.token,
            "block_table": list(self.table),
            "block_size": g.block_size,
            "capacity": len(self.table) * g.block_size,
            "logical_block": loc.logical_block,
            "offset": loc.offset,
            "physical_block": loc.physical_block,
            "slot": loc.slot,
            "layout": g.layout.name,
            "dtype": g.dtype,
            "element_size": g.element_size,
            "num_blocks": g.num_blocks,
            "kv_heads": g.num_kv_heads,
            "head": self.head,
            "head_dim": g.head_dim,
            "x": g.x if g.x > 1 else None,
            "scale": self.scale,
            "key": address_json(self.key),
            "value": address_json(self.value),
        }


def address_json(addr: VectorAddress) -> dict:
    return {
        "axes": list(addr.axes),
        "shape": list(addr.shape),
        "strides": list(addr.strides),
        "index": list(addr.index),
        "element_offset": addr.element_offset,
        "byte_offset": addr.byte_offset,
        "block_base_element": addr.block_base,
        "block_base_byte": addr.block_base * addr.element_size,
        "contiguous": addr.contiguous,
        "chunk_stride_elements": addr.chunk_stride,
        "chunks": [
            {
                "first_dim": c.first_dim,
                "elements": c.elements,
                "element_offset": c.element_offset,
                "byte_offset": c.element_offset * addr.element_size,
            }
            for c in addr.chunks
        ],
    }


def trace_token(
    token: int,
    table: list[int],
    *,
    block_size: int = 16,
    head_dim: int = 8,
    kv_heads: int = 1,
    head: int = 0,
    dtype: str = "fp32",
    layout: str = "blocks",
    num_blocks: int | None = None,
    allow_repeats: bool = False,
) -> TokenTrace:
    """Trace `token` of a sequence with block table `table`; sizes default to the worked example.

    `allow_repeats` lets a table map one physical block twice (`run` draws such a table
    with a warning; `lookup` refuses it)."""
    check_table(table, None, allow_repeats=allow_repeats)
    if num_blocks is None:
        num_blocks = max(table) + 1
    geom = make_geometry(layout, num_blocks, block_size, kv_heads, head_dim, dtype)
    check_table(table, num_blocks, allow_repeats=allow_repeats)
    if head < 0 or head >= kv_heads:
        raise UsageError("--head", head, f"must be in 0..{kv_heads - 1} (--kv-heads is {kv_heads})")
    loc = locate(token, table, block_size)
    return TokenTrace(
        table=list(table),
        geometry=geom,
        head=head,
        location=loc,
        key=vector_address(geom, "key", loc.physical_block, loc.offset, head),
        value=vector_address(geom, "value", loc.physical_block, loc.offset, head),
    )
