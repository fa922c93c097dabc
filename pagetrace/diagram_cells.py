"""The cells model of the block-mapping diagrams: what a `MappingView` draws, as cells.

`layout_cells` turns a view into `Cells`: each sequence's logical cells, the pool's cells
and the arrows between them, with runs collapsed, long tables elided and unreferenced
stretches of a long pool summed up. Package-private: import these names from
`pagetrace.diagram`, which re-exports them. No torch, no Graphviz here.

The work grows with the blocks the sequences use and the cells drawn, never with the
pool: the used blocks are walked in order and each free run is stepped over whole.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import ClassVar

from .blocks import blocks_needed
from .errors import UsageError

# -- what gets drawn ----------------------------------------------------------

SMALL = 64  # pools and tables up to this many blocks are drawn one cell per block
MAX_SEQ_CELLS = 12  # a sequence with more cells keeps half as many at its head, its tail and the traced cell
SEQ_TAIL_CELLS = 2
MAX_POOL_CELLS = 40  # a pool with more cells sums up runs of cells no arrow points to
AUTO_SLOTS_BLOCK_SIZE = 16  # slots are drawn by default up to this block size (in a small pool)
MAX_SLOTS_BLOCK_SIZE = 256  # and never above it


@dataclass
class SequenceMap:
    name: str  # e.g. "seq 0"
    seq_len: int
    table: list[int]  # physical block of each logical block; may be longer than needed
    # per logical block: sum of that block's tokens' attention weights (averaged over heads)
    attention_mass: list[float] | None = None


@dataclass
class MappingView:
    block_size: int
    num_blocks: int
    sequences: list[SequenceMap]
    highlight: tuple[int, int] | None = None  # (sequence index, token)
    show_slots: bool | None = None  # None: only when block_size is small and the pool small


class _BlockRun:
    """Blocks first..last drawn as one cell. Its port (and SVG id) is PREFIX and the range:
    l<i> or l<i>_<j> for logical blocks, p<b> or p<b>_<c> for physical ones."""

    __slots__ = ()
    PREFIX: ClassVar[str] = ""
    first: int
    last: int

    @property
    def blocks(self) -> int:
        return self.last - self.first + 1

    @property
    def port(self) -> str:
        return f"{self.PREFIX}{self.first}" if self.first == self.last else f"{self.PREFIX}{self.first}_{self.last}"


@dataclass(frozen=True, slots=True)
class LogicalCell(_BlockRun):
    """One drawn cell of a sequence: logical blocks first..last, mapped to physical..+n."""

    PREFIX: ClassVar[str] = "l"

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


@dataclass(frozen=True, slots=True)
class PoolCell(_BlockRun):
    """One drawn cell of the pool: physical blocks first..last."""

    PREFIX: ClassVar[str] = "p"

    first: int
    last: int  # inclusive
    owners: tuple[int, ...]  # the sequences that map every block of the cell; () when free or mixed
    used: int  # blocks of the cell that some sequence maps
    fill: int | None = None  # a one-block used cell: how many of its slots hold tokens
    traced_slot: int | None = None  # offset of the traced token, in the traced block

    @property
    def kind(self) -> str:
        """free, used (one sequence), shared (several) or mixed (a summary of a stretch)."""
        if self.used == 0:
            return "free"
        if not self.owners:
            return "mixed"
        return "shared" if len(self.owners) > 1 else "used"


@dataclass(frozen=True, slots=True)
class Traced:
    """The highlighted token and where the two-level lookup puts it."""

    seq: int
    token: int
    logical: int
    offset: int
    physical: int


@dataclass
class Cells:
    """What a rendering draws, computed once from a `MappingView`."""

    view: MappingView
    needed: list[int]  # logical blocks each sequence uses
    sequences: list[list[LogicalCell]]
    pool: list[PoolCell]
    edges: list[tuple[LogicalCell, PoolCell]]
    slots: bool
    traced: Traced | None
    owners: dict[int, tuple[int, ...]]  # used physical block -> the sequences that map it
    used_blocks: int
    shared_blocks: int
    max_block_mass: float | None  # the largest single block's mass, for the shading scale

    @property
    def logical_cells(self) -> int:
        return sum(len(cells) for cells in self.sequences)


def block_mass(token_weights: list[float], block_size: int) -> list[float]:
    """Attention mass per logical block: the sum of its tokens' weights (token order)."""
    return [float(sum(token_weights[i : i + block_size])) for i in range(0, len(token_weights), block_size)]


# -- cells ----------------------------------------------------------------------


