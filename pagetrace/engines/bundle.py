"""The capture bundle: one engine step (or several) on disk, and its loader.

A bundle is a folder:

    manifest.json          what was captured (engine, model dims, cache layout, steps)
    step-NNNN.safetensors  one file per captured step: its metadata and tensors

safetensors keeps shapes and dtypes but not strides, so the manifest names the cache
layout (`pagetrace.paging.layouts.LAYOUTS`) and each cache tensor is stored
contiguous in the layout's raw shape, with only the blocks the step references. The
docs/engines.md lists every field. Loading refuses a malformed bundle
with a `BundleError` (exit 2) naming the file and the field. The index tensors load
through NumPy, so `check` and `lookup --from` never import torch.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..paging.layouts import LAYOUTS, OLD_NAMES, CacheGeometry, Layout, check_factors

FORMAT = "pagetrace-capture"
VERSION = 1
DTYPES = {"fp32": 4, "fp16": 2, "bf16": 2}
TORCH_DTYPES = {"fp32": "torch.float32", "fp16": "torch.float16", "bf16": "torch.bfloat16"}
SHARING = ("none", "full-blocks")  # which blocks requests may share: prefix caching shares full blocks
INDEX_TENSORS = ("query_start_loc", "seq_lens", "block_table", "block_counts", "slot_mapping", "positions", "blocks")


class BundleError(UsageError):
    """A bundle that cannot be read: names the file and the field (None: the whole file)."""

    def __init__(self, file: str | Path, field_name: str | None, reason: str) -> None:
        where = f"{file}: {field_name}" if field_name else str(file)
        super().__init__(where, "", reason)
        self.args = (f"malformed bundle: {where}: {reason}",)

    def __str__(self) -> str:
        return self.args[0]


@dataclass(slots=True)
class Manifest:
    engine: dict
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    layout: Layout
    block_size: int
    kernel_block_size: int
    num_blocks: int
    null_block: int | None
    table_padding: int
    slot_padding: int
    sharing: str
    scale: float
    k_scale: float
    v_scale: float
    sliding_window: int | None
    layers: dict[int, str]  # layer index -> engine's layer name
    steps: list[dict]
    ring: dict | None = None  # the metadata ring's entry (meta_ring.py): its steps, bytes and segment files
    folder: Path | None = None  # the bundle's folder (the ring's segments are read from it)

    @property
    def element_size(self) -> int:
        return DTYPES[self.dtype]

    @property
    def engine_words(self) -> str:
        """`vllm 0.32.0 CPU_ATTN isa amx`, `flashinfer`: the fields the bundle has, no gaps."""
        e = self.engine
        isa = f"isa {e['isa']}" if e.get("isa") else None
        return " ".join(str(part) for part in (e.get("name"), e.get("version"), e.get("backend"), isa) if part)

    def geometry(self, num_blocks: int | None = None) -> CacheGeometry:
        """The engine's whole cache (real addresses), or `num_blocks` stored pages of it."""
        return CacheGeometry(self.layout, self.num_blocks if num_blocks is None else num_blocks, self.block_size, self.num_kv_heads, self.head_dim, self.dtype)


@dataclass(slots=True)
class Step:
    """One captured forward pass: the attention metadata, as plain lists."""

    step: int
    file: Path
    requests: list[str]
    layers: list[int]
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: list[list[int]]  # full rows, padding included
    block_counts: list[int]
    slot_mapping: list[int]  # padding included
    positions: list[int]
    blocks: list[int]  # physical blocks whose pages are stored
    dtypes: dict[str, str] = field(default_factory=dict)  # index tensor -> numpy dtype name
    guard: dict | None = None  # the guard's record of a step it flagged (mode, violations, what it made safe, affected requests)
    ring: bool = False  # a step of the metadata ring: index tensors and request ids, no pages

    @property
    def num_tokens(self) -> int:
        return self.query_start_loc[-1] if self.query_start_loc else 0

    def query_len(self, r: int) -> int:
        return self.query_start_loc[r + 1] - self.query_start_loc[r]

    def request_index(self, request: str, option: str = "--request") -> int:
        """A request by its id, by the part of it the client knows (`names_request`), or by its
        row. A name that fits several (the samples of an n > 1 request) is refused naming them."""
        if request in self.requests:
            return self.requests.index(request)
        found = [i for i, r in enumerate(self.requests) if names_request(request, r)]
        if len(found) == 1:
            return found[0]
        samples = [i for i in found if self.requests[i].partition("_")[0].isdigit() and "_" in self.requests[i]]
        if len(found) > 1 and samples == found:
            raise UsageError(option, request, f"names {len(found)} requests of step {self.step} (the samples of an n > 1 request): "
                                              f"{', '.join(self.requests[i] for i in found)}; name one")
        if request.isdigit() and int(request) < len(self.requests):
            return int(request)
        raise UsageError(option, request, f"step {self.step} holds requests {', '.join(self.requests)}")


