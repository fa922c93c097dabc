"""KV-cache layouts: where element (block, slot, head, dim) of K or V lies in memory.

One table, `LAYOUTS`, serves every command and every engine adapter. A layout lists,
for the key and for the value, the *factors* of its buffer in memory order, outermost
first; the buffer is row-major over the factors' sizes. A factor is a logical axis or
a part of one:

    block  physical block number           slot  offset inside the block
    head   KV head                         dim   element of the head vector
    kv     0 for K, 1 for V (K and V share one buffer)

    "slot"      the whole axis
    "slot%16"   slot % 16, the inner part (16 values)
    "slot/16"   slot // 16, the outer part (the rest)
    "dim/x%y"   (dim // x) % y, a middle part, when an axis is split three ways

A size is a number or a symbol of the element size: x = 16 bytes / element (vLLM's
split key), p = 4 bytes / element (the dword pairs of vLLM's CPU amx pages). vLLM's
split key [N, H, D/x, bs, x] is ("block", "head", "dim/x", "slot", "dim%x"); the CPU
backend's amx key is ("block", "head", "kv", "slot/16", "dim/p", "slot%16", "dim%p").

This is CuTe's hierarchical Shape:Stride in a few dataclasses: `CacheGeometry.formula`
prints each logical axis as `shape:stride`, a split axis as tuples in CuTe's order, its
fastest-varying part first (the amx key at bs 32, D 64, bf16: `slot:(16,2):(2,1024)
dim:(2,32):(1,32)`). A layout is affine
(one stride per logical axis) unless an axis other than the key's dim is split; the
kernel reads affine layouts through strides, and a tiled one through a copy.

Plain Python: no torch here. `CacheGeometry.element` takes ints or integer arrays
(NumPy, torch) alike, so the probe and the views compute every offset with it.
"""

from __future__ import annotations

import functools
import re
from typing import NamedTuple

from ..errors import UsageError
from .blocks import MAX_BLOCK_SIZE, MAX_BLOCKS, MAX_HEAD_DIM, MAX_HEADS, check_size
from .dtypes import ELEMENT_SIZES, canonical_dtype

# bytes per element of each cache dtype (the one list is pagetrace.paging.dtypes)
DTYPE_SIZES: dict[str, int] = ELEMENT_SIZES

AXES = ("block", "slot", "head", "dim")  # the coordinates of one element of K or V
VLLM_KEY_CHUNK_BYTES = 16  # x: vLLM's split key packs 16 bytes of a key vector together
AMX_PAIR_BYTES = 4  # p: vLLM's amx pages pack 4 bytes (a dword) of consecutive elements

_FACTOR = re.compile(r"^(block|slot|head|dim|kv)(?:/(\w+))?(?:%(\w+))?$")
_OPTIONS = {"block": "--num-blocks", "slot": "--block-size", "head": "--kv-heads", "dim": "--head-dim"}


class Layout(NamedTuple):
    name: str
    summary: str
    source: str  # where the engine defines it
    key: tuple[str, ...]  # the key buffer's factors, memory order, outermost first
    value: tuple[str, ...]
    raw: tuple[str, ...] | None = None  # the engine's own shape of the buffer, when not the factors'
    view: tuple[str, ...] | None = None  # the axis order the engine's tensor shows, when not memory order

    @property
    def combined(self) -> bool:
        """K and V in one buffer, told apart by the `kv` factor."""
        return "kv" in self.key

    @property
    def single_head(self) -> bool:
        return "head" not in self.key

    def factors(self, which: str) -> tuple[str, ...]:
        return self.key if which == "key" else self.value

    def buffer(self, which: str) -> str:
        """The buffer K or V lives in: "kv" (one for both), "key" or "value"."""
        return "kv" if self.combined else which

    def shown_axes(self, which: str) -> tuple[str, ...]:
        return self.view or self.factors(which)

    @property
    def tiled(self) -> bool:
        """Some axis other than the key's dim is split: no strided view reads it."""
        for which in ("key", "value"):
            for axis in AXES:
                parts = [f for f in self.factors(which) if _FACTOR.match(f).group(1) == axis]
                if len(parts) > 1 and (which == "value" or axis != "dim" or len(parts) > 2):
                    return True
        return False

    @property
    def block_axis(self) -> int:
        """The axis of the raw buffer (the engine's shape) that numbers blocks."""
        return self.raw.index("N") if self.raw else self.key.index("block")

    @property
    def kernel_ready(self) -> bool:
        """`paged_attention` takes it as two cache tensors with these factors as axes."""
        return not self.combined and not self.tiled


