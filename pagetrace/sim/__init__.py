"""The KV cache simulator: vLLM V1's block manager over time, and Orca's contiguous baselines.

    from pagetrace.sim import SimRequest, simulate
    result = simulate([SimRequest("a", prompt, output)], num_blocks=1024, block_size=16)

Modules, one idea each: `blockpool` (free queue, reference counts, cached hashes), `request`
(a request's tokens and block hashes), `policy` (the prefix-caching manager the scheduler
calls), `radix` (SGLang's radix-tree cache, the second policy), `scheduler` (vLLM's FCFS
loop), `cruise` (the scheduler's calendar of decode steps that change the pool), `run` (a
workload through both), `workload` (synthetic or JSONL), `causes` (why a token missed),
`baselines` (Orca's waste), `summary`, `capacity` (the memory model: blocks, tokens and requests a budget holds); the pictures are `pagetrace.views.sim_pictures`. Plain Python: no torch, no numpy.
"""

from .policy import KVCachePolicy, VllmPrefixCaching
from .radix import SglangRadixCache
from .request import SimRequest
from .run import SimResult, simulate
from .scheduler import Scheduler, SchedulerConfig, StepRecord

__all__ = ["KVCachePolicy", "Scheduler", "SchedulerConfig", "SimRequest", "SglangRadixCache", "SimResult", "StepRecord", "VllmPrefixCaching", "simulate"]
