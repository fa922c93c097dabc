"""A captured step through pagetrace's kernel, against contiguous attention and the engine.

The stored cache pages become a compact pool (stored block i is pool block i) read
through the bundle's layout (`views.as_tensors`: strided views, or one gathered copy for a
tiled layout, which the report names), and each block table is
renumbered into it. The step then runs as the engine ran it: one varlen `paged_attention`
call with its query_start_loc and seq_lens (bottom-right causal: the k-th of q new tokens
in an n-token sequence sees n - q + k + 1 tokens). With a `paged_attention` that takes no
query_start_loc (decode only), each new token is its own decode query over its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import RuntimeFailure
from ..paging.layouts import start_addresses
from .bundle import Manifest, Step
from .views import pool_views


def cache_read(manifest: Manifest) -> str:
    """How the replay reads the stored pages, in words for the report."""
    if manifest.layout.tiled:
        return f"one copy into [block, slot, head, dim] order: the '{manifest.layout.name}' layout is tiled, no strides read it"
    return f"strided views of the stored pages, no copy ('{manifest.layout.name}' layout)"


@dataclass(slots=True)
class TokenQuery:
    """One new token replayed: which request, where, and what it attended to."""

    request: int
    index: int  # row in the step's token axis (query_start_loc numbering)
    position: int  # its position in the sequence; it sees tokens 0..position


@dataclass(slots=True)
class Replay:
    queries: list[TokenQuery]
    output: torch.Tensor  # kernel: [tokens, H, D]
    reference: torch.Tensor  # contiguous attention, fp32
    engine: torch.Tensor | None  # the engine's own output, when captured
    trace: object  # pagetrace.attention.api.Trace
    backend: str
    tables: list[list[int]]  # physical block tables (real ids), one per request, counted entries only


class ReplayRefused(RuntimeFailure):
    """A step that cannot be replayed as captured; `violations` are `check`'s findings that say why."""

    def __init__(self, message: str, violations: list | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


WHY = ("replay cannot judge attention here: its contiguous reference reads the pages through the same block tables and "
       "slots as the kernel, so both read the same wrong pages and agree")


def violation_words(v) -> str:
    """`pool: request b token 4: logical block 1 maps to ...`: the check, where, and what."""
    where = "" if v.request is None else f"request {v.request}" + ("" if v.token is None else f" token {v.token}") + ": "
    return f"{v.check}: {where}{v.message}"


def refuse_violations(manifest: Manifest, step: Step) -> None:
    """Raise `ReplayRefused` when `check`'s index checks find anything in the step (not the
    index dtypes, which the replay does not read): each violation named, and why the replay
    cannot judge attention there."""
    from .check import Checker

    if step.ring:
        pages = [e["step"] for e in manifest.steps if e.get("layers")]
        held = f"steps with pages: {', '.join(map(str, pages))}" if pages else "no step of this bundle has pages"
        raise ReplayRefused(f"step {step.step} is in the bundle's metadata ring: its index tensors and request ids, no cache pages, query or "
                            f"output; replay reads a step with pages ({held}); `pagetrace check --step {step.step}` checks its tables")
    checker = Checker(manifest, step)
    checker.run()
    found = [v for v in checker.found if v.check != "dtype"]
    if found:
        named = "; ".join(violation_words(v) for v in found[:3])
        more = f"; and {len(found) - 3} more" if len(found) > 3 else ""
        flagged = " (the guard flagged it)" if step.guard else ""
        raise ReplayRefused(f"step {step.step}{flagged}: {len(found)} violation{'s' if len(found) > 1 else ''}: {named}{more}; {WHY}; "
                            f"`pagetrace check` lists every violation", found)


def queries_of(step: Step, requests: list[int] | None = None) -> list[TokenQuery]:
    out = []
    for r in range(len(step.requests)):
        if requests is not None and r not in requests:
            continue
        start, end = step.query_start_loc[r], step.query_start_loc[r + 1]
        first = step.seq_lens[r] - (end - start)
        out.extend(TokenQuery(r, i, first + k) for k, i in enumerate(range(start, end)))
    return out


def replay_layer(manifest: Manifest, step: Step, tensors: dict, *, requests: list[int] | None = None, backend: str = "auto") -> Replay:
    from ..attention.api import paged_attention

    if "query" not in tensors:
        raise ReplayRefused(f"{step.file}: the step stored no query for this layer; nothing to replay")
    refuse_violations(manifest, step)
    key, value, compact = pool_views(manifest, step, tensors)
    queries = queries_of(step, requests)
    if not queries:
        raise ReplayRefused(f"step {step.step} has no new tokens to replay for the chosen requests")
    bs = manifest.block_size
    tables = [row[: -(-n // bs)] for row, n in zip(step.block_table, step.seq_lens)]

    def pool_rows(rows: list[list[int]]) -> torch.Tensor:
        width = max(len(row) for row in rows)
        return torch.tensor([[compact[b] for b in row] + [-1] * (width - len(row)) for row in rows], dtype=torch.int32)

    query = tensors["query"][[q.index for q in queries]].to(key.dtype)
    options = dict(layout="nhd", scale=manifest.scale, trace=True, backend=backend)
    # the step as the engine ran it: one call, query_start_loc and all
    chosen = sorted({q.request for q in queries})
    qsl = [0]
    for r in chosen:
        qsl.append(qsl[-1] + sum(q.request == r for q in queries))
    out, trace = paged_attention(
        query, key, value, pool_rows([tables[r] for r in chosen]), torch.tensor([step.seq_lens[r] for r in chosen], dtype=torch.int32),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32), sliding_window=manifest.sliding_window, **options,
    )
    reference = causal_reference(query, key, value, queries, [tables[q.request] for q in queries], compact, manifest)
    engine = tensors["output"][[q.index for q in queries]] if "output" in tensors else None
    return Replay(queries, out, reference, engine, trace, trace.backend, tables)


def causal_reference(query, key, value, queries: list[TokenQuery], tables: list[list[int]], compact: dict[int, int], manifest: Manifest) -> torch.Tensor:
    """Contiguous attention in fp32, one gather per request: its tokens 0..last position
    laid out in order, then each new token's softmax over the tokens up to its own (and
    inside the sliding window, when there is one)."""
    from ..attention.reference import gather

    bs, window = manifest.block_size, manifest.sliding_window
    out = torch.empty(len(queries), *query.shape[1:], dtype=torch.float32)
    by_request: dict[int, list[int]] = {}
    for j, q in enumerate(queries):
        by_request.setdefault(q.request, []).append(j)
    for rows in by_request.values():
        last = max(queries[j].position for j in rows)
        table = [compact[b] for b in tables[rows[0]][: last // bs + 1]]
        k = gather(key, "nhd", "key", table, last + 1, bs).float()  # [n, Hkv, D]
        v = gather(value, "nhd", "value", table, last + 1, bs).float()
        group = query.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        logits = torch.einsum("mhd,nhd->mhn", query[rows].float(), k) * manifest.scale
        keys, positions = torch.arange(last + 1)[None, :], torch.tensor([queries[j].position for j in rows])[:, None]
        visible = (keys <= positions) & ((keys > positions - window) if window is not None else True)
        weights = torch.softmax(logits.masked_fill(~visible[:, None, :], float("-inf")), dim=-1)
        out[rows] = torch.einsum("mhn,nhd->mhd", weights, v)
    return out


@dataclass(slots=True)
class RequestResult:
    request: str
    new_tokens: int
    seq_len: int
    table: list[int]
    vs_contiguous: float  # max |kernel - contiguous|
    vs_engine: float | None  # max |kernel - engine's output|
    passed: bool


@dataclass(slots=True)
class ReplaySummary:
    backend: str
    dtype: str
    tolerance: float
    requests: list[RequestResult]
    traced_request: int  # the step's row of the traced request (not an index into `requests`)
    traced_token: int
    rows: list[dict]  # per context token of the traced query
    block_mass: list[float]  # attention per logical block of the traced request (mean over heads)
    refcount: dict[int, int]  # physical block -> requests whose table holds it
    cache_read: str  # how the stored pages were read (`cache_read`)
    traced_name: str  # the traced request's id (`requests` lists only those with new tokens replayed)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.requests)

    @property
    def kernel_ran(self) -> bool:
        """Whether pagetrace's Triton kernel ran (compiled or interpreted); `--backend auto`
        picks the torch path on the CPU when the interpreter would take too long."""
        return self.backend != "torch"

    @property
    def compared(self) -> str:
        """What was held against what, naming only what ran: `kernel` or `torch path`, and the
        engine's output only when the bundle stored it."""
        ran = "kernel" if self.kernel_ran else "torch path"
        engine = " = engine output" if any(r.vs_engine is not None for r in self.requests) else ""
        return f"{ran} = contiguous attention{engine}"

    def _repr_html_(self) -> str:
        from ..views.notebook import replay_html

        return replay_html(self)

    def to_json(self, bundle: str, layer: int) -> dict:
        return {
            "bundle": str(bundle),
            "layer": layer,
            "backend": self.backend,
            "kernel_ran": self.kernel_ran,
            "compared": self.compared,
            "cache_read": self.cache_read,
            "dtype": self.dtype,
            "tolerance": self.tolerance,
            "passed": self.passed,
            "requests": [
                {"request": r.request, "new_tokens": r.new_tokens, "seq_len": r.seq_len, "block_table": r.table,
                 "max_diff_contiguous": r.vs_contiguous, "max_diff_engine": r.vs_engine, "passed": r.passed}
                for r in self.requests
            ],
            "traced": {"request": self.traced_name, "token": self.traced_token, "tokens": self.rows},
            "shared_blocks": {str(b): n for b, n in sorted(self.refcount.items()) if n > 1},
        }


def summarize(manifest: Manifest, step: Step, result: Replay, request: int, token: int) -> ReplaySummary:
    from ..attention.report import compare

    results = []
    for r in range(len(step.requests)):
        rows = [j for j, q in enumerate(result.queries) if q.request == r]
        if not rows:
            continue
        out = result.output[rows]
        ref_diff, tol, ok = compare(out, result.reference[rows], manifest.dtype)
        eng_diff = None
        if result.engine is not None:
            eng_diff, _, ok_engine = compare(out, result.engine[rows], manifest.dtype)
            ok = ok and ok_engine
        results.append(RequestResult(step.requests[r], len(rows), step.seq_lens[r], result.tables[r], ref_diff, eng_diff, ok))
    refcount: dict[int, int] = {}
    for table in result.tables:
        for b in set(table):
            refcount[b] = refcount.get(b, 0) + 1
    j = next(j for j, q in enumerate(result.queries) if q.request == request and q.position == token)
    bs, table = manifest.block_size, result.tables[request]
    weights = result.trace.weights[j, :, : token + 1].mean(0)
    logits = result.trace.logits[j, :, : token + 1].mean(0)
    rows = []
    for t in range(token + 1):
        physical = table[t // bs]
        rows.append({
            "token": t, "logical_block": t // bs, "offset": t % bs, "physical_block": physical, "slot": physical * bs + t % bs,
            "refcount": refcount[physical], "score": float(logits[t]), "weight": float(weights[t]),
        })
    # each token's key/value address in the engine's cache (its layout, its real block ids), as `lookup --from` gives it
    for row, address in zip(rows, start_addresses(manifest.geometry(), [r["physical_block"] for r in rows], [r["offset"] for r in rows])):
        row.update(address)
    mass = [float(weights[b * bs : (b + 1) * bs].sum()) for b in range(len(table))]
    return ReplaySummary(result.backend, manifest.dtype, tol, results, request, token, rows, mass, refcount, cache_read(manifest), step.requests[request])