# The layouts of vLLM V1 before the layout RFC (v0.9-v0.11 source):
#   vllm/v1/attention/backends/flash_attn.py  FlashAttentionBackend.get_kv_cache_shape
#       -> (2, num_blocks, block_size, num_kv_heads, head_size)
#   vllm/v1/attention/backends/flashinfer.py and triton_attn.py  get_kv_cache_shape
#       -> (num_blocks, 2, block_size, num_kv_heads, head_size)
#   get_kv_cache_stride_order() -> (0, 1, 2, 3, 4) for NHD, (0, 1, 3, 2, 4) for HND; the model
#       runner (gpu_model_runner.py, _reshape_kv_cache_tensors) allocates the shape permuted by
#       the stride order contiguously, then permutes it back: memory order is the permuted shape.
# vLLM 0.32 (vllm/v1/kv_cache_layout.py, RFC #42082): logical [B, H, N, 2D], K|V packed in the
# last axis; LBHNC keeps that order in memory, LBNHC stores [B, N, H, 2D]. FlashAttention splits
# it with `kv_cache.transpose(1, 2).split(head_size, dim=-1)` (v1/attention/backends/flash_attn.py).
# vLLM 0.32's CPU backend (v1/attention/backends/cpu_attn.py, forward and do_kv_cache_update):
# [N, H, bs, 2D] re-viewed as [N, H, 2bs, D] and chunked: each (block, head) page is bs*D keys,
# then bs*D values. Where inside a half each element goes is the writer's choice, by ISA
# (`_get_attn_isa`; the op `cpu_attn_reshape_and_cache`, csrc/cpu/cpu_attn_*.hpp):
#   vec, vec16: K column-major (dim, slot), V row-major (slot, dim);
#   amx: K in 16-slot groups of dword pairs, V in 16-dim groups of slot pairs, read back from the
#   op itself by `pagetrace layouts --probe` and at every capture (engines/probe.py).
_FA = ("kv", "block", "slot", "head", "dim")
_FI = ("block", "kv", "slot", "head", "dim")

LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout("blocks", "[num_blocks, block_size, head_dim], one KV head (the worked example)", "the worked example",
               ("block", "slot", "dim"), ("block", "slot", "dim")),
        Layout("nhd", "[num_blocks, block_size, num_kv_heads, head_dim], a key and a value tensor",
               "FlashAttention flash_attn_with_kvcache; FlashInfer (k, v) NHD; SGLang k_buffer/v_buffer paged",
               ("block", "slot", "head", "dim"), ("block", "slot", "head", "dim")),
        Layout("hnd", "[num_blocks, num_kv_heads, block_size, head_dim], a key and a value tensor", "FlashInfer (k, v) HND",
               ("block", "head", "slot", "dim"), ("block", "head", "slot", "dim")),
        Layout("vllm", "key [num_blocks, num_kv_heads, head_dim/x, block_size, x], value [num_blocks, num_kv_heads, head_dim, block_size]",
               "vLLM csrc/attention paged_attention_v1/v2",
               ("block", "head", "dim/x", "slot", "dim%x"), ("block", "head", "dim", "slot")),
        Layout("flash", "[2, num_blocks, block_size, num_kv_heads, head_dim], K and V in one tensor",
               "vLLM V1 FlashAttention (NHD), before 0.32", _FA, _FA),
        Layout("flash-hnd", "[2, num_blocks, block_size, num_kv_heads, head_dim] viewed, memory [2, num_blocks, num_kv_heads, block_size, head_dim]",
               "vLLM V1 FlashAttention (HND stride order), before 0.32",
               ("kv", "block", "head", "slot", "dim"), ("kv", "block", "head", "slot", "dim"), view=_FA),
        Layout("flashinfer", "[num_blocks, 2, block_size, num_kv_heads, head_dim], K and V in one tensor",
               "FlashInfer paged_kv_cache NHD; vLLM V1 FlashInfer and Triton, before 0.32", _FI, _FI),
        Layout("flashinfer-hnd", "[num_blocks, 2, num_kv_heads, block_size, head_dim], K and V in one tensor",
               "FlashInfer paged_kv_cache HND; vLLM V1 FlashInfer (HND stride order), before 0.32",
               ("block", "kv", "head", "slot", "dim"), ("block", "kv", "head", "slot", "dim"), view=_FI),
        Layout("vllm-hnd", "[num_blocks, num_kv_heads, block_size, 2*head_dim], K then V in the last axis",
               "vLLM 0.32 KVCacheLayout.LBHNC (v1/kv_cache_layout.py)",
               ("block", "head", "slot", "kv", "dim"), ("block", "head", "slot", "kv", "dim"), raw=("N", "H", "bs", "2D")),
        Layout("vllm-nhd", "[num_blocks, block_size, num_kv_heads, 2*head_dim] in memory, K then V in the last axis",
               "vLLM 0.32 KVCacheLayout.LBNHC (v1/kv_cache_layout.py)",
               ("block", "slot", "head", "kv", "dim"), ("block", "slot", "head", "kv", "dim"), raw=("N", "bs", "H", "2D")),
        Layout("vllm-cpu", "[num_blocks, num_kv_heads, block_size, 2*head_dim]: per (block, head) K column-major, then V row-major",
               "vLLM 0.32 CPU backend, isa vec and vec16 (v1/attention/backends/cpu_attn.py)",
               ("block", "head", "kv", "dim", "slot"), ("block", "head", "kv", "slot", "dim"), raw=("N", "H", "bs", "2D")),
        Layout("vllm-cpu-amx", "[num_blocks, num_kv_heads, block_size, 2*head_dim]: per (block, head) K in 16-slot tiles of dword pairs, V in 16-dim tiles of slot pairs",
               "vLLM 0.32 CPU backend, isa amx (cpu_attn_reshape_and_cache, csrc/cpu/cpu_attn_amx.hpp)",
               ("block", "head", "kv", "slot/16", "dim/p", "slot%16", "dim%p"),
               ("block", "head", "kv", "dim/16", "slot/p", "dim%16", "slot%p"), raw=("N", "H", "bs", "2D")),
    )
}

# names that bundles written by earlier pagetrace releases carry in kv_cache.layout
OLD_NAMES = {"flash-attn": "flash", "flashinfer-nhd": "flashinfer"}

# the layouts `paged_attention` takes directly: a key and a value tensor, one stride per axis
KERNEL_LAYOUTS = tuple(name for name, layout in LAYOUTS.items() if layout.kernel_ready)


class Factor(NamedTuple):
    """One factor of a buffer: coordinate (axis // div) % size, at `stride` elements."""

    name: str
    axis: str
    div: int
    size: int
    stride: int


