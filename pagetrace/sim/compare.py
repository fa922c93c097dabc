"""Predicted KV events against a server's: blocks stored and removed, by hash, in order.

The simulator logs what vLLM would publish (policy.py `record_events`); the server's
messages come from events.py. Both are flattened to one item per block hash:
("stored", hash) for each hash of a BlockStored, ("removed", hash) for each of a
BlockRemoved, in publication order, and compared item by item. The first item that
differs is the divergence: the step and request on pagetrace's side, the message sequence
number on the server's, the hash, and what each side did there.

Hashes are vLLM's own (vllm_hash.py) when the trace's hashing can be reproduced (sha256,
the default, with the recorded seed); otherwise, or when no predicted hash matches a
stored one (another seed or algorithm), blocks are compared by token content: a
BlockStored carries its token ids and parent, so each server hash is mapped to the chain of
token ids and extra keys it stands for, and a BlockRemoved to the content it stored.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .events import AllBlocksCleared, BlockRemoved, BlockStored, EventStream
from .vllm_hash import HASH_ALGOS, block_hashes, external
from .workload import salt_of_lora_key


@dataclass(slots=True)
class Item:
    kind: str  # "stored", "removed" or "cleared"
    key: object  # the hash (or the content key)
    where: str  # "step 4" / "message 3, event 0"
    request: str | None = None  # the request that stored it, or whose allocation evicted it
    block: int | None = None  # the block's index in that request
    seq: int | None = None  # the server's message sequence number


@dataclass(slots=True)
class Comparison:
    mode: str  # "hash" or "content"
    predicted: int
    server: int
    agree: int  # leading items equal
    same_multiset: bool  # the same items, whatever the order
    first_divergence: dict | None
    notes: list[str] = field(default_factory=list)
    skipped: int = 0  # server events left out (another block size, another group)
    likely: list[dict] = field(default_factory=list)  # what likely differs between the server and the simulation (likely.py)

    @property
    def passed(self) -> bool:
        return self.first_divergence is None

    def to_json(self) -> dict:
        return {"mode": self.mode, "predicted_items": self.predicted, "server_items": self.server, "agree": self.agree,
                "same_items_any_order": self.same_multiset, "equal": self.first_divergence is None,
                "first_divergence": self.first_divergence, "likely": self.likely, "notes": self.notes,
                "server_events_skipped": self.skipped}


def _norm(h):
    return external(h) if isinstance(h, bytes) and len(h) == 32 else h


def _content_chain(tokens, block_size: int, salt: str | None, lora: str | None) -> list:
    out, parent = [], None
    for i in range(len(tokens) // block_size):
        keys = ([lora] if lora else []) + ([salt] if i == 0 and salt else [])
        parent = hash((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), tuple(keys) or None))
        out.append(parent)
    return out


def predicted_items(result, trace, block_size: int, mode: str) -> list[Item]:
    """The simulator's events as items, each hash in vLLM's form (mode "hash") or as a content key."""
    by_id = {r.request_id: r for r in result.requests}
    seed = trace.header.hash_seed if trace.header is not None else None
    keys: dict[str, list] = {}
    internal_to_key: dict[int, object] = {}

    def key_of(rid: str, i: int):
        ks = keys.get(rid)
        if ks is None:
            req = by_id[rid]
            if rid in trace.given_hashes:
                ks = trace.given_hashes[rid]
            else:
                tokens = req.token_slice(0, req.prompt_len + len(req.output))
                salt = salt_of_lora_key(req.cache_salt) if rid in trace.lora else req.cache_salt
                if mode == "hash":
                    ks = block_hashes(tokens, block_size, salt, seed)
                else:
                    ks = _content_chain(tokens, block_size, salt, trace.lora.get(rid))
            keys[rid] = ks
        return ks[i] if i < len(ks) else ("unknown block", rid, i)

    items: list[Item] = []
    for step, log in result.events or ():
        for entry in log:
            if entry[0] == "stored" and len(entry) == 6:  # a hybrid model's group (hybrid.py): the key is (hash, group)
                _, rid, _, hashes, g, indices = entry
                for h, i in zip(hashes, indices):
                    key = (key_of(rid, i), g)
                    internal_to_key[(h, g)] = key
                    items.append(Item("stored", key, f"step {step}, group {g}", rid, i))
            elif entry[0] == "stored":
                _, rid, first, hashes = entry
                for k, h in enumerate(hashes):
                    key = key_of(rid, first + k)
                    internal_to_key[h] = key
                    items.append(Item("stored", key, f"step {step}", rid, first + k))
            else:
                _, h, owner = entry
                items.append(Item("removed", internal_to_key.get(h, ("unknown", h)), f"step {step}", owner))
    return items


def server_items(stream: EventStream, block_size: int, mode: str, groups: bool = False) -> tuple[list[Item], list[str], int]:
    """The server's events as items; events of another block size are left out, and of a KV
    cache group other than 0 unless `groups` (a hybrid simulation: each key is then (hash, group))."""
    items: list[Item] = []
    notes: list[str] = []
    skipped = 0
    content: dict[object, object] = {}  # server hash -> content key (mode "content")
    for batch in stream.batches:
        for k, ev in enumerate(batch.events):
            where = f"message {batch.seq}, event {k}"
            if isinstance(ev, AllBlocksCleared):
                items.append(Item("cleared", None, where, seq=batch.seq))
                continue
            g = ev.group_idx or 0
            if g and not groups:
                skipped += 1
                if skipped == 1:
                    notes.append(f"{where}: an event of KV cache group {ev.group_idx}; only group 0 (full attention) is simulated, such events are left out")
                continue
            if isinstance(ev, BlockStored):
                if ev.block_size != block_size:
                    skipped += 1
                    notes.append(f"{where}: a BlockStored of {ev.block_size}-token blocks; the simulation's blocks hold {block_size}; left out")
                    continue
                if mode == "content" and len(ev.token_ids) > len(ev.block_hashes) * block_size and not any("covers more" in n for n in notes):
                    notes.append(f"{where}: a BlockStored (group {g}) covers more blocks than it hashes (a sliding window's); "
                                 "by token content its blocks cannot be told apart, so such items may not match")
                parent = content.get(_norm(ev.parent_block_hash)) if ev.parent_block_hash is not None else None
                if ev.parent_block_hash is not None and parent is None and mode == "content":
                    parent = ("unseen parent", _norm(ev.parent_block_hash))
                for i, h in enumerate(ev.block_hashes):
                    h = _norm(h)
                    if mode == "content":
                        extra = ev.extra_keys[i] if ev.extra_keys and i < len(ev.extra_keys) else None
                        parent = hash((parent, tuple(ev.token_ids[i * block_size:(i + 1) * block_size]),
                                       tuple(extra) if extra else None))
                        content[h] = parent
                        items.append(Item("stored", (parent, g) if groups else parent, where, seq=batch.seq))
                    else:
                        items.append(Item("stored", (h, g) if groups else h, where, seq=batch.seq))
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    h = _norm(h)
                    key = content.get(h, ("unseen", h)) if mode == "content" else h
                    items.append(Item("removed", (key, g) if groups else key, where, seq=batch.seq))
    return items, notes, skipped


def _show(key) -> str:
    if isinstance(key, int):
        return f"{key:#018x}"
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], int) and isinstance(key[1], int):
        return f"{key[0]:#018x} (group {key[1]})"
    return str(key)


def compare(result, trace, stream: EventStream, block_size: int, settings: dict | None = None) -> Comparison:
    """`settings`: the simulation's num_blocks, max_num_batched_tokens, max_num_seqs, for the
    hints of a divergence (`Comparison.likely`)."""
    algo = trace.header.hash_algo if trace.header is not None else "sha256"
    mode = "hash" if algo in HASH_ALGOS and not trace.lora else "content"
    notes = []
    if mode == "content":
        notes.append(f"compared by token content: the trace's hashing ({algo}{', LoRA' if trace.lora else ''}) is not reproduced here")
    groups = hasattr(result.policy, "groups")
    pred = predicted_items(result, trace, block_size, mode)
    serv, more, skipped = server_items(stream, block_size, mode, groups)
    if mode == "hash" and not trace.given_hashes:
        p_stored = {i.key for i in pred if i.kind == "stored"}
        s_stored = {i.key for i in serv if i.kind == "stored"}
        if p_stored and s_stored and not p_stored & s_stored:
            mode = "content"
            notes.append("no predicted block hash is one the server stored: its NONE_HASH seed or hash algorithm differs "
                         "(PYTHONHASHSEED, --prefix-caching-hash-algo); compared by token content instead")
            pred = predicted_items(result, trace, block_size, mode)
            serv, more, skipped = server_items(stream, block_size, mode, groups)
    notes += more
    agree = 0
    for a, b in zip(pred, serv):
        if (a.kind, a.key) != (b.kind, b.key):
            break
        agree += 1
    same = Counter((i.kind, i.key) for i in pred) == Counter((i.kind, i.key) for i in serv)
    divergence = None
    if agree < max(len(pred), len(serv)):
        a = pred[agree] if agree < len(pred) else None
        b = serv[agree] if agree < len(serv) else None
        owner = {}
        for i in pred:
            if i.kind == "stored":
                owner.setdefault(i.key, (i.request, i.block))
        def side(item, is_pred):
            if item is None:
                return {"did": "nothing more" + (" (the prediction ends here)" if is_pred else " (the server's events end here)")}
            doc = {"did": f"Block{item.kind.capitalize()}" if item.kind != "cleared" else "AllBlocksCleared", "hash": _show(item.key), "where": item.where}
            rid, blk = (item.request, item.block) if is_pred else owner.get(item.key, (None, None))
            if rid is not None:
                doc["request"] = rid
                if blk is not None:
                    doc["block"] = blk
            return doc
        divergence = {"item": agree, "pagetrace": side(a, True), "server": side(b, False)}
        gap_items = _items_before_gaps(stream, serv)
        cut = next((p for p in stream.problems if p.endswith("reading stopped there")), None)
        if b is None and cut is not None:
            divergence["reason"] = f"the server's events end early: {cut}"
        elif gap_items is not None and agree >= gap_items:
            divergence["reason"] = "messages are missing from the server's stream here (a sequence gap)"
        elif trace.header is not None and trace.header.source.get("sequential") is False:
            divergence["reason"] = ("the trace was recorded with requests sent concurrently: its arrival steps are estimated "
                                    "from send times, and which requests the server's steps took depended on when they reached it; "
                                    f"the two agree on the first {agree} events")
        elif same:
            divergence["reason"] = ("the same blocks were stored and removed in another order: the server's schedule depended "
                                    "on timing (when requests arrived between its steps), which the trace's arrival steps only estimate")
    likely = []
    if divergence is not None:
        from .likely import likely_differences

        likely = likely_differences(pred, serv, agree, stream, trace, block_size, settings or {}, result.steps)
    return Comparison(mode, len(pred), len(serv), agree, same, divergence, notes, skipped, likely)


def _items_before_gaps(stream: EventStream, serv: list[Item]) -> int | None:
    if not stream.gaps:
        return None
    first_missing = stream.gaps[0][0]
    return sum(1 for item in serv if item.seq < first_missing)
