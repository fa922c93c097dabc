"""The data of `simulate --html`: `simulate --json`'s document plus the run's history, summarised
when it is large.

The block tables at a step are rebuilt in the page from per-step changes (sim/history.py); here they
are rebuilt once more in Python, at the steps the page keeps, so that a page over a sampled run
still shows, at each kept step, exactly the tables `--at STEP` prints.
"""

from __future__ import annotations

MAX_STEPS = 1000  # steps the slider holds; longer runs keep this many, spread evenly
MAX_NAMES = 8  # request ids listed per event (admitted, preempted, finished); the count is kept
MAX_TABLE_INTS = 40_000  # block ids the page carries for the tables; past that, counts only
MAX_REQUESTS = 2000  # requests listed in full; a larger run keeps the ids of those in the kept tables only


def kept_steps(total: int, limit: int = MAX_STEPS) -> list[int]:
    if total <= limit:
        return list(range(total))
    return sorted({round(i * (total - 1) / (limit - 1)) for i in range(limit)})


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


def simulate_page_doc(doc: dict, history) -> dict:
    """`doc` (simulate --json's document) with `history`: {steps, tables, pool, hit_rate, ...}."""
    steps = doc["steps"]
    # the steps whose pool was counted (every stride-th); none for a large pool, counted from the tables below
    counted = sorted(history.pool) or list(range(len(steps)))
    keep = [counted[i] for i in kept_steps(len(counted))]
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
    state: dict[int, list[int]] = {}
    shown: dict[int, list[int]] = {}
    ints, until = 0, None
    wanted = set(keep)
    for i, change in enumerate(history.changes):
        for r in change.get("drop", ()):
            del state[r]
        for r, blocks in change.get("set", ()):
            state[r] = list(blocks)
        for r, blocks in change.get("add", ()):
            state[r].extend(blocks)
        if i not in wanted:
            continue
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
        d = _diff(shown, state)
        cost = sum(len(b) for _, b in d.get("set", ())) + sum(len(b) for _, b in d.get("add", ()))
        if ints + cost > MAX_TABLE_INTS:
            until = len(tables) - 1
            continue
        ints += cost
        tables.append(d)
        shown = {r: list(b) for r, b in state.items()}
    notes = []
    if len(keep) < len(steps):
        notes.append(f"{len(steps):,} steps: the slider holds {len(keep):,} of them, evenly spaced (each shows its own step's record)")
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
        "hit_rate": [hit_rate[i] for i in keep],
        "note": "; ".join(notes) + ("." if notes else ""),
    }
    return page
