"""vLLM's own block hashes, bit for bit: what its KV events carry and what a trace can hold.

vllm/v1/core/kv_cache_utils.py `hash_block_tokens`: `hash_function((parent_block_hash,
tuple(block_token_ids), extra_keys))`, the first block's parent being NONE_HASH;
`prefix_caching_hash_algo` defaults to "sha256" (vllm/config/cache.py), which is
`hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()`
(vllm/utils/hashing.py `sha256`). NONE_HASH is `sha256(seed)`, the seed being
PYTHONHASHSEED when it is set, else "vllm-none-hash" (`init_none_hash`,
`resolve_none_hash_seed`). With xxhash and no PYTHONHASHSEED the seed is random per
process: then no one outside the server can compute its hashes, and a comparison falls
back to token content (compare.py). Events carry `maybe_convert_block_hash(h)`: the low
64 bits of the digest read big-endian, as VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES is on by
default (vllm/envs.py), or the digest bytes when it is off.

The simulator itself keys blocks with Python's `hash` (request.py): only equality matters
there, and it is ten times faster. This module is for talking to a real server.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Sequence

DEFAULT_SEED = "vllm-none-hash"  # kv_cache_utils.py DEFAULT_NONE_HASH_SEED
HASH_ALGOS = ("sha256",)  # the ones computed here; sha256_cbor and xxhash need cbor2 / xxhash


def _sha256(obj) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def none_hash(seed: str | None = None) -> bytes:
    """NONE_HASH of a server started with PYTHONHASHSEED=seed (None: the default seed)."""
    return _sha256(DEFAULT_SEED if seed is None else seed)


def server_seed() -> str | None:
    """The seed a server started from this environment would use (PYTHONHASHSEED or None)."""
    return os.environ.get("PYTHONHASHSEED")


def external(digest: bytes) -> int:
    """`maybe_convert_block_hash`: the integer an event carries."""
    return int.from_bytes(digest, "big") & ((1 << 64) - 1)


def extra_keys(block_index: int, cache_salt: str | None, lora: tuple[str, str] | None = None) -> tuple | None:
    """`generate_block_hash_extra_keys` for a text request: LoRA (name, path) on every
    block, the cache salt on the first block only."""
    keys: list = []
    if lora is not None:
        keys.append(("lora", lora[0], lora[1]))
    if block_index == 0 and cache_salt:
        keys.append(("cache_salt", cache_salt))
    return tuple(keys) if keys else None


def block_hashes(tokens: Sequence[int], block_size: int, cache_salt: str | None = None, seed: str | None = None,
                 lora: tuple[str, str] | None = None) -> list[int]:
    """The event hashes of every full block of `tokens` (the request's block hasher,
    `get_request_block_hasher`: full blocks only, chained)."""
    parent = none_hash(seed)
    out = []
    for i in range(len(tokens) // block_size):
        parent = _sha256((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra_keys(i, cache_salt, lora)))
        out.append(external(parent))
    return out
