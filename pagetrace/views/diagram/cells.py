"""The cells model: `layout_cells` turns a `MappingView` into the `Cells` that are drawn.

Each sequence's logical cells, the pool's cells and the arrows between them, with runs
collapsed, long tables elided, unreferenced stretches of a long pool summed up, and many
sequences summed up too: up to MAX_SEQUENCES are drawn (the traced one, the largest, then
those that share blocks, then the first), the others become one summary cell.

One scan, in plain Python, finds the structure; the work grows with the blocks the
sequences use, never with the pool, and Python objects are made only for the cells drawn:

- the used blocks in order with their owners, then the runs of consecutive used blocks with
  the same owners (the free cells are the gaps between runs, never listed);
- each drawn sequence's cells as the logical blocks where a cell starts.

There is no NumPy scan: a small diagram (`lookup`'s terminal map) must not pay NumPy's import,
and one implementation is one to test. The passes over every entry run inside built-ins.
"""

from __future__ import annotations

import bisect
import math
import operator
from itertools import compress

from ...errors import UsageError
from ...paging.blocks import blocks_needed
from .model import (
    AUTO_SLOTS_BLOCK_SIZE,
    MAX_POOL_CELLS,
    MAX_SEQ_CELLS,
    MAX_SEQUENCES,
    MAX_SLOTS_BLOCK_SIZE,
    SEQ_TAIL_CELLS,
    SMALL,
    Cells,
    HiddenSequences,
    LogicalCell,
    MappingView,
    PoolCell,
    SequenceMap,
    Traced,
    UsedBlocks,
)

# -- checks -----------------------------------------------------------------------


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
    for seq in view.sequences:
        if seq.seq_len < 1:
            raise UsageError("--tokens", seq.seq_len, f"{seq.name}: a sequence holds at least 1 token")
        n = blocks_needed(seq.seq_len, bs)
        if len(seq.table) < n:
            raise UsageError("--table", _table_text(seq), f"{seq.name} has {seq.seq_len} tokens, which need {n} blocks of {bs}; the table has {len(seq.table)}")
        used = seq.table if len(seq.table) == n else seq.table[:n]
        low, high = min(used), max(used)
        if low < 0 or high >= view.num_blocks:
            bad = low if low < 0 else high
            _entry_out_of_range(view, seq, used.index(bad))
        for name, per_block in (("attention_mass", seq.attention_mass), ("masked", seq.masked)):
            if per_block is not None and len(per_block) < n:
                raise ValueError(f"{seq.name}: {name} has {len(per_block)} entries for {n} logical blocks")
        needed.append(n)
    if view.show_slots and bs > MAX_SLOTS_BLOCK_SIZE:
        raise UsageError("--slots", bs, f"slots are drawn for block sizes up to {MAX_SLOTS_BLOCK_SIZE}; use --no-slots")
    _traced(view)  # the highlighted --seq/--token exist
    return needed


def _table_text(seq: SequenceMap) -> str:
    return ",".join(map(str, seq.table))


def _entry_out_of_range(view: MappingView, seq: SequenceMap, logical: int) -> None:
    physical = seq.table[logical]
    raise UsageError("--table", _table_text(seq), f"{seq.name}: entry {logical} is physical block {physical}; the pool has blocks 0..{view.num_blocks - 1}")


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


