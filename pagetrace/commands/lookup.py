"""`pagetrace lookup`: the two-level lookup for one token, down to the byte."""

from typing import Annotated

import typer

from ..errors import UsageError
from ..paging.blocks import capacity, parse_int_list
from ..paging.lookup import TokenTrace, trace_token
from ..views.diagram import MappingView, SequenceMap
from .diagram import DotOption, HtmlOption, PngOption, SvgOption, report_console, save_diagrams, save_page
from .options import ChoiceOption, IntOption, dtype_choice, layout_choice

HELP = "Trace one token through the block table to the exact element and byte address of its key and value."
EPILOG = "Example: pagetrace lookup --token 20 --table 7,2,15 --layout vllm --dtype fp16 --head-dim 64"


# the cache geometry's options, shared with `where`
BlockSizeOption = Annotated[int, IntOption(help="Tokens per block.")]
HeadDimOption = Annotated[int, IntOption(help="Elements per key/value vector.")]
KvHeadsOption = Annotated[int, IntOption(help="KV heads in the cache.")]
DtypeOption = Annotated[str, ChoiceOption(dtype_choice(), help="Cache dtype (any case; aliases float32/float, float16/half, bfloat16, fp8 = fp8_e4m3).")]
LayoutOption = Annotated[str, ChoiceOption(layout_choice(), help="Cache layout (any case): an entry of the one table, `pagetrace layouts` shows each; flash*, flashinfer* and vllm-* hold K and V in one buffer, as the engines allocate them.")]


def mapping_view(trace: TokenTrace, seq_len: int | None = None) -> MappingView:
    """The block mapping `lookup` draws: one sequence, the traced token highlighted.

    Given `seq_len` (`--seq-len`), the sequence is drawn that long, its last block partly
    filled; without it, at the table's full capacity (every block full), and a line under
    the map says so: the table's blocks, the arrows and the traced path are exact either way,
    and no fill is invented. `run` knows the lengths and draws them.
    """
    g = trace.geometry
    return MappingView(
        block_size=g.block_size,
        num_blocks=g.num_blocks,
        sequences=[SequenceMap("seq 0", capacity(trace.table, g.block_size) if seq_len is None else seq_len, list(trace.table))],
        highlight=(0, trace.location.token),
    )


def lookup(
    token: Annotated[int, IntOption(help="Token position in the sequence (0-based).")] = 20,
    table: Annotated[str, typer.Option(help="Block table: physical block of each logical block, comma-separated.")] = "7,2,15",
    seq_len: Annotated[int | None, IntOption(help="Tokens in the sequence, for the map (default: the table's capacity, every block full).")] = None,
    block_size: BlockSizeOption = 16,
    head_dim: HeadDimOption = 8,
    kv_heads: KvHeadsOption = 1,
    head: Annotated[int, IntOption(help="Which KV head to address.")] = 0,
    dtype: DtypeOption = "fp32",
    layout: LayoutOption = "blocks",
    num_blocks: Annotated[int | None, IntOption(help="Physical blocks in the pool (default: largest table entry + 1).")] = None,
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
    from_bundle: Annotated[str | None, typer.Option("--from", help="Capture bundle: address the token in that engine's real cache (with --request).")] = None,
    request: Annotated[str | None, typer.Option(help="With --from: the request (its id, the id before '-', or its batch row).")] = None,
    step: Annotated[int | None, IntOption(help="With --from: the captured step (default: the first that holds --request).")] = None,
    html: HtmlOption = None,
) -> None:
    from ..views.diagram import check_output_paths
    from ..views.diagram.outputs import requested_outputs
    from ..views.page import check_page_path
    from .output import emit_json

    if from_bundle is not None:
        from ..engines.address import bundle_lookup, render_bundle_lookup

        if request is None:
            raise UsageError("--request", "", "--from needs --request (a request id of the bundle)")
        for option, value in (("--svg", svg), ("--png", png), ("--dot", dot)):
            if value is not None:  # the bundle has its own tables: draw them with `pagetrace replay --svg`
                raise UsageError(option, value, "is not drawn with --from; `pagetrace replay BUNDLE --svg FILE` draws a bundle's tables")
        check_page_path(html, None, json_output)
        from .output import stderr_console

        document = bundle_lookup(from_bundle, request, token, step, head, note=lambda text: stderr_console().print(text, markup=False, soft_wrap=True))
        if html is not None:
            save_page(html, "lookup", document, f"pagetrace lookup: request {document['request']} token {token}, {document['layout']}", quiet=json_output)
        if json_output:
            emit_json(document)
        else:
            from .output import stderr_console, stdout_console

            (stderr_console() if html == "-" else stdout_console()).print(render_bundle_lookup(document), markup=False, soft_wrap=True)
        return

    for option, value in (("--request", request), ("--step", step)):
        if value is not None:
            raise UsageError(option, value, "addresses a captured request; give --from BUNDLE too")
    check_output_paths(svg, png, dot, json=json_output)
    check_page_path(html, requested_outputs(svg, png, dot), json_output)
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
    if seq_len is not None:
        cap = capacity(trace.table, block_size)
        if not 1 <= seq_len <= cap:
            raise UsageError("--seq-len", seq_len, f"the table's {len(trace.table)} blocks of {block_size} hold 1..{cap} tokens")
        if token >= seq_len:
            raise UsageError("--token", token, f"a sequence of {seq_len} tokens has tokens 0..{seq_len - 1}")
    view = mapping_view(trace, seq_len)
    saved = save_diagrams(view, svg, png, dot, quiet=json_output)
    if json_output or html is not None:
        document = trace.to_json()
        document["seq_len"] = seq_len  # null: not given; the map then draws the table's capacity
        if html is not None:
            save_page(html, "lookup", document, f"pagetrace lookup: token {token}, table {table}, layout {trace.geometry.layout.name}", quiet=json_output)
    if json_output:
        if saved is not None:
            document["diagrams"] = saved["written"]
        emit_json(document)
        return
    from ..views.text import render_lookup

    console = report_console(svg, png, dot, html)
    console.print(render_lookup(trace))
    if saved is None:
        from ..views.diagram import terminal_mapping

        console.print(terminal_mapping(view))
        if seq_len is None:
            console.print(f"(drawn at the table's capacity, {capacity(trace.table, block_size)} tokens; --seq-len N draws a sequence of N)", style="dim", highlight=False)