OPENAI_PREFIXES = ("cmpl-", "chatcmpl-")  # vLLM's OpenAI server: f"cmpl-{X-Request-Id or a uuid}" (entrypoints/openai/completion/serving.py)


def names_request(name: str, engine_id: str) -> bool:
    """Whether a client's name for a request names this engine id. vLLM's ids, as installed
    (vllm 0.32): the OpenAI server makes `cmpl-<id>` (chat: `chatcmpl-<id>`), <id> the
    client's X-Request-Id header when it sends one (entrypoints/serve/engine/serving.py,
    `_base_request_id`), then `-<prompt index>`; the engine appends `-` and 8 random hex
    characters (v1/engine/input_processor.py, `assign_request_id`); an n > 1 request's samples
    are `<k>_<parent id>` (v1/engine/parallel_sampling.py, `get_child_info`). So `cmpl-x-0-1a2b3c4d`
    is named by itself, `cmpl-x-0`, `cmpl-x` and the X-Request-Id `x`, and `1_cmpl-w2-0-...` also by
    its parent's `cmpl-w2`."""
    forms = [engine_id]
    head, sep, rest = engine_id.partition("_")
    if sep and head.isdigit():
        forms.append(rest)  # the parent's id
    for form in list(forms):
        forms += [form[len(p):] for p in OPENAI_PREFIXES if form.startswith(p)]  # the X-Request-Id
    return any(f == name or f.startswith(name + "-") for f in forms)


def steps_holding(manifest: "Manifest", request: str) -> list[int]:
    """The steps whose requests a client's name fits (the manifest's steps, then the metadata ring's)."""
    found = {s["step"] for s in manifest.steps if any(r == request or names_request(request, r) for r in s["requests"])}
    found |= {n for n, requests in ring_requests(manifest).items() if any(r == request or names_request(request, r) for r in requests)}
    return sorted(found)


def step_entries(manifest: "Manifest") -> list[dict]:
    """Every step the bundle holds, as manifest entries ({step, requests, ...}): the step files, and
    the metadata ring's steps that have no file (`ring: True`), in step order."""
    files = {s["step"] for s in manifest.steps}
    ring = [{"step": n, "requests": r, "layers": [], "ring": True} for n, r in ring_requests(manifest).items() if n not in files]
    return sorted(manifest.steps + ring, key=lambda e: e["step"])


def step_for_request(manifest: "Manifest", step: int | None, request: str | None, note=None) -> int | None:
    """The step to read: `step` when given; else the first step when it holds the request (or no
    request is named); else the first that holds it, with `note` told the list. None of them: refused."""
    entries = step_entries(manifest)
    if step is not None or request is None or not entries:
        return step
    first = entries[0]
    if any(r == request or names_request(request, r) for r in first["requests"]) or (request.isdigit() and int(request) < len(first["requests"])):
        # None reads the first step file; a metadata ring's earlier step is named
        return None if manifest.steps and first is manifest.steps[0] else first["step"]
    holding = steps_holding(manifest, request)
    if not holding:
        raise UsageError("--request", request, f"no step of the bundle holds it; step {first['step']} holds requests {', '.join(first['requests'])}")
    if note is not None:
        note(f"request {request} is in {'step' if len(holding) == 1 else 'steps'} {ranges_text(holding)} of this bundle; "
             f"reading step {holding[0]} (--step picks another)")
    return holding[0]


def ranges_text(numbers: list[int]) -> str:
    """[3, 4, 5, 9] -> `3-5, 9`."""
    out, start = [], None
    for i, n in enumerate(numbers):
        if start is None:
            start = n
        if i + 1 == len(numbers) or numbers[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}-{n}")
            start = None
    return ", ".join(out)


