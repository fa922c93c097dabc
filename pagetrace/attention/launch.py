"""The kernel's launches: the grid, arguments, work buffers and constexprs of the partition
kernel and the reduce (`kernel.py`) for one call, built without running them.

A `LaunchPlan` runs the call; a compile check (`gpu_compile.py`) compiles its launches for
a GPU architecture without a GPU. Import this module only after `api.load_kernel` has
chosen compiled or interpreted Triton (it imports `kernel`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..paging.layouts import get_layout, kernel_strides
from .kernel import NO_KEY, PARTS_ALIGN, KernelTrace, _paged_attention_partition, _paged_attention_reduce, interpreted


def _pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, triton.next_power_of_2(n))


def cache_geometry(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(block_size, num_kv_heads, x) read from the key cache's shape under `layout`."""
    lay = get_layout(layout)
    shape = dict(zip(lay.key, key_cache.shape))
    assert key_cache.dim() == len(lay.key), f"key cache has {key_cache.dim()} dims; '{layout}' needs {lay.key}"
    assert value_cache.dim() == len(lay.value), f"value cache has {value_cache.dim()} dims; '{layout}' needs {lay.value}"
    return shape["slot"], shape.get("head", 1), shape.get("dim%x", 1)


def query_tiles(query_lens: list[int], block_q: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(tile_seq, tile_q0), int32 on `device`: each tile's sequence and first query token;
    a sequence with q_len new tokens gets ceil(q_len / block_q) tiles (none when q_len is 0).
    Computed on the host from the lengths the caller already has (no device sync; a
    "meta" device plans for free)."""
    q_lens = torch.tensor(query_lens, dtype=torch.int64)
    per_seq = (q_lens + block_q - 1) // block_q
    tile_seq = torch.repeat_interleave(torch.arange(len(q_lens)), per_seq)
    first_tile = torch.cumsum(per_seq, 0) - per_seq
    starts = torch.cumsum(q_lens, 0) - q_lens
    tile_q0 = starts[tile_seq] + (torch.arange(len(tile_seq)) - first_tile[tile_seq]) * block_q
    return tile_seq.to(torch.int32).to(device), tile_q0.to(torch.int32).to(device)


def _value_run(vs: dict[str, int], block_size: int, block_n: int, value_cache: torch.Tensor) -> int:
    """Tokens per contiguous, 16-byte-aligned run of the value cache that a tile may read at
    once: the largest power of two dividing the block size (so runs never cross a block,
    tiles starting at multiples of block_n) when a block's tokens are adjacent in memory
    (vllm's value layout); 1 otherwise."""
    run = min(block_size & -block_size, block_n)
    aligned = value_cache.data_ptr() % 16 == 0 and all(vs[axis] % run == 0 for axis in ("block", "head", "dim_hi"))
    return run if vs["slot"] == 1 and run > 1 and aligned else 1


@dataclass(slots=True)
class Launch:
    """One kernel launch exactly as the launcher makes it: call it to run it, or hand it to
    a compile check to compile it for a GPU architecture without a GPU."""

    kernel: object  # a triton JITFunction (or the interpreter's stand-in for one)
    grid: tuple[int, int, int]
    args: tuple
    constexprs: dict[str, object]

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.constexprs)


@dataclass(slots=True)
class LaunchPlan:
    """The launches of one call, in order, and the tensors they write."""

    launches: list[Launch]
    partition_size: int
    block_n: int
    block_q: int
    out: torch.Tensor  # what the reduce writes
    lse: torch.Tensor
    trace: KernelTrace | None
    final: torch.Tensor | None = None  # the caller's output, when `out` is an fp32 stand-in for it

    def run(self) -> tuple[torch.Tensor, torch.Tensor, KernelTrace | None]:
        for one in self.launches:
            one()
        if self.final is None:
            return self.out, self.lse, self.trace
        self.final.copy_(self.out)  # torch's cast rounds to nearest even
        return self.final, self.lse, self.trace


def launch(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, KernelTrace | None]:
    """Run the partition kernel and the reduce; returns (output, lse, trace or None).
    Takes `plan_launches`'s arguments."""
    return plan_launches(*args, **kwargs).run()


def plan_launches(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor | None = None,
    *,
    layout: str,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    trace: bool = False,
    partition_size: int = 512,
    block_n: int = 64,
    block_q: int = 1,
    max_seq_len: int | None = None,
    tiles: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> LaunchPlan:
    """Allocate the outputs and work buffers and build the launches, without running them.

    query: [num_query_tokens, num_heads, head_dim]; query_start_loc: [num_seqs + 1]
    (None: decode, one token per sequence). k_scale / v_scale: fp32 one-element tensors, read by the kernel.
    `out`, when given, receives the output (any strides). `tiles`: `query_tiles`' result
    when the caller has it.
    """
    num_tokens, num_heads, head_dim = query.shape
    if query_start_loc is None:  # decode: one query token per sequence, a tile each (no host sync)
        query_start_loc = torch.arange(seq_lens.shape[0] + 1, dtype=torch.int32, device=query.device)
        if tiles is None and block_q == 1:
            tiles = (query_start_loc[:-1], query_start_loc[:-1])
    block_size, num_kv_heads, x = cache_geometry(key_cache, value_cache, layout)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads"
    assert key_cache.dtype == value_cache.dtype, "key and value caches must share a dtype"
    assert block_tables.shape[0] == seq_lens.shape[0] == query_start_loc.shape[0] - 1, "one table row, length and query range per sequence"
    assert block_n >= 16 and block_n & (block_n - 1) == 0, "block_n must be a power of two >= 16 (tl.dot's minimum)"
    assert partition_size % block_n == 0, "partition_size must be a multiple of block_n"
    assert block_q >= 1 and block_q & (block_q - 1) == 0, "block_q must be a power of two"
    assert num_heads <= 65535, "a CUDA grid's y axis stops at 65535"
    device = query.device
    seq_lens = seq_lens.contiguous()  # read as seq_lens[seq] with stride 1
    query_start_loc = query_start_loc.contiguous()
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max()) if seq_lens.numel() else 0
    num_parts = max(1, triton.cdiv(max_seq_len, partition_size))
    group = num_heads // num_kv_heads
    ks = kernel_strides(get_layout(layout), "key", key_cache.stride())
    vs = kernel_strides(get_layout(layout), "value", value_cache.stride())
    assert vs["dim_lo"] == 0, "the value cache is never split"
    if tiles is None:
        starts = query_start_loc.tolist()
        tiles = query_tiles([b - a for a, b in zip(starts, starts[1:])], block_q, device)
    tile_seq, tile_q0 = tiles
    num_tiles = len(tile_seq)

    direct = num_parts == 1
    rows = (1, 1) if direct else (num_tokens, num_heads)  # one partition writes no partials: stand-ins, never read
    parts_alloc = triton.cdiv(num_parts, PARTS_ALIGN) * PARTS_ALIGN
    part_out = torch.empty(*rows, parts_alloc, 1 if direct else head_dim, dtype=torch.float32, device=device)
    part_m = torch.empty(*rows, parts_alloc, dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    if trace:
        slots = torch.full((len(seq_lens), max_seq_len), -1, dtype=torch.int64, device=device)
        parts = torch.full((len(seq_lens), max_seq_len), -1, dtype=torch.int32, device=device)
        mask = torch.full((num_tokens, max_seq_len), NO_KEY, dtype=torch.int8, device=device)
        logits = torch.full((num_tokens, num_heads, max_seq_len), float("nan"), dtype=torch.float32, device=device)
    else:  # never written: TRACE is a compile-time False
        slots = parts = mask = logits = part_m
    dummy = part_m  # stands for an absent k_scale / v_scale / alibi_slopes (never read)
    # bf16 under the interpreter: its fp32 -> bf16 cast truncates, so the kernel writes fp32
    # and `LaunchPlan.run` casts on the host, where torch rounds to nearest even
    host_cast = interpreted() and query.dtype == torch.bfloat16
    final = out if out is not None else torch.empty_like(query)
    result = torch.empty(query.shape, dtype=torch.float32, device=device) if host_cast else final
    lse = torch.empty(num_tokens, num_heads, dtype=torch.float32, device=device)

    partition = Launch(_paged_attention_partition, (num_tiles * num_parts, num_kv_heads, 1), (
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc,
        tile_seq, tile_q0,
        dummy if k_scale is None else k_scale, dummy if v_scale is None else v_scale,
        dummy if alibi_slopes is None else alibi_slopes,
        part_out, part_m, part_l, result, lse,
        slots, parts, mask, logits,
        scale, float(soft_cap or 0.0), int(sliding_window or 0), block_size, partition_size, num_parts,
        *query.stride(),
        ks["block"], ks["slot"], ks["head"], ks["dim_hi"], ks["dim_lo"],
        vs["block"], vs["slot"], vs["head"], vs["dim_hi"],
        *block_tables.stride(),
        *part_out.stride(),
        *part_m.stride(),
        *result.stride(),
        *lse.stride(),
        *(slots.stride() if trace else (0, 0)),
        *(mask.stride() if trace else (0, 0)),
        *(logits.stride() if trace else (0, 0, 0)),
    ), dict(
        GROUP=group, GROUP_P=_pow2(group), BLOCK_Q=block_q,  # tl.dot needs K >= 16 only; Triton pads M itself
        HEAD_DIM=head_dim, HEAD_DIM_P=_pow2(head_dim, 16), X=x,
        KEY_ALIGNED=x > 1 and ks["dim_lo"] == 1 and key_cache.data_ptr() % 16 == 0
        and all(ks[axis] % x == 0 for axis in ("block", "slot", "head", "dim_hi")),
        VALUE_RUN=_value_run(vs, block_size, block_n, value_cache),
        BLOCK_N=block_n,
        SOFT_CAP=soft_cap is not None, SLIDING=sliding_window is not None, ALIBI=alibi_slopes is not None,
        KV_SCALED=k_scale is not None,
        TRACE=trace, IEEE_DOT=query.dtype == torch.float32 or (interpreted() and query.dtype == torch.bfloat16),
        DIRECT=direct,
    ))
    reduce = Launch(_paged_attention_reduce, (num_tokens, num_heads, 1), (
        part_out, part_m, part_l, result, lse, num_parts,
        *part_out.stride(),
        *part_m.stride(),
        *result.stride(),
        *lse.stride(),
    ), dict(
        HEAD_DIM=head_dim, HEAD_DIM_P=_pow2(head_dim, 16),
        PARTS_TILE=max(2, min(32, 2048 // _pow2(head_dim, 16))),  # by shape, not partition count: one variant per shape
    ))
    kernel_trace = KernelTrace(slots, parts, mask, logits, lse) if trace else None
    launches = ([partition] if direct else [partition, reduce]) if num_tokens else []
    return LaunchPlan(launches, partition_size, block_n, block_q, result, lse, kernel_trace, final if host_cast else None)
