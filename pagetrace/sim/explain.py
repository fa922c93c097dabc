"""Each request's prefix-cache outcome, block by block: what hit, and why the rest missed.

The causes are causes.py's, counted when the request was first admitted (partial block,
evicted, different extra key, first seen). With the run's KV events recorded
(`simulate(record_events=True)`), an evicted block also names the step and the request
whose allocation dropped it (the last drop of that hash before the request's admission).
A hit on a block another request stored in the same step (vLLM caches a block when it is
allocated for computing, kv_cache_manager.py `allocate_slots` -> `cache_blocks`) is counted
in `hit_while_written`: the block's K/V are being written by that step, not yet read.
A request preempted later is looked up again when it is readmitted: those hits are
`recomputed_hit_tokens`, which vLLM counts apart (`preempted_hits`, vllm/v1/metrics/stats.py).
"""

from __future__ import annotations

from bisect import bisect_right


def explain_requests(result, block_size: int) -> list[dict]:
    drops: dict[int, tuple[list[int], list[str | None]]] = {}  # hash -> (steps, requests) of its drops, in order
    for step, log in result.events or ():
        for entry in log:
            if entry[0] == "removed":
                steps, owners = drops.setdefault(entry[1], ([], []))
                steps.append(step)
                owners.append(entry[2])
    stores: dict[int, tuple[list[int], list[str]]] = {}  # hash -> (steps, requests) of its stores, in order
    for step, log in result.events or ():
        for entry in log:
            if entry[0] == "stored":
                for h in entry[3]:
                    steps, owners = stores.setdefault(h, ([], []))
                    steps.append(step)
                    owners.append(entry[1])
    out = []
    for req in result.requests:
        why = req.why
        doc: dict = {"prompt_tokens_by_cause": why, "recomputed_hit_tokens": req.recomputed_hit_tokens}
        if why and why.get("hit") and result.events is not None:
            written = []
            for i in range(why["hit"] // block_size):
                steps, owners = stores.get(req.block_hashes[i], ([], []))
                k = bisect_right(steps, req.first_scheduled) - 1
                if k >= 0 and steps[k] == req.first_scheduled and owners[k] != req.request_id:
                    written.append({"block": i, "by": owners[k]})
            doc["hit_while_written"] = written
        if why and why.get("evicted") and result.events is not None:
            first = (req.num_cached_tokens or 0) // block_size
            evicted = []
            for i in range(first, first + why["evicted"] // block_size):
                steps, owners = drops.get(req.block_hashes[i], ([], []))
                k = bisect_right(steps, req.first_scheduled) - 1  # the last drop before its admission
                evicted.append({"block": i, "step": steps[k], "by": owners[k]} if k >= 0 else {"block": i, "step": None, "by": None})
            doc["evicted_blocks"] = evicted
        out.append(doc)
    return out
