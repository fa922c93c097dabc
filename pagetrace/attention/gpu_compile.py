"""Compile the kernel's launches for a GPU architecture on a machine without a GPU,
and read what the compiled code shows (registers, spills, shared memory, load widths,
dot instructions, occupancy).

Triton's wheel ships `ptxas`, and `triton.compile(ASTSource(...), target=GPUTarget(...))`
needs no CUDA driver. Each `Launch` that the launcher plans (`attention.plan_kernel`,
the path `paged_attention` runs) goes through Triton's own argument binder, the code
`JITFunction.run` uses to choose the signature, the constexprs and the alignment
attributes, so what is compiled here is what a GPU would launch, tile choices included.

Inputs are "meta" tensors: shapes and strides without memory, so a 128k-token batch
costs nothing. This module must run where TRITON_INTERPRET is unset (the interpreter
replaces the kernels); `compile_configs` starts such a process.
    python -m pagetrace.attention.gpu_compile < configs.json > results.json
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Arch:
    """What limits a program on one GPU (CUDA C Programming Guide, compute capability table)."""

    name: str
    capability: int
    gpu: str
    num_sms: int
    shared_bytes: int  # the most dynamic shared memory one block may opt in to
    registers_per_sm: int = 65536
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32


ARCHS: dict[str, Arch] = {
    "sm_90": Arch("sm_90", 90, "H100/H200 SXM", 132, 227 * 1024),
    "sm_80": Arch("sm_80", 80, "A100", 108, 163 * 1024),
}


@dataclass(frozen=True, slots=True)
class Config:
    """One call of `paged_attention` on a GPU, by its shapes."""

    layout: str = "nhd"
    dtype: str = "fp16"  # the query's; the caches' too unless cache_dtype says "fp8"
    block_size: int = 16
    head_dim: int = 128
    num_heads: int = 32
    num_kv_heads: int = 8
    seq_lens: tuple[int, ...] = (1024,)
    trace: bool = False
    query_lens: tuple[int, ...] | None = None  # new tokens per sequence; None: decode (one each)
    cache_dtype: str = ""  # "fp8" (float8_e4m3fn) or "fp8_e5m2" caches, with k/v scales
    sliding_window: int | None = None
    soft_cap: float | None = None
    alibi: bool = False

    @property
    def decode(self) -> bool:
        return self.query_lens is None or max(self.query_lens) <= 1

    @property
    def label(self) -> str:
        def short(lens):
            return ",".join(map(str, lens)) if len(lens) <= 2 else f"{len(lens)}x{lens[0]}"

        extras = [f"q {short(self.query_lens)}"] if self.query_lens else []
        extras += [f"window {self.sliding_window}"] if self.sliding_window else []
        extras += [f"cap {self.soft_cap:g}"] if self.soft_cap else []
        extras += ["alibi"] * self.alibi + ["trace"] * self.trace
        dtype = f"{self.dtype}/{self.cache_dtype}" if self.cache_dtype else self.dtype
        return " ".join([f"{self.layout} {dtype} d{self.head_dim} bs{self.block_size} h{self.num_heads}/{self.num_kv_heads} "
                         f"ctx {short(self.seq_lens)}", *extras])


@dataclass(slots=True)
class Compiled:
    """One launch compiled for one architecture, and what its code shows."""

    config: Config
    arch: str
    kernel: str
    grid: tuple[int, int, int]
    constexprs: dict[str, object]
    num_warps: int = 0
    registers: int = 0
    spill_bytes: int = 0  # spill stores + spill loads, bytes per thread (ptxas -v)
    shared_bytes: int = 0
    loads: dict[str, str] = field(default_factory=dict)  # tensor loaded -> its global load widths, e.g. "16B cp.async"
    dot: str = "none"  # wgmma, mma or fma
    instructions: int = 0  # PTX instructions
    fmas: int = 0  # fp32 fma instructions in the PTX
    key: str = ""  # the hash Triton gives this compiled variant: equal keys, one compile
    programs_per_sm: int = 0  # resident at once, limited by registers, shared memory and threads
    waves: float = 0.0  # grid programs / (SMs x programs_per_sm)
    error: str = ""


def ptxas_path(capability: int = 90) -> str | None:
    """The ptxas Triton uses for a compute capability, or None when this Triton has none."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        return None
    try:
        path = get_ptxas(capability).path
    except Exception:  # noqa: BLE001 - any failure to find it means "no ptxas"
        return None
    return path if path and os.access(path, os.X_OK) else None


