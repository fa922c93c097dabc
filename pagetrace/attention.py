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

import functools
import os
import sys
from dataclasses import dataclass

import torch

from .errors import RuntimeFailure, UsageError
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
GPU_BLOCK_N = 64  # tokens per tile on a GPU, fewer for wide heads (see gpu_block_n)
GPU_PARTITION = 512  # the longest split-K partition on a GPU; shorter when the batch is small (gpu_partition_size)
GPU_PROGRAMS_PER_SM = 2  # partition programs wanted per SM before partitions stop shrinking
GPU_TILE_BYTES = 16 * 1024  # one K (or V) tile in shared memory


def _want_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def load_kernel(interpret: bool):
    """Import `pagetrace.kernel` compiled or interpreted; returns the module.

    Triton's interpreter replaces its language functions when triton is first imported,
    so it can be chosen only before that: a process that imported triton without
    TRITON_INTERPRET=1 can run the compiled kernel only, and one with it the
    interpreted kernel only.
    """
    if interpret and "pagetrace.kernel" not in sys.modules and not _want_interpreter():
        if "triton" in sys.modules:
            raise RuntimeFailure(
                "Triton's interpreter cannot run: this process imported triton before TRITON_INTERPRET=1 was set; "
                "set TRITON_INTERPRET=1 in the environment, or use the torch backend"
            )
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from . import kernel
    except ImportError as exc:
        raise RuntimeFailure(f"the Triton backends need triton, which does not import here ({exc}); use the torch backend") from None
    if kernel.interpreted() != interpret:
        if interpret:
            raise RuntimeFailure("the compiled kernel is already loaded in this process; set TRITON_INTERPRET=1 before starting Python to interpret")
        raise RuntimeFailure("TRITON_INTERPRET is set, so this process runs Triton's interpreter only; unset it to run compiled on the GPU")
    return kernel


def gpu_block_n(head_dim: int, element_size: int) -> int:
    """Tokens per tile: a K tile of GPU_TILE_BYTES at most, between 16 and GPU_BLOCK_N."""
    width = 1 << max(4, (head_dim - 1).bit_length())
    fit = GPU_TILE_BYTES // (width * element_size)
    return max(16, min(GPU_BLOCK_N, 1 << max(0, fit.bit_length() - 1)))


