"""Why a prompt token was or was not a prefix-cache hit, counted when a request is first admitted.

The answer to "why is my hit rate 0": each prompt token is exactly one of
- hit: in a cached full block of the longest cached prefix;
- partial block: in the prompt's last, partly filled block, or the last token of a prompt
  that ends on a block boundary (vLLM looks up at most `num_tokens - 1` tokens, and only
  whole blocks: kv_cache_manager.py `get_computed_blocks`). A shared prefix shorter than one
  block is all "partial block";
- evicted: its block (same tokens, same prefix, same extra keys) was cached before, and its
  hash has since been dropped because the block was reused (or an earlier block of the chain was);
- different extra key: the same tokens after the same prefix were cached, under another
  cache salt (an extra key of the block hash);
- first seen: no request computed this block before.

The same holds for SGLang's radix cache (radix.py): its lookup is page-aligned and capped at
`num_tokens - 1` as well, a tree path is the same chain of tokens and salt as a block hash,
and its `ever_cached` holds the hash of every page ever inserted into the tree, which loses
a page only by eviction. There "first seen" includes pages a running request computed but had
not inserted yet (decoded pages enter the tree when the request finishes).
"""

from __future__ import annotations

from .request import SimRequest

CAUSES = ("hit", "partial block", "evicted", "different extra key", "first seen")


def classify(req: SimRequest, num_hit: int, block_size: int, ever_cached: set[int], ever_cached_content: set[int]) -> dict[str, int]:
    out = dict.fromkeys(CAUSES, 0)
    prompt = req.prompt_len
    lookup_blocks = (prompt - 1) // block_size
    out["hit"] = num_hit
    out["partial block"] = prompt - lookup_blocks * block_size
    if len(req.block_hashes) < lookup_blocks:  # (the lookup hashed them when caching is on)
        req.update_hashes(block_size)
    if req.cache_salt is None:
        missed = req.block_hashes[num_hit // block_size : lookup_blocks]
        # A chain is cached from its first block on (a hash covers its whole prefix), so the
        # missed blocks that were ever cached are the leading ones: one probe past them.
        evicted = 0
        for h in missed:
            if h not in ever_cached:
                break
            evicted += 1
        other_key = sum(1 for h in missed if h in ever_cached_content and h not in ever_cached) if ever_cached_content else 0
        out["evicted"] = evicted * block_size
        out["different extra key"] = other_key * block_size
        out["first seen"] = (len(missed) - evicted - other_key) * block_size
        return out
    for i in range(num_hit // block_size, lookup_blocks):  # a salted request
        h = req.block_hashes[i]
        if h in ever_cached:
            cause = "evicted"
        elif req.content_hash(i) in ever_cached_content or req.content_hash(i) in ever_cached:
            cause = "different extra key"  # the same tokens, salted otherwise or not at all
        else:
            cause = "first seen"
        out[cause] += block_size
    return out
