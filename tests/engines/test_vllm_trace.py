"""The server trace's writer (engines/vllm_trace.py) on vLLM's own `Request` objects, in process:
the private form writes vLLM's block hashes, which equal pagetrace's own (sim/vllm_hash.py),
and the trace reads back. The live server test is tests/sim/test_sim_server_events.py."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install -e '.[vllm]' to test the trace hook on vLLM's requests", allow_module_level=True)

pytestmark = pytest.mark.vllm


def scheduler_of(cache, hash_block_size):
    """A stand-in for a made v1 Scheduler: the attributes engines/vllm_trace.py reads from it
    (the live test, tests/sim/test_sim_self_describing.py, reads them from a real one)."""
    return types.SimpleNamespace(
        cache_config=cache, hash_block_size=hash_block_size, block_size=cache.block_size,
        kv_cache_config=types.SimpleNamespace(num_blocks=16, kv_cache_groups=[object()]), max_num_scheduled_tokens=2048,
        max_num_running_reqs=16, max_model_len=64, scheduler_config=types.SimpleNamespace(enable_chunked_prefill=True),
        vllm_config=types.SimpleNamespace(model_config=types.SimpleNamespace(served_model_name="tiny", model="/models/tiny")))


@pytest.mark.parametrize("private", [False, True])
def test_a_finished_request_is_one_line_with_vllms_own_hashes(tmp_path, private):
    from vllm.config import CacheConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from pagetrace.engines.vllm_trace import SchedulerTrace
    from pagetrace.sim.vllm_hash import block_hashes
    from pagetrace.sim.workload import read_trace

    init_none_hash(sha256)
    scheduler = scheduler_of(CacheConfig(block_size=4, enable_prefix_caching=True), 4)
    path = tmp_path / "trace.jsonl"
    trace = SchedulerTrace(str(path), private, scheduler)
    hasher = get_request_block_hasher(4, sha256)
    a = Request("cmpl-a-0-abcdef12", list(range(10)), SamplingParams(max_tokens=4), None, cache_salt="s", block_hasher=hasher)
    b = Request("cmpl-b-0-12345678", list(range(9)), SamplingParams(max_tokens=2), None, block_hasher=hasher)
    trace.arrive(a)
    trace.steps += 3  # three schedule() calls
    trace.arrive(b)
    b.append_output_token_ids([7, 8])
    trace.finish(b)  # b ends first: written first, ordered by seq when read
    a.append_output_token_ids([50, 51, 52])
    trace.finish(a)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows[0]["hashes_only"] is private and rows[0]["block_size"] == 4
    server = rows[0]["server"]
    assert {k: server[k] for k in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len", "model")} == \
        {"block_size": 4, "num_blocks": 16, "max_num_batched_tokens": 2048, "max_num_seqs": 16, "max_model_len": 64, "model": "tiny"}
    assert [(r["id"], r["client_id"], r["arrival"], r["seq"], r["output_len"]) for r in rows[1:]] == [
        ("cmpl-b-0-12345678", "cmpl-b-0", 3, 1, 2), ("cmpl-a-0-abcdef12", "cmpl-a-0", 0, 0, 3)]
    if private:
        assert "prompt\"" not in path.read_text() and "cache_salt" not in path.read_text()
        assert rows[2]["block_hashes"] == block_hashes(list(range(10)) + [50, 51, 52], 4, "s")  # vLLM's = pagetrace's
        assert rows[1]["block_hashes"] == block_hashes(list(range(9)) + [7, 8], 4)
    else:
        assert rows[2]["prompt"] == list(range(10)) and rows[2]["output"] == [50, 51, 52] and rows[2]["cache_salt"] == "s"
    got = read_trace(path.read_text(), 4)
    assert [r.request_id for r in got.requests] == ["cmpl-a-0-abcdef12", "cmpl-b-0-12345678"]


BS = 4


def _request(rid, prompt, max_tokens, **kw):
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    return Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
                   block_hasher=get_request_block_hasher(BS, sha256), **kw)


def _trace(tmp_path, private=False, caching=True, name="trace.jsonl", algo="sha256"):
    from vllm.config import CacheConfig

    from pagetrace.engines.vllm_trace import SchedulerTrace

    cache = CacheConfig(block_size=BS, enable_prefix_caching=caching, prefix_caching_hash_algo=algo)
    scheduler = scheduler_of(cache, BS)
    return SchedulerTrace(str(tmp_path / name), private, scheduler), tmp_path / name


@pytest.mark.parametrize("caching, algo, seed", [(True, "sha256", None), (False, "sha256_cbor", "7")])
def test_the_header_names_the_recorder_the_engine_and_its_hashing(tmp_path, monkeypatch, caching, algo, seed):
    """The first line, whole and compact, as the server writes it before any request: the hash
    function the server's cache config names, and the seed a server started with this
    PYTHONHASHSEED uses."""
    import vllm

    if seed is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", seed)
    _, path = _trace(tmp_path, caching=caching, algo=algo)
    line = path.read_text()
    assert line.endswith("\n") and line.count("\n") == 1
    doc = json.loads(line)
    assert line == json.dumps(doc, separators=(",", ":")) + "\n"
    assert doc == {"format": "pagetrace-trace", "version": 1, "block_size": BS, "hashes_only": False,
                   "hash": {"algo": algo, "seed": seed},
                   "source": {"recorder": "pagetrace vllm_plugin (Scheduler hook)", "engine": f"vllm {vllm.__version__}",
                              "prefix_caching": caching},
                   "server": {"block_size": BS, "hash_block_size": BS, "num_blocks": 16, "kv_cache_groups": 1,
                              "max_num_batched_tokens": 2048, "max_num_seqs": 16, "max_model_len": 64, "chunked_prefill": True,
                              "prefix_caching": caching, "hash_algo": algo, "hash_seed": seed, "vllm": vllm.__version__, "model": "tiny"}}


def test_the_trace_file_is_made_new_with_its_mode_and_never_over_a_file_or_link(tmp_path):
    import os
    import stat

    _, path = _trace(tmp_path)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 & ~umask
    (tmp_path / "old.jsonl").write_text("keep\n")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "nowhere")
    for name in ("old.jsonl", "link.jsonl"):
        with pytest.raises(FileExistsError):
            _trace(tmp_path, name=name)
    assert (tmp_path / "old.jsonl").read_text() == "keep\n" and not (tmp_path / "nowhere").exists()


def test_each_request_is_written_field_by_field_when_it_finishes(tmp_path):
    """Arrival steps and times relative to the first request, the order of arrival, max_tokens,
    LoRA, priority; a request aborted before its first token has no output (its length is what
    it asked for); a second add of the same id (a streaming session's next chunk) and the
    free of a request never added change nothing."""
    from vllm.lora.request import LoRARequest

    trace, path = _trace(tmp_path)
    a = _request("cmpl-a-0-aaaaaaaa", range(6), 3, arrival_time=1000.0, priority=2)
    b = _request("cmpl-b-0-bbbbbbbb", range(5), 2, arrival_time=1002.5, lora_request=LoRARequest("sql", 1, "/loras/sql"))
    c = _request("cmpl-c-0-cccccccc", range(7), 5, arrival_time=1003.0)
    trace.arrive(a)
    trace.steps += 2
    trace.arrive(b)
    trace.arrive(b)
    trace.steps += 1
    trace.arrive(c)
    a.append_output_token_ids([9, 8, 7])
    b.append_output_token_ids([1, 2])
    for r in (c, a, b):
        trace.finish(r)
    trace.finish(_request("cmpl-x-0-xxxxxxxx", range(3), 1))
    trace.finish(a)  # written once
    rows = [json.loads(x) for x in path.read_text().splitlines()[1:]]
    assert [r["id"] for r in rows] == ["cmpl-c-0-cccccccc", "cmpl-a-0-aaaaaaaa", "cmpl-b-0-bbbbbbbb"]
    assert [(r["arrival"], r["time"], r["seq"], r["max_tokens"], r["output_len"]) for r in rows] == [
        (3, 3.0, 2, 5, 5), (0, 0.0, 0, 3, 3), (2, 2.5, 1, 2, 2)]
    assert "output" not in rows[0] and rows[1]["output"] == [9, 8, 7] and rows[2]["output"] == [1, 2]
    assert not any("n" in r for r in rows)  # one sample each: n = 1 is the trace's default, not written
    assert (rows[1].get("priority"), rows[2].get("priority"), rows[2].get("lora_name"), rows[1].get("lora_name")) == (2, None, "sql", None)


def test_the_hook_counts_vllms_own_scheduler_steps(tmp_path):
    """vLLM 0.32's Scheduler, made without a model (a config.json alone), patched as the plugin
    patches it (on a subclass here, so the test process's class stays as it is) and stepped:
    arrival is the number of schedule() calls before the request, every finished request is a
    line, an abort goes through _free_request too, and patching twice wraps once."""
    from transformers import LlamaConfig
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

    import torch

    from pagetrace.engines.vllm_trace import patch_scheduler

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=1,
                vocab_size=1 << 12, max_position_embeddings=256).save_pretrained(tmp_path / "model")
    cache = CacheConfig(block_size=BS, enable_prefix_caching=True)
    cache.num_gpu_blocks = 64
    vc = VllmConfig(model_config=ModelConfig(model=str(tmp_path / "model"), skip_tokenizer_init=True, max_model_len=256, enforce_eager=True, dtype="bfloat16"),
                    cache_config=cache,
                    scheduler_config=SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256,
                                                     enable_chunked_prefill=True, is_encoder_decoder=False))
    kvc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["l.0"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.bfloat16))])
    module = types.SimpleNamespace(Scheduler=type("Traced", (Scheduler,), {}))
    said = []
    path = tmp_path / "trace.jsonl"
    patch_scheduler(module, str(path), True, log=said.append)
    patch_scheduler(module, str(path), True, log=said.append)
    sched = module.Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=False)
    assert said == [f"pagetrace: recording every request to the trace {path} (block hashes only, blocks of {BS}; "
                    "pool 64 blocks, max_num_batched_tokens 64, max_num_seqs 8)"]
    other = types.SimpleNamespace(Scheduler=type("TracedIds", (Scheduler,), {}))
    patch_scheduler(other, str(tmp_path / "ids.jsonl"), False, log=said.append)
    other.Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=False)
    assert said[1].startswith(f"pagetrace: recording every request to the trace {tmp_path / 'ids.jsonl'} (token ids, blocks of {BS};")

    def step():
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        sampled = [[5] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
        sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled))

    sched.add_request(_request("cmpl-a-0-aaaaaaaa", range(8), 2))
    step()
    step()
    sched.add_request(_request("cmpl-b-0-bbbbbbbb", range(20, 29), 3))
    sched.add_request(_request("cmpl-c-0-cccccccc", range(40, 45), 4))
    sched.finish_requests("cmpl-c-0-cccccccc", RequestStatus.FINISHED_ABORTED)
    while sched.has_requests():
        step()
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    rows = [lines[0]] + [r for r in lines[1:] if "id" in r]
    steps = [r for r in lines[1:] if "step" in r and "id" not in r]
    assert rows[0]["hashes_only"] is True and rows[0]["block_size"] == BS
    # the real scheduler's settings (vllm/v1/core/sched/scheduler.py), as simulate takes them
    assert {k: rows[0]["server"][k] for k in ("block_size", "num_blocks", "max_num_batched_tokens", "max_num_seqs", "max_model_len",
                                              "chunked_prefill", "prefix_caching", "kv_cache_groups")} == {
        "block_size": BS, "num_blocks": 64, "max_num_batched_tokens": 64, "max_num_seqs": 8, "max_model_len": 256,
        "chunked_prefill": True, "prefix_caching": True, "kv_cache_groups": 1}
    # one line per schedule() call: the first runs a's 8 prompt tokens, the second its first decode
    assert [s["step"] for s in steps] == list(range(len(steps))) and len(steps) >= 5
    assert steps[0] | {"time": 0} == {"step": 0, "time": 0, "tokens": 8, "requests": 1, "prefill_tokens": 8, "decode_requests": 0, "context_tokens": 0}
    assert {k: steps[1][k] for k in ("tokens", "prefill_tokens", "decode_requests", "context_tokens")} == \
        {"tokens": 1, "prefill_tokens": 0, "decode_requests": 1, "context_tokens": 8}
    assert [(r["id"], r["arrival"], r["seq"], r["output_len"]) for r in rows[1:]] == [
        ("cmpl-a-0-aaaaaaaa", 0, 0, 2), ("cmpl-c-0-cccccccc", 2, 2, 4), ("cmpl-b-0-bbbbbbbb", 2, 1, 3)]
    from pagetrace.sim.vllm_hash import block_hashes

    assert rows[1]["block_hashes"] == block_hashes(list(range(8)) + [5, 5], BS)  # 10 tokens: 2 full blocks


def test_pagetrace_events_records_the_schedulers_own_events_and_simulate_agrees(tmp_path, capsys):
    """PAGETRACE_EVENTS on vLLM 0.32's Scheduler, made without a model and with no KV events
    config: the hook turns events on (publisher "null"), every published batch is in the file,
    the settings first; the trace and the events then agree under `simulate` with no flag."""
    from conftest import cli
    from transformers import LlamaConfig
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.structured_output import StructuredOutputManager

    import torch

    from pagetrace.engines.vllm_trace import RecordingPublisher, patch_scheduler
    from pagetrace.sim.events import read_file

    LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=1,
                vocab_size=1 << 12, max_position_embeddings=256).save_pretrained(tmp_path / "model")
    cache = CacheConfig(block_size=BS, enable_prefix_caching=True)
    cache.num_gpu_blocks = 12
    vc = VllmConfig(model_config=ModelConfig(model=str(tmp_path / "model"), skip_tokenizer_init=True, max_model_len=40, enforce_eager=True, dtype="bfloat16"),
                    cache_config=cache,
                    scheduler_config=SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=4, max_model_len=40,
                                                     enable_chunked_prefill=True, is_encoder_decoder=False))
    assert vc.kv_events_config is None or not vc.kv_events_config.enable_kv_cache_events
    kvc = KVCacheConfig(num_blocks=12, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["l.0"], FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.bfloat16))])
    module = types.SimpleNamespace(Scheduler=type("Recorded", (Scheduler,), {}))
    trace, events = tmp_path / "t.jsonl", tmp_path / "e.kvev"
    patch_scheduler(module, str(trace), False, events_path=str(events))
    sched = module.Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BS, log_stats=False)
    assert isinstance(sched.kv_event_publisher, RecordingPublisher)
    shared = list(range(100, 112))
    prompts = [(shared + [0, 1, 2], 3), (shared + [10, 11, 12, 13], 2), (list(range(200, 228)), 4), (shared + [30, 31, 32], 3),
               (list(range(300, 326)), 3), (shared + [40], 2)]  # the two long ones evict the shared prefix's blocks
    for i, (prompt, n) in enumerate(prompts):
        sched.add_request(_request(f"cmpl-{i}-0-aaaaaaaa", prompt, n))
        while sched.has_requests():
            out = sched.schedule()
            ids = list(out.num_scheduled_tokens)
            sampled = [[7 + i] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else [] for r in ids]
            sched.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)}, sampled_token_ids=sampled))
    stream = read_file(str(events))
    assert stream.settings["num_blocks"] == 12 and stream.settings["max_num_batched_tokens"] == 16 and stream.num_events >= 4
    assert [b.seq for b in stream.batches] == list(range(len(stream.batches))) and stream.problems == []
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--events", str(events), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["events"]["equal"], json.dumps(doc["events"], indent=1)
    from pagetrace.sim.events import BlockRemoved

    assert any(isinstance(e, BlockRemoved) for b in stream.batches for e in b.events)  # the pool of 11 usable blocks evicted
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--events", str(events), "--num-blocks", "64")
    assert code == 1 and "--num-blocks 64 (the server's: 12, the trace's header)" in err
    assert "likely: num_blocks: the trace's header says the server ran with num_blocks 12" in out


def test_a_trace_path_is_checked_before_the_server_starts(tmp_path, monkeypatch):
    """What `PAGETRACE_TRACE=PATH` refuses, word for word: an existing file or link (even a dangling
    one), a missing folder; a bare name lives in the working folder."""
    from pagetrace.engines.vllm_trace import problem_with

    (tmp_path / "old.jsonl").write_text("")
    (tmp_path / "link.jsonl").symlink_to(tmp_path / "nowhere")
    for name in ("old.jsonl", "link.jsonl"):
        assert problem_with(str(tmp_path / name)) == "already exists; choose a new trace file"
    assert problem_with(str(tmp_path / "no" / "t.jsonl")) == f"its folder {str(tmp_path / 'no')!r} does not exist"
    (tmp_path / "file").write_text("")
    assert problem_with(str(tmp_path / "file" / "t.jsonl")) == f"its folder {str(tmp_path / 'file')!r} does not exist"
    assert problem_with(str(tmp_path / "t.jsonl")) is None
    monkeypatch.chdir(tmp_path)
    assert problem_with("t.jsonl") is None and problem_with("old.jsonl") == "already exists; choose a new trace file"


@pytest.mark.skipif(__import__("os").geteuid() == 0, reason="root writes into a read-only folder: the refusal cannot be seen as root")
def test_a_trace_folder_that_is_not_writable_is_refused(tmp_path):
    from pagetrace.engines.vllm_trace import problem_with

    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    try:
        assert problem_with(str(locked / "t.jsonl")) == f"its folder {str(locked)!r} is not writable"
    finally:
        locked.chmod(0o700)


def test_a_private_trace_keeps_vllms_own_hashes_of_a_lora_request(tmp_path):
    """vLLM mixes the adapter into a LoRA request's block hashes (kv_cache_utils.py
    generate_block_hash_extra_keys); the trace records the request's own hashes, not ones
    recomputed from its tokens, which would leave the adapter out."""
    from vllm.lora.request import LoRARequest

    from pagetrace.sim.vllm_hash import block_hashes, external

    trace, path = _trace(tmp_path, private=True)
    r = _request("cmpl-l-0-llllllll", range(9), 2, lora_request=LoRARequest("sql", 1, "/loras/sql"))
    trace.arrive(r)
    r.append_output_token_ids([3, 4])
    trace.finish(r)
    row = json.loads(path.read_text().splitlines()[1])
    assert row["block_hashes"] == [external(bytes(h)) for h in r.block_hashes] and len(row["block_hashes"]) == 2
    assert row["block_hashes"] != block_hashes(list(range(9)) + [3, 4], BS)
