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

from ..errors import UsageError, plural
from ..paging.blocks import MAX_BLOCK_SIZE, MAX_HEAD_DIM, MAX_HEADS, MAX_TOKENS, cdiv
from ..paging.dtypes import ELEMENT_SIZES, canonical_dtype

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
    groups: list[dict] | None = None  # a hybrid model's KV cache groups (sim/hybrid.py): kind, layers, blocks per request


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
    """Bytes per element of a cache dtype, by any name `pagetrace.paging.dtypes` knows (fp16, half, bfloat16, fp8, ...)."""
    name = canonical_dtype(dtype)
    if name is None:
        raise UsageError(option, dtype, f"use one of {', '.join(ELEMENT_SIZES)} (or float32, float16, half, bfloat16, fp8)")
    return ELEMENT_SIZES[name]


def read_config(path: str) -> dict:
    """A Hugging Face config.json, the text model's part (`text_config`) of a multimodal one."""
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
    return cfg


def config_field(cfg: dict, path: str, key: str, required: bool = True) -> int | None:
    value = cfg.get(key)
    if value is None:
        if required:
            raise UsageError("--config", path, f"{key} is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError("--config", path, f"{key} must be a positive integer, got {value!r}")
    return value


def dims_from_config(path: str, dtype: str | None = None) -> ModelDims:
    return dims_of(read_config(path), path, dtype)


def dims_of(cfg: dict, path: str, dtype: str | None = None) -> ModelDims:
    """Layers, KV heads and head size from a Hugging Face config (`read_config`; `path` names it
    in errors). `num_key_value_heads` defaults to the attention heads and `head_dim` to
    hidden_size // num_attention_heads, as in transformers."""

    def field(key: str, required: bool = True) -> int | None:
        return config_field(cfg, path, key, required)

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


def capacity(dims: ModelDims, memory_bytes: int, block_size: int = 16, length: int | None = None, kinds: list | None = None) -> Capacity:
    """`kinds`: each layer's attention (sim/hybrid.py `LayerKind`), for a model with sliding-window
    layers: vLLM then groups the layers (`kv_cache_groups`), one pool block holds a page of each
    layer of one group (the largest: `group_size` layers), and every group takes its own blocks
    from the pool. A sliding group holds at most cdiv(W - 1, block_size) + 1 blocks of a decoding
    request (the window's tokens and one block of offset), a full group all of them."""
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
    groups = None
    if kinds:
        from .hybrid import kv_cache_groups

        hybrid, group_size = kv_cache_groups(kinds)
        per_block = per_block_layer * group_size
    else:
        per_block = per_block_layer * dims.num_layers
    num_blocks = memory_bytes // per_block
    if num_blocks < 2:  # block 0 is the null block: a pool needs one more to hold a token
        raise UsageError("--memory", memory_bytes, f"holds {plural(num_blocks, 'block')} of {per_block:,} bytes; a pool needs at least 2 "
                         f"(block 0 is the null block), so at least {2 * per_block:,} bytes")
    usable = num_blocks - 1
    per_request = None if length is None else cdiv(length, block_size)
    tokens = usable * block_size
    if kinds:
        windows = [g.kind.window for g in hybrid]
        # one sequence as long as the pool allows: the sliding groups' windows, the rest in full groups
        window_blocks = sum(cdiv(w - 1, block_size) + 1 for w in windows if w is not None)
        num_full = sum(1 for w in windows if w is None)
        tokens = (max(usable - window_blocks, 0) // num_full * block_size) if num_full else None
        groups = []
        for g in hybrid:
            w = g.kind.window
            held = None if length is None else (cdiv(length, block_size) if w is None else min(cdiv(length, block_size), cdiv(w - 1, block_size) + 1))
            groups.append({"kind": g.kind.kind, "window": w, "layers": g.layers, "blocks_per_request": held,
                           "bytes_per_block": per_block_layer * g.layers})
        if length is not None:
            per_request = sum(x["blocks_per_request"] for x in groups)
    return Capacity(
        dims=dims,
        block_size=block_size,
        memory_bytes=memory_bytes,
        bytes_per_token=per_token_layer * dims.num_layers,
        bytes_per_block_per_layer=per_block_layer,
        bytes_per_block=per_block,
        num_blocks=num_blocks,
        usable_blocks=usable,
        tokens=tokens,
        length=length,
        blocks_per_request=per_request,
        requests=None if per_request is None else usable // per_request,
        requests_closed_form=None if length is None else memory_bytes / (per_token_layer * dims.num_layers * length),
        groups=groups,
    )


# -- the budget vLLM gives the KV cache on a device -----------------------------------------
# vllm/v1/worker/utils.py request_memory: requested = ceil(total_memory x gpu_memory_utilization);
# vllm/v1/worker/gpu_worker.py determine_available_memory: available KV cache memory =
# requested - non_kv_cache_memory (the weights, the activation peak of the profiling run and
# the memory torch does not allocate: NCCL, the CUDA context) - the CUDA-graph estimate.
# Checked against what vLLM printed in vllm#10517 (tests/sim/test_capacity_budget.py).


def parameter_count(cfg: dict, path: str) -> int:
    """Parameters of a dense decoder-only transformer from its config.json: embeddings, per layer
    the q/k/v/o projections (with biases where `attention_bias` says so, as Qwen2 has them), the
    gated MLP (gate, up, down) and two norms, the final norm, and the LM head unless the
    embeddings are tied. A mixture of experts is refused: give --weights."""
    if any(cfg.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")):
        raise UsageError("--config", path, "is a mixture of experts; its weights are not counted here, give --weights")

    def field(key: str, required: bool = True) -> int | None:
        return config_field(cfg, path, key, required)

    hidden, layers, heads, vocab, inter = (field(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size", "intermediate_size"))
    kv_heads = field("num_key_value_heads", required=False) or heads
    head_dim = field("head_dim", required=False) or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    bias = q + 2 * kv if cfg.get("attention_bias") or "Qwen2" in "".join(cfg.get("architectures") or []) else 0
    per_layer = hidden * q + 2 * hidden * kv + q * hidden + bias + 3 * hidden * inter + 2 * hidden
    lm_head = 0 if cfg.get("tie_word_embeddings") else vocab * hidden
    return vocab * hidden + layers * per_layer + hidden + lm_head


def activation_estimate(cfg: dict, path: str, tokens: int, element_size: int) -> int:
    """A rough activation peak for vLLM's profiling run of `tokens` batched tokens: per token
    the gated MLP's two intermediate activations and four hidden-sized buffers. A documented
    guess, printed as one; vLLM measures it (its log: `peak_activation_memory`), pass --activation."""
    hidden, inter = config_field(cfg, path, "hidden_size"), config_field(cfg, path, "intermediate_size")
    return tokens * (2 * inter + 4 * hidden) * element_size


@dataclass(slots=True)
class DeviceBudget:
    total_bytes: int
    utilization: float
    requested_bytes: int  # ceil(total x utilization)
    weights_bytes: int
    weights_from: str  # "config.json: N parameters x B bytes", or "--weights"
    activation_bytes: int
    activation_from: str
    non_torch_bytes: int
    kv_cache_bytes: int

    def to_json(self) -> dict:
        return asdict(self)


def device_budget(total: int, utilization: float, weights: int, weights_from: str, activation: int, activation_from: str, non_torch: int) -> DeviceBudget:
    if not (0 < utilization <= 1) or not math.isfinite(utilization):
        raise UsageError("--gpu-memory-utilization", utilization, "is a share of the device's memory: above 0, at most 1")
    requested = math.ceil(total * utilization)
    kv = requested - weights - activation - non_torch
    if kv <= 0:
        raise UsageError("--gpu-memory", total, f"x {utilization} = {requested:,} bytes leaves nothing for the KV cache after the weights "
                         f"({weights:,}), activations ({activation:,}) and non-torch memory ({non_torch:,})")
    return DeviceBudget(total, utilization, requested, weights, weights_from, activation, activation_from, non_torch, kv)
