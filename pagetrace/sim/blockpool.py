"""The block pool of vLLM V1: a free-block queue in eviction order, reference counts, hashes.

A line-by-line model of `vllm/v1/core/block_pool.py` (`BlockPool`) and
`vllm/v1/core/kv_cache_utils.py` (`FreeKVCacheBlockQueue`), vLLM 0.32.0. Blocks are
plain ints; per-block state lives in flat lists so a 1M-block pool costs a few lists,
not a million objects. The queue is the same doubly linked list vLLM keeps, with a
fake head and tail (here the ids `num_blocks` and `num_blocks + 1`).
"""

from __future__ import annotations

from collections.abc import Iterable


class FreeBlockQueue:
    """Free blocks in eviction order: the head is reused (and evicted) first.

    Starts in block-id order (kv_cache_utils.py `FreeKVCacheBlockQueue.__init__`).
    `remove` takes a block out of the middle in O(1): a prefix-cache hit on a free block.
    """

    __slots__ = ("prev", "next", "head", "tail", "num_free")

    def __init__(self, num_blocks: int) -> None:
        self.head, self.tail = num_blocks, num_blocks + 1
        # prev[b] / next[b]: neighbours of b while it is in the queue, -1 when it is not.
        self.prev = list(range(-1, num_blocks - 1)) + [-1, num_blocks - 1]
        self.next = list(range(1, num_blocks + 1)) + [0, -1]
        if num_blocks:
            self.prev[0] = self.head
            self.next[num_blocks - 1] = self.tail
        else:
            self.next[self.head], self.prev[self.tail] = self.tail, self.head
        self.num_free = num_blocks

    def __contains__(self, block: int) -> bool:
        return self.prev[block] != -1

    def popleft_n(self, n: int) -> list[int]:
        """The first n free blocks (kv_cache_utils.py `popleft_n`)."""
        nxt, prev = self.next, self.prev
        out = []
        block = nxt[self.head]
        for _ in range(n):
            out.append(block)
            following = nxt[block]
            nxt[block] = prev[block] = -1
            block = following
        nxt[self.head] = block
        prev[block] = self.head
        self.num_free -= n
        return out

    def remove(self, block: int) -> None:
        """Take a free block out of the queue: it was hit by a new request (`remove`)."""
        p, n = self.prev[block], self.next[block]
        self.next[p], self.prev[n] = n, p
        self.prev[block] = self.next[block] = -1
        self.num_free -= 1

    def prepend_n(self, blocks: list[int]) -> None:
        """Put blocks at the front, in the given order (`prepend_n`)."""
        self._link(self.head, self.next[self.head], blocks)

    def append_n(self, blocks: list[int]) -> None:
        """Put blocks at the back, in the given order (`append_n`)."""
        self._link(self.prev[self.tail], self.tail, blocks)

    def _link(self, before: int, after: int, blocks: list[int]) -> None:
        nxt, prev = self.next, self.prev
        for b in blocks:
            prev[b], nxt[before] = before, b
            before = b
        nxt[before], prev[after] = after, before
        self.num_free += len(blocks)

    def order(self) -> list[int]:
        """The free blocks head to tail (for tests and pictures)."""
        out, b = [], self.next[self.head]
        while b != self.tail:
            out.append(b)
            b = self.next[b]
        return out


