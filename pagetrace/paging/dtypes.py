"""Cache dtypes: the one list of names, aliases and element sizes (plain Python, no torch).

`CacheDtype` is the set the CLI offers; `ALIASES` maps the spellings users type
(PyTorch's and vLLM's `--kv-cache-dtype` names) to it. A module that needs the torch
dtype (the workload) maps `CacheDtype` values itself, so this module stays import-light.
Add a dtype here and every option that takes one (`lookup`, `where`, `run`) offers it.
"""

from __future__ import annotations

from enum import Enum


class CacheDtype(str, Enum):
    fp32 = "fp32"
    fp16 = "fp16"
    bf16 = "bf16"
    fp8_e4m3 = "fp8_e4m3"
    fp8_e5m2 = "fp8_e5m2"


# bytes per element
ELEMENT_SIZES: dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}

# other spellings -> the canonical name (matched case-insensitively). `fp8` is vLLM's
# default fp8 KV cache, which is e4m3 (vllm/config/cache.py: "fp8" is an alias of "fp8_e4m3").
ALIASES: dict[str, str] = {
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "bfloat16": "bf16",
    "fp8": "fp8_e4m3",
    "float8_e4m3fn": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "e5m2": "fp8_e5m2",
}


def canonical_dtype(name: str) -> str | None:
    """The canonical name of `name` (any case, any alias), or None when it is no cache dtype."""
    key = name.lower()
    key = ALIASES.get(key, key)
    return key if key in ELEMENT_SIZES else None
