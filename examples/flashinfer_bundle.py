"""A FlashInfer batch-decode step as a pagetrace bundle, then `check` and `replay` on it.

No FlashInfer needed: the tensors follow its conventions (flashinfer/decode.py,
BatchDecodeWithPagedKVCacheWrapper.plan): a CSR page table `kv_indptr`, `kv_indices`,
`kv_last_page_len`, and a paged cache [max_num_pages, 2, page_size, H, D] ("NHD"). With
your own FlashInfer run, pass the same `plan` arguments, the cache, the query and the
wrapper's output to `write_bundle`.

    python examples/flashinfer_bundle.py --out fi.bundle
    pagetrace check fi.bundle && pagetrace replay fi.bundle --request 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from pagetrace.cli import run_cli
from pagetrace.engines.flashinfer import block_tables, kv_views, write_bundle

PAGE_SIZE, KV_HEADS, QO_HEADS, HEAD_DIM, PAGES = 16, 2, 8, 64, 32


def flashinfer_step(gen: torch.Generator):
    """Three requests of 40, 16 and 57 tokens over scattered pages; one new token each."""
    kv_indices = [5, 9, 2, 17, 30, 11, 4, 20, 8]  # request 0: 5, 9, 2; request 1: 17; request 2: 30, 11, 4, 20
    kv_indptr = [0, 3, 4, 8]
    kv_last_page_len = [8, 16, 9]  # 2*16 + 8 = 40, 16, 3*16 + 9 = 57
    paged_kv_cache = torch.randn(PAGES, 2, PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    query = torch.randn(3, QO_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    return kv_indptr, kv_indices[: kv_indptr[-1]], kv_last_page_len, paged_kv_cache, query


def attention(query, key, value, tables, lens) -> torch.Tensor:
    """What FlashInfer's decode computes, written plainly: each request's query over its tokens."""
    out = []
    for q, table, n in zip(query.float(), tables, lens):
        slots = [(table[t // PAGE_SIZE], t % PAGE_SIZE) for t in range(n)]
        k = torch.stack([key[p, o] for p, o in slots]).float().repeat_interleave(QO_HEADS // KV_HEADS, dim=1)
        v = torch.stack([value[p, o] for p, o in slots]).float().repeat_interleave(QO_HEADS // KV_HEADS, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q, k) * HEAD_DIM**-0.5, dim=-1)
        out.append(torch.einsum("ht,thd->hd", w, v))
    return torch.stack(out).to(query.dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("flashinfer.bundle"), help="bundle folder to write (must not exist)")
    args = parser.parse_args(argv)
    kv_indptr, kv_indices, kv_last_page_len, cache, query = flashinfer_step(torch.Generator().manual_seed(0))
    tables, lens = block_tables(kv_indptr, kv_indices, kv_last_page_len, PAGE_SIZE)
    key, value = kv_views(cache, "NHD", PAGE_SIZE, KV_HEADS, HEAD_DIM)
    write_bundle(args.out, kv_indptr, kv_indices, kv_last_page_len, cache, kv_layout="NHD", page_size=PAGE_SIZE,
                 num_qo_heads=QO_HEADS, query=query, output=attention(query, key, value, tables, lens), null_block=None)
    print(f"wrote {args.out}: {len(tables)} requests, block tables {tables}, seq_lens {lens}")
    for command in (["check", str(args.out)], ["replay", str(args.out), "--request", "1", "--backend", "torch"]):
        print(f"\n$ pagetrace {' '.join(command)}", flush=True)
        code = run_cli(command)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
