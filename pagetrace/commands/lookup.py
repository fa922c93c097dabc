"""`pagetrace lookup`: the two-level lookup for one token, down to the byte."""

from __future__ import annotations

from typing import Annotated

import typer

from ..blocks import capacity, parse_int_list
from ..diagram import MappingView, SequenceMap
from ..lookup import TokenTrace, trace_token
from .diagram import DotOption, PngOption, SvgOption, report_console, save_diagrams

HELP = "Trace one token through the block table to the exact element and byte address of its key and value."
EPILOG = "Example: pagetrace lookup --token 20 --table 7,2,15 --layout vllm --dtype fp16 --head-dim 64"


def mapping_view(trace: TokenTrace) -> MappingView:
    """The block mapping `lookup` draws: one sequence, the traced token highlighted.

    `lookup` is given a block table, not a sequence length, so the sequence is drawn at
    the table's full capacity (every block full): the table's blocks, the arrows and the
    traced path are exact, and no fill is invented. `run` knows the lengths and draws them.
    """
    g = trace.geometry
    return MappingView(
        block_size=g.block_size,
        num_blocks=g.num_blocks,
        sequences=[SequenceMap("seq 0", capacity(trace.table, g.block_size), list(trace.table))],
        highlight=(0, trace.location.token),
    )


def lookup(
    token: Annotated[int, typer.Option(help="Token position in the sequence (0-based).")] = 20,
    table: Annotated[str, typer.Option(help="Block table: physical block of each logical block, comma-separated.")] = "7,2,15",
    block_size: Annotated[int, typer.Option(help="Tokens per block.")] = 16,
    head_dim: Annotated[int, typer.Option(help="Elements per key/value vector.")] = 8,
    kv_heads: Annotated[int, typer.Option(help="KV heads in the cache.")] = 1,
    head: Annotated[int, typer.Option(help="Which KV head to address.")] = 0,
    dtype: Annotated[str, typer.Option(help="Cache dtype: fp32, fp16, bf16 or fp8.")] = "fp32",
    layout: Annotated[str, typer.Option(help="Cache layout: blocks, nhd, hnd or vllm.")] = "blocks",
    num_blocks: Annotated[int | None, typer.Option(help="Physical blocks in the pool (default: largest table entry + 1).")] = None,
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    from ..cli import emit_json
    from ..diagram import check_output_paths

    check_output_paths(svg, png, dot, json=json_output)
    trace = trace_token(
        token,
        parse_int_list(table, "--table"),
        block_size=block_size,
        head_dim=head_dim,
        kv_heads=kv_heads,
        head=head,
        dtype=dtype,
        layout=layout,
        num_blocks=num_blocks,
    )
    view = mapping_view(trace)
    saved = save_diagrams(view, svg, png, dot, quiet=json_output)
    if json_output:
        document = trace.to_json()
        if saved is not None:
            document["diagrams"] = saved["written"]
        emit_json(document)
        return
    from ..render import render_lookup

    console = report_console(svg, png, dot)
    console.print(render_lookup(trace))
    if saved is None:
        from ..diagram import terminal_mapping

        console.print(terminal_mapping(view))
