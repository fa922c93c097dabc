"""The hybrid block manager against vLLM's own `KVCacheManager`, call by call, no engine and no
scheduler: the same requests looked up, allocated, grown and freed on both, and after every
call the same hit, the same answer (blocks or None), each group's block table of every live
request, and the same KV events per group (vllm/v1/core/kv_cache_manager.py over
`HybridKVCacheCoordinator`, vLLM 0.32, a full-attention and a sliding-window group over one
pool; the requests are vLLM's own `Request` with its sha256 block hasher).

The calls are what vLLM's scheduler makes (vllm/v1/core/sched/scheduler.py): a new request's
`get_computed_blocks`, then `allocate_slots(request, chunk, num_new_computed_tokens=hit,
new_computed_blocks=..., full_sequence_must_fit=True)`; a running one's
`allocate_slots(request, n)`; `free` at the end. The windows sit at, one short of and one past
a block boundary (block size 4). tests/sim/test_sim_hybrid_vllm.py (-m vllm) holds the same
policy to vLLM's whole scheduler. Skips with the reason where vLLM is not installed.
"""

from __future__ import annotations

import pytest

from pagetrace.sim.hybrid import FULL, SLIDING, HybridVllmPrefixCaching, KVGroup, LayerKind
from pagetrace.sim.request import SimRequest
from pagetrace.sim.vllm_hash import block_hashes

pytest.importorskip("vllm.v1.core.kv_cache_manager", reason="vLLM is not installed: its KVCacheManager is the reference")

BS, MML, IN_FLIGHT = 4, 256, 64


def windows(window) -> tuple:
    """One sliding window, or several (one group each)."""
    return window if isinstance(window, tuple) else (window,)


class Vllm:
    def __init__(self, num_blocks: int, window: int, retention: int | None, caching: bool = True, bs: int = 4) -> None:
        import torch
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

        common = dict(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
        kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], prefix_cache_retention_interval=retention,
                            kv_cache_groups=[KVCacheGroupSpec(["full.0"], FullAttentionSpec(**common))]
                            + [KVCacheGroupSpec([f"sw.{k}"], SlidingWindowSpec(**common, sliding_window=w)) for k, w in enumerate(windows(window))])
        self.mgr = KVCacheManager(kvc, MML, bs, bs, max_in_flight_tokens=IN_FLIGHT, enable_caching=caching, enable_kv_cache_events=True)
        init_none_hash(sha256)
        self.hasher = get_request_block_hasher(bs, sha256)
        self.reqs: dict = {}

    def add(self, rid, prompt, outputs, chunk):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request, RequestStatus

        req = Request(rid, list(prompt), SamplingParams(max_tokens=len(outputs), ignore_eos=True), None, block_hasher=self.hasher)
        blocks, hit, boundary = self.mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        n = min(chunk, len(prompt) - hit)
        got = self.mgr.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks, full_sequence_must_fit=True)
        if got is None:
            return hit, None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = hit + n
        self.reqs[rid] = (req, list(outputs))
        self._sample(rid)
        return hit, True

    def _sample(self, rid):
        req, outputs = self.reqs[rid]
        if req.num_computed_tokens == req.num_tokens:  # the prompt is in: the step samples the next token
            req.append_output_token_ids(outputs[req.num_output_tokens])

    def step(self, rid, n):
        req, _ = self.reqs[rid]
        if self.mgr.allocate_slots(req, n) is None:
            return None
        req.num_computed_tokens += n
        self._sample(rid)
        return True

    def free(self, rid):
        self.mgr.free(self.reqs.pop(rid)[0])

    def preempt(self, rid):
        """scheduler.py `_preempt_request`: freed, num_computed_tokens 0, looked up again on readmission."""
        from vllm.v1.request import RequestStatus

        req, outputs = self.reqs[rid]
        self.mgr.free(req)
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        blocks, hit, boundary = self.mgr.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        n = req.num_tokens - hit
        if self.mgr.allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks, full_sequence_must_fit=True) is None:
            del self.reqs[rid]
            return hit, None
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = hit + n
        self._sample(rid)
        return hit, True

    def tables(self):
        return {rid: [list(g) for g in self.mgr.get_block_ids(rid)] for rid in self.reqs}

    def events(self):
        from vllm.distributed.kv_events import BlockRemoved, BlockStored

        out = []
        for ev in self.mgr.take_events():
            kind = "stored" if isinstance(ev, BlockStored) else "removed" if isinstance(ev, BlockRemoved) else "cleared"
            out += [(kind, h, ev.group_idx) for h in ev.block_hashes]
        return out


