"""A traced, checked run of the paged-attention kernel: what `pagetrace run` does.

Two steps: `prepare` checks every option (nothing is allocated until it has passed), and
`execute` builds the cache, runs the kernel with its trace and checks it against
contiguous float64 attention. `pagetrace.commands.run` parses the options and renders.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..paging.blocks import MAX_HEADS, check_size, parse_int_list
from ..paging.plan import Plan

WORKED_EXAMPLE_TOKEN = 20
MAX_SCALE = 1e6  # larger scales overflow fp32 logits
KERNEL_MAX_HEAD_DIM = 512  # K and V tiles must fit a GPU's shared memory
BACKEND_NAMES = {"triton": "Triton kernel, compiled", "interpret": "Triton kernel, interpreter", "torch": "torch (gather + softmax)"}


def parse_rows(text: str) -> int | None:
    if text == "all":
        return None
    if re.fullmatch(r"[0-9]{1,9}", text) and int(text) >= 1:
        return int(text)
    raise UsageError("--rows", text, "give a number of rows >= 1, or 'all'")


def parse_heads(text: str, num_heads: int) -> list[int]:
    if text == "all":
        return list(range(num_heads))
    heads = parse_int_list(text, "--show-heads")
    for h in heads:
        if not 0 <= h < num_heads:
            raise UsageError("--show-heads", text, f"query heads are 0..{num_heads - 1}")
    return list(dict.fromkeys(heads))


def pick_device(text: str):
    import torch

    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::([0-9]+))?", text)
    if not match:
        raise UsageError("--device", text, "use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError("--device", text, "no CUDA device is available here; use --device cpu")
    index = int(match.group(1) or 0)
    if index >= torch.cuda.device_count():
        raise UsageError("--device", text, f"this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


@dataclass
class RunSetup:
    """Every option of a run, checked."""

    tokens_text: str
    plan: Plan
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    layout: str
    seed: int
    scale: float
    token: int | None
    seq: int
    limit: int | None
    shown_heads: list[int]
    device: Any  # torch.device
    backend: str
    memory_option: tuple[str, object]
    query_lens: list[int] | None = None  # new tokens per sequence; None: decode (one each)
    query: int | None = None  # which of --seq's new tokens the tables show (None: the last)
    sliding_window: int | None = None
    soft_cap: float | None = None
    alibi: bool = False
    k_scale: float = 1.0
    v_scale: float = 1.0
    partition_size: int | None = None

    @property
    def prefill(self) -> bool:
        return self.query_lens is not None and max(self.query_lens) > 1


def prepare(
    tokens: str, table: list[str] | None, block_size: int, head_dim: int, heads: int, kv_heads: int,
    num_blocks: int | None, dtype: str, layout: str | None, seed: int, scale: float | None, token: int | None,
    seq: int, rows: str, show_heads: str | None, backend: str, device: str, json_rows: bool = False,
    variant: "Variant | None" = None,
) -> RunSetup:
    from ..paging.layouts import make_geometry
    from ..paging.plan import plan_tables

    seq_lens = parse_int_list(tokens, "--tokens")
    tables = [parse_int_list(t, "--table") for t in table] if table else None
    limit = parse_rows(rows)
    if not 0 <= seed < 2**63:
        raise UsageError("--seed", seed, "must be in 0..2**63-1")
    if scale is not None and not (math.isfinite(scale) and abs(scale) <= MAX_SCALE):
        raise UsageError("--scale", scale, f"must be a finite number with |scale| <= {MAX_SCALE:g}")
    check_size("--heads", heads, MAX_HEADS)
    plan = plan_tables(seq_lens, tables, block_size, num_blocks, seed)
    if layout is None:
        layout = "blocks" if kv_heads == 1 else "nhd"
    geom = make_geometry(layout, plan.num_blocks, block_size, kv_heads, head_dim, dtype)
    if dtype == "fp8":
        raise UsageError("--dtype", dtype, "the kernel reads fp8_e4m3 or fp8_e5m2 caches; name one (plain fp8 is for lookup's addresses)")
    variant = variant or Variant()
    query_lens = variant.check(seq_lens, seq, dtype)
    if heads % kv_heads:
        raise UsageError("--heads", heads, f"must be a multiple of --kv-heads ({kv_heads})")
    if not 0 <= seq < len(seq_lens):
        raise UsageError("--seq", seq, f"sequences are 0..{len(seq_lens) - 1}")
    if token is None:
        token = WORKED_EXAMPLE_TOKEN if seq_lens[seq] > WORKED_EXAMPLE_TOKEN else None
    elif not 0 <= token < seq_lens[seq]:
        raise UsageError("--token", token, f"sequence {seq} has tokens 0..{seq_lens[seq] - 1}")
    shown_heads = parse_heads(show_heads if show_heads is not None else ("all" if heads <= 4 else "0"), heads)

    from .api import resolve_backend

    dev = pick_device(device)
    chosen = resolve_backend(backend, dev, seq_lens, heads, kv_heads, query_lens)
    if chosen != "torch" and head_dim > KERNEL_MAX_HEAD_DIM:
        raise UsageError("--head-dim", head_dim, f"the kernel takes head_dim up to {KERNEL_MAX_HEAD_DIM}; use --backend torch")
    from .workload import check_memory, run_extra_bytes

    memory_option = ("--num-blocks", num_blocks) if num_blocks is not None else ("--tokens", tokens)
    num_query_tokens = sum(query_lens) if query_lens else None
    check_memory(geom, dev, *memory_option, extra=run_extra_bytes(seq_lens, heads, kv_heads, head_dim, json_rows, num_query_tokens))
    return RunSetup(
        tokens_text=tokens, plan=plan, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, layout=layout,
        seed=seed, scale=head_dim**-0.5 if scale is None else scale, token=token, seq=seq, limit=limit,
        shown_heads=shown_heads, device=dev, backend=chosen, memory_option=memory_option,
        query_lens=query_lens, query=variant.query, sliding_window=variant.sliding_window, soft_cap=variant.soft_cap,
        alibi=variant.alibi, k_scale=variant.k_scale or 1.0, v_scale=variant.v_scale or 1.0, partition_size=variant.partition_size,
    )


BIG_CACHE_BYTES = 256 << 20  # from here on, `run` says what it is about to allocate before it does


def cache_size(setup: RunSetup) -> str:
    from ..paging.dtypes import ELEMENT_SIZES
    from ..paging.plan import cache_bytes, human_bytes

    p = setup.plan
    need = cache_bytes(p.num_blocks, p.block_size, setup.kv_heads, setup.head_dim, ELEMENT_SIZES[setup.dtype])
    return f"{human_bytes(need)} ({p.num_blocks:,} blocks x {p.block_size} tokens x {setup.kv_heads} KV head(s) x {setup.head_dim} x {ELEMENT_SIZES[setup.dtype]} bytes, keys and values)"


def memory_note(setup: RunSetup) -> str | None:
    """For a large cache, a line saying what it takes and what is available (the refusal
    in `workload.check_memory` already follows the machine's available memory)."""
    from ..paging.dtypes import ELEMENT_SIZES
    from ..paging.plan import available_memory_bytes, cache_bytes, human_bytes

    p = setup.plan
    if cache_bytes(p.num_blocks, p.block_size, setup.kv_heads, setup.head_dim, ELEMENT_SIZES[setup.dtype]) < BIG_CACHE_BYTES:
        return None
    free = available_memory_bytes()
    where = f"; {human_bytes(free)} of memory available" if free is not None else ""
    return f"note: the KV cache takes {cache_size(setup)}{where}"


@dataclass
class Variant:
    """The prefill and attention-variant options of a run, as given."""

    query_len: str | None = None
    query: int | None = None
    sliding_window: int | None = None
    soft_cap: float | None = None
    alibi: bool = False
    k_scale: float | None = None
    v_scale: float | None = None
    partition_size: int | None = None

    def check(self, seq_lens: list[int], seq: int, dtype: str) -> list[int] | None:
        """Refuse what cannot run; returns new tokens per sequence (None: decode)."""
        query_lens = None
        if self.query_len is not None:
            query_lens = parse_int_list(self.query_len, "--query-len")
            if len(query_lens) == 1:
                query_lens = query_lens * len(seq_lens)
            if len(query_lens) != len(seq_lens):
                raise UsageError("--query-len", self.query_len, f"give one count, or one per sequence ({len(seq_lens)})")
            for q, n in zip(query_lens, seq_lens):
                if not 1 <= q <= n:
                    raise UsageError("--query-len", self.query_len, f"each sequence's new tokens must be 1..its length (--tokens counts them too), got {q} for {n}")
        if self.query is not None and not 0 <= self.query < (query_lens[seq] if query_lens else 1):
            raise UsageError("--query", self.query, f"sequence {seq} has new (query) tokens 0..{(query_lens[seq] if query_lens else 1) - 1}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise UsageError("--sliding-window", self.sliding_window, "must be at least 1 token")
        if self.soft_cap is not None and not (math.isfinite(self.soft_cap) and 0 < self.soft_cap <= MAX_SCALE):
            raise UsageError("--soft-cap", self.soft_cap, f"must be a finite number in (0, {MAX_SCALE:g}]")
        for option, value in (("--k-scale", self.k_scale), ("--v-scale", self.v_scale)):
            if value is None:
                continue
            if not dtype.startswith("fp8"):
                raise UsageError(option, value, "scales apply to fp8 caches: use --dtype fp8_e4m3 or fp8_e5m2")
            if not (math.isfinite(value) and 1e-6 <= value <= MAX_SCALE):
                raise UsageError(option, value, f"must be a finite number in [1e-6, {MAX_SCALE:g}]")
        if self.partition_size is not None and (self.partition_size < 16 or self.partition_size % 16 or self.partition_size > 2**20):
            raise UsageError("--partition-size", self.partition_size, "must be a multiple of 16 tokens, 16..1048576")
        return query_lens

    @property
    def block_n(self) -> int | None:
        """Key tile for --partition-size: the largest power of two up to 128 dividing it."""
        if self.partition_size is None:
            return None
        return min(128, self.partition_size & -self.partition_size)


@dataclass
class RunResult:
    setup: RunSetup
    elapsed: float
    partition_size: int
    reports: list  # [SequenceReport]
    checks: Any  # Checks
    key_norm: float | None
    mask_rows: list = None  # [(query position, one character per key block)] for --seq, prefill or a window only


def execute(setup: RunSetup, all_rows: bool, status) -> RunResult:
    import torch

    from .api import paged_attention
    from .reference import gather, reference_attention
    from .report import Checks, build_report, check_slots, compare, mask_map
    from .workload import make_workload

    plan = setup.plan
    from .workload import alibi_slopes

    with status(f"building the KV cache: {cache_size(setup)} ..."):
        work = make_workload(
            plan, num_heads=setup.heads, num_kv_heads=setup.kv_heads, head_dim=setup.head_dim, dtype=setup.dtype,
            layout=setup.layout, seed=setup.seed, device=setup.device, memory_option=setup.memory_option,
            query_lens=setup.query_lens, k_scale=setup.k_scale, v_scale=setup.v_scale,
        )
    fp8 = setup.dtype.startswith("fp8")
    variants = dict(
        sliding_window=setup.sliding_window, soft_cap=setup.soft_cap,
        alibi_slopes=alibi_slopes(setup.heads).to(setup.device) if setup.alibi else None,
    )
    with status(f"running the {BACKEND_NAMES[setup.backend]} on {setup.device} ..."):
        start = time.perf_counter()
        output, trace = paged_attention(
            work.query, work.key_cache, work.value_cache, work.block_tables, work.seq_lens,
            query_start_loc=work.query_start_loc if setup.query_lens else None,
            layout=setup.layout, scale=setup.scale, trace=True, backend=setup.backend,
            k_scale=setup.k_scale if fp8 else None, v_scale=setup.v_scale if fp8 else None,
            partition_size=setup.partition_size, block_n=Variant(partition_size=setup.partition_size).block_n, **variants,
        )
        if setup.device.type == "cuda":
            torch.cuda.synchronize(setup.device)
        elapsed = time.perf_counter() - start
    with status("checking against contiguous attention ..."):
        ref = reference_attention(
            work.query, work.key_cache, work.value_cache, plan.tables, plan.seq_lens,
            layout=setup.layout, block_size=plan.block_size, scale=setup.scale, compute_dtype=torch.float64,
            query_lens=setup.query_lens, k_scale=setup.k_scale if fp8 else 1.0, v_scale=setup.v_scale if fp8 else 1.0, **variants,
        )
        max_diff, tol, passed = compare(output, ref.output, setup.dtype)
        got, want = trace.logits.double().cpu(), ref.logits.cpu()
        both = ~torch.isnan(want)
        passed = passed and bool(torch.equal(trace.mask.cpu(), ref.mask.cpu())) and bool(torch.equal(both, ~torch.isnan(got)))
        logit_diff = float((got[both] - want[both]).abs().nan_to_num(nan=math.inf).max()) if bool(both.any()) else 0.0
        checks = Checks(max_diff, tol, passed, check_slots(plan, trace.slots), logit_diff)
        traced = (setup.seq, setup.token) if setup.token is not None else None
        queries = [setup.query if s == setup.seq else None for s in range(len(plan.seq_lens))]
        reports = build_report(plan, trace, output, setup.shown_heads, setup.limit, all_rows=all_rows, traced=traced, queries=queries)
        mask_rows = mask_map(trace, setup.seq, plan.seq_lens[setup.seq], plan.block_size) if setup.prefill or setup.sliding_window else []
    key_norm = None
    if setup.token is not None:
        keys = gather(work.key_cache, setup.layout, "key", plan.tables[setup.seq], plan.seq_lens[setup.seq], plan.block_size)
        key_norm = float(keys[setup.token, 0].float().norm())
    return RunResult(setup, elapsed, trace.partition_size, reports, checks, key_norm, mask_rows)