def meta_inputs(config: Config):
    """Query, caches, block tables and lengths of `config` as meta tensors: shapes and
    strides, no memory, so a 128k-token batch costs nothing."""
    import torch

    from ..paging.layouts import LAYOUTS, CacheGeometry

    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
    meta = dict(device="meta")
    query_tokens = sum(config.query_lens) if config.query_lens else len(config.seq_lens)
    widest = max(-(-n // config.block_size) for n in config.seq_lens)
    cache = config.cache_dtype or config.dtype
    geom = CacheGeometry(LAYOUTS[config.layout], widest * len(config.seq_lens), config.block_size, config.num_kv_heads, config.head_dim,
                         "fp8" if cache.startswith("fp8") else cache)
    return (
        torch.empty(query_tokens, config.num_heads, config.head_dim, dtype=dtypes[config.dtype], **meta),
        torch.empty(geom.shape("key"), dtype=dtypes[cache], **meta),
        torch.empty(geom.shape("value"), dtype=dtypes[cache], **meta),
        torch.empty(len(config.seq_lens), widest, dtype=torch.int32, **meta),
        torch.empty(len(config.seq_lens), dtype=torch.int32, **meta),
    )


def plan_config(config: Config, arch: Arch):
    """The launches `paged_attention` makes for `config` on a GPU of `arch`: the launcher
    planning from lengths alone (`attention.plan_kernel` without a checked batch)."""
    import torch

    from .api import load_kernel, plan_kernel

    kernel = load_kernel(interpret=False)
    scale = torch.empty(1, dtype=torch.float32, device="meta") if config.cache_dtype else None
    return plan_kernel(
        kernel, *meta_inputs(config), layout=config.layout, scale=config.head_dim**-0.5, trace=config.trace, on_gpu=True,
        max_seq_len=max(config.seq_lens), num_kv_heads=config.num_kv_heads,
        query_lens=list(config.query_lens) if config.query_lens else None,
        sliding_window=config.sliding_window, soft_cap=config.soft_cap,
        alibi_slopes=torch.empty(config.num_heads, dtype=torch.float32, device="meta") if config.alibi else None,
        k_scale=scale, v_scale=scale, num_sms=arch.num_sms,
    )


def prepare(launch, arch: Arch):
    """What `JITFunction.run` would hand to `triton.compile` for this launch on `arch`:
    (source, target, options, hash): the hash Triton's compile gives the kernel (its
    CompiledKernel.hash), from Triton's own cache key, which names the arch."""
    from triton import knobs
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.cache import get_cache_key
    from triton.runtime.jit import create_function_from_signature

    fn = launch.kernel
    target = GPUTarget("cuda", arch.capability, 32)
    backend = make_backend(target)
    kwargs = dict(launch.constexprs)  # plus the options JITFunction.run adds (Triton 3.9, runtime/jit.py)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    src = ASTSource(fn, signature, constexprs, attrs)
    key = get_cache_key(src, backend, options, get_cache_invalidating_env_vars())
    return src, target, options, hashlib.sha256(key.encode("utf-8")).hexdigest()


def compile_launch(launch, arch: Arch):
    """Compile one `Launch` for `arch`; returns Triton's CompiledKernel."""
    import triton

    src, target, options, _ = prepare(launch, arch)
    return triton.compile(src, target=target, options=options.__dict__)


def ptxas_usage(ptx: str, arch: Arch) -> tuple[int, int]:
    """(registers, spill bytes) from `ptxas -v`, run with the flags Triton's make_cubin uses."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        suffix = "a" if arch.capability >= 90 else ""
        cmd = [ptxas_path(arch.capability), "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name=sm_{arch.capability}{suffix}", str(src), "-o", str(src.with_suffix(".o"))]
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return regs, spills


_INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*[\s;]", re.M)
_LOAD = re.compile(r"^\s*(?:@!?%p\d+\s+)?(ld\.global\S*|cp\.async\.c[ag]\.shared\.global\S*)\s+(.*)")


def load_lines(fn) -> dict[int, str]:
    """Source line -> the name the value of a `tl.load` there is assigned to, in the kernel's file."""
    source, first = inspect.getsourcelines(fn)
    tree = ast.parse(textwrap.dedent("".join(source)))
    names: dict[int, str] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        target = node.targets[0]
        name = target.id if isinstance(target, ast.Name) else ast.unparse(target)
        for call in ast.walk(node.value):
            if isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "load":
                for line in range(call.lineno, call.end_lineno + 1):
                    names[first - 1 + line] = name
    return names


def load_widths(ptx: str, fn) -> dict[str, str]:
    """Each loaded tensor's global-load widths in bytes, from the PTX's line info.

    "16B cp.async" is a 16-byte asynchronous copy to shared memory (pipelined); "2B" a
    scalar 2-byte load. Only loads attributed to the kernel's own file count."""
    names = load_lines(fn)
    kernel_file = inspect.getsourcefile(fn)
    files = {m.group(1): m.group(2) for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', ptx, re.M)}
    widths: dict[str, set[str]] = {}
    current = None
    for line in ptx.splitlines():
        loc = re.match(r"^\s*\.loc\s+(\d+)\s+(\d+)", line)
        if loc:
            same = os.path.basename(files.get(loc.group(1), "")) == os.path.basename(kernel_file)
            current = names.get(int(loc.group(2))) if same else None
            continue
        m = _LOAD.match(line)
        if not m or current is None:
            continue
        op, operands = m.groups()
        if op.startswith("cp.async"):
            width = f"{int(operands.rstrip(';').split(',')[2].strip(), 0)}B cp.async"
        else:
            vec = re.search(r"\.v(\d)", op)
            bits = re.search(r"\.[bufs](\d+)\b", op)
            width = f"{(int(vec.group(1)) if vec else 1) * int(bits.group(1)) // 8}B" if bits else op
        widths.setdefault(current, set()).add(width)
    return {name: " ".join(sorted(w, key=lambda s: (-int(s.split("B")[0]), s))) for name, w in sorted(widths.items())}


def dot_kind(ptx: str) -> str:
    if "wgmma.mma_async" in ptx:
        return "wgmma"
    if re.search(r"\bmma\.sync", ptx):
        return "mma"
    return "fma"


def occupancy(registers: int, shared: int, num_warps: int, arch: Arch) -> int:
    """Programs resident on one SM at once (register allocation in warps of 256-register units)."""
    regs_per_warp = -(-max(registers, 1) * 32 // 256) * 256
    by_regs = arch.registers_per_sm // (regs_per_warp * num_warps)
    by_threads = arch.threads_per_sm // (32 * num_warps)
    by_shared = arch.shared_bytes // shared if shared else arch.blocks_per_sm
    return max(0, min(by_regs, by_threads, by_shared, arch.blocks_per_sm))


STATS_VERSION = 1  # of the figures kept in the cache folder
STATS = ("num_warps", "registers", "spill_bytes", "shared_bytes", "loads", "dot", "instructions", "fmas")


def code_stats(launch, arch: Arch) -> dict[str, object]:
    """Compile one launch and read its code: the STATS fields of `Compiled`."""
    kernel = compile_launch(launch, arch)
    ptx = kernel.asm["ptx"]
    registers, spills = ptxas_usage(ptx, arch)
    return dict(
        num_warps=kernel.metadata.num_warps, registers=registers, spill_bytes=spills, shared_bytes=kernel.metadata.shared,
        loads=load_widths(ptx, launch.kernel.fn), dot=dot_kind(ptx),
        instructions=len(_INSTRUCTION.findall(ptx)), fmas=len(re.findall(r"^\s*(?:@!?%p\d+\s+)?fma\.rn\.f32", ptx, re.M)),
    )


def compile_config(config: Config, arch: Arch, cache: Path | None = None, seen: dict | None = None) -> list[Compiled]:
    """Every launch of `config` compiled for `arch`, with what its code shows.

    A launch's figures are kept under its Triton cache key, in `seen` (this process) and
    in `cache` (a folder, across runs), so a variant already compiled is not compiled again."""
    seen = {} if seen is None else seen
    results = []
    for launch in plan_config(config, arch).launches:
        one = Compiled(config, arch.name, launch.name, tuple(launch.grid), dict(launch.constexprs))
        try:
            key = one.key = prepare(launch, arch)[3]
            stored = cache / f"{key}.{STATS_VERSION}.json" if cache else None
            if key not in seen and stored and stored.exists():
                seen[key] = json.loads(stored.read_text())
            if key not in seen:
                seen[key] = code_stats(launch, arch)
                if stored:
                    stored.parent.mkdir(parents=True, exist_ok=True)
                    tmp = stored.with_suffix(f".{os.getpid()}.tmp")
                    tmp.write_text(json.dumps(seen[key]))
                    tmp.replace(stored)
        except Exception as exc:  # noqa: BLE001 - reported per launch; the compile test fails on it
            lines = str(exc).strip().splitlines()  # a CompilationError's cause is its last line
            one.error = f"{type(exc).__name__}: {lines[-1] if lines else ''}"
            results.append(one)
            continue
        for name in STATS:
            setattr(one, name, seen[key][name])
        one.programs_per_sm = occupancy(one.registers, one.shared_bytes, one.num_warps, arch)
        programs = launch.grid[0] * launch.grid[1] * launch.grid[2]
        one.waves = round(programs / (arch.num_sms * max(one.programs_per_sm, 1)), 3)
        results.append(one)
    return results


def from_json(fields: dict) -> Config:
    """A Config from its JSON form (lists back to tuples)."""
    return Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def main() -> None:
    """Worker: read {"jobs": [{"config": {...}, "arch": "sm_90"}, ...], "cache": folder or null}
    on stdin; print {"missing": why nothing could compile, or "", "records": [`Compiled`, ...]}."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("pagetrace.attention.gpu_compile: unset TRITON_INTERPRET (the interpreter replaces the kernels)")
    request = json.load(sys.stdin)
    missing = [arch for arch in {job["arch"] for job in request["jobs"]} if ptxas_path(ARCHS[arch].capability) is None]
    if missing:
        json.dump({"missing": f"this Triton has no ptxas for {', '.join(sorted(missing))}", "records": []}, sys.stdout)
        return
    cache = Path(request["cache"]) if request.get("cache") else None
    seen: dict = {}
    out = []
    for job in request["jobs"]:
        config = from_json(job["config"])
        out.extend(asdict(r) for r in compile_config(config, ARCHS[job["arch"]], cache, seen))
    json.dump({"missing": "", "records": out}, sys.stdout)


if __name__ == "__main__":
    main()
