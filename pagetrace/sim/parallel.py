"""SGLang's parallel sampling: the prompt is prefilled alone first, then the n samples are sent.

SGLang 0.5.23, python/sglang/srt/managers/tokenizer_manager.py ("Cache the common prefix for
parallel sampling"): for a request with n > 1 the tokenizer manager first sends a copy with
`max_new_tokens = 0` (a new rid) and waits for its response, so the prompt is in the radix
tree; only then does it send the n samples. A request with `max_new_tokens = 0` is
prefill-only (schedule_batch.py `is_prefill_only`): it finishes at the end of its last
prefill step and is released with `checkpoint=True`, so its page-aligned prompt stays in the
tree for the samples to match.

Here (the sglang policy only) each group of samples becomes a prefix request `<id>.prefix`
with the prompt and one output token: the scheduler finishes a request when its output is
complete, and the token sampled by the last prefill step is never stored, which is what a
prefill-only request does. Its samples are held back and handed to the scheduler right after
the step in which it finishes, so they are admitted at the next step at the earliest, behind
the requests already waiting. The prefix request is an engine request like any other (its
prompt tokens count, as SGLang's scheduler sees them); the summary counts it apart.
vLLM has no such step: its n samples are sent at once and share the first one's blocks.
"""

from __future__ import annotations

from .request import SimRequest

PREFIX_SUFFIX = ".prefix"


def split_parallel_groups(requests: list[SimRequest]) -> tuple[list[SimRequest], dict[str, list[SimRequest]]]:
    """The requests to feed (each group's samples replaced by its prefix request, in the first
    sample's place) and each prefix request's held samples, by the prefix request's id."""
    feed: list[SimRequest] = []
    held: dict[str, list[SimRequest]] = {}
    prefix_of: dict[str, str] = {}  # group -> its prefix request's id
    taken = {r.request_id for r in requests}
    for r in requests:
        if r.group is None:
            feed.append(r)
            continue
        rid = prefix_of.get(r.group)
        if rid is None:
            rid = r.group + PREFIX_SUFFIX
            while rid in taken:  # a trace may hold a request of that id: the suffix again
                rid += PREFIX_SUFFIX
            taken.add(rid)
            prefix_of[r.group] = rid
            held[rid] = []
            feed.append(SimRequest(rid, r.prompt, list(r.output[:1]), arrival=r.arrival, cache_salt=r.cache_salt))
        held[rid].append(r)
    return feed, held


__all__ = ["PREFIX_SUFFIX", "split_parallel_groups"]