class Sim:
    def __init__(self, num_blocks: int, window: int, retention: int | None, caching: bool = True, bs: int = 4) -> None:
        groups = [KVGroup(LayerKind(FULL), 1)] + [KVGroup(LayerKind(SLIDING, w), 1) for w in windows(window)]
        self.bs = bs
        self.policy = HybridVllmPrefixCaching(groups, num_blocks, bs, enable_caching=caching, max_model_len=MML,
                                              max_in_flight_tokens=IN_FLIGHT, retention=retention)
        self.log = self.policy.record_events()
        self.reqs: dict[str, SimRequest] = {}
        self.external: dict = {}

    def add(self, rid, prompt, outputs, chunk):
        req = SimRequest(rid, list(prompt), list(outputs))
        blocks, hit = self.policy.lookup(req)
        n = min(chunk, len(prompt) - hit)
        if self.policy.allocate_slots(req, n, blocks, hit, full_sequence_must_fit=True) is None:
            return hit, None
        req.num_computed = hit + n
        self.reqs[rid] = req
        self._sample(req)
        return hit, True

    def _sample(self, req):
        if req.num_computed == req.num_tokens:
            req.num_generated += 1

    def step(self, rid, n):
        req = self.reqs[rid]
        if self.policy.allocate_slots(req, n) is None:
            return None
        req.num_computed += n
        self._sample(req)
        return True

    def free(self, rid):
        self.policy.free(self.reqs.pop(rid))

    def preempt(self, rid):
        req = self.reqs[rid]
        self.policy.free(req)
        req.num_computed = 0
        blocks, hit = self.policy.lookup(req)
        n = req.num_tokens - hit
        if self.policy.allocate_slots(req, n, blocks, hit, full_sequence_must_fit=True) is None:
            self.freed[rid] = self.reqs.pop(rid)
            return hit, None
        req.num_computed = hit + n
        self._sample(req)
        return hit, True

    def tables(self):
        return {rid: self.policy.group_tables(rid) for rid in self.reqs}

    def events(self):
        out = []
        for entry in self.log:
            if entry[0] == "stored":
                _, rid, _, hashes, g, indices = entry
                req = self.reqs.get(rid) or self.freed[rid]
                theirs = block_hashes(list(req.prompt) + list(req.output), self.bs)
                for h, i in zip(hashes, indices):
                    self.external[(h, g)] = theirs[i]
                    out.append(("stored", theirs[i], g))
            else:
                _, (h, g), _ = entry
                out.append(("removed", self.external[(h, g)], g))
        self.log.clear()
        return out


def both(num_blocks, window, retention, script, caching=True, bs=4):
    """Run the script on vLLM's manager and on pagetrace's, comparing after every call."""
    v, s = Vllm(num_blocks, window, retention, caching, bs), Sim(num_blocks, window, retention, caching, bs)
    s.freed = {}
    for k, (op, rid, *args) in enumerate(script):
        if op != "add" and rid not in v.reqs:  # refused when it came: its later calls are not made
            continue
        if op == "add":
            got = v.add(rid, *args), s.add(rid, *args)
        elif op == "step":
            got = v.step(rid, *args), s.step(rid, *args)
        elif op == "preempt":
            got = v.preempt(rid), s.preempt(rid)
        else:
            s.freed[rid] = s.reqs[rid]
            v.free(rid)
            s.free(rid)
            got = None, None
        where = f"call {k} {op} {rid}"
        assert got[0] == got[1], where
        assert v.tables() == s.tables(), where
        assert v.events() == s.events(), where
        assert v.mgr.block_pool.get_num_free_blocks() == s.policy.pool.num_free, where


