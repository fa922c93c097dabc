"""K/V cache layouts as data: any strided view an engine hands us, described and checked.

An engine keeps one raw buffer per layer (or a key and a value buffer) and reads K and V
through strided views of it. pagetrace describes every view the same way, whatever
the engine: a shape in the axis order ``(block, slot, head, dim)``, the strides of those
axes in elements, and a storage offset from the raw buffer's first element. From that
come the element and byte address of any (block, slot, head, dim), and a check that a
tensor someone hands us really is the view the layout names (a wrong view of the right
shape has the right shape and the wrong strides, and fails here, naming the axis).

Plain Python: no torch here (`as_tensors` imports it when called).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

AXES = ("block", "slot", "head", "dim")


@dataclass(frozen=True, slots=True)
class KVView:
    """Where K (or V) of every (block, slot, head, dim) lies in the raw buffer."""

    which: str  # "key" or "value"
    shape: tuple[int, int, int, int]  # (num_blocks, block_size, num_kv_heads, head_dim)
    strides: tuple[int, int, int, int]  # elements, same axis order
    offset: int  # elements from the raw buffer's first element
    element_size: int
    buffer: str = "kv"  # which raw buffer: "kv" (one for K and V), "key" or "value"

    def element(self, block: int, slot: int, head: int, dim: int) -> int:
        return self.offset + sum(i * s for i, s in zip((block, slot, head, dim), self.strides))

    def byte(self, block: int, slot: int, head: int, dim: int = 0) -> int:
        return self.element(block, slot, head, dim) * self.element_size

    def to_json(self) -> dict:
        return {
            "which": self.which,
            "buffer": self.buffer,
            "axes": list(AXES),
            "shape": list(self.shape),
            "strides": list(self.strides),
            "offset": self.offset,
            "element_size": self.element_size,
        }


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """A named engine layout: the raw buffer's shape and the K and V views of it."""

    name: str
    raw: str  # the raw buffer's shape, in the engine's words
    source: str  # where the engine defines it
    block_axis: int  # axis of the raw buffer that numbers blocks
    separate: bool  # K and V are two buffers (a (k, v) tuple), not one

    def raw_shape(self, nb: int, bs: int, h: int, d: int) -> tuple[int, ...]:
        return _RAW[self.name](nb, bs, h, d)

    def views(self, nb: int, bs: int, h: int, d: int, element_size: int) -> tuple[KVView, KVView]:
        (ks, ko), (vs, vo) = _VIEWS[self.name](nb, bs, h, d)
        kb, vb = ("key", "value") if self.separate else ("kv", "kv")
        shape = (nb, bs, h, d)
        return KVView("key", shape, ks, ko, element_size, kb), KVView("value", shape, vs, vo, element_size, vb)


# Raw buffer shapes (contiguous, row-major), by layout name.
_RAW = {
    "vllm-cpu": lambda nb, bs, h, d: (nb, h, bs, 2 * d),
    "vllm-hnd": lambda nb, bs, h, d: (nb, h, bs, 2 * d),
    "vllm-nhd": lambda nb, bs, h, d: (nb, bs, h, 2 * d),
    "flash-attn": lambda nb, bs, h, d: (2, nb, bs, h, d),
    "flashinfer-nhd": lambda nb, bs, h, d: (nb, 2, bs, h, d),
    "flashinfer-hnd": lambda nb, bs, h, d: (nb, 2, h, bs, d),
    "nhd": lambda nb, bs, h, d: (nb, bs, h, d),
    "hnd": lambda nb, bs, h, d: (nb, h, bs, d),
}

