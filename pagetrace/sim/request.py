"""One request as the simulator sees it: its tokens, how many are computed, its block hashes."""

from __future__ import annotations

from dataclasses import dataclass, field

WAITING, RUNNING, PREEMPTED, FINISHED = "waiting", "running", "preempted", "finished"


def hash_block(parent: int | None, tokens: tuple[int, ...], extra_keys: tuple | None) -> int:
    """The prefix-caching key of one full block: its parent's key, its token ids, its extra keys.

    vllm/v1/core/kv_cache_utils.py `hash_block_tokens`: `hash_function((parent_block_hash,
    curr_block_token_ids_tuple, extra_keys))`, the first block's parent being NONE_HASH.
    vLLM hashes with sha256/xxhash; only equality matters here, so Python's hash serves,
    and the token ids enter as `block_key` gives them.
    """
    return hash((parent, tokens, extra_keys))


def block_key(tokens: range | tuple[int, ...]) -> range | tuple[int, ...]:
    """A block's token ids as they enter its hash: a `range` when they are consecutive ids,
    a tuple otherwise. Only equality of hashes matters to the simulator, and equal blocks
    get equal keys either way; a range hashes without touching its ids (the synthetic
    workloads' text is runs of consecutive ids)."""
    if type(tokens) is range:
        return tokens if tokens.step == 1 else block_key(tuple(tokens))
    first = tokens[0]
    n = len(tokens)
    if tokens[-1] - first == n - 1 and tokens == tuple(range(first, first + n)):
        return range(first, first + n)
    return tokens


def _run(seq, start: int, stop: int) -> range | tuple[int, ...]:
    """seq[start:stop] as a range when the sequence can give one, else as a tuple."""
    if type(seq) is range:
        return seq[start:stop]
    run = getattr(seq, "run", None)  # workload.SyntheticTokens
    return run(start, stop) if run is not None else tuple(seq[start:stop])


@dataclass(slots=True, eq=False)
class SimRequest:
    """A request: prompt token ids, the output token ids it will generate, an optional cache salt."""

    request_id: str
    prompt: list[int]
    output: list[int]  # all output tokens; `num_generated` of them exist so far
    arrival: int = 0
    cache_salt: str | None = None
    group: str | None = None  # a sample of parallel sampling (n > 1): the id of the request it samples
    status: str = WAITING
    num_computed: int = 0  # tokens whose K/V are in the cache (`num_computed_tokens`)
    num_generated: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int | None = None  # prefix hit at first admission, as RequestOutput reports it
    first_scheduled: int | None = None
    finished_step: int | None = None
    why: dict[str, int] | None = None  # prompt tokens by hit/miss cause at first admission (causes.py)
    recomputed_hit_tokens: int = 0  # hits of its lookups after a preemption (vLLM's preempted_hits)
    block_hashes: list[int] = field(default_factory=list)
    content_hashes: list[int] = field(default_factory=list)  # the same chain without extra keys
    prompt_len: int = field(init=False)
    seq: int = 0  # admission order: the running list is sorted by it
    synced: int = 0  # step at whose start num_computed/num_generated hold (cruising requests run ahead)
    last_step: int = -1  # the step a cruising request samples its last token
    max_tokens: int = field(init=False)  # len(output), kept as a field: the scheduler reads it often

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt)
        self.max_tokens = len(self.output)

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_generated

    def token_slice(self, start: int, stop: int) -> tuple[int, ...]:
        p = self.prompt_len
        if stop <= p:
            return tuple(self.prompt[start:stop])
        if start >= p:
            return tuple(self.output[start - p : stop - p])
        return tuple(self.prompt[start:]) + tuple(self.output[: stop - p])

    def token_run(self, start: int, stop: int) -> range | tuple[int, ...]:
        """The token ids start..stop as `token_slice` gives them, or as a range when the
        request's token sequence can give one."""
        p = self.prompt_len
        if stop <= p:
            return _run(self.prompt, start, stop)
        if start >= p:
            return _run(self.output, start - p, stop - p)
        return self.token_slice(start, stop)

    def update_hashes(self, block_size: int, full: int | None = None) -> None:
        """Hash every full block of the tokens known so far (the request's block hasher,
        kv_cache_utils.py `get_request_block_hasher`: full blocks only, chained), or the
        first `full` blocks (a cruising request runs ahead of `num_generated`).

        The cache salt is an extra key of the first block only (`generate_block_hash_extra_keys`:
        `start_token_idx == 0 and request.cache_salt`), so it reaches every later block
        through the parent hash.
        """
        hashes = self.block_hashes
        i = len(hashes)
        if full is None:
            full = (self.prompt_len + self.num_generated) // block_size
        if i >= full:
            return
        parent = hashes[-1] if i else None
        first = i
        known = self.token_run(first * block_size, full * block_size)  # one slice for every new block
        canonical = type(known) is range and known.step == 1  # then so is each block's slice
        if self.cache_salt is None:  # the common case: no extra keys, one chain
            append = hashes.append
            if canonical:
                for k in range(0, len(known), block_size):
                    parent = hash((parent, known[k : k + block_size], None))  # hash_block(parent, key, None)
                    append(parent)
            else:
                for k in range(0, len(known), block_size):
                    parent = hash((parent, block_key(known[k : k + block_size]), None))
                    append(parent)
            return
        content = self.content_hashes
        for i in range(first, full):
            k = (i - first) * block_size
            tokens = block_key(known[k : k + block_size])
            extra = (("cache_salt", self.cache_salt),) if i == 0 else None
            parent = hash_block(parent, tokens, extra)
            hashes.append(parent)
            content.append(hash_block(content[-1] if i else None, tokens, None))

    def content_hash(self, i: int) -> int:
        return self.content_hashes[i] if self.cache_salt is not None else self.block_hashes[i]
