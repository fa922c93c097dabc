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

from ..errors import RuntimeFailure, UsageError
from ..paging.layouts import get_layout
from .inputs import Batch, check_inputs
from .reference import NO_KEY, VISIBLE, reference_attention, slots_of
from .torch_path import torch_attention

BACKENDS = ("auto", "triton", "interpret", "torch")

# Interpreter cost model, fitted to bench/bench_run.py and bench/bench_prefill.py on the
# 2-core CI machine (see bench/README.md): a loop iteration of the partition kernel costs
# about 3.5 ms with a decode tile (a few query rows), about twice that with a prefill tile
# of INTERPRET_ROWS rows; each program about 5 ms on top; and the first call in a process
# about 0.6 s more (the interpreter binds the kernels' source on first use), which a model
# fitted to warm runs missed by 3-4x on small cold runs.
INTERPRET_ITERATION_S = 0.0035
INTERPRET_PREFILL_ITERATION_S = 0.007
INTERPRET_PROGRAM_S = 0.005
INTERPRET_FIRST_CALL_S = 0.6
INTERPRET_BUDGET_S = 1.0
INTERPRET_BLOCK_N = 128
INTERPRET_ROWS = 128  # query rows (tokens x grouped heads) per tile under the interpreter
INTERPRET_PARTITION = 4096
GPU_BLOCK_N = 64  # tokens per tile on a GPU, fewer for wide heads (see gpu_block_n)
# Prefill tiles on a GPU, as vLLM's unified Triton attention picks them
# (vllm/v1/attention/ops/triton_unified_attention.py, vllm 0.32: BLOCK_M = 16 query rows
# while the GQA group fits, TILE_SIZE_PREFILL = 32 keys, Triton's default 4 warps and 3
# stages). The 64-row tiles used before spilled 1-2 KB per thread with 16-bit dtypes and
# 30-48 KB with fp32 on sm_80 and sm_90 (bench/README.md, "Prefill tiles").
GPU_ROWS = 16  # query rows (tokens x padded group) per prefill tile
GPU_PREFILL_BLOCK_N = 32  # keys per prefill tile, 16-bit queries
# fp32 queries take IEEE dots, run as FMAs whose operands sit in registers: half the keys,
# and 8 rows from head_dim 256 on (16 rows spilled 32 B there on sm_90, 364-472 B at 512),
# the largest tiles that compile without a spill on both archs (bench/compile_report.py --prefill).
GPU_FP32_PREFILL_BLOCK_N = 16
GPU_FP32_ROW_ELEMENTS = 16 * 128  # rows x padded head_dim, never under 8 rows
GPU_PARTITION = 512  # the longest decode split-K partition on a GPU; shorter when the batch is small
GPU_PROGRAMS_PER_SM = 2  # partition programs wanted per SM before partitions stop shrinking
GPU_TILE_BYTES = 16 * 1024  # one K (or V) tile in shared memory


_interpreter_warm = False  # set once the interpreter has run a kernel in this process


def _want_interpreter() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "yes", "on")


def load_kernel(interpret: bool):
    """Import `pagetrace.attention.kernel` compiled or interpreted; returns the module.

    Triton's interpreter replaces its language functions when triton is first imported,
    so it can be chosen only before that: a process that imported triton without
    TRITON_INTERPRET=1 can run the compiled kernel only, and one with it the
    interpreted kernel only.
    """
    if interpret and "pagetrace.attention.kernel" not in sys.modules and not _want_interpreter():
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