def layout_cells(view: MappingView, max_seq_cells: int = MAX_SEQ_CELLS, max_sequences: int = MAX_SEQUENCES) -> Cells:
    """The cells and arrows to draw, with runs collapsed, long tables elided and, past
    `max_sequences`, the sequences not picked summed up."""
    needed = check_view(view)
    traced = _traced(view)
    small = view.num_blocks <= SMALL and max(needed) <= SMALL
    slots = _auto_slots(view, small)
    scan = _Scan(view, needed, collapse=not small, traced=traced)
    drawn = _pick_sequences(view, traced, scan.sharing, max_sequences)

    # blocks that get a pool cell of their own: the traced one, and with slots each drawn last block
    alone = set() if traced is None else {traced.physical}
    if slots:  # a sequence's last block shows its fill in its slots
        alone |= {view.sequences[s].table[needed[s] - 1] for s in drawn}
    scan.find_cells(alone)

    sequences: list[list[LogicalCell]] = [[] for _ in view.sequences]
    for s in drawn:
        sequences[s] = _sequence_cells(view, s, needed[s], scan.starts(s), traced, max_seq_cells)
    anchored = {scan.run_at(c.physical) for s in drawn for c in sequences[s] if not c.elided}
    pool = scan.pool(anchored)
    firsts = [cell.first for cell in pool]
    edges = [(c, pool[bisect.bisect_right(firsts, c.physical) - 1]) for s in drawn for c in sequences[s] if not c.elided]
    masses = [m for seq, n in zip(view.sequences, needed) if seq.attention_mass is not None for m in seq.attention_mass[:n]]
    return Cells(
        view=view,
        needed=needed,
        sequences=sequences,
        drawn=drawn,
        hidden=_hidden(view, needed, drawn, scan.sharing),
        pool=pool,
        edges=edges,
        slots=slots,
        traced=traced,
        owners=scan.owners,
        used_blocks=len(scan.owners),
        shared_blocks=scan.shared_blocks,
        max_block_mass=max((m for m in masses if math.isfinite(m)), default=None) if masses else None,
    )


def _pick_sequences(view: MappingView, traced: Traced | None, sharing: set[int], limit: int) -> list[int]:
    """The sequences drawn: all up to `limit`; else the traced one, the largest, those
    that share a block with another sequence, then the first ones, in index order."""
    count = len(view.sequences)
    if count <= limit:
        return list(range(count))
    picked: dict[int, None] = {}
    if traced is not None:
        picked[traced.seq] = None
    picked[max(range(count), key=lambda s: view.sequences[s].seq_len)] = None
    for s in sorted(sharing):
        if len(picked) >= limit:
            break
        picked[s] = None
    s = 0
    while len(picked) < limit:
        picked[s] = None
        s += 1
    return sorted(picked)


def _hidden(view: MappingView, needed: list[int], drawn: list[int], sharing: set[int]) -> HiddenSequences | None:
    shown = set(drawn)
    hidden = [s for s in range(len(view.sequences)) if s not in shown]
    if not hidden:
        return None
    return HiddenSequences(
        count=len(hidden),
        tokens=sum(view.sequences[s].seq_len for s in hidden),
        blocks=sum(needed[s] for s in hidden),
        shared=sum(1 for s in hidden if s in sharing),
    )


