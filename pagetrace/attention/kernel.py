"""The Triton paged-attention kernel for mixed batches, its split-K reduce, and their launcher.

One launch serves a batch where each sequence brings any number of new query tokens
(decode: one; prefill or a prefill chunk: many), read only through its block table.
A program handles one (query tile, KV head, partition): a query tile is up to BLOCK_Q
consecutive new tokens of one sequence times the GROUP query heads that share the KV
head, flattened to BLOCK_Q * GROUP_P rows (vLLM's unified Triton attention tiles the
same way: BLOCK_M = BLOCK_Q * num_queries_per_kv). It walks its partition of the keys
BLOCK_N at a time, doing the two-level lookup per key

    logical = t // block_size;  offset = t % block_size
    physical = block_tables[seq, logical]

and masks inside the loop. Causal alignment is bottom-right (FlashAttention's
convention): of a sequence with seq_len tokens, q_len of them new, query i sits at
position p = seq_len - q_len + i and sees keys t <= p; with a sliding window w only
keys t > p - w. Scores: q.k * scale, then soft cap c * tanh(s / c), then ALiBi
slope * (t - p), then the mask; an online softmax in fp32. fp8 caches are read as
stored and scaled by k_scale (scores) and v_scale (output). A second kernel merges the
partitions (max, sum, log-sum-exp) per (query token, head); with one partition (prefill
by default, short decode contexts on the CPU) the first kernel writes the output itself.

Import this module only through `pagetrace.attention.api`, which decides first whether
Triton runs compiled or under its interpreter (TRITON_INTERPRET is read at import).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..paging.layouts import get_layout, kernel_strides

# Arguments that change with the batch (partition length and count, table width, trace
# width): specialising on their values (== 1, % 16) would compile new variants as a
# context grows.
_PARTITION_GROWING = ("partition_size", "num_parts", "stride_bts", "stride_ts", "stride_mt", "stride_lt", "stride_lh")
_REDUCE_GROWING = ("num_parts",)
PARTS_ALIGN = 16  # the partition axis of the work buffers is allocated in multiples of this

# mask states in a trace (and in `pagetrace.attention.reference.mask_states`)
VISIBLE, CAUSAL_MASKED, WINDOW_MASKED, NO_KEY = 0, 1, 2, -1


@triton.jit
def _tanh(x):
    # 1 - 2 / (e^2x + 1): saturates to +-1 instead of overflowing to inf / inf
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit(do_not_specialize=_PARTITION_GROWING)
def _paged_attention_partition(
    q_ptr, k_ptr, v_ptr, block_tables_ptr, seq_lens_ptr, query_start_loc_ptr,
    tile_seq_ptr, tile_q0_ptr,
    k_scale_ptr, v_scale_ptr, alibi_ptr,
    part_out_ptr, part_m_ptr, part_l_ptr, out_ptr, lse_ptr,
    trace_slot_ptr, trace_part_ptr, trace_mask_ptr, trace_logit_ptr,
    scale, soft_cap, sliding_window, block_size, partition_size, num_parts,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kdh, stride_kdl,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bts, stride_btb,
    stride_pot, stride_poh, stride_pop, stride_pod,
    stride_pmt, stride_pmh, stride_pmp,
    stride_ot, stride_oh, stride_od,
    stride_lset, stride_lseh,
    stride_ts, stride_tt,
    stride_mt, stride_mk,
    stride_lt, stride_lh, stride_lk,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, BLOCK_Q: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, X: tl.constexpr,
    KEY_ALIGNED: tl.constexpr,  # X > 1 and every X-element key chunk starts 16-byte aligned (the launcher checked)
    VALUE_RUN: tl.constexpr,  # > 1: runs of this many tokens (one block's) lie contiguous in V, aligned (vllm's value cache)
    BLOCK_N: tl.constexpr,
    SOFT_CAP: tl.constexpr, SLIDING: tl.constexpr, ALIBI: tl.constexpr, KV_SCALED: tl.constexpr,
    TRACE: tl.constexpr,
    IEEE_DOT: tl.constexpr,  # fp32 products: fp32 queries, and bf16 under the interpreter (numpy has no bf16 matmul)
    DIRECT: tl.constexpr,  # one partition: write the output and lse here, no reduce
):
    pid = tl.program_id(0)  # (tile, partition) on the axis without the 65535 limit
    tile = pid // num_parts
    part = pid % num_parts
    kv_head = tl.program_id(1)
    seq = tl.load(tile_seq_ptr + tile).to(tl.int64)  # int64 offsets: buffers can pass 2**31 elements
    q0 = tl.load(tile_q0_ptr + tile).to(tl.int64)  # the tile's first query token (a row of `query`)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
    q_begin = tl.load(query_start_loc_ptr + seq).to(tl.int64)
    q_end = tl.load(query_start_loc_ptr + seq + 1).to(tl.int64)
    context = seq_len - (q_end - q_begin).to(tl.int32)  # tokens cached before this step's new ones

    # -- rows: BLOCK_Q query tokens x the GROUP heads sharing this KV head --
    r = tl.arange(0, BLOCK_Q * GROUP_P)
    g = r % GROUP_P
    token = q0 + r // GROUP_P
    row_ok = (token < q_end) & (g < GROUP)
    pos = context + (token - q_begin).to(tl.int32)  # the key position each row's query sits at
    heads = kv_head * GROUP + g
    d = tl.arange(0, HEAD_DIM_P)
    d_mask = d < HEAD_DIM
    q = tl.load(
        q_ptr + token[:, None] * stride_qt + heads[:, None] * stride_qh + d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_mask[None, :], other=0.0,
    )
    k_chunk = (d // X) * stride_kdh  # vllm splits a key into X-element chunks
    if KEY_ALIGNED:  # without the proof Triton reads a split key one element at a time
        k_chunk = tl.multiple_of(k_chunk, X)
    k_dim = k_chunk + (d % X) * stride_kdl
    qk_scale = scale
    if KV_SCALED:
        qk_scale = scale * tl.load(k_scale_ptr)
    if ALIBI:
        slope = tl.load(alibi_ptr + heads, mask=row_ok, other=0.0)

    # -- the keys this tile can see, cut to this partition (a trace records every key) --
    first_pos = context + (q0 - q_begin).to(tl.int32)
    hi = tl.minimum(first_pos + BLOCK_Q, seq_len)
    lo = 0
    if SLIDING:
        lo = tl.maximum(first_pos - sliding_window + 1, 0)
    if TRACE:
        lo = 0
        hi = seq_len
    start = tl.maximum(part * partition_size, lo)
    end = tl.minimum(part * partition_size + partition_size, hi)
    if VALUE_RUN > 1:  # tiles start on a run (the keys below a window's start are masked anyway)
        start = start // VALUE_RUN * VALUE_RUN

    m_i = tl.full([BLOCK_Q * GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_P, HEAD_DIM_P], tl.float32)
    for tile_start in range(start, end, BLOCK_N):
        t = tile_start + tl.arange(0, BLOCK_N)
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
        # -- scores: scale, soft cap, ALiBi, then the mask --
        if IEEE_DOT:
            s = tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(q.dtype)))
        s = s * qk_scale
        if SOFT_CAP:
            s = soft_cap * _tanh(s / soft_cap)
        if ALIBI:
            s += slope[:, None] * (t[None, :] - pos[:, None]).to(tl.float32)
        causal = t[None, :] <= pos[:, None]
        visible = causal & t_mask[None, :]
        if SLIDING:
            inside = t[None, :] > pos[:, None] - sliding_window
            visible = visible & inside
        if TRACE:
            first_head = t_mask & (tl.zeros_like(t) + kv_head == 0)  # one KV head's programs record per-key facts
            tl.store(trace_slot_ptr + seq * stride_ts + t * stride_tt, physical * block_size + offset, mask=first_head)
            tl.store(trace_part_ptr + seq * stride_ts + t * stride_tt, tl.zeros_like(t) + part, mask=first_head)
            state = tl.where(causal, 0, 1)
            if SLIDING:
                state = tl.where(causal & ~inside, 2, state)
            tl.store(
                trace_mask_ptr + token[:, None] * stride_mt + t[None, :] * stride_mk, state.to(tl.int8),
                mask=(row_ok & (g == 0))[:, None] & first_head[None, :],
            )
            tl.store(
                trace_logit_ptr + token[:, None] * stride_lt + heads[:, None] * stride_lh + t[None, :] * stride_lk,
                s, mask=row_ok[:, None] & t_mask[None, :],
            )
        s = tl.where(visible, s, float("-inf"))
        # -- online softmax --
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if IEEE_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    # -- epilogue: this partition's normalised output, max and sum (zeros, -inf, 0 when it saw no key) --
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    if KV_SCALED:
        out = out * tl.load(v_scale_ptr)
    if DIRECT:
        tl.store(
            out_ptr + token[:, None] * stride_ot + heads[:, None] * stride_oh + d[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_mask[None, :],
        )
        tl.store(lse_ptr + token * stride_lset + heads * stride_lseh, m_i + tl.log(l_i), mask=row_ok)
        return
    tl.store(
        part_out_ptr + token[:, None] * stride_pot + heads[:, None] * stride_poh + part * stride_pop + d[None, :] * stride_pod,
        out, mask=row_ok[:, None] & d_mask[None, :],
    )
    ml = token * stride_pmt + heads * stride_pmh + part * stride_pmp
    tl.store(part_m_ptr + ml, m_i, mask=row_ok)
    tl.store(part_l_ptr + ml, l_i, mask=row_ok)


@triton.jit(do_not_specialize=_REDUCE_GROWING)
def _paged_attention_reduce(
    part_out_ptr, part_m_ptr, part_l_ptr, out_ptr, lse_ptr, num_parts,
    stride_pot, stride_poh, stride_pop, stride_pod,
    stride_pmt, stride_pmh, stride_pmp,
    stride_ot, stride_oh, stride_od,
    stride_lset, stride_lseh,
    HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, PARTS_TILE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    d = tl.arange(0, HEAD_DIM_P)
    d_mask = d < HEAD_DIM
    ml = part_m_ptr + token * stride_pmt + head * stride_pmh
    ll = part_l_ptr + token * stride_pmt + head * stride_pmh

    # -- pass 1: the largest partition max (a partition that saw no key has -inf) --
    m_lanes = tl.full([PARTS_TILE], float("-inf"), tl.float32)
    for p0 in range(0, num_parts, PARTS_TILE):
        p = p0 + tl.arange(0, PARTS_TILE)
        m_lanes = tl.maximum(m_lanes, tl.load(ml + p * stride_pmp, mask=p < num_parts, other=float("-inf")))
    m = tl.max(m_lanes, axis=0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    # -- pass 2: rescale each partition's sum and output to that max, and add --
    l_lanes = tl.zeros([PARTS_TILE], tl.float32)
    acc = tl.zeros([PARTS_TILE, HEAD_DIM_P], tl.float32)
    for p0 in range(0, num_parts, PARTS_TILE):
        p = p0 + tl.arange(0, PARTS_TILE)
        p_mask = p < num_parts
        w = tl.load(ll + p * stride_pmp, mask=p_mask, other=0.0) * tl.exp(
            tl.load(ml + p * stride_pmp, mask=p_mask, other=float("-inf")) - m_safe
        )
        o = tl.load(
            part_out_ptr + token * stride_pot + head * stride_poh + p[:, None] * stride_pop + d[None, :] * stride_pod,
            mask=p_mask[:, None] & d_mask[None, :], other=0.0,
        )
        l_lanes += w
        acc += w[:, None] * o
    l = tl.sum(l_lanes, axis=0)
    out = tl.sum(acc, axis=0) / tl.where(l > 0, l, 1.0)  # no visible key (an empty sequence): zeros
    tl.store(out_ptr + token * stride_ot + head * stride_oh + d * stride_od, out.to(out_ptr.dtype.element_ty), mask=d_mask)
    tl.store(lse_ptr + token * stride_lset + head * stride_lseh, m + tl.log(l))


@dataclass
class KernelTrace:
    """What the kernel wrote while it ran (trace mode)."""

    slots: torch.Tensor  # int64 [num_seqs, max_seq_len]: physical slot each key was loaded from, -1 past the end
    partitions: torch.Tensor  # int32 [num_seqs, max_seq_len]: the partition that loaded it, -1 past the end
    mask: torch.Tensor  # int8 [num_query_tokens, max_seq_len]: VISIBLE, CAUSAL_MASKED, WINDOW_MASKED; NO_KEY past the end
    logits: torch.Tensor  # fp32 [num_query_tokens, num_heads, max_seq_len]: score before the mask, NaN past the end
    lse: torch.Tensor  # fp32 [num_query_tokens, num_heads]: log-sum-exp of each row's visible scores


def interpreted() -> bool:
    """Whether this module's kernels run under Triton's interpreter."""
    return not isinstance(_paged_attention_partition, triton.runtime.JITFunction)


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
