"""How the block-mapping diagrams look: colours, and the labels every rendering shares.

Labels are ASCII on purpose: Graphviz measures text with per-font width tables, and
non-ASCII characters would be measured (and so laid out) differently by each engine.
"""

from __future__ import annotations

import bisect
import math

FONT = "Helvetica"
TRACE = "#d62728"  # the traced token's path: borders, arrow, slot
SEQ_EDGE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
SEQ_FILL = ["#aec7e8", "#ffbb78", "#98df8a", "#c5b0d5", "#c49c94", "#f7b6d2", "#9edae5", "#dbdb8d"]
OTHERS_EDGE = "#7f7f7f"  # the sequences not drawn, summed up
OTHERS_FILL = "#d9d9d9"
SHARED_FILL = "#d4b9da"
SHARED_SLOT = "#88419d"  # a shared block's slots that hold tokens
FREE_FILL = "#f0f0f0"
FREE_TEXT = "#9a9a9a"
MIXED_FILL = "#ffffff"
MASKED_FILL = "#e7e1ef"  # keys the shown query token does not see (causal or sliding-window mask)
MASKED_TEXT = "#756bb1"
EMPTY_SLOT = "#ffffff"
# ColorBrewer "Blues", 9 classes: attention mass per block, low to high
MASS_FILL = ["#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"]
MASS_DARK_FROM = 6  # classes from here on get white text
SLOTS_PER_ROW = 16


def span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def percent(mass: float) -> str:
    if 0 < mass < 0.001:
        return "<0.1%"
    return f"{mass:.1%}"


def seq_colours(s: int) -> tuple[str, str]:
    return SEQ_EDGE[s % len(SEQ_EDGE)], SEQ_FILL[s % len(SEQ_FILL)]


def drawn_colours(drawn: list[int], s: int) -> tuple[str, str]:
    """(edge, fill) of sequence s: by its place among the drawn sequences, so no two drawn
    share a colour; a sequence not drawn (summed up) gets grey."""
    i = bisect.bisect_left(drawn, s)
    return seq_colours(i) if i < len(drawn) and drawn[i] == s else (OTHERS_EDGE, OTHERS_FILL)


def mass_class(mass_per_block: float, max_block_mass: float) -> int:
    """Which of the 9 shades a block (or the mean block of a run) gets; NaN gets none."""
    if not (math.isfinite(mass_per_block) and math.isfinite(max_block_mass)) or max_block_mass <= 0:
        return 0
    return max(0, min(len(MASS_FILL) - 1, int(mass_per_block / max_block_mass * len(MASS_FILL))))
