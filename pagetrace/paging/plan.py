"""Plan a run's block tables and pool before anything is allocated. Plain Python.

Given each sequence's length and, optionally, its block table, `plan_tables` checks
the tables (or makes them) and sizes the pool. With no table, sequence 0 starts with
the worked example's [7, 2, 15] and every table goes on with free blocks drawn by a
seeded shuffle, so the same flags always give the same mapping.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from ..errors import UsageError
from .blocks import MAX_BLOCK_SIZE, MAX_BLOCKS, MAX_SEQS, MAX_TOKENS, blocks_needed, cdiv, check_size, check_table

WORKED_EXAMPLE_TABLE = [7, 2, 15]
WORKED_EXAMPLE_POOL = 16


@dataclass
class Plan:
    seq_lens: list[int]
    tables: list[list[int]]
    num_blocks: int
    block_size: int
    # physical block -> how many sequences map it (only blocks used by >= 2)
    shared: dict[int, int] = field(default_factory=dict)
    # human-readable problems that do not stop the run (a block twice in one sequence)
    warnings: list[str] = field(default_factory=list)

    @property
    def max_blocks(self) -> int:
        return max(len(t) for t in self.tables)


def plan_tables(
    seq_lens: list[int],
    tables: list[list[int]] | None,
    block_size: int,
    num_blocks: int | None = None,
    seed: int = 0,
) -> Plan:
    check_size("--block-size", block_size, MAX_BLOCK_SIZE)
    text = ",".join(map(str, seq_lens))
    if not seq_lens:
        raise UsageError("--tokens", "", "give at least one sequence length")
    if len(seq_lens) > MAX_SEQS:
        raise UsageError("--tokens", f"{len(seq_lens)} sequences", f"at most {MAX_SEQS:,} sequences")
    for n in seq_lens:
        if not 1 <= n <= MAX_TOKENS:
            raise UsageError("--tokens", text, f"sequence length {n} must be in 1..{MAX_TOKENS:,}")
    if num_blocks is not None:
        check_size("--num-blocks", num_blocks, MAX_BLOCKS)
    needed = [blocks_needed(n, block_size) for n in seq_lens]
    if sum(needed) > MAX_BLOCKS and tables is None:
        raise UsageError(
            "--tokens", text, f"needs {sum(needed):,} blocks of {block_size} tokens; pools have at most {MAX_BLOCKS:,} blocks"
        )
    if tables is not None:
        made = _check_given(seq_lens, tables, needed, block_size, num_blocks)
        pool = num_blocks if num_blocks is not None else max(WORKED_EXAMPLE_POOL, max(max(t) for t in made) + 1)
    else:
        pool = num_blocks if num_blocks is not None else _default_pool(sum(needed))
        if sum(needed) > pool:
            raise UsageError(
                "--num-blocks", pool, f"the sequences need {sum(needed)} blocks of {block_size} tokens; the pool has {pool}"
            )
        made = _draw_tables(needed, pool, seed)
    plan = Plan(list(seq_lens), made, pool, block_size)
    if tables is None:
        return plan  # drawn tables are disjoint: nothing shared, nothing repeated
    counts = Counter(p for t, n in zip(made, needed) for p in set(t[:n]))
    plan.shared = {p: c for p, c in sorted(counts.items()) if c > 1}
    for s, (t, n) in enumerate(zip(made, needed)):
        repeats = sorted(p for p, c in Counter(t[:n]).items() if c > 1)
        if repeats:
            plan.warnings.append(
                f"sequence {s} maps physical block(s) {repeats} more than once: its tokens overwrite each other in the cache"
            )
    return plan


def _default_pool(total_needed: int) -> int:
    if total_needed <= WORKED_EXAMPLE_POOL:
        return WORKED_EXAMPLE_POOL
    return min(MAX_BLOCKS, 16 * cdiv(cdiv(total_needed * 5, 4), 16))  # 25% free, rounded up to 16 blocks


def _draw_tables(needed: list[int], pool: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = WORKED_EXAMPLE_TABLE if pool >= WORKED_EXAMPLE_POOL else []
    tables = [list(prefix[:n]) if s == 0 else [] for s, n in enumerate(needed)]
    taken = {b for t in tables for b in t}
    missing = sum(needed) - len(taken)
    # a seeded sample of the pool, not a shuffle of it: the work follows the blocks drawn
    free = [b for b in rng.sample(range(pool), missing + len(taken)) if b not in taken][:missing]
    for table, n in zip(tables, needed):
        take = n - len(table)
        table.extend(free[:take])
        del free[:take]
    return tables


def _check_given(
    seq_lens: list[int], tables: list[list[int]], needed: list[int], block_size: int, num_blocks: int | None
) -> list[list[int]]:
    if len(tables) != len(seq_lens):
        raise UsageError(
            "--table", " ".join(",".join(map(str, t)) for t in tables),
            f"{len(tables)} table(s) for {len(seq_lens)} sequence(s) in --tokens; give one --table per sequence",
        )
    for s, (table, n, need) in enumerate(zip(tables, seq_lens, needed)):
        text = ",".join(map(str, table))
        if len(table) < need:
            raise UsageError(
                "--table", text, f"sequence {s} has {n} tokens, which need {need} blocks of {block_size}; the table has {len(table)}"
            )
        check_table(table, num_blocks, allow_repeats=True)
    return [list(t) for t in tables]


def cache_bytes(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, element_size: int) -> int:
    """Bytes of the key cache plus the value cache."""
    return 2 * num_blocks * block_size * num_kv_heads * head_dim * element_size


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
