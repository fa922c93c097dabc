"""What `pagetrace run` found, as plain numbers, checked against the host's arithmetic.

`check_slots` compares the slots the kernel says it read with the block-table lookup
(`reference.slots_of`: `table[t // block_size] * block_size + t % block_size`), token by token; `compare`
checks the output against contiguous attention; `build_report` turns the trace into
rows (every token for --json, only the shown ones for the terminal) and summaries.
Rendering lives in `render_run`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..paging.blocks import BlockSpan, coverage
from ..paging.plan import Plan
from .reference import slots_of

# |paged - contiguous| <= TOL * (1 + |contiguous|), per cache dtype (fp32 accumulation).
# fp8 caches run with fp16 queries, and the reference dequantizes the very bytes the kernel
# reads (every e4m3 / e5m2 value is exact in fp16), so quantization error is on both sides
# alike: what is left is the fp16 query's rounding, hence fp16's tolerance.
TOLERANCES = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1.6e-2, "fp8_e4m3": 1e-3, "fp8_e5m2": 1e-3}


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
    mask: str = "visible"  # for the shown query token: visible, causal (after it) or window (too far before it)


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
    rows: list[Row]  # sorted by token: all of them, or the ones some table shows
    block_mass: list[float]  # attention mass per logical block, mean over all query heads
    head_rows: list[set[int]] = field(default_factory=list)  # per shown head: the tokens its table shows
    traced: int | None = None  # the --token of this sequence
    query_row: int = 0  # the row of the query (and of the trace) the tables show
    query: int = 0  # which of the sequence's new tokens that is
    query_position: int = 0  # its position in the sequence
    block_masked: list[tuple[int, int]] = field(default_factory=list)  # per logical block, keys that query does not see: (causal, window)
    choices: list[dict] | None = None  # a prefill's queries a page can switch between (`query_choices`); None: one new token


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


def check_slots(plan: Plan, slots: torch.Tensor, limit: int = 10) -> list[str]:
    """Each token's slot as the kernel recorded it against the host-side lookup."""
    problems: list[str] = []
    recorded = slots.cpu()
    for s, (n, table) in enumerate(zip(plan.seq_lens, plan.tables)):
        want = slots_of(table, n, plan.block_size)
        got = recorded[s, :n]
        for t in torch.nonzero(got != want).flatten()[: limit - len(problems)].tolist():
            problems.append(f"sequence {s} token {t}: kernel read slot {int(got[t])}, block table says {int(want[t])}")
        if (recorded[s, n:] != -1).any():
            problems.append(f"sequence {s}: kernel recorded slots past its {n} tokens")
        if len(problems) >= limit:
            break
    return problems


def compare(output: torch.Tensor, expected: torch.Tensor, dtype: str) -> tuple[float, float, bool]:
    """(max |diff|, tolerance, passed); NaN anywhere fails."""
    tol = TOLERANCES[dtype]
    got, want = output.double().cpu(), expected.double().cpu()
    diff = (got - want).abs()
    passed = bool((diff <= tol * (1 + want.abs())).all())
    worst = float(diff.nan_to_num(nan=math.inf).max())
    return worst, tol, passed


def rows_to_show(n: int, weights: torch.Tensor, limit: int | None, traced: int | None = None) -> set[int]:
    """Indices to print out of `n` (tokens, or blocks by their mass): all when they fit,
    else the first, the last and the heaviest, `limit` in all, plus the traced one."""
    if limit is None or n <= limit:
        return set(range(n))
    edge = limit // 3
    heavy = torch.topk(weights.nan_to_num(nan=-1.0), limit - 2 * edge).indices.tolist()
    shown = set(range(edge)) | set(range(n - edge, n)) | set(heavy)
    return shown | ({traced} if traced is not None else set())


MASK_NAMES = {0: "visible", 1: "causal", 2: "window", -1: "-"}


