"""The data of `run --html`: `run --json`'s document, summarised when it is large.

A page should stay small enough to mail (about 1 MB), and a row of `run --json` costs about 250
bytes (more with many shown heads). Under ROW_BYTES of rows the page's document is `--json`'s,
unchanged. Past it, each sequence keeps a share of its rows, by the rules below, and the page says
so (`page_summary`):

- every row of its first and its last logical block, the traced token (`--token`), the
  HEAVIEST rows by weight (any shown head, for the rows' query), and rows evenly spaced over the
  rest;
- a prefill's `queries` carry their scores and weights for the kept rows only (in the kept rows'
  order), and no more of them than QUERY_NUMBERS numbers allow (the rows' query always among them);
- `coverage` (one entry per logical block, which the page does not draw) is left out of a
  sequence of more than MAX_COVERAGE blocks.

Every number kept is the one `--json` prints; the block tables, the checks and the mask map are
whole, so the picture, the owners and the four steps of any token still show.
"""

from __future__ import annotations

import json

PAGE_BYTES = 900_000  # what a summarised page aims at, script and style included
MIN_ROW_BYTES = 100_000  # rows kept whatever the rest of the page costs (a huge block table)
QUERY_NUMBERS = 8_192  # scores and weights in the kept queries together (about 20 bytes each)
HEAVIEST = 256  # per sequence, the heaviest rows always kept
MAX_COVERAGE = 256  # logical blocks of a sequence whose coverage the page keeps


def _row_bytes(row: dict) -> int:
    return len(json.dumps(row, separators=(",", ":"))) + 1


def kept_rows(rows: list[dict], budget: int, block_size: int, traced: int | None) -> list[int]:
    """Indices into `rows` (sorted by token) to keep: at most `budget` of them (or the fixed ones)."""
    n = len(rows)
    if n <= budget:
        return list(range(n))
    fixed = set(range(min(n, block_size)))
    last_block = rows[-1]["logical_block"]
    fixed.update(i for i in range(max(0, n - block_size), n) if rows[i]["logical_block"] == last_block)
    if traced is not None:
        fixed.update(i for i, r in enumerate(rows) if r["token"] == traced)
    weight = [max((w for w in r["weights"] if w is not None), default=0.0) for r in rows]
    fixed.update(sorted(range(n), key=lambda i: -weight[i])[: min(HEAVIEST, max(0, budget - len(fixed)) // 2)])
    room = budget - len(fixed)
    if room > 0:
        fixed.update(round(i * (n - 1) / max(1, room - 1)) for i in range(room))
    return sorted(fixed)


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
    # what stays whole: everything but the rows, the queries and a long sequence's coverage
    rest = _size({k: v for k, v in doc.items() if k != "sequences"}) + sum(
        _size({k: v for k, v in s.items() if k not in ("rows", "queries", "coverage")}) + (_size(s["coverage"]) if len(s["coverage"]) <= MAX_COVERAGE else 0)
        for s in sequences)
    query_room = min(queries, QUERY_NUMBERS * 22)
    budget = max(MIN_ROW_BYTES, PAGE_BYTES - fixed_bytes - rest - query_room - 2_000) // per_row
    bs = doc["config"]["block_size"]
    traced = doc["token"]
    out = dict(doc, sequences=[])
    notes = []
    for s in sequences:
        share = max(1, budget * len(s["rows"]) // total_rows)
        keep = kept_rows(s["rows"], share, bs, traced["token"] if traced and traced["sequence"] == s["index"] else None)
        seq = dict(s, rows=[s["rows"][i] for i in keep])
        words = []
        if len(keep) < len(s["rows"]):
            seq["rows_kept"] = {"kept": len(keep), "of": len(s["rows"])}
            words.append(f"{len(keep):,} of {len(s['rows']):,} rows")
        if len(s["coverage"]) > MAX_COVERAGE:
            del seq["coverage"]
        if s.get("queries"):
            seq["queries"] = _kept_queries(s["queries"], keep, s["query"]["index"], sum(bool(x.get("queries")) for x in sequences))
            if len(seq["queries"]) < len(s["queries"]):
                words.append(f"{len(seq['queries'])} of the {len(s['queries'])} queries `--json` holds")
        if words:
            notes.append(f"sequence {s['index']}: " + ", ".join(words))
        out["sequences"].append(seq)
    out["page_summary"] = (
        "This page is summarised (the run is large): " + "; ".join(notes) + ". Each sequence keeps every row of its first and last "
        f"block, the traced token, its {HEAVIEST} heaviest rows and rows evenly spaced over the rest; a prefill's queries carry the kept "
        "rows' weights only. Every number shown is the one `pagetrace run --json` prints, which has every row."
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
    return [dict(q, scores=[[h[i] for i in keep] for h in q["scores"]], weights=[[h[i] for i in keep] for h in q["weights"]]) for q in picks]
