"""KV-cache layouts and the exact address of a token's key and value vectors.

A layout names the axes of the key cache and of the value cache, outermost first.
Axis names:

    block   physical block number            (size num_blocks)
    slot    offset inside the block          (size block_size)
    head    KV head                          (size num_kv_heads)
    dim     element of the head vector       (size head_dim)
    dim_hi  dim // x, for vLLM's split key   (size head_dim // x)
    dim_lo  dim %  x                         (size x = 16 bytes / element size)
    kv      0 for the key, 1 for the value   (size 2: K and V in one tensor)

The axes are listed in memory order. A layout whose engine presents the tensor in
another axis order (vLLM's HND stride order) also names those `view_axes`: the shape
and strides shown are then the view's, non-row-major, and the offsets are the same.

From the axes come the shape, the row-major strides and so the element and byte
offset of any (block, slot, head, dim) from the cache's base. The kernel's launcher
uses the same axes to read the strides of real tensors, so one kernel serves every
layout. Plain Python: no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .blocks import MAX_BLOCK_SIZE, MAX_BLOCKS, MAX_HEAD_DIM, MAX_HEADS, check_size
from .dtypes import ELEMENT_SIZES, canonical_dtype
from .errors import UsageError

# bytes per element of each cache dtype (the one list is pagetrace.dtypes)
DTYPE_SIZES: dict[str, int] = ELEMENT_SIZES

VLLM_KEY_CHUNK_BYTES = 16  # vLLM's key cache packs 16 bytes of a key vector together


@dataclass(frozen=True, slots=True)
class Layout:
    name: str
    summary: str
    key_axes: tuple[str, ...]
    value_axes: tuple[str, ...]
    single_head: bool = False  # the layout has no head axis
    view_axes: tuple[str, ...] | None = None  # the axis order the engine's tensor shows, when not memory order

    @property
    def combined(self) -> bool:
        """K and V in one tensor, told apart by the `kv` axis."""
        return "kv" in self.key_axes

    def shown_axes(self, which: str) -> tuple[str, ...]:
        return self.view_axes or (self.key_axes if which == "key" else self.value_axes)


# The combined K/V layouts of vLLM V1 (v0.9-v0.11 source):
#   vllm/v1/attention/backends/flash_attn.py  FlashAttentionBackend.get_kv_cache_shape
#       -> (2, num_blocks, block_size, num_kv_heads, head_size)
#   vllm/v1/attention/backends/flashinfer.py and triton_attn.py  get_kv_cache_shape
#       -> (num_blocks, 2, block_size, num_kv_heads, head_size)
#   get_kv_cache_stride_order() -> (0, 1, 2, 3, 4) for NHD, (0, 1, 3, 2, 4) for HND
#       (VLLM_KV_CACHE_LAYOUT=HND), and the model runner (gpu_model_runner.py,
#       _reshape_kv_cache_tensors) allocates the shape permuted by the stride order
#       contiguously, then permutes it back: memory order is the permuted shape.
# vLLM 0.32 (installed in /work/vllmenv) has moved on to KVCacheLayout
# (vllm/v1/kv_cache_layout.py, RFC #42082); these are the layouts of the releases above.
_FA_VIEW = ("kv", "block", "slot", "head", "dim")
_FI_VIEW = ("block", "kv", "slot", "head", "dim")


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            "blocks",
            "[num_blocks, block_size, head_dim], one KV head (the worked example)",
            ("block", "slot", "dim"),
            ("block", "slot", "dim"),
            single_head=True,
        ),
        Layout(
            "nhd",
            "[num_blocks, block_size, num_kv_heads, head_dim] (FlashAttention, vLLM V1, FlashInfer NHD)",
            ("block", "slot", "head", "dim"),
            ("block", "slot", "head", "dim"),
        ),
        Layout(
            "hnd",
            "[num_blocks, num_kv_heads, block_size, head_dim] (FlashInfer HND)",
            ("block", "head", "slot", "dim"),
            ("block", "head", "slot", "dim"),
        ),
        Layout(
            "vllm",
            "key [num_blocks, num_kv_heads, head_dim // x, block_size, x], value [num_blocks, num_kv_heads, head_dim, block_size] (vLLM paged_attention v1/v2)",
            ("block", "head", "dim_hi", "slot", "dim_lo"),
            ("block", "head", "dim", "slot"),
        ),
        Layout(
            "flash",
            "[2, num_blocks, block_size, num_kv_heads, head_dim], K and V in one tensor (vLLM V1 FlashAttention, NHD)",
            _FA_VIEW,
            _FA_VIEW,
        ),
        Layout(
            "flash-hnd",
            "[2, num_blocks, block_size, num_kv_heads, head_dim] viewed, memory [2, num_blocks, num_kv_heads, block_size, head_dim] (vLLM V1 FlashAttention, HND stride order)",
            ("kv", "block", "head", "slot", "dim"),
            ("kv", "block", "head", "slot", "dim"),
            view_axes=_FA_VIEW,
        ),
        Layout(
            "flashinfer",
            "[num_blocks, 2, block_size, num_kv_heads, head_dim], K and V in one tensor (vLLM V1 FlashInfer and Triton, NHD)",
            _FI_VIEW,
            _FI_VIEW,
        ),
        Layout(
            "flashinfer-hnd",
            "[num_blocks, 2, block_size, num_kv_heads, head_dim] viewed, memory [num_blocks, 2, num_kv_heads, block_size, head_dim] (vLLM V1 FlashInfer, HND stride order)",
            ("block", "kv", "head", "slot", "dim"),
            ("block", "kv", "head", "slot", "dim"),
            view_axes=_FI_VIEW,
        ),
    )
}

# the layouts the kernel and the reference run on: one tensor per cache
KERNEL_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if not layout.combined)


@dataclass(frozen=True, slots=True)
class CacheGeometry:
    """The sizes that fix a paged cache's shape."""

    layout: Layout
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @property
    def element_size(self) -> int:
        return DTYPE_SIZES[canonical_dtype(self.dtype) or self.dtype]  # any alias: fp8, half, ...

    @property
    def x(self) -> int:
        """Elements per packed key chunk: 16 bytes for the vllm layout, else 1 (no split)."""
        if "dim_lo" in self.layout.key_axes:
            return VLLM_KEY_CHUNK_BYTES // self.element_size
        return 1

    def axis_size(self, axis: str) -> int:
        return {
            "block": self.num_blocks,
            "slot": self.block_size,
            "head": self.num_kv_heads,
            "dim": self.head_dim,
            "dim_hi": self.head_dim // self.x,
            "dim_lo": self.x,
            "kv": 2,
        }[axis]

    def shape(self, which: str) -> tuple[int, ...]:
        return tuple(self.axis_size(axis) for axis in self.axes(which))

    def axes(self, which: str) -> tuple[str, ...]:
        return self.layout.key_axes if which == "key" else self.layout.value_axes

    def numel(self, which: str) -> int:
        n = 1
        for size in self.shape(which):
            n *= size
        return n