class _Scan:
    """One pass over the tables: the used blocks in order with their owners (one tuple
    object per distinct set of owners), then the runs of used blocks with the same owners
    (`find_cells`); free cells are the gaps between runs. `starts(s)`: where sequence s's
    cells start. `pool` makes the pool cells that are drawn; a stretch between them is
    summed up from the runs' positions in the used blocks, which count the blocks before.

    The loops over every entry run inside built-ins (dict.fromkeys, sorted, map,
    compress), so a table of half a million blocks scans in a fraction of a second
    without NumPy; Python-level loops run per run of blocks or per shared entry."""

    def __init__(self, view: MappingView, needed: list[int], collapse: bool, traced: Traced | None):
        self.view, self.needed, self.collapse, self.traced = view, needed, collapse, traced
        bs = view.block_size
        self._partial: dict[int, int] = {}  # a table's last block -> the most slots a table fills in it
        for seq, n in zip(view.sequences, needed):
            last = seq.table[n - 1]
            self._partial[last] = max(self._partial.get(last, 0), seq.seq_len - (n - 1) * bs)
        shared: dict[int, list[int]] = {}  # a block several sequences map -> them, in order
        interned: dict[tuple[int, ...], tuple[int, ...]] = {}
        if len(view.sequences) == 1:  # one owner: the used blocks are the table's distinct entries
            seq, n = view.sequences[0], needed[0]
            self._used = used = sorted(set(seq.table if len(seq.table) == n else seq.table[:n]))
            keys = [(0,)] * len(used)
        else:
            singles = [(s,) for s in range(len(view.sequences))]
            key_of: dict[int, tuple[int, ...]] = {}  # used block -> its owners (the first one's, until shared)
            for s, (seq, n) in enumerate(zip(view.sequences, needed)):
                mine = dict.fromkeys(seq.table if len(seq.table) == n else seq.table[:n], singles[s])
                if key_of and not key_of.keys().isdisjoint(mine):
                    for p in mine.keys() & key_of.keys():
                        shared.setdefault(p, list(key_of[p])).append(s)
                        del mine[p]
                key_of.update(mine)
            for p, owners in shared.items():
                t = tuple(owners)
                key_of[p] = interned.setdefault(t, t)
            self._used = used = sorted(key_of)
            keys = list(map(key_of.__getitem__, used))
            del key_of
        self._keys = keys
        self.owners = UsedBlocks(used, keys)
        self.shared_blocks = len(shared)
        self.sharing: set[int] = set().union(*interned)

    def find_cells(self, alone: set[int]) -> None:
        """The runs of used blocks (the pool's used cells before summing up); the blocks of
        `alone` get a run each. Free cells are the gaps between runs, never listed."""
        used, keys, n_used = self._used, self._keys, len(self._used)
        if self.collapse:  # a run breaks where the next block does not follow or its owners change
            breaks = map(operator.or_, map((1).__ne__, map(operator.sub, used[1:], used[:-1])), map(operator.is_not, keys[1:], keys[:-1]))
            runs = [0, *compress(range(1, n_used), breaks)]
            for b in alone:  # a cell of its own: break before it and after it
                i = bisect.bisect_left(used, b)
                for at in (i, i + 1):
                    k = bisect.bisect_left(runs, at)
                    if 0 < at < n_used and (k == len(runs) or runs[k] != at):
                        runs.insert(k, at)
        else:
            runs = list(range(n_used))
        self.runs = runs + [n_used]  # run r: used[runs[r]:runs[r + 1]], so runs[r] used blocks come before it
        self.run_first = list(map(used.__getitem__, runs))
        self.run_last = list(map(used.__getitem__, map(operator.sub, runs[1:] + [n_used], [1] * len(runs))))
        # runs that start right after a used block: where a table going on to the next block
        # still starts a new cell (its owners change, or a block of `alone`); few, usually
        rf, rl = self.run_first, self.run_last
        self._first_set = set(compress(rf[1:], map(operator.eq, rf[1:], map(operator.add, rl[:-1], [1] * (len(rf) - 1)))))

    def starts(self, s: int) -> list[int]:
        """The logical blocks of sequence s where a cell starts: where the next physical
        block does not follow, or starts a pool cell; the first, last, traced and the next."""
        table, n = self.view.sequences[s].table[: self.needed[s]], self.needed[s]
        if not self.collapse:
            return list(range(n))
        jumps = map((1).__ne__, map(operator.sub, table[1:], table[:-1]))
        out = [0, *compress(range(1, n), map(operator.or_, jumps, map(self._first_set.__contains__, table[1:])))]
        t = self.traced.logical if self.traced is not None and self.traced.seq == s else -1
        for i in (t, t + 1, n - 1):
            k = bisect.bisect_left(out, i)
            if 0 < i < n and (k == len(out) or out[k] != i):
                out.insert(k, i)
        return out

    def fill(self, block: int) -> int:
        """The slots of a used block that hold a token: full unless it is only ever a table's last block."""
        partial = self._partial.get(block)
        if partial is None or partial == self.view.block_size:
            return self.view.block_size
        for s in self.owners[block]:  # mapped before the last entry of some table: full
            if block in self.view.sequences[s].table[: self.needed[s] - 1]:
                return self.view.block_size
        return partial

    def run_at(self, block: int) -> int:
        """The run that holds the used `block`."""
        return bisect.bisect_right(self.run_first, block) - 1

    def run_cell(self, r: int) -> PoolCell:
        first, last = self.run_first[r], self.run_last[r]
        t = self.traced
        return PoolCell(
            first=first,
            last=last,
            owners=self._keys[self.runs[r]],
            used=last - first + 1,
            fill=self.fill(first) if first == last else None,
            traced_slot=t.offset if t is not None and t.physical == first else None,
        )

    def _cells(self, a: int, b: int, out: list[PoolCell]) -> None:
        """Every cell from the end of run a to the start of run b (a = -1: the pool's
        start; b = the run count: its end), the runs between and the free gaps."""
        p = self.run_last[a] + 1 if a >= 0 else 0
        for r in range(a + 1, b):
            self._free(p, self.run_first[r] - 1, out)
            out.append(self.run_cell(r))
            p = self.run_last[r] + 1
        self._free(p, (self.run_first[b] if b < len(self.run_first) else self.view.num_blocks) - 1, out)

    def _free(self, first: int, last: int, out: list[PoolCell]) -> None:
        """Free blocks first..last: one cell, or one per block in a small pool."""
        if self.collapse:
            out.extend([PoolCell(first, last, (), 0)] if first <= last else [])
        else:
            out.extend(PoolCell(p, p, (), 0) for p in range(first, last + 1))

    def pool(self, anchored: set[int]) -> list[PoolCell]:
        """Every cell; or, in a pool with too many, the runs arrows point to and one
        summary cell for each stretch between them (a stretch of one cell stays itself)."""
        count = len(self.run_first)
        gaps = sum(map(operator.lt, map(operator.add, [-1, *self.run_last], [1] * (count + 1)), [*self.run_first, self.view.num_blocks]))
        out: list[PoolCell] = []
        if count + gaps <= MAX_POOL_CELLS:
            self._cells(-1, count, out)
            return out
        previous = -1
        for r in [*sorted(anchored), count]:
            self._stretch(previous, r, out)
            if r < count:
                out.append(self.run_cell(r))
            previous = r
        return out

    def _stretch(self, a: int, b: int, out: list[PoolCell]) -> None:
        """The blocks between run a and run b as one cell, or as the one cell they are."""
        first = self.run_last[a] + 1 if a >= 0 else 0
        last = (self.run_first[b] if b < len(self.run_first) else self.view.num_blocks) - 1
        if last < first:
            return
        used = self.runs[b] - self.runs[a + 1]
        runs = b - a - 1
        gapless = used == last - first + 1
        if runs == 0 or (runs == 1 and gapless):  # one free gap, or one run: the cell itself
            self._cells(a, b, out)
            return
        key = self._keys[self.runs[a + 1]]
        same = gapless and all(self._keys[self.runs[r]] is key for r in range(a + 2, b))
        out.append(PoolCell(first, last, key if same else (), used))


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
    causal, window = _masked(seq, first, last)
    return LogicalCell(s, first, last, physical, first * bs, last_token, last_token - last * bs + 1, mass, traced,
                       causal=causal, window=window)


def _masked(seq: SequenceMap, first: int, last: int) -> tuple[int, int]:
    """Keys of logical blocks first..last the query does not see: (causal, window)."""
    if seq.masked is None:
        return 0, 0
    run = seq.masked[first : last + 1]
    return sum(c for c, _ in run), sum(w for _, w in run)


def _elided_cell(view: MappingView, s: int, starts, i: int, j: int) -> LogicalCell:
    """Cells i..j (not the last) as one elided cell; its mass sums theirs, cell by cell."""
    seq, bs = view.sequences[s], view.block_size
    first, last = int(starts[i]), int(starts[j + 1]) - 1
    last_token = min((last + 1) * bs, seq.seq_len) - 1
    mass = None
    if seq.attention_mass is not None:
        bounds = [int(b) for b in starts[i : j + 2]]
        mass = float(sum(float(sum(seq.attention_mass[a:b])) for a, b in zip(bounds, bounds[1:])))
    causal, window = _masked(seq, first, last)
    return LogicalCell(s, first, last, -1, first * bs, last_token, last_token - last * bs + 1, mass, elided=True,
                       causal=causal, window=window)
