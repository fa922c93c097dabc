"""The cells model of the block-mapping diagrams: what a `MappingView` draws, as cells.

`layout_cells` turns a view into `Cells`: each sequence's logical cells, the pool's cells
and the arrows between them, with runs collapsed, long tables elided and unreferenced
stretches of a long pool summed up. Package-private: import these names from
`pagetrace.diagram`, which re-exports them. No torch, no Graphviz here.

The work grows with the blocks the sequences use, never with the pool, and Python
objects are made only for the cells drawn. Two passes find the structure:

- the pool's cells before summing up (runs of used blocks with the same owners, free runs
  between them) as parallel arrays of first block, last block, blocks used and owners;
- each sequence's cells as the logical blocks where a cell starts.

Tables of `_NUMPY_FROM` logical blocks or more are scanned with NumPy (sorted arrays, the
owners of a block as a bit mask of sequences), smaller ones in plain Python, so that a
small diagram loads no NumPy. Both give the same structure; the cells drawn (a long
table's head, tail and traced cell, the pool cells arrows point to, one summary cell per
stretch between them) are then made from it by arithmetic and bisection.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, ClassVar

from .blocks import blocks_needed
from .errors import UsageError

# -- what gets drawn ----------------------------------------------------------

SMALL = 64  # pools and tables up to this many blocks are drawn one cell per block
MAX_SEQ_CELLS = 12  # a sequence with more cells keeps half as many at its head, its tail and the traced cell
SEQ_TAIL_CELLS = 2
MAX_POOL_CELLS = 40  # a pool with more cells sums up runs of cells no arrow points to
AUTO_SLOTS_BLOCK_SIZE = 16  # slots are drawn by default up to this block size (in a small pool)
MAX_SLOTS_BLOCK_SIZE = 256  # and never above it

_NUMPY_FROM = 1 << 12  # logical blocks in all tables together from which the scan uses NumPy
_MASK_SEQS = 63  # NumPy keeps a block's owners as a bit mask in an int64: up to 63 sequences
_MASK_BLOCKS = 1 << 56  # and sorts (block << 6 | sequence) keys: blocks below 2**56


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


class UsedBlocks(Mapping):
    """Used physical block -> the sequences that map it (a sorted tuple), in block order.

    A read-only mapping kept as two parallel sorted arrays (the used blocks and their owners,
    as tuples or as bit masks), not as a dict entry per block: a table of millions of
    scattered blocks costs no Python object per block. `count` and `owner_counts` answer
    for a range of blocks by bisection.
    """

    __slots__ = ("_blocks", "_keys", "_decode")

    def __init__(self, blocks: Sequence[int], keys: Sequence[Any], decode: Callable[[Any], tuple[int, ...]]):
        self._blocks = blocks  # sorted, distinct
        self._keys = keys  # the owners of each, as `decode` reads them
        self._decode = decode

    def __len__(self) -> int:
        return len(self._blocks)

    def __iter__(self) -> Iterator[int]:
        blocks = self._blocks
        return iter(blocks if isinstance(blocks, list) else blocks.tolist())

    def _index(self, block: object) -> int | None:
        try:
            i = bisect.bisect_left(self._blocks, block)
        except (TypeError, OverflowError):  # not a block number
            return None
        return i if i < len(self._blocks) and self._blocks[i] == block else None

    def __contains__(self, block: object) -> bool:
        return self._index(block) is not None

    def __getitem__(self, block: int) -> tuple[int, ...]:
        i = self._index(block)
        if i is None:
            raise KeyError(block)
        return self._decode(self._keys[i])

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
        keys = self._keys[lo:hi]
        if isinstance(keys, list):
            return dict(Counter(keys))
        if hi == lo:
            return {}
        if keys.min() == keys.max():
            return {self._decode(keys[0]): hi - lo}
        import numpy as np

        values, counts = np.unique(keys, return_counts=True)
        return {self._decode(v): int(c) for v, c in zip(values, counts)}


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


# -- checks -----------------------------------------------------------------------


def check_view(view: MappingView) -> list[int]:
    """Refuse a view that no cache could be in; return the blocks each sequence uses.

    Errors name the CLI options that feed a view, as every command spells them.
    """
    return _check(view)[0]


def _check(view: MappingView) -> tuple[list[int], list | None]:
    """`check_view`, and each table's used part as a NumPy array where the tables are
    long enough for the NumPy scan (None where they are not, or an entry is no int)."""
    bs = view.block_size
    if bs < 1:
        raise UsageError("--block-size", bs, "must be at least 1")
    if view.num_blocks < 1:
        raise UsageError("--num-blocks", view.num_blocks, "must be at least 1")
    if not view.sequences:
        raise UsageError("--tokens", "", "give at least one sequence")
    total = sum(min(len(seq.table), blocks_needed(seq.seq_len, bs)) for seq in view.sequences if seq.seq_len >= 1)
    arrays: list | None = [] if total >= _NUMPY_FROM else None
    needed = []
    for s, seq in enumerate(view.sequences):
        if seq.seq_len < 1:
            raise UsageError("--tokens", seq.seq_len, f"{seq.name}: a sequence holds at least 1 token")
        n = blocks_needed(seq.seq_len, bs)
        if len(seq.table) < n:
            raise UsageError("--table", _table_text(seq), f"{seq.name} has {seq.seq_len} tokens, which need {n} blocks of {bs}; the table has {len(seq.table)}")
        array = None if arrays is None else _int_array(seq.table, n, view.num_blocks)
        if array is None:
            arrays = None  # an entry NumPy cannot hold: the plain Python scan, for every table
            for logical, physical in enumerate(seq.table[:n]):
                if not 0 <= physical < view.num_blocks:
                    _entry_out_of_range(view, seq, logical)
        else:
            if int(array.min()) < 0 or int(array.max()) >= view.num_blocks:
                import numpy as np

                _entry_out_of_range(view, seq, int(np.flatnonzero((array < 0) | (array >= view.num_blocks))[0]))
            arrays.append(array)
        if seq.attention_mass is not None and len(seq.attention_mass) < n:
            raise ValueError(f"{seq.name}: attention_mass has {len(seq.attention_mass)} entries for {n} logical blocks")
        needed.append(n)
    if view.show_slots and bs > MAX_SLOTS_BLOCK_SIZE:
        raise UsageError("--slots", bs, f"slots are drawn for block sizes up to {MAX_SLOTS_BLOCK_SIZE}; use --no-slots")
    _traced(view)  # the highlighted --seq/--token exist
    return needed, arrays


def _table_text(seq: SequenceMap) -> str:
    return ",".join(map(str, seq.table))


def _entry_out_of_range(view: MappingView, seq: SequenceMap, logical: int) -> None:
    physical = seq.table[logical]
    raise UsageError("--table", _table_text(seq), f"{seq.name}: entry {logical} is physical block {physical}; the pool has blocks 0..{view.num_blocks - 1}")


def _int_array(table: Sequence[int], n: int, num_blocks: int):
    """table[:n] as a NumPy array of int32 (int64 in a pool of 2**31 blocks or more); None
    if an entry is no int or does not fit (and so is out of range). struct takes ints only
    (and what has __index__), unlike NumPy's conversions, and is the fastest of them."""
    import struct

    import numpy as np

    code = "i" if num_blocks <= 2**31 - 1 else "q"
    try:
        raw = struct.pack(f"={n}{code}", *(table if len(table) == n else table[:n]))
    except struct.error:
        return None
    return np.frombuffer(raw, dtype=np.int32 if code == "i" else np.int64)


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