# ((key strides, key offset), (value strides, value offset)), strides in (block, slot, head, dim) order.
_VIEWS = {
    # One (block, head) page of bs * 2d elements: K first, column-major (element (s, d) at
    # d * bs + s), then V row-major (s * d + d). The backend re-views [N, H, bs, 2D] as
    # [N, H, 2 bs, D] and chunks dim 2 (vllm/v1/attention/backends/cpu_attn.py, forward);
    # the column-major K is how csrc/cpu's reshape_and_cache writes it, checked bit for bit
    # against the keys vLLM 0.32 wrote (tests/test_vllm_e2e.py).
    "vllm-cpu": lambda nb, bs, h, d: (((h * bs * 2 * d, 1, bs * 2 * d, bs), 0), ((h * bs * 2 * d, d, bs * 2 * d, 1), bs * d)),
    # vLLM 0.32, KVCacheLayout.LBHNC: logical [B, H, N, 2D], K|V packed in the last axis;
    # FlashAttention splits `kv_cache.transpose(1, 2).split(head_size, dim=-1)`
    # (vllm/v1/attention/backends/flash_attn.py; vllm/v1/kv_cache_layout.py).
    "vllm-hnd": lambda nb, bs, h, d: (((h * bs * 2 * d, 2 * d, bs * 2 * d, 1), 0), ((h * bs * 2 * d, 2 * d, bs * 2 * d, 1), d)),
    # vLLM 0.32, KVCacheLayout.LBNHC: physical [B, N, H, 2D].
    "vllm-nhd": lambda nb, bs, h, d: (((bs * h * 2 * d, h * 2 * d, 2 * d, 1), 0), ((bs * h * 2 * d, h * 2 * d, 2 * d, 1), d)),
    # vLLM V1 before the layout RFC: FlashAttentionBackend.get_kv_cache_shape
    # = (2, num_blocks, block_size, num_kv_heads, head_size); kv_cache.unbind(0).
    "flash-attn": lambda nb, bs, h, d: (((bs * h * d, h * d, d, 1), 0), ((bs * h * d, h * d, d, 1), nb * bs * h * d)),
    # FlashInfer's paged_kv_cache 5-D form [max_num_pages, 2, page_size, num_kv_heads, head_dim]
    # (NHD) or [max_num_pages, 2, num_kv_heads, page_size, head_dim] (HND); also vLLM V1's
    # FlashInfer/Triton shape before the RFC (num_blocks, 2, block_size, num_kv_heads, head_size).
    "flashinfer-nhd": lambda nb, bs, h, d: (((2 * bs * h * d, h * d, d, 1), 0), ((2 * bs * h * d, h * d, d, 1), bs * h * d)),
    "flashinfer-hnd": lambda nb, bs, h, d: (((2 * h * bs * d, d, bs * d, 1), 0), ((2 * h * bs * d, d, bs * d, 1), h * bs * d)),
    # Two buffers: FlashInfer's (k_cache, v_cache) tuple, NHD or HND; SGLang's per-layer
    # k_buffer / v_buffer [size, head_num, head_dim] viewed as [size // page_size, page_size, H, D].
    "nhd": lambda nb, bs, h, d: (((bs * h * d, h * d, d, 1), 0), ((bs * h * d, h * d, d, 1), 0)),
    "hnd": lambda nb, bs, h, d: (((h * bs * d, d, bs * d, 1), 0), ((h * bs * d, d, bs * d, 1), 0)),
}

ENGINE_LAYOUTS: dict[str, EngineLayout] = {
    lay.name: lay
    for lay in (
        EngineLayout("vllm-cpu", "[num_blocks, num_kv_heads, block_size, 2*head_dim]", "vllm/v1/attention/backends/cpu_attn.py", 0, False),
        EngineLayout("vllm-hnd", "[num_blocks, num_kv_heads, block_size, 2*head_dim]", "vllm/v1/kv_cache_layout.py LBHNC; flash_attn.py", 0, False),
        EngineLayout("vllm-nhd", "[num_blocks, block_size, num_kv_heads, 2*head_dim]", "vllm/v1/kv_cache_layout.py LBNHC", 0, False),
        EngineLayout("flash-attn", "[2, num_blocks, block_size, num_kv_heads, head_dim]", "vLLM V1 FlashAttentionBackend.get_kv_cache_shape", 1, False),
        EngineLayout("flashinfer-nhd", "[num_pages, 2, page_size, num_kv_heads, head_dim]", "flashinfer paged_kv_cache, kv_layout='NHD'", 0, False),
        EngineLayout("flashinfer-hnd", "[num_pages, 2, num_kv_heads, page_size, head_dim]", "flashinfer paged_kv_cache, kv_layout='HND'", 0, False),
        EngineLayout("nhd", "k, v: [num_blocks, block_size, num_kv_heads, head_dim]", "flashinfer (k, v) tuple NHD; sglang k_buffer/v_buffer", 0, True),
        EngineLayout("hnd", "k, v: [num_blocks, num_kv_heads, block_size, head_dim]", "flashinfer (k, v) tuple HND", 0, True),
    )
}


