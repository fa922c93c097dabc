"""The reverse lookup: from a slot or a byte offset back to block, offset, head, dim,
key or value, and (given block tables) the sequences and tokens that own it.

`pagetrace where` computes this. A byte is counted from the base of the cache tensor:
the key cache or the value cache for layouts with one tensor each (`cache` says
which), the one combined buffer for the layouts that hold K and V together, whose `kv`
factor then tells key from value. Tiled layouts (vllm-cpu-amx) decode the same way:
the factors of the buffer, then each logical axis from its factors. Plain Python: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError
from .blocks import check_table
from .layouts import CacheGeometry, make_geometry, shown_order

DEFAULT_NUM_BLOCKS = 16  # the worked example's pool, as `lookup --table 7,2,15` has it


@dataclass(frozen=True, slots=True)
class SlotOwner:
    sequence: int
    logical_block: int
    token: int  # position in the sequence (the table's capacity; lengths are not given)


@dataclass(frozen=True, slots=True)
class Place:
    geometry: CacheGeometry
    slot: int
    block: int
    offset: int
    owners: list[SlotOwner] = field(default_factory=list)
    # only for a byte:
    byte: int | None = None
    element: int | None = None
    byte_in_element: int | None = None
    which: str | None = None  # "key" or "value"
    head: int | None = None
    dim: int | None = None
    index: tuple[int, ...] | None = None  # tensor index, in the order the tensor shows its axes

    def to_json(self, tables_given: bool) -> dict:
        g = self.geometry
        return {
            "layout": g.layout.name,
            "dtype": g.dtype,
            "element_size": g.element_size,
            "num_blocks": g.num_blocks,
            "block_size": g.block_size,
            "kv_heads": g.num_kv_heads,
            "head_dim": g.head_dim,
            "byte": self.byte,
            "element": self.element,
            "byte_in_element": self.byte_in_element,
            "cache": self.which,
            "axes": list(g.layout.shown_axes(self.which)) if self.which else None,
            "index": list(self.index) if self.index is not None else None,
            "physical_block": self.block,
            "offset": self.offset,
            "slot": self.slot,
            "head": self.head,
            "dim": self.dim,
            "owners": [{"sequence": o.sequence, "logical_block": o.logical_block, "token": o.token} for o in self.owners] if tables_given else None,
        }


def owners_of(block: int, offset: int, block_size: int, tables: list[list[int]]) -> list[SlotOwner]:
    """Every (sequence, logical block) whose table maps to `block`, in one pass over the tables."""
    return [
        SlotOwner(s, logical, logical * block_size + offset)
        for s, table in enumerate(tables)
        for logical, physical in enumerate(table)
        if physical == block
    ]


def where_geometry(
    layout: str, dtype: str, block_size: int, kv_heads: int, head_dim: int, num_blocks: int | None, tables: list[list[int]]
) -> CacheGeometry:
    for table in tables:
        check_table(table, None, allow_repeats=True)
    if num_blocks is None:
        num_blocks = max(max(t) for t in tables) + 1 if tables else DEFAULT_NUM_BLOCKS
    geom = make_geometry(layout, num_blocks, block_size, kv_heads, head_dim, dtype)
    for table in tables:
        check_table(table, num_blocks, allow_repeats=True)
    return geom


def where_slot(geom: CacheGeometry, slot: int, tables: list[list[int]]) -> Place:
    slots = geom.num_blocks * geom.block_size
    if not 0 <= slot < slots:
        raise UsageError("--slot", slot, f"the pool has slots 0..{slots - 1} ({geom.num_blocks} blocks x {geom.block_size}); raise --num-blocks")
    block, offset = divmod(slot, geom.block_size)
    return Place(geom, slot, block, offset, owners_of(block, offset, geom.block_size, tables))


def where_byte(geom: CacheGeometry, byte: int, cache: str | None, tables: list[list[int]]) -> Place:
    """Decode a byte offset from the base of a cache buffer into its coordinates."""
    if geom.layout.combined and cache is not None:
        raise UsageError("--cache", cache, f"the '{geom.layout.name}' layout holds K and V in one tensor: the byte itself says which")
    which = cache or "key"
    shape = geom.shape(which)
    size = geom.numel(which) * geom.element_size
    if not 0 <= byte < size:
        tensor = "the combined K/V tensor" if geom.layout.combined else f"the {which} cache"
        raise UsageError("--byte", byte, f"{tensor} has bytes 0..{size - 1} ({'x'.join(map(str, shape))} elements of {geom.element_size} bytes); raise --num-blocks")
    element, within = divmod(byte, geom.element_size)
    which, coords, index = geom.coordinates(element, None if geom.layout.combined else which)
    block, offset = coords["block"], coords["slot"]
    return Place(
        geom,
        block * geom.block_size + offset,
        block,
        offset,
        owners_of(block, offset, geom.block_size, tables),
        byte=byte,
        element=element,
        byte_in_element=within,
        which=which,
        head=coords["head"],
        dim=coords["dim"],
        index=shown_order(geom, which, index),
    )