def decode(rid, n):
    return [("step", rid, 1)] * n


P = list(range(100, 118))  # 18 tokens: 4 full blocks and 2 tokens


def sequential():
    return [("add", "a", P, [1, 2, 3, 4, 5, 6], 64), *decode("a", 5), ("free", "a"),
            ("add", "b", P, [7, 8], 64), *decode("b", 1), ("free", "b"),  # the same prompt: a hit
            ("add", "c", P[:10] + [9] * 9, [3, 4, 5], 64), *decode("c", 2), ("free", "c"),  # a shorter shared prefix
            ("add", "d", P + [1, 2, 3, 4, 5], [6], 64), ("free", "d")]  # a's prompt and output: a longer hit


@pytest.mark.parametrize("window", [2, 3, 4, 5, 6, 8, 9, 10, 17])
@pytest.mark.parametrize("retention", [0, None, 8])
def test_sequential_requests(window, retention):
    both(40, window, retention, sequential())


@pytest.mark.parametrize("window", [4, 5, 9])
def test_chunked_prefill(window):
    long = list(range(200, 231))  # 31 tokens
    both(40, window, 0, [("add", "a", long, [1, 2, 3], 6), ("step", "a", 6), ("step", "a", 6), ("step", "a", 6), ("step", "a", 7),
                          *decode("a", 2), ("free", "a"),
                          ("add", "b", long, [4, 5], 5), ("step", "b", 5), *decode("b", 1), ("free", "b")])


@pytest.mark.parametrize("window", [4, 5, 8])
@pytest.mark.parametrize("retention", [0, None])
def test_concurrent_requests_share_a_prefix(window, retention):
    both(40, window, retention, [("add", "a", P, [1, 2, 3, 4, 5, 6, 7, 8], 64), *decode("a", 2),
                                 ("add", "b", P + [1, 2], [9, 9, 9], 64), ("step", "a", 1), ("step", "b", 1),
                                 ("add", "c", P[:12], [5, 5], 64), ("step", "c", 1), ("step", "a", 1), ("step", "b", 1),
                                 ("free", "b"), ("step", "a", 1), ("free", "a"), ("free", "c"),
                                 ("add", "d", P + [1, 2, 3, 4], [6, 6], 64), ("step", "d", 1), ("free", "d")])


@pytest.mark.parametrize("window", [4, 5, 9])
def test_a_small_pool_evicts_and_refuses(window):
    q = list(range(300, 318))
    both(12, window, 0, [("add", "a", P, [1, 2, 3], 64), *decode("a", 2), ("free", "a"),
                         ("add", "b", q, [4, 5, 6, 7, 8, 9], 64),  # evicts a's cached blocks
                         ("add", "c", P, [1, 2], 64),  # refused or admitted with what is left, as vLLM does
                         *decode("b", 5), ("free", "b"),
                         ("add", "e", P, [1, 2], 64), *decode("e", 1), ("free", "e")])


@pytest.mark.parametrize("num_blocks", [10, 11, 12, 13])
def test_admission_at_the_edge_of_the_pool(num_blocks):
    both(num_blocks, 5, 0, [("add", "a", P, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 8), ("step", "a", 8), ("step", "a", 2),
                            *decode("a", 3), ("add", "b", list(range(400, 408)), [1, 2], 64), *decode("a", 2)])


def test_without_prefix_caching():
    both(40, 5, 0, sequential(), caching=False)


def test_a_request_of_one_block_and_one_token():
    both(20, 4, 0, [("add", "a", [1, 2, 3, 4], [5, 6], 64), ("step", "a", 1), ("free", "a"),
                    ("add", "b", [1, 2, 3, 4], [7], 64), ("free", "b"), ("add", "c", [9], [1, 2, 3, 4, 5], 64), *decode("c", 4)])