def check_view(view: MappingView) -> list[int]:
    """Refuse a view that no cache could be in; return the blocks each sequence uses.

    Errors name the CLI options that feed a view, as every command spells them.
    """
    bs = view.block_size
    if bs < 1:
        raise UsageError("--block-size", bs, "must be at least 1")
    if view.num_blocks < 1:
        raise UsageError("--num-blocks", view.num_blocks, "must be at least 1")
    if not view.sequences:
        raise UsageError("--tokens", "", "give at least one sequence")
    needed = []
    for s, seq in enumerate(view.sequences):
        text = ",".join(map(str, seq.table))
        if seq.seq_len < 1:
            raise UsageError("--tokens", seq.seq_len, f"{seq.name}: a sequence holds at least 1 token")
        n = blocks_needed(seq.seq_len, bs)
        if len(seq.table) < n:
            raise UsageError("--table", text, f"{seq.name} has {seq.seq_len} tokens, which need {n} blocks of {bs}; the table has {len(seq.table)}")
        for logical, physical in enumerate(seq.table[:n]):
            if not 0 <= physical < view.num_blocks:
                raise UsageError("--table", text, f"{seq.name}: entry {logical} is physical block {physical}; the pool has blocks 0..{view.num_blocks - 1}")
        if seq.attention_mass is not None and len(seq.attention_mass) < n:
            raise ValueError(f"{seq.name}: attention_mass has {len(seq.attention_mass)} entries for {n} logical blocks")
        needed.append(n)
    if view.show_slots and bs > MAX_SLOTS_BLOCK_SIZE:
        raise UsageError("--slots", bs, f"slots are drawn for block sizes up to {MAX_SLOTS_BLOCK_SIZE}; use --no-slots")
    _traced(view)  # the highlighted --seq/--token exist
    return needed


def _traced(view: MappingView) -> Traced | None:
    if view.highlight is None:
        return None
    s, token = view.highlight
    if not 0 <= s < len(view.sequences):
        raise UsageError("--seq", s, f"there are {len(view.sequences)} sequence(s): 0..{len(view.sequences) - 1}")
    seq = view.sequences[s]
    if not 0 <= token < seq.seq_len:
        raise UsageError("--token", token, f"{seq.name} holds tokens 0..{seq.seq_len - 1}")
    logical, offset = divmod(token, view.block_size)
    return Traced(s, token, logical, offset, seq.table[logical])


def _auto_slots(view: MappingView, small: bool) -> bool:
    if view.show_slots is not None:
        return view.show_slots
    return small and view.block_size <= AUTO_SLOTS_BLOCK_SIZE


def layout_cells(view: MappingView, max_seq_cells: int = MAX_SEQ_CELLS) -> Cells:
    """The cells and arrows to draw, with runs collapsed and long tables elided."""
    needed = check_view(view)
    traced = _traced(view)
    bs, n_pool = view.block_size, view.num_blocks
    small = n_pool <= SMALL and max(needed) <= SMALL
    slots = _auto_slots(view, small)

    owner_sets: dict[int, set[int]] = {}
    fill: dict[int, int] = {}  # physical block -> slots that hold a token (of any sequence)
    for s, (seq, n) in enumerate(zip(view.sequences, needed)):
        for logical, physical in enumerate(seq.table[:n]):
            owner_sets.setdefault(physical, set()).add(s)
            fill[physical] = max(fill.get(physical, 0), min(bs, seq.seq_len - logical * bs))
    owners = {p: tuple(sorted(o)) for p, o in owner_sets.items()}

    alone = set() if traced is None else {traced.physical}
    if slots:  # a sequence's last block shows its fill in its slots
        alone |= {seq.table[n - 1] for seq, n in zip(view.sequences, needed)}
    pool = _pool_cells(n_pool, owners, fill, alone, collapse=not small, traced=traced)
    cell_of = {}  # used physical block -> index of its pool cell
    for index, cell in enumerate(pool):
        if cell.used:  # before summing up, a cell is all used or all free
            for p in range(cell.first, cell.last + 1):
                cell_of[p] = index

    sequences = [
        _elide(_logical_cells(view, s, n, cell_of, traced, collapse=not small), max_seq_cells)
        for s, n in enumerate(needed)
    ]
    anchored = {cell_of[c.physical] for cells in sequences for c in cells if not c.elided}
    pool = _sum_up_pool(pool, anchored)
    firsts = [cell.first for cell in pool]
    edges = [
        (c, pool[bisect.bisect_right(firsts, c.physical) - 1]) for cells in sequences for c in cells if not c.elided
    ]
    masses = [m for seq, n in zip(view.sequences, needed) if seq.attention_mass is not None for m in seq.attention_mass[:n]]
    return Cells(
        view=view,
        needed=needed,
        sequences=sequences,
        pool=pool,
        edges=edges,
        slots=slots,
        traced=traced,
        owners=owners,
        used_blocks=len(owners),
        shared_blocks=sum(1 for o in owners.values() if len(o) > 1),
        max_block_mass=max((m for m in masses if math.isfinite(m)), default=None) if masses else None,
    )


