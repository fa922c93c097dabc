"""The KV cache policy the scheduler calls: vLLM V1's prefix-caching block manager.

What the scheduler needs from a policy, in five calls (`radix.SglangRadixCache`, SGLang's
radix tree, is the second class with the same five):
- `lookup(req)`: the cached blocks and tokens of the longest prefix hit;
- `allocate_slots(req, num_new_tokens, hit_blocks, num_hit_tokens, full_sequence_must_fit)`:
  blocks for the request's next tokens, or None when the pool cannot give them;
- `free(req)`: release the request's blocks;
- `block_ids(request_id)`: the request's block table;
- `end_step()`: what the cache does once the step's tokens are computed (SGLang inserts
  the prefilled pages into its tree then; vLLM has nothing to do).
While the scheduler cruises (pagetrace/sim/cruise.py) it calls `allocate_slots(req, 1)` only
for the decoding requests whose token starts a block. A policy that also has
`decode_blocks`, `decode_hashes` and `decode_cache` does those in batches and caches the
blocks they fill.

`VllmPrefixCaching` is `KVCacheManager` (vllm/v1/core/kv_cache_manager.py) and
`FullAttentionManager` (single_type_kv_cache_manager.py) for one full-attention group,
without speculative decoding, KV connectors or sliding windows; the hash block size
equals the block size, so there are no partial-block hits (`fine_grained` is False).
"""

from __future__ import annotations

from typing import Protocol

from ..paging.blocks import cdiv
from .blockpool import BlockPool
from .request import SimRequest


