"""The worked example as a picture: 38 tokens, block size 16, block table [7, 2, 15].

Token 20 lies in logical block 20 // 16 = 1 at offset 20 % 16 = 4; block_table[1] = 2,
so its key and value sit in physical block 2, slot 2 * 16 + 4 = 36. The diagram draws
that path in red, the pool of 16 blocks (13 free, greyed), and the last block's fill
(6 of 16 slots). Each logical block is shaded by the attention mass of its tokens, from
the worked example's seeded cache and query run through the Triton kernel
(`pagetrace.paged_attention`, interpreted on a CPU) with trace=True.

    python examples/worked_example.py            # writes examples/worked_example.svg
    python examples/worked_example.py out.png    # or any .svg / .png / .dot path
"""

from __future__ import annotations

import sys
from pathlib import Path

from pagetrace.paging.plan import plan_tables
from pagetrace.views.diagram import MappingView, SequenceMap, block_mass, find_engine, graphviz_pure_engine, write_diagrams

SVG = Path(__file__).with_suffix(".svg")


def attention_mass(plan) -> list[float]:
    """Per logical block: the sum of its tokens' attention weights, as the kernel computed them."""
    from pagetrace import paged_attention
    from pagetrace.attention.workload import make_workload

    w = make_workload(plan)  # seed 0: key cache, value cache, query, as in the worked example
    _, trace = paged_attention(w.query, w.key_cache, w.value_cache, w.block_tables, w.seq_lens, layout="blocks", trace=True)
    weights = trace.weights[0, 0, : plan.seq_lens[0]].tolist()
    # rounded, so that the last bits of a machine's float sums cannot change the picture
    return [round(m, 4) for m in block_mass(weights, plan.block_size)]


def build_view() -> MappingView:
    plan = plan_tables([38], [[7, 2, 15]], block_size=16, num_blocks=16)
    return MappingView(
        block_size=16,
        num_blocks=16,
        sequences=[SequenceMap("seq 0", seq_len=38, table=[7, 2, 15], attention_mass=attention_mass(plan))],
        highlight=(0, 20),
    )


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else str(SVG)
    # graphviz-pure first: the same bytes on every machine, so the committed SVG stays put
    engine = graphviz_pure_engine() or find_engine()
    for written in write_diagrams(build_view(), engine=engine, **{Path(path).suffix.lstrip(".") or "svg": path}):
        print(f"wrote {written}")