def gpu_partition_size(max_seq_len: int, num_seqs: int, num_kv_heads: int, block_n: int, num_sms: int) -> int:
    """Tokens per split-K partition on a GPU: short enough that the (sequence, KV head,
    partition) programs fill GPU_PROGRAMS_PER_SM x num_sms, never under one tile nor
    over GPU_PARTITION. A power of two, so a multiple of block_n."""
    parts = max(1, -(-GPU_PROGRAMS_PER_SM * num_sms // (num_seqs * num_kv_heads)))
    size = 1 << max(0, (-(-max_seq_len // parts) - 1).bit_length())
    return min(GPU_PARTITION, max(block_n, size))


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def plan_kernel(
    kernel, query, key_cache, value_cache, block_tables, seq_lens, *,
    layout: str, scale: float, trace: bool, on_gpu: bool, max_seq_len: int, num_kv_heads: int,
    num_sms: int | None = None, partition_size: int | None = None, block_n: int | None = None,
):
    """The kernel's launches for this call (`pagetrace.kernel.LaunchPlan`), tiles chosen for
    the device: what `paged_attention` runs, and what `pagetrace.gpu_compile` compiles.
    num_sms: the GPU's SM count (read from the device when None)."""
    head_dim = query.shape[-1]
    if on_gpu:
        block_n = block_n or gpu_block_n(head_dim, query.element_size())
        num_sms = num_sms or sm_count(query.device)
        partition_size = partition_size or gpu_partition_size(max_seq_len, query.shape[0], num_kv_heads, block_n, num_sms)
    else:
        block_n = block_n or INTERPRET_BLOCK_N
        partition_size = partition_size or max(INTERPRET_PARTITION, block_n)
    check_tiles(partition_size, block_n)
    return kernel.plan_launches(
        query, key_cache, value_cache, block_tables, seq_lens,
        layout=layout, scale=scale, trace=trace, partition_size=partition_size, block_n=block_n, max_seq_len=max_seq_len,
    )


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
    lens, num_kv_heads = check_inputs(query, key_cache, value_cache, block_tables, seq_lens, layout)
    head_dim = query.shape[-1]
    if scale is None:
        scale = head_dim**-0.5
    chosen = resolve_backend(backend, query.device, lens, query.shape[1], num_kv_heads)
    if chosen == "torch":
        return _torch_backend(query, key_cache, value_cache, block_tables, lens, layout, scale, trace)

    kernel = load_kernel(interpret=chosen == "interpret")
    plan = plan_kernel(
        kernel, query, key_cache, value_cache, block_tables, seq_lens,
        layout=layout, scale=scale, trace=trace, on_gpu=chosen == "triton", max_seq_len=max(lens), num_kv_heads=num_kv_heads,
        partition_size=partition_size, block_n=block_n,
    )
    try:
        out, _, ktrace = plan.run()
    except Exception as exc:
        if type(exc).__name__ == "OutOfResources":  # triton.runtime.errors.OutOfResources
            raise RuntimeFailure(f"the kernel does not fit this GPU with head_dim {head_dim} and {plan.block_n}-token tiles: {exc}") from exc
        raise
    if not trace:
        return out
    return out, Trace(chosen, plan.partition_size, ktrace.slots, ktrace.partitions, ktrace.logits, ktrace.lse)


def check_inputs(query, key_cache, value_cache, block_tables, seq_lens, layout: str) -> tuple[list[int], int]:
    """Refuse inputs the kernel would read out of bounds with; returns (lengths, num_kv_heads).

    A table entry outside the pool, or a table too short for its length, makes a GPU
    kernel fault and the interpreter read garbage, so they are checked here, on the host.
    """
    lay = get_layout(layout, option="layout")
    if query.dim() != 3 or 0 in query.shape:
        raise UsageError("query", tuple(query.shape), "must be [num_seqs, num_heads, head_dim], each at least 1")
    num_seqs, num_heads, head_dim = query.shape
    if query.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise UsageError("query", str(query.dtype), "the kernel takes float32, float16 or bfloat16")
    for name, tensor in (("key_cache", key_cache), ("value_cache", value_cache)):
        if tensor.dtype != query.dtype:
            raise UsageError(name, str(tensor.dtype), f"must have the query's dtype, {query.dtype}")
    devices = {t.device for t in (query, key_cache, value_cache, block_tables, seq_lens)}
    if len(devices) > 1:
        raise UsageError("query", str(query.device), f"all tensors must be on one device, got {sorted(map(str, devices))}")
    for name, cache, axes in (("key_cache", key_cache, lay.key_axes), ("value_cache", value_cache, lay.value_axes)):
        if cache.dim() != len(axes):
            raise UsageError(name, tuple(cache.shape), f"the '{layout}' layout has axes {axes}")
    key = dict(zip(lay.key_axes, key_cache.shape))
    value = dict(zip(lay.value_axes, value_cache.shape))
    key_dim = key["dim"] if "dim" in key else key["dim_hi"] * key["dim_lo"]
    for axis in ("block", "slot", "head"):
        if key.get(axis, 1) != value.get(axis, 1):
            raise UsageError("value_cache", tuple(value_cache.shape), f"its {axis} axis differs from the key cache's {tuple(key_cache.shape)}")
    if key_dim != head_dim or value["dim"] != head_dim:
        raise UsageError("query", tuple(query.shape), f"head_dim {head_dim} differs from the caches' ({key_dim}, {value['dim']})")
    num_blocks, block_size, num_kv_heads = key["block"], key["slot"], key.get("head", 1)
    if num_heads % num_kv_heads:
        raise UsageError("query", tuple(query.shape), f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise UsageError("block_tables", str(block_tables.dtype), "block_tables and seq_lens must be int32")
    if block_tables.dim() != 2 or block_tables.shape[0] != num_seqs or tuple(seq_lens.shape) != (num_seqs,):
        raise UsageError("block_tables", tuple(block_tables.shape), f"need one row per sequence ({num_seqs}) and seq_lens of shape ({num_seqs},)")
    lens = [int(n) for n in seq_lens.tolist()]
    if min(lens) < 1:
        raise UsageError("seq_lens", lens, "every sequence needs at least one token")
    needed = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    if int(needed.max()) > block_tables.shape[1]:
        raise UsageError("block_tables", tuple(block_tables.shape), f"a sequence of {max(lens)} tokens needs {int(needed.max())} blocks of {block_size}")
    used = torch.arange(block_tables.shape[1], device=block_tables.device)[None, :] < needed[:, None].to(block_tables.device)
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    if bool(bad.any()):
        s, b = (int(i) for i in torch.nonzero(bad)[0])
        raise UsageError("block_tables", int(block_tables[s, b]), f"sequence {s} maps logical block {b} outside the pool of {num_blocks} blocks")
    return lens, num_kv_heads


def check_tiles(partition_size: int, block_n: int) -> None:
    if block_n < 16 or block_n & (block_n - 1):
        raise UsageError("block_n", block_n, "must be a power of two >= 16 (tl.dot's minimum)")
    if partition_size < 1 or partition_size % block_n:
        raise UsageError("partition_size", partition_size, f"must be a positive multiple of block_n ({block_n})")


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