class KVCachePolicy(Protocol):
    name: str  # --policy
    label: str  # the system in the waste table
    block_size: int
    pool: BlockPool

    def lookup(self, req: SimRequest) -> tuple[list[int], int]: ...

    def allocate_slots(
        self,
        req: SimRequest,
        num_new_tokens: int,
        hit_blocks: list[int] | None = None,
        num_hit_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None: ...

    def free(self, req: SimRequest) -> None: ...

    def block_ids(self, request_id: str) -> list[int]: ...

    def end_step(self) -> None: ...


class VllmPrefixCaching:
    """vLLM V1's block manager: allocate on demand, cache full blocks by hash, free tail first."""

    name = "vllm"
    label = "vLLM (paged)"

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        max_model_len: int = 1 << 30,
        uncached_first: bool = True,
    ) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_blocks, enable_caching, uncached_first)
        self.req_to_blocks: dict[str, list[int]] = {}
        self.num_cached_block: dict[str, int] = {}  # present while the request holds blocks
        self.ever_cached: set[int] = set()  # every hash ever cached: tells "evicted" from "never seen"
        self.ever_cached_content: set[int] = set()  # the same without extra keys: "different extra key"
        self.event_log: list | None = None  # vLLM's KV events, when recorded (`record_events`)

    def record_events(self) -> list:
        """Log what vLLM publishes as KV events, in its order: ("stored", request id, first
        block index, hashes) per `cache_full_blocks` call (one BlockStored, every newly full
        block, copies of a cached hash included) and ("removed", hash, request id) per hash
        dropped, with the request whose allocation dropped it."""
        self.event_log = self.pool.event_log = []
        return self.event_log

    def block_ids(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def end_step(self) -> None:
        """Nothing: vLLM caches a block when it is allocated."""

    def lookup(self, req: SimRequest) -> tuple[list[int], int]:
        """The longest run of cached full blocks from the start (`get_computed_blocks`).

        At most `num_tokens - 1` tokens can hit: the last one is recomputed for its logits,
        and since hits are whole blocks a prompt of exactly k blocks hits at most k - 1.
        """
        if not self.enable_caching:
            return [], 0
        bs = self.block_size
        req.update_hashes(bs)
        hits: list[int] = []
        get = self.pool.cached.get
        for h in req.block_hashes[: (req.prompt_len + req.num_generated - 1) // bs]:
            block = get(h)  # `get_one_block`: the first block holding it
            if block is None:
                break
            hits.append(block if type(block) is int else next(iter(block)))
        return hits, len(hits) * bs

    def _num_blocks_to_allocate(self, request_id: str, num_tokens: int, hit_blocks: list[int]) -> int:
        """single_type_kv_cache_manager.py `get_num_blocks_to_allocate` (full attention)."""
        required = cdiv(num_tokens, self.block_size)
        held = len(self.req_to_blocks.get(request_id, ()))
        if request_id in self.num_cached_block:  # running: no new hits
            return max(required - held, 0)
        new = max(required - (len(hit_blocks) + held), 0)
        if not hit_blocks:
            return new
        # A hit on a free block takes it out of the free queue: it counts against the free blocks.
        ref = self.pool.ref_cnt
        return new + sum(1 for b in hit_blocks if ref[b] == 0)

    def allocate_slots(
        self,
        req: SimRequest,
        num_new_tokens: int,
        hit_blocks: list[int] | None = None,
        num_hit_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """kv_cache_manager.py `allocate_slots` with no lookahead, connector or watermark."""
        rid = req.request_id
        if self.event_log is not None:
            self.pool.event_owner = rid
        blocks = self.req_to_blocks.get(rid)
        if blocks is not None and not hit_blocks and not num_hit_tokens and not full_sequence_must_fit:
            # A running request (the scheduler's common call: a decode step or a prefill chunk).
            # The general path below with its no-op parts dropped: no hits to count or adopt,
            # and `get_num_blocks_to_allocate` is `required - held` for a running request.
            mml = self.max_model_len
            total_computed = req.num_computed if req.num_computed < mml else mml
            need_slots = total_computed + num_new_tokens
            if need_slots > mml:
                need_slots = mml
            bs = self.block_size
            new = -(-need_slots // bs) - len(blocks)  # cdiv(need_slots, bs) - held
            if new > self.pool.queue.num_free:
                return None
            new_blocks = self.pool.get_new_blocks(new) if new > 0 else []
            blocks.extend(new_blocks)
            if self.enable_caching:
                num_tokens = min(total_computed + num_new_tokens, req.prompt_len + req.num_generated)
                if num_tokens // bs > self.num_cached_block[rid]:
                    self._cache_blocks(req, blocks, num_tokens)
            return new_blocks
        hit_blocks = hit_blocks or []
        total_computed = min(req.num_computed + num_hit_tokens, self.max_model_len)
        free = self.pool.num_free
        full = -1
        if full_sequence_must_fit:  # `scheduler_reserve_full_isl`: the whole prompt must fit
            full = min(req.num_tokens, self.max_model_len)
            if self._num_blocks_to_allocate(rid, full, hit_blocks) > free:
                return None
        need_slots = min(total_computed + num_new_tokens, self.max_model_len)
        if need_slots != full and self._num_blocks_to_allocate(rid, need_slots, hit_blocks) > free:  # the same check if equal
            return None
        blocks = self.req_to_blocks.get(rid)
        if blocks is None:  # first allocation since admission: adopt the hits (`add_local_computed_blocks`)
            if self.enable_caching and hit_blocks:
                self.pool.touch(hit_blocks)
            blocks = self.req_to_blocks[rid] = list(hit_blocks)
            self.num_cached_block[rid] = len(hit_blocks)
        new = cdiv(need_slots, self.block_size) - len(blocks)
        new_blocks = self.pool.get_new_blocks(new) if new > 0 else []
        blocks.extend(new_blocks)
        if self.enable_caching:
            # Cache what is computed after this step, never past the known tokens.
            self._cache_blocks(req, blocks, min(total_computed + num_new_tokens, req.num_tokens))
        return new_blocks

    # The scheduler's cruising steps (pagetrace/sim/cruise.py): the one-token `allocate_slots`
    # of many decoding requests at once, in running order, with the same effect.

    def decode_blocks(self, reqs: list[SimRequest]) -> list[int]:
        """One new block for each of these requests (their next token starts a block), off
        the free queue's head in order. The caller has checked that the pool has them."""
        new_blocks = self.pool.get_new_blocks(len(reqs))
        tables = self.req_to_blocks
        for req, b in zip(reqs, new_blocks):
            tables[req.request_id].append(b)
        return new_blocks

    def decode_hashes(self, reqs: list[SimRequest]) -> list[int] | None:
        """The hash of the block each of these requests' next token fills (its
        `num_cached_block`-th), added to its chain as `update_hashes` would. None when one
        of them is already cached: then vLLM's request-by-request order of evictions and
        fills decides where that hash sits in the cache, and the step must run explicitly."""
        bs, done, cached = self.block_size, self.num_cached_block, self.pool.cached
        out = []
        append = out.append
        for req in reqs:
            i = done[req.request_id]
            hashes = req.block_hashes
            n = len(hashes)
            if n == i:  # the usual: the block is hashed now
                start = i * bs - req.prompt_len
                tokens = req.output[start : start + bs] if start >= 0 else None
                if i and req.cache_salt is None and type(tokens) is range and tokens.step == 1:
                    h = hash((hashes[-1], tokens, None))  # hash_block(parent, block_key(tokens), None), inlined
                    hashes.append(h)
                else:
                    req.update_hashes(bs, i + 1)
                    h = hashes[i]
            elif n > i:  # hashed before (by a lookup, or before a preemption)
                h = hashes[i]
            else:
                return None
            if h in cached:
                return None
            append(h)
        return out

    def decode_cache(self, reqs: list[SimRequest], hashes: list[int]) -> None:
        """Cache the blocks of `decode_hashes` (`_cache_blocks` for one block each)."""
        pool, done, tables = self.pool, self.num_cached_block, self.req_to_blocks
        block_hash, insert = pool.block_hash, pool.cached.setdefault
        for req, h in zip(reqs, hashes):
            rid = req.request_id
            i = done[rid]
            if self.event_log is not None:
                self.event_log.append(("stored", rid, i, [h]))
            b = tables[rid][i]
            if block_hash[b] is None:  # pool.cache_block(b, h), inlined
                block_hash[b] = h
                if insert(h, b) != b:
                    pool.add_holder(h, b)
            done[rid] = i + 1
            if req.cache_salt is not None:
                self.ever_cached_content.add(req.content_hashes[i])
        self.ever_cached.update(hashes)

    def _cache_blocks(self, req: SimRequest, blocks: list[int], num_tokens: int) -> None:
        """`cache_blocks` -> block_pool.py `cache_full_blocks`: register newly full blocks."""
        rid = req.request_id
        done = self.num_cached_block[rid]
        full = num_tokens // self.block_size
        if done >= full:
            return
        if len(req.block_hashes) < full:  # (the prompt's were hashed by the lookup)
            req.update_hashes(self.block_size)
        pool = self.pool
        block_hash, insert = pool.block_hash, pool.cached.setdefault
        new_hashes = req.block_hashes[done:full]
        if self.event_log is not None:
            self.event_log.append(("stored", rid, done, new_hashes))
        for h, b in zip(new_hashes, blocks[done:full]):
            if block_hash[b] is None:  # pool.cache_block(b, h), inlined
                block_hash[b] = h
                if insert(h, b) != b:
                    pool.add_holder(h, b)
        self.ever_cached.update(new_hashes)
        if req.cache_salt is not None:
            self.ever_cached_content.update(req.content_hashes[done:full])
        self.num_cached_block[rid] = full

    def free(self, req: SimRequest) -> None:
        """Free tail first, so a request's last blocks are evicted first (`free`)."""
        blocks = self.req_to_blocks.pop(req.request_id, [])
        self.num_cached_block.pop(req.request_id, None)
        self.pool.free_blocks(reversed(blocks))