@pytest.mark.parametrize("window", [1, 2, 3, 5])
def test_one_token_blocks(window):
    both(60, window, 0, sequential(), bs=1)


@pytest.mark.parametrize("length", [16, 17])
@pytest.mark.parametrize("window", [5, 6])
def test_prompts_at_and_one_past_a_block(length, window):
    p = list(range(500, 500 + length))
    both(40, window, 0, [("add", "a", p, [1, 2], 64), ("step", "a", 1), ("free", "a"), ("add", "b", p, [3], 64), ("free", "b"),
                         ("add", "c", p + [1, 2, 3], [4], 64), ("free", "c")])


@pytest.mark.parametrize("window", [4, 5, 6])
def test_preempted_and_looked_up_again(window):
    both(40, window, 0, [("add", "a", P, [1, 2, 3, 4, 5, 6, 7], 64), *decode("a", 3), ("preempt", "a"), *decode("a", 2),
                         ("add", "b", P + [1, 2, 3], [8, 9, 10], 64), ("preempt", "b"), ("step", "b", 1), ("free", "b"), ("free", "a"),
                         ("add", "a", P, [1, 2], 64), ("free", "a")])  # the same id again, after it was freed


@pytest.mark.parametrize("window", [5, 6])
def test_two_requests_computing_the_same_blocks(window):
    """b arrives while a is in its prefill: both compute (and cache) the blocks a had not reached."""
    both(40, window, 0, [("add", "a", P, [1, 2], 4), ("add", "b", P, [3, 4], 4), ("step", "a", 4), ("step", "b", 4),
                         ("step", "a", 4), ("step", "b", 4), ("step", "a", 6), ("step", "b", 6), ("step", "a", 1),
                         ("free", "a"), ("add", "c", P, [5], 64), ("step", "b", 1), ("free", "b"), ("free", "c"),
                         ("add", "d", P, [6], 64), ("free", "d")])


@pytest.mark.parametrize("num_blocks", [42, 43, 44, 45, 50, 51])
def test_the_sliding_cap_at_admission(num_blocks):
    """A 100-token prompt, window 5: the full group needs 25 blocks, the sliding one at most its
    cap cdiv(min(4 + 64, 256), 4) + 1 = 18 (not 25): admitted from 43 free blocks on."""
    long = list(range(600, 700))
    both(num_blocks + 1, 5, 0, [("add", "a", long, [1, 2, 3], 32), ("step", "a", 32), ("step", "a", 32), ("step", "a", 4),
                                *decode("a", 2)])


@pytest.mark.parametrize("num_blocks", range(9, 17))
def test_a_tight_pool_with_cached_hits(num_blocks):
    """b's hits are a's freed, cached (evictable) blocks: counted as blocks to allocate."""
    both(num_blocks, 5, 0, [("add", "a", P, [1, 2], 64), ("step", "a", 1), ("free", "a"),
                            ("add", "z", list(range(900, 906)), [1], 64),
                            ("add", "b", P + [1, 2, 3], [4, 5, 6], 64), *decode("b", 2), ("free", "b"),
                            ("add", "c", P, [7], 64)])


@pytest.mark.parametrize("window", [(5, 9), (9, 5), (4, 6), (6, 10)])
def test_two_sliding_windows(window):
    """Three groups: full attention and two windows. The hit is found by the fixed point over
    the groups (kv_cache_coordinator.py find_longest_cache_hit), not in one pass."""
    both(60, window, 0, sequential())
    both(60, window, 0, [("add", "a", P, [1, 2, 3, 4, 5, 6, 7, 8], 64), *decode("a", 4),
                         ("add", "b", P + [1, 2, 3], [9, 9], 64), ("step", "b", 1), ("preempt", "a"), ("free", "b"), ("free", "a")])
