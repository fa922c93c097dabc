"""What a block-mapping diagram shows: the view it is given and the cells it draws.

A `MappingView` is the input (sequences with their block tables, the pool, a traced
token); `Cells` is what `layout_cells` (in `cells`) makes of it, and what every rendering
(DOT, terminal) draws. Plain Python: no NumPy, no Graphviz.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# -- what gets drawn ----------------------------------------------------------

SMALL = 64  # pools and tables up to this many blocks are drawn one cell per block
MAX_SEQ_CELLS = 12  # a sequence with more cells keeps half as many at its head, its tail and the traced cell
SEQ_TAIL_CELLS = 2
MAX_POOL_CELLS = 40  # a pool with more cells sums up runs of cells no arrow points to
MAX_SEQUENCES = 8  # more sequences: the traced, the largest and sharing ones drawn, the rest summed up
AUTO_SLOTS_BLOCK_SIZE = 16  # slots are drawn by default up to this block size (in a small pool)
MAX_SLOTS_BLOCK_SIZE = 256  # and never above it


@dataclass
class SequenceMap:
    name: str  # e.g. "seq 0"
    seq_len: int
    table: list[int]  # physical block of each logical block; may be longer than needed
    # per logical block: sum of that block's tokens' attention weights (averaged over heads)
    attention_mass: list[float] | None = None
    # per logical block, for the query token those masses belong to: how many of the block's
    # keys it does not see, (after it: causal, too far before it: sliding window)
    masked: list[tuple[int, int]] | None = None


@dataclass
class MappingView:
    block_size: int
    num_blocks: int
    sequences: list[SequenceMap]
    highlight: tuple[int, int] | None = None  # (sequence index, token)
    show_slots: bool | None = None  # None: only when block_size is small and the pool small

    def _repr_svg_(self) -> str | None:
        """The diagram, in a notebook: rendered by the system's dot, else graphviz-pure."""
        from ..notebook import render_svg
        from .dot import dot_source

        return render_svg(dot_source(self))


def _run_blocks(cell) -> int:
    return cell.last - cell.first + 1


def _run_port(prefix: str) -> property:
    """A cell stands for blocks first..last. Its port (and SVG id) is the prefix and the range:
    l<i> or l<i>_<j> for logical blocks, p<b> or p<b>_<c> for physical ones."""
    return property(lambda cell: f"{prefix}{cell.first}" if cell.first == cell.last else f"{prefix}{cell.first}_{cell.last}")


class LogicalCell(NamedTuple):
    """One drawn cell of a sequence: logical blocks first..last, mapped to physical..+n."""

    seq: int
    first: int
    last: int  # inclusive
    physical: int  # physical block of `first`; -1 in an elided cell
    first_token: int
    last_token: int  # inclusive
    fill: int  # tokens in the cell's last block
    mass: float | None  # summed attention mass of the cell's blocks
    traced: bool = False
    elided: bool = False  # stands for blocks that are not drawn: no arrow
    causal: int = 0  # keys of the cell the query token does not see: after it
    window: int = 0  # and too far before it (sliding window)

    blocks = property(_run_blocks)
    port = _run_port("l")

    @property
    def tokens(self) -> int:
        return self.last_token - self.first_token + 1

    @property
    def masked(self) -> int:
        return self.causal + self.window


class PoolCell(NamedTuple):
    """One drawn cell of the pool: physical blocks first..last."""

    first: int
    last: int  # inclusive
    owners: tuple[int, ...]  # the sequences that map every block of the cell; () when free or mixed
    used: int  # blocks of the cell that some sequence maps
    fill: int | None = None  # a one-block used cell: how many of its slots hold tokens
    traced_slot: int | None = None  # offset of the traced token, in the traced block

    blocks = property(_run_blocks)
    port = _run_port("p")

    @property
    def kind(self) -> str:
        """free, used (one sequence), shared (several) or mixed (a summary of a stretch)."""
        if self.used == 0:
            return "free"
        if not self.owners:
            return "mixed"
        return "shared" if len(self.owners) > 1 else "used"


class Traced(NamedTuple):
    """The highlighted token and where the two-level lookup puts it."""

    seq: int
    token: int
    logical: int
    offset: int
    physical: int


class HiddenSequences(NamedTuple):
    """The sequences not drawn, summed up in one cell: how many, their tokens and blocks."""

    count: int
    tokens: int
    blocks: int  # logical blocks, all of them together
    shared: int  # of them, the sequences that share a block with another sequence


class UsedBlocks(Mapping):
    """Used physical block -> the sequences that map it (a sorted tuple), in block order.

    A read-only mapping kept as two parallel sorted lists (the used blocks and their
    owners), so that `count` and `owner_counts` answer for a range of blocks by bisection.
    """

    __slots__ = ("_blocks", "_owners")

    def __init__(self, blocks: Sequence[int], owners: Sequence[tuple[int, ...]]):
        self._blocks = blocks  # sorted, distinct
        self._owners = owners

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[int]:
        return iter(self._blocks)

    def _index(self, block: object) -> int | None:
        try:
            i = bisect.bisect_left(self._blocks, block)
        except TypeError:  # not a block number
            return None
        return i if i < len(self._blocks) and self._blocks[i] == block else None

    def __contains__(self, block: object) -> bool:
        return self._index(block) is not None

    def __getitem__(self, block: int) -> tuple[int, ...]:
        i = self._index(block)
        if i is None:
            raise KeyError(block)
        return self._owners[i]

    def __repr__(self) -> str:
        return f"UsedBlocks({len(self)} used)"

    def _range(self, start: int, stop: int) -> tuple[int, int]:
        return bisect.bisect_left(self._blocks, start), bisect.bisect_left(self._blocks, stop)

    def count(self, start: int, stop: int) -> int:
        """How many of blocks start..stop-1 are used."""
        lo, hi = self._range(start, stop)
        return hi - lo

    def owner_counts(self, start: int, stop: int) -> dict[tuple[int, ...], int]:
        """The owners of the used blocks among start..stop-1, with how many blocks each."""
        lo, hi = self._range(start, stop)
        return dict(Counter(self._owners[lo:hi]))


@dataclass
class Cells:
    """What a rendering draws, computed once from a `MappingView`."""

    view: MappingView
    needed: list[int]  # logical blocks each sequence uses
    sequences: list[list[LogicalCell]]  # per sequence; [] for a sequence not drawn
    drawn: list[int]  # the sequences drawn, in order (all of them up to MAX_SEQUENCES)
    hidden: HiddenSequences | None  # the others, summed up
    pool: list[PoolCell]
    edges: list[tuple[LogicalCell, PoolCell]]
    slots: bool
    traced: Traced | None
    owners: UsedBlocks  # used physical block -> the sequences that map it (a read-only mapping)
    used_blocks: int
    shared_blocks: int
    max_block_mass: float | None  # the largest single block's mass, for the shading scale

    @property
    def logical_cells(self) -> int:
        return sum(len(cells) for cells in self.sequences)


def block_mass(token_weights: list[float], block_size: int) -> list[float]:
    """Attention mass per logical block: the sum of its tokens' weights (token order)."""
    return [float(sum(token_weights[i : i + block_size])) for i in range(0, len(token_weights), block_size)]
