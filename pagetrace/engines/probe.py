"""Learn a cache layout from the engine's own cache writer, element by element.

Tagged keys and values go through the writer the layer itself uses into a scratch cache of
a few blocks: token t is written to slot t, and each element carries, pass by pass, one
base-128 digit of its token, its head or its dim, plus 1 (so every tag is an integer that
bf16 holds exactly, and 0 or NaN is never one); keys are positive, values negative. Reading
the scratch back names every element: (key or value, block, slot, head, dim). A layout of
`pagetrace.paging.layouts.LAYOUTS` is proven when its arithmetic puts every element exactly where
the writer did. Nothing proven: `ProbeRefused`, naming the first element found elsewhere.

The writers: for vLLM, the backend's own `do_kv_cache_update(layer, key, value, kv_cache,
slot_mapping)` (vllm/v1/attention/backend.py; the CPU backend's calls
`cpu_attn_reshape_and_cache` with the layer's `isa`, v1/attention/backends/cpu_attn.py);
for `pagetrace layouts --probe`, that op called directly for an ISA you name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import RuntimeFailure
from ..paging.layouts import LAYOUTS, CacheGeometry, check_factors
from .views import coordinate_grid

SCRATCH_BLOCKS = 3  # block 0, and two more so the block stride is seen twice
DIGIT = 128  # one base-128 digit per pass, + 1: integers 1..128, exact in bf16


class ProbeRefused(RuntimeFailure):
    """No layout of the table explains where the writer put the elements."""


@dataclass(slots=True)
class Probe:
    layout: str  # the layout proven (the expected one when several explain the write)
    explained_by: list[str]  # every table layout that puts each element where the writer did
    elements: int  # elements written and checked
    writer: str
    isa: str | None = None
    misses: dict[str, str] = field(default_factory=dict)  # layout -> its first misplaced element

    def to_json(self) -> dict:
        return {"method": "writer", "writer": self.writer, "isa": self.isa, "scratch_blocks": SCRATCH_BLOCKS,
                "elements": self.elements, "layout": self.layout, "explained_by": self.explained_by}


def _passes(sizes: dict[str, int]) -> list[tuple[str, int]]:
    """(coordinate, divisor) per pass: enough base-128 digits for each coordinate."""
    out = []
    for name, n in sizes.items():
        div = 1
        while True:
            out.append((name, div))
            div *= DIGIT
            if div >= n:
                break
    return out


def read_back(write, scratch, raw_of, block_size: int, num_kv_heads: int, head_dim: int):
    """Run the tagged passes through `write(key, value, scratch, slot_mapping)` and name every
    element of the raw buffer `raw_of(scratch)`: a dict of int64 tensors over its elements,
    `sign` (+1 key, -1 value, 0 never written), `token`, `head`, `dim`."""
    import torch

    tokens = SCRATCH_BLOCKS * block_size
    coords = {
        "token": torch.arange(tokens).view(-1, 1, 1).expand(tokens, num_kv_heads, head_dim),
        "head": torch.arange(num_kv_heads).view(1, -1, 1).expand(tokens, num_kv_heads, head_dim),
        "dim": torch.arange(head_dim).view(1, 1, -1).expand(tokens, num_kv_heads, head_dim),
    }
    slots = torch.arange(tokens, dtype=torch.int64, device=scratch.device)
    named = {name: torch.zeros(raw_of(scratch).numel(), dtype=torch.int64) for name in coords}
    sign = None
    for name, div in _passes({"token": tokens, "head": num_kv_heads, "dim": head_dim}):
        tag = ((coords[name] // div) % DIGIT + 1).to(torch.float32)
        scratch.fill_(float("nan"))
        try:
            write(tag.to(scratch.dtype).to(scratch.device).contiguous(), (-tag).to(scratch.dtype).to(scratch.device).contiguous(), scratch, slots)
        except RuntimeError as exc:  # the engine refuses these dims (amx: block_size a multiple of 32)
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RuntimeFailure(f"the engine's cache writer refused block size {block_size}, {num_kv_heads} KV heads, head_dim {head_dim}: {reason}") from None
        raw = raw_of(scratch)
        if not raw.is_contiguous():
            raise RuntimeFailure(f"the probe reads the raw buffer in memory order; this one has strides {tuple(raw.stride())}")
        got = raw.reshape(-1).float().cpu()
        written = ~torch.isnan(got)
        s = torch.where(written, torch.sign(got), torch.zeros_like(got)).to(torch.int64)
        sign = s if sign is None else torch.where(sign == s, sign, torch.zeros_like(sign))
        digit = torch.where(written, got.abs() - 1, torch.zeros_like(got)).round().to(torch.int64)
        named[name] += digit * div
    return {"sign": sign, **named}


def explains(named: dict, geom: CacheGeometry) -> str | None:
    """None when `geom` puts every element where the writer did; else the first element it misplaces."""
    nb, bs, h, d = geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim
    b, s, hh, dd = (t.expand(nb, bs, h, d) for t in coordinate_grid(nb, bs, h, d))
    total = named["sign"].numel()
    for which, sign in (("key", 1), ("value", -1)):
        where = geom.element(which, b, s, hh, dd)
        if int(where.min()) < 0 or int(where.max()) >= total:
            return f"the {which}s do not fit the buffer of {total} elements"
        ok = (named["sign"][where] == sign) & (named["token"][where] == b * bs + s) & (named["head"][where] == hh) & (named["dim"][where] == dd)
        if not bool(ok.all()):
            i = int((~ok).reshape(-1).nonzero()[0])
            blk, slot, head, dim = (int(t.reshape(-1)[i]) for t in (b, s, hh, dd))
            at = int(where.reshape(-1)[i])
            found = ((named["sign"] == sign) & (named["token"] == blk * bs + slot) & (named["head"] == head) & (named["dim"] == dim)).nonzero()
            there = f"the writer put it at element {int(found[0])}" if len(found) else "the writer did not write it"
            return f"{which} (block {blk}, slot {slot}, head {head}, dim {dim}): the '{geom.layout.name}' layout puts it at element {at}; {there}"
    return None


def learn_layout(write, scratch, raw_of, *, block_size: int, num_kv_heads: int, head_dim: int, dtype: str,
                 expected: str | None, writer: str, isa: str | None = None) -> Probe:
    """The table layout that explains the writer, preferring `expected`; refuses when none does."""
    named = read_back(write, scratch, raw_of, block_size, num_kv_heads, head_dim)
    shape = tuple(raw_of(scratch).shape)
    explained, misses = [], {}
    for name, lay in LAYOUTS.items():
        geom = CacheGeometry(lay, SCRATCH_BLOCKS, block_size, num_kv_heads, head_dim, dtype)
        try:
            check_factors(geom)
        except ValueError:
            continue
        if not lay.combined or geom.raw_shape() != shape:
            continue
        miss = explains(named, geom)
        if miss is None:
            explained.append(name)
        else:
            misses[name] = miss
    written = int((named["sign"] != 0).sum())
    if not explained:
        first = misses.get(expected) or next(iter(misses.values()), f"no layout of the table has the raw shape {list(shape)}")
        raise ProbeRefused(
            f"{writer}{f' (isa {isa})' if isa else ''}: no layout of pagetrace's table explains where it wrote the "
            f"{2 * SCRATCH_BLOCKS * block_size * num_kv_heads * head_dim} tagged elements; {first}. Capture refused: "
            "a bundle would misread this cache"
        )
    chosen = expected if expected in explained else explained[0]
    return Probe(chosen, explained, written, writer, isa, misses)


def vllm_cpu_writer(isa: str):
    """vLLM's CPU cache writer for one ISA, as the backend calls it (cpu_attn.py,
    do_kv_cache_update: [N, H, bs, 2D] viewed as [N, H, 2bs, D], chunked into K and V)."""
    from vllm import _custom_ops as ops

    def write(key, value, kv_cache, slot_mapping):
        n, h, bs, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(n, h, 2 * bs, -1).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, isa)

    return write


def probe_vllm_cpu(isa: str, block_size: int, num_kv_heads: int, head_dim: int, dtype: str) -> Probe:
    """Which layout vLLM's installed CPU writer produces for `isa` and these dims."""
    import torch

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    scratch = torch.empty(SCRATCH_BLOCKS, num_kv_heads, block_size, 2 * head_dim, dtype=torch_dtype)
    return learn_layout(vllm_cpu_writer(isa), scratch, lambda t: t, block_size=block_size, num_kv_heads=num_kv_heads, head_dim=head_dim,
                        dtype=dtype, expected=None, writer="vLLM cpu_attn_reshape_and_cache", isa=isa)