def _pool_cells(
    n_pool: int, owners: dict[int, tuple[int, ...]], fill: dict[int, int], alone: set[int], collapse: bool, traced: Traced | None
) -> list[PoolCell]:
    """Runs of used blocks with the same owners and runs of free blocks, or one cell per
    block in a small pool. Walks the used blocks in order and steps over each free run
    whole, so the work grows with the used blocks and the cells, not with the pool."""
    cells: list[PoolCell] = []

    def free_run(first: int, last: int) -> None:
        if collapse:
            cells.append(PoolCell(first, last, (), 0))
        else:
            cells.extend(PoolCell(p, p, (), 0) for p in range(first, last + 1))

    used = sorted(owners)
    p = 0  # the first block not yet in a cell
    i = 0
    while i < len(used):
        first = used[i]
        if first > p:
            free_run(p, first - 1)
        key = owners[first]
        last = first
        if collapse and first not in alone:
            while i + 1 < len(used) and used[i + 1] == last + 1 and last + 1 not in alone and owners[last + 1] == key:
                i += 1
                last += 1
        cells.append(
            PoolCell(
                first=first,
                last=last,
                owners=key,
                used=last - first + 1,
                fill=fill[first] if first == last else None,
                traced_slot=traced.offset if traced is not None and traced.physical == first else None,
            )
        )
        p = last + 1
        i += 1
    if p < n_pool:
        free_run(p, n_pool - 1)
    return cells


def _logical_cells(view: MappingView, s: int, n: int, cell_of: dict[int, int], traced: Traced | None, collapse: bool) -> list[LogicalCell]:
    """A sequence's logical blocks; in a big picture, runs that map to consecutive blocks of
    one pool cell share a cell. The traced block and the last block stand alone."""
    table = view.sequences[s].table
    traced_logical = traced.logical if traced is not None and traced.seq == s else -1
    starts = []
    for i in range(n):
        if (
            not collapse
            or i in (0, n - 1, traced_logical, traced_logical + 1)
            or table[i] != table[i - 1] + 1
            or cell_of[table[i]] != cell_of[table[i - 1]]
        ):
            starts.append(i)
    bounds = list(zip(starts, starts[1:] + [n]))
    return [_logical_cell(view, s, first, stop - 1, physical=table[first], traced=first == traced_logical) for first, stop in bounds]


def _logical_cell(view: MappingView, s: int, first: int, last: int, physical: int, traced: bool) -> LogicalCell:
    seq, bs = view.sequences[s], view.block_size
    last_token = min((last + 1) * bs, seq.seq_len) - 1
    mass = None if seq.attention_mass is None else float(sum(seq.attention_mass[first : last + 1]))
    return LogicalCell(s, first, last, physical, first * bs, last_token, last_token - last * bs + 1, mass, traced)


def _elide(cells: list[LogicalCell], limit: int) -> list[LogicalCell]:
    """Keep a long sequence's head, tail and traced cell; one elided cell per gap."""
    if len(cells) <= limit:
        return cells
    keep = set(range(limit // 2)) | set(range(len(cells) - SEQ_TAIL_CELLS, len(cells)))
    for i, c in enumerate(cells):
        if c.traced:
            keep |= {i - 1, i, i + 1}
    out: list[LogicalCell] = []
    gap: list[LogicalCell] = []
    for i, c in enumerate(cells):
        if i in keep:
            if gap:
                out.append(_merge_elided(gap))
                gap = []
            out.append(c)
        else:
            gap.append(c)
    return out


def _merge_elided(gap: list[LogicalCell]) -> LogicalCell:
    a, b = gap[0], gap[-1]
    masses = [c.mass for c in gap]
    mass = None if masses[0] is None else float(sum(masses))
    return LogicalCell(a.seq, a.first, b.last, -1, a.first_token, b.last_token, b.fill, mass, elided=True)


def _sum_up_pool(pool: list[PoolCell], anchored: set[int]) -> list[PoolCell]:
    """In a pool with too many cells, one summary cell per stretch no arrow points to."""
    if len(pool) <= MAX_POOL_CELLS:
        return pool
    out: list[PoolCell] = []
    stretch: list[PoolCell] = []

    def flush() -> None:
        if len(stretch) == 1:
            out.append(stretch[0])
        elif stretch:
            kinds = {c.owners for c in stretch}
            owners = stretch[0].owners if len(kinds) == 1 else ()
            out.append(PoolCell(stretch[0].first, stretch[-1].last, owners, sum(c.used for c in stretch)))
        stretch.clear()

    for index, cell in enumerate(pool):
        if index in anchored:
            flush()
            out.append(cell)
        else:
            stretch.append(cell)
    flush()
    return out