# -- cells ----------------------------------------------------------------------


def layout_cells(view: MappingView, max_seq_cells: int = MAX_SEQ_CELLS) -> Cells:
    """The cells and arrows to draw, with runs collapsed and long tables elided."""
    needed, arrays = _check(view)
    traced = _traced(view)
    n_pool = view.num_blocks
    small = n_pool <= SMALL and max(needed) <= SMALL
    slots = _auto_slots(view, small)

    # blocks that get a pool cell of their own: the traced one, and with slots each last block
    alone = set() if traced is None else {traced.physical}
    if slots:  # a sequence's last block shows its fill in its slots
        alone |= {seq.table[n - 1] for seq, n in zip(view.sequences, needed)}
    if arrays is not None and not small and len(arrays) <= _MASK_SEQS and n_pool <= _MASK_BLOCKS:
        scan = _scan_numpy(view, needed, arrays, alone, traced)
    else:
        scan = _scan_python(view, needed, alone, collapse=not small, traced=traced)

    sequences = [_sequence_cells(view, s, n, scan.starts[s], traced, max_seq_cells) for s, n in enumerate(needed)]
    anchored = {scan.cell_at(c.physical) for cells in sequences for c in cells if not c.elided}
    pool = scan.pool(anchored)
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
        owners=scan.owners,
        used_blocks=len(scan.owners),
        shared_blocks=scan.shared_blocks,
        max_block_mass=max((m for m in masses if math.isfinite(m)), default=None) if masses else None,
    )


