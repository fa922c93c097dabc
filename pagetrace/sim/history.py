"""The run step by step, for `simulate --html`: what changed in the block tables, and the pool by state.

`TableHistory.record` reads the policy after each step, where `simulate(tables_at=...)` takes its
copies of the tables (`--at N`), so the tables rebuilt from the changes at step N are `--at N`'s.
A change is small: a table that grew by its tail records the tail only; any other change records
the whole table; a request that holds no table any more is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class TableHistory:
    index: dict[str, int]  # request id -> its position in the run's requests
    changes: list[dict] = field(default_factory=list)  # per step: {"drop": [i], "add": [[i, blocks]], "set": [[i, blocks]]}
    pool: list[tuple[int, int, int, int]] = field(default_factory=list)  # per step: free, used, cached, shared
    _last: dict[str, list[int]] = field(default_factory=dict)

    def record(self, policy) -> None:
        now = policy.req_to_blocks
        last, index = self._last, self.index
        change: dict = {}
        for rid in [r for r in last if r not in now]:
            change.setdefault("drop", []).append(index[rid])
            del last[rid]
        for rid, blocks in now.items():
            before = last.get(rid)
            if before is not None and len(blocks) >= len(before) and blocks[: len(before)] == before:
                if len(blocks) > len(before):
                    change.setdefault("add", []).append([index[rid], blocks[len(before):]])
            elif before is not None or blocks:
                change.setdefault("set", []).append([index[rid], list(blocks)])
            else:
                continue
            last[rid] = list(blocks)
        self.changes.append(change)
        self.pool.append(pool_states(policy.pool))


def pool_states(pool) -> tuple[int, int, int, int]:
    """(free, used, cached, shared) over the usable blocks (block 0 is the null block): the
    pictures' rule (sim/run.py `occupancy_row`): cached = no reference but still hashed; used = one
    or more references, shared = more than one. `free` here counts free blocks that hold no hash."""
    ref, hashes = pool.ref_cnt, pool.block_hash
    n = pool.num_blocks - 1
    unreferenced = ref.count(0) - (ref[0] == 0)
    used = n - unreferenced
    shared = used - (ref.count(1) - (ref[0] == 1))
    cached = sum(1 for r, h in zip(ref[1:], hashes[1:]) if r == 0 and h is not None) if len(hashes) - hashes.count(None) else 0
    return unreferenced - cached, used, cached, shared
