"""`pagetrace check BUNDLE`: the invariants of a captured step's paged metadata."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import IntOption

HELP = (
    "Check a captured engine step (a capture bundle): table entries inside the pool and stored, no visible token on the null "
    "block, slot_mapping equal to the block-table arithmetic, seq_lens within capacity, query_start_loc, index "
    "dtypes, no two tokens writing one slot, sharing only of prefix-cached full blocks, and the new K/V at their "
    "slots through the layout. Exit 0 clean, 1 with violations."
)
EPILOG = "Example: pagetrace check capture.bundle --step 1   (write a bundle with examples/vllm_capture.py)"
SHOWN = 20  # violations printed per step; --json lists them all


def check(
    bundle: Annotated[str, typer.Argument(help="Capture bundle folder (manifest.json + step files).", show_default=False)],
    step: Annotated[int | None, IntOption(help="Check only this step (default: every step in the bundle).")] = None,
    data: Annotated[bool, typer.Option("--data/--no-data", help="Also read the new tokens' K/V back through the layout (loads torch).")] = True,
    ring: Annotated[bool, typer.Option("--ring", help="Also check every step of the bundle's metadata ring (index checks: it keeps no pages).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> int:
    from ..engines.bundle import read_layer, read_manifest, read_step, step_entries
    from ..engines.check import check_step
    from .output import emit_json, stdout_console

    manifest = read_manifest(bundle)
    entries = step_entries(manifest) if ring or not manifest.steps else manifest.steps
    numbers = [s["step"] for s in entries] if step is None else [step]
    results = []
    for number in numbers:
        st = read_step(bundle, manifest, number)
        layers = {layer: read_layer(manifest, st, layer) for layer in st.layers} if data else None
        results.append((st, check_step(manifest, st, layers)))
    total = sum(len(v) for _, v in results)
    if json_output:
        emit_json({
            "bundle": str(bundle),
            "engine": manifest.engine,
            "layout": manifest.layout.name,
            "passed": total == 0,
            **({"ring": ring_json(manifest)} if manifest.ring else {}),
            "steps": [
                {"step": st.step, "requests": st.requests, "tokens": st.num_tokens, **({"ring": True} if st.ring else {}), "violations": [v.to_json() for v in found],
                 **({"guard": st.guard} if st.guard else {})}
                for st, found in results
            ],
        })
        return 0 if total == 0 else 1
    from rich.table import Table

    from ..errors import plural

    console = stdout_console()
    console.print(
        f"{bundle}: {manifest.engine_words} · layout {manifest.layout.name} · "
        f"block size {manifest.block_size} · pool {manifest.num_blocks} blocks · sharing {manifest.sharing}",
        markup=False,
        soft_wrap=True,
    )
    if manifest.ring:
        console.print(ring_words(manifest, ring or not manifest.steps), markup=False, soft_wrap=True)
    for st, found in results:
        head = f"step {st.step}: {plural(len(st.requests), 'request')}, {plural(st.num_tokens, 'new token')}"
        if not found:
            data_words = f" (data checked on {'layer' if len(st.layers) == 1 else 'layers'} {', '.join(map(str, st.layers))})" if data and st.layers else ""
            console.print(f"{head}: clean" + (" (metadata ring)" if st.ring else data_words), markup=False)
            continue
        console.print(f"{head}: {len(found)} violation{'s' if len(found) > 1 else ''}", markup=False)
        if st.guard:
            console.print(guard_words(st.guard), markup=False, soft_wrap=True)
        table = Table(box=None, pad_edge=False)
        for col in ("check", "request", "token", "logical", "physical", "slot", "byte", "what"):
            table.add_column(col, justify="right" if col in ("token", "logical", "physical", "slot", "byte") else "left")
        dash = lambda v: "-" if v is None else str(v)  # noqa: E731
        for v in found[:SHOWN]:
            table.add_row(v.check, dash(v.request), dash(v.token), dash(v.logical_block), dash(v.physical_block), dash(v.slot), dash(v.byte), v.message)
        console.print(table)
        if len(found) > SHOWN:
            console.print(f"... and {len(found) - SHOWN} more (--json lists all)")
    console.print("passed: every invariant holds" if total == 0 else f"failed: {total} violation{'s' if total > 1 else ''}", markup=False)
    return 0 if total == 0 else 1


def ring_json(manifest) -> dict:
    r = manifest.ring
    return {k: r.get(k) for k in ("steps", "first", "last", "bytes", "bound_bytes")}


def ring_words(manifest, checked: bool) -> str:
    """One line: what the metadata ring holds, and whether this run checks it."""
    r = manifest.ring
    if not r.get("steps"):
        return "metadata ring: empty"
    told = "checked below" if checked else "--ring checks them too, --step N one of them"
    return (f"metadata ring: steps {r['first']}..{r['last']} ({r['steps']} steps: index tensors and request ids, no pages) "
            f"in {r['bytes'] / (1 << 20):.2f} MiB of {r['bound_bytes'] / (1 << 20):g}; {told}")


def guard_words(guard: dict) -> str:
    """One line: what the guard did at a step it flagged (the step's manifest entry)."""
    affected = ", ".join(guard.get("affected") or []) or "none named"
    if guard.get("made_safe"):
        safe = guard["made_safe"]
        done = (f"made safe before the forward ({len(safe.get('table_entries', []))} table entries to the null block, "
                f"{len(safe.get('slots', []))} slots to the padding slot), the step ran")
    else:
        done = "the step was stopped before its forward"
    return f"  flagged by the guard ({guard.get('mode')}): {done}; requests not trusted at this step: {affected}"
