"""`pagetrace where`: the reverse lookup, from a slot or a byte to block, offset, head, dim and token."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import UsageError
from ..paging.blocks import parse_int_list
from ..paging.where import Place, where_byte, where_geometry, where_slot
from .lookup import BlockSizeOption, DtypeOption, HeadDimOption, KvHeadsOption, LayoutOption
from .options import AliasChoice, ChoiceOption, IntOption

HELP = "Reverse lookup: which block, offset, KV head, dim, key or value (and, given block tables, which sequence and token) a slot or a byte offset is."
EPILOG = "Example: pagetrace where --byte 1152 --table 7,2,15   (token 20's key in the worked example); pagetrace where --slot 36 --table 7,2,15"

SHOWN_OWNERS = 20


def where(
    slot: Annotated[int | None, IntOption(help="A slot: physical block x block size + offset.")] = None,
    byte: Annotated[int | None, IntOption(help="A byte offset from the base of the cache tensor.")] = None,
    cache: Annotated[str | None, ChoiceOption(AliasChoice(("key", "value")), help="Which tensor --byte is in, for layouts with one tensor per cache (default key).")] = None,
    table: Annotated[list[str] | None, typer.Option(help="Block table of a sequence, comma-separated; repeat once per sequence, to learn which token it is.")] = None,
    block_size: BlockSizeOption = 16,
    head_dim: HeadDimOption = 8,
    kv_heads: KvHeadsOption = 1,
    dtype: DtypeOption = "fp32",
    layout: LayoutOption = "blocks",
    num_blocks: Annotated[int | None, IntOption(help="Physical blocks in the pool (default: largest table entry + 1, else 16).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    from .output import emit_json, stdout_console

    if (slot is None) == (byte is None):
        raise UsageError("--slot/--byte", f"--slot {slot} --byte {byte}" if slot is not None else "neither", "give exactly one of --slot and --byte")
    if slot is not None and cache is not None:
        raise UsageError("--cache", cache, "goes with --byte; a slot holds both the key and the value")
    tables = [parse_int_list(t, "--table") for t in table] if table else []
    geom = where_geometry(layout, dtype, block_size, kv_heads, head_dim, num_blocks, tables)
    place = where_slot(geom, slot, tables) if slot is not None else where_byte(geom, byte, cache, tables)
    if json_output:
        emit_json(place.to_json(tables_given=bool(tables)))
        return
    stdout_console().print(render_place(place, bool(tables)))


def render_place(place: Place, tables_given: bool):
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    g = place.geometry
    rows = Table(show_header=False, box=None, padding=(0, 1))
    rows.add_column(style="bold")
    rows.add_column()
    if place.byte is not None:
        tensor = "combined K/V tensor" if g.layout.combined else f"{place.which} cache"
        rows.add_row("byte", f"{place.byte} of the {tensor} = element {place.element} × {g.element_size} bytes + {place.byte_in_element}")
        axes = g.layout.shown_axes(place.which)
        rows.add_row("index", ", ".join(f"{a}={i}" for a, i in zip(axes, place.index)))
        rows.add_row("cache", f"[bold]{place.which}[/]")
    rows.add_row("physical block", f"[bold]{place.block}[/]")
    rows.add_row("offset", f"{place.offset}    (slot {place.block} × {g.block_size} + {place.offset} = {place.slot})")
    if place.byte is not None:
        rows.add_row("KV head", str(place.head))
        rows.add_row("dim", f"{place.dim} of {g.head_dim}")
    if not tables_given:
        rows.add_row("token", "[dim]give --table (once per sequence) to learn which sequence and token[/]")
    elif not place.owners:
        rows.add_row("token", f"no table maps block {place.block}: a free block")
    else:
        for owner in place.owners[:SHOWN_OWNERS]:
            rows.add_row("token", f"sequence {owner.sequence}, token [bold]{owner.token}[/] (logical block {owner.logical_block})")
        if len(place.owners) > SHOWN_OWNERS:
            rows.add_row("", f"[dim]{len(place.owners) - SHOWN_OWNERS} more[/]")
    title = f"[bold]where[/] · layout {g.layout.name} · {g.dtype} · block size {g.block_size} · head_dim {g.head_dim} · {g.num_kv_heads} KV head(s) · pool of {g.num_blocks} blocks"
    return Group(Text.from_markup(title), rows)
