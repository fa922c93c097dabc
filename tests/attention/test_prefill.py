"""Prefill and mixed batches against a float64 attention written here, from the math.

Each sequence's keys and values are drawn per token, then written into a pool at
slots this file computes (table[t // block_size] * block_size + t % block_size) over
scrambled tables; every other slot is NaN. The reference reads the per-token tensors
directly: it never sees a block table, a layout or the package's own reference. Its
mask is the documented one: query i of q_len new tokens sits at p = seq_len - q_len + i,
sees keys t <= p, and with a window w only t > p - w.
"""

import math
from unittest import mock

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND, scrambled_tables

from pagetrace import paged_attention
from pagetrace.attention import torch_path
from pagetrace.paging.layouts import KERNEL_LAYOUTS, LAYOUTS
from pagetrace.attention.reference import layout_cache

BACKENDS = [KERNEL_BACKEND, "torch"]
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
         "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
# compared as |got - want| <= tol * (1 + |want|); fp8 caches are dequantized exactly (every
# e4m3/e5m2 value is an fp16 value), so they take the fp16 query's tolerance
TOL = {"fp32": 2e-5, "fp16": 2e-3, "bf16": 2e-2, "fp8_e4m3": 2e-3, "fp8_e5m2": 2e-3}


def reference(q, keys, values, seq_lens, q_lens, scale, window=None, cap=None, slopes=None):
    """float64: (output [T, H, D], scores [T, H, L] NaN-padded, visible [T, L] or None where no key)."""
    num_tokens, num_heads, head_dim = q.shape
    width = max(seq_lens)
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float64)
    scores = torch.full((num_tokens, num_heads, width), math.nan, dtype=torch.float64)
    state = torch.full((num_tokens, width), -1, dtype=torch.int64)  # 0 visible, 1 causal-masked, 2 window-masked
    row = 0
    for s, (n, ql) in enumerate(zip(seq_lens, q_lens)):
        for i in range(ql):
            p = n - ql + i
            for h in range(num_heads):
                kvh = h // (num_heads // keys[s].shape[1])
                sc = keys[s][:, kvh] @ q[row, h].double() * scale
                if cap is not None:
                    sc = cap * torch.tanh(sc / cap)
                if slopes is not None:
                    sc = sc + float(slopes[h]) * (torch.arange(n) - p)
                scores[row, h, :n] = sc
                t = torch.arange(n)
                visible = (t <= p) & ((t > p - window) if window is not None else True)
                w = torch.softmax(sc.masked_fill(~visible, -math.inf), 0)
                out[row, h] = w @ values[s][:, kvh]
            t = torch.arange(n)
            state[row, :n] = torch.where(t > p, 1, torch.where((t <= p - window) if window else t < 0, 2, 0))
            row += 1
    return out, scores, state


