"""An engine's raw KV buffer read as K and V tensors, and tensors checked against a layout.

The layouts are `pagetrace.paging.layouts.LAYOUTS`, the one table every command uses. This module
applies one to real tensors: `as_tensors` gives K and V of a raw buffer (or a (key, value)
pair) as ``[num_blocks, block_size, H, D]`` tensors, strided views with no copy where the
layout is affine, a gathered copy where it is tiled (vLLM's CPU amx pages); `verify` checks
that tensors someone hands us really are the views a layout names (a wrong view of the
right shape has the right shape and the wrong strides, and fails here, naming the axis).

Plain Python at import: torch is imported by the functions that take tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from ..paging.layouts import AXES, CacheGeometry, Layout, check_factors, get_layout

TORCH_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8_e4m3", "torch.float8_e5m2": "fp8_e5m2"}
# vLLM keeps an fp8 KV cache ("fp8", "fp8_e4m3", "fp8_e5m2") in torch.uint8 tensors and an int8 one
# in torch.int8 (STR_DTYPE_TO_TORCH_DTYPE, vllm/utils/torch_utils.py). A layout places elements by
# their size alone, so another dtype is placed as pagetrace's dtype of its size (which fp8, the
# engine's cache_dtype says); one of no such size (float64, in tests) as fp32, which places it
# right in every layout that splits no axis by bytes.
BY_SIZE = {4: "fp32", 2: "fp16", 1: "fp8_e4m3"}


def dtype_name(tensor) -> str:
    """pagetrace's dtype name for placing a cache tensor's elements."""
    return TORCH_NAMES.get(str(tensor.dtype)) or BY_SIZE.get(tensor.element_size(), "fp32")


@dataclass(frozen=True, slots=True)
class KVView:
    """A strided tensor as measured: its strides in (block, slot, head, dim) order and its
    offset in elements from the first element of the raw buffer it views."""

    which: str  # "key" or "value"
    shape: tuple[int, int, int, int]  # (num_blocks, block_size, num_kv_heads, head_dim)
    strides: tuple[int, int, int, int]  # elements, same axis order
    offset: int
    element_size: int
    buffer: str = "kv"  # which raw buffer: "kv" (one for K and V), "key" or "value"


def geometry(layout: Layout | str, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: str) -> CacheGeometry:
    """The geometry of an engine's cache; refuses dims the layout cannot split."""
    lay = get_layout(layout, "layout") if isinstance(layout, str) else layout
    geom = CacheGeometry(lay, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    check_factors(geom)
    return geom


def expected_view(geom: CacheGeometry, which: str) -> KVView | None:
    """The strided view the layout gives K or V; None for a tiled layout (no strides read it)."""
    affine = geom.affine(which)
    if affine is None:
        return None
    strides, offset = affine
    shape = (geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim)
    return KVView(which, shape, strides, offset, geom.element_size, geom.layout.buffer(which))


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


def coordinate_grid(nb: int, bs: int, h: int, d: int, device=None):
    """(block, slot, head, dim) as four int64 tensors that broadcast to [nb, bs, h, d]: feed them
    to `CacheGeometry.element` for every element's offset at once."""
    import torch

    return tuple(torch.arange(n, device=device).view(*[n if i == k else 1 for i in range(4)]) for k, n in enumerate((nb, bs, h, d)))


def split_buffers(raw, layout: Layout) -> dict[str, object]:
    """which -> the raw buffer holding it: one buffer for both, or a (key, value) pair."""
    if layout.combined:
        return {"key": raw, "value": raw}
    if not isinstance(raw, (tuple, list)) or len(raw) != 2:
        raise UsageError("kv_cache", type(raw).__name__, f"the '{layout.name}' layout keeps K and V in two tensors: pass a (key, value) pair")
    return {"key": raw[0], "value": raw[1]}


def as_tensors(raw, layout: Layout | str, bs: int, h: int, d: int):
    """K and V of a raw buffer (or a (key, value) pair) as ``[num_blocks, block_size, H, D]``
    tensors: views with the layout's strides (no copy), or for a tiled layout a copy gathered
    through the layout's element offsets. The raw buffer(s) must be contiguous."""
    import torch

    lay = get_layout(layout, "layout") if isinstance(layout, str) else layout
    bufs = split_buffers(raw, lay)
    for buf in bufs.values():
        if not buf.is_contiguous():
            raise UsageError("kv_cache", tuple(buf.stride()), f"the '{lay.name}' layout reads a contiguous buffer")
    dtype = dtype_name(bufs["key"])
    nb = int(bufs["key"].shape[lay.block_axis]) if bufs["key"].dim() > lay.block_axis else 0
    geom = geometry(lay, nb, bs, h, d, dtype)
    out = []
    for which in ("key", "value"):
        buf = bufs[which]
        want = geom.raw_shape(which)
        if tuple(buf.shape) != want:
            raise UsageError("kv_cache", tuple(buf.shape), f"the '{lay.name}' layout with block size {bs}, {h} KV heads, head_dim {d} has shape {want}")
        view = expected_view(geom, which)
        if view is not None:
            out.append(torch.as_strided(buf, view.shape, view.strides, buf.storage_offset() + view.offset))
            continue
        out.append(buf.reshape(-1)[geom.element(which, *coordinate_grid(nb, bs, h, d, buf.device))])
    return tuple(out)


def verify(key, value, raw, layout: str) -> tuple[KVView, KVView]:
    """Check that `key` and `value` (``[num_blocks, block_size, H, D]`` tensors) are the views
    `layout` gives of `raw` (one buffer, or a (key, value) pair); returns their descriptions.

    Use it before handing an engine's tensors to `pagetrace.paged_attention`, which reads
    whatever strides it is given."""
    lay = get_layout(layout, "layout")
    nb, bs, h, d = (int(n) for n in key.shape)
    geom = geometry(lay, nb, bs, h, d, dtype_name(key))
    bufs = split_buffers(raw, lay)
    found = []
    for which, tensor in (("key", key), ("value", value)):
        want = expected_view(geom, which)
        if want is None:
            raise UsageError("layout", layout, "is tiled: no strided view reads it; take K and V from pagetrace.engines.views.as_tensors (a copy)")
        got = describe(tensor, bufs[which], which, buffer=want.buffer)
        check_view(got, want, lay.name)
        found.append(got)
    return found[0], found[1]


def pool_views(manifest, step, tensors: dict):
    """(key, value, compact): the stored pages of a bundle's step (`bundle.Manifest`,
    `bundle.Step`) as ``[stored_blocks, bs, H, D]`` views, and physical block -> pool block.
    `check` and `replay` both read the pages this way."""
    raw = tensors["kv"] if manifest.layout.combined else (tensors["key"], tensors["value"])
    key, value = as_tensors(raw, manifest.layout, manifest.block_size, manifest.num_kv_heads, manifest.head_dim)
    from .bundle import stored_blocks

    return key, value, {b: i for i, b in enumerate(stored_blocks(manifest, step))}
