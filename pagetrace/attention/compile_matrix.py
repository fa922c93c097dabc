"""Which calls to compile for a GPU, and compiling them in worker processes.

The matrix covers every distinct tile shape the launcher produces: each layout, dtype,
head_dim, GQA group and trace setting (they fix GROUP_P, HEAD_DIM_P, BLOCK_N, X and the
dot's precision), with block sizes 1/3/16/24/32 (1 and multiples of 16 change Triton's
specialisation) and short, long and batched contexts (they change the grid and the
partition length) cycled through it; then fp8 caches, and prefill (BLOCK_Q > 1) with each
masking feature, over every layout, head_dim, group and trace setting. `representative`
is the part CI compiles.

The workers run `python -m pagetrace.attention.gpu_compile` without TRITON_INTERPRET, so this module
works from a process that runs the interpreter (the test suite). No torch or triton here.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from .gpu_compile import Compiled, Config, from_json

LAYOUTS = ("blocks", "nhd", "hnd", "vllm")
DTYPES = ("fp32", "fp16", "bf16")
HEAD_DIMS = (8, 64, 80, 128, 256, 512)
BLOCK_SIZES = (1, 3, 16, 24, 32)
GROUPS = (1, 4, 8)
CONTEXTS = ((38,), (1024,), (131072, 7), (4096,) * 16)
ARCH_NAMES = ("sm_90", "sm_80")
PREFILLS = (((512,), (512,)), ((4096, 1000), (256, 1)))  # (seq_lens, query_lens): a prefill; a chunk beside a decode
FEATURES = ({}, {"sliding_window": 1024}, {"soft_cap": 30.0}, {"alibi": True})
# (arch, cache dtype) that Triton cannot compile, and that `paged_attention` refuses on such a GPU
UNSUPPORTED = {("sm_80", "fp8"): "not supported in this architecture"}  # Triton has fp8e4nv (e4m3) from sm_89 only


def heads_for(layout: str, group: int) -> tuple[int, int]:
    """(query heads, KV heads): 8 KV heads, or the one KV head of the "blocks" layout."""
    kv = 1 if layout == "blocks" else 8
    return kv * group, kv


def production(config: Config) -> bool:
    """A decode config serving would run: it must compile without spilling a register."""
    return (config.head_dim in (64, 128) and config.dtype in ("fp16", "bf16") and not config.cache_dtype
            and config.layout in ("nhd", "hnd", "vllm") and not config.trace and config.decode
            and not (config.sliding_window or config.soft_cap or config.alibi))


def full_matrix() -> list[Config]:
    out = []
    axes = itertools.product(LAYOUTS, DTYPES, HEAD_DIMS, GROUPS, (False, True))
    for i, (layout, dtype, head_dim, group, trace) in enumerate(axes):
        heads, kv = heads_for(layout, group)
        out.append(Config(layout, dtype, BLOCK_SIZES[i % len(BLOCK_SIZES)], head_dim, heads, kv, CONTEXTS[(i // 5) % len(CONTEXTS)], trace))
    for i, (layout, dtype, head_dim, block_size, group) in enumerate(
        itertools.product(("nhd", "hnd", "vllm"), ("fp16", "bf16"), (64, 128), (16, 32), GROUPS)
    ):
        heads, kv = heads_for(layout, group)
        out.append(Config(layout, dtype, block_size, head_dim, heads, kv, CONTEXTS[i % len(CONTEXTS)]))
    # fp8 caches, and prefill / chunked prefill / mixed batches with each masking feature
    for i, (layout, head_dim, group, trace) in enumerate(itertools.product(LAYOUTS, HEAD_DIMS, GROUPS, (False, True))):
        heads, kv = heads_for(layout, group)
        block_size = BLOCK_SIZES[i % len(BLOCK_SIZES)]
        fp8 = ("fp8", "fp8_e5m2")[i % 2]
        out.append(Config(layout, "bf16", block_size, head_dim, heads, kv, CONTEXTS[i % len(CONTEXTS)], trace, cache_dtype=fp8))
        dtype = DTYPES[i % len(DTYPES)]
        for lens, q_lens in PREFILLS:
            out.append(Config(layout, dtype, block_size, head_dim, heads, kv, lens, trace, q_lens, **FEATURES[i % len(FEATURES)]))
    return list(dict.fromkeys(out))


def representative() -> list[Config]:
    """The production decode configs at block size 16, 32/8 heads, the extremes, an fp8
    cache, and prefill: a whole prompt, a chunk beside a decode, every masking feature,
    fp32/fp16/bf16 at head_dim 64 and 128, and fp8 caches."""
    out = [
        Config(layout, dtype, 16, head_dim, 32, 8, (4096,) * 16)
        for layout, dtype, head_dim in itertools.product(("nhd", "hnd", "vllm"), ("fp16", "bf16"), (64, 128))
    ]
    out += [
        Config("blocks", "fp32", 16, 8, 1, 1, (38,), True),  # the worked example, traced
        Config("nhd", "fp32", 16, 512, 32, 8, (1024,), True),  # the most shared memory
        Config("vllm", "bf16", 16, 512, 64, 8, (1024,)),
        Config("hnd", "fp16", 3, 80, 8, 8, (1024,)),
        Config("nhd", "bf16", 1, 256, 64, 8, (131072, 7), True),
        Config("vllm", "fp32", 24, 64, 32, 8, (38,)),
        Config("blocks", "fp16", 32, 128, 8, 1, (131072,)),
        Config("vllm", "fp16", 16, 128, 8, 8, (1024,), True),
        Config("vllm", "bf16", 16, 128, 32, 8, (4096,) * 16, cache_dtype="fp8"),
        Config("nhd", "fp16", 16, 128, 32, 8, (4096,) * 16, cache_dtype="fp8_e5m2"),
        Config("nhd", "fp16", 16, 128, 32, 8, (512,), query_lens=(512,)),
        Config("vllm", "bf16", 16, 128, 32, 8, (4096, 1000), query_lens=(256, 1), sliding_window=1024),
        Config("hnd", "fp32", 3, 64, 8, 1, (600,), True, (77,), soft_cap=30.0, alibi=True),
        # prefill tiles by dtype and head_dim (attention.gpu_prefill_tiles): fp32 with GQA, a
        # 16-bit head_dim 64 without it, and fp8 caches (e4m3 is refused on sm_80)
        Config("nhd", "fp32", 16, 128, 32, 8, (512,), query_lens=(512,)),
        Config("vllm", "bf16", 16, 64, 8, 8, (1024,), query_lens=(300,)),
        Config("nhd", "fp16", 16, 128, 32, 8, (512,), query_lens=(512,), cache_dtype="fp8_e5m2"),
        Config("vllm", "bf16", 16, 128, 64, 8, (512,), query_lens=(512,), cache_dtype="fp8"),
    ]
    return out


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pagetrace" / "compile"


def compile_configs(
    configs: list[Config], archs: tuple[str, ...] = ARCH_NAMES, jobs: int | None = None, cache: Path | None = None,
    timeout_s: float = 3600,
) -> tuple[list[Compiled], str]:
    """Compile every launch of every config for every arch in `jobs` worker processes
    (default: one per core, at most 8).

    Returns (records, missing): `missing` says why nothing compiled (no ptxas), else "".
    Configs that differ only in context sit side by side, so one worker compiles their
    shared variant once."""
    work = sorted(
        ({"config": {f.name: getattr(c, f.name) for f in fields(Config)}, "arch": a} for c in configs for a in archs),
        key=lambda j: (j["arch"], json.dumps({k: v for k, v in j["config"].items() if k != "seq_lens"})),
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    jobs = jobs or max(1, min(8, os.cpu_count() or 1))
    size = -(-len(work) // jobs)
    cache = default_cache() if cache is None else cache
    procs = []
    for start in range(0, len(work), size):
        proc = subprocess.Popen(
            [sys.executable, "-m", "pagetrace.attention.gpu_compile"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=env, cwd=root,
        )
        procs.append((proc, json.dumps({"jobs": work[start : start + size], "cache": str(cache)})))
    records: list[Compiled] = []
    missing = ""
    for proc, request in procs:
        out, err = proc.communicate(request, timeout=timeout_s)
        if proc.returncode:
            raise RuntimeError(f"compile worker failed ({proc.returncode}): {err.strip()[-2000:]}")
        answer = json.loads(out)
        missing = missing or answer["missing"]
        records += [from_record(r) for r in answer["records"]]
    return records, missing


def from_record(record: dict) -> Compiled:
    return Compiled(**{**record, "config": from_json(record["config"]), "grid": tuple(record["grid"])})
