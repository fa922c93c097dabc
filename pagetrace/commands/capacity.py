"""`pagetrace capacity`: blocks, tokens and requests a KV cache budget holds."""

from __future__ import annotations

from typing import Annotated

import typer

HELP = "How many KV blocks, tokens and requests fit in a memory budget (vLLM's bytes-per-block formula, block rounding)."
EPILOG = (
    "Example: pagetrace capacity --layers 32 --kv-heads 8 --head-dim 128 --dtype fp8 --memory 40GiB --length 4096"
    "  |  pagetrace capacity --config config.json --memory 20GiB --length 2000"
)


def capacity(
    memory: Annotated[str, typer.Option(help="KV cache budget: bytes, or with a unit (40GiB, 512MiB, 16GB).")] = "16GiB",
    layers: Annotated[int, typer.Option(help="Attention layers.")] = 32,
    kv_heads: Annotated[int, typer.Option(help="KV heads per layer (after tensor parallelism, per GPU).")] = 8,
    head_dim: Annotated[int, typer.Option(help="Elements per key (and per value) vector.")] = 128,
    dtype: Annotated[str | None, typer.Option(help="KV cache dtype: fp32, fp16, bf16, fp8. Default: bf16, or the config's.")] = None,
    config: Annotated[str | None, typer.Option(metavar="PATH", help="A Hugging Face config.json: layers, KV heads, head size (and dtype) from it.")] = None,
    block_size: Annotated[int, typer.Option(help="Tokens per block.")] = 16,
    length: Annotated[int | None, typer.Option(help="Tokens per request (prompt + output): how many such requests fit.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    from ..capacity import ModelDims, capacity as compute, dims_from_config, parse_memory
    from ..cli import emit_json, stdout_console

    dims = dims_from_config(config, dtype) if config else ModelDims(layers, kv_heads, head_dim, dtype or "bf16")
    cap = compute(dims, parse_memory(memory), block_size, length)
    if json_output:
        emit_json(cap.to_json())
        return
    from rich.table import Table

    t = Table(title="KV cache capacity", show_header=False, title_justify="left")
    d = cap.dims
    t.add_row("model", f"{d.num_layers} layers × {d.num_kv_heads} KV heads × head_dim {d.head_dim}, {d.dtype}")
    t.add_row("bytes per token", f"{cap.bytes_per_token:,} (K and V, all layers)")
    t.add_row("bytes per block", f"{cap.bytes_per_block:,} ({cap.block_size} tokens; {cap.bytes_per_block_per_layer:,} per layer)")
    t.add_row("memory", f"{cap.memory_bytes:,} bytes")
    t.add_row("blocks in the pool", f"{cap.num_blocks:,} ({cap.usable_blocks:,} usable: block 0 is the null block)")
    t.add_row("tokens that fit", f"{cap.tokens:,}")
    if cap.length is not None:
        t.add_row(f"requests of {cap.length:,} tokens", f"{cap.requests:,} ({cap.blocks_per_request:,} blocks each)")
        t.add_row("closed form, no rounding", f"{cap.requests_closed_form:,.1f}")
    stdout_console().print(t)