class _Scan:
    """What a scan finds, before any cell is made.

    The pool's cells before summing up, as parallel arrays (lists or NumPy arrays): each
    cell's first and last block, its used blocks (0: free) and its owners' key (what
    `decode` turns into the owners tuple; a free cell's decodes to ()), with running totals
    of the used blocks and of the owner changes from cell to cell. Each sequence's cells as
    the logical blocks where one starts. `fill(block)`: the slots of a used block that hold
    a token. `cell`, `cell_at` and `pool` make the pool cells that are drawn.
    """

    def __init__(self, *, firsts, lasts, used, keys, used_before, changes_before, decode, fill, starts, owners, shared_blocks, traced):
        self.firsts, self.lasts, self.used, self.keys = firsts, lasts, used, keys
        self.used_before = used_before  # [k]: used blocks in cells 0..k-1
        self.changes_before = changes_before  # [k]: cells j in 1..k whose key differs from cell j-1's
        self.decode: Callable[[Any], tuple[int, ...]] = decode
        self.fill: Callable[[int], int] = fill
        self.starts: list = starts
        self.owners: UsedBlocks = owners
        self.shared_blocks: int = shared_blocks
        self.traced = traced

    def cell_at(self, block: int) -> int:
        """The index of the cell that holds `block`."""
        return bisect.bisect_right(self.firsts, block) - 1

    def cell(self, k: int) -> PoolCell:
        first, last, used = int(self.firsts[k]), int(self.lasts[k]), int(self.used[k])
        if not used:
            return PoolCell(first, last, (), 0)
        t = self.traced
        return PoolCell(
            first=first,
            last=last,
            owners=self.decode(self.keys[k]),
            used=used,
            fill=self.fill(first) if first == last else None,
            traced_slot=t.offset if t is not None and t.physical == first else None,
        )

    def pool(self, anchored: set[int]) -> list[PoolCell]:
        """Every cell; or, in a pool with too many, the cells arrows point to and one
        summary cell for each stretch between them (a stretch of one cell stays itself)."""
        count = len(self.firsts)
        if count <= MAX_POOL_CELLS:
            return [self.cell(k) for k in range(count)]
        out: list[PoolCell] = []
        start = 0
        for k in sorted(anchored):
            self._stretch(start, k - 1, out)
            out.append(self.cell(k))
            start = k + 1
        self._stretch(start, count - 1, out)
        return out

    def _stretch(self, i: int, j: int, out: list[PoolCell]) -> None:
        if j < i:
            return
        if i == j:
            out.append(self.cell(i))
            return
        same = self.changes_before[j] == self.changes_before[i]  # one owners key throughout
        owners = self.decode(self.keys[i]) if same else ()
        out.append(PoolCell(int(self.firsts[i]), int(self.lasts[j]), owners, int(self.used_before[j + 1] - self.used_before[i])))


def _scan_python(view: MappingView, needed: list[int], alone: set[int], collapse: bool, traced: Traced | None) -> _Scan:
    """The scan in plain Python: runs of used blocks with the same owners and runs of free
    blocks (or one cell per block in a small pool), found by walking the used blocks in
    order and stepping over each free run whole; then each table's cell starts."""
    bs, n_pool = view.block_size, view.num_blocks
    owner_sets: dict[int, set[int]] = {}
    fill: dict[int, int] = {}  # physical block -> slots that hold a token (of any sequence)
    for s, (seq, n) in enumerate(zip(view.sequences, needed)):
        for logical, physical in enumerate(seq.table[:n]):
            owner_sets.setdefault(physical, set()).add(s)
            fill[physical] = max(fill.get(physical, 0), min(bs, seq.seq_len - logical * bs))
    owners = {p: tuple(sorted(o)) for p, o in owner_sets.items()}

    firsts: list[int] = []
    lasts: list[int] = []
    counts: list[int] = []
    keys: list[tuple[int, ...]] = []

    def add(first: int, last: int, used: int, key: tuple[int, ...]) -> None:
        firsts.append(first)
        lasts.append(last)
        counts.append(used)
        keys.append(key)

    def free_run(first: int, last: int) -> None:
        if collapse:
            add(first, last, 0, ())
        else:
            for p in range(first, last + 1):
                add(p, p, 0, ())

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
        add(first, last, last - first + 1, key)
        p = last + 1
        i += 1
    if p < n_pool:
        free_run(p, n_pool - 1)

    cell_of: dict[int, int] = {}  # used physical block -> index of its cell
    for index, (first, last, n_used) in enumerate(zip(firsts, lasts, counts)):
        if n_used:
            for b in range(first, last + 1):
                cell_of[b] = index
    starts = []
    for s, n in enumerate(needed):
        table = view.sequences[s].table
        traced_logical = traced.logical if traced is not None and traced.seq == s else -1
        starts.append([
            i
            for i in range(n)
            if not collapse
            or i in (0, n - 1, traced_logical, traced_logical + 1)
            or table[i] != table[i - 1] + 1
            or cell_of[table[i]] != cell_of[table[i - 1]]
        ])
    return _Scan(
        firsts=firsts,
        lasts=lasts,
        used=counts,
        keys=keys,
        used_before=[0, *accumulate(counts)],
        changes_before=[0, *accumulate(a != b for a, b in zip(keys[1:], keys))],
        decode=_same,
        fill=fill.__getitem__,
        starts=starts,
        owners=UsedBlocks(used, [owners[b] for b in used], _same),
        shared_blocks=sum(1 for o in owners.values() if len(o) > 1),
        traced=traced,
    )