def build(seq_lens, q_lens, *, block_size=3, heads=4, kv_heads=2, head_dim=16, layout="nhd", dtype="fp32",
          query_dtype=None, k_scale=1.0, v_scale=1.0, seed=0, index_dtype=torch.int32):
    """Caches laid out as `layout` over scrambled tables, NaN outside the sequences; the
    per-token K/V (as stored, dequantized, float64) for the reference."""
    gen = torch.Generator().manual_seed(seed)
    if LAYOUTS[layout].single_head:
        kv_heads = 1
    tables, num_blocks = scrambled_tables(seq_lens, block_size, seed, spare=2)
    needed = [len(t) for t in tables]
    stored_dtype = TORCH[dtype]
    canon = {w: torch.full((num_blocks * block_size, kv_heads, head_dim), math.nan) for w in ("key", "value")}
    for table, n in zip(tables, seq_lens):
        slots = [table[t // block_size] * block_size + t % block_size for t in range(n)]
        for which, sc in (("key", k_scale), ("value", v_scale)):
            canon[which][slots] = torch.randn(n, kv_heads, head_dim, generator=gen) / sc
    caches, per_token = [], []
    for which, sc in (("key", k_scale), ("value", v_scale)):
        stored = canon[which].to(stored_dtype)
        x = 16 // stored.element_size() if "dim%x" in LAYOUTS[layout].key else 1
        caches.append(layout_cache(stored.view(num_blocks, block_size, kv_heads, head_dim), layout, which, x).to(DEVICE))
        rows = []
        for table, n in zip(tables, seq_lens):
            slots = [table[t // block_size] * block_size + t % block_size for t in range(n)]
            rows.append(stored[slots].double() * sc)
        per_token.append(rows)
    qdtype = TORCH[query_dtype or (dtype if not dtype.startswith("fp8") else "fp16")]
    query = torch.randn(sum(q_lens), heads, head_dim, generator=gen).to(qdtype)
    width = max(max(needed), 1)
    block_tables = torch.tensor([t + [-1] * (width - len(t)) for t in tables], dtype=index_dtype)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=index_dtype)
    return dict(
        query=query.to(DEVICE), key_cache=caches[0], value_cache=caches[1], block_tables=block_tables.to(DEVICE),
        seq_lens=torch.tensor(seq_lens, dtype=index_dtype, device=DEVICE), query_start_loc=qsl.to(DEVICE),
    ), per_token[0], per_token[1], tables


def check(args, keys, values, seq_lens, q_lens, dtype, backend, *, tables=None, block_size=None, partition_size=None, **variant):
    head_dim = args["query"].shape[-1]
    scale = head_dim**-0.5
    kw = {k: v for k, v in variant.items() if k in ("sliding_window", "soft_cap", "alibi_slopes", "k_scale", "v_scale")}
    out, trace = paged_attention(**args, layout=variant.get("layout", "nhd"), trace=True, backend=backend,
                                 partition_size=partition_size, block_n=16 if partition_size else None, **kw)
    want, scores, state = reference(args["query"].cpu(), keys, values, seq_lens, q_lens, scale, kw.get("sliding_window"),
                                    kw.get("soft_cap"), kw.get("alibi_slopes"))
    tol = TOL[dtype]
    assert out.shape == args["query"].shape and out.dtype == args["query"].dtype
    assert_close_to(out, want, tol)
    if backend == "torch":  # untraced, the torch path reads blocks in chunks: one block a chunk, the default, and SDPA past the score limit
        for chunk_bytes, scores_bytes in ((1, torch_path.SCORES_BYTES), (torch_path.CHUNK_BYTES, torch_path.SCORES_BYTES), (torch_path.CHUNK_BYTES, 0)):
            with mock.patch.object(torch_path, "CHUNK_BYTES", chunk_bytes), mock.patch.object(torch_path, "SCORES_BYTES", scores_bytes):
                plain = paged_attention(**args, layout=variant.get("layout", "nhd"), backend=backend, **kw)
            assert_close_to(plain, want, tol, f"untraced, {chunk_bytes}-byte chunks, {scores_bytes}-byte score limit")
    assert torch.equal(trace.mask.long().cpu(), state), "mask states differ"
    have = ~torch.isnan(scores)
    assert torch.equal(have, ~torch.isnan(trace.logits.cpu())), "scores recorded for other keys than the sequence's"
    torch.testing.assert_close(trace.logits.cpu().double()[have], scores[have], atol=tol * 10, rtol=tol * 10)
    w = trace.weights.cpu().double()
    visible = (state == 0)[:, None, :].expand_as(w)
    assert (w[~visible & have] == 0).all(), "masked keys carry weight"
    rows = w.nan_to_num(0).sum(-1)
    nonempty = torch.tensor([n > 0 for n, ql in zip(seq_lens, q_lens) for _ in range(ql)])
    torch.testing.assert_close(rows[nonempty], torch.ones_like(rows[nonempty]), atol=1e-3, rtol=0)
    if tables is not None:
        for s, (n, ql) in enumerate(zip(seq_lens, q_lens)):  # a sequence without new tokens is not read
            want_slots = [tables[s][t // block_size] * block_size + t % block_size for t in range(n)] if ql else [-1] * n
            assert trace.slots[s, :n].tolist() == want_slots
        if partition_size and backend != "torch":
            for s, (n, ql) in enumerate(zip(seq_lens, q_lens)):
                assert trace.partitions[s, :n].tolist() == [t // partition_size if ql else -1 for t in range(n)]
    return out, trace


def assert_close_to(out, want, tol, what=""):
    got = out.double().cpu()
    bad = ~((got - want).abs() <= tol * (1 + want.abs()))  # a NaN is off too
    assert not bad.any(), f"{what}: {int(bad.sum())} outputs off, max diff {float((got - want).abs().max())}"


# a mixed batch: decode, a whole prompt, a chunk longer than a block after some context, an idle sequence
MIXED = ([9, 5, 37, 12], [1, 5, 20, 0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", list(KERNEL_LAYOUTS))
def test_mixed_batch_every_layout(layout, backend):
    k = list(KERNEL_LAYOUTS).index(layout)
    block_size = [1, 3, 16][k % 3]
    heads, kv_heads = [(4, 2), (4, 1), (2, 2)][k % 3]  # GQA, MQA, MHA
    seq_lens, q_lens = MIXED
    args, keys, values, tables = build(seq_lens, q_lens, block_size=block_size, heads=heads, kv_heads=kv_heads, layout=layout, seed=k)
    check(args, keys, values, seq_lens, q_lens, "fp32", backend, tables=tables, block_size=block_size, layout=layout)


@pytest.mark.parametrize("layout", ["hnd", "vllm"])
@pytest.mark.parametrize("dtype", ["fp32", "fp16", "fp8_e4m3"])
def test_torch_decode_reads_block_major_layouts_in_place(layout, dtype):
    """A decode over hnd or vLLM's layout: the torch path multiplies each (block, KV head) as
    stored (fp32) or after one copy (fp16, fp8), a window and last blocks cut mid-block."""
    seq_lens, q_lens, block_size = [1, 16, 17, 40, 3], [1, 1, 2, 1, 1], 16
    scales = dict(k_scale=0.5, v_scale=2.0) if dtype.startswith("fp8") else {}
    args, keys, values, tables = build(seq_lens, q_lens, block_size=block_size, heads=8, kv_heads=2, layout=layout,
                                       dtype=dtype, seed=7, **scales)
    for window in (None, 20):
        variant = dict(layout=layout, **scales) | ({} if window is None else dict(sliding_window=window))
        check(args, keys, values, seq_lens, q_lens, dtype, "torch", tables=tables, block_size=block_size, **variant)


VARIANTS = {
    "window": dict(sliding_window=7),
    "soft_cap": dict(soft_cap=0.5),
    "alibi": dict(alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625])),
    "fp8_e4m3": dict(dtype="fp8_e4m3", k_scale=0.5, v_scale=2.0),
    "fp8_e5m2": dict(dtype="fp8_e5m2", k_scale=0.25, v_scale=1.0),
    "all": dict(sliding_window=4, soft_cap=2.0, alibi_slopes=torch.tensor([0.3, 0.2, 0.1, 0.05]), dtype="fp8_e4m3", k_scale=0.5, v_scale=0.5),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_alone_and_combined(variant, backend):
    v = dict(VARIANTS[variant])
    dtype = v.pop("dtype", "fp32")
    seq_lens, q_lens = MIXED
    args, keys, values, _ = build(seq_lens, q_lens, dtype=dtype, k_scale=v.get("k_scale", 1.0), v_scale=v.get("v_scale", 1.0))
    check(args, keys, values, seq_lens, q_lens, dtype, backend, **v)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_half_precision_prefill(dtype):
    seq_lens, q_lens = [40, 3], [24, 3]
    args, keys, values, _ = build(seq_lens, q_lens, block_size=16, heads=8, kv_heads=2, head_dim=32, layout="vllm", dtype=dtype)
    check(args, keys, values, seq_lens, q_lens, dtype, KERNEL_BACKEND, layout="vllm", sliding_window=16)


def test_split_k_partitions_with_prefill_rows():
    """Keys cut into 16-token partitions: the reduce merges them per query row."""
    seq_lens, q_lens = [70, 18], [33, 1]
    args, keys, values, tables = build(seq_lens, q_lens, block_size=3)
    check(args, keys, values, seq_lens, q_lens, "fp32", KERNEL_BACKEND, tables=tables, block_size=3, partition_size=16, sliding_window=40)


@pytest.mark.parametrize("backend", BACKENDS)
def test_flash_attention_two_by_five_example(backend):
    """FlashAttention's documented bottom-right mask: 2 queries over 5 keys give 11110, 11111."""
    args, keys, values, _ = build([5], [2], heads=1, kv_heads=1)
    _, trace = check(args, keys, values, [5], [2], "fp32", backend)
    visible = (trace.mask == 0).int().tolist()
    assert visible == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_length_sequences_give_zeros(backend):
    # decode: a padded CUDA-graph slot with length 0
    args, keys, values, _ = build([7, 0, 4], [1, 1, 1])
    args.pop("query_start_loc")
    out = paged_attention(**args, backend=backend)
    assert (out[1] == 0).all() and not torch.isnan(out).any()
    want, _, _ = reference(args["query"].cpu(), keys, values, [7, 0, 4], [1, 1, 1], 16**-0.5)
    torch.testing.assert_close(out.double().cpu(), want, atol=1e-5, rtol=1e-5)
    # varlen: an empty sequence and one with context but no new tokens, between others
    seq_lens, q_lens = [6, 0, 9, 3], [2, 0, 0, 3]
    args, keys, values, _ = build(seq_lens, q_lens, seed=3)
    check(args, keys, values, seq_lens, q_lens, "fp32", backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_int64_indices_and_out_buffer(backend):
    seq_lens, q_lens = [11, 4], [3, 1]
    args, keys, values, _ = build(seq_lens, q_lens, index_dtype=torch.int64)
    out32, _ = check(args, keys, values, seq_lens, q_lens, "fp32", backend)
    buffer = torch.full((4, 4, 32), math.nan, device=DEVICE)[:, :, ::2]  # strided, like a slice of a bigger tensor
    got = paged_attention(**args, out=buffer, backend=backend)
    assert got is buffer
    torch.testing.assert_close(buffer, out32, atol=1e-6, rtol=1e-6)  # torch: fused SDPA without a trace


def test_bf16_output_rounds_to_nearest_even():
    """Interpreted bf16 used to truncate: outputs must match the float64 result rounded by torch."""
    seq_lens, q_lens = [48], [16]
    args, keys, values, _ = build(seq_lens, q_lens, heads=4, kv_heads=4, head_dim=32, dtype="bf16")
    out = paged_attention(**args, backend=KERNEL_BACKEND)
    want, _, _ = reference(args["query"].cpu(), keys, values, seq_lens, q_lens, 32**-0.5)
    rne = want.to(torch.bfloat16)
    toward_zero = ((want.to(torch.bfloat16).double() - want).abs() > 0) & (rne.double().abs() > want.abs())
    same = (out.cpu() == rne).double().mean()
    assert same > 0.8, f"only {float(same):.0%} of bf16 outputs are the rounded float64 result"
    # where round-to-nearest goes away from zero, truncation would not: those must agree too
    assert (out.cpu()[toward_zero] == rne[toward_zero]).double().mean() > 0.7


def test_torch_backend_reads_only_the_used_blocks():
    """A pool of 2**24 blocks (4 TB if it were real; one block repeated via a 0 stride):
    copying the whole pool, once or per sequence, would not fit in memory."""
    for layout in ("hnd", "vllm"):
        args, keys, values, _ = build([5, 3], [5, 1], block_size=4, heads=2, kv_heads=2, layout=layout)
        for name in ("key_cache", "value_cache"):
            c = args[name]
            one = torch.randn_like(c[:1])
            args[name] = one.as_strided((2**24, *c.shape[1:]), (0, *one.stride()[1:]))
        table = torch.tensor([[2**24 - 1, 5], [77, -1]], dtype=torch.int32)
        args["block_tables"] = table
        out = paged_attention(**args, layout=layout, backend="torch")
        assert out.shape == args["query"].shape and not torch.isnan(out).any()


def test_bad_varlen_inputs_name_the_argument():
    from pagetrace.errors import UsageError

    args, _, _, _ = build([5, 4], [2, 1])
    for bad, match in (
        (torch.tensor([0, 2, 2], dtype=torch.int32), "rise from 0"),
        (torch.tensor([0, 3], dtype=torch.int32), r"num_seqs \+ 1"),
        (torch.tensor([1, 2, 3], dtype=torch.int32), "rise from 0"),
    ):
        with pytest.raises(UsageError, match=match):
            paged_attention(**{**args, "query_start_loc": bad}, backend="torch")
    with pytest.raises(UsageError, match="seq_lens counts the new tokens"):
        paged_attention(**{**args, "seq_lens": torch.tensor([1, 4], dtype=torch.int32)}, backend="torch")
    with pytest.raises(UsageError, match="seq_lens.*int32 or int64"):
        paged_attention(**{**args, "seq_lens": args["seq_lens"].float()}, backend="torch")
    with pytest.raises(UsageError, match="sliding_window"):
        paged_attention(**args, sliding_window=0, backend="torch")
    with pytest.raises(UsageError, match="soft_cap"):
        paged_attention(**args, soft_cap=-1.0, backend="torch")
    with pytest.raises(UsageError, match="alibi_slopes"):
        paged_attention(**args, alibi_slopes=torch.ones(3), backend="torch")
    with pytest.raises(UsageError, match="fp8 caches only"):
        paged_attention(**args, k_scale=2.0, backend="torch")
    with pytest.raises(UsageError, match="out"):
        paged_attention(**args, out=torch.empty(2, 4, 16), backend="torch")


def test_torch_backend_takes_a_query_that_requires_grad():
    """Like the kernel, the torch path computes no gradient, and does not fail on such a query."""
    seq_lens, q_lens = [20, 7], [1, 3]
    args, keys, values, _ = build(seq_lens, q_lens, block_size=3, layout="hnd")
    args["query"].requires_grad_(True)
    out = paged_attention(**args, layout="hnd", backend="torch")
    want, _, _ = reference(args["query"].detach().cpu(), keys, values, seq_lens, q_lens, 16**-0.5)
    assert not out.requires_grad
    assert_close_to(out.detach(), want, TOL["fp32"])


@pytest.mark.parametrize("seq_len", [1, 7, 64, 300])
def test_extreme_equal_logits_give_exactly_one_traced_or_not(seq_len):
    """FlashInfer's extreme-logits case: every score -46,341 (q·k scaled to it), V = 1.
    The output is exactly 1.0 at zero tolerance, with trace=True as without: tracing
    must never change the result. (An output normalised before the value product,
    sum of fl(1/n) * 1, is 1.0006 at n = 7 and 0.99873 at 64.)"""
    block_size, head_dim = 16, 128
    num_blocks = -(-seq_len // block_size)
    scale = 1.0  # -46341 / 128 is exact in fp32, and so is the sum of 128 of them
    query = torch.ones(1, 1, head_dim, device=DEVICE)
    key_cache = torch.full((num_blocks, block_size, 1, head_dim), -46341.0 / head_dim, device=DEVICE)
    value_cache = torch.ones(num_blocks, block_size, 1, head_dim, device=DEVICE)
    table = torch.arange(num_blocks, dtype=torch.int32, device=DEVICE)[None]
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=DEVICE)
    assert float(query[0, 0] @ key_cache[0, 0, 0]) == -46341.0
    backends = ["torch"] + ([KERNEL_BACKEND] if seq_len <= 64 else [])
    for backend in backends:
        args = (query, key_cache, value_cache, table, seq_lens)
        plain = paged_attention(*args, scale=scale, backend=backend)
        traced, _ = paged_attention(*args, scale=scale, backend=backend, trace=True)
        assert torch.equal(plain.cpu(), torch.ones(1, 1, head_dim)), (backend, plain.unique())
        assert torch.equal(traced.cpu(), torch.ones(1, 1, head_dim)), (backend, traced.unique())


@pytest.mark.parametrize("layout", ["nhd", "hnd"])
def test_trace_never_changes_the_torch_backend_output(layout):
    """Random inputs, a mixed batch with a window: trace=True returns bit for bit what trace=False does."""
    seq_lens, q_lens = [20, 7, 33], [1, 3, 5]
    args, _, _, _ = build(seq_lens, q_lens, block_size=4, layout=layout)
    plain = paged_attention(**args, layout=layout, sliding_window=9, backend="torch")
    traced, _ = paged_attention(**args, layout=layout, sliding_window=9, backend="torch", trace=True)
    assert torch.equal(plain, traced)


def test_torch_backend_in_and_out_of_inference_mode():
    """vLLM and its tests call attention under torch.inference_mode(); a call there and then
    one outside it (and back, in any order) must work and agree with the reference."""
    seq_lens, q_lens = [20, 7], [1, 3]
    args, keys, values, _ = build(seq_lens, q_lens, block_size=3, layout="hnd")
    want, _, _ = reference(args["query"].cpu(), keys, values, seq_lens, q_lens, 16**-0.5)
    for mode in ("inference", "plain", "no_grad", "inference", "inference", "plain", "plain"):
        context = {"inference": torch.inference_mode, "no_grad": torch.no_grad}.get(mode, torch.enable_grad)
        with context():
            out = paged_attention(**args, layout="hnd", backend="torch")
        assert_close_to(out, want, TOL["fp32"])
    # a caller's out= buffer made outside inference mode, the call inside it
    out = torch.empty_like(args["query"])
    with torch.inference_mode():
        paged_attention(**args, layout="hnd", backend="torch", out=out)
    assert_close_to(out, want, TOL["fp32"])


def test_torch_backend_scratch_stays_bounded_across_shapes():
    """However many shapes a thread runs, the buffers it keeps hold at most
    `torch_path.KEPT_BYTES` (the documented bound), in and out of inference mode."""
    torch_path._kept.__dict__.clear()
    for i, (n, heads, head_dim) in enumerate([(40, 4, 16), (400, 8, 64), (3000, 8, 128), (64, 2, 32), (9000, 16, 128)]):
        args, _, _, _ = build([n], [1], block_size=16, heads=heads, kv_heads=heads // 2, head_dim=head_dim, layout="hnd")
        with torch.inference_mode() if i % 2 else torch.no_grad():
            paged_attention(**args, layout="hnd", backend="torch")
        kept = torch_path._kept.__dict__.get("buffers", {})
        total = sum(b.numel() * b.element_size() for b in kept.values())
        assert total <= torch_path.KEPT_BYTES, total
        assert not any(b.is_inference() for b in kept.values())
