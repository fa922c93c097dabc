"""Three sequences that share a 32-token system prompt, with grouped-query attention.

The prompt fills physical blocks 3 and 9, which all three block tables map (ref count 3):
the cache holds the prompt once. Each sequence then goes on in blocks of its own. Every
query has 8 heads over 2 KV heads (groups of 4); the diagram shades each logical block
by the attention mass of its tokens, averaged over the 8 heads, computed by pagetrace's
plain-torch reference on the CPU. Token 20 of seq 1 (in the shared block 9, slot 4) is
traced.

    python examples/gqa_shared_prefix.py            # writes examples/gqa_shared_prefix.svg
    python examples/gqa_shared_prefix.py out.png    # or any .svg / .png / .dot path
"""

from __future__ import annotations

import sys
from pathlib import Path

from pagetrace.paging.plan import plan_tables
from pagetrace.views.diagram import MappingView, SequenceMap, block_mass, find_engine, graphviz_pure_engine, write_diagrams

SVG = Path(__file__).with_suffix(".svg")
BLOCK_SIZE = 16
NUM_BLOCKS = 24
SEQ_LENS = [70, 45, 100]
PROMPT = [3, 9]  # the shared system prompt: 32 tokens in 2 blocks
TABLES = [PROMPT + [14, 0, 21], PROMPT + [6], PROMPT + [17, 5, 11, 18, 4]]
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 8, 2, 16


def attention_mass(plan) -> list[list[float]]:
    """Per sequence, per logical block: its tokens' attention weights summed, head-averaged."""
    from pagetrace.attention.reference import reference_attention
    from pagetrace.attention.workload import make_workload

    w = make_workload(plan, num_heads=NUM_HEADS, num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, layout="nhd")
    ref = reference_attention(
        w.query, w.key_cache, w.value_cache, plan.tables, plan.seq_lens,
        layout="nhd", block_size=BLOCK_SIZE, scale=HEAD_DIM**-0.5,
    )
    # rounded, so that the last bits of a CPU's float sums cannot change the picture
    return [[round(m, 4) for m in block_mass(weights[:, :n].mean(0).tolist(), BLOCK_SIZE)] for weights, n in zip(ref.weights, plan.seq_lens)]


def build_view() -> MappingView:
    plan = plan_tables(SEQ_LENS, TABLES, BLOCK_SIZE, NUM_BLOCKS)
    masses = attention_mass(plan)
    return MappingView(
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        sequences=[SequenceMap(f"seq {s}", n, t, m) for s, (n, t, m) in enumerate(zip(plan.seq_lens, plan.tables, masses))],
        highlight=(1, 20),
    )


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else str(SVG)
    # graphviz-pure first: the same bytes on every machine, so the committed SVG stays put
    engine = graphviz_pure_engine() or find_engine()
    for written in write_diagrams(build_view(), engine=engine, **{Path(path).suffix.lstrip(".") or "svg": path}):
        print(f"wrote {written}")
