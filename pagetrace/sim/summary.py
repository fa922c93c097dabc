"""The numbers of a simulation: hits by cause, peak blocks, preemptions, waste against Orca."""

from __future__ import annotations

from dataclasses import dataclass

from .baselines import Waste, contiguous_waste, paged_waste
from .causes import CAUSES
from .run import SimResult


@dataclass(slots=True)
class Summary:
    requests: int
    steps: int
    preemptions: int
    preempted_requests: int
    prompt_tokens: int
    causes: dict[str, int]  # prompt tokens by cause (first admission of each request)
    peak_used_blocks: int
    peak_running: int
    usable_blocks: int
    evictions: int
    waste: list[Waste]
    cache: str = "vLLM (paged)"  # the policy's label
    prefix_requests: int = 0  # of `requests`: SGLang's parallel-sampling prefix requests (sim/parallel.py)

    @property
    def hit_rate(self) -> float:
        return self.causes["hit"] / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self) -> dict:
        return {
            "requests": self.requests,
            "prefix_requests": self.prefix_requests,
            "steps": self.steps,
            "preemptions": self.preemptions,
            "preempted_requests": self.preempted_requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": self.hit_rate,
            "prompt_tokens_by_cause": self.causes,
            "share_by_cause": {k: (v / self.prompt_tokens if self.prompt_tokens else 0.0) for k, v in self.causes.items()},
            "peak_used_blocks": self.peak_used_blocks,
            "usable_blocks": self.usable_blocks,
            "peak_running": self.peak_running,
            "evictions": self.evictions,
            "waste": [w.to_json() for w in self.waste],
        }


def summarize(result: SimResult, causes: dict[str, int], block_size: int, max_model_len: int, max_num_seqs: int) -> Summary:
    pool = result.policy.pool
    capacity = (pool.num_blocks - 1) * block_size  # the same memory, as contiguous slots
    reqs = result.requests
    waste = [paged_waste(result.steps, block_size, result.policy.label)] + [
        contiguous_waste(reqs, capacity, mode, max_model_len, max_num_seqs) for mode in ("max", "pow2", "oracle")
    ]
    return Summary(
        requests=len(reqs),
        steps=len(result.steps),
        preemptions=result.num_preemptions,
        preempted_requests=sum(1 for r in reqs if r.num_preemptions),
        prompt_tokens=sum(len(r.prompt) for r in reqs),
        causes={k: causes[k] for k in CAUSES},
        peak_used_blocks=max((s.used_blocks for s in result.steps), default=0),
        peak_running=max((s.running for s in result.steps), default=0),
        usable_blocks=pool.num_blocks - 1,
        evictions=pool.evictions,
        waste=waste,
        cache=result.policy.label,
        prefix_requests=result.prefix_requests,
    )