class CacheGeometry(NamedTuple):
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
        """Elements per packed key chunk (vLLM's split key: the key's dim%x factor), else 1."""
        inner = [f.size for f in self.factors("key") if f.name == "dim%x"]
        return inner[0] if inner else 1

    def _number(self, token: str) -> int:
        if token == "x":
            return max(1, VLLM_KEY_CHUNK_BYTES // self.element_size)
        if token == "p":
            return max(1, AMX_PAIR_BYTES // self.element_size)
        return int(token)

    def axis_size(self, axis: str) -> int:
        return {"block": self.num_blocks, "slot": self.block_size, "head": self.num_kv_heads, "dim": self.head_dim, "kv": 2}[axis]

    def factors(self, which: str) -> tuple[Factor, ...]:
        """The buffer's factors with their sizes and row-major strides (`check_factors` has
        made sure each axis's factors tile it exactly). Computed once per geometry."""
        return _factors(self, which)

    def _resolve(self, which: str) -> tuple[Factor, ...]:
        parsed = []
        for spec in self.layout.factors(which):
            axis, div, size = _FACTOR.match(spec).groups()
            d = self._number(div) if div else 1
            n = self._number(size) if size else self.axis_size(axis) // d
            parsed.append((spec, axis, d, n))
        out, stride = [], 1
        for spec, axis, d, n in reversed(parsed):
            out.append(Factor(spec, axis, d, n, stride))
            stride *= n
        return tuple(reversed(out))

    def axes(self, which: str) -> tuple[str, ...]:
        return self.layout.factors(which)

    def shape(self, which: str) -> tuple[int, ...]:
        return tuple(f.size for f in self.factors(which))

    def strides(self, which: str) -> tuple[int, ...]:
        return tuple(f.stride for f in self.factors(which))

    def numel(self, which: str) -> int:
        n = 1
        for size in self.shape(which):
            n *= size
        return n

    def raw_shape(self, which: str = "key") -> tuple[int, ...]:
        """The buffer's shape in the engine's own words (what a bundle stores)."""
        if self.layout.raw is None:
            return self.shape(which)
        sizes = {"N": self.num_blocks, "H": self.num_kv_heads, "bs": self.block_size, "2D": 2 * self.head_dim, "D": self.head_dim}
        return tuple(sizes[t] for t in self.layout.raw)

    @property
    def block_axis(self) -> int:
        return self.layout.block_axis

    def index(self, which: str, block, slot, head, dim) -> tuple:
        """Each factor's coordinate of element `dim` of (block, slot, head)'s key or value."""
        coords = {"block": block, "slot": slot, "head": head, "dim": dim, "kv": 0 if which == "key" else 1}
        return tuple((coords[f.axis] // f.div) % f.size for f in self.factors(which))

    def element(self, which: str, block, slot, head, dim):
        """Elements from the buffer's first element to this one (ints or integer arrays)."""
        coords = {"block": block, "slot": slot, "head": head, "dim": dim, "kv": 0 if which == "key" else 1}
        total = 0
        for f in self.factors(which):
            total = total + (coords[f.axis] // f.div) % f.size * f.stride
        return total

    def coordinates(self, element: int, cache: str | None = None) -> tuple[str, dict[str, int], tuple[int, ...]]:
        """The inverse of `element`: (which, {block, slot, head, dim}, factor index) of one
        element of the buffer. A combined buffer's `kv` factor says which; the factors before it
        are the same for K and V (a test holds every layout to that)."""
        which = cache or "key"
        for _ in range(2):
            index, rest = [], element
            for f in self.factors(which):
                digit, rest = divmod(rest, f.stride)
                index.append(digit)
            kv = dict(zip(self.axes(which), index)).get("kv")
            if kv is None or ("key", "value")[kv] == which:
                break
            which = ("key", "value")[kv]
        coords = dict.fromkeys(AXES, 0)
        for f, digit in zip(self.factors(which), index):
            if f.axis != "kv":
                coords[f.axis] += digit * f.div
        return which, coords, tuple(index)

    def affine(self, which: str) -> tuple[tuple[int, int, int, int], int] | None:
        """((block, slot, head, dim) strides, offset) when one stride per axis reads it, else None."""
        strides = dict.fromkeys(AXES, 0)
        offset = 0
        for f in self.factors(which):
            if f.axis == "kv":
                offset = (0 if which == "key" else 1) * f.stride
            elif f.div == 1 and f.size == self.axis_size(f.axis):
                strides[f.axis] = f.stride
            elif f.size > 1:  # a split that matters (a factor of size 1 is always at 0)
                return None
        return (strides["block"], strides["slot"], strides["head"], strides["dim"]), offset

    def formula(self, which: str) -> str:
        """CuTe's notation, one logical axis at a time: `slot:(16,2):(2,1024)`, plus the offset
        of the kv factor. A split axis lists its parts in CuTe's colexicographic order, the
        fastest-varying first: `(16,2):(2,1024)` is slot % 16 at stride 2, then slot // 16 at
        stride 1024 (include/cute/layout.hpp; the CuTe docs' 01_layout)."""
        parts = []
        factors = self.factors(which)
        for axis in AXES:
            mine = sorted((f for f in factors if f.axis == axis), key=lambda f: f.div)  # innermost part first, as CuTe
            if not mine:
                continue
            if len(mine) == 1:
                parts.append(f"{axis}:{mine[0].size}:{mine[0].stride}")
            else:
                parts.append(f"{axis}:({','.join(str(f.size) for f in mine)}):({','.join(str(f.stride) for f in mine)})")
        kv = [f for f in factors if f.axis == "kv"]
        offset = kv[0].stride * (0 if which == "key" else 1) if kv else 0
        return "  ".join(parts) + f"  + {offset}"


@functools.lru_cache(maxsize=256)
def _factors(geom: CacheGeometry, which: str) -> tuple[Factor, ...]:
    return geom._resolve(which)


def get_layout(name: str, option: str = "--layout") -> Layout:
    try:
        return LAYOUTS[OLD_NAMES.get(name, name)]
    except KeyError:
        raise UsageError(option, name, f"choose one of {', '.join(LAYOUTS)}") from None


def check_factors(geom: CacheGeometry) -> None:
    """A split axis must be a multiple of what its factors split off (amx: slot of 16,
    dim of p). Errors name the option of the axis. That the factors of each table entry
    tile their axis exactly is held by tests/paging/test_layouts.py."""
    for which in ("key", "value"):
        for spec in geom.layout.factors(which):
            axis, div, size = _FACTOR.match(spec).groups()
            if axis == "kv" or not (div or size):
                continue
            need = (geom._number(div) if div else 1) * (geom._number(size) if size else 1)
            if geom.axis_size(axis) % need:
                raise UsageError(
                    _OPTIONS[axis], geom.axis_size(axis),
                    f"the '{geom.layout.name}' layout splits the {which}'s {axis} as {spec} ({need} with {geom.dtype}); use a multiple of {need}",
                )


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
    check_factors(geom)
    return geom


class Chunk(NamedTuple):
    """A run of consecutive elements of one vector that also lie consecutively in memory."""

    first_dim: int
    element_offset: int
    elements: int


class VectorAddress(NamedTuple):
    """Where one token's key (or value) vector for one KV head lies in its cache buffer."""

    which: str  # "key" or "value"
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements (row-major over the factors unless the layout has a view)
    axes: tuple[str, ...]
    index: tuple[int, ...]  # factor index of element 0 of the vector
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
        return max(c.element_offset + c.elements - 1 for c in self.chunks)


def shown_order(geom: CacheGeometry, which: str, values: tuple[int, ...]) -> tuple[int, ...]:
    """Per-factor `values` (in memory order) rearranged into the order the tensor shows."""
    axes = geom.axes(which)
    return tuple(values[axes.index(a)] for a in geom.layout.shown_axes(which))


def chunks_of(offsets: list[int]) -> tuple[Chunk, ...]:
    """Runs of consecutive dims that lie at consecutive elements."""
    chunks: list[Chunk] = []
    first = 0
    for d in range(1, len(offsets) + 1):
        if d == len(offsets) or offsets[d] != offsets[d - 1] + 1:
            chunks.append(Chunk(first, offsets[first], d - first))
            first = d
    return tuple(chunks)


def vector_address(geom: CacheGeometry, which: str, block: int, slot: int, head: int) -> VectorAddress:
    offsets = [geom.element(which, block, slot, head, d) for d in range(geom.head_dim)]
    return VectorAddress(
        which=which,
        shape=shown_order(geom, which, geom.shape(which)),
        strides=shown_order(geom, which, geom.strides(which)),
        axes=geom.layout.shown_axes(which),
        index=shown_order(geom, which, geom.index(which, block, slot, head, 0)),
        element_offset=offsets[0],
        byte_offset=offsets[0] * geom.element_size,
        element_size=geom.element_size,
        # where this block's part of the cache begins: (block, slot 0, head 0, dim 0)
        block_base=geom.element(which, block, 0, 0, 0),
        chunks=chunks_of(offsets),
    )


def start_addresses(geom: CacheGeometry, blocks, slots) -> list[dict]:
    """Where each (block, slot)'s key and value vectors start, per KV head: the element and byte
    of dim 0 (what `lookup` prints as the vector's offset), for many slots at once (NumPy).
    One dict per slot: key_element, key_byte, value_element, value_byte, each a list over KV heads.
    `run --json` and `replay --json` rows take these (and so do their pages)."""
    import numpy as np

    blocks = np.asarray(blocks, dtype=np.int64)
    slots = np.asarray(slots, dtype=np.int64)
    size = geom.element_size
    columns = {}
    for which in ("key", "value"):
        # [slots, heads]; `+ zeros` makes a layout whose element ignores the block (or slot) an array too
        elements = np.stack([np.asarray(geom.element(which, blocks, slots, h, 0), dtype=np.int64) + np.zeros_like(blocks)
                             for h in range(geom.num_kv_heads)], axis=1) if len(blocks) else np.zeros((0, geom.num_kv_heads), np.int64)
        columns[f"{which}_element"] = elements.tolist()
        columns[f"{which}_byte"] = (elements * size).tolist()
    return [{name: col[i] for name, col in columns.items()} for i in range(len(blocks))]


def kernel_strides(layout: Layout, which: str, tensor_strides: tuple[int, ...]) -> dict[str, int]:
    """Map a real tensor's strides onto the axes the kernel addresses.

    The tensor's axes are the layout's factors. Returns strides for block, slot, head,
    dim_hi and dim_lo (the kernel's element d at ``d // x * dim_hi + d % x * dim_lo``): a
    layout without a head axis gets head stride 0; one whose dim is whole gets dim_hi = its
    stride and dim_lo = 0, so the sum is plain ``d * dim``.
    """
    if not layout.kernel_ready:
        raise ValueError(f"the '{layout.name}' layout is not two strided tensors; read it through pagetrace.engines.views.as_tensors")
    axes = layout.factors(which)
    if len(axes) != len(tensor_strides):
        raise ValueError(f"{which} cache has {len(tensor_strides)} dims; the '{layout.name}' layout needs {len(axes)} {axes}")
    out = {"block": 0, "slot": 0, "head": 0, "dim_hi": 0, "dim_lo": 0}
    for spec, stride in zip(axes, tensor_strides):
        axis, div, size = _FACTOR.match(spec).groups()
        if axis == "dim":
            out["dim_lo" if size and not div else "dim_hi"] = stride
        else:
            out[axis] = stride
    return out


def table_markdown() -> str:
    """The documented layout table (docs/layouts.md), made from `LAYOUTS`
    (tests/paging/test_layout_model.py holds the page to it; `pagetrace layouts --markdown` prints it)."""
    lines = [
        "| layout | key factors (memory order) | value factors | what it is | engine |",
        "|---|---|---|---|---|",
    ]
    for lay in LAYOUTS.values():
        key, value = (f"`({', '.join(lay.factors(w))})`" for w in ("key", "value"))
        lines.append(f"| `{lay.name}` | {key} | {value if lay.value != lay.key else 'same'} | {lay.summary} | {lay.source} |")
    return "\n".join(lines) + "\n"


def runs_text(runs: list[tuple[int, int]], element_size: int) -> str:
    """How a vector's runs lie, in words: `runs` is (element offset, elements) per chunk.
    A tiled vector (the amx value: 16 single elements 2 apart, then the next 16 far away)
    says its groups, so no reader takes the first gap for all of them."""
    n, size = len(runs), runs[0][1]
    if n == 1:
        return f"contiguous, {size} elements"
    what = f"{n} chunks of {size} elements" if all(r[1] == size for r in runs) and size > 1 else (
        f"{n} single elements" if all(r[1] == 1 for r in runs) else f"{n} runs of {'/'.join(sorted({str(r[1]) for r in runs}, key=int))} elements")
    starts = ", ".join(str(r[0]) for r in runs[:4]) + (", ..." if n > 4 else "")
    gaps = [b[0] - a[0] for a, b in zip(runs, runs[1:])]

    def apart(g: int) -> str:
        return f"{g} elements ({g * element_size} bytes) apart"

    if len(set(gaps)) == 1:
        return f"{what}, {apart(gaps[0])}, at {starts}"
    inner = gaps[0]
    k = next((i for i, g in enumerate(gaps) if g != inner), len(gaps)) + 1  # runs per group
    groups = [runs[i][0] for i in range(0, n, k)]
    if n % k == 0 and all(gaps[i] == inner for i in range(len(gaps)) if (i + 1) % k) and len({b - a for a, b in zip(groups, groups[1:])}) == 1:
        return f"{what} in {n // k} groups of {k}, {apart(inner)} within a group, the groups {apart(groups[1] - groups[0])}, at {starts}"
    return f"{what} at irregular gaps ({', '.join(map(str, sorted(set(gaps))))} elements), at {starts}"
