"""The run step by step, for `simulate --html`: what changed in the block tables, and the pool by state.

`TableHistory.record` reads the policy after each step, where `simulate(tables_at=...)` takes its
copies of the tables (`--at N`), so the tables rebuilt from the changes at step N are `--at N`'s.
A change is small: a table that grew by its tail records the tail only; any other change records
the whole table; a request that holds no table any more is dropped.

The pool by state costs a pass over the pool, so it is counted at every `stride`-th step only:
the stride starts at 1 and doubles (dropping every other count) whenever more than `2 * keep`
counts are held, so a long run keeps between `keep` and `2 * keep` steps, evenly spaced, and the
page's slider holds those. A pool over EXACT_POOL_BLOCKS is not counted here at all (a pass over
a million blocks at a thousand steps is most of a minute): the page counts used and shared blocks
from the tables instead (page/sim_data.py), and not the cached ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EXACT_POOL_BLOCKS = 1 << 16  # pools up to this size are counted block by block (a Python pass)


@dataclass(slots=True)
class TableHistory:
    index: dict[str, int]  # request id -> its position in the run's requests
    keep: int = 1000
    changes: list[dict] = field(default_factory=list)  # per step: {"drop": [i], "add": [[i, blocks]], "set": [[i, blocks]]}
    pool: dict[int, tuple] = field(default_factory=dict)  # step index -> (free, used, cached, shared), every stride-th step
    stride: int = 1
    # step index -> the blocks that gained a hash (or another one) and those that lost theirs since the last counted step,
    # at the counted steps: with the tables, the page knows each block's state (cached = hashed, no table holds it)
    hashes: dict[int, tuple[list, list]] = field(default_factory=dict)
    _last: dict[str, list[int]] = field(default_factory=dict)
    _hashed: dict[int, int] = field(default_factory=dict)
    _pending: tuple | None = None  # the hash changes of a dropped count, not yet carried onto a later one

    def record(self, policy) -> None:
        now = policy.req_to_blocks
        last, index = self._last, self.index
        change: dict = {}
        for rid in [r for r in last if r not in now]:
            change.setdefault("drop", []).append(index[rid])
            del last[rid]
        for rid, blocks in now.items():
            before = last.get(rid)
            if blocks == before:  # most steps leave most tables as they were (one C-level compare)
                continue
            if before is not None and len(blocks) > len(before) and blocks[: len(before)] == before:
                tail = blocks[len(before):]
                change.setdefault("add", []).append([index[rid], tail])
                before.extend(tail)
                continue
            if before is None and not blocks:
                continue
            change.setdefault("set", []).append([index[rid], list(blocks)])
            last[rid] = list(blocks)
        i = len(self.changes)
        self.changes.append(change)
        if i % self.stride == 0 and policy.pool.num_blocks <= EXACT_POOL_BLOCKS:
            self._count(i, policy.pool)
            if len(self.pool) > 2 * self.keep:
                self.stride *= 2
                drop = [k for k in self.pool if k % self.stride]
                for k in drop:  # its hash changes move on to the next counted step
                    del self.pool[k]
                    added, lost = self.hashes.pop(k)
                    later = min((j for j in self.hashes if j > k), default=None)
                    if later is None:
                        self._pending = (added, lost)
                    else:
                        self.hashes[later] = merge_hashes((added, lost), self.hashes[later])

    def close(self, policy) -> None:
        """After the run: the last step counted too (if it was not), so the page reaches it."""
        last = len(self.changes) - 1
        if last >= 0 and last not in self.pool and policy.pool.num_blocks <= EXACT_POOL_BLOCKS:
            self._count(last, policy.pool)

    def _count(self, i: int, pool) -> None:
        self.pool[i] = pool_states(pool)
        now = {b: h for b, h in enumerate(pool.block_hash) if h is not None and b}
        before = self._hashed
        added = [[b, h] for b, h in now.items() if before.get(b) != h]
        lost = [b for b in before if b not in now]
        self._hashed = now
        if self._pending is not None:
            added, lost = merge_hashes(self._pending, (added, lost))
            self._pending = None
        self.hashes[i] = (added, lost)


def merge_hashes(first: tuple[list, list], then: tuple[list, list]) -> tuple[list, list]:
    """Two hash changes, one after the other, as one."""
    state: dict[int, object] = {}
    for added, lost in (first, then):
        for b in lost:
            state[b] = None
        for b, h in added:
            state[b] = h
    return [[b, h] for b, h in state.items() if h is not None], [b for b, h in state.items() if h is None]


def pool_states(pool) -> tuple[int, int, int, int]:
    """(free, used, cached, shared) over the usable blocks (block 0 is the null block), by the
    pictures' rule (sim/run.py `occupancy_row`): cached = no reference but still hashed (a prefix
    hit can take it back), used = one reference or more, shared = more than one; `free` counts
    the unreferenced blocks that hold no hash."""
    ref, hashes = pool.ref_cnt, pool.block_hash
    n = pool.num_blocks - 1
    # vLLM's free queue holds exactly the unreferenced blocks (blockpool.py); SGLang's leaves out the tree's
    unreferenced = pool.num_free if hasattr(pool, "queue") else ref.count(0) - (ref[0] == 0)
    used = n - unreferenced
    shared = used - (ref.count(1) - (ref[0] == 1))
    cached = sum(1 for r, h in zip(ref[1:], hashes[1:]) if r == 0 and h is not None) if len(hashes) - hashes.count(None) else 0
    return unreferenced - cached, used, cached, shared
