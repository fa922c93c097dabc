"""An SGLang decode step as a pagetrace bundle, then `check` and `replay` on it.

No SGLang needed: the tensors follow its token pool (python/sglang/srt/mem_cache/memory_pool.py):
`req_to_token` [max_reqs, max_context_len] holds the KV slot of every token of every request,
`k_buffer` / `v_buffer` [size + page_size, H, D] one layer's keys and values, slot 0's page the
padding page; `out_cache_loc` the slots this step's new tokens were written to. With a
page_size of 4 the allocator hands out whole pages, so a request's block table is
req_to_token[r, ::4] // 4.

    python examples/sglang_bundle.py --out sgl.bundle
    pagetrace check sgl.bundle && pagetrace replay sgl.bundle --request 0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from pagetrace.cli import run_cli
from pagetrace.engines.sglang import block_tables, kv_views, write_bundle

PAGE_SIZE, KV_HEADS, HEADS, HEAD_DIM, SLOTS = 4, 2, 4, 32, 64


def sglang_step(gen: torch.Generator):
    """Two requests in rows 3 and 5 of the request pool, 11 and 6 tokens, over scattered pages."""
    req_to_token = torch.zeros(8, 32, dtype=torch.int32)
    pages = {3: [7, 2, 12], 5: [9, 4]}
    lens = {3: 11, 5: 6}
    for row, owned in pages.items():
        for t in range(lens[row]):
            req_to_token[row, t] = owned[t // PAGE_SIZE] * PAGE_SIZE + t % PAGE_SIZE
    k_buffer = torch.randn(SLOTS + PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    v_buffer = torch.randn(SLOTS + PAGE_SIZE, KV_HEADS, HEAD_DIM, generator=gen)
    rows, seq_lens = [3, 5], [lens[3], lens[5]]
    out_cache_loc = [int(req_to_token[r, n - 1]) for r, n in zip(rows, seq_lens)]  # this step's token of each request
    query = torch.randn(2, HEADS, HEAD_DIM, generator=gen)
    return req_to_token, rows, seq_lens, k_buffer, v_buffer, out_cache_loc, query


def attention(query, req_to_token, rows, seq_lens, k_buffer, v_buffer) -> torch.Tensor:
    """What SGLang's decode computes, written plainly over req_to_token's slots."""
    out = []
    for q, row, n in zip(query, rows, seq_lens):
        slots = req_to_token[row, :n].long()
        k = k_buffer[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        v = v_buffer[slots].repeat_interleave(HEADS // KV_HEADS, dim=1)
        w = torch.softmax(torch.einsum("hd,thd->ht", q, k) * HEAD_DIM**-0.5, dim=-1)
        out.append(torch.einsum("ht,thd->hd", w, v))
    return torch.stack(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("sglang.bundle"), help="bundle folder to write (must not exist)")
    args = parser.parse_args(argv)
    req_to_token, rows, seq_lens, k_buffer, v_buffer, out_cache_loc, query = sglang_step(torch.Generator().manual_seed(0))
    tables = block_tables(req_to_token, rows, seq_lens, PAGE_SIZE)
    kv_views(k_buffer, v_buffer, PAGE_SIZE)  # K and V as [pages, page_size, H, D] views, no copy
    write_bundle(args.out, req_to_token, rows, seq_lens, k_buffer, v_buffer, num_heads=HEADS, page_size=PAGE_SIZE,
                 out_cache_loc=out_cache_loc, query=query, output=attention(query, req_to_token, rows, seq_lens, k_buffer, v_buffer))
    print(f"wrote {args.out}: block tables {tables}, seq_lens {seq_lens}")
    for command in (["check", str(args.out)], ["replay", str(args.out), "--request", "0", "--backend", "torch"]):
        print(f"\n$ pagetrace {' '.join(command)}", flush=True)
        code = run_cli(command)
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
