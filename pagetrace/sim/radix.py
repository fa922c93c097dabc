"""SGLang's radix-tree prefix cache as the simulator's second KV cache policy.

Same workload, same scheduler (vLLM's, `scheduler.py`), different cache. The rules are
SGLang 0.5.23's (the PyPI wheel), python/sglang/srt/mem_cache/:

- radix_cache.py `RadixCache`: a tree whose nodes hold runs of token ids and their KV
  pages. With `page_size > 1` every key is cut to whole pages (`RadixKey.page_aligned`),
  matches count whole pages (`RadixKey.match_at`) and a node's children are keyed by their
  first page of tokens (`child_key_at`), namespaced by the cache salt. `match_prefix` walks
  the tree, stamps each node it passes with the access time, and splits a node where the
  match ends inside it (`_split_node`); `_insert_helper` does the same and hangs the new
  tail off the last node as a leaf. `inc_lock_ref`/`dec_lock_ref` lock a node and its
  ancestors for a running request; `evict` heaps the unlocked leaves by
  `last_access_time` (LRUStrategy, evict_policy.py), frees whole leaves, and pushes a
  parent once its last child has gone.
- When nodes are inserted (`checkpoint` -> `_insert_cache`, called by common.py
  `checkpoint_kv_cache` after each prefill step of an unfinished request, and by
  `release_kv_cache(checkpoint=True)` when a request finishes): the page-aligned computed
  tokens go into the tree, then the page-aligned prompt again when it is shorter
  (`split_prompt`: the node splits where the prompt ends, the output a leaf of its own); pages the request computed that the tree already holds are
  freed (`free_segment(kv_indices[cache_protected_len:prefix_len])`) and the request's
  row is rebound to the tree's pages; its lock moves to the new last node. On finish the
  unaligned tail page is freed too and the lock dropped (earlier releases name these two
  `cache_unfinished_req` and `cache_finished_req`). A preempted (retracted) request
  is released with `checkpoint=False` (schedule_batch.py: "TODO: for preempted requests,
  we may want to insert into the tree"): only its pages outside the tree are freed.
- allocator/paged.py `PagedTokenToKVPoolAllocator` (page_size > 1): free pages
  `arange(1, num_pages + 1)` (page 0 is padding, as vLLM's null block); `alloc` takes
  from the front; a free puts the pages back at the FRONT in the order given
  (`_release_page_ids`: `cat((page_ids, free_pages))`). allocator/token.py
  `TokenToKVPoolAllocator` (page_size 1) appends freed slots at the BACK. The frees of
  one step's results are one group (`free_group_begin/end` in batch_result_processor.py):
  collected in order and released together; eviction frees leaf by leaf, at once.
  `need_sort` (merge-and-sort of released pages) is on only in disaggregated serving.
- Eviction is asked for when the allocator is short (allocator/base.py
  `evict_to_free_tokens`: evict the shortfall).

Mapping onto the scheduler's calls (it allocates per request, so the shortfall is the
request's; SGLang's own batch estimate of one spare page per request is not modelled):
`lookup` = `match_prefix` of the first `num_tokens - 1` tokens (schedule_batch.py
`_compute_max_prefix_len`: "at most 1 less than the input length"); `allocate_slots`
locks the match, evicts, takes pages; a completed prefill is checkpointed and a finished
request released after the step (`end_step`), in batch order (`seq`), one free group; a
prefill that stopped mid-way is checkpointed after that group, on its own (SGLang does it at
the top of the next step); a preempted request is released at once. Access times are a counter, ties broken by node creation order.
"""

from __future__ import annotations

import heapq
from collections import deque

from ..paging.blocks import cdiv
from .request import FINISHED, SimRequest


class TreeNode:
    """A run of whole pages of token ids, their page ids, and the LRU/lock state."""

    __slots__ = ("children", "parent", "key", "pages", "child_key", "lock_ref", "last_access", "id")

    def __init__(self, parent: TreeNode | None, key: tuple, pages: list[int], child_key: tuple, tick: int, node_id: int) -> None:
        self.children: dict[tuple, TreeNode] = {}
        self.parent = parent
        self.key = key  # token ids, a whole number of pages
        self.pages = pages  # one page id per page of the key
        self.child_key = child_key  # (cache salt, first page of tokens): its entry in parent.children
        self.lock_ref = 0
        self.last_access = tick
        self.id = node_id