def get_engine_layout(name: str, option: str = "layout") -> EngineLayout:
    try:
        return ENGINE_LAYOUTS[name]
    except KeyError:
        raise UsageError(option, name, f"choose one of {', '.join(ENGINE_LAYOUTS)}") from None


def describe(tensor, base, which: str, axes: tuple[str, ...] = AXES, buffer: str = "kv") -> KVView:
    """The `KVView` a real tensor is: its strides in (block, slot, head, dim) order and its
    offset from `base` (the raw buffer it views). `axes` names the tensor's own axis order."""
    order = [axes.index(a) for a in AXES]
    shape = tuple(int(tensor.shape[i]) for i in order)
    strides = tuple(int(tensor.stride()[i]) for i in order)
    offset = (tensor.data_ptr() - base.data_ptr()) // tensor.element_size()
    return KVView(which, shape, strides, offset, tensor.element_size(), buffer)


def check_view(actual: KVView, expected: KVView, layout: str) -> None:
    """Refuse a view that is not the one `layout` gives, naming the first axis that differs.

    Two views of one shape with different strides read different memory: the check is
    what stops a wrong view of the right shape from running silently."""
    what = f"{actual.which} view"
    if actual.shape != expected.shape:
        raise UsageError(what, list(actual.shape), f"the '{layout}' layout gives shape {list(expected.shape)} (block, slot, head, dim)")
    for axis, got, want, size in zip(AXES, actual.strides, expected.strides, actual.shape):
        if got != want and size > 1:
            raise UsageError(what, list(actual.strides), f"its {axis} stride is {got} elements; the '{layout}' layout has {want} (strides {list(expected.strides)})")
    if actual.offset != expected.offset:
        raise UsageError(what, actual.offset, f"starts {actual.offset} elements into the buffer; the '{layout}' layout starts it at {expected.offset}")


def as_tensors(raw, layout: EngineLayout, bs: int, h: int, d: int):
    """K and V of a raw buffer (or a (key, value) pair) as ``[num_blocks, block_size, H, D]``
    tensors with the layout's strides: no copy. The raw buffer(s) must be contiguous."""
    import torch

    buffers = tuple(raw) if layout.separate else (raw,)
    for buf in buffers:
        if not buf.is_contiguous():
            raise UsageError("kv_cache", tuple(buf.stride()), f"the '{layout.name}' layout reads a contiguous {layout.raw} buffer")
    nb = int(buffers[0].shape[layout.block_axis])
    want = layout.raw_shape(nb, bs, h, d)
    for buf in buffers:
        if tuple(buf.shape) != want:
            raise UsageError("kv_cache", tuple(buf.shape), f"the '{layout.name}' layout with block size {bs}, {h} KV heads, head_dim {d} has shape {want}")
    kview, vview = layout.views(nb, bs, h, d, buffers[0].element_size())
    k_buf, v_buf = buffers if layout.separate else (raw, raw)
    key = torch.as_strided(k_buf, kview.shape, kview.strides, k_buf.storage_offset() + kview.offset)
    value = torch.as_strided(v_buf, vview.shape, vview.strides, v_buf.storage_offset() + vview.offset)
    return key, value


def verify(key, value, raw, layout: str) -> tuple[KVView, KVView]:
    """Check that `key` and `value` (``[num_blocks, block_size, H, D]`` tensors) are the views
    `layout` gives of `raw` (one buffer, or a (key, value) pair); returns their descriptions.

    Use it before handing an engine's tensors to `pagetrace.paged_attention`, which reads
    whatever strides it is given."""
    lay = get_engine_layout(layout)
    nb, bs, h, d = (int(n) for n in key.shape)
    want_k, want_v = lay.views(nb, bs, h, d, key.element_size())
    k_buf, v_buf = tuple(raw) if lay.separate else (raw, raw)
    got_k = describe(key, k_buf, "key", buffer=want_k.buffer)
    got_v = describe(value, v_buf, "value", buffer=want_v.buffer)
    check_view(got_k, want_k, layout)
    check_view(got_v, want_v, layout)
    return got_k, got_v