def build_report(
    plan: Plan, trace, output: torch.Tensor, shown_heads: list[int], limit: int | None = None, all_rows: bool = True,
    traced: tuple[int, int] | None = None, queries: list[int] | None = None,
) -> list[SequenceReport]:
    """queries: per sequence, which of its new tokens the tables show (default: the last)."""
    reports = []
    mask = trace.mask.cpu()
    logits = trace.logits.cpu()
    weights = trace.weights.cpu()
    slots = trace.slots.cpu()
    parts = trace.partitions.cpu()
    out = output.float().cpu()
    bs = plan.block_size
    for s, (n, table) in enumerate(zip(plan.seq_lens, plan.tables)):
        rows_of_seq = trace.rows_of(s)
        q = len(rows_of_seq) - 1 if queries is None or queries[s] is None else queries[s]
        r = rows_of_seq[q]
        w = weights[r, :, :n]
        heads = [
            HeadSummary(h, float(w[h].max()), int(w[h].nan_to_num(nan=-1.0).argmax()), float(out[r, h].norm()), float(trace.lse[r, h]))
            for h in range(w.shape[0])
        ]
        token = traced[1] if traced is not None and traced[0] == s else None
        head_rows = [rows_to_show(n, w[h], limit, token) for h in shown_heads]
        tokens = list(range(n)) if all_rows else sorted(set().union(*head_rows))
        index = torch.tensor(tokens, dtype=torch.long)
        shown_logits = logits[r][shown_heads][:, index].T.tolist()
        states = mask[r, index].tolist()
        shown_weights = w[shown_heads][:, index].T.tolist()
        slot_list = slots[s, index].tolist()
        part_list = parts[s, index].tolist()
        rows = [
            Row(t, t // bs, t % bs, table[t // bs], slot_list[i], part_list[i], shown_logits[i], shown_weights[i], MASK_NAMES[states[i]])
            for i, t in enumerate(tokens)
        ]
        spans = coverage(n, table, bs)
        per_token = w.mean(dim=0)
        cumulative = torch.cat([torch.zeros(1, dtype=torch.float64), per_token.double().cumsum(0)])
        mass = [float(cumulative[span.last_token + 1] - cumulative[span.first_token]) for span in spans]
        masked = _masked_per_block(mask[r, :n], [(span.first_token, span.last_token) for span in spans])
        reports.append(SequenceReport(s, n, table[: len(spans)], spans, heads, rows, mass, head_rows, token, r, q, n - len(rows_of_seq) + q,
                                      block_masked=masked))
    if all_rows:
        budget = max(1, QUERY_VALUES // max(1, sum(len(trace.rows_of(s)) > 1 for s in range(len(plan.seq_lens)))))
        for rep in reports:
            rep.choices = query_choices(trace, rep, shown_heads, budget)
    return reports


MAX_QUERIES = 32  # a prefill's queries with their own weights, per sequence (`query_choices`)
QUERY_VALUES = 24_576  # scores and weights in all the sequences' choices together


def query_choices(trace, rep: SequenceReport, shown_heads: list[int], budget: int = QUERY_VALUES) -> list[dict] | None:
    """A prefill's (or mixed batch's) new tokens of one sequence, each with its own scores and
    weights per shown head over keys 0..n-1 and its masked keys as runs [first, last, causal|window]
    (the kernel's trace, not re-derived): at most MAX_QUERIES of them and `budget` numbers, evenly
    spaced, the first, the last and the one the rows show always among them. None for one new token."""
    rows = trace.rows_of(rep.index)
    if len(rows) <= 1:
        return None
    n, heads = rep.seq_len, len(shown_heads)
    room = max(1, min(MAX_QUERIES, budget // (2 * heads * n)))
    if room >= len(rows):
        picks = list(range(len(rows)))
    else:  # room - 1 evenly spaced (the first and the last among them), and the shown one
        picks = sorted({rep.query, *(round(i * (len(rows) - 1) / max(1, room - 2)) for i in range(room - 1))})
    first_position = n - len(rows)
    out = []
    for k in picks:
        r = rows[k]
        states = trace.mask[r, :n].cpu()
        runs, start = [], None
        values = states.tolist()
        for t, v in enumerate(values + [0]):
            if start is not None and (t == n or v != values[start]):
                runs.append([start, t - 1, MASK_NAMES[values[start]]])
                start = None
            if t < n and v not in (0, -1) and start is None:
                start = t
        out.append({
            "index": k, "position": first_position + k, "row": r,
            "scores": trace.logits[r][shown_heads][:, :n].cpu().tolist(),
            "weights": trace.weights[r][shown_heads][:, :n].cpu().tolist(),
            "masked": runs,
        })
    return out


def _masked_per_block(states: torch.Tensor, blocks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Per block (first..last token): how many keys are causal-masked and window-masked."""
    zero = torch.zeros(1, dtype=torch.long)
    causal = torch.cat([zero, (states == 1).long().cumsum(0)]).tolist()
    window = torch.cat([zero, (states == 2).long().cumsum(0)]).tolist()
    return [(causal[b + 1] - causal[a], window[b + 1] - window[a]) for a, b in blocks]


def mask_map(trace, seq: int, seq_len: int, block_size: int, limit: int = 16) -> list[tuple[int, str]]:
    """The sequence's mask, query rows x key blocks: (position, one character per block):
    '█' every key visible, '░' some, '·' none (causal), 'w' none (window); at most `limit`
    rows (the first and the last ones)."""
    rows = list(trace.rows_of(seq))
    if len(rows) > limit:
        rows = rows[: limit // 2] + rows[-(limit - limit // 2):]
    mask = trace.mask.cpu()
    first_pos = seq_len - len(trace.rows_of(seq)) - trace.rows_of(seq).start
    out = []
    for r in rows:
        cells = []
        for b in range(0, seq_len, block_size):
            states = mask[r, b : min(b + block_size, seq_len)]
            if bool((states == 0).all()):
                cells.append("█")
            elif bool((states == 0).any()):
                cells.append("░")
            else:
                cells.append("w" if bool((states == 2).any()) else "·")
        out.append((first_pos + r, "".join(cells)))
    return out
