"""SGLang's radix-tree cache policy (pagetrace/sim/radix.py) against references written here.

`Reference` is the policy's flows written plainly from SGLang's code (admission locks the
match, allocation evicts the shortfall, a prefill is checkpointed and a finished request
released after the step, a preempted one released at once) over a plain page allocator
(a list: taken from the front, freed pages put back at the front for page size > 1, at
the back for page size 1) and one of two trees:
- `NaiveTree`: the radix tree as a flat list of segments, each holding its whole token
  path, found by linear scans; eviction takes the unlocked leaf with the smallest (access
  time, creation) again and again;
- `SglangTree`: SGLang's own `RadixCache` (python/sglang/srt/mem_cache/radix_cache.py),
  loaded from the sglang source at $PAGETRACE_SGLANG_SRC (a directory holding `sglang/`,
  e.g. an unpacked `pip download sglang --no-deps` wheel) or an installed sglang, with its
  heavy imports stubbed and its clock made a counter; the tests skip with the reason
  without it.
Both run through the real scheduler beside `SglangRadixCache`, and every step's record,
every block table and the free list's order must agree.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import os
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pagetrace.sim.radix import SglangRadixCache  # noqa: E402
from pagetrace.sim.request import FINISHED, SimRequest  # noqa: E402
from pagetrace.sim.run import simulate  # noqa: E402
from pagetrace.sim.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from sim_drive import drive  # noqa: E402


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the reference policy --------------------------------------------------------------


class RefPool:
    def __init__(self, ref: Reference, num_blocks: int) -> None:
        self.ref, self.num_blocks, self.evictions = ref, num_blocks, 0

    @property
    def num_free(self) -> int:
        return len(self.ref.free_list) + self.ref.tree.evictable()


class Reference:
    name, label = "reference", "reference"

    def __init__(self, make_tree, num_blocks: int, page_size: int, max_model_len: int = 1 << 30) -> None:
        self.block_size, self.enable_caching, self.max_model_len = page_size, True, max_model_len
        self.free_list = list(range(1, num_blocks))
        self.pool = RefPool(self, num_blocks)
        self.tree = make_tree(self, page_size)
        self.req_to_blocks: dict[str, list[int]] = {}
        self.node, self.protected, self.pending, self.chunked = {}, {}, {}, {}
        self.ever_cached, self.ever_cached_content = set(), set()  # the scheduler's causes are recounted below
        self.inserted: set[tuple] = set()  # (salt, tokens up to a page end) of every page ever inserted
        self.causes = {"hit": 0, "partial block": 0, "evicted": 0, "different extra key": 0, "first seen": 0}
        self.why: dict | None = None
        self.last = None

    def give_back(self, pages: list[int]) -> None:
        if self.block_size > 1:
            self.free_list[:0] = pages
        else:
            self.free_list += pages

    def take(self, n: int) -> list[int]:
        if n > len(self.free_list):
            self.tree.evict(n - len(self.free_list))
        out = self.free_list[:n]
        del self.free_list[:n]
        return out

    def block_ids(self, rid: str) -> list[int]:
        return self.req_to_blocks.get(rid, [])

    def lookup(self, req: SimRequest):
        ps = self.block_size
        n = (req.num_tokens - 1) // ps * ps
        self.why = None
        if n <= 0:
            return [], 0
        pages, node = self.tree.match(req.token_slice(0, n), req.cache_salt)
        self.last = node
        self.why = self.classify(req, len(pages))
        return pages, len(pages) * ps

    def classify(self, req, hit_pages: int) -> dict:
        """Each prompt token's outcome, from the pages ever inserted (causes.py's categories)."""
        ps, prompt = self.block_size, req.prompt_len
        lookup_pages = (prompt - 1) // ps
        why = dict.fromkeys(self.causes, 0)
        why["hit"], why["partial block"] = hit_pages * ps, prompt - lookup_pages * ps
        salts = {salt for salt, _ in self.inserted}
        for i in range(hit_pages, lookup_pages):
            tokens = req.token_slice(0, (i + 1) * ps)
            if (req.cache_salt, tokens) in self.inserted:
                why["evicted"] += ps
            elif any((salt, tokens) in self.inserted for salt in salts if salt != req.cache_salt):
                why["different extra key"] += ps
            else:
                why["first seen"] += ps
        return why

    def allocate_slots(self, req, n, hits=None, num_hit=0, full=False):
        rid, ps, mml = req.request_id, self.block_size, self.max_model_len
        avail = len(self.free_list) + self.tree.evictable()
        if rid not in self.req_to_blocks:
            hits = list(hits or [])
            node = self.last if hits else self.tree.root
            self.tree.lock(node)
            start = req.num_computed + num_hit
            need = cdiv(min(start + n, mml), ps) - len(hits)
            avail = len(self.free_list) + self.tree.evictable()
            if need > avail or (full and cdiv(min(req.num_tokens, mml), ps) - len(hits) > avail):
                self.tree.unlock(node)
                return None
            new = self.take(need)
            self.req_to_blocks[rid], self.node[rid], self.protected[rid] = hits + new, node, len(hits)
            if req.num_preemptions == 0:
                why = self.why if self.why is not None else self.classify(req, 0)
                for cause, n_tokens in why.items():
                    self.causes[cause] += n_tokens
            self.why = None
        else:
            start = req.num_computed
            need = cdiv(min(start + n, mml), ps) - len(self.req_to_blocks[rid])
            if need > avail:
                return None
            new = self.take(max(need, 0))
            self.req_to_blocks[rid] += new
        if req.num_computed < req.prompt_len or req.num_tokens - req.num_computed > 1:
            self.pending[rid] = (req, min(start + n, req.num_tokens))
            if start + n < req.num_tokens:  # its prefill goes on next step: SGLang's chunked_req
                self.chunked[rid] = True
            else:
                self.chunked.pop(rid, None)
        return new

    def allocate_decode(self, req):
        return self.allocate_slots(req, 1)

    def free(self, req) -> None:
        rid = req.request_id
        self.chunked.pop(rid, None)
        if req.status == FINISHED:
            self.pending[rid] = (req, -1)
            return
        self.pending.pop(rid, None)
        table = self.req_to_blocks.pop(rid)
        self.give_back(table[self.protected.pop(rid):])
        self.tree.unlock(self.node.pop(rid))

    def end_step(self) -> None:
        """process_batch_result_*: in one free group, in batch order, finished requests released
        and completed prefills checkpointed; then (scheduler.py `get_next_batch_to_run`:
        `stash_chunked_request`, at the top of the next step) the request whose prefill stopped
        mid-way is checkpointed, its duplicates freed on their own, after the group."""
        group: list[int] = []
        later = []
        for req, up_to in sorted(self.pending.values(), key=lambda e: e[0].seq):
            rid = req.request_id
            if up_to >= 0 and self.chunked.pop(rid, False):
                later.append((req, up_to))
                continue
            if up_to < 0:
                self.checkpoint(req, min(req.num_computed, len(self.req_to_blocks[rid]) * self.block_size), group)
                table = self.req_to_blocks.pop(rid)
                group += table[self.protected.pop(rid):]
                self.tree.unlock(self.node.pop(rid))
            else:
                self.checkpoint(req, up_to, group)
        self.pending.clear()
        if group:
            self.give_back(group)
        for req, up_to in later:
            own: list[int] = []
            self.checkpoint(req, up_to, own)
            if own:
                self.give_back(own)

    def checkpoint(self, req, up_to: int, group: list[int]) -> None:
        """radix_cache.py `checkpoint`: insert the page-aligned computed tokens, then (split_prompt)
        insert the page-aligned prompt again when it is shorter, so the prompt ends at a node;
        free the request's copies of pages the tree already held, rebind, move the lock."""
        rid, ps = req.request_id, self.block_size
        k = up_to // ps
        table, protected = self.req_to_blocks[rid], self.protected[rid]
        tokens = req.token_slice(0, k * ps)
        self.inserted.update((req.cache_salt, tokens[: j * ps]) for j in range(1, k + 1))
        if hasattr(self.tree, "checkpoint"):  # SGLang's own RadixCache.checkpoint
            node = self.tree.checkpoint(req, tokens, table, protected, self.node[rid], group)
        else:
            prefix = self.tree.insert(tokens, table[:k], req.cache_salt) // ps
            prompt = req.prompt_len // ps * ps
            if 0 < prompt < k * ps:
                self.tree.insert(tokens[:prompt], table[: prompt // ps], req.cache_salt)
            pages, node = self.tree.match(tokens, req.cache_salt) if tokens else ([], self.tree.root)
            for i in range(protected, prefix):
                group.append(table[i])
                table[i] = pages[i]
            self.tree.unlock(self.node[rid])
            self.tree.lock(node)
        self.protected[rid] = k
        self.node[rid] = node


class Segment:
    def __init__(self, salt, path, start, pages, lock, time, ident) -> None:
        self.salt, self.path, self.start, self.pages = salt, path, start, pages
        self.lock, self.time, self.id = lock, time, ident


class NaiveTree:
    """Segments in a flat list; a segment covers path[start:], its parent ends at start."""

    root = None

    def __init__(self, ref: Reference, page_size: int) -> None:
        self.ref, self.ps, self.segments = ref, page_size, []
        self.clock, self.ids = 0, 0

    def find(self, salt, tokens, at):
        for s in self.segments:
            if s.salt == salt and s.start == at and s.path[: at + self.ps] == tuple(tokens[: at + self.ps]):
                return s
        return None

    def parent(self, s):
        for p in self.segments:
            if p.salt == s.salt and p.path == s.path[: s.start]:
                return p
        return None

    def is_leaf(self, s) -> bool:
        return not any(c.salt == s.salt and c.start == len(s.path) and c.path[: len(s.path)] == s.path for c in self.segments)

    def walk(self, tokens, salt):
        """Follow tokens from the root, stamping each segment; split the one where they diverge."""
        self.clock += 1
        tokens = tuple(tokens)
        at, pages, last = 0, [], None
        while at < len(tokens):
            s = self.find(salt, tokens, at)
            if s is None:
                break
            s.time = self.clock
            end = at
            while end + self.ps <= min(len(s.path), len(tokens)) and s.path[end : end + self.ps] == tokens[end : end + self.ps]:
                end += self.ps
            if end < len(s.path):  # split: s.path[:end] becomes a new segment in front of s
                self.ids += 1
                head = Segment(salt, s.path[:end], s.start, s.pages[: (end - s.start) // self.ps], s.lock, self.clock, self.ids)
                s.pages, s.start = s.pages[(end - s.start) // self.ps :], end
                self.segments.append(head)
                return end, pages + head.pages, head
            pages, at, last = pages + s.pages, end, s
        return at, pages, last

    def match(self, tokens, salt):
        _, pages, last = self.walk(tokens, salt)
        return pages, last

    def insert(self, tokens, pages, salt) -> int:
        at, _, _ = self.walk(tokens, salt)
        if at < len(tokens):
            self.ids += 1
            self.segments.append(Segment(salt, tuple(tokens), at, list(pages[at // self.ps :]), 0, self.clock, self.ids))
        return at

    def lock(self, s) -> None:
        while s is not None:
            s.lock += 1
            s = self.parent(s)

    def unlock(self, s) -> None:
        while s is not None:
            s.lock -= 1
            s = self.parent(s)

    def evictable(self) -> int:
        return sum(len(s.pages) for s in self.segments if s.lock == 0)

    def evict(self, num_pages: int) -> None:
        freed = 0
        while freed < num_pages:
            leaves = [s for s in self.segments if s.lock == 0 and self.is_leaf(s)]
            if not leaves:
                return
            x = min(leaves, key=lambda s: (s.time, s.id))
            self.segments.remove(x)
            self.ref.give_back(list(x.pages))
            self.ref.pool.evictions += len(x.pages)
            freed += len(x.pages)


# -- SGLang's own RadixCache, when its source is here ------------------------------------


REAL_MODULES = {"sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.base_prefix_cache",
                "sglang.srt.mem_cache.evict_policy", "sglang.srt.mem_cache.cache_init_params"}


def _sglang_root() -> str | None:
    root = os.environ.get("PAGETRACE_SGLANG_SRC")
    if root:
        return root if Path(root, "sglang/srt/mem_cache/radix_cache.py").is_file() else None
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = str(Path(list(spec.submodule_search_locations)[0]).parent)
    return root if Path(root, "sglang/srt/mem_cache/radix_cache.py").is_file() else None


def load_sglang_radix():
    """radix_cache.py and the three small modules it builds on, everything else stubbed."""
    root = _sglang_root()
    if root is None:
        pytest.skip("SGLang's radix_cache.py not found: set PAGETRACE_SGLANG_SRC to an unpacked sglang wheel (pip download sglang --no-deps)")
    pytest.importorskip("torch")

    class Anything:
        def __init__(self, *a, **k): pass
        def __call__(self, *a, **k): return Anything()
        def __getattr__(self, name): return Anything()
        def __mro_entries__(self, bases): return (object,)

    class Stub(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return Anything()

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if not name.startswith("sglang"):
                return None
            if name in REAL_MODULES:
                return importlib.util.spec_from_file_location(name, f"{root}/{name.replace('.', '/')}.py")
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

        def create_module(self, spec):
            return Stub(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    saved = {k: v for k, v in sys.modules.items() if k.startswith("sglang")}
    for k in saved:
        del sys.modules[k]
    finder = Finder()
    sys.meta_path.insert(0, finder)
    try:
        evict_policy = importlib.import_module("sglang.srt.mem_cache.evict_policy")
        utils = importlib.import_module("sglang.srt.mem_cache.utils")
        utils.get_eviction_strategy = lambda name, config=None: evict_policy.LRUStrategy()
        utils.split_node_hash_value = lambda hashes, n, page_size: (None, None)
        rc = importlib.import_module("sglang.srt.mem_cache.radix_cache")
        bpc = importlib.import_module("sglang.srt.mem_cache.base_prefix_cache")
    except Exception as exc:  # a newer sglang that needs more than these stubs
        pytest.skip(f"SGLang's radix_cache.py did not load standalone: {exc!r}")
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k.startswith("sglang")]:
            del sys.modules[k]
        sys.modules.update(saved)
    counter = itertools.count(1)
    rc.time = types.SimpleNamespace(monotonic=lambda: next(counter), perf_counter=lambda: 0.0)
    return rc, bpc


class SglangTree:
    def __init__(self, sglang, ref: Reference, page_size: int) -> None:
        import torch
        from array import array

        self.torch, self.array = torch, array
        self.rc, self.bpc = sglang
        self.ref, self.ps = ref, page_size
        self.freeing: list[int] | None = None
        tree = self

        class Allocator:  # what RadixCache.evict calls: free_segment(node.value)
            device = "cpu"

            def free_segment(self, slots, start_pos=0):
                pages = (slots[::page_size] // page_size).tolist()
                if tree.freeing is not None:  # checkpoint's duplicates: the step's free group
                    tree.freeing += pages
                    return
                tree.ref.give_back(pages)
                tree.ref.pool.evictions += len(pages)

        self.cache = self.rc.RadixCache.create_simulated(page_size=page_size, mock_allocator=Allocator())
        self.root = self.cache.root_node

    def key(self, tokens, salt):
        return self.rc.RadixKey(self.array("q", tokens), cache_salt=salt)

    def match(self, tokens, salt):
        node = self.cache.match_prefix(self.bpc.MatchPrefixParams(key=self.key(tokens, salt))).last_device_node
        slots = self.cache.path_device_indices(node)
        return (slots[:: self.ps] // self.ps).tolist(), node

    def insert(self, tokens, pages, salt) -> int:
        slots = self.torch.tensor([p * self.ps + j for p in pages for j in range(self.ps)], dtype=self.torch.int64)
        return self.cache.insert(self.bpc.InsertParams(key=self.key(tokens, salt), value=slots)).prefix_len

    def lock(self, node) -> None:
        self.cache.inc_lock_ref(node)

    def unlock(self, node) -> None:
        self.cache.dec_lock_ref(node)

    def checkpoint(self, req, tokens, table, protected, node, group):
        """`RadixCache.checkpoint` itself, on a stand-in `Req` whose kv row is `table`'s slots:
        what it frees goes into the step's free group, the row it rewrites back into `table`."""
        torch, ps = self.torch, self.ps
        row = torch.tensor([p * ps + j for p in table for j in range(ps)], dtype=torch.int64)[None, :]
        kv = types.SimpleNamespace(req_pool_idx=0, cache_protected_len=protected * ps, cache_inserted_len=0, swa_evict_floor=0)
        lock = self.bpc.TreeLock(node, self.cache.inc_lock_ref(node).to_dec_params())
        self.cache.dec_lock_ref(node)  # the lock the Reference took, now held as a TreeLock
        sreq = types.SimpleNamespace(
            kv=kv, lock=lock, last_node=node, priority=None, extra_key=None, cache_salt=req.cache_salt,
            origin_input_ids=req.token_slice(0, req.prompt_len), full_untruncated_fill_ids=self.array("q", tokens),
        )

        def write(index, values):
            row[index[0], index[1]] = values

        self.cache.req_to_token_pool = types.SimpleNamespace(req_to_token=row, write=write)
        self.freeing = group
        try:
            self.cache.checkpoint(sreq, up_to=len(tokens))
        finally:
            self.freeing = None
        table[: len(tokens) // ps] = (row[0, : len(tokens) : ps] // ps).tolist()
        assert kv.cache_protected_len == len(tokens)
        return sreq.last_node

    def evictable(self) -> int:
        return self.cache.evictable_size() // self.ps

    def evict(self, num_pages: int) -> None:
        self.cache.evict(self.bpc.EvictParams(num_tokens=num_pages * self.ps))


# -- workloads and the comparison ----------------------------------------------------------


def workload(seed: int, n: int, page_size: int, salts: bool = False) -> list[tuple]:
    """Requests as (id, prompt, output, arrival, salt): prompts from a few shared stems,
    some cut mid-page, so prefixes are shared, split and diverge."""
    import random

    rng = random.Random(seed)
    stems = [[rng.randrange(1, 50) for _ in range(rng.randrange(1, 5 * page_size + 3))] for _ in range(4)]
    out = []
    for i in range(n):
        stem = stems[rng.randrange(len(stems))]
        cut = rng.randrange(0, len(stem) + 1)
        prompt = stem[:cut] + [1000 + 37 * i + j for j in range(rng.randrange(1, 3 * page_size + 2))]
        salt = rng.choice([None, None, "a", "b"]) if salts else None
        out.append((f"r{i}", prompt, [7] * rng.randrange(1, 3 * page_size + 2), rng.randrange(0, n // 2 + 1), salt))
    return out


def requests(spec) -> list[SimRequest]:
    return [SimRequest(rid, list(p), list(o), arrival=a, cache_salt=s) for rid, p, o, a, s in spec]


def run(policy, spec, config: SchedulerConfig):
    """Each step's record, tables and free list, with the requests' cached-token counts."""
    sched = Scheduler(policy, config)
    pending = sorted(requests(spec), key=lambda r: r.arrival)
    trace = []
    for rec in drive(sched, pending, 20_000):
        free = list(policy.pool.free) if isinstance(policy, SglangRadixCache) else list(policy.free_list)
        tables = {rid: list(b) for rid, b in policy.req_to_blocks.items()}
        trace.append((rec.step, rec.admitted, rec.preempted, rec.finished, rec.allocated, rec.hit_tokens, rec.evicted,
                      rec.free_blocks, rec.used_blocks, tables, free))
    causes = policy.causes if isinstance(policy, Reference) else dict(sched.causes)
    return trace, {r.request_id: r.num_cached_tokens for r in pending}, sched.num_preemptions, causes


CASES = [  # page size, blocks, token budget, seed, requests, salts
    (1, 60, 64, 0, 30, False),
    (1, 200, 4096, 1, 40, True),
    (4, 24, 32, 2, 40, False),
    (4, 40, 4096, 3, 40, True),
    (16, 12, 64, 4, 30, False),
    (16, 30, 4096, 5, 40, True),
]


def check_against(make_tree, case) -> int:
    ps, blocks, budget, seed, n, salts = case
    spec = workload(seed, n, ps, salts)
    need = max(cdiv(len(p) + len(o) - 1, ps) for _, p, o, _, _ in spec)
    blocks = max(blocks, need + 2)
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=16)
    return compare(make_tree, spec, blocks, ps, config)


def compare(make_tree, spec, blocks: int, ps: int, config: SchedulerConfig) -> int:
    got = run(SglangRadixCache(blocks, ps), spec, config)
    want = run(Reference(make_tree, blocks, ps), spec, config)
    for g, w in zip(got[0], want[0]):
        assert g == w, f"step {g[0]} differs"
    assert len(got[0]) == len(want[0]) and got[1:] == want[1:]
    return sum(t[6] for t in got[0]) + got[2]  # evictions + preemptions: the case exercised them


# Prefills chunked by a small token budget while requests sharing their prefix finish: the
# chunk's duplicate pages are freed after the step's free group (stash_chunked_request).
CHUNK_CASES = [  # page size, blocks, budget, max_num_seqs, spec
    (2, 10, 8, 2, [("r0", [2, 2, 100, 100], [7], 2, None), ("r1", [2, 2, 6, 3, 3], [7] * 5, 1, None), ("r2", [2, 2, 6, 3], [7], 2, None),
                   ("r3", [2, 2], [7] * 4, 0, None), ("r4", [2, 2, 6, 3, 3, 104], [7] * 5, 1, None), ("r5", [2, 2, 6], [7] * 4, 0, None),
                   ("r6", [2], [7, 7], 2, None), ("r7", [2, 2, 6, 3, 3, 7, 2], [7], 0, None), ("r8", [2, 2, 6, 3, 3, 7, 2, 108], [7], 0, None)]),
    (4, 8, 8, 2, [("r0", [8, 4, 1, 7, 7, 4, 7, 100, 100, 100], [7] * 5, 2, None),
                  ("r1", [8, 4, 1, 7, 7, 4, 7, 6, 2, 1, 4, 3, 101, 101, 101], [7] * 7, 2, None), ("r2", [8, 4, 1, 7, 7, 102], [7, 7], 0, None),
                  ("r3", [8, 4, 1, 7, 7, 4, 7, 6, 2, 1, 4, 3, 1, 103, 103], [7] * 4, 1, None), ("r4", [8, 4, 1, 7, 7, 104], [7] * 5, 2, None),
                  ("r5", [8, 4, 1, 7, 7, 4, 7, 6, 2, 1, 4, 3, 1, 105, 105, 105], [7] * 4, 0, None), ("r6", [8, 106], [7], 0, None),
                  ("r7", [8, 4, 1, 7, 7, 4, 7, 6, 2, 1, 4, 3, 1, 2, 107, 107, 107], [7] * 7, 0, None),
                  ("r8", [8, 4, 1, 7, 7, 4, 7, 6, 2, 108, 108, 108], [7, 7, 7], 1, None)]),
]


@pytest.mark.parametrize("tree", ["naive", "sglang"])
@pytest.mark.parametrize("case", CHUNK_CASES, ids=[f"ps{c[0]}" for c in CHUNK_CASES])
def test_a_chunk_is_checkpointed_after_the_steps_free_group(tree, case, request):
    ps, blocks, budget, seqs, spec = case
    make_tree = NaiveTree if tree == "naive" else (lambda ref, p: SglangTree(request.getfixturevalue("sglang"), ref, p))
    compare(make_tree, spec, blocks, ps, SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=seqs))


@pytest.mark.parametrize("case", CASES, ids=[f"ps{c[0]}-blocks{c[1]}-budget{c[2]}-seed{c[3]}" for c in CASES])
def test_policy_matches_the_naive_tree(case):
    check_against(NaiveTree, case)


def test_the_cases_evict_and_preempt():
    """The small pools really evict and preempt (else the comparison above proves little)."""
    assert check_against(NaiveTree, CASES[2]) > 0 and check_against(NaiveTree, CASES[4]) > 0
    spec = workload(2, 40, 4, False)
    sched_result = simulate(requests(spec), 24, 4, SchedulerConfig(32, 16), policy="sglang")
    assert sched_result.num_preemptions > 0 and sched_result.policy.pool.evictions > 0


@pytest.fixture(scope="module")
def sglang():
    return load_sglang_radix()


@pytest.mark.parametrize("case", CASES, ids=[f"ps{c[0]}-blocks{c[1]}-budget{c[2]}-seed{c[3]}" for c in CASES])
def test_policy_matches_sglangs_own_radix_cache(sglang, case):
    check_against(lambda ref, ps: SglangTree(sglang, ref, ps), case)


def check_accounting(policy: SglangRadixCache) -> None:
    """Every usable page is in exactly one place (free list, tree, a request's own pages);
    counts, locks and the evictable leaves agree with the tree as it stands."""
    nodes, stack = [], list(policy.root.children.values())
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.children.values())
    tree = [p for n in nodes for p in n.pages]
    own = [p for rid, t in policy.req_to_blocks.items() for p in t[policy._protected[rid]:]]
    free = list(policy.pool.free)
    assert sorted(tree + own + free) == list(range(1, policy.pool.num_blocks))
    assert policy.pool.evictable == sum(len(n.pages) for n in nodes if n.lock_ref == 0)
    assert policy.evictable_leaves == {n for n in nodes if n.lock_ref == 0 and not n.children}
    holders = {}
    for t in policy.req_to_blocks.values():
        for p in t:
            holders[p] = holders.get(p, 0) + 1
    assert all(policy.pool.ref_cnt[p] == holders.get(p, 0) for p in range(policy.pool.num_blocks))
    for n in nodes:
        locks = 0
        for rid, locked in policy._node.items():
            while locked is not None and locked is not n:
                locked = locked.parent
            locks += locked is n
        assert n.lock_ref == locks
    for rid, t in policy.req_to_blocks.items():  # the tree's part of a table is the path to its locked node
        path, node = [], policy._node[rid]
        while node is not policy.root:
            path[:0] = node.pages
            node = node.parent
        assert t[: policy._protected[rid]] == path


@pytest.mark.parametrize("caching", [True, False])
@pytest.mark.parametrize("case", CASES[::2] + CASES[3:4], ids=lambda c: f"ps{c[0]}-seed{c[3]}" if isinstance(c, tuple) else str(c))
def test_pool_accounting_holds_after_every_step(case, caching):
    ps, blocks, budget, seed, n, salts = case
    spec = workload(seed, n, ps, salts)
    blocks = max(blocks, max(cdiv(len(p) + len(o) - 1, ps) for _, p, o, _, _ in spec) + 2)
    policy = SglangRadixCache(blocks, ps, enable_caching=caching)
    sched = Scheduler(policy, SchedulerConfig(budget, 16))
    pending = sorted(requests(spec), key=lambda r: r.arrival)
    while pending or sched.waiting or sched.running:
        while pending and pending[0].arrival <= sched.step_count:
            sched.add(pending.pop(0))
        sched.step()
        check_accounting(policy)
    assert not policy.req_to_blocks and policy.pool.num_free == blocks - 1
    if not caching:
        assert not policy.root.children and sorted(policy.pool.free) == list(range(1, blocks))


# -- hand-built scenarios, numbers worked out by hand ----------------------------------------


def sim(reqs, num_blocks, ps, **kw):
    return simulate(reqs, num_blocks, ps, SchedulerConfig(max_num_batched_tokens=4096), policy="sglang", **kw)


@pytest.mark.parametrize("ps, hit", [(16, 0), (1, 10)])
def test_prefix_shorter_than_a_page_hits_only_with_page_size_1(ps, hit):
    shared = list(range(1, 11))
    a = SimRequest("a", shared + list(range(100, 120)), [7])
    b = SimRequest("b", shared + list(range(200, 220)), [7], arrival=1)
    sim([a, b], 64, ps)
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, hit)


def test_prefix_longer_than_a_page_hits_whole_pages():
    shared = list(range(1, 41))  # 2.5 pages of 16
    a = SimRequest("a", shared + [500], [7])
    b = SimRequest("b", shared + [600, 601], [7], arrival=1)
    c = SimRequest("c", shared[:32], [7], arrival=2)  # exactly two pages: at most prompt - 1 tokens hit
    sim([a, b, c], 64, 16)
    assert (b.num_cached_tokens, c.num_cached_tokens) == (32, 16)


def test_same_step_duplicates_are_freed_and_the_table_rebound():
    """A and B prefill the same 8 tokens in one step (no hit: nothing is in the tree before the
    step ends; vLLM would hit). A's checkpoint inserts pages 1, 2, 3; B's insert splits A's
    node after page 2, frees B's own copies 4, 5 to the front of the free list and rebinds
    B to 1, 2. Step 1: each decodes into a new page, taken from the front: 4, then 5."""
    a = SimRequest("a", list(range(1, 13)), [7, 7, 7])
    b = SimRequest("b", list(range(1, 9)) + [100, 101, 102, 103], [7, 7, 7])
    res = sim([a, b], 16, 4, tables_at=[0, 1])
    assert res.tables_at[0] == {"a": [1, 2, 3], "b": [1, 2, 6]}
    assert res.tables_at[1] == {"a": [1, 2, 3, 4], "b": [1, 2, 6, 5]}
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 0)
    assert res.steps[0].free_blocks == 15 - 4


def test_eviction_order_lru_leaf_first_and_locked_nodes_kept():
    """Page size 4, 16 pages. Step 0: A (1..12) and B (1..8, 100..103) finish; the tree is
    [1..8: pages 1 2] -> {[9..12: 3], [100..103: 6]}, B's copies 4 5 freed to the front.
    B's insert touched A's tail [9..12] before splitting it, then B's match touched the
    split head and [100..103]: [9..12] is the least recently used leaf.
    Step 1: C (1..8, 200..203) hits 8 tokens and stays running (locks [1..8]).
    Step 2: C's decode takes page 5 first; D needs 11 pages, 9 are free and 2 evictable:
    evict [9..12] then [100..103] (each put at the front), never the locked [1..8]."""
    a = SimRequest("a", list(range(1, 13)), [7])
    b = SimRequest("b", list(range(1, 9)) + [100, 101, 102, 103], [7])
    c = SimRequest("c", list(range(1, 9)) + [200, 201, 202, 203], [7, 7], arrival=1)
    d = SimRequest("d", list(range(300, 344)), [7, 7], arrival=2)
    res = sim([a, b, c, d], 16, 4, tables_at=[0, 1, 2])
    assert res.tables_at[1] == {"c": [1, 2, 4]}
    assert c.num_cached_tokens == 8
    assert res.tables_at[2]["d"] == [6, 3, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert res.steps[2].evicted == 2
    policy = res.policy
    assert [1, 2] in [n.pages for n in policy.root.children.values()]  # the locked prefix survived


def test_a_parent_is_evicted_only_after_its_children():
    """Page size 1, slots 1..9. A (tokens 1 2 3 4) leaves one node in slots 1-4. B (1 2 9)
    matches 1 2, which splits it into [1 2] -> [3 4], and adds [9] in slot 5: free 6..9.
    E needs 8 slots, 4 are free: evict the leaves [3 4] (touched first, by B's lookup) and
    [9]; only then is their parent [1 2] a leaf, and 4 + 2 + 1 < 8 evicts it too. Page size 1
    puts freed slots at the BACK of the free list (TokenToKVPoolAllocator.free)."""
    a = SimRequest("a", [1, 2, 3, 4], [7])
    b = SimRequest("b", [1, 2, 9], [7], arrival=1)
    e = SimRequest("e", list(range(100, 108)), [7, 7], arrival=2)
    res = sim([a, b, e], 10, 1, tables_at=[2])
    assert b.num_cached_tokens == 2
    assert res.tables_at[2]["e"] == [6, 7, 8, 9, 3, 4, 5, 1]
    assert res.steps[2].evicted == 5


def test_an_insert_stamps_the_nodes_it_walks():
    """`_insert_helper` stamps every node it passes, even one it then splits off. Page size 4,
    pages 1..11; A (1..12), X (50..53), B (1..8, 100..103) all finish in step 0, released in
    that order. B's insert passes A's node and splits it: the tail [9..12] (page 3) is now
    newer than X's leaf (page 4). D needs 7 pages with 6 free: X's leaf is evicted, not page 3."""
    a = SimRequest("a", list(range(1, 13)), [7])
    x = SimRequest("x", [50, 51, 52, 53], [7])
    b = SimRequest("b", list(range(1, 9)) + [100, 101, 102, 103], [7])
    d = SimRequest("d", list(range(300, 328)), [7, 7], arrival=1)
    res = sim([a, x, b, d], 12, 4, tables_at=[0, 1])
    assert res.steps[0].free_blocks == 11  # 6 free, 5 evictable
    assert res.tables_at[1]["d"] == [4, 5, 6, 8, 9, 10, 11]


def test_cli_policy(tmp_path):
    from typer.testing import CliRunner

    from pagetrace.cli import app

    bad = CliRunner().invoke(app, ["simulate", "--policy", "lru", "--requests", "5"])
    assert bad.exit_code == 2 and "--policy" in bad.output and "lru" in bad.output
    import json

    for policy in ("vllm", "sglang"):
        out = CliRunner().invoke(app, ["simulate", "--policy", policy, "--requests", "20", "--shared-prefix", "40", "--json"])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.stdout)
        assert doc["config"]["policy"] == policy
        assert doc["summary"]["waste"][0]["system"] == ("SGLang (radix)" if policy == "sglang" else "vLLM (paged)")
        out = CliRunner().invoke(app, ["simulate", "--policy", policy, "--requests", "5", "--n", "3", "--json"])
        doc = json.loads(out.stdout)
        assert doc["summary"]["requests"] == (20 if policy == "sglang" else 15)
        assert doc["summary"]["prefix_requests"] == (5 if policy == "sglang" else 0)


def test_the_prompt_is_split_off_so_eviction_can_keep_it():
    """radix_cache.py `checkpoint(split_prompt=True)` re-inserts the page-aligned prompt, so a
    finished request's node ends at its prompt and its output is a leaf of its own. Page size
    1, slots 1..6, budget 4. r1 ([8] -> 3 8) finishes in step 2 leaving [8] -> [3]; r6
    ([8 5]) matches [8] in step 4, when one slot must be evicted: the output leaf [3] goes,
    the prompt [8] stays (without the split the whole node [8 3] went: 2 slots, no hit)."""
    spec = [("r1", [8], [3, 8], 1), ("r5", [7, 1, 5, 6], [5, 1], 2), ("r6", [8, 5], [6], 2), ("r8", [7, 1, 5, 8], [6, 7, 3], 0)]
    reqs = [SimRequest(i, p, o, arrival=a) for i, p, o, a in spec]
    res = simulate(reqs, 7, 1, SchedulerConfig(max_num_batched_tokens=4, max_num_seqs=4), policy="sglang")
    assert res.steps[4].evicted == 1
    assert reqs[2].num_cached_tokens == 1


def test_parallel_sampling_sends_the_prompt_first():
    """tokenizer_manager.py "Cache the common prefix for parallel sampling": a request with
    n > 1 is first sent with max_new_tokens=0; its n samples go out once it has finished.
    Page size 16, prompt 40: the prefix request prefills alone and finishes in its first
    step, leaving 2 whole pages in the tree; the 4 samples are admitted the next step and
    each matches those 32 tokens (the vLLM policy: sample 0 computes, the others hit)."""
    from pagetrace.sim.workload import SyntheticSpec, synthetic

    reqs = synthetic(SyntheticSpec(3, (40, 40), (5, 5), 0, 4, 0.2, 0))
    res = simulate(reqs, 100, 16, SchedulerConfig(max_num_batched_tokens=4096), policy="sglang")
    assert res.prefix_requests == 3 and len(res.requests) == 15
    by_id = {r.request_id: r for r in res.requests}
    for g in ("0", "1", "2"):
        prefix = by_id[f"{g}.prefix"]
        assert (prefix.num_cached_tokens, prefix.first_scheduled, prefix.finished_step) == (0, prefix.arrival, prefix.arrival)
        samples = [by_id[f"{g}.{k}"] for k in range(4)]
        assert [s.num_cached_tokens for s in samples] == [32] * 4
        assert [s.first_scheduled for s in samples] == [prefix.finished_step + 1] * 4
    vllm = simulate(synthetic(SyntheticSpec(3, (40, 40), (5, 5), 0, 4, 0.2, 0)), 100, 16, policy="vllm")
    assert vllm.prefix_requests == 0 and [r.num_cached_tokens for r in vllm.requests[:4]] == [0, 32, 32, 32]


def test_a_prefix_request_id_never_takes_a_trace_id():
    from pagetrace.sim.workload import parse_trace

    trace = '{"id": "x", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "output_len": 2, "n": 2}\n' \
            '{"id": "x.prefix", "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9], "output_len": 2, "arrival": 3}'
    res = simulate(parse_trace(trace, 2), 20, 2, policy="sglang")
    assert [(r.request_id, r.num_cached_tokens, r.first_scheduled) for r in res.requests] == [
        ("x.prefix.prefix", 0, 0), ("x.0", 8, 1), ("x.1", 8, 1), ("x.prefix", 8, 3)]