def _get(doc: dict, key: str, kind, file, prefix: str = "", optional: bool = False):
    name = f"{prefix}{key}"
    if key not in doc or doc[key] is None:
        if optional:
            return None
        raise BundleError(file, name, "is missing")
    value = doc[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise BundleError(file, name, f"must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise BundleError(file, name, f"must be a finite number, got {value!r}")
    if kind in (str, list, dict) and not isinstance(value, kind):
        raise BundleError(file, name, f"must be a {kind.__name__}, got {type(value).__name__}")
    return value


def read_manifest(path: str | Path) -> Manifest:
    folder = Path(path)
    file = folder / "manifest.json"
    if not folder.is_dir():
        beside = sorted(folder.parent.glob(f"{folder.name}.rank*")) if folder.parent.is_dir() and not folder.exists() else []
        if beside:  # the server plugin with tensor parallelism: one bundle per rank, PATH.rank<r> (and PATH.rank<r>.2, ... after a rotation)
            raise UsageError("BUNDLE", str(path), f"is not a folder; with tensor parallelism each rank wrote its own bundle: "
                                                  f"{', '.join(str(p) for p in beside)}; name one")
        raise UsageError("BUNDLE", str(path), "is not a folder; a capture bundle is a folder with manifest.json")
    try:
        doc = json.loads(file.read_text())
    except FileNotFoundError:
        raise BundleError(file, None, "is missing") from None
    except IsADirectoryError:
        raise BundleError(file, None, "is a folder, not a file") from None
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, not JSON, or a number past Python's 4,300 digits
        raise BundleError(file, None, f"is not readable JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise BundleError(file, "format", f"must be {FORMAT!r}")
    if _get(doc, "version", int, file) != VERSION:
        raise BundleError(file, "version", f"this pagetrace reads version {VERSION}")
    model = _get(doc, "model", dict, file)
    kv = _get(doc, "kv_cache", dict, file)
    attn = _get(doc, "attention", dict, file)
    dims = {k: _get(model, k, int, file, "model.") for k in ("num_layers", "num_heads", "num_kv_heads", "head_dim")}
    for k, v in dims.items():
        if v < 1:
            raise BundleError(file, f"model.{k}", f"must be at least 1, got {v}")
    if dims["num_heads"] % dims["num_kv_heads"]:
        raise BundleError(file, "model.num_heads", f"{dims['num_heads']} is not a multiple of num_kv_heads {dims['num_kv_heads']}")
    dtype = _get(kv, "dtype", str, file, "kv_cache.")
    if dtype not in DTYPES:
        raise BundleError(file, "kv_cache.dtype", f"{dtype!r}: choose one of {', '.join(DTYPES)}")
    layout_name = _get(kv, "layout", str, file, "kv_cache.")
    layout_name = OLD_NAMES.get(layout_name, layout_name)  # bundles of earlier releases
    if layout_name not in LAYOUTS:
        raise BundleError(file, "kv_cache.layout", f"{layout_name!r}: choose one of {', '.join(LAYOUTS)}")
    sizes = {k: _get(kv, k, int, file, "kv_cache.") for k in ("block_size", "num_blocks")}
    for k, v in sizes.items():
        if v < 1:
            raise BundleError(file, f"kv_cache.{k}", f"must be at least 1, got {v}")
    sharing = _get(kv, "sharing", str, file, "kv_cache.")
    if sharing not in SHARING:
        raise BundleError(file, "kv_cache.sharing", f"{sharing!r}: choose one of {', '.join(SHARING)}")
    layers_doc = _get(doc, "layers", list, file)
    layers: dict[int, str] = {}
    for i, entry in enumerate(layers_doc):
        if not isinstance(entry, dict):
            raise BundleError(file, f"layers[{i}]", "must be an object with index and name")
        index = _get(entry, "index", int, file, f"layers[{i}].")
        if not 0 <= index < dims["num_layers"]:
            raise BundleError(file, f"layers[{i}].index", f"{index} is outside 0..{dims['num_layers'] - 1}")
        layers[index] = _get(entry, "name", str, file, f"layers[{i}].")
    steps = _get(doc, "steps", list, file)
    ring = _ring_entry(doc, file)
    if not steps and not (ring and ring["segments"]):
        raise BundleError(file, "steps", "is empty: the bundle holds no step")
    for i, entry in enumerate(steps):
        if not isinstance(entry, dict):
            raise BundleError(file, f"steps[{i}]", "must be an object")
        _get(entry, "step", int, file, f"steps[{i}].")
        name = _get(entry, "file", str, file, f"steps[{i}].")
        if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
            raise BundleError(file, f"steps[{i}].file", f"{name!r}: name a file inside the bundle folder")
        reqs = _get(entry, "requests", list, file, f"steps[{i}].")
        if not all(isinstance(r, str) for r in reqs):
            raise BundleError(file, f"steps[{i}].requests", "must be a list of strings")
        for j, layer in enumerate(_get(entry, "layers", list, file, f"steps[{i}].")):
            if isinstance(layer, bool) or not isinstance(layer, int) or layer not in layers:
                raise BundleError(file, f"steps[{i}].layers[{j}]", f"layer {layer!r} is not in the manifest's layers")
    window = _get(attn, "sliding_window", int, file, "attention.", optional=True)
    if window is not None and window < 1:
        raise BundleError(file, "attention.sliding_window", f"{window}: a window holds at least 1 token; write null for none")
    null_block = _get(kv, "null_block", int, file, "kv_cache.", optional=True)
    manifest = Manifest(
        engine=_get(doc, "engine", dict, file),
        **dims,
        dtype=dtype,
        layout=LAYOUTS[layout_name],
        block_size=sizes["block_size"],
        kernel_block_size=_get(kv, "kernel_block_size", int, file, "kv_cache.", optional=True) or sizes["block_size"],
        num_blocks=sizes["num_blocks"],
        null_block=null_block,
        table_padding=_get(kv, "table_padding", int, file, "kv_cache."),
        slot_padding=_get(kv, "slot_padding", int, file, "kv_cache."),
        sharing=sharing,
        scale=float(_get(attn, "scale", float, file, "attention.")),
        k_scale=float(_get(kv, "k_scale", float, file, "kv_cache.", optional=True) or 1.0),
        v_scale=float(_get(kv, "v_scale", float, file, "kv_cache.", optional=True) or 1.0),
        sliding_window=window,
        layers=layers,
        steps=steps,
        ring=ring,
        folder=folder,
    )
    try:  # the dims must fit the layout's splits (amx: block_size a multiple of 16)
        check_factors(manifest.geometry())
    except UsageError as exc:
        raise BundleError(file, "kv_cache.layout", f"{layout_name!r}: {exc.reason}") from None
    return manifest


def _step_entry(manifest: Manifest, step: int | None, option: str = "--step") -> dict:
    numbers = [s["step"] for s in manifest.steps]
    if step is None:
        return manifest.steps[0] if manifest.steps else step_entries(manifest)[0]
    for entry in manifest.steps:
        if entry["step"] == step:
            return entry
    if step in ring_requests(manifest):
        return {"step": step, "ring": True}
    held = f"steps {ranges_text(numbers)}" if numbers else "no step file"
    if manifest.ring and manifest.ring.get("steps"):
        held += f", and steps {ranges_text(sorted(ring_requests(manifest)))} in its metadata ring"
    raise UsageError(option, step, f"the bundle holds {held}")


def _ring_entry(doc: dict, file) -> dict | None:
    """The manifest's `ring` entry, checked: segment files inside the folder, step numbers."""
    ring = doc.get("ring")
    if ring is None:
        return None
    if not isinstance(ring, dict):
        raise BundleError(file, "ring", "must be an object")
    segments = _get(ring, "segments", list, file, "ring.")
    for i, seg in enumerate(segments):
        if not isinstance(seg, dict):
            raise BundleError(file, f"ring.segments[{i}]", "must be an object")
        name = _get(seg, "file", str, file, f"ring.segments[{i}].")
        if "/" in name or name in ("", ".", ".."):
            raise BundleError(file, f"ring.segments[{i}].file", f"{name!r}: name a file inside the bundle folder")
        for key in ("first", "last", "steps"):
            _get(seg, key, int, file, f"ring.segments[{i}].")
    return ring


_RING_CACHE: dict = {}  # (segment path, size, mtime) -> its decoded steps


def _ring_segment(manifest: Manifest, seg: dict) -> list[dict]:
    from . import meta_ring

    path = Path(manifest.folder) / seg["file"]
    try:
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns)
        if key not in _RING_CACHE:
            _RING_CACHE.clear()  # one segment at a time in memory
            steps = meta_ring.read_segment(path.read_bytes())
            numbers = [st["step"] for st in steps]
            if len(steps) != seg["steps"] or (steps and (numbers[0], numbers[-1]) != (seg["first"], seg["last"])):
                raise ValueError(f"it holds {len(steps)} steps{f' ({numbers[0]}..{numbers[-1]})' if steps else ''}; the manifest's ring says "
                                 f"{seg['steps']} ({seg['first']}..{seg['last']}): the file is cut short or not this bundle's")
            _RING_CACHE[key] = steps
    except FileNotFoundError:
        raise BundleError(path, "file", "is missing (the manifest's ring lists it)") from None
    except (OSError, ValueError, EOFError) as exc:
        raise BundleError(path, "file", f"is not a readable metadata ring segment ({exc})") from None
    return _RING_CACHE[key]


def ring_requests(manifest: Manifest) -> dict[int, list[str]]:
    """Step -> its request ids, for every step of the metadata ring (decodes the segments once each)."""
    if not manifest.ring or manifest.folder is None:
        return {}
    key = ("requests", str(manifest.folder), json.dumps(manifest.ring, sort_keys=True))
    cached = _RING_REQUESTS.get(key)
    if cached is None:
        cached = {}
        for seg in manifest.ring["segments"]:
            cached.update({s["step"]: s["requests"] for s in _ring_segment(manifest, seg)})
        _RING_REQUESTS.clear()
        _RING_REQUESTS[key] = cached
    return cached


_RING_REQUESTS: dict = {}


def _ring_step(manifest: Manifest, step: int) -> Step:
    """One step of the metadata ring as a `Step` (no layers, no pages: `ring` True)."""
    for seg in manifest.ring["segments"]:
        if seg["first"] <= step <= seg["last"]:
            for s in _ring_segment(manifest, seg):
                if s["step"] == step:
                    table, counts, slots = s["block_table"], s["block_counts"], s["slot_mapping"]
                    used = [table[r, : min(int(c), table.shape[1])] for r, c in enumerate(counts)]
                    written = [int(x) // s["block_size"] for x in slots.tolist() if x >= 0]
                    blocks = sorted({int(b) for row in used for b in row.tolist()} | set(written))
                    positions = s["positions"].tolist()
                    qsl, lens = s["query_start_loc"].tolist(), s["seq_lens"].tolist()
                    if len(positions) != qsl[-1]:  # the model's positions were not seen: derived, as capture does
                        positions = [p for r, n in enumerate(lens) for p in range(n - (qsl[r + 1] - qsl[r]), n)]
                    return Step(step=step, file=Path(manifest.folder) / seg["file"], requests=s["requests"], layers=[],
                                query_start_loc=qsl, seq_lens=lens, block_table=table.tolist(),
                                block_counts=counts.tolist(), slot_mapping=slots.tolist(), positions=positions, blocks=blocks,
                                dtypes=dict(manifest.ring.get("dtypes") or {}), ring=True)
    raise UsageError("--step", step, "is not in the bundle's metadata ring")


def read_step(folder: str | Path, manifest: Manifest, step: int | None = None) -> Step:
    """The index tensors of one step, checked for presence, rank and agreement of sizes (a step
    of the metadata ring: decoded from its segment)."""
    from safetensors import SafetensorError, safe_open

    entry = _step_entry(manifest, step)
    if entry.get("ring"):
        return _ring_step(manifest, entry["step"])
    file = Path(folder) / entry["file"]
    try:
        with safe_open(str(file), framework="numpy") as f:
            names = set(f.keys())
            arrays = {}
            for name in INDEX_TENSORS:
                if name not in names:
                    raise BundleError(file, name, "is missing")
                arrays[name] = f.get_tensor(name)
    except BundleError:  # a tensor missing: named as it is, not as an unreadable file (BundleError is a ValueError)
        raise
    except FileNotFoundError:
        raise BundleError(file, "file", "is missing") from None
    except (SafetensorError, OSError, ValueError, TypeError, AttributeError) as exc:
        # AttributeError: safetensors before 0.5 reads a bf16 tensor into NumPy as `np.bfloat16`,
        # which NumPy lacks (newer ones raise TypeError); an index tensor is never bf16
        raise BundleError(file, "file", f"is not a readable safetensors file ({exc})") from None
    ranks = {"block_table": 2}
    for name, array in arrays.items():
        if array.ndim != ranks.get(name, 1):
            raise BundleError(file, name, f"has {array.ndim} dims, needs {ranks.get(name, 1)}")
        if array.dtype.kind not in "iu":
            raise BundleError(file, name, f"must hold integers, got {array.dtype}")
    num_reqs = len(entry["requests"])
    for name, want in (("query_start_loc", num_reqs + 1), ("seq_lens", num_reqs), ("block_table", num_reqs), ("block_counts", num_reqs)):
        if arrays[name].shape[0] != want:
            raise BundleError(file, name, f"has {arrays[name].shape[0]} rows; the step's {num_reqs} requests need {want}")
    qsl = arrays["query_start_loc"].tolist()
    if len(arrays["positions"]) != qsl[-1] or len(arrays["slot_mapping"]) < qsl[-1]:
        raise BundleError(file, "positions", f"has {len(arrays['positions'])} entries and slot_mapping {len(arrays['slot_mapping'])}; query_start_loc ends at {qsl[-1]} tokens")
    return Step(
        step=entry["step"],
        file=file,
        requests=list(entry["requests"]),
        layers=list(entry["layers"]),
        query_start_loc=qsl,
        seq_lens=arrays["seq_lens"].tolist(),
        block_table=arrays["block_table"].tolist(),
        block_counts=arrays["block_counts"].tolist(),
        slot_mapping=arrays["slot_mapping"].tolist(),
        positions=arrays["positions"].tolist(),
        blocks=arrays["blocks"].tolist(),
        dtypes={name: str(arrays[name].dtype) for name in arrays},
        guard=entry.get("guard") if isinstance(entry.get("guard"), dict) else None,
    )


def stored_blocks(manifest: Manifest, step: Step) -> list[int]:
    """The step's blocks whose pages the bundle holds, in their stored order: `blocks` lists
    every block the step's tables and slots name, and one outside the pool (a bad entry the
    guard flagged) has no page to store."""
    return [b for b in step.blocks if 0 <= b < manifest.num_blocks]


def read_layer(manifest: Manifest, step: Step, layer: int) -> dict:
    """The float tensors of one layer in one step (torch): the stored cache pages
    (`kv`, or `key` and `value`), and when captured `query`, `output`, `new_key`, `new_value`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if layer not in step.layers:
        raise UsageError("--layer", layer, f"step {step.step} holds layers {', '.join(map(str, step.layers))}")
    try:
        tensors = load_file(str(step.file))
    except (SafetensorError, OSError) as exc:
        raise BundleError(step.file, "file", f"is not a readable safetensors file ({exc})") from None
    prefix = f"layer{layer}."
    out = {name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
    pages = ("kv",) if manifest.layout.combined else ("key", "value")
    count = len(stored_blocks(manifest, step))
    stored = manifest.geometry(count)
    for name in pages:
        want = stored.raw_shape("key" if name == "kv" else name)
        if name not in out:
            raise BundleError(step.file, prefix + name, "is missing")
        if tuple(out[name].shape) != want:
            raise BundleError(step.file, prefix + name, f"has shape {tuple(out[name].shape)}; '{manifest.layout.name}' with {count} stored blocks needs {want}")
        if str(out[name].dtype) != TORCH_DTYPES[manifest.dtype]:
            raise BundleError(step.file, prefix + name, f"is {out[name].dtype}; the manifest's kv_cache.dtype is {manifest.dtype}")
    if ("new_key" in out) != ("new_value" in out):  # the data check reads both
        missing = "new_value" if "new_key" in out else "new_key"
        raise BundleError(step.file, prefix + missing, "is missing; a step stores the new keys and values together")
    tokens = step.num_tokens
    for name, heads in (("query", manifest.num_heads), ("output", manifest.num_heads), ("new_key", manifest.num_kv_heads), ("new_value", manifest.num_kv_heads)):
        if name in out and tuple(out[name].shape) != (tokens, heads, manifest.head_dim):
            raise BundleError(step.file, prefix + name, f"has shape {tuple(out[name].shape)}, needs {(tokens, heads, manifest.head_dim)}")
        if name in out and not out[name].is_floating_point():
            raise BundleError(step.file, prefix + name, f"is {out[name].dtype}; it must hold floats")
    return out


class BundleWriter:
    """Write a bundle whole or not at all: steps go to a hidden folder beside `path`,
    which becomes `path` on `close()`. An existing `path` is never replaced."""

    def __init__(self, path: str | Path, manifest: dict) -> None:
        self.path = Path(path)
        if self.path.exists() or self.path.is_symlink():
            raise UsageError("bundle", str(path), "already exists; choose a new folder")
        self.manifest = dict(manifest, format=FORMAT, version=VERSION, steps=[])
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent or "."))

    def add_step(self, step: int, requests: list[str], layers: list[int], tensors: dict, **extra) -> None:
        from safetensors.torch import save_file

        name = f"step-{step:04d}.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(self.tmp / name))
        self.manifest["steps"].append({"step": step, "file": name, "requests": requests, "layers": layers, **extra})

    def close(self) -> Path:
        (self.tmp / "manifest.json").write_text(json.dumps(self.manifest, indent=2) + "\n")
        os.rename(self.tmp, self.path)
        return self.path

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class LiveBundle:
    """A bundle kept whole on disk while a server runs: steps come and go (a ring), and at
    every moment `path` is a bundle `check` reads. Each change writes the step's file
    (temporary name, then renamed), then the manifest (the same way), and only then deletes
    the files of steps that left; so a process killed at any point (vLLM's API server
    SIGKILLs its engine processes at stop) leaves a whole bundle. The folder is created
    at the first step, and never over an existing path."""

    def __init__(self, path: str | Path, manifest: dict) -> None:
        self.path = Path(path)
        self.manifest = dict(manifest, format=FORMAT, version=VERSION, steps=[])
        self.created = False

    def _atomic(self, name: str, write) -> None:
        tmp = self.path / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, self.path / name)

    def add(self, step: int, requests: list[str], layers: list[int], tensors: dict, drop: list[int] = (), **extra) -> None:
        from safetensors.torch import save_file

        if not self.created:
            os.mkdir(self.path)  # FileExistsError: someone made it since start; never written into
            self.created = True
        name = f"step-{step:04d}.safetensors"
        self._atomic(name, lambda tmp: save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp)))
        gone = {f"step-{s:04d}.safetensors" for s in drop}
        self.manifest["steps"] = [s for s in self.manifest["steps"] if s["file"] not in gone]
        self.manifest["steps"].append({"step": step, "file": name, "requests": requests, "layers": layers, **extra})
        self._atomic("manifest.json", lambda tmp: tmp.write_text(json.dumps(self.manifest, indent=2) + "\n"))
        for file in gone:
            with contextlib.suppress(FileNotFoundError):
                (self.path / file).unlink()

    def add_ring(self, name: str | None, data: bytes, index: dict, drop: list[str] = ()) -> None:
        """A segment of the metadata ring (meta_ring.py): its file (None: none, segments only
        leave), then the manifest's `ring` entry (what the ring holds), then the files of the
        segments that left."""
        if not self.created:
            os.mkdir(self.path)
            self.created = True

        def write(tmp):
            with open(tmp, "wb") as f:
                f.write(data)

        if name is not None:
            self._atomic(name, write)
        self.manifest["ring"] = index
        self._atomic("manifest.json", lambda tmp: tmp.write_text(json.dumps(self.manifest, indent=2) + "\n"))
        for file in drop:
            with contextlib.suppress(FileNotFoundError):
                (self.path / file).unlink()

    def set(self, key: str, value) -> None:
        """A top-level manifest field (e.g. why the bundle was closed), written at once."""
        self.manifest[key] = value
        if self.created:
            self._atomic("manifest.json", lambda tmp: tmp.write_text(json.dumps(self.manifest, indent=2) + "\n"))
