"""The Triton paged-attention kernel for mixed batches and its split-K reduce: their contract.

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
Triton runs compiled or under its interpreter (TRITON_INTERPRET is read at import). The
launches (grids, strides, work buffers, constexprs) are built in `launch.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

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
