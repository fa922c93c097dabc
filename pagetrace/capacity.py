"""How many blocks, tokens and requests a KV cache budget holds, with block rounding.

Bytes per block follow vLLM's own formula, vllm/v1/kv_cache_interface.py (0.32):
`AttentionSpec.page_size_bytes = num_kv_heads * num_states * (head_size + head_size_v) *
dtype_size` per layer, `num_states = block_size` (one state per token), and the pool has
`available_memory // bytes_per_block` blocks (kv_cache_utils.py, "num_blocks =
available_memory // bytes_per_block"), bytes_per_block summing the layers. Block 0 is
the null block (block_pool.py), so one block fewer holds tokens.

A request of L tokens holds ceil(L / block_size) blocks: the closed form
memory / (bytes per token * L) ignores that rounding and the null block, and overcounts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from .blocks import MAX_BLOCK_SIZE, MAX_HEAD_DIM, MAX_HEADS, MAX_TOKENS, cdiv
from .dtypes import ELEMENT_SIZES, canonical_dtype
from .errors import UsageError, plural

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


@dataclass(slots=True)
class ModelDims:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str


@dataclass(slots=True)
class Capacity:
    dims: ModelDims
    block_size: int
    memory_bytes: int
    bytes_per_token: int
    bytes_per_block_per_layer: int
    bytes_per_block: int
    num_blocks: int
    usable_blocks: int
    tokens: int
    length: int | None
    blocks_per_request: int | None
    requests: int | None
    requests_closed_form: float | None  # memory / (bytes per token * length): no rounding

    def to_json(self) -> dict:
        return asdict(self)


MAX_LAYERS = 4096  # no model has more attention layers; a typo is refused, not computed
MAX_MEMORY = 2**60  # 1 EiB: past any machine's memory


def parse_memory(text: str, option: str = "--memory") -> int:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in UNITS:
        raise UsageError(option, text, "give bytes with an optional unit: 80GiB, 512MiB, 16GB, 1e9")
    value = float(m.group(1)) * UNITS[m.group(2).lower()]
    if not math.isfinite(value):  # 1e400, or 1e300TiB: past any float
        raise UsageError(option, text, "is too large to be a number of bytes")
    if value < 1:
        raise UsageError(option, text, "must be at least 1 byte")
    if value > MAX_MEMORY:
        raise UsageError(option, text, f"is more than 1 EiB ({MAX_MEMORY:,} bytes); no KV cache is that large")
    return int(value)


def dtype_bytes(dtype: str, option: str = "--dtype") -> int:
    """Bytes per element of a cache dtype, by any name `pagetrace.dtypes` knows (fp16, half, bfloat16, fp8, ...)."""
    name = canonical_dtype(dtype)
    if name is None:
        raise UsageError(option, dtype, f"use one of {', '.join(ELEMENT_SIZES)} (or float32, float16, half, bfloat16, fp8)")
    return ELEMENT_SIZES[name]


def dims_from_config(path: str, dtype: str | None = None) -> ModelDims:
    """Layers, KV heads and head size from a Hugging Face config.json (the text model's,
    `text_config`, in a multimodal one). `num_key_value_heads` defaults to the attention
    heads and `head_dim` to hidden_size // num_attention_heads, as in transformers."""
    try:
        cfg = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UsageError("--config", path, exc.strerror or str(exc)) from None
    except ValueError as exc:  # not UTF-8, not JSON, or a number past Python's 4,300 digits
        raise UsageError("--config", path, f"not JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise UsageError("--config", path, "not a JSON object")
    cfg = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    if not isinstance(cfg, dict):
        raise UsageError("--config", path, "text_config is not a JSON object")

    def field(key: str, required: bool = True) -> int | None:
        value = cfg.get(key)
        if value is None:
            if required:
                raise UsageError("--config", path, f"{key} is missing")
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UsageError("--config", path, f"{key} must be a positive integer, got {value!r}")
        return value

    layers = field("num_hidden_layers")
    heads = field("num_attention_heads")
    kv_heads = field("num_key_value_heads", required=False) or heads
    head_dim = field("head_dim", required=False)
    if head_dim is None:
        hidden = field("hidden_size")
        head_dim = hidden // heads
        if head_dim < 1:
            raise UsageError("--config", path, f"hidden_size {hidden} / num_attention_heads {heads} is no head size; give head_dim")
    if dtype is None:
        dtype = cfg.get("torch_dtype") or cfg.get("dtype") or "bf16"
        if not isinstance(dtype, str) or canonical_dtype(dtype) is None:
            raise UsageError("--config", path, f"torch_dtype {dtype!r} is not a cache dtype; give --dtype")
    return ModelDims(layers, kv_heads, head_dim, dtype)


def capacity(dims: ModelDims, memory_bytes: int, block_size: int = 16, length: int | None = None) -> Capacity:
    for option, value, limit in (("--layers", dims.num_layers, MAX_LAYERS), ("--kv-heads", dims.num_kv_heads, MAX_HEADS),
                                 ("--head-dim", dims.head_dim, MAX_HEAD_DIM), ("--block-size", block_size, MAX_BLOCK_SIZE),
                                 ("--length", 1 if length is None else length, MAX_TOKENS)):
        if value < 1:
            raise UsageError(option, value, "must be at least 1")
        if value > limit:
            raise UsageError(option, value, f"must be at most {limit:,}")
    size = dtype_bytes(dims.dtype)
    per_token_layer = dims.num_kv_heads * 2 * dims.head_dim * size  # K and V: head_size + head_size_v
    per_block_layer = per_token_layer * block_size
    per_block = per_block_layer * dims.num_layers
    num_blocks = memory_bytes // per_block
    if num_blocks < 2:  # block 0 is the null block: a pool needs one more to hold a token
        raise UsageError("--memory", memory_bytes, f"holds {plural(num_blocks, 'block')} of {per_block:,} bytes; a pool needs at least 2 "
                         f"(block 0 is the null block), so at least {2 * per_block:,} bytes")
    usable = num_blocks - 1
    per_request = None if length is None else cdiv(length, block_size)
    return Capacity(
        dims=dims,
        block_size=block_size,
        memory_bytes=memory_bytes,
        bytes_per_token=per_token_layer * dims.num_layers,
        bytes_per_block_per_layer=per_block_layer,
        bytes_per_block=per_block,
        num_blocks=num_blocks,
        usable_blocks=usable,
        tokens=usable * block_size,
        length=length,
        blocks_per_request=per_request,
        requests=None if per_request is None else usable // per_request,
        requests_closed_form=None if length is None else memory_bytes / (per_token_layer * dims.num_layers * length),
    )
