"""The invariants of one engine step's paged metadata, each violation named to the byte.

What is checked (the failures behind vLLM issues 5376, 8230, 6976, 24430 and PR 9532:
illegal memory accesses and silent corruption from a bad block table or slot mapping
with prefix caching or chunked prefill on):

    dtype       index tensors have the dtypes the kernels read (int32; slot_mapping int64)
    query       query_start_loc starts at 0, never decreases, ends at the token count;
                no request has more new tokens than tokens; slot_mapping padding is padding
    capacity    each seq_len fits its row of the block table
    pool        every table entry a visible token needs lies inside the pool
    stored      the bundle stored the page of every table entry the tokens need
    null        no visible token lies on the null block (outside a sliding window it may)
    slot        slot_mapping[i] = table[pos // bs] * bs + pos % bs for every new token
    position    positions[i] = seq_len - query_len + k, the k-th new token of its request
    collision   no two new tokens write one slot
    sharing     a physical block appears twice only where the manifest allows: never within
                one request; across requests only for prefix caching's full blocks, at the
                same logical block
    data        (when the step stored the new K/V) the cache read through the layout holds
                each new token's key and value at its slot: this is what catches a wrong layout

Everything but `data` is plain Python over the bundle's index tensors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from .bundle import Manifest, Step
from .views import pool_views

WANT_DTYPES = {"query_start_loc": "int32", "seq_lens": "int32", "block_table": "int32", "slot_mapping": "int64"}


@dataclass(slots=True)
class Violation:
    check: str
    step: int
    message: str
    request: str | None = None
    token: int | None = None  # position in the request's sequence
    logical_block: int | None = None
    physical_block: int | None = None
    slot: int | None = None
    byte: int | None = None  # of the key's element 0 (KV head 0) in the engine's cache
    layer: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


class Violations(list):
    """`check_step`'s findings: a list of Violation that shows itself as a table in a notebook."""

    def _repr_html_(self) -> str:
        from ..views.notebook import violations_html

        return violations_html(self)


