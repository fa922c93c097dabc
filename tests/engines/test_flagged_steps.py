"""A step the guard flagged, as the server plugin writes it before the forward: the index
tensors whole (a table entry far outside the pool included), the pages of the blocks it names
that lie in the pool, no query, new K/V or output, and the guard's record in the manifest.
`check` lists its violations (not a malformed bundle), `replay` refuses it naming them and
why, `lookup --from` names the violation at the token; and the guard's plan that made the
step safe, on the engine's tensors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bundles import BS, NB, write_bundle
from conftest import cli
from pagetrace.engines import quarantine
from pagetrace.engines.check import Violation

FAR = 5_000_000


def flagged_bundle(path, entry: int = FAR):
    """write_bundle's step with request b's logical block 1 on `entry`, as the plugin keeps a flagged step."""
    path = write_bundle(path)
    file = path / "step-0000.safetensors"
    t = load_file(str(file))
    t["block_table"][1, 1] = entry
    if not 0 <= entry < NB:
        t["blocks"] = torch.cat([t["blocks"], torch.tensor([entry])])  # the recorder lists every block named; only in-pool pages are stored
    for name in ("query", "new_key", "new_value", "output"):
        del t[f"layer0.{name}"]
    save_file(t, str(file))
    m = json.loads((path / "manifest.json").read_text())
    m["steps"][0]["guard"] = {"mode": "report", "count": 1, "affected": ["b-1a2b3c4d"],
                              "made_safe": {"requests": ["b"], "table_entries": [{"row": 1, "column": 1, "was": entry}], "slots": [{"index": 11, "was": 17}]}}
    (path / "manifest.json").write_text(json.dumps(m))
    return path


def test_check_lists_the_violations_of_a_flagged_step(tmp_path, capsys):
    path = flagged_bundle(tmp_path / "b")
    code, out, err = cli(capsys, "check", str(path), "--json")
    assert code == 1, err
    step = json.loads(out)["steps"][0]
    pool = [v for v in step["violations"] if v["check"] == "pool"]
    assert [(v["request"], v["token"], v["logical_block"], v["physical_block"]) for v in pool] == [("b", 4, 1, FAR)]
    assert step["guard"]["affected"] == ["b-1a2b3c4d"]
    code, out, err = cli(capsys, "check", str(path))
    assert code == 1 and "malformed" not in out + err
    assert "flagged by the guard (report): made safe before the forward (1 table entries to the null block, 1 slots to the padding slot)" in out


@pytest.mark.parametrize("entry", [FAR, NB, -1, 0])  # far, one past the pool, negative, the null block
def test_replay_of_a_flagged_step_exits_1_naming_the_violation_and_why(tmp_path, capsys, entry):
    path = flagged_bundle(tmp_path / "b", entry)
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch")
    check = "null" if entry == 0 else "pool"
    assert code == 1 and err.startswith("pagetrace: step 0 (the guard flagged it): "), err
    assert f"{check}: request b token 4: logical block 1 " in err and "replay cannot judge attention here" in err
    assert "Traceback" not in err


def test_lookup_from_names_the_violation_at_the_token(tmp_path, capsys):
    path = flagged_bundle(tmp_path / "b", 0)  # the null block: an address inside the cache, and a violation
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "5", "--json")
    doc = json.loads(out)
    # (the hand bundle stored no page of block 0, so `stored` is named there too)
    assert code == 0 and [v["check"] for v in doc["violations"]] == ["stored", "null"], doc["violations"]
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "5")
    assert "null violation at this token (step 0): logical block 1 (tokens 4..7) is on the null block 0" in out
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "1", "--json")
    assert code == 0 and json.loads(out)["violations"] == []  # another block of the same request: no violation there
    far = flagged_bundle(tmp_path / "c")
    code, out, err = cli(capsys, "lookup", "--from", str(far), "--request", "b", "--token", "5")
    assert code == 1 and f"block_table[1] = {FAR} is outside the pool of {NB} blocks in step 0; pool violation: logical block 1 maps to physical block {FAR}" in err


# -- the plan, on the engine's tensors -------------------------------------------------------

class Meta:  # the attention metadata's fields the plan edits
    def __init__(self):
        self.block_table = torch.tensor([[3, 5, 1, 0], [3, 5, 4, 0]], dtype=torch.int32)
        self.slot_mapping = torch.tensor([12, 13, 14, 15, 20, 21, 22, 23, 4, 5, 6, 17, -1, -1], dtype=torch.int64)


def step_of(meta):
    from pagetrace.engines.bundle import Step

    return Step(step=0, file=None, requests=["a", "b"], layers=[], query_start_loc=[0, 11, 12], seq_lens=[11, 10],
                block_table=meta.block_table.tolist(), block_counts=[3, 3], slot_mapping=meta.slot_mapping.tolist(), positions=[], blocks=[])


def test_the_plan_redirects_bad_entries_of_the_named_request_and_pads_its_slots():
    meta = Meta()
    meta.block_table[1, 1] = FAR
    meta.block_table[1, 3] = -7  # an unused column outside the pool: redirected too (nothing reads it, nothing may)
    p = quarantine.plan(step_of(meta), [Violation("pool", 0, "far", request="b", token=4)], num_blocks=NB, block_size=BS)
    assert (p.rows, p.requests, p.table, p.slots, p.unsafe) == ([1], ["b"], [(1, 1, FAR), (1, 3, -7)], [(11, 17)], None)
    before = (meta.block_table.clone(), meta.slot_mapping.clone())
    undo = quarantine.apply(meta, p)
    assert meta.block_table.tolist() == [[3, 5, 1, 0], [3, 0, 4, 0]]  # request a's row untouched
    assert meta.slot_mapping.tolist() == before[1].tolist()[:11] + [-1, -1, -1]  # b's one new token writes nothing; a's as scheduled
    undo()
    assert torch.equal(meta.block_table, before[0]) and torch.equal(meta.slot_mapping, before[1])


def test_a_slot_outside_the_pool_is_padded_and_its_request_named():
    meta = Meta()
    meta.slot_mapping[3] = NB * BS  # one past the last slot: request a's token 3
    p = quarantine.plan(step_of(meta), [], num_blocks=NB, block_size=BS)
    assert p.requests == ["a"] and p.slots == [(i, int(meta.slot_mapping[i])) for i in range(11)] and p.table == []


def test_broken_query_start_loc_affects_every_request_and_pads_every_slot():
    meta = Meta()
    st = step_of(meta)
    st.query_start_loc = [0, 13, 12]
    p = quarantine.plan(st, [Violation("query", 0, "13 new tokens but seq_len 11", request="a")], num_blocks=NB, block_size=BS)
    assert p.requests == ["a", "b"] and [i for i, _ in p.slots] == list(range(12))


def test_a_seq_len_past_its_row_cannot_be_made_safe():
    meta = Meta()
    st = step_of(meta)
    st.seq_lens = [17, 10]  # 5 blocks of 4, the row has 4
    p = quarantine.plan(st, [Violation("capacity", 0, "x", request="a")], num_blocks=NB, block_size=BS)
    assert p.unsafe and "request a" in p.unsafe
