"""GPU benchmark of the untraced paged-attention kernel (needs CUDA).

    python bench/bench_gpu.py            # fp16 and bf16, batch 1/16/64, contexts 1k..128k
    python bench/bench_gpu.py --quick    # a few points, for scripts/gpu_check.sh

Decode: 32 query heads over 8 KV heads, head_dim 128, block size 16, nhd layout, block
tables scrambled over the pool. For each point, in one run: the kernel's latency
(triton.testing.do_bench, median), the K and V bytes it must read over that time as a
share of the GPU's peak HBM bandwidth, and torch's scaled_dot_product_attention on the
same K and V laid out contiguously ([batch, kv_heads, context, head_dim], enable_gqa).
Also the cost of trace mode against the untraced kernel, and prefill: whole prompts of
1k-8k tokens (q_len = seq_len) through the same kernel (`plan_kernel`'s prefill tiles),
in TFLOP/s against SDPA with is_causal on the same K and V laid out contiguously.
"""

from __future__ import annotations

import argparse
import sys
import time

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12}


def peak_bandwidth(name: str) -> float | None:
    for key, value in PEAK_BYTES_PER_S.items():
        if key in name:
            return value
    return None


def make_point(batch: int, context: int, dtype, device):
    import torch

    blocks_per_seq = context // BLOCK_SIZE
    num_blocks = batch * blocks_per_seq
    # contiguous K/V as SDPA wants them, then the same vectors scattered into a paged pool
    k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, dtype=dtype, device=device)
    v = torch.randn_like(k)
    table = torch.randperm(num_blocks, device=device, dtype=torch.int64).view(batch, blocks_per_seq)
    key_cache = torch.empty(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=dtype, device=device)
    value_cache = torch.empty_like(key_cache)
    key_cache[table.reshape(-1)] = k.permute(0, 2, 1, 3).reshape(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    value_cache[table.reshape(-1)] = v.permute(0, 2, 1, 3).reshape(num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=dtype, device=device)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    return q, k, v, key_cache, value_cache, table.to(torch.int32), seq_lens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_gpu.py needs a CUDA GPU; the GPU table in bench/README.md stays 'not yet measured'")
    import torch.nn.functional as F
    from triton.testing import do_bench

    from pagetrace.attention.api import load_kernel, plan_kernel

    kernel = load_kernel(interpret=False)
    device = torch.device("cuda")
    name = torch.cuda.get_device_name(device)
    peak = peak_bandwidth(name)
    dtypes = [torch.float16] if args.quick else [torch.float16, torch.bfloat16]
    batches = [1, 16] if args.quick else [1, 16, 64]
    contexts = [1024, 16384] if args.quick else [1024, 4096, 16384, 32768, 131072]
    print(f"# {time.strftime('%Y-%m-%d')} · {name} · torch {torch.__version__} · heads {HEADS}/{KV_HEADS}, head_dim {HEAD_DIM}, block {BLOCK_SIZE}")
    print("| dtype | batch | context | partitions x tokens | paged (us) | GB/s | % of peak | SDPA contiguous (us) | paged / SDPA | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    scale = HEAD_DIM**-0.5
    for dtype in dtypes:
        for batch in batches:
            for context in contexts:
                q, k, v, kc, vc, bt, lens = make_point(batch, context, dtype, device)

                def plan(trace=False):  # the launches paged_attention makes, without its input checks
                    return plan_kernel(kernel, q, kc, vc, bt, lens, layout="nhd", scale=scale, trace=trace, on_gpu=True,
                                       max_seq_len=context, num_kv_heads=KV_HEADS)

                def paged():
                    return plan().run()

                def sdpa():
                    return F.scaled_dot_product_attention(q[:, :, None, :], k, v, scale=scale, enable_gqa=True)

                tiles = plan()
                parts = f"{tiles.launches[0].grid[0]} x {tiles.partition_size}"
                out = paged()[0]
                ref = sdpa()[:, :, 0, :]
                diff = float((out.float() - ref.float()).abs().max())
                t_paged = do_bench(paged, return_mode="median") * 1e-3
                t_sdpa = do_bench(sdpa, return_mode="median") * 1e-3
                bytes_read = 2 * k.numel() * k.element_size()
                bw = bytes_read / t_paged
                pct = f"{100 * bw / peak:.0f}%" if peak else "n/a"
                print(f"| {str(dtype).removeprefix('torch.')} | {batch} | {context} | {parts} | {t_paged * 1e6:.1f} | {bw / 1e9:.0f} | {pct} | "
                      f"{t_sdpa * 1e6:.1f} | {t_paged / t_sdpa:.2f}x | {diff:.2e} |", flush=True)
                del q, k, v, kc, vc, bt, lens, out, ref
                torch.cuda.empty_cache()
    # trace mode: the same kernel writing slots, partitions and logits per token
    q, k, v, kc, vc, bt, lens = make_point(16, 16384, torch.float16, device)
    def run(trace):
        return plan_kernel(kernel, q, kc, vc, bt, lens, layout="nhd", scale=scale, trace=trace, on_gpu=True,
                           max_seq_len=16384, num_kv_heads=KV_HEADS).run()

    untraced = do_bench(lambda: run(False), return_mode="median")
    traced = do_bench(lambda: run(True), return_mode="median")
    print(f"\ntrace mode, fp16, batch 16, context 16384: untraced {untraced * 1e3:.1f} us, traced {traced * 1e3:.1f} us ({traced / untraced:.2f}x)")
    prefill_table(args.quick)


def prefill_table(quick: bool) -> None:
    """Whole prompts through the paged kernel against causal SDPA on contiguous K/V."""
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench

    from pagetrace.attention.api import load_kernel, plan_kernel

    kernel = load_kernel(interpret=False)
    device = torch.device("cuda")
    scale = HEAD_DIM**-0.5
    print("\n| dtype | batch | prompt | paged (ms) | TFLOP/s | SDPA causal (ms) | TFLOP/s | paged / SDPA | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|")
    for batch, context in ([(1, 1024), (4, 4096)] if quick else [(1, 1024), (1, 4096), (1, 8192), (4, 4096), (8, 2048)]):
        dtype = torch.float16
        _, k, v, kc, vc, bt, lens = make_point(batch, context, dtype, device)
        q = torch.randn(batch, HEADS, context, HEAD_DIM, dtype=dtype, device=device)
        q_paged = q.permute(0, 2, 1, 3).reshape(batch * context, HEADS, HEAD_DIM)
        plan = plan_kernel(kernel, q_paged, kc, vc, bt, lens, layout="nhd", scale=scale, trace=False, on_gpu=True,
                           max_seq_len=context, num_kv_heads=KV_HEADS, query_lens=[context] * batch)

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True, enable_gqa=True)

        out = plan.run()[0]
        diff = float((out.view(batch, context, HEADS, HEAD_DIM).permute(0, 2, 1, 3).float() - sdpa().float()).abs().max())
        t_paged = do_bench(lambda: plan.run(), return_mode="median") * 1e-3
        t_sdpa = do_bench(sdpa, return_mode="median") * 1e-3
        flops = 2 * batch * HEADS * context * context * HEAD_DIM  # causal: half of 4 * b * h * n^2 * d
        print(f"| fp16 | {batch} | {context} | {t_paged * 1e3:.2f} | {flops / t_paged / 1e12:.0f} | {t_sdpa * 1e3:.2f} | "
              f"{flops / t_sdpa / 1e12:.0f} | {t_paged / t_sdpa:.2f}x | {diff:.2e} |", flush=True)
        del q, k, v, kc, vc, bt, lens, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