class Checker:
    def __init__(self, manifest: Manifest, step: Step) -> None:
        self.m, self.s = manifest, step
        self.geom = manifest.geometry()
        self.found: list[Violation] = []

    def add(self, check: str, message: str, r: int | None = None, token: int | None = None, physical: int | None = None, slot: int | None = None, layer: int | None = None) -> None:
        bs = self.m.block_size
        logical = None if token is None else token // bs
        if physical is None and r is not None and logical is not None and logical < len(self.s.block_table[r]):
            physical = self.s.block_table[r][logical]
        if slot is None and physical is not None and physical >= 0 and token is not None:
            slot = physical * bs + token % bs  # (a negative entry is no block: no slot)
        byte = None  # of the record's slot: where the key's element 0 of KV head 0 lies
        if slot is not None and 0 <= slot < self.m.num_blocks * bs:
            byte = self.geom.element("key", slot // bs, slot % bs, 0, 0) * self.geom.element_size
        request = None if r is None else self.s.requests[r]
        self.found.append(Violation(check, self.s.step, message, request, token, logical, physical, slot, byte, layer))

    def run(self) -> list[Violation]:
        self.dtypes()
        self.query_ok = self.query()
        if self.query_ok:  # the per-token checks index rows by query_start_loc
            self.tables()
            self.slots()
            self.sharing()
        return self.found

    def dtypes(self) -> None:
        for name, want in WANT_DTYPES.items():
            got = self.s.dtypes.get(name)
            if got != want:
                self.add("dtype", f"{name} is {got}; the kernels read {want}")

    def query(self) -> bool:
        s = self.s
        qsl = s.query_start_loc
        ok = True
        if qsl[0] != 0:
            self.add("query", f"query_start_loc starts at {qsl[0]}, not 0")
            ok = False
        for r in range(len(s.requests)):
            qlen = qsl[r + 1] - qsl[r]
            if qlen < 0:
                self.add("query", f"query_start_loc decreases at request {r}: {qsl[r]} then {qsl[r + 1]}", r)
                ok = False
            elif qlen > s.seq_lens[r]:
                self.add("query", f"{qlen} new tokens but seq_len {s.seq_lens[r]}", r)
                ok = False
        if qsl[-1] > len(s.slot_mapping):
            self.add("query", f"query_start_loc ends at {qsl[-1]}, past the step's {len(s.slot_mapping)} token rows")
            ok = False
        for i in range(qsl[-1], len(s.slot_mapping)):
            if s.slot_mapping[i] != self.m.slot_padding:
                self.add("query", f"slot_mapping[{i}] = {s.slot_mapping[i]} past the {qsl[-1]} real tokens; padding is {self.m.slot_padding}", slot=s.slot_mapping[i])
        return ok

    def visible(self, r: int, logical: int) -> bool:
        """Whether any of the request's new tokens attends to a token of this logical block.

        With a window w the first new token, at p = seq_len - query_len, sees the most:
        keys p - w + 1..p. vLLM frees blocks by that token's window too (the next token to
        compute: vllm/v1/core/single_type_kv_cache_manager.py
        `SlidingWindowManager.get_num_skipped_tokens`, num_computed_tokens - w + 1 skipped).
        A request without new tokens is judged by its last token's window."""
        window = self.m.sliding_window
        if window is None:
            return True
        qsl = self.s.query_start_loc
        first = self.s.seq_lens[r] - max(qsl[r + 1] - qsl[r], 1)
        return (logical + 1) * self.m.block_size > first - window + 1

    def tables(self) -> None:
        s, bs = self.s, self.m.block_size
        stored = set(s.blocks)
        for r, (seq_len, row) in enumerate(zip(s.seq_lens, s.block_table)):
            need = -(-seq_len // bs)
            if need > len(row) or need > s.block_counts[r]:
                self.add("capacity", f"seq_len {seq_len} needs {need} blocks of {bs}; the row has {len(row)} entries, {s.block_counts[r]} counted", r, seq_len - 1, physical=-1)
            for logical in range(min(need, len(row))):
                physical = row[logical]
                token = logical * bs
                if not 0 <= physical < self.m.num_blocks:
                    self.add("pool", f"logical block {logical} maps to physical block {physical}, outside the pool 0..{self.m.num_blocks - 1}", r, token)
                    continue
                if physical not in stored:  # a bundle stores every block its tables use (engines/bundle.py)
                    self.add("stored", f"logical block {logical} maps to physical block {physical}, whose page the bundle did not store", r, token)
                if physical == self.m.null_block and self.visible(r, logical):
                    self.add("null", f"logical block {logical} (tokens {token}..{min(token + bs, seq_len) - 1}) is on the null block {physical}", r, token)

    def slots(self) -> None:
        s, bs = self.s, self.m.block_size
        writers: dict[int, tuple[int, int]] = {}
        for r in range(len(s.requests)):
            start, end = s.query_start_loc[r], s.query_start_loc[r + 1]
            first = s.seq_lens[r] - (end - start)
            row = s.block_table[r]
            for k, i in enumerate(range(start, end)):
                pos = first + k
                if s.positions[i] != pos:
                    self.add("position", f"positions[{i}] = {s.positions[i]}; new token {k} of a {s.seq_lens[r]}-token sequence is at {pos}", r, pos)
                logical = pos // bs
                if logical >= len(row):
                    continue  # reported by the capacity check
                want = row[logical] * bs + pos % bs
                got = s.slot_mapping[i]
                if got != want:
                    self.add("slot", f"slot_mapping[{i}] = {got}; block table gives {row[logical]} x {bs} + {pos % bs} = {want}", r, pos, physical=row[logical], slot=got)
                if got in writers and got != self.m.slot_padding:
                    other, other_pos = writers[got]
                    self.add("collision", f"slot {got} is written by request {s.requests[other]} token {other_pos} too", r, pos, physical=got // bs, slot=got)
                writers[got] = (r, pos)

    def sharing(self) -> None:
        s, bs = self.s, self.m.block_size
        owners: dict[int, list[tuple[int, int]]] = defaultdict(list)
        for r, (seq_len, row) in enumerate(zip(s.seq_lens, s.block_table)):
            for logical in range(min(-(-seq_len // bs), len(row))):
                if row[logical] != self.m.null_block:
                    owners[row[logical]].append((r, logical))
        for physical, users in sorted(owners.items()):
            holders: dict[int, int] = {}  # request -> its first logical block on this physical block
            for r, logical in users:
                if r in holders:
                    self.add("sharing", f"physical block {physical} is logical blocks {holders[r]} and {logical} of one request", r, logical * bs, physical=physical)
                holders.setdefault(r, logical)
            if len(holders) < 2:
                continue
            (r0, l0), *rest = holders.items()
            for r, logical in rest:
                where = f"physical block {physical} is logical block {logical} of request {s.requests[r]} and {l0} of request {s.requests[r0]}"
                if self.m.sharing == "none":
                    self.add("sharing", f"{where}, but this engine shares no blocks (no prefix caching)", r, logical * bs, physical=physical)
                elif logical != l0:
                    self.add("sharing", f"{where}: a prefix-cached block is the same logical block in every request", r, logical * bs, physical=physical)
                else:
                    for rr in (r0, r):
                        if (logical + 1) * bs > s.seq_lens[rr]:
                            self.add("sharing", f"{where}: only full blocks are shared, and request {s.requests[rr]} fills {s.seq_lens[rr] - logical * bs} of {bs} slots", rr, logical * bs, physical=physical)

    def data(self, layer: int, tensors: dict) -> None:
        """The new tokens' K and V, read back through the layout, equal what the layer wrote."""
        if "new_key" not in tensors:
            return
        s, bs = self.s, self.m.block_size
        key, value, compact = pool_views(self.m, self.s, tensors)
        for r in range(len(s.requests)):
            start, end = s.query_start_loc[r], s.query_start_loc[r + 1]
            first = s.seq_lens[r] - (end - start)
            for k, i in enumerate(range(start, end)):
                slot = s.slot_mapping[i]
                if slot < 0 or slot // bs not in compact:
                    continue
                b, o = compact[slot // bs], slot % bs
                for which, view, new in (("key", key, tensors["new_key"]), ("value", value, tensors["new_value"])):
                    diff = float((view[b, o].float() - new[i].float()).abs().max())
                    if not diff == 0.0:
                        self.add("data", f"layer {layer}: the {which} written for this token is not at slot {slot} through the '{self.m.layout.name}' layout (max |diff| {diff:.3g})", r, first + k, physical=slot // bs, slot=slot, layer=layer)
                        break


def check_step(manifest: Manifest, step: Step, data_layers: dict[int, dict] | None = None) -> Violations:
    """All violations of one step; `data_layers` (layer -> its tensors) adds the data check."""
    checker = Checker(manifest, step)
    checker.run()
    if step.ring:  # the metadata ring keeps no page by design: nothing to find stored
        checker.found = [v for v in checker.found if v.check != "stored"]
    for layer, tensors in (data_layers or {}).items() if checker.query_ok else ():
        checker.data(layer, tensors)
    return Violations(checker.found)