def _same(key: tuple[int, ...]) -> tuple[int, ...]:
    return key


def _scan_numpy(view: MappingView, needed: list[int], arrays: list, alone: set[int], traced: Traced | None) -> _Scan:
    """The scan with NumPy, for a big picture (runs collapsed), up to 63 sequences: the
    same cells as `_scan_python`, from sorted arrays. A block's owners are a bit mask.
    Few arrays as long as the tables are made: on a big table each costs more in fresh
    memory than in arithmetic."""
    import numpy as np

    bs, n_pool = view.block_size, view.num_blocks
    if len(arrays) == 1:
        entries = blocks = np.sort(arrays[0])  # every entry, sorted: the used blocks in order
    else:  # every entry as (block << 6 | sequence), sorted: each used block's entries together
        wide = np.int32 if n_pool << 6 <= np.iinfo(np.int32).max else np.int64
        entries = np.concatenate([(a.astype(wide) << 6) | s for s, a in enumerate(arrays)])
        entries.sort()
        blocks = entries >> 6
    repeated = blocks[1:] == blocks[:-1]
    if repeated.any():
        group = np.flatnonzero(np.concatenate(([True], ~repeated)))  # each used block's first entry
        used = blocks[group]
    else:
        group, used = None, blocks
    del repeated
    if len(arrays) == 1:
        masks = np.broadcast_to(np.int64(1), used.shape)
    else:
        bits = np.left_shift(np.int64(1), entries & 63)
        masks = bits if group is None else np.bitwise_or.reduceat(bits, group)
        del bits, blocks
    del entries

    # runs of used blocks: consecutive, the same owners, and no block of `alone` inside one
    breaks = np.empty(len(used), dtype=bool)
    breaks[0] = True
    np.not_equal(used[1:] - 1, used[:-1], out=breaks[1:])
    if len(arrays) > 1:
        breaks[1:] |= masks[1:] != masks[:-1]
    if alone:
        at = np.searchsorted(used, np.array(sorted(int(b) for b in alone), dtype=np.int64))
        breaks[at] = True
        breaks[at[at + 1 < len(used)] + 1] = True
    run = np.flatnonzero(breaks)
    del breaks
    run_first = used[run].astype(np.int64)
    run_last = used[np.append(run[1:], len(used)) - 1].astype(np.int64)
    # the free run before each used run (if any), and after the last
    before = np.concatenate(([-1], run_last[:-1]))
    gap = run_first > before + 1
    at_run = np.arange(len(run)) + np.cumsum(gap)  # the cell index of each used run
    tail = int(run_last[-1]) < n_pool - 1
    count = len(run) + int(gap.sum()) + tail
    firsts = np.empty(count, dtype=np.int64)
    lasts = np.empty(count, dtype=np.int64)
    counts = np.zeros(count, dtype=np.int64)
    keys = np.zeros(count, dtype=np.int64)
    firsts[at_run], lasts[at_run] = run_first, run_last
    counts[at_run] = run_last - run_first + 1
    keys[at_run] = masks[run]
    at_gap = at_run[gap] - 1
    firsts[at_gap], lasts[at_gap] = before[gap] + 1, run_first[gap] - 1
    if tail:
        firsts[-1], lasts[-1] = run_last[-1] + 1, n_pool - 1

    # each table's cell starts: where the next block is not the next physical one, or
    # starts a run of its own; the first, last, traced block and the one after it
    starts = []
    for s, a in enumerate(arrays):
        n = len(a)
        start = np.zeros(n, dtype=bool)
        if n > 1:
            np.not_equal(a[1:] - 1, a[:-1], out=start[1:])
            at = np.flatnonzero(~start[1:]) + 1  # the next physical block: a cell starts if its run does
            if len(at):
                where = np.minimum(np.searchsorted(run_first, a[at]), len(run) - 1)
                start[at[run_first[where] == a[at]]] = True
        start[0] = start[n - 1] = True
        if traced is not None and traced.seq == s:
            start[traced.logical] = True
            if traced.logical + 1 < n:
                start[traced.logical + 1] = True
        starts.append(np.flatnonzero(start))

    lasts_of = [(int(a[-1]), seq.seq_len - (n - 1) * bs) for a, seq, n in zip(arrays, view.sequences, needed)]
    n_entries = sum(needed)

    def fill(block: int) -> int:
        """bs if an entry other than a table's last maps the block, else the fullest last block's fill."""
        mine = [f for last, f in lasts_of if last == block]
        if group is None:
            entries_of = 1
        else:
            i = bisect.bisect_left(used, block)
            entries_of = int(group[i + 1] if i + 1 < len(group) else n_entries) - int(group[i])
        return bs if entries_of > len(mine) else max(mine)

    seqs = range(len(arrays))

    def decode(mask) -> tuple[int, ...]:
        m = int(mask)
        return tuple(s for s in seqs if m >> s & 1)

    return _Scan(
        firsts=firsts,
        lasts=lasts,
        used=counts,
        keys=keys,
        used_before=np.concatenate(([0], np.cumsum(counts))),
        changes_before=np.concatenate(([0], np.cumsum(keys[1:] != keys[:-1]))),
        decode=decode,
        fill=fill,
        starts=starts,
        owners=UsedBlocks(used, masks, decode),
        shared_blocks=0 if len(arrays) == 1 else int(np.count_nonzero(masks & (masks - 1))),
        traced=traced,
    )