def gpu_prefill_tiles(head_dim: int, element_size: int) -> tuple[int, int]:
    """(query rows, keys) per tile of a prefill launch on a GPU (see GPU_ROWS)."""
    block_n = min(gpu_block_n(head_dim, element_size), GPU_PREFILL_BLOCK_N)
    if element_size < 4:
        return GPU_ROWS, block_n
    width = 1 << max(4, (head_dim - 1).bit_length())
    return max(8, min(GPU_ROWS, GPU_FP32_ROW_ELEMENTS // width)), min(block_n, GPU_FP32_PREFILL_BLOCK_N)


def gpu_partition_size(max_seq_len: int, num_tiles: int, num_kv_heads: int, block_n: int, num_sms: int, prefill: bool = False) -> int:
    """Tokens per split-K partition on a GPU: short enough that the (query tile, KV head,
    partition) programs fill GPU_PROGRAMS_PER_SM x num_sms, never under one tile, nor over
    GPU_PARTITION for decode (a prefill batch has programs enough: one partition, no
    partials to store). A power of two, so a multiple of block_n."""
    parts = max(1, -(-GPU_PROGRAMS_PER_SM * num_sms // max(1, num_tiles * num_kv_heads)))
    size = 1 << max(0, (-(-max_seq_len // parts) - 1).bit_length())
    return max(block_n, size if prefill else min(GPU_PARTITION, size))


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def query_block(query_lens: list[int], group: int, rows: int) -> int:
    """Query tokens per tile: 1 for decode, else as many as fit `rows` rows with the group."""
    longest = max(query_lens, default=1)
    if longest <= 1:
        return 1
    group_p = 1 << max(0, (group - 1).bit_length())
    return max(1, min(1 << (longest - 1).bit_length(), rows // group_p))


def plan_kernel(
    kernel, query, key_cache, value_cache, block_tables, seq_lens, batch: Batch | None = None, *,
    layout: str, scale: float, trace: bool, on_gpu: bool,
    max_seq_len: int | None = None, num_kv_heads: int | None = None, query_lens: list[int] | None = None,
    sliding_window: int | None = None, soft_cap: float | None = None, alibi_slopes: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None, out: torch.Tensor | None = None,
    num_sms: int | None = None, partition_size: int | None = None, block_n: int | None = None,
):
    """The kernel's launches for this call (`pagetrace.attention.launch.LaunchPlan`), tiles chosen for
    the device: what `paged_attention` runs, and what a compile check compiles.

    `batch` comes from `check_inputs`; without it (a compile check, tensors on the "meta"
    device, nothing read) give max_seq_len, num_kv_heads and query_lens (default decode).
    num_sms: the GPU's SM count (read from the device when None)."""
    if batch is None:
        query_lens = [1] * seq_lens.shape[0] if query_lens is None else query_lens
        starts = [0]
        for q in query_lens:
            starts.append(starts[-1] + q)
        block_size = dict(zip(get_layout(layout).key, key_cache.shape))["slot"]
        batch = Batch([max_seq_len], query_lens, torch.tensor(starts, dtype=torch.int32).to(query.device), num_kv_heads, block_size,
                      alibi_slopes, k_scale, v_scale)
    head_dim = query.shape[-1]
    group = query.shape[1] // batch.num_kv_heads
    max_seq_len = max(batch.seq_lens)
    if on_gpu and max(batch.query_lens, default=1) > 1:  # prefill, a chunk, or a mixed batch
        rows, gpu_n = gpu_prefill_tiles(head_dim, query.element_size())
    else:  # decode on a GPU (one token per sequence: BLOCK_Q 1 whatever the rows), or the interpreter
        rows, gpu_n = INTERPRET_ROWS, gpu_block_n(head_dim, query.element_size())
    block_q = query_block(batch.query_lens, group, rows)
    from .launch import plan_launches, query_tiles  # after load_kernel: `kernel` is its argument

    tiles = query_tiles(batch.query_lens, block_q, query.device)
    if on_gpu:
        block_n = block_n or gpu_n
        num_sms = num_sms or sm_count(query.device)
        partition_size = partition_size or gpu_partition_size(max_seq_len, len(tiles[0]), batch.num_kv_heads, block_n, num_sms, prefill=block_q > 1)
    else:
        block_n = block_n or INTERPRET_BLOCK_N
        partition_size = partition_size or interpret_partition_size(max_seq_len, block_q, block_n)
    check_tiles(partition_size, block_n)
    return plan_launches(
        query, key_cache, value_cache, block_tables, seq_lens, batch.query_start_loc,
        layout=layout, scale=scale, sliding_window=sliding_window, soft_cap=soft_cap, alibi_slopes=batch.alibi_slopes,
        k_scale=batch.k_scale, v_scale=batch.v_scale, out=out, trace=trace,
        partition_size=partition_size, block_n=block_n, block_q=block_q, max_seq_len=max_seq_len, tiles=tiles,
    )


def interpret_partition_size(max_seq_len: int, block_q: int, block_n: int = INTERPRET_BLOCK_N) -> int:
    """Split-K partition on the CPU: INTERPRET_PARTITION for decode (so long contexts show
    partitions), the whole context for prefill: the interpreter runs programs one after
    another, so partitions only add a reduce program per (query token, head), about 5 ms each."""
    if block_q == 1:
        return max(INTERPRET_PARTITION, block_n)
    return max(INTERPRET_PARTITION, block_n, 1 << max(0, (max_seq_len - 1).bit_length()))


def interpret_cost_s(
    seq_lens: list[int], num_heads: int, num_kv_heads: int, query_lens: list[int] | None = None,
    block_n: int = INTERPRET_BLOCK_N, partition_size: int | None = None,
) -> float:
    """Rough seconds the interpreter needs: a program per (query tile, KV head, partition)
    looping over the key tiles its queries can see, then a reduce program per (query
    token, query head)."""
    query_lens = [1] * len(seq_lens) if query_lens is None else query_lens
    block_q = query_block(query_lens, num_heads // num_kv_heads, INTERPRET_ROWS)
    longest = max(seq_lens, default=0)
    partition_size = partition_size or interpret_partition_size(longest, block_q, block_n)
    parts = max(1, -(-longest // partition_size))
    iterations = programs = 0
    for n, q in zip(seq_lens, query_lens):
        for first in range(n - q, n, block_q):  # each tile sees keys up to its last query's position
            iterations += -(-min(first + block_q, n) // block_n)
            programs += parts
    reduces = sum(query_lens) * num_heads if parts > 1 else 0  # one partition writes the output itself
    per_iteration = INTERPRET_ITERATION_S if block_q == 1 else INTERPRET_PREFILL_ITERATION_S
    cold = 0.0 if _interpreter_warm else INTERPRET_FIRST_CALL_S
    return cold + iterations * num_kv_heads * per_iteration + (programs * num_kv_heads + reduces) * INTERPRET_PROGRAM_S


def resolve_backend(backend: str, device: torch.device, seq_lens: list[int], num_heads: int, num_kv_heads: int, query_lens: list[int] | None = None) -> str:
    if backend not in BACKENDS:
        raise UsageError("--backend", backend, f"choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        if device.type == "cuda":
            return "triton"
        if interpret_cost_s(seq_lens, num_heads, num_kv_heads, query_lens) <= INTERPRET_BUDGET_S:
            return "interpret"
        return "torch"
    if backend == "triton" and device.type != "cuda":
        raise UsageError("--backend", backend, "compiled Triton needs a CUDA device; use --backend interpret (or auto) on the CPU")
    if backend == "interpret" and device.type != "cpu":
        raise UsageError("--backend", backend, "the interpreter runs on CPU tensors; use --device cpu")
    return backend


@dataclass
class Trace:
    """Per-(query token, key) record of one paged-attention call.

    With a Triton backend every field was written by the kernel itself; with the
    torch backend the slots are the gather's indices and there is one partition.
    Rows are query tokens (rows of `query`); for decode, one per sequence.
    """

    backend: str
    partition_size: int
    slots: torch.Tensor  # int64 [num_seqs, max_seq_len]: physical slot read for each key, -1 past the end (or unread: no new tokens)
    partitions: torch.Tensor  # int32 [num_seqs, max_seq_len]: partition that read it, -1 where `slots` is
    logits: torch.Tensor  # fp32 [num_query_tokens, num_heads, max_seq_len]: score before the mask, NaN past the end
    lse: torch.Tensor  # fp32 [num_query_tokens, num_heads]: log-sum-exp of each row's visible scores
    mask: torch.Tensor  # int8 [num_query_tokens, max_seq_len]: 0 visible, 1 causal-masked, 2 window-masked, -1 past the end
    query_start_loc: torch.Tensor  # [num_seqs + 1]: the query tokens of sequence s are rows qsl[s]..qsl[s+1]-1

    @property
    def weights(self) -> torch.Tensor:
        """fp32 [num_query_tokens, num_heads, max_seq_len]: softmax weights, exp(logit - lse)
        where visible, 0 where masked, NaN past the end."""
        w = torch.exp(self.logits - self.lse[..., None])
        w = torch.where(self.mask[:, None, :] == VISIBLE, w, torch.zeros_like(w))
        return torch.where(self.mask[:, None, :] == NO_KEY, torch.full_like(w, float("nan")), w)

    def rows_of(self, seq: int) -> range:
        """The query-token rows of sequence `seq`."""
        return range(int(self.query_start_loc[seq]), int(self.query_start_loc[seq + 1]))

    def __repr__(self) -> str:  # the sizes, never the tensors
        from ..views.notebook import trace_text

        return trace_text(self)

    def _repr_html_(self) -> str:
        from ..views.notebook import trace_html

        return trace_html(self)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    query_start_loc: torch.Tensor | None = None,
    layout: str = "nhd",
    scale: float | None = None,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    trace: bool = False,
    backend: str = "auto",
    partition_size: int | None = None,
    block_n: int | None = None,
):
    """Attention of each sequence's new query tokens over its paged KV cache: decode,
    prefill (or a prefill chunk) and mixed batches in one call.

    Args:
        query: ``[num_query_tokens, num_heads, head_dim]``, fp32, fp16 or bf16. Without
            `query_start_loc`, one token per sequence (decode).
        key_cache, value_cache: the pool of blocks, shaped by `layout` (see
            `pagetrace.paging.layouts.LAYOUTS`; for "nhd" ``[num_blocks, block_size,
            num_kv_heads, head_dim]``), the query's dtype or float8_e4m3fn / float8_e5m2.
        block_tables: int32 or int64 ``[num_seqs, max_blocks]``: physical block of each
            logical block, -1 where a sequence has fewer blocks.
        seq_lens: int32 or int64 ``[num_seqs]``: tokens in each sequence, its new ones
            included (FlashAttention's seqused_k). 0 is legal and gives zeros.
        query_start_loc: int32 or int64 ``[num_seqs + 1]``, cumulative: sequence s's new
            tokens are query rows query_start_loc[s] to query_start_loc[s+1] - 1 (vLLM's
            query_start_loc, FlashAttention's cu_seqlens_q). Causal alignment is
            bottom-right: new token i of q_len sits at position seq_len - q_len + i and
            sees the keys at and before it.
        scale: multiplies q·k; default 1/sqrt(head_dim).
        sliding_window: w: a query at position p sees keys j > p - w only.
        soft_cap: c: score = c·tanh(score / c), after the scale, before the mask.
        alibi_slopes: ``[num_heads]``: score += slope_h·(j - p).
        k_scale, v_scale: fp8 caches' per-tensor scales (value = stored × scale, as vLLM).
        out: a tensor shaped and typed like `query` to write the output into.
        trace: also return a `Trace` of what was read and computed per (query token, key).
        backend: "auto", "triton", "interpret" or "torch".
        partition_size, block_n: split-K partition length and key tile (Triton backends);
            defaults suit the device.

    Returns:
        ``output`` ``[num_query_tokens, num_heads, head_dim]`` in the query's dtype, or
        ``(output, trace)`` when ``trace=True``. num_heads must be a multiple of
        num_kv_heads; query head h reads KV head h // (num_heads // num_kv_heads).
    """
    global _interpreter_warm
    batch = check_inputs(
        query, key_cache, value_cache, block_tables, seq_lens, layout, query_start_loc=query_start_loc,
        sliding_window=sliding_window, soft_cap=soft_cap, alibi_slopes=alibi_slopes, k_scale=k_scale, v_scale=v_scale, out=out,
    )
    head_dim = query.shape[-1]
    if scale is None:
        scale = head_dim**-0.5
    chosen = resolve_backend(backend, query.device, batch.seq_lens, query.shape[1], batch.num_kv_heads, batch.query_lens)
    if chosen == "torch":
        return _torch_backend(query, key_cache, value_cache, block_tables, batch, layout, scale, sliding_window, soft_cap, out, trace)

    if chosen == "triton" and key_cache.dtype == torch.float8_e4m3fn and torch.cuda.get_device_capability(query.device) < (8, 9):
        # Triton has fp8e4nv (e4m3) from sm_89 on: the kernel would not compile (tests/attention/test_compile.py shows it)
        major, minor = torch.cuda.get_device_capability(query.device)
        raise RuntimeFailure(f"float8_e4m3fn caches need a GPU of compute capability 8.9 or newer, this one is {major}.{minor}; "
                             "use float8_e5m2 caches or the torch backend")
    kernel = load_kernel(interpret=chosen == "interpret")
    plan = plan_kernel(
        kernel, query, key_cache, value_cache, block_tables, seq_lens, batch,
        layout=layout, scale=scale, trace=trace, on_gpu=chosen == "triton",
        sliding_window=sliding_window, soft_cap=soft_cap, out=out, partition_size=partition_size, block_n=block_n,
    )
    try:
        result, _, ktrace = plan.run()
        _interpreter_warm = _interpreter_warm or chosen == "interpret"
    except Exception as exc:
        if type(exc).__name__ == "OutOfResources":  # triton.runtime.errors.OutOfResources
            raise RuntimeFailure(f"the kernel does not fit this GPU with head_dim {head_dim} and {plan.block_n}-token tiles: {exc}") from exc
        raise
    if not trace:
        return result
    return result, Trace(chosen, plan.partition_size, ktrace.slots, ktrace.partitions, ktrace.logits, ktrace.lse, ktrace.mask, batch.query_start_loc)


def check_tiles(partition_size: int, block_n: int) -> None:
    if block_n < 16 or block_n & (block_n - 1):
        raise UsageError("block_n", block_n, "must be a power of two >= 16 (tl.dot's minimum)")
    if partition_size < 1 or partition_size % block_n:
        raise UsageError("partition_size", partition_size, f"must be a positive multiple of block_n ({block_n})")


def _torch_backend(query, key_cache, value_cache, block_tables, batch: Batch, layout, scale, sliding_window, soft_cap, out, trace):
    tables = block_tables.to(torch.int64).cpu()  # -1 padding is never indexed: only the blocks a length needs are read
    result = out if out is not None else torch.empty_like(query)
    staging = result if result.dtype == torch.float32 else torch.empty(result.shape, dtype=torch.float32, device=result.device)
    torch_attention(query, key_cache, value_cache, tables, batch, layout, scale, sliding_window, soft_cap, staging)
    if staging is not result:
        result.copy_(staging)
    if not trace:
        return result
    # The trace's scores come from the reference; the output stays the untraced path's,
    # so tracing never changes the result.
    ref = reference_attention(
        query, key_cache, value_cache, tables, batch.seq_lens, layout=layout, block_size=batch.block_size, scale=scale,
        query_lens=batch.query_lens, sliding_window=sliding_window, soft_cap=soft_cap, alibi_slopes=batch.alibi_slopes,
        k_scale=1.0 if batch.k_scale is None else float(batch.k_scale), v_scale=1.0 if batch.v_scale is None else float(batch.v_scale),
        keep_scores=True,
    )
    width = max(batch.seq_lens)
    slots = torch.full((len(batch.seq_lens), width), -1, dtype=torch.int64)
    parts = torch.full((len(batch.seq_lens), width), -1, dtype=torch.int32)
    for s, n in enumerate(batch.seq_lens):
        if batch.query_lens[s]:  # like the kernel: a sequence without new tokens reads nothing
            slots[s, :n] = slots_of(tables[s], n, batch.block_size)
            parts[s, :n] = 0
    return result, Trace("torch", max(width, 1), slots, parts, ref.logits.float().cpu(), ref.lse.float().cpu(), ref.mask.cpu(), batch.query_start_loc.cpu())