class BlockPool:
    """`num_blocks` blocks; block 0 is the null block and never handed out.

    `cached` maps a block hash to the block holding it or, when several do, to a dict of
    them in insertion order: vLLM's `BlockHashToBlockMap` (block_pool.py) keeps the same
    union "to reduce GC costs from the inner dict", and returns the first block
    (`get_one_block`). A cached block stays cached while free, until allocation pops it
    from the head of the queue.
    """

    __slots__ = ("num_blocks", "queue", "ref_cnt", "block_hash", "cached", "evictions", "enable_caching", "uncached_first", "event_log", "event_owner")

    def __init__(self, num_blocks: int, enable_caching: bool = True, uncached_first: bool = True) -> None:
        """`uncached_first=False` frees every block to the back of the queue, as the design
        doc's walkthrough (docs/design/prefix_caching.md) and earlier releases did."""
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.uncached_first = uncached_first
        self.queue = FreeBlockQueue(num_blocks)
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int | dict[int, None]] = {}
        self.evictions = 0  # cached blocks whose hash was dropped on reuse
        # ("removed", hash) for each dropped hash, when a caller records vLLM's KV events
        # (block_pool.py `_maybe_evict_cached_block` -> `_emit_block_removed_events`)
        self.event_log: list | None = None
        self.event_owner: str | None = None  # the request whose allocation is running (set by the policy while logging)
        # block_pool.py __init__: "self.null_block = self.free_block_queue.popleft()"
        self.queue.popleft_n(1)

    @property
    def num_free(self) -> int:
        return self.queue.num_free

    def cached_items(self) -> list[tuple[int, list[int]]]:
        """Each cached hash (insertion order) with its blocks (insertion order)."""
        return [(h, [b] if type(b) is int else list(b)) for h, b in self.cached.items()]

    def get_new_blocks(self, n: int) -> list[int]:
        """Pop n blocks from the head; a popped block that was cached loses its hash
        (block_pool.py `get_new_blocks` -> `_maybe_evict_cached_block`)."""
        queue = self.queue
        if n > queue.num_free:
            raise ValueError(f"cannot get {n} free blocks from the pool")
        # queue.popleft_n(n) and the evictions in one pass
        nxt, prev = queue.next, queue.prev
        ref, hashes, cached, evicted = self.ref_cnt, self.block_hash, self.cached, 0
        blocks = []
        append = blocks.append
        b = nxt[queue.head]
        for _ in range(n):
            append(b)
            following = nxt[b]
            nxt[b] = prev[b] = -1
            key = hashes[b]
            if key is not None:  # `_maybe_evict_cached_block`: the block's hash is dropped
                holders = cached[key]
                if type(holders) is int:
                    del cached[key]
                else:
                    del holders[b]
                    if not holders:
                        del cached[key]
                hashes[b] = None
                evicted += 1
                if self.event_log is not None:
                    self.event_log.append(("removed", key, self.event_owner))
            ref[b] += 1
            b = following
        nxt[queue.head] = b
        prev[b] = queue.head
        queue.num_free -= n
        self.evictions += evicted
        return blocks

    def touch(self, blocks: Iterable[int]) -> None:
        """A prefix hit: a free block leaves the queue, and every hit block gains a reference."""
        ref, queue = self.ref_cnt, self.queue
        for b in blocks:
            if ref[b] == 0:
                queue.remove(b)
            ref[b] += 1

    def cache_block(self, block: int, block_hash: int) -> None:
        """Register a full block under its hash (`cache_full_blocks` -> `_insert_block_hash`)."""
        if self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        if self.cached.setdefault(block_hash, block) != block:
            self.add_holder(block_hash, block)

    def add_holder(self, block_hash: int, block: int) -> None:
        """A second block with a cached hash: vLLM does not de-duplicate (NOTE #1 there)."""
        holders = self.cached[block_hash]
        if type(holders) is int:
            self.cached[block_hash] = {holders: None, block: None}
        else:
            holders[block] = None

    def free_blocks(self, ordered_blocks: Iterable[int]) -> None:
        """Drop one reference from each block, given in eviction order (the request's tail first).

        block_pool.py `free_blocks`: a block reaching 0 references that has no hash goes to
        the FRONT of the queue (LIFO reuse, "for better GPU locality"); a cached one goes to
        the BACK (FIFO, so the cache evicts least recently used first).
        """
        ref, hashes = self.ref_cnt, self.block_hash
        if self.uncached_first and self.enable_caching:
            # The common case in one pass: a cached block is linked at the back at once (the
            # back keeps the given order), an uncached one is kept for the front.
            queue = self.queue
            nxt, prev = queue.next, queue.prev
            tail = queue.tail
            first = []
            before = prev[tail]
            count = queue.num_free
            for b in ordered_blocks:
                r = ref[b] = ref[b] - 1
                if r or not b:  # block 0, the null block, is never freed
                    continue
                if hashes[b] is None:
                    first.append(b)
                else:
                    prev[b], nxt[before] = before, b
                    before = b
                    count += 1
            nxt[before], prev[tail] = tail, before
            queue.num_free = count
            if first:
                queue.prepend_n(first)
            return
        blocks = list(ordered_blocks)
        for b in blocks:
            ref[b] -= 1
        freed = [b for b in blocks if not ref[b] and b]  # block 0, the null block, is never freed
        if not self.uncached_first:
            first, last = [], freed
        elif not self.enable_caching:
            first, last = freed, []
        else:
            first = [b for b in freed if hashes[b] is None]
            last = [b for b in freed if hashes[b] is not None] if len(first) < len(freed) else []
        if first:
            self.queue.prepend_n(first)
        if last:
            self.queue.append_n(last)
