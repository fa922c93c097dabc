"""`pagetrace replay BUNDLE`: a captured step through pagetrace's kernel, checked twice."""

from __future__ import annotations

from typing import Annotated

import typer

from .diagram import DotOption, HtmlOption, PngOption, SvgOption, save_diagrams, save_page
from .options import IntOption

HELP = (
    "Replay a captured engine step through pagetrace's paged-attention kernel: every new token's attention, read "
    "through the engine's own block tables and cache layout, compared with contiguous attention and with the "
    "engine's own output; a per-token table for one request, and the real block tables as a diagram."
)
EPILOG = "Example: pagetrace replay capture.bundle --step 1 --layer 0 --request 1 --svg tables.svg"
ROWS = 24


def replay(
    bundle: Annotated[str, typer.Argument(help="Capture bundle folder (manifest.json + step files).", show_default=False)],
    step: Annotated[int | None, IntOption(help="Step to replay (default: the bundle's first; with --request, the first that holds it).")] = None,
    layer: Annotated[int | None, IntOption(help="Attention layer (default: the step's first).")] = None,
    request: Annotated[str | None, typer.Option(help="Request for the per-token table: its id, the id before '-', or its batch row (default: the first).")] = None,
    token: Annotated[int | None, IntOption(help="Which new token of the request (its position; default: the last).")] = None,
    backend: Annotated[str, typer.Option(help="auto, triton, interpret or torch.")] = "auto",
    svg: SvgOption = None,
    png: PngOption = None,
    dot: DotOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
    html: HtmlOption = None,
) -> int:
    from ..engines.bundle import read_layer, read_manifest, read_step
    from ..engines.replay import ReplayRefused, refuse_violations, summarize
    from ..errors import RuntimeFailure, UsageError
    from ..views.diagram import check_output_paths
    from ..views.replay import mapping_view
    from ..views.diagram.outputs import requested_outputs
    from ..views.page import check_page_path
    from .output import emit_json, stdout_console

    check_output_paths(svg, png, dot, json=json_output)  # before any work
    check_page_path(html, requested_outputs(svg, png, dot), json_output)
    manifest = read_manifest(bundle)
    from ..engines.bundle import step_for_request
    from .output import stderr_console

    st = read_step(bundle, manifest, step_for_request(manifest, step, request, lambda text: stderr_console().print(text, markup=False, soft_wrap=True)))
    try:
        layer = st.layers[0] if layer is None and st.layers else layer
        refuse_violations(manifest, st)  # before --token is read against the step's rows, and before a flagged step's missing query
        if layer is None:
            raise ReplayRefused(f"step {st.step} stored no layer; there is nothing to replay")
        r = st.request_index(request) if request is not None else 0
        first = st.seq_lens[r] - st.query_len(r)
        if token is None:
            token = st.seq_lens[r] - 1
        if not first <= token < st.seq_lens[r]:
            raise UsageError("--token", token, f"request {st.requests[r]}'s new tokens in step {st.step} are {first}..{st.seq_lens[r] - 1}")
        from ..engines.replay import replay_layer

        result = replay_layer(manifest, st, read_layer(manifest, st, layer), backend=backend)
    except ReplayRefused as exc:  # the bundle's own finding: with --json, a document says so (as `check --json` does)
        if json_output:
            emit_json({"bundle": str(bundle), "step": st.step, "layer": layer, "passed": False, "error": str(exc),
                       "violations": [v.to_json() for v in exc.violations]})
        raise
    summary = summarize(manifest, st, result, r, token)
    saved, diagram_failure = None, None
    try:
        saved = save_diagrams(mapping_view(manifest, st, summary), svg, png, dot, quiet=json_output)
    except RuntimeFailure as exc:  # the replay's result is still worth printing (as `run` does)
        diagram_failure = exc
    doc = replay_json(manifest, st, summary, bundle, layer) if json_output or html is not None else None
    if html is not None and diagram_failure is None:
        try:
            save_page(html, "replay", doc, f"pagetrace replay: {manifest.engine_words}, step {st.step}, layer {layer}", quiet=json_output)
        except RuntimeFailure as exc:
            diagram_failure = exc
    if json_output:
        if svg or png or dot:
            doc["diagrams"] = saved["written"] if saved else []
        emit_json(doc)
    else:
        from ..files import STDOUT
        from ..views.replay import render_replay
        from .output import stderr_console

        (stderr_console() if html == STDOUT else stdout_console()).print(render_replay(manifest, st, layer, summary, ROWS))
    if diagram_failure is not None:
        raise diagram_failure
    return 0 if summary.passed else 1


def replay_json(manifest, st, summary, bundle: str, layer: int) -> dict:
    """`replay --json`'s document (and the --html page's data)."""
    doc = summary.to_json(bundle, layer)
    doc["step"] = st.step
    doc.update(block_size=manifest.block_size, num_blocks=manifest.num_blocks, layout=manifest.layout.name,
               element_size=manifest.element_size)
    return doc
