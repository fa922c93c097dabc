"""What `pagetrace run` found, as plain numbers, checked against the host's arithmetic.

`build_report` turns the kernel's trace and the contiguous reference into lists of
rows (one per token) and summaries; `check_slots` compares the slots the kernel says
it read with `blocks.slot_mapping`, token by token. Rendering lives in `render_run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .blocks import BlockSpan, coverage, slot_mapping
from .plan import Plan

# |paged - contiguous| <= TOL * (1 + |contiguous|), per cache dtype (fp32 accumulation)
TOLERANCES = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1.6e-2}


@dataclass
class Row:
    token: int
    logical_block: int
    offset: int
    physical_block: int
    slot: int
    partition: int
    scores: list[float]  # per shown query head
    weights: list[float]


@dataclass
class HeadSummary:
    head: int
    max_weight: float
    argmax: int
    output_norm: float
    lse: float


@dataclass
class SequenceReport:
    index: int
    seq_len: int
    table: list[int]  # the blocks the sequence uses
    spans: list[BlockSpan]
    heads: list[HeadSummary]
    rows: list[Row]
    block_mass: list[float]  # attention mass per logical block, mean over all query heads


@dataclass
class Checks:
    max_abs_diff: float
    tolerance: float
    passed: bool
    slot_mismatches: list[str] = field(default_factory=list)
    logit_max_abs_diff: float = 0.0

    @property
    def slots_match(self) -> bool:
        return not self.slot_mismatches


def check_slots(plan: Plan, slots: torch.Tensor) -> list[str]:
    """Each token's slot as the kernel recorded it against the host-side lookup."""
    problems = []
    recorded = slots.cpu().tolist()
    for s, (n, table) in enumerate(zip(plan.seq_lens, plan.tables)):
        expected = slot_mapping(n, table, plan.block_size)
        for t, (got, want) in enumerate(zip(recorded[s][:n], expected)):
            if got != want:
                problems.append(f"sequence {s} token {t}: kernel read slot {got}, block table says {want}")
                if len(problems) >= 10:
                    return problems
        if any(x != -1 for x in recorded[s][n:]):
            problems.append(f"sequence {s}: kernel recorded slots past its {n} tokens")
    return problems


def compare(output: torch.Tensor, expected: torch.Tensor, dtype: str) -> tuple[float, float, bool]:
    tol = TOLERANCES[dtype]
    diff = (output.double().cpu() - expected.double().cpu()).abs()
    bound = tol * (1 + expected.double().cpu().abs())
    return float(diff.max()), tol, bool((diff <= bound).all())


def build_report(plan: Plan, trace, output: torch.Tensor, shown_heads: list[int]) -> list[SequenceReport]:
    reports = []
    logits = trace.logits.cpu()
    weights = trace.weights.cpu()
    slots = trace.slots.cpu()
    parts = trace.partitions.cpu()
    out = output.float().cpu()
    for s, (n, table) in enumerate(zip(plan.seq_lens, plan.tables)):
        bs = plan.block_size
        heads = []
        for h in range(logits.shape[1]):
            w = weights[s, h, :n]
            heads.append(HeadSummary(h, float(w.max()), int(w.argmax()), float(out[s, h].norm()), float(trace.lse[s, h])))
        shown_logits = logits[s, shown_heads, :n].T.tolist()
        shown_weights = weights[s, shown_heads, :n].T.tolist()
        slot_list = slots[s, :n].tolist()
        part_list = parts[s, :n].tolist()
        rows = [
            Row(t, t // bs, t % bs, table[t // bs], slot_list[t], part_list[t], shown_logits[t], shown_weights[t])
            for t in range(n)
        ]
        spans = coverage(n, table, bs)
        per_token = weights[s, :, :n].mean(dim=0)
        mass = [float(per_token[span.first_token : span.last_token + 1].sum()) for span in spans]
        reports.append(SequenceReport(s, n, table[: len(spans)], spans, heads, rows, mass))
    return reports


def rows_to_show(n: int, weights: list[float], limit: int | None) -> list[int]:
    """Token indices to print: all when they fit, else the first, the last and the heaviest."""
    if limit is None or n <= limit:
        return list(range(n))
    edge = max(1, limit // 3)
    heavy = sorted(range(n), key=lambda t: -weights[t])[: max(1, limit - 2 * edge)]
    return sorted(set(range(edge)) | set(range(n - edge, n)) | set(heavy))
