"""The data of `simulate --html`: `simulate --json`'s document plus the run's history, summarised
when it is large.

The block tables at a step are rebuilt in the page from per-step changes (sim/history.py); here they
are rebuilt once more in Python, at the steps the page keeps, so that a page over a sampled run
still shows, at each kept step, exactly the tables `--at STEP` prints.
"""

from __future__ import annotations

import json

MAX_STEPS = 1000  # steps the slider holds; longer runs keep this many, spread evenly
MAX_NAMES = 8  # request ids listed per event (admitted, preempted, finished); the count is kept
MAX_TABLE_BYTES = 480_000  # what the tables may cost (their JSON); the slider holds as many kept steps as fit
MAX_CHART = 2001  # points of the chart of the pool over the whole run
MAX_MARKS = 400  # preemption (and eviction) marks on the chart, binned
MAX_REQUESTS = 2000  # requests listed in full; a larger run keeps the ids of those in the kept tables only


def kept_steps(total: int, limit: int = MAX_STEPS) -> list[int]:
    if total <= limit:
        return list(range(total))
    return sorted({round(i * (total - 1) / (limit - 1)) for i in range(limit)})


def runs(blocks: list[int]) -> list[int]:
    """A block list with each run of 3 or more consecutive ids cut to its first and -(how many follow):
    [5, 6, 7, 8, 20] -> [5, -3, 20] (the page's `unruns` reverses it). Fresh blocks come off the free queue in order."""
    out: list[int] = []
    i, n = 0, len(blocks)
    while i < n:
        j = i
        while j + 1 < n and blocks[j + 1] == blocks[j] + 1:
            j += 1
        if j - i >= 2:
            out += [blocks[i], -(j - i)]
        else:
            out += blocks[i : j + 1]
        i = j + 1
    return out


def _packed(change: dict) -> dict:
    """A table change with its block lists as `runs`."""
    return {k: (v if k == "drop" else [[r, runs(b)] for r, b in v]) for k, v in change.items()}


def _diff(before: dict[int, list[int]], now: dict[int, list[int]]) -> dict:
    change: dict = {}
    drop = [r for r in before if r not in now]
    if drop:
        change["drop"] = drop
    for r, blocks in now.items():
        old = before.get(r)
        if old is not None and len(blocks) >= len(old) and blocks[: len(old)] == old:
            if len(blocks) > len(old):
                change.setdefault("add", []).append([r, blocks[len(old):]])
        elif old is not None or blocks:
            change.setdefault("set", []).append([r, list(blocks)])
    return change


def _table_cost(changes: list[dict], keep: list[int]) -> int:
    """What the page's tables cost at these kept steps, in bytes of JSON (each kept step's change from the one before)."""
    state: dict[int, list[int]] = {}
    shown: dict[int, list[int]] = {}
    wanted, cost = set(keep), 0
    for i, change in enumerate(changes):
        _apply(state, change)
        if i in wanted:
            d = _packed(_diff(shown, state))
            cost += len(json.dumps(d, separators=(",", ":"))) + 1
            shown = {r: list(b) for r, b in state.items()}
    return cost


def _apply(state: dict[int, list[int]], change: dict) -> None:
    for r in change.get("drop", ()):
        del state[r]
    for r, blocks in change.get("set", ()):
        state[r] = list(blocks)
    for r, blocks in change.get("add", ()):
        state[r].extend(blocks)


def choose_steps(counted: list[int], changes: list[dict]) -> list[int]:
    """The kept steps: up to MAX_STEPS of the counted ones, evenly spaced, the first and the last among them, as many
    as keep every kept step's block tables within MAX_TABLE_BYTES (fewer steps when the tables change a lot)."""
    limit = min(MAX_STEPS, len(counted))
    for _ in range(8):
        keep = [counted[i] for i in kept_steps(len(counted), limit)]
        cost = _table_cost(changes, keep)
        if cost <= MAX_TABLE_BYTES or limit <= 2:
            return keep
        limit = max(2, int(limit * MAX_TABLE_BYTES / cost * 0.9))
    return keep


