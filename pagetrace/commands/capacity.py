"""`pagetrace capacity`: blocks, tokens and requests a KV cache budget holds."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import UsageError
from .options import FloatOption, IntOption

HELP = (
    "How many KV blocks, tokens and requests fit: in a KV budget (--memory), or on a device as vLLM sizes it (--gpu-memory: "
    "total x utilisation - weights - activations - non-torch memory). vLLM's bytes-per-block formula, block rounding."
)
EPILOG = (
    "Example: pagetrace capacity --config config.json --gpu-memory 80GB --length 4096  |  "
    "pagetrace capacity --layers 32 --kv-heads 8 --head-dim 128 --dtype fp8 --memory 40GiB --length 4096  |  "
    "pagetrace capacity --layers sliding:1024:5,full:1,sliding:1024:5,full:1 --kv-heads 4 --head-dim 256 --memory 1GiB --length 4096"
)


def capacity(
    memory: Annotated[str, typer.Option(help="KV cache budget: bytes, or with a unit (40GiB, 512MiB, 16GB).")] = "16GiB",
    layers: Annotated[str, typer.Option(help="Attention layers: a count (32), or a hybrid model's kinds, full:N,sliding:W:M (as simulate --layers).")] = "32",
    kv_heads: Annotated[int, IntOption(help="KV heads per layer (after tensor parallelism, per GPU).")] = 8,
    head_dim: Annotated[int, IntOption(help="Elements per key (and per value) vector.")] = 128,
    dtype: Annotated[str | None, typer.Option(help="KV cache dtype: fp32, fp16, bf16, fp8. Default: bf16, or the config's.")] = None,
    config: Annotated[str | None, typer.Option(metavar="PATH", help="A Hugging Face config.json: layers, KV heads, head size (and dtype) from it.")] = None,
    block_size: Annotated[int, IntOption(help="Tokens per block.")] = 16,
    length: Annotated[int | None, IntOption(help="Tokens per request (prompt + output): how many such requests fit.")] = None,
    gpu_memory: Annotated[str | None, typer.Option(help="The device's memory (80GB, 23.58GiB): the KV budget is then vLLM's, from the terms below, not --memory.")] = None,
    gpu_memory_utilization: Annotated[float, FloatOption(help="vLLM's --gpu-memory-utilization: the share of the device vLLM takes.")] = 0.9,
    weights: Annotated[str | None, typer.Option(help="With --gpu-memory: the weights' bytes (default: counted from --config, at the config's dtype).")] = None,
    activation: Annotated[str | None, typer.Option(help="With --gpu-memory: the activation peak vLLM profiles (its log: peak activation memory); default: a rough estimate from --config.")] = None,
    non_torch: Annotated[str, typer.Option(help="With --gpu-memory: memory torch does not allocate (CUDA context, NCCL; vLLM logs it).")] = "0",
    max_num_batched_tokens: Annotated[int, IntOption(help="With --gpu-memory and no --activation: the tokens of vLLM's profiling run, for the estimate.")] = 8192,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object and nothing else on stdout.")] = False,
) -> None:
    from ..sim.capacity import ModelDims, dims_of, parse_memory, read_config
    from ..sim.capacity import capacity as compute
    from .output import emit_json, stdout_console

    from ..sim.hybrid import parse_layers

    cfg = read_config(config) if config else None  # read once: the dims, and the device budget's terms
    kinds = None
    if cfg is None:
        text = layers.strip()
        if text.lstrip("-").isdigit() and text.isascii():
            num_layers = int(text)
        else:
            try:
                kinds = parse_layers(text)
            except ValueError as exc:
                raise UsageError("--layers", layers, str(exc)) from None
            num_layers = len(kinds)
            if all(k.window is None for k in kinds):
                kinds = None
    dims = dims_of(cfg, config, dtype) if cfg is not None else ModelDims(num_layers, kv_heads, head_dim, dtype or "bf16")
    budget = None
    if gpu_memory is not None:
        budget = vllm_budget(cfg, config, dims, gpu_memory, gpu_memory_utilization, weights, activation, non_torch, max_num_batched_tokens)
        kv_bytes = budget.kv_cache_bytes
    else:
        for option, value in (("--weights", weights), ("--activation", activation)):
            if value is not None:
                raise UsageError(option, value, "is a term of the device budget; give --gpu-memory too")
        kv_bytes = parse_memory(memory)
    if cfg is not None:
        from ..sim.hybrid import layers_from_config

        try:
            kinds = layers_from_config(cfg)  # None: no sliding-window layer, one group
        except ValueError as exc:
            raise UsageError("--config", config, str(exc)) from None
    cap = compute(dims, kv_bytes, block_size, length, kinds)
    if json_output:
        emit_json({**cap.to_json(), "budget": budget.to_json() if budget else None})
        return
    from rich.table import Table

    t = Table(title="KV cache capacity", show_header=False, title_justify="left")
    d = cap.dims
    if budget is not None:
        b = budget
        t.add_row("device memory", f"{b.total_bytes:,} bytes × {b.utilization} = {b.requested_bytes:,} (vLLM's share)")
        t.add_row("- weights", f"{b.weights_bytes:,} ({b.weights_from})")
        t.add_row("- activation peak", f"{b.activation_bytes:,} ({b.activation_from})")
        t.add_row("- non-torch memory", f"{b.non_torch_bytes:,}")
        t.add_row("= KV cache budget", f"{b.kv_cache_bytes:,} bytes ({b.kv_cache_bytes / 2**30:.2f} GiB)")
    t.add_row("model", f"{d.num_layers} layers × {d.num_kv_heads} KV heads × head_dim {d.head_dim}, {d.dtype}")
    t.add_row("bytes per token", f"{cap.bytes_per_token:,} (K and V, all layers)")
    if cap.groups:
        per = cap.bytes_per_block // cap.bytes_per_block_per_layer
        t.add_row("KV cache groups", f"{len(cap.groups)}, each its own block table over one pool (vLLM's hybrid allocator)")
        for i, g in enumerate(cap.groups):
            kind = "full attention" if g["window"] is None else f"sliding window {g['window']:,}"
            held = "" if g["blocks_per_request"] is None else f"; {g['blocks_per_request']:,} blocks per request of {cap.length:,} tokens"
            t.add_row(f"  group {i}", f"{kind}, {g['layers']} layers{held}")
        t.add_row("bytes per block", f"{cap.bytes_per_block:,} ({cap.block_size} tokens; a page of each of {per} layers, "
                  f"{cap.bytes_per_block_per_layer:,} per layer: the largest group's)")
    else:
        t.add_row("bytes per block", f"{cap.bytes_per_block:,} ({cap.block_size} tokens; {cap.bytes_per_block_per_layer:,} per layer)")
    if budget is None:
        t.add_row("memory", f"{cap.memory_bytes:,} bytes")
    t.add_row("blocks in the pool", f"{cap.num_blocks:,} ({cap.usable_blocks:,} usable: block 0 is the null block)")
    if cap.groups:
        t.add_row("tokens that fit", "no limit from the pool: every layer slides" if cap.tokens is None else
                  f"{cap.tokens:,} in one sequence (the full-attention groups hold every token, the sliding ones their window)")
    else:
        t.add_row("tokens that fit", f"{cap.tokens:,}")
    if cap.length is not None:
        t.add_row(f"requests of {cap.length:,} tokens", f"{cap.requests:,} ({cap.blocks_per_request:,} blocks each)")
        t.add_row("closed form, every layer full, no rounding" if cap.groups else "closed form, no rounding", f"{cap.requests_closed_form:,.1f}")
    stdout_console().print(t)


def vllm_budget(cfg, config, dims, gpu_memory, utilization, weights, activation, non_torch, batched_tokens):
    """vLLM's KV budget on a device, each term from an option or, where it can be, the config."""
    from ..sim.capacity import activation_estimate, device_budget, dtype_bytes, parameter_count, parse_memory

    size = dtype_bytes(dims.dtype)
    if weights is not None:
        w, w_from = parse_memory(weights, "--weights"), "--weights"
    elif cfg is not None:
        n = parameter_count(cfg, config)
        w, w_from = n * size, f"config.json: {n:,} parameters x {size} bytes"
    else:
        raise UsageError("--weights", "", "--gpu-memory needs the weights: give --config config.json or --weights BYTES")
    if activation is not None:
        a, a_from = parse_memory(activation, "--activation"), "--activation"
    elif cfg is not None:
        a = activation_estimate(cfg, config, batched_tokens, size)
        a_from = f"estimate: {batched_tokens:,} tokens x (2 x intermediate + 4 x hidden) x {size} bytes; vLLM's log has the measured peak"
    else:
        raise UsageError("--activation", "", "--gpu-memory needs the activation peak: give --config (an estimate) or --activation BYTES")
    return device_budget(parse_memory(gpu_memory, "--gpu-memory"), utilization, w, w_from, a, a_from,
                         0 if non_torch.strip() in ("0", "") else parse_memory(non_torch, "--non-torch"))
