"""The data of `run --html`: `run --json`'s document, summarised when it is large.

A page should stay small enough to mail (about 1 MB), and a row of `run --json` costs about 250
bytes (more with many shown heads). Under ROW_BYTES of rows the page's document is `--json`'s,
unchanged. Past it, each sequence keeps a share of its rows, by the rules below, and the page says
so (`page_summary`):

- in this order, as far as its share (by its length) of the row budget goes: the traced token
  (`--token`), its heaviest rows by weight (any shown head, for the rows' query: up to HEAVIEST, half
  its share at most), the rows of its first and then of its last logical block, and rows evenly
  spaced over the rest;
- a prefill's `queries` carry their scores and weights for the kept rows only (in the kept rows'
  order), and no more of them than QUERY_NUMBERS numbers allow (the rows' query always among them);
- `coverage` (one entry per logical block, never drawn whole) is left out; its attention mass per
  logical block is kept as `block_mass` (the page draws it) while all the sequences' blocks together
  are at most MASS_NUMBERS.

Every number kept is the one `--json` prints; the block tables, the checks and the mask map are
whole, so the picture, the owners and the four steps of any token still show.
"""

from __future__ import annotations

import json

PAGE_BYTES = 900_000  # what a summarised page aims at, script and style included
MIN_ROW_BYTES = 100_000  # rows kept whatever the rest of the page costs (a huge block table)
QUERY_NUMBERS = 8_192  # scores and weights in the kept queries together (about 20 bytes each)
HEAVIEST = 256  # per sequence, the heaviest rows always kept
MASS_NUMBERS = 16_384  # logical blocks (all sequences) whose attention mass a summarised page keeps


def run_title(seq_lens: list[int], block_size: int) -> str:
    """The page's title: the tokens of a few sequences, or their count and range (a title never widens the page)."""
    text = ",".join(map(str, seq_lens))
    if len(seq_lens) > 4 or len(text) > 40:
        text = f"{len(seq_lens)} sequences of {min(seq_lens):,} to {max(seq_lens):,}"
    return f"pagetrace run: tokens {text}, block size {block_size}"


def _row_bytes(row: dict) -> int:
    return len(json.dumps(row, separators=(",", ":"))) + 1


