"""Hybrid models: full-attention and sliding-window layers in KV cache groups over one pool.

vLLM 0.32 (vllm/v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`) puts the
layers of one attention type in one bucket (full; sliding with window W, one bucket per W),
splits every bucket into groups of `group_size` layers (the smallest bucket's layer count, or
the largest's when that is under 1.5 times the smallest), each group with its own block table,
and sizes one shared pool whose block holds a page of every layer of the largest group
(`_get_kv_cache_bytes_per_block`). `HybridVllmPrefixCaching` is `KVCacheManager.allocate_slots`
(kv_cache_manager.py) over `HybridKVCacheCoordinator` (kv_cache_coordinator.py) with one
`FullAttentionManager` or `SlidingWindowManager` (single_type_kv_cache_manager.py) per group:

- a sliding-window group frees the blocks that fall out of the window before each allocation
  (`remove_skipped_blocks`, `get_num_skipped_tokens(n) = max(0, n - W + 1)`) and keeps the
  null block (id 0) in their place;
- a cache hit is looked up per group (full attention: the longest run from the start; sliding
  window: from the right, the first run of `cdiv(W - 1, block_size)` cached blocks) and the
  shortest length wins (`find_longest_cache_hit`'s fixed point); hashes are cached per group
  (`make_block_hash_with_group_id`: here the key `(hash, group)`);
- a sliding-window group caches, under vLLM's default `prefix_cache_retention_interval=0`, only
  the blocks a later hit can use: the run ending at the prompt's replay boundary
  (`replay_boundaries`: `num_prompt_tokens - 1`) and at a shared prefix a full-attention group
  found longer (`shared_prefix_boundary`) (`SlidingWindowManager.reachable_block_mask`);
  `retention=None` caches every block (dense), a positive interval one tail per segment;
- admission with `full_sequence_must_fit` caps a sliding group's reservation at
  `cdiv(min(W - 1 + max_in_flight_tokens, max_model_len), block_size) + 1` blocks
  (kv_cache_interface.py `SlidingWindowSpec.max_admission_blocks_per_request`).

One block size for every group (so the scheduler's block size is the hash block size), no
EAGLE, KV connector, DCP/PCP, or partial-block hits. `record_events` logs what vLLM publishes,
per group (`group_idx`): a BlockStored per `cache_full_blocks` call holding the hashes of the
blocks it cached (a sliding group's masked and null blocks left out), a BlockRemoved per hash
dropped, the key `(hash, group)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..paging.blocks import cdiv
from .blockpool import BlockPool
from .request import SimRequest

FULL, SLIDING = "full", "sliding"


@dataclass(frozen=True, slots=True)
class LayerKind:
    """One attention type: full (window None) or sliding with its window in tokens."""

    kind: str
    window: int | None = None

    def label(self) -> str:
        return "full attention" if self.window is None else f"sliding window {self.window}"


@dataclass(frozen=True, slots=True)
class KVGroup:
    """A KV cache group: one block table per request, `layers` real layers (the rest padding)."""

    kind: LayerKind
    layers: int


def kv_cache_groups(layers: list[LayerKind]) -> tuple[list[KVGroup], int]:
    """vLLM's groups for these layers, in model order, and the group size (layers a block
    holds a page of). `_get_kv_cache_groups_uniform_page_size`: buckets in order of their
    first layer, each split into `cdiv(len, group_size)` groups, layer i of a bucket going to
    its group i % num_groups."""
    if not layers:
        raise ValueError("a model with no attention layer has no KV cache")
    buckets: dict[LayerKind, int] = {}
    for k in layers:
        buckets[k] = buckets.get(k, 0) + 1
    if len(buckets) == 1:  # one spec: one group of every layer (`_get_kv_cache_groups_uniform_type`)
        (k, n), = buckets.items()
        return [KVGroup(k, n)], n
    smallest, largest = min(buckets.values()), max(buckets.values())
    group_size = largest if largest < smallest * 1.5 else smallest
    groups = []
    for k, n in buckets.items():
        num = cdiv(n, group_size)
        for i in range(num):
            groups.append(KVGroup(k, len(range(i, n, num))))
    return groups, group_size


def parse_layers(text: str) -> list[LayerKind]:
    """`full:N,sliding:W:M`: N full-attention layers, M sliding-window layers of window W
    (the items repeat and mix in any order, as a model's layers do). ValueError names the item."""
    out: list[LayerKind] = []
    for item in text.split(","):
        parts = item.strip().split(":")
        kind = parts[0].strip().lower()
        nums = [int(p.strip()) for p in parts[1:] if p.strip().isascii() and p.strip().isdigit()]
        if len(nums) != len(parts) - 1:
            raise ValueError(f"{item.strip()!r} is not full:N or sliding:W:N (whole numbers, 0-9)")
        if kind == FULL and len(nums) == 1:
            window, count = None, nums[0]
        elif kind == SLIDING and len(nums) == 2:
            window, count = nums
            if window < 1:
                raise ValueError(f"{item.strip()!r}: a sliding window of {window} tokens holds no token (at least 1)")
        else:
            raise ValueError(f"{item.strip()!r} is not full:N or sliding:W:N")
        if count < 1:
            raise ValueError(f"{item.strip()!r} holds no layer (at least 1)")
        out.extend([LayerKind(kind, window)] * count)
    return out


def layers_from_config(cfg: dict) -> list[LayerKind] | None:
    """The layer kinds a Hugging Face config gives (`layer_types` with "full_attention" /
    "sliding_attention" and `sliding_window`, as Gemma 2/3, gpt-oss, Qwen2/3 and others write
    them); None when the config has no sliding-window layer. ValueError names the field."""
    window = cfg.get("sliding_window")
    types = cfg.get("layer_types")
    n = cfg.get("num_hidden_layers")
    if types is None:
        # A model with one `sliding_window` and no layer_types (Mistral 7B v0.1): every layer slides.
        if window is None or cfg.get("use_sliding_window") is False:
            return None
        types = ["sliding_attention"] * int(n or 0)
    if not isinstance(types, list) or not types:
        raise ValueError("layer_types must be a non-empty list")
    if n is not None and len(types) != n:
        raise ValueError(f"layer_types lists {len(types)} layers, num_hidden_layers is {n}")
    if "sliding_attention" not in types:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"sliding_window={window!r}: the sliding layers need a window of at least 1 token")
    out = []
    for t in types:
        if t == "sliding_attention":
            out.append(LayerKind(SLIDING, window))
        elif t == "full_attention":
            out.append(LayerKind(FULL))
        else:
            raise ValueError(f"layer_types holds {t!r}: pagetrace models full_attention and sliding_attention")
    return out


