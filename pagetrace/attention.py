"""`paged_attention`: the Python API over the Triton kernel and the torch reference.

Backends:
    triton     the kernel, compiled for a CUDA GPU
    interpret  the same kernel source under Triton's interpreter, on the CPU
    torch      gather the blocks into contiguous tensors, then softmax attention
    auto       triton on CUDA; on the CPU the interpreter when the work is small
               enough to finish in about a second, else torch

Triton reads TRITON_INTERPRET once, when it is first imported, and a kernel is bound
to one mode when it is defined; `load_kernel` sets the variable before that import
when the interpreter is wanted, and refuses a mode the process can no longer switch to.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

from .errors import UsageError
from .layouts import get_layout
from .reference import reference_attention, slots_of

BACKENDS = ("auto", "triton", "interpret", "torch")

# Interpreter cost model, fitted to bench/bench_run.py on the 2-core CI machine (see
# bench/README.md): a loop iteration of the partition kernel costs about 3.5 ms whatever
# its tile holds, and each program (partition or reduce) about 5 ms on top.
INTERPRET_ITERATION_S = 0.0035
INTERPRET_PROGRAM_S = 0.005
INTERPRET_BUDGET_S = 1.0
INTERPRET_BLOCK_N = 128
INTERPRET_PARTITION = 4096
GPU_BLOCK_N = 64
GPU_PARTITION = 512


def _want_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def load_kernel(interpret: bool):
    """Import `pagetrace.kernel` compiled or interpreted; returns the module."""
    if "pagetrace.kernel" not in sys.modules and "triton" not in sys.modules and interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    from . import kernel

    if kernel.interpreted() != interpret:
        mode = "interpreted" if kernel.interpreted() else "compiled"
        hint = "set TRITON_INTERPRET=1 before starting Python" if interpret else "unset TRITON_INTERPRET"
        raise UsageError("--backend", "interpret" if interpret else "triton", f"this process already loaded the {mode} kernel; {hint}")
    return kernel


def interpret_cost_s(seq_lens: list[int], num_heads: int, num_kv_heads: int, block_n: int = INTERPRET_BLOCK_N) -> float:
    """Rough seconds the interpreter needs: a program per (sequence, KV head, partition)
    looping over token tiles, then a reduce program per (sequence, query head)."""
    iterations = sum(-(-n // block_n) for n in seq_lens) * num_kv_heads
    programs = sum(-(-n // INTERPRET_PARTITION) for n in seq_lens) * num_kv_heads + len(seq_lens) * num_heads
    return iterations * INTERPRET_ITERATION_S + programs * INTERPRET_PROGRAM_S


def resolve_backend(backend: str, device: torch.device, seq_lens: list[int], num_heads: int, num_kv_heads: int) -> str:
    if backend not in BACKENDS:
        raise UsageError("--backend", backend, f"choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton"
        if interpret_cost_s(seq_lens, num_heads, num_kv_heads) <= INTERPRET_BUDGET_S:
            return "interpret"
        return "torch"
    if backend == "triton" and device.type != "cuda":
        raise UsageError("--backend", backend, "compiled Triton needs a CUDA device; use --backend interpret (or auto) on the CPU")
    if backend == "interpret" and device.type != "cpu":
        raise UsageError("--backend", backend, "the interpreter runs on CPU tensors; use --device cpu")
    return backend


@dataclass
class Trace:
    """Per-token record of one paged-attention call.

    With a Triton backend every field was written by the kernel itself; with the
    torch backend the slots are the gather's indices and there is one partition.
    """

    backend: str
    partition_size: int
    slots: torch.Tensor  # int64 [num_seqs, max_seq_len]: physical slot read for each token, -1 past the end
    partitions: torch.Tensor  # int32 [num_seqs, max_seq_len]: partition that read it, -1 past the end
    logits: torch.Tensor  # fp32 [num_seqs, num_heads, max_seq_len]: q·k * scale, NaN past the end
    lse: torch.Tensor  # fp32 [num_seqs, num_heads]: log-sum-exp of each head's logits

    @property
    def weights(self) -> torch.Tensor:
        """fp32 [num_seqs, num_heads, max_seq_len]: softmax weights, exp(logit - lse); NaN past the end."""
        return torch.exp(self.logits - self.lse[..., None])


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    layout: str = "nhd",
    scale: float | None = None,
    trace: bool = False,
    backend: str = "auto",
    partition_size: int | None = None,
    block_n: int | None = None,
):
    """Decode attention of each sequence's query over its paged KV cache.

    Args:
        query: ``[num_seqs, num_heads, head_dim]``, fp32, fp16 or bf16.
        key_cache, value_cache: the pool of blocks, shaped by `layout` (see
            `pagetrace.layouts.LAYOUTS`; for "nhd" ``[num_blocks, block_size,
            num_kv_heads, head_dim]``), same dtype as the query.
        block_tables: int32 ``[num_seqs, max_blocks]``: physical block of each logical
            block, -1 where a sequence has fewer blocks.
        seq_lens: int32 ``[num_seqs]``: tokens in each sequence (>= 1).
        scale: multiplies q·k; default 1/sqrt(head_dim).
        trace: also return a `Trace` of what was read and computed per token.
        backend: "auto", "triton", "interpret" or "torch".
        partition_size, block_n: split-K partition length and token tile (Triton
            backends); defaults suit the device.

    Returns:
        ``output`` ``[num_seqs, num_heads, head_dim]`` in the query's dtype, or
        ``(output, trace)`` when ``trace=True``. num_heads must be a multiple of
        num_kv_heads; query head h reads KV head h // (num_heads // num_kv_heads).
    """
    head_dim = query.shape[-1]
    if scale is None:
        scale = head_dim**-0.5
    lens = [int(n) for n in seq_lens.tolist()]
    if min(lens) < 1:
        raise UsageError("seq_lens", lens, "every sequence needs at least one token")
    lay = get_layout(layout)
    num_kv_heads = dict(zip(lay.key_axes, key_cache.shape)).get("head", 1)
    chosen = resolve_backend(backend, query.device, lens, query.shape[1], num_kv_heads)
    if chosen == "torch":
        return _torch_backend(query, key_cache, value_cache, block_tables, lens, layout, scale, trace)

    kernel = load_kernel(interpret=chosen == "interpret")
    on_gpu = chosen == "triton"
    block_n = block_n or (GPU_BLOCK_N if on_gpu else INTERPRET_BLOCK_N)
    partition_size = partition_size or (GPU_PARTITION if on_gpu else max(INTERPRET_PARTITION, block_n))
    out, _, ktrace = kernel.launch(
        query, key_cache, value_cache, block_tables, seq_lens,
        layout=layout, scale=scale, trace=trace, partition_size=partition_size, block_n=block_n, max_seq_len=max(lens),
    )
    if not trace:
        return out
    return out, Trace(chosen, partition_size, ktrace.slots, ktrace.partitions, ktrace.logits, ktrace.lse)


def _torch_backend(query, key_cache, value_cache, block_tables, lens, layout, scale, trace):
    tables = block_tables.cpu().tolist()  # -1 padding is never indexed: slots_of reads only the blocks a length needs
    block_size = dict(zip(get_layout(layout).key_axes, key_cache.shape))["slot"]
    ref = reference_attention(query, key_cache, value_cache, tables, lens, layout=layout, block_size=block_size, scale=scale)
    out = ref.output.to(query.dtype)
    if not trace:
        return out
    num_seqs, num_heads, _ = query.shape
    width = max(lens)
    slots = torch.full((num_seqs, width), -1, dtype=torch.int64)
    parts = torch.full((num_seqs, width), -1, dtype=torch.int32)
    logits = torch.full((num_seqs, num_heads, width), float("nan"), dtype=torch.float32)
    for s, n in enumerate(lens):
        slots[s, :n] = slots_of(tables[s], n, block_size)
        parts[s, :n] = 0
        logits[s, :, :n] = ref.logits[s].float().cpu()
    return out, Trace("torch", width, slots, parts, logits, ref.lse.float().cpu())
