"""Block-table arithmetic: the two-level lookup of PagedAttention, in plain Python.

A sequence's tokens live in fixed-size blocks. Its block table maps each *logical*
block (the i-th block of the sequence) to a *physical* block in the shared pool:

    logical_block  = token // block_size
    offset         = token %  block_size
    physical_block = block_table[logical_block]
    slot           = physical_block * block_size + offset

Everything here is importable without torch or triton; the CLI, the kernel's
launcher, its trace check and the diagrams all use these functions.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import UsageError

_ENTRY = re.compile(r"-?[0-9]+")

# Bounds on sizes, so that a typo is refused at once instead of hanging or exhausting
# memory: far above any real cache (an H200 holds about 2.2M blocks of 16 tokens x 8 KV
# heads x 128 dims in fp16), far below what would stall a Python loop.
MAX_BLOCKS = 1 << 22
MAX_BLOCK_SIZE = 1 << 16
MAX_HEAD_DIM = 1 << 14
MAX_HEADS = 1 << 12
MAX_SEQS = 65535  # a CUDA grid's y and z axes stop there
MAX_TOKENS = 2**31 - 1  # seq_lens are int32


class TokenLocation(NamedTuple):
    """Where one token of a sequence lives in the paged cache."""

    token: int
    block_size: int
    logical_block: int  # token // block_size: which entry of the block table
    offset: int  # token % block_size: position inside the block
    physical_block: int  # block_table[logical_block]
    slot: int  # physical_block * block_size + offset: flat index over all slots


class BlockSpan(NamedTuple):
    """One logical block of a sequence and the tokens it holds."""

    logical_block: int
    physical_block: int
    first_token: int
    last_token: int  # inclusive

    @property
    def used(self) -> int:
        return self.last_token - self.first_token + 1


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_size(option: str, value: int, limit: int) -> int:
    """A count that must lie in 1..limit."""
    if value < 1:
        raise UsageError(option, value, "must be at least 1")
    if value > limit:
        raise UsageError(option, value, f"must be at most {limit:,}")
    return value


def parse_int_list(text: str, option: str) -> list[int]:
    """Parse a comma-separated list of integers such as ``7,2,15``.

    Spaces, empty entries and anything that is not an integer are refused, so a typo
    never silently becomes a different table.
    """
    if text == "" or text.strip() == "":
        raise UsageError(option, text, "is empty; give comma-separated integers such as 7,2,15")
    if any(ch.isspace() for ch in text):
        raise UsageError(option, text, "contains spaces; write it as comma-separated integers without spaces, such as 7,2,15")
    entries = text.split(",")
    for position, entry in enumerate(entries):
        if entry == "":
            raise UsageError(option, text, f"entry {position} is empty; write comma-separated integers such as 7,2,15")
        if not _ENTRY.fullmatch(entry):
            raise UsageError(option, text, f"entry {position} ({entry!r}) is not an integer")
    return [int(entry) for entry in entries]


def check_table(table: list[int], num_blocks: int | None, option: str = "--table", allow_repeats: bool = False) -> list[int]:
    """Refuse tables no allocator could have produced: negative entries, entries outside
    the pool, and (unless `allow_repeats`) a physical block used twice by one sequence."""
    text = ",".join(map(str, table))
    if not table:
        raise UsageError(option, text, "the block table is empty")
    seen: dict[int, int] = {}
    if len(table) > MAX_BLOCKS:
        raise UsageError(option, f"{len(table)} entries", f"a table has at most {MAX_BLOCKS:,} entries")
    for logical, physical in enumerate(table):
        if physical < 0:
            raise UsageError(option, text, f"entry {logical} is {physical}; physical block numbers are >= 0")
        if num_blocks is None and physical >= MAX_BLOCKS:
            raise UsageError(option, text, f"entry {logical} is physical block {physical}; pools have at most {MAX_BLOCKS:,} blocks")
        if num_blocks is not None and physical >= num_blocks:
            raise UsageError(
                option, text, f"entry {logical} is physical block {physical}, but the pool has {num_blocks} blocks (0..{num_blocks - 1}); raise --num-blocks"
            )
        if physical in seen and not allow_repeats:
            raise UsageError(
                option, text, f"physical block {physical} appears twice (logical blocks {seen[physical]} and {logical}); one sequence cannot own a block twice"
            )
        seen[physical] = logical
    return table


def capacity(table: list[int], block_size: int) -> int:
    """How many tokens a block table can hold."""
    return len(table) * block_size


def locate(token: int, table: list[int], block_size: int, option: str = "--token") -> TokenLocation:
    """The two-level lookup for one token."""
    cap = capacity(table, block_size)
    if token < 0 or token >= cap:
        raise UsageError(
            option, token, f"the table holds tokens 0..{cap - 1} ({len(table)} blocks x {block_size} tokens = capacity {cap})"
        )
    logical_block, offset = divmod(token, block_size)
    physical_block = table[logical_block]
    return TokenLocation(
        token=token,
        block_size=block_size,
        logical_block=logical_block,
        offset=offset,
        physical_block=physical_block,
        slot=physical_block * block_size + offset,
    )


def blocks_needed(seq_len: int, block_size: int) -> int:
    return cdiv(seq_len, block_size)


def coverage(seq_len: int, table: list[int], block_size: int) -> list[BlockSpan]:
    """Which tokens each logical block of a ``seq_len``-token sequence holds."""
    spans = []
    for logical in range(blocks_needed(seq_len, block_size)):
        first = logical * block_size
        spans.append(BlockSpan(logical, table[logical], first, min(first + block_size, seq_len) - 1))
    return spans


def slot_mapping(seq_len: int, table: list[int], block_size: int) -> list[int]:
    """The physical slot of every token of a sequence, in token order."""
    return [table[t // block_size] * block_size + t % block_size for t in range(seq_len)]