def sliding_admission_cap(window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
    """`SlidingWindowSpec.max_admission_blocks_per_request`: the blocks a sliding group holds
    at most for one request (the window less one, the tokens in flight, one block of offset)."""
    return cdiv(min(window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1


class HybridVllmPrefixCaching:
    """vLLM V1's block manager for several KV cache groups sharing one pool.

    `tables[g][request_id]` is group g's block table (0 for a block that left the window);
    `req_to_blocks` / `block_ids` give a request's real blocks of every group (for the
    pictures and the scheduler's counters)."""

    name = "vllm"
    label = "vLLM (paged, hybrid)"

    def __init__(
        self,
        groups: list[KVGroup],
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        max_model_len: int = 1 << 30,
        max_in_flight_tokens: int = 4096,
        retention: int | None = 0,
    ) -> None:
        self.groups = groups
        self.windows = [g.kind.window for g in groups]
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.max_model_len = max_model_len
        self.retention = retention
        self.caps = [None if w is None else sliding_admission_cap(w, block_size, max_in_flight_tokens, max_model_len)
                     for w in self.windows]
        self.pool = BlockPool(num_blocks, enable_caching)
        self.tables: list[dict[str, list[int]]] = [{} for _ in groups]
        self.num_cached: list[dict[str, int]] = [{} for _ in groups]
        self.junction: dict[str, int] = {}  # request.shared_prefix_boundary
        self.ever_cached: set[int] = set()
        self.ever_cached_content: set[int] = set()
        self.event_log: list | None = None
        # HybridKVCacheCoordinator.verify_and_split_kv_cache_groups: groups of one spec are
        # looked up together; full attention first.
        spec_groups: dict[LayerKind, list[int]] = {}
        for i, g in enumerate(groups):
            spec_groups.setdefault(g.kind, []).append(i)
        self.spec_groups = sorted(spec_groups.items(), key=lambda kv: kv[0].window is not None)

    def record_events(self) -> list:
        """Log vLLM's KV events in its order: ("stored", request id, first block index, hashes,
        group, block indices) per `cache_full_blocks` call, ("removed", (hash, group), request id)
        per hash dropped by the allocation of that request."""
        self.event_log = self.pool.event_log = []
        return self.event_log

    # -- what the scheduler and the pictures read

    @property
    def req_to_blocks(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for table in self.tables:
            for rid, blocks in table.items():
                out.setdefault(rid, []).extend(b for b in blocks if b)
        return out

    def block_ids(self, request_id: str) -> list[int]:
        return [b for table in self.tables for b in table.get(request_id, ()) if b]

    def group_tables(self, request_id: str) -> list[list[int]]:
        """Each group's block table of the request, null blocks (0) included, as vLLM's
        `get_block_ids` gives them."""
        return [list(table.get(request_id, ())) for table in self.tables]

    def empty_slots(self, running) -> int:
        """Allocated slots not yet written, over every group's table of the running requests
        (a table's end, in tokens, less the request's computed tokens)."""
        bs, out = self.block_size, 0
        for table in self.tables:
            for r in running:
                blocks = table.get(r.request_id)
                if blocks:
                    out += len(blocks) * bs - r.num_computed
        return out

    def held_by_group(self) -> list[int]:
        """Real blocks each group's tables hold now (a block shared by requests counts once)."""
        return [len({b for blocks in table.values() for b in blocks if b}) for table in self.tables]

    def end_step(self) -> None:
        """Nothing: vLLM caches a block when it is allocated."""

    # -- the cache hit (find_longest_cache_hit)

    def _get(self, h: int, group_ids: list[int]) -> list[int] | None:
        """block_pool.py `get_cached_block`: the first block of (hash, group) for every group, or None."""
        out = []
        get = self.pool.cached.get
        for g in group_ids:
            block = get((h, g))
            if block is None:
                return None
            out.append(block if type(block) is int else next(iter(block)))
        return out

    def _full_hit(self, hashes: list[int], max_length: int, group_ids: list[int]) -> tuple[list[list[int]], int]:
        bs = self.block_size
        computed: list[list[int]] = [[] for _ in group_ids]
        for h in hashes[: max_length // bs]:
            blocks = self._get(h, group_ids)
            if blocks is None:
                break
            for c, b in zip(computed, blocks):
                c.append(b)
        return computed, len(computed[0]) * bs

    def _sliding_hit(self, hashes: list[int], max_length: int, group_ids: list[int], window: int) -> tuple[list[list[int]], int]:
        """SlidingWindowManager.find_longest_cache_hit: right to left, the first run of
        `cdiv(window - 1, block_size)` cached blocks; nulls before it."""
        bs = self.block_size
        need = cdiv(window - 1, bs)
        n = max_length // bs
        computed = [[0] * n for _ in group_ids]
        run = 0
        found = False
        for i in range(n - 1, -1, -1):
            blocks = self._get(hashes[i], group_ids)
            if blocks is not None:
                for c, b in zip(computed, blocks):
                    c[i] = b
                run += 1
                if run >= need:
                    for c in computed:
                        del c[i + run:]
                    found = True
                    break
            else:
                run = 0
        if not found:  # the first `run` blocks hit even if fewer than `need`
            for c in computed:
                del c[run:]
        return computed, len(computed[0]) * bs

    def lookup(self, req: SimRequest) -> tuple[tuple[list[int], ...], int]:
        """`get_computed_blocks` -> `HybridKVCacheCoordinator.find_longest_cache_hit`."""
        empty = tuple([] for _ in self.groups)
        if not self.enable_caching:
            return empty, 0
        bs = self.block_size
        req.update_hashes(bs)
        hashes = req.block_hashes
        by_group: list[list[int] | None] = [None] * len(self.groups)
        length_by_group = [0] * len(self.groups)
        hit_length = req.prompt_len + req.num_generated - 1  # max_cache_hit_length = num_tokens - 1
        longest = 0
        simple = len(self.spec_groups) == 2 and self.spec_groups[0][0].window is None
        while True:
            curr = hit_length
            for kind, gids in self.spec_groups:
                if kind.window is None and by_group[gids[0]] is not None:  # downward-closed: trim only
                    curr = min(curr, length_by_group[gids[0]])
                    continue
                if kind.window is None:
                    blocks, new = self._full_hit(hashes, curr, gids)
                else:
                    blocks, new = self._sliding_hit(hashes, curr, gids, kind.window)
                curr = new
                for g, b in zip(gids, blocks):
                    by_group[g], length_by_group[g] = b, new
                longest = max(longest, curr)
            if curr >= hit_length:
                break
            hit_length = curr
            if simple:
                break
        for kind, gids in self.spec_groups:  # full attention trimmed to the final length
            if kind.window is None:
                for g in gids:
                    if by_group[g] is not None:
                        del by_group[g][cdiv(hit_length, bs):]
        uncached = longest - hit_length
        self.junction[req.request_id] = hit_length + uncached if uncached else 0
        return tuple(b if b is not None else [] for b in by_group), hit_length

    # -- allocation (kv_cache_manager.py allocate_slots)

    def _skipped(self, g: int, num_computed: int) -> int:
        w = self.windows[g]
        return 0 if w is None else max(0, num_computed - w + 1)

    def _num_blocks_to_allocate(self, g: int, rid: str, num_tokens: int, new_computed: list[int],
                                total_computed: int, cap: bool) -> int:
        """single_type_kv_cache_manager.py `get_num_blocks_to_allocate`."""
        required = cdiv(num_tokens, self.block_size)
        if cap and self.caps[g] is not None:
            required = min(required, self.caps[g])
        held = len(self.tables[g].get(rid, ()))
        if rid in self.num_cached[g]:
            return max(required - held, 0)
        skipped_blocks = self._skipped(g, total_computed) // self.block_size
        new = max(required - max(skipped_blocks, len(new_computed) + held), 0)
        ref = self.pool.ref_cnt
        evictable = sum(1 for b in new_computed[max(0, skipped_blocks - held):] if b and ref[b] == 0)
        return new + evictable

    def _remove_skipped(self, g: int, rid: str, processed: int) -> None:
        """`remove_skipped_blocks`: free the blocks before the window, tail first, null in their place."""
        skipped = self._skipped(g, processed)
        if skipped <= 0:
            return
        blocks = self.tables[g].get(rid)
        if not blocks:
            return
        freed = []
        for i in range(min(skipped // self.block_size, len(blocks)) - 1, -1, -1):
            if blocks[i] == 0:
                break
            freed.append(blocks[i])
            blocks[i] = 0
        if freed:
            self.pool.free_blocks(freed)

    def allocate_slots(
        self,
        req: SimRequest,
        num_new_tokens: int,
        hit_blocks: tuple[list[int], ...] | None = None,
        num_hit_tokens: int = 0,
        full_sequence_must_fit: bool = False,
    ) -> list[int] | None:
        rid = req.request_id
        if self.event_log is not None:
            self.pool.event_owner = rid
        hits = hit_blocks or tuple([] for _ in self.groups)
        mml = self.max_model_len
        local = req.num_computed + num_hit_tokens
        total = min(local, mml)
        free = self.pool.num_free
        ng = range(len(self.groups))
        if full_sequence_must_fit:
            full = min(req.num_tokens, mml)
            if sum(self._num_blocks_to_allocate(g, rid, full, hits[g], total, True) for g in ng) > free:
                return None
        need_slots = min(total + num_new_tokens, mml)
        for g in ng:
            self._remove_skipped(g, rid, total)
        free = self.pool.num_free
        if sum(self._num_blocks_to_allocate(g, rid, need_slots, hits[g], local, False) for g in ng) > free:
            return None
        if rid not in self.tables[0]:  # `allocate_new_computed_blocks`: touch every group's hits first
            for g in ng:
                skipped_blocks = self._skipped(g, local) // self.block_size
                adopted = hits[g][skipped_blocks:] if skipped_blocks else hits[g]
                if self.enable_caching:
                    self.pool.touch([b for b in adopted if b])
                table = self.tables[g][rid] = [0] * skipped_blocks + list(adopted)
                self.num_cached[g][rid] = len(table)
        new_blocks: list[int] = []
        bs = self.block_size
        for g in ng:
            table = self.tables[g][rid]
            n = cdiv(need_slots, bs) - len(table)
            if n > 0:
                got = self.pool.get_new_blocks(n)
                table.extend(got)
                new_blocks.extend(got)
        if self.enable_caching:
            cacheable = min(total + num_new_tokens, req.num_tokens) // bs * bs  # `_align_cacheable`
            for g in ng:
                self._cache_blocks(g, req, cacheable)
        return new_blocks

    def _mask(self, g: int, req: SimRequest, start: int, end: int) -> list[bool] | None:
        """SlidingWindowManager.reachable_block_mask (no EAGLE, alignment = block size)."""
        w = self.windows[g]
        if w is None:
            return None
        bs = self.block_size
        need = cdiv(w - 1, bs)
        mask = [False] * (end - start)
        if self.retention is None:
            segment = bs
        else:
            segment = self.retention or None
        if segment is not None:
            per_segment = segment // bs
            if need >= per_segment:
                return None
            for i in range(start, end):
                if i % per_segment >= per_segment - need:
                    mask[i - start] = True
        if self.retention is not None:
            boundaries = [req.prompt_len - 1]
            if self.junction.get(req.request_id):
                boundaries.append(self.junction[req.request_id])
            for boundary in boundaries:
                stop = boundary // bs
                for j in range(max(start, stop - need), min(end, stop)):
                    mask[j - start] = True
        return mask

    def _cache_blocks(self, g: int, req: SimRequest, num_tokens: int) -> None:
        """`cache_blocks` -> block_pool.py `cache_full_blocks` with the group's mask."""
        rid = req.request_id
        done = self.num_cached[g].get(rid, 0)
        full = num_tokens // self.block_size
        if done >= full:
            return
        if len(req.block_hashes) < full:
            req.update_hashes(self.block_size)
        mask = self._mask(g, req, done, full)
        pool = self.pool
        block_hash, insert = pool.block_hash, pool.cached.setdefault
        table = self.tables[g][rid]
        hashes = req.block_hashes
        stored: list[int] | None = [] if self.event_log is not None else None
        for i in range(done, full):
            b = table[i]
            if not b or (mask is not None and not mask[i - done]):
                continue
            if stored is not None:
                stored.append(i)
            key = (hashes[i], g)
            if block_hash[b] is None:
                block_hash[b] = key
                if insert(key, b) != b:
                    pool.add_holder(key, b)
            self.ever_cached.add(hashes[i])
            if req.cache_salt is not None:
                self.ever_cached_content.add(req.content_hashes[i])
        if stored is not None:
            self.event_log.append(("stored", rid, done, [hashes[i] for i in stored], g, stored))
        self.num_cached[g][rid] = full

    def free(self, req: SimRequest) -> None:
        """`KVCacheCoordinator.free`: each group frees its blocks tail first, group by group."""
        rid = req.request_id
        for g in range(len(self.groups)):
            self.num_cached[g].pop(rid, None)
            self.pool.free_blocks(reversed(self.tables[g].pop(rid, [])))
        self.junction.pop(rid, None)
