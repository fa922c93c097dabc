"""The Triton kernel (interpreted here, compiled on a GPU) against plain torch attention.

Tables are scrambled over a pool three times larger than needed and every slot no
sequence uses is NaN, so any read outside a sequence's own blocks poisons the output.
"""

import itertools

import pytest
import torch
from conftest import DEVICE, KERNEL_BACKEND, scrambled_tables

from pagetrace import paged_attention
from pagetrace.paging.blocks import slot_mapping
from pagetrace.paging.plan import plan_tables
from pagetrace.attention.reference import reference_attention
from pagetrace.attention.report import TOLERANCES
from pagetrace.attention.workload import make_workload

BLOCK_SIZES = [1, 3, 16, 24, 32]
HEAD_DIMS = [8, 64, 80, 128]
HEADS = [(1, 1), (4, 4), (8, 2), (32, 8), (6, 1)]
LAYOUTS = ["blocks", "nhd", "hnd", "vllm"]
DTYPES = ["fp32", "fp16", "bf16"]


def cases():
    """A covering grid: every layout x dtype pair, cycling the other axes so each value
    of each appears several times (the full product would take hours interpreted)."""
    out = []
    for i, (layout, dtype) in enumerate(itertools.product(LAYOUTS, DTYPES)):
        for j in range(3):
            k = 3 * i + j
            heads = HEADS[k % len(HEADS)]
            if layout == "blocks":
                heads = (1, 1) if k % 2 else (6, 1)
            out.append((layout, dtype, BLOCK_SIZES[k % len(BLOCK_SIZES)], HEAD_DIMS[(k // 2 + j) % len(HEAD_DIMS)], heads))
    return out


def scrambled_plan(seq_lens, block_size, seed):
    tables, pool = scrambled_tables(seq_lens, block_size, seed)
    return plan_tables(seq_lens, tables, block_size, pool)


def run_case(layout, dtype, block_size, head_dim, heads, kv_heads, seq_lens, partition_size, block_n=16, seed=0):
    plan = scrambled_plan(seq_lens, block_size, seed)
    work = make_workload(plan, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, layout=layout, seed=seed, device=DEVICE)
    scale = head_dim**-0.5
    out, trace = paged_attention(
        work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens,
        layout=layout, trace=True, backend=KERNEL_BACKEND, partition_size=partition_size, block_n=block_n,
    )
    ref = reference_attention(
        work.query, work.key_cache, work.value_cache, plan.tables, seq_lens,
        layout=layout, block_size=block_size, scale=scale, compute_dtype=torch.float64,
    )
    tol = TOLERANCES[dtype]
    assert out.dtype == work.query.dtype and out.shape == work.query.shape
    torch.testing.assert_close(out.double().cpu(), ref.output.cpu(), atol=tol, rtol=tol)
    torch.testing.assert_close(trace.lse.double().cpu(), ref.lse.cpu(), atol=tol, rtol=tol)
    for s, n in enumerate(seq_lens):
        assert trace.slots[s, :n].tolist() == slot_mapping(n, plan.tables[s], block_size)
        assert (trace.slots[s, n:] == -1).all()
        assert trace.partitions[s, :n].tolist() == [t // partition_size for t in range(n)]
        torch.testing.assert_close(trace.logits[s, :, :n].double().cpu(), ref.logits[s, :, :n].cpu(), atol=tol * 10, rtol=tol)
        assert torch.isnan(trace.logits[s, :, n:]).all()
        torch.testing.assert_close(trace.weights[s, :, :n].sum(-1).double().cpu(), torch.ones(heads, dtype=torch.float64), atol=1e-4, rtol=0)
    return out, trace


@pytest.mark.parametrize("layout, dtype, block_size, head_dim, heads", cases())
def test_kernel_matches_contiguous_attention(layout, dtype, block_size, head_dim, heads):
    # lengths: one token, exactly one block, not a multiple of the block size, several partitions
    seq_lens = [1, block_size, 2 * block_size + 1, 70]
    run_case(layout, dtype, block_size, head_dim, heads[0], heads[1], seq_lens, partition_size=32)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_worked_example_numbers(layout):
    plan = plan_tables([38], None, 16)
    work = make_workload(plan, layout=layout, device=DEVICE)
    out, trace = paged_attention(
        work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens, layout=layout, trace=True, backend=KERNEL_BACKEND
    )
    weights = trace.weights[0, 0, :38]
    assert round(float(weights.max()), 4) == 0.1318 and int(weights.argmax()) == 9
    assert round(float(out.float().norm()), 4) == 0.7807


def test_many_partitions_merge():
    """A sequence cut into 9 partitions of 16 tokens each, beside a short one."""
    run_case("nhd", "fp32", 16, 64, 8, 2, [140, 5], partition_size=16)


def test_nan_outside_the_sequence_would_show():
    """Sanity check of the harness: a table pointing at a free (NaN) block poisons the output."""
    plan = plan_tables([20], [[0, 1, 2, 3, 4]], 4, num_blocks=8)
    work = make_workload(plan, layout="nhd", device=DEVICE)
    work.block_tables[0, 1] = 6  # block 6 is unused, hence NaN
    out = paged_attention(work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens, layout="nhd", backend=KERNEL_BACKEND)
    assert torch.isnan(out).all()


def test_noncontiguous_cache_views_are_read_through_their_strides():
    plan = scrambled_plan([50, 9], 8, seed=1)
    work = make_workload(plan, num_heads=4, num_kv_heads=2, head_dim=32, layout="nhd", device=DEVICE)
    # a view with a padded head_dim: strides are not those of a contiguous tensor
    wide_k = torch.full((*work.key_cache.shape[:3], 48), float("nan"), device=DEVICE)
    wide_v = wide_k.clone()
    wide_k[..., :32] = work.key_cache
    wide_v[..., :32] = work.value_cache
    args = (work.query, wide_k[..., :32], wide_v[..., :32], work.block_tables, work.seq_lens)
    out = paged_attention(*args, layout="nhd", backend=KERNEL_BACKEND)
    ref = paged_attention(*args, layout="nhd", backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_torch_backend_and_trace():
    plan = scrambled_plan([33, 7], 4, seed=2)
    work = make_workload(plan, num_heads=4, num_kv_heads=1, head_dim=16, layout="hnd")
    out, trace = paged_attention(work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens, layout="hnd", trace=True, backend="torch")
    assert trace.backend == "torch"
    assert trace.slots[0, :33].tolist() == slot_mapping(33, plan.tables[0], 4)
    ref = reference_attention(work.query, work.key_cache, work.value_cache, plan.tables, [33, 7], layout="hnd", block_size=4, scale=0.25, compute_dtype=torch.float64)
    torch.testing.assert_close(out.double(), ref.output, atol=1e-5, rtol=1e-5)


def test_auto_backend_picks_by_work(monkeypatch):
    from pagetrace.attention import api as attention
    from pagetrace.attention.api import resolve_backend

    cpu = torch.device("cpu")
    for warm in (False, True):  # the first interpreted call in a process costs about 0.6 s more
        monkeypatch.setattr(attention, "_interpreter_warm", warm)
        assert resolve_backend("auto", cpu, [38], 1, 1) == "interpret"
        assert resolve_backend("auto", cpu, [8000], 1, 1) == "interpret"
        assert resolve_backend("auto", cpu, [38], 1, 1, [38]) == "interpret"  # a prefill of the worked example
        assert resolve_backend("auto", cpu, [2048], 8, 2, [2048]) == "torch"
        assert resolve_backend("auto", cpu, [8192], 32, 8) == "torch"
        assert resolve_backend("auto", cpu, [131072], 32, 8) == "torch"
    monkeypatch.setattr(attention, "_interpreter_warm", False)
    assert resolve_backend("auto", cpu, [4096], 32, 8) == "torch"
    assert resolve_backend("auto", cpu, [20000], 1, 1) == "torch"


def _inputs(seq_lens=(20, 7), block_size=4, heads=4, kv_heads=2, head_dim=16):
    plan = scrambled_plan(list(seq_lens), block_size, seed=4)
    return make_workload(plan, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim, layout="nhd", device=DEVICE)


@pytest.mark.parametrize("backend", [KERNEL_BACKEND, "torch"])
def test_api_refuses_tables_that_would_read_out_of_bounds(backend):
    from pagetrace.errors import UsageError

    w = _inputs()
    num_blocks = w.key_cache.shape[0]
    args = lambda bt: (w.query, w.key_cache, w.value_cache, bt, w.seq_lens)  # noqa: E731
    outside = w.block_tables.clone()
    outside[0, 2] = num_blocks
    with pytest.raises(UsageError, match="outside the pool"):
        paged_attention(*args(outside), backend=backend)
    negative = w.block_tables.clone()
    negative[1, 0] = -1
    with pytest.raises(UsageError, match="outside the pool"):
        paged_attention(*args(negative), backend=backend)
    with pytest.raises(UsageError, match="needs 5 blocks"):
        paged_attention(*args(w.block_tables[:, :2].contiguous()), backend=backend)
    with pytest.raises(UsageError, match="head_dim"):
        paged_attention(w.query[..., :8], w.key_cache, w.value_cache, w.block_tables, w.seq_lens, backend=backend)


def test_gpu_tile_sizes_fit_shared_memory():
    from pagetrace.attention.api import GPU_TILE_BYTES, gpu_block_n

    assert gpu_block_n(128, 2) == 64
    for head_dim in (8, 64, 80, 128, 256, 512):
        for size in (2, 4):
            n = gpu_block_n(head_dim, size)
            assert n >= 16 and n & (n - 1) == 0
            assert n == 16 or n * max(16, 1 << (head_dim - 1).bit_length()) * size <= GPU_TILE_BYTES


def test_gpu_prefill_tiles_by_dtype_and_head_dim():
    """vLLM's prefill tiles (16 rows, 32 keys) for 16-bit queries; fp32 halves the keys and
    narrows the rows from head_dim 256 on, where 16 rows spilled (bench/README.md)."""
    from pagetrace.attention.api import gpu_block_n, gpu_prefill_tiles

    assert gpu_prefill_tiles(128, 2) == (16, 32)
    assert gpu_prefill_tiles(512, 2) == (16, 16)
    assert gpu_prefill_tiles(128, 4) == (16, 16)
    assert gpu_prefill_tiles(256, 4) == (8, 16)
    assert gpu_prefill_tiles(512, 4) == (8, 16)
    for head_dim in (8, 64, 80, 128, 256, 512):
        for size in (2, 4):
            rows, n = gpu_prefill_tiles(head_dim, size)
            assert rows & (rows - 1) == 0 and n >= 16 and n & (n - 1) == 0 and n <= gpu_block_n(head_dim, size)


def test_interpreter_after_triton_import_is_a_clear_failure():
    import os
    import subprocess
    import sys

    probe = (
        "import triton, torch, pagetrace\n"
        "from pagetrace.errors import RuntimeFailure\n"
        "q = torch.zeros(1, 1, 16); c = torch.zeros(1, 16, 1, 16); bt = torch.zeros(1, 1, dtype=torch.int32)\n"
        "try:\n"
        "    pagetrace.paged_attention(q, c, c, bt, torch.ones(1, dtype=torch.int32), backend='interpret')\n"
        "except RuntimeFailure as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120).stdout
    assert "refused:" in out and "TRITON_INTERPRET=1" in out


def test_api_reads_seq_lens_through_their_strides():
    w = _inputs()
    strided = torch.stack([w.seq_lens, torch.full_like(w.seq_lens, 10**6)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    out = paged_attention(w.query, w.key_cache, w.value_cache, w.block_tables, strided, backend=KERNEL_BACKEND)
    ref = paged_attention(w.query, w.key_cache, w.value_cache, w.block_tables, w.seq_lens, backend="torch")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_api_refuses_mismatched_dtypes_devices_and_tiles():
    from pagetrace.errors import UsageError

    w = _inputs()
    args = (w.query, w.key_cache, w.value_cache, w.block_tables, w.seq_lens)
    with pytest.raises(UsageError, match="dtype"):
        paged_attention(w.query.half(), *args[1:], backend=KERNEL_BACKEND)
    with pytest.raises(UsageError, match="float32, float16 or bfloat16"):
        paged_attention(w.query.double(), w.key_cache.double(), w.value_cache.double(), *args[3:], backend=KERNEL_BACKEND)
    with pytest.raises(UsageError, match="block_n"):
        paged_attention(*args, backend=KERNEL_BACKEND, block_n=8)
    with pytest.raises(UsageError, match="partition_size"):
        paged_attention(*args, backend=KERNEL_BACKEND, partition_size=100, block_n=16)
    with pytest.raises(UsageError, match="at least one sequence"):
        paged_attention(w.query[:0], *args[1:3], w.block_tables[:0], w.seq_lens[:0], backend=KERNEL_BACKEND)


@pytest.mark.parametrize("layout", ["hnd", "vllm", "nhd"])
def test_kernel_on_caches_built_by_an_explicit_permute(layout):
    """The caches are laid out here by hand, from the engines' documented shapes, not
    through `pagetrace.paging.layouts`, and the expected output is attention over each
    sequence's tokens gathered by plain indexing: a wrong axis order in LAYOUTS fails."""
    gen = torch.Generator().manual_seed(3)
    nb, bs, kvh, hd, heads = 9, 4, 2, 16, 4
    tables, lens = [[5, 0, 7], [2, 8]], [11, 6]
    k = torch.randn(nb, bs, kvh, hd, generator=gen)
    v = torch.randn(nb, bs, kvh, hd, generator=gen)
    used = torch.zeros(nb, bs, dtype=torch.bool)
    for table, n in zip(tables, lens):
        for t in range(n):
            used[table[t // bs], t % bs] = True
    k[~used], v[~used] = float("nan"), float("nan")
    q = torch.randn(len(lens), heads, hd, generator=gen)
    if layout == "nhd":  # [num_blocks, block_size, num_kv_heads, head_dim]
        key_cache, value_cache = k.contiguous(), v.contiguous()
    elif layout == "hnd":  # [num_blocks, num_kv_heads, block_size, head_dim]
        key_cache, value_cache = k.permute(0, 2, 1, 3).contiguous(), v.permute(0, 2, 1, 3).contiguous()
    else:  # vllm fp32, x = 4: key [nb, kvh, hd/x, bs, x], value [nb, kvh, hd, bs]
        key_cache = k.reshape(nb, bs, kvh, hd // 4, 4).permute(0, 2, 3, 1, 4).contiguous()
        value_cache = v.permute(0, 2, 3, 1).contiguous()
    block_tables = torch.tensor([t + [-1] * (3 - len(t)) for t in tables], dtype=torch.int32)
    out = paged_attention(
        q.to(DEVICE), key_cache.to(DEVICE), value_cache.to(DEVICE), block_tables.to(DEVICE), torch.tensor(lens, dtype=torch.int32, device=DEVICE),
        layout=layout, backend=KERNEL_BACKEND, block_n=16,
    )
    for s, (table, n) in enumerate(zip(tables, lens)):
        keys = torch.stack([k[table[t // bs], t % bs] for t in range(n)]).double()  # [n, kvh, hd]
        values = torch.stack([v[table[t // bs], t % bs] for t in range(n)]).double()
        for h in range(heads):
            g = h // (heads // kvh)
            w = torch.softmax(keys[:, g] @ q[s, h].double() * hd**-0.5, dim=0)
            torch.testing.assert_close(out[s, h].double().cpu(), w @ values[:, g], atol=1e-5, rtol=1e-5)


def test_gpu_partitions_fill_the_sms_of_small_batches():
    from pagetrace.attention.api import GPU_PARTITION, gpu_partition_size

    # batch 1 x 8 KV heads x 1k tokens on 132 SMs: 16 partitions of 64 (128 programs), not 2 of 512
    assert gpu_partition_size(1024, 1, 8, 64, 132) == 64
    assert gpu_partition_size(131072, 64, 8, 64, 132) == GPU_PARTITION  # a big batch fills the GPU already
    assert gpu_partition_size(38, 1, 1, 64, 108) == 64  # never under one tile
    for n in (1, 17, 1000, 4096, 100000):
        for seqs, heads in ((1, 1), (1, 8), (16, 8), (64, 32)):
            size = gpu_partition_size(n, seqs, heads, 32, 132)
            assert size % 32 == 0 and size & (size - 1) == 0 and 32 <= size <= GPU_PARTITION
