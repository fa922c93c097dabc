"""The Tap on a flagged step, without vLLM: the metadata a runner would hold, a cache that
counts its reads. The guard alone (no capture) copies no page of a flagged step, since
nothing would write it; with capture the step's pages are kept. A verdict that `check`'s
rules do not name is logged, not only counted. Two requests with one client id (a client
may send one X-Request-Id twice): the bad one is made safe, not its twin."""

from __future__ import annotations

import torch

from pagetrace.engines.vllm import Recorder, Tap

BS, NB = 4, 8


class Cache:
    """A layer's cache (vllm-hnd: [blocks, kv heads, block size, 2 x head dim]) that counts page copies."""

    def __init__(self):
        self.data = torch.zeros(NB, 1, BS, 8)
        self.copies = 0
        self.device = self.data.device

    def index_select(self, axis, ids):
        self.copies += 1
        return self.data.index_select(axis, ids)


class Layer:
    layer_name = "model.layers.0.self_attn.attn"

    def __init__(self):
        self.kv_cache = Cache()


class Meta:  # a decode of two requests, 5 and 3 tokens: blocks [1, 2] and [3]
    def __init__(self):
        self.query_start_loc = torch.tensor([0, 1, 2], dtype=torch.int32)
        self.seq_lens = torch.tensor([5, 3], dtype=torch.int32)
        self.block_table = torch.tensor([[1, 2], [3, 0]], dtype=torch.int32)
        self.slot_mapping = torch.tensor([2 * BS + 0, 3 * BS + 2], dtype=torch.int64)
        self.num_actual_tokens = 2


class Runner:
    input_batch = None  # vLLM's InputBatch: its req_ids, by row


def tap(recorder: Recorder, guard: str = "report", ids=("a-1a2b3c4d", "b-5e6f7a8b")) -> tuple[Tap, Layer, list[str]]:
    layer = Layer()
    recorder.block_size, recorder.prefix_caching, recorder.num_layers = BS, False, 1
    recorder.modules = {0: layer}
    recorder.meta = {"layers": {0: layer.layer_name}, "layout": "vllm-hnd", "block_axis": 0, "num_blocks": NB, "sliding_window": None,
                     "num_heads": 1, "num_kv_heads": 1, "head_dim": 4, "dtype": "fp32", "scale": 0.5}
    logged: list[str] = []
    runner = Runner()
    runner.input_batch = type("Batch", (), {"req_ids": list(ids)})()
    t = Tap(runner, recorder, guard=guard, log=logged.append)
    t.installed = True
    meta = Meta()
    t.metadata = lambda: meta
    t.meta = meta
    return t, layer, logged


def flag(t: Tap) -> list:
    """One step with request b's block on 5,000,000; returns what the forward saw of the table."""
    t.plants = {0: [lambda m: (m.block_table.__setitem__((1, 0), 5_000_000), lambda: m.block_table.__setitem__((1, 0), 3))[1]]}
    seen = []
    t.forward(lambda: seen.append(t.meta.block_table.tolist()))
    return seen


def test_the_guard_alone_copies_no_page_of_a_flagged_step():
    rec = Recorder(steps=[], ring_bytes=0)  # the plugin's recorder without PAGETRACE_CAPTURE
    t, layer, logged = tap(rec)
    seen = flag(t)
    assert {v.check for v in t.fired} == {"pool", "slot"} and any(" · pool · request b · " in x for x in logged), logged
    assert seen == [[[1, 2], [0, 0]]]  # report: made safe, then the forward ran
    assert layer.kv_cache.copies == 0 and rec.records == {} and rec.dropped == [] and rec.current is None


def test_with_capture_the_flagged_step_keeps_its_pages():
    kept = []
    rec = Recorder(ring_bytes=1 << 20)
    rec.sink = lambda r, gone: kept.append(r)
    t, layer, logged = tap(rec)
    flag(t)
    assert layer.kv_cache.copies == 1 and [r["step"] for r in kept] == [0]
    assert kept[0]["guard"]["violations"][0]["check"] == "pool" and kept[0]["guard"]["affected"] == ["b-5e6f7a8b"]


def test_a_verdict_checks_rules_do_not_name_is_logged():
    import pagetrace.engines.guard as guard

    t, layer, logged = tap(Recorder(steps=[], ring_bytes=0))
    original = guard.verdict
    guard.verdict = lambda *a, **k: False  # a guard whose vectorised verdict disagrees with check's rules
    try:
        t.forward(lambda: None)
    finally:
        guard.verdict = original
    assert [v.check for v in t.fired] == ["guard"]
    assert any(x.startswith("pagetrace guard: step 0 · guard: the vectorised guard found a violation") for x in logged), logged


def test_the_bad_row_of_two_requests_with_one_client_id_is_the_one_made_safe():
    """Rows 0 and 1 are both the client's `cmpl-x-0`; the entry far outside the pool is row 1's.
    The guard names row 1 by vLLM's own id, and the forward sees row 1's entry on the null
    block (before the fix: the name led the plan to row 0, and block 5,000,000 reached the kernel)."""
    ids = ("cmpl-x-0-1a2b3c4d", "cmpl-x-0-5e6f7a8b")
    t, layer, logged = tap(Recorder(steps=[], ring_bytes=0), ids=ids)
    seen = flag(t)
    assert {v.request for v in t.fired} == {ids[1]}, logged
    assert seen == [[[1, 2], [0, 0]]] and t.affected == [(0, [ids[1]])]


def test_the_plan_makes_every_row_of_a_name_safe():
    """quarantine.plan given a name two rows share (a step read as check reads it): both rows' bad
    entries are redirected; none is missed."""
    from pagetrace.engines import quarantine
    from pagetrace.engines.bundle import Step
    from pagetrace.engines.check import Violation

    step = Step(step=0, file=None, requests=["x", "x"], layers=[], query_start_loc=[0, 1, 2], seq_lens=[5, 3],
                block_table=[[1, 2], [5_000_000, 0]], block_counts=[2, 1], slot_mapping=[8, 14], positions=[], blocks=[])
    p = quarantine.plan(step, [Violation("pool", 0, "far", request="x", token=0)], num_blocks=NB, block_size=BS)
    assert p.rows == [0, 1] and p.table == [(1, 0, 5_000_000)] and p.slots == [(0, 8), (1, 14)]  # (the slot, in the pool, as vLLM computed it)
