"""The worked example as a picture: 38 tokens, block size 16, block table [7, 2, 15].

Token 20 lies in logical block 20 // 16 = 1 at offset 20 % 16 = 4; block_table[1] = 2,
so its key and value sit in physical block 2, slot 2 * 16 + 4 = 36. The diagram draws
that path in red, the pool of 16 blocks (13 free, greyed), and the last block's fill
(6 of 16 slots).

    python examples/worked_example.py            # writes examples/worked_example.svg
    python examples/worked_example.py out.png    # or any .svg / .png / .dot path
"""

from __future__ import annotations

import sys
from pathlib import Path

from pagetrace.diagram import MappingView, SequenceMap, find_engine, graphviz_pure_engine, write_diagrams

SVG = Path(__file__).with_suffix(".svg")


def build_view() -> MappingView:
    return MappingView(
        block_size=16,
        num_blocks=16,
        sequences=[SequenceMap("seq 0", seq_len=38, table=[7, 2, 15])],
        highlight=(0, 20),
    )


if __name__ == "__main__":
    path = sys.argv[1] if len(sys.argv) > 1 else str(SVG)
    # graphviz-pure first: the same bytes on every machine, so the committed SVG stays put
    engine = graphviz_pure_engine() or find_engine()
    for written in write_diagrams(build_view(), engine=engine, **{Path(path).suffix.lstrip(".") or "svg": path}):
        print(f"wrote {written}")
