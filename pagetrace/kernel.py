"""The Triton paged-attention decode kernel, its split-K reduce, and their launcher.

Each sequence's one new query attends to that sequence's cached tokens, read only
through its block table. A program handles one (sequence, KV head, partition): it
loads the queries of every query head that shares the KV head (GQA/MQA), then walks
the partition's tokens BLOCK_N at a time, doing the two-level lookup per token

    logical = t // block_size;  offset = t % block_size
    physical = block_tables[seq, logical]

and reading each K/V vector once through the layout's strides. Scores go through an
online softmax in fp32. A second kernel merges the partitions (max, sum, log-sum-exp).

Import this module only through `pagetrace.attention`, which decides first whether
Triton runs compiled or under its interpreter (TRITON_INTERPRET is read at import).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .layouts import get_layout, kernel_strides


# Arguments that change with the batch's longest sequence (partition length, table width,
# trace width): specialising on their values (== 1, % 16) would compile new variants as a
# context grows. The partition buffers' strides need no such care: their partition axis is
# allocated in multiples of 16 (PARTS_ALIGN), so those strides stay multiples of 16.
_PARTITION_GROWING = ("partition_size", "stride_bts", "stride_ts", "stride_ls", "stride_lh")
_REDUCE_GROWING = ("partition_size",)
PARTS_ALIGN = 16


@triton.jit(do_not_specialize=_PARTITION_GROWING)
def _paged_attention_partition(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr,
    part_out_ptr, part_m_ptr, part_l_ptr,
    trace_slot_ptr, trace_part_ptr, trace_logit_ptr,
    scale, block_size, partition_size,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kdh, stride_kdl,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bts, stride_btb,
    stride_pos, stride_poh, stride_pop, stride_pod,
    stride_pms, stride_pmh, stride_pmp,
    stride_ts, stride_tt,
    stride_ls, stride_lh, stride_lt,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, X: tl.constexpr,
    KEY_ALIGNED: tl.constexpr,  # X > 1 and every X-element key chunk starts 16-byte aligned (the launcher checked)
    VALUE_RUN: tl.constexpr,  # > 1: runs of this many tokens (one block's) lie contiguous in V, aligned (vllm's value cache)
    BLOCK_N: tl.constexpr,
    TRACE: tl.constexpr,
    IEEE_DOT: tl.constexpr,  # fp32 products: fp32 caches, and bf16 under the interpreter (numpy has no bf16 matmul)
):
    part = tl.program_id(0)  # the axis without the 65535 limit: a long context has many partitions
    kv_head = tl.program_id(1)
    seq = tl.program_id(2).to(tl.int64)  # int64 offsets: trace and partition buffers can pass 2**31 elements
    seq_len = tl.load(seq_lens_ptr + seq)
    start = part * partition_size
    end = tl.minimum(start + partition_size, seq_len)

    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, HEAD_DIM_P)
    g_mask = g < GROUP
    d_mask = d < HEAD_DIM
    heads = kv_head * GROUP + g

    # -- the queries of every head that shares this KV head --
    q = tl.load(
        q_ptr + seq * stride_qs + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=g_mask[:, None] & d_mask[None, :], other=0.0,
    )
    k_chunk = (d // X) * stride_kdh  # vllm splits a key into X-element chunks
    if KEY_ALIGNED:  # without the proof Triton reads a split key one element at a time
        k_chunk = tl.multiple_of(k_chunk, X)
    k_dim = k_chunk + (d % X) * stride_kdl

    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], tl.float32)
    for tile in range(start, end, BLOCK_N):
        t = tile + tl.arange(0, BLOCK_N)
        t_mask = t < end
        # -- two-level lookup: block table, then offset inside the block --
        logical = t // block_size
        offset = t % block_size
        in_table = t_mask
        if VALUE_RUN > 1:  # a token past the end keeps its block's entry, so a run of tokens reads one block
            in_table = logical < tl.cdiv(seq_len, block_size)
        physical = tl.load(block_tables_ptr + seq * stride_bts + logical * stride_btb, mask=in_table, other=0).to(tl.int64)
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_token = physical * stride_kb + offset * stride_ko + kv_head * stride_kh
        if KEY_ALIGNED:
            k_token = tl.multiple_of(k_token, X)
        k = tl.load(k_ptr + k_token[:, None] + k_dim[None, :], mask=kv_mask, other=0.0)
        v_off = physical[:, None] * stride_vb + offset[:, None] * stride_vo + kv_head * stride_vh + d[None, :] * stride_vd
        if VALUE_RUN > 1:  # read along the tokens: load whole runs (inside real blocks), zero the tokens past the end
            v_off = tl.max_contiguous(tl.multiple_of(v_off, [VALUE_RUN, 1]), [VALUE_RUN, 1])
            v = tl.where(t_mask[:, None], tl.load(v_ptr + v_off, mask=d_mask[None, :], other=0.0), 0.0)
        else:
            v = tl.load(v_ptr + v_off, mask=kv_mask, other=0.0)
        # -- scores --
        if IEEE_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(t_mask[None, :], s * scale, float("-inf"))
        if TRACE:
            slot = physical * block_size + offset
            first_head = t_mask & (tl.zeros_like(t) + kv_head == 0)  # one KV head's programs record the slots
            tl.store(trace_slot_ptr + seq * stride_ts + t * stride_tt, slot, mask=first_head)
            tl.store(trace_part_ptr + seq * stride_ts + t * stride_tt, tl.zeros_like(t) + part, mask=first_head)
            tl.store(
                trace_logit_ptr + seq * stride_ls + heads[:, None] * stride_lh + t[None, :] * stride_lt,
                s, mask=g_mask[:, None] & t_mask[None, :],
            )
        # -- online softmax --
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # -- epilogue: this partition's normalised output, max and sum --
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(
        part_out_ptr + seq * stride_pos + heads[:, None] * stride_poh + part * stride_pop + d[None, :] * stride_pod,
        out, mask=g_mask[:, None] & d_mask[None, :],
    )
    ml = seq * stride_pms + heads * stride_pmh + part * stride_pmp
    tl.store(part_m_ptr + ml, m_i, mask=g_mask)
    tl.store(part_l_ptr + ml, l_i, mask=g_mask)


@triton.jit(do_not_specialize=_REDUCE_GROWING)
def _paged_attention_reduce(
    part_out_ptr, part_m_ptr, part_l_ptr, out_ptr, lse_ptr, seq_lens_ptr, partition_size,
    stride_pos, stride_poh, stride_pop, stride_pod,
    stride_pms, stride_pmh, stride_pmp,
    stride_os, stride_oh, stride_od,
    stride_lses, stride_lseh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, PARTS_TILE: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_parts = tl.cdiv(seq_len, partition_size)
    d = tl.arange(0, HEAD_DIM_P)
    d_mask = d < HEAD_DIM
    ml = part_m_ptr + seq * stride_pms + head * stride_pmh
    ll = part_l_ptr + seq * stride_pms + head * stride_pmh

    # -- pass 1: the largest partition max --
    m_lanes = tl.full([PARTS_TILE], float("-inf"), tl.float32)
    for p0 in range(0, num_parts, PARTS_TILE):
        p = p0 + tl.arange(0, PARTS_TILE)
        m_lanes = tl.maximum(m_lanes, tl.load(ml + p * stride_pmp, mask=p < num_parts, other=float("-inf")))
    m = tl.max(m_lanes, axis=0)

    # -- pass 2: rescale each partition's sum and output to that max, and add --
    l_lanes = tl.zeros([PARTS_TILE], tl.float32)
    acc = tl.zeros([PARTS_TILE, HEAD_DIM_P], tl.float32)
    for p0 in range(0, num_parts, PARTS_TILE):
        p = p0 + tl.arange(0, PARTS_TILE)
        p_mask = p < num_parts
        w = tl.load(ll + p * stride_pmp, mask=p_mask, other=0.0) * tl.exp(
            tl.load(ml + p * stride_pmp, mask=p_mask, other=float("-inf")) - m
        )
        o = tl.load(
            part_out_ptr + seq * stride_pos + head * stride_poh + p[:, None] * stride_pop + d[None, :] * stride_pod,
            mask=p_mask[:, None] & d_mask[None, :], other=0.0,
        )
        l_lanes += w
        acc += w[:, None] * o
    l = tl.sum(l_lanes, axis=0)
    out = tl.sum(acc, axis=0) / l
    tl.store(out_ptr + seq * stride_os + head * stride_oh + d * stride_od, out.to(out_ptr.dtype.element_ty), mask=d_mask)
    tl.store(lse_ptr + seq * stride_lses + head * stride_lseh, m + tl.log(l))


@dataclass
class KernelTrace:
    """What the kernel wrote while it ran (trace mode)."""

    slots: torch.Tensor  # int64 [num_seqs, max_seq_len]: physical slot each token was loaded from, -1 past the end
    partitions: torch.Tensor  # int32 [num_seqs, max_seq_len]: the partition (program) that loaded it, -1 past the end
    logits: torch.Tensor  # fp32 [num_seqs, num_heads, max_seq_len]: q·k * scale, NaN past the end
    lse: torch.Tensor  # fp32 [num_seqs, num_heads]: log-sum-exp of each head's logits


def interpreted() -> bool:
    """Whether this module's kernels run under Triton's interpreter."""
    return not isinstance(_paged_attention_partition, triton.runtime.JITFunction)


def _pow2(n: int, at_least: int = 1) -> int:
    return max(at_least, triton.next_power_of_2(n))


def cache_geometry(key_cache: torch.Tensor, value_cache: torch.Tensor, layout: str) -> tuple[int, int, int]:
    """(block_size, num_kv_heads, x) read from the key cache's shape under `layout`."""
    lay = get_layout(layout)
    shape = dict(zip(lay.key_axes, key_cache.shape))
    assert key_cache.dim() == len(lay.key_axes), f"key cache has {key_cache.dim()} dims; '{layout}' needs {lay.key_axes}"
    assert value_cache.dim() == len(lay.value_axes), f"value cache has {value_cache.dim()} dims; '{layout}' needs {lay.value_axes}"
    return shape["slot"], shape.get("head", 1), shape.get("dim_lo", 1)


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
    `pagetrace.gpu_compile` to compile it for a GPU architecture without a GPU."""

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
    out: torch.Tensor
    lse: torch.Tensor
    trace: KernelTrace | None

    def run(self) -> tuple[torch.Tensor, torch.Tensor, KernelTrace | None]:
        for one in self.launches:
            one()
        return self.out, self.lse, self.trace


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
    *,
    layout: str,
    scale: float,
    trace: bool = False,
    partition_size: int = 512,
    block_n: int = 64,
    max_seq_len: int | None = None,
) -> LaunchPlan:
    """Allocate the outputs and work buffers and build the launches, without running them.

    Nothing here reads tensor data, so inputs on the "meta" device plan a launch of any
    size for free (that is how `pagetrace.gpu_compile` compiles what a GPU would run).
    """
    num_seqs, num_heads, head_dim = query.shape
    block_size, num_kv_heads, x = cache_geometry(key_cache, value_cache, layout)
    assert num_heads % num_kv_heads == 0, f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads"
    assert key_cache.dtype == value_cache.dtype == query.dtype, "query, key cache and value cache must share a dtype"
    assert block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32, "block_tables and seq_lens must be int32"
    assert block_tables.shape[0] == seq_lens.shape[0] == num_seqs, "one block-table row and one length per sequence"
    assert block_n >= 16 and block_n & (block_n - 1) == 0, "block_n must be a power of two >= 16 (tl.dot's minimum)"
    assert partition_size % block_n == 0, "partition_size must be a multiple of block_n"
    assert num_seqs <= 65535 and num_heads <= 65535, "a CUDA grid's y and z axes stop at 65535"
    devices = {t.device for t in (query, key_cache, value_cache, block_tables, seq_lens)}
    assert len(devices) == 1, f"all tensors must be on one device, got {devices}"
    device = query.device
    seq_lens = seq_lens.contiguous()  # both kernels read seq_lens[seq] with stride 1
    if max_seq_len is None:
        max_seq_len = int(seq_lens.max())
    num_parts = triton.cdiv(max_seq_len, partition_size)
    group = num_heads // num_kv_heads
    ks = kernel_strides(get_layout(layout), "key", key_cache.stride())
    vs = kernel_strides(get_layout(layout), "value", value_cache.stride())
    assert vs["dim_lo"] == 0, "the value cache is never split"

    parts_alloc = triton.cdiv(num_parts, PARTS_ALIGN) * PARTS_ALIGN
    part_out = torch.empty(num_seqs, num_heads, parts_alloc, head_dim, dtype=torch.float32, device=device)
    part_m = torch.empty(num_seqs, num_heads, parts_alloc, dtype=torch.float32, device=device)
    part_l = torch.empty_like(part_m)
    if trace:
        slots = torch.full((num_seqs, max_seq_len), -1, dtype=torch.int64, device=device)
        parts = torch.full((num_seqs, max_seq_len), -1, dtype=torch.int32, device=device)
        logits = torch.full((num_seqs, num_heads, max_seq_len), float("nan"), dtype=torch.float32, device=device)
    else:  # never written: TRACE is a compile-time False
        slots = parts = logits = part_m
    logit_strides = logits.stride() if trace else (0, 0, 0)
    slot_strides = slots.stride() if trace else (0, 0)

    partition = Launch(_paged_attention_partition, (num_parts, num_kv_heads, num_seqs), (
        query, key_cache, value_cache, block_tables, seq_lens,
        part_out, part_m, part_l,
        slots, parts, logits,
        scale, block_size, partition_size,
        *query.stride(),
        ks["block"], ks["slot"], ks["head"], ks["dim_hi"], ks["dim_lo"],
        vs["block"], vs["slot"], vs["head"], vs["dim_hi"],
        *block_tables.stride(),
        *part_out.stride(),
        *part_m.stride(),
        *slot_strides,
        *logit_strides,
    ), dict(
        GROUP=group, GROUP_P=_pow2(group),  # tl.dot needs K >= 16 only; Triton pads M (the group) itself
        HEAD_DIM=head_dim, HEAD_DIM_P=_pow2(head_dim, 16), X=x,
        KEY_ALIGNED=x > 1 and ks["dim_lo"] == 1 and key_cache.data_ptr() % 16 == 0
        and all(ks[axis] % x == 0 for axis in ("block", "slot", "head", "dim_hi")),
        VALUE_RUN=_value_run(vs, block_size, block_n, value_cache),
        BLOCK_N=block_n,
        TRACE=trace, IEEE_DOT=query.dtype == torch.float32 or (interpreted() and query.dtype == torch.bfloat16),
    ))
    out = torch.empty_like(query)
    lse = torch.empty(num_seqs, num_heads, dtype=torch.float32, device=device)
    reduce = Launch(_paged_attention_reduce, (num_seqs, num_heads, 1), (
        part_out, part_m, part_l, out, lse, seq_lens, partition_size,
        *part_out.stride(),
        *part_m.stride(),
        *out.stride(),
        *lse.stride(),
    ), dict(
        HEAD_DIM=head_dim, HEAD_DIM_P=_pow2(head_dim, 16),
        PARTS_TILE=max(2, min(32, 2048 // _pow2(head_dim, 16))),  # by shape, not partition count: one variant per shape
    ))
    kernel_trace = KernelTrace(slots, parts, logits, lse) if trace else None
    return LaunchPlan([partition, reduce], partition_size, block_n, out, lse, kernel_trace)