class PagePool:
    """SGLang's page allocator, seen through the pool attributes the simulator reads.

    `num_free` counts the free list and the pages of unlocked tree nodes (which eviction can
    reclaim), so `used` means pages held by running requests, as for vLLM's pool.
    `ref_cnt[p]`: block tables holding page p; `block_hash[p]` is not None while p is in the tree.
    """

    __slots__ = ("num_blocks", "free", "ref_cnt", "block_hash", "evictions", "evictable", "free_to_front")

    def __init__(self, num_blocks: int, page_size: int) -> None:
        self.num_blocks = num_blocks
        self.free = deque(range(1, num_blocks))  # clear(): arange(1, num_pages + 1); page 0 pads
        self.ref_cnt = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.evictions = 0  # pages evicted from the tree
        self.evictable = 0  # pages of unlocked tree nodes (`evictable_size_` / page size)
        self.free_to_front = page_size > 1  # paged allocator: LIFO; token allocator: FIFO

    @property
    def num_free(self) -> int:
        return len(self.free) + self.evictable

    def release(self, pages: list[int]) -> None:
        """One allocator free (or one free group): paged to the front in order, token to the back."""
        if self.free_to_front:
            self.free.extendleft(reversed(pages))
        else:
            self.free.extend(pages)


class SglangRadixCache:
    """SGLang's `RadixCache` over its page allocator, behind the simulator's policy calls."""

    name = "sglang"
    label = "SGLang (radix)"

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True, max_model_len: int = 1 << 30) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching  # off: SGLang's --disable-radix-cache, nothing shared
        self.max_model_len = max_model_len
        self.pool = PagePool(num_blocks, block_size)
        self.req_to_blocks: dict[str, list[int]] = {}
        self.ever_cached: set[int] = set()  # block hashes of every page ever inserted (causes.py)
        self.ever_cached_content: set[int] = set()
        self.root = TreeNode(None, (), [], (None, ()), 0, 0)
        self.root.lock_ref = 1  # reset(): the root is never evicted
        self.evictable_leaves: set[TreeNode] = set()
        self._tick = 0  # the access clock (SGLang: time.monotonic())
        self._ids = 0
        self._node: dict[str, TreeNode] = {}  # req.last_node: the node the request locks
        self._protected: dict[str, int] = {}  # req.kv.cache_protected_len, in pages: the tree's part of the table
        self._match: tuple[str, TreeNode] | None = None  # the latest lookup: (request id, last node)
        # after the step: (request, checkpoint to n tokens or -1 = release, its prefill goes on next step)
        self._pending: dict[str, tuple[SimRequest, int, bool]] = {}

    # -- the policy calls --

    def block_ids(self, request_id: str) -> list[int]:
        return self.req_to_blocks.get(request_id, [])

    def lookup(self, req: SimRequest) -> tuple[list[int], int]:
        """`match_prefix` on the page-aligned first `num_tokens - 1` tokens."""
        ps = self.block_size
        aligned = (req.num_tokens - 1) // ps * ps
        if not self.enable_caching or aligned <= 0:
            return [], 0
        pages, node = self._match_prefix(req.token_slice(0, aligned), req.cache_salt)
        self._match = (req.request_id, node)
        return pages, len(pages) * ps

    def allocate_slots(
        self,
        req: SimRequest,
        num_new_tokens: int,
        hit_blocks: list[int] | None = None,
        num_hit_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        """Pages for the request's next tokens, evicting LRU leaves when the free list is short."""
        rid, ps, pool, mml = req.request_id, self.block_size, self.pool, self.max_model_len
        table = self.req_to_blocks.get(rid)
        c = req.num_computed
        if table is None:  # admission: lock the match (PrefillAdder: inc_lock_ref(req.last_node))
            hits = list(hit_blocks or ())
            node = self.root
            if hits:
                match = self._match
                node = match[1] if match is not None and match[0] == rid else self._match_prefix(req.token_slice(0, len(hits) * ps), req.cache_salt)[1]
            self._lock(node)
            total = min(c + num_hit_tokens, mml)
            need = cdiv(min(total + num_new_tokens, mml), ps) - len(hits)
            avail = len(pool.free) + pool.evictable
            if need > avail or (full_sequence_must_fit and cdiv(min(req.num_tokens, mml), ps) - len(hits) > avail):
                self._unlock(node)
                return None
            new = self._take(need) if need > 0 else []
            table = self.req_to_blocks[rid] = hits + new
            self._node[rid], self._protected[rid] = node, len(hits)
            refs = table
        else:
            total = min(c, mml)
            need = cdiv(min(total + num_new_tokens, mml), ps) - len(table)
            if need > len(pool.free) + pool.evictable:
                return None
            new = self._take(need) if need > 0 else []
            table.extend(new)
            refs = new
        ref = pool.ref_cnt
        for p in refs:
            ref[p] += 1
        if self.enable_caching and (c < req.prompt_len or req.num_tokens - c > 1):  # a prefill chunk
            up_to = total + num_new_tokens
            self._pending[rid] = (req, min(up_to, req.num_tokens), up_to < req.num_tokens)
        return new

    def free(self, req: SimRequest) -> None:
        """A finished request is released after the step (`release_kv_cache(checkpoint=True)`);
        a preempted one now, without inserting (`checkpoint=False`)."""
        rid = req.request_id
        if rid not in self.req_to_blocks:
            return
        if req.status == FINISHED:
            self._pending[rid] = (req, -1, False)
            return
        self._pending.pop(rid, None)
        group: list[int] = []
        self._drop(rid, group)
        self.pool.release(group)

    def end_step(self) -> None:
        """The step's results, in batch order, as one free group: each finished request
        released, each request whose prefill completed checkpointed (`process_batch_result_*`).
        Then each request whose prefill stopped mid-way (SGLang's `chunked_req`) is
        checkpointed on its own, after the group: scheduler.py `get_next_batch_to_run` does it
        (`stash_chunked_request`) at the top of the next step, outside any free group."""
        if not self._pending:
            return
        group: list[int] = []
        chunked: list[tuple[SimRequest, int, bool]] = []
        for req, up_to, mid in sorted(self._pending.values(), key=lambda entry: entry[0].seq):
            if mid:
                chunked.append((req, up_to, mid))
            elif up_to < 0:
                if self.enable_caching:
                    rid = req.request_id
                    stored = min(req.num_computed, len(self.req_to_blocks[rid]) * self.block_size)
                    self._checkpoint(req, stored // self.block_size, group)
                self._drop(req.request_id, group)
            else:
                self._checkpoint(req, up_to // self.block_size, group)
        self._pending.clear()
        self.pool.release(group)
        for req, up_to, _ in chunked:
            own: list[int] = []
            self._checkpoint(req, up_to // self.block_size, own)
            self.pool.release(own)

    # -- requests and the tree --

    def _checkpoint(self, req: SimRequest, k: int, group: list[int]) -> None:
        """radix_cache.py `checkpoint`: insert the first k pages, split the node at the prompt's
        last whole page (`_insert_cache(split_prompt=True)` inserts the page-aligned prompt again,
        "so eviction can drop the output KV without the prompt"), free the duplicates, rebind,
        move the lock."""
        rid, ps, ref = req.request_id, self.block_size, self.pool.ref_cnt
        table, protected = self.req_to_blocks[rid], self._protected[rid]
        tokens = req.token_slice(0, k * ps)
        prefix = self._insert(tokens, table[:k], req.cache_salt) // ps
        prompt_pages = req.prompt_len // ps
        if 0 < prompt_pages < k:
            self._insert(tokens[: prompt_pages * ps], table[:prompt_pages], req.cache_salt)
        pages, node = self._match_prefix(tokens, req.cache_salt)
        for i in range(protected, prefix):  # the tree had these already: free ours, take the tree's
            group.append(table[i])
            ref[table[i]] -= 1
            table[i] = pages[i]
            ref[pages[i]] += 1
        if prefix < k:
            req.update_hashes(ps)
            self.ever_cached.update(req.block_hashes[prefix:k])
            if req.cache_salt is not None:
                self.ever_cached_content.update(req.content_hashes[prefix:k])
        self._protected[rid] = max(protected, k)
        self._unlock(self._node[rid])
        self._lock(node)
        self._node[rid] = node

    def _drop(self, rid: str, group: list[int]) -> None:
        """Free the request's pages outside the tree and release its lock."""
        table = self.req_to_blocks.pop(rid)
        group.extend(table[self._protected.pop(rid):])
        ref = self.pool.ref_cnt
        for p in table:
            ref[p] -= 1
        self._unlock(self._node.pop(rid))

    def _take(self, n: int) -> list[int]:
        free = self.pool.free
        if n > len(free):
            self._evict(n - len(free))
        return [free.popleft() for _ in range(n)]

    def _evict(self, num_pages: int) -> None:
        """`evict`: unlocked leaves, least recently used first, until enough pages are freed."""
        pool = self.pool
        heap = [(n.last_access, n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            x = heapq.heappop(heap)[2]
            pool.release(x.pages)  # free_segment(x.value): one free per leaf
            freed += len(x.pages)
            pool.evictions += len(x.pages)
            pool.evictable -= len(x.pages)
            for p in x.pages:
                pool.block_hash[p] = None
            parent = x.parent
            del parent.children[x.child_key]  # _delete_leaf
            self.evictable_leaves.discard(x)
            self._update_leaf(parent)
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))

    def _lock(self, node: TreeNode) -> None:
        """`inc_lock_ref`: the node and its ancestors."""
        pool = self.pool
        while node is not self.root:
            if node.lock_ref == 0:
                pool.evictable -= len(node.pages)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent

    def _unlock(self, node: TreeNode) -> None:
        """`dec_lock_ref`."""
        pool = self.pool
        while node is not self.root:
            if node.lock_ref == 1:
                pool.evictable += len(node.pages)
            node.lock_ref -= 1
            self._update_leaf(node)
            node = node.parent

    def _update_leaf(self, node: TreeNode) -> None:
        """`_update_leaf_status`: an unlocked node without children is an evictable leaf."""
        if node.lock_ref > 0 or node.children:
            self.evictable_leaves.discard(node)
        else:
            self.evictable_leaves.add(node)

    def _key(self, tokens: tuple, start: int, salt: str | None) -> tuple:
        return (salt, tokens[start : start + self.block_size])

    def _match_len(self, key: tuple, tokens: tuple, start: int) -> int:
        """Whole pages `key` shares with tokens[start:] (`RadixKey.match_at`, page-rounded)."""
        n = min(len(key), len(tokens) - start)
        if key[:n] != tokens[start : start + n]:
            i = 0
            while key[i] == tokens[start + i]:
                i += 1
            n = i
        return n // self.block_size * self.block_size

    def _new_node(self, parent: TreeNode, key: tuple, pages: list[int], child_key: tuple) -> TreeNode:
        self._ids += 1
        return TreeNode(parent, key, pages, child_key, self._tick, self._ids)

    def _split(self, child: TreeNode, m: int, salt: str | None) -> TreeNode:
        """`_split_node`: the first m tokens of `child` become its new parent."""
        ps = self.block_size
        new = self._new_node(child.parent, child.key[:m], child.pages[: m // ps], child.child_key)
        new.lock_ref = child.lock_ref
        child.parent.children[new.child_key] = new
        child.key, child.pages = child.key[m:], child.pages[m // ps :]
        child.child_key = self._key(child.key, 0, salt)
        child.parent = new
        new.children[child.child_key] = child
        return new

    def _walk(self, tokens: tuple, salt: str | None) -> tuple[int, list[int], TreeNode]:
        """The loop of `_match_prefix_helper` and `_insert_helper`: follow tokens from the root,
        stamp each node passed, split the one they leave mid-way (a split node's one child
        then differs from them, so both loops end there). Tokens matched, their pages, last node."""
        self._tick += 1
        node = self.root
        node.last_access = self._tick
        pages: list[int] = []
        i = 0
        while i < len(tokens):
            child = node.children.get(self._key(tokens, i, salt))
            if child is None:
                break
            child.last_access = self._tick
            m = self._match_len(child.key, tokens, i)
            i += m
            node = self._split(child, m, salt) if m < len(child.key) else child
            pages += node.pages
            if node is not child:
                break
        return i, pages, node

    def _match_prefix(self, tokens: tuple, salt: str | None) -> tuple[list[int], TreeNode]:
        """`match_prefix`: the pages of the longest cached prefix and its last node."""
        _, pages, node = self._walk(tokens, salt)
        return pages, node

    def _insert(self, tokens: tuple, pages: list[int], salt: str | None) -> int:
        """`_insert_helper`: tokens already in the tree (the prefix length); the rest becomes a leaf."""
        i, _, node = self._walk(tokens, salt)
        if i < len(tokens):
            ps = self.block_size
            leaf = self._new_node(node, tokens[i:], pages[i // ps :], self._key(tokens, i, salt))
            node.children[leaf.child_key] = leaf
            self.pool.evictable += len(leaf.pages)
            for p in leaf.pages:
                self.pool.block_hash[p] = leaf.id
            self._update_leaf(node)
            self._update_leaf(leaf)
        return i