def get_layout(name: str, option: str = "--layout") -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise UsageError(option, name, f"choose one of {', '.join(LAYOUTS)}") from None


def make_geometry(
    layout: str,
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: str,
) -> CacheGeometry:
    """Validate the sizes and build the cache geometry (errors name the CLI option)."""
    lay = get_layout(layout)
    name = canonical_dtype(dtype) if isinstance(dtype, str) else None
    if name is None:
        raise UsageError("--dtype", dtype, f"choose one of {', '.join(DTYPE_SIZES)}")
    dtype = name
    for option, value, limit in (
        ("--num-blocks", num_blocks, MAX_BLOCKS),
        ("--block-size", block_size, MAX_BLOCK_SIZE),
        ("--kv-heads", num_kv_heads, MAX_HEADS),
        ("--head-dim", head_dim, MAX_HEAD_DIM),
    ):
        check_size(option, value, limit)
    if lay.single_head and num_kv_heads != 1:
        raise UsageError("--kv-heads", num_kv_heads, f"the '{lay.name}' layout holds one KV head; use nhd, hnd or vllm for several")
    geom = CacheGeometry(lay, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    if geom.x > 1 and head_dim % geom.x:
        raise UsageError(
            "--head-dim",
            head_dim,
            f"the vllm key layout splits each key into chunks of x = 16 bytes / {geom.element_size} bytes = {geom.x} elements ({dtype}); head_dim must be a multiple of {geom.x}",
        )
    return geom


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def axis_index(geom: CacheGeometry, which: str, block: int, slot: int, head: int, dim: int) -> tuple[int, ...]:
    """The tensor index of element `dim` of (block, slot, head)'s key or value vector."""
    coords = {
        "block": block,
        "slot": slot,
        "head": head,
        "dim": dim,
        "dim_hi": dim // geom.x,
        "dim_lo": dim % geom.x,
        "kv": 0 if which == "key" else 1,
    }
    return tuple(coords[axis] for axis in geom.axes(which))


def element_offset(geom: CacheGeometry, which: str, block: int, slot: int, head: int, dim: int, strides: tuple[int, ...] | None = None) -> int:
    """Elements from the cache's base to one element of a key or value vector."""
    if strides is None:
        strides = row_major_strides(geom.shape(which))
    index = axis_index(geom, which, block, slot, head, dim)
    return sum(i * s for i, s in zip(index, strides))


@dataclass(frozen=True, slots=True)
class Chunk:
    """A run of consecutive elements of one vector that also lie consecutively in memory."""

    first_dim: int
    element_offset: int
    elements: int


@dataclass(frozen=True, slots=True)
class VectorAddress:
    """Where one token's key (or value) vector for one KV head lies in its cache tensor."""

    which: str  # "key" or "value"
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements (row-major unless the layout has view_axes)
    axes: tuple[str, ...]
    index: tuple[int, ...]  # tensor index of element 0 of the vector
    element_offset: int  # of element 0
    byte_offset: int  # of element 0
    element_size: int
    block_base: int  # element offset of the physical block's first element
    chunks: tuple[Chunk, ...]

    @property
    def contiguous(self) -> bool:
        return len(self.chunks) == 1

    @property
    def chunk_stride(self) -> int | None:
        """Elements between the starts of consecutive chunks (None when contiguous)."""
        if len(self.chunks) < 2:
            return None
        return self.chunks[1].element_offset - self.chunks[0].element_offset

    @property
    def last_element_offset(self) -> int:
        last = self.chunks[-1]
        return last.element_offset + last.elements - 1


def shown_order(geom: CacheGeometry, which: str, values: tuple[int, ...]) -> tuple[int, ...]:
    """Per-axis `values` (in memory order) rearranged into the order the tensor shows."""
    axes = geom.axes(which)
    return tuple(values[axes.index(a)] for a in geom.layout.shown_axes(which))


def vector_address(geom: CacheGeometry, which: str, block: int, slot: int, head: int) -> VectorAddress:
    shape = geom.shape(which)
    strides = row_major_strides(shape)
    offsets = [element_offset(geom, which, block, slot, head, d, strides) for d in range(geom.head_dim)]
    chunks: list[Chunk] = []
    first = 0
    for d in range(1, geom.head_dim + 1):
        if d == geom.head_dim or offsets[d] != offsets[d - 1] + 1:
            chunks.append(Chunk(first, offsets[first], d - first))
            first = d
    return VectorAddress(
        which=which,
        shape=shown_order(geom, which, shape),
        strides=shown_order(geom, which, strides),
        axes=geom.layout.shown_axes(which),
        index=shown_order(geom, which, axis_index(geom, which, block, slot, head, 0)),
        element_offset=offsets[0],
        byte_offset=offsets[0] * geom.element_size,
        element_size=geom.element_size,
        # where this block's part of the cache begins: (block, slot 0, head 0, dim 0)
        block_base=element_offset(geom, which, block, 0, 0, 0, strides),
        chunks=tuple(chunks),
    )


def kernel_strides(layout: Layout, which: str, tensor_strides: tuple[int, ...]) -> dict[str, int]:
    """Map a real tensor's strides onto the axes the kernel addresses.

    Returns strides for block, slot, head, dim_hi and dim_lo. A layout without a head
    axis gets head stride 0; a layout without the split key gets dim_hi = the dim
    stride and dim_lo = 0, so ``d // 1 * dim_hi + d % 1 * dim_lo`` is plain ``d * dim``.
    """
    axes = layout.key_axes if which == "key" else layout.value_axes
    if len(axes) != len(tensor_strides):
        raise ValueError(f"{which} cache has {len(tensor_strides)} dims; the '{layout.name}' layout needs {len(axes)} {axes}")
    by_axis = dict(zip(axes, tensor_strides))
    if "dim" in by_axis:
        by_axis["dim_hi"], by_axis["dim_lo"] = by_axis.pop("dim"), 0
    by_axis.setdefault("head", 0)
    return {axis: by_axis[axis] for axis in ("block", "slot", "head", "dim_hi", "dim_lo")}