def _sequence_cells(view: MappingView, s: int, n: int, starts, traced: Traced | None, limit: int) -> list[LogicalCell]:
    """A sequence's cells from where they start; a long one keeps its head, its tail and
    the traced cell (with a neighbour each side), and one elided cell per gap."""
    table = view.sequences[s].table
    traced_logical = traced.logical if traced is not None and traced.seq == s else -1
    count = len(starts)

    def cell(k: int) -> LogicalCell:
        first = int(starts[k])
        last = int(starts[k + 1]) - 1 if k + 1 < count else n - 1
        return _logical_cell(view, s, first, last, physical=table[first], traced=first == traced_logical)

    if count <= limit:
        return [cell(k) for k in range(count)]
    keep = set(range(limit // 2)) | set(range(count - SEQ_TAIL_CELLS, count))
    if traced_logical >= 0:
        t = bisect.bisect_left(starts, traced_logical)
        keep |= {t - 1, t, t + 1}
    out: list[LogicalCell] = []
    after = 0  # the first cell not yet drawn or elided
    for k in sorted(k for k in keep if 0 <= k < count):
        if k > after:
            out.append(_elided_cell(view, s, starts, after, k - 1))
        out.append(cell(k))
        after = k + 1
    return out


def _logical_cell(view: MappingView, s: int, first: int, last: int, physical: int, traced: bool) -> LogicalCell:
    seq, bs = view.sequences[s], view.block_size
    last_token = min((last + 1) * bs, seq.seq_len) - 1
    mass = None if seq.attention_mass is None else float(sum(seq.attention_mass[first : last + 1]))
    return LogicalCell(s, first, last, physical, first * bs, last_token, last_token - last * bs + 1, mass, traced)


def _elided_cell(view: MappingView, s: int, starts, i: int, j: int) -> LogicalCell:
    """Cells i..j (not the last) as one elided cell; its mass sums theirs, cell by cell."""
    seq, bs = view.sequences[s], view.block_size
    first, last = int(starts[i]), int(starts[j + 1]) - 1
    last_token = min((last + 1) * bs, seq.seq_len) - 1
    mass = None
    if seq.attention_mass is not None:
        bounds = [int(b) for b in starts[i : j + 2]]
        mass = float(sum(float(sum(seq.attention_mass[a:b])) for a, b in zip(bounds, bounds[1:])))
    return LogicalCell(s, first, last, -1, first * bs, last_token, last_token - last * bs + 1, mass, elided=True)