def kept_rows(rows: list[dict], budget: int, block_size: int, traced: int | None) -> list[int]:
    """Indices into `rows` (sorted by token) to keep: at most `budget` of them (or the fixed ones)."""
    n = len(rows)
    if n <= budget:
        return list(range(n))
    # in this order, as far as the budget goes: the traced token, the heaviest rows (half the budget at most), the first
    # block, the last block; then rows evenly spaced
    fixed = set() if traced is None else {i for i, r in enumerate(rows) if r["token"] == traced}
    weight = [max((w for w in r["weights"] if w is not None), default=0.0) for r in rows]
    fixed.update(heaviest(weight, min(HEAVIEST, max(1, budget // 2))))
    first, last = ends(rows, block_size)
    for i in [*first, *last]:
        if len(fixed) >= budget:
            break
        fixed.add(i)
    room = budget - len(fixed)
    if room > 0:
        fixed.update(round(i * (n - 1) / max(1, room - 1)) for i in range(room))
    return sorted(fixed)


def ends(rows: list[dict], block_size: int) -> tuple[list[int], list[int]]:
    """The rows of the first and of the last logical block."""
    n = len(rows)
    last_block = rows[-1]["logical_block"]
    return list(range(min(n, block_size))), [i for i in range(max(0, n - block_size), n) if rows[i]["logical_block"] == last_block]


def heaviest(weight: list[float], k: int) -> list[int]:
    """The indices of the k largest weights (ties: the earlier row)."""
    import heapq

    return heapq.nlargest(k, range(len(weight)), key=lambda i: (weight[i], -i))


def mass_of(seq: dict) -> list:
    """A sequence's attention mass per logical block, `coverage`'s numbers in its order."""
    return [c["attention_mass"] for c in seq["coverage"]]


def _size(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def run_page_doc(doc: dict, fixed_bytes: int = 0) -> dict:
    """`doc` (run --json's document), or a summary of it when the page would pass PAGE_BYTES;
    `fixed_bytes`: what the page costs besides its data (script, style)."""
    sequences = doc["sequences"]
    total_rows = sum(len(s["rows"]) for s in sequences)
    if not total_rows:
        return doc
    per_row = max(_row_bytes(s["rows"][len(s["rows"]) // 2]) for s in sequences if s["rows"])
    queries = sum(_size(s["queries"]) for s in sequences if s.get("queries"))
    if fixed_bytes + _size(doc) <= PAGE_BYTES:
        return doc
    # what stays whole: everything but the rows, the queries and the coverage (its mass per block, where it fits)
    keep_mass = sum(len(s["coverage"]) for s in sequences) <= MASS_NUMBERS
    rest = _size({k: v for k, v in doc.items() if k != "sequences"}) + sum(
        _size({k: v for k, v in s.items() if k not in ("rows", "queries", "coverage")}) + (_size(mass_of(s)) if keep_mass else 0)
        for s in sequences)
    query_room = min(queries, QUERY_NUMBERS * 22)
    budget = max(MIN_ROW_BYTES, PAGE_BYTES - fixed_bytes - rest - query_room - 2_000) // per_row
    bs = doc["config"]["block_size"]
    traced = doc["token"]
    out = dict(doc, sequences=[])
    kept_total, queries_cut = 0, []
    for s in sequences:  # the budget shared out by length
        share = max(1, budget * len(s["rows"]) // total_rows)
        keep = kept_rows(s["rows"], share, bs, traced["token"] if traced and traced["sequence"] == s["index"] else None)
        seq = {k: v for k, v in s.items() if k != "coverage"}
        seq["rows"] = [s["rows"][i] for i in keep]
        kept_total += len(keep)
        if keep_mass:
            seq["block_mass"] = mass_of(s)
        if len(keep) < len(s["rows"]):
            seq["rows_kept"] = {"kept": len(keep), "of": len(s["rows"])}
        if s.get("queries"):
            seq["queries"] = _kept_queries(s["queries"], keep, s["query"]["index"], sum(bool(x.get("queries")) for x in sequences))
            with_numbers = sum(q["weights"] is not None for q in seq["queries"])
            if with_numbers < len(s["queries"]):
                seq["queries_kept"] = {"kept": with_numbers, "of": len(s["queries"])}
                queries_cut.append(f"{with_numbers} of sequence {s['index']}'s {len(s['queries'])} queries")
        out["sequences"].append(seq)
    many = f"{len(sequences)} sequences: " if len(sequences) > 1 else ""
    out["page_summary"] = (
        f"This page is summarised (the run is large). {many}{kept_total:,} of {total_rows:,} rows are kept: per sequence the traced token, "
        f"its heaviest rows (up to {HEAVIEST}, half its share), its first and last block as its share allows, rows evenly spaced"
        + (f"; {', '.join(queries_cut[:3])}{' …' if len(queries_cut) > 3 else ''} carry weights (the others their mask only)" if queries_cut else "")
        + ". Every number shown is `pagetrace run --json`'s, which has every row."
    )
    return out


def _kept_queries(queries: list[dict], keep: list[int], shown: int, sequences: int) -> list[dict]:
    """The queries a summarised page keeps, their scores and weights cut to the kept rows."""
    per_query = max(1, 2 * len(queries[0]["weights"]) * len(keep))
    room = max(1, QUERY_NUMBERS // sequences // per_query)
    if room >= len(queries):
        picks = queries
    else:  # room - 1 evenly spaced, and the rows' own query
        at = {round(i * (len(queries) - 1) / max(1, room - 2)) for i in range(room - 1)}
        picks = [q for i, q in enumerate(queries) if i in at or q["index"] == shown]
    # every query stays reachable: one left out keeps its position and masked runs (the mask), its numbers null
    chosen = {q["index"] for q in picks}
    return [dict(q, scores=[[h[i] for i in keep] for h in q["scores"]], weights=[[h[i] for i in keep] for h in q["weights"]]) if q["index"] in chosen
            else dict(q, scores=None, weights=None) for q in queries]