def _cache_entry(hashed: set[int], before: set[int], num_blocks: int) -> dict:
    """The hashed blocks at a kept step: {"bits": base64 of one bit per block} or {"add", "drop"} from the kept step
    before, whichever is shorter (a busy pool changes most of its hashes between far-apart steps)."""
    import base64

    add, drop = sorted(hashed - before), sorted(before - hashed)
    delta = {"add": add, "drop": drop}
    if (len(add) + len(drop)) * 5 < num_blocks // 6:
        return delta
    bits = bytearray((num_blocks + 7) // 8)
    for b in hashed:
        bits[b >> 3] |= 1 << (b & 7)
    return {"bits": base64.b64encode(bytes(bits)).decode("ascii")}


def simulate_page_doc(doc: dict, history) -> dict:
    """`doc` (simulate --json's document) with `history`: {steps, tables, pool, hit_rate, ...}."""
    steps = doc["steps"]
    # the steps whose pool was counted (every stride-th, and the last); none for a large pool, counted from the tables below
    counted = sorted(history.pool) or list(range(len(steps)))
    keep = choose_steps(counted, history.changes)
    usable = doc["config"]["num_blocks"] - 1
    pools: list[list] = []
    prompt = {r["id"]: r["prompt_tokens"] for r in doc["requests"]}
    seen: set[str] = set()
    hits = admitted_prompt = 0
    hit_rate = []
    for s in steps:
        hits += s["hit_tokens"]
        for rid in s["admitted"]:
            if rid not in seen:
                seen.add(rid)
                admitted_prompt += prompt[rid]
        hit_rate.append(hits / admitted_prompt if admitted_prompt else 0.0)
    kept = []
    for i in keep:
        s = dict(steps[i])
        for key in ("admitted", "preempted", "finished"):
            if len(s[key]) > MAX_NAMES:
                s[f"{key}_count"] = len(s[key])
                s[key] = s[key][:MAX_NAMES]
        kept.append(s)
    # the tables at the kept steps, as changes from one kept step to the next
    tables: list[dict] = []
    caches: list[dict] = []  # per kept step: the blocks that hold a hash (`_cache_entry`)
    state: dict[int, list[int]] = {}
    shown: dict[int, list[int]] = {}
    ints, until = 0, None
    wanted = set(keep)
    hashes = getattr(history, "hashes", {}) or {}
    hashed: set[int] = set()
    shown_hashed: set[int] = set()
    for i, change in enumerate(history.changes):
        _apply(state, change)
        if i in hashes:
            added, lost = hashes[i]
            hashed.difference_update(lost)
            hashed.update(b for b, _ in added)
        if i not in wanted:
            continue
        if hashes:
            caches.append(_cache_entry(hashed, shown_hashed, doc["config"]["num_blocks"]))
            shown_hashed = set(hashed)
        if i in history.pool:
            pools.append(list(history.pool[i]))
        else:  # a request's table holds a block once, so its references are the tables that hold it
            holders: dict[int, int] = {}
            for blocks in state.values():
                for b in blocks:
                    holders[b] = holders.get(b, 0) + 1
            used = len(holders)
            pools.append([usable - used, used, None, sum(1 for c in holders.values() if c > 1)])
        if until is not None:
            continue
        d = _packed(_diff(shown, state))
        cost = len(json.dumps(d, separators=(",", ":"))) + 1
        if ints + cost > MAX_TABLE_BYTES:  # only where even two kept steps' tables do not fit (choose_steps)
            until = len(tables) - 1
            continue
        ints += cost
        tables.append(d)
        shown = {r: list(b) for r, b in state.items()}
    notes = []
    if len(keep) < len(steps):
        notes.append(f"{len(steps):,} steps: the slider holds {len(keep):,} of them, evenly spaced, the first and the last among them (each shows "
                     "its own step's record and block tables; as many steps as keep the page's tables within its size); the chart covers the whole run")
    if not history.pool:
        notes.append("the pool is too large to count block by block: used and shared blocks are counted from the tables, cached ones not ('free' includes them)")
    if until is not None:
        notes.append(f"block tables are kept up to step {kept[until]['step'] if until >= 0 else 0:,} (the page would be too large past it)")
    if any(f"{k}_count" in s for s in kept for k in ("admitted", "preempted", "finished")):
        notes.append(f"events list at most {MAX_NAMES} request ids, then their count")
    page = {k: v for k, v in doc.items() if k != "steps"}
    page["steps_total"] = len(steps)
    if len(doc["requests"]) > MAX_REQUESTS:
        named = sorted({r for d in tables for key in ("set", "add") for r, _ in d.get(key, ())})
        page["requests"] = None
        page["request_ids"] = {str(i): doc["requests"][i]["id"] for i in named}
        notes.append(f"{len(doc['requests']):,} requests: the page names those in the kept tables only")
    page["history"] = {
        "steps": kept,
        "tables": tables,
        "tables_until": until,
        "pool": pools,
        "caches": caches if hashes else None,
        "hit_rate": [hit_rate[i] for i in keep],
        "chart": _chart(steps, history.pool, usable),
        "marks": {"preempted": _marks(steps, lambda s: len(s["preempted"])), "evicted": _marks(steps, lambda s: s["evicted"])},
        "note": "; ".join(notes) + ("." if notes else ""),
    }
    return page


def _chart(steps: list[dict], pool: dict, usable: int) -> list[list]:
    """The pool over the whole run, [step, free, used, cached] at up to MAX_CHART steps: the counted ones (every
    stride-th), or for a pool too large to count, the steps' own used and free blocks (cached not told apart)."""
    if pool:
        at = sorted(pool)
        at = [at[i] for i in kept_steps(len(at), MAX_CHART)]
        return [[steps[i]["step"], pool[i][0], pool[i][1], pool[i][2]] for i in at]
    return [[steps[i]["step"], steps[i]["free_blocks"], steps[i]["used_blocks"], None] for i in kept_steps(len(steps), MAX_CHART)]


def _marks(steps: list[dict], count) -> list[list[int]]:
    """[step, how many] of an event over the run, binned to at most MAX_MARKS marks (each at its bin's first event)."""
    events = [(s["step"], count(s)) for s in steps if count(s)]
    if len(events) <= MAX_MARKS:
        return [list(e) for e in events]
    per = -(-len(events) // MAX_MARKS)
    return [[events[i][0], sum(n for _, n in events[i : i + per])] for i in range(0, len(events), per)]
