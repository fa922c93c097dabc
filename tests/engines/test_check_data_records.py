"""`check`'s data records where the slot is not the table's: a token written into another
request's slot (the record names the slot the engine wrote, and that slot's block), and a
token written to a block the bundle did not store (skipped: the tokens after it are still
read back). The hand bundle of tests/bundles.py: vllm-cpu, blocks of 4, tables a [3, 5, 1],
b [3, 5, 4]; a prefills tokens 0-10 (rows 0-10), b decodes token 9 (row 11, slot 17)."""

from __future__ import annotations

from safetensors.torch import load_file
from test_bundle_documents import FIELDS, byte_of, violations

from bundles import edit_step, write_bundle as hand_bundle


def test_a_token_written_into_another_requests_slot(tmp_path, capsys):
    """b's token 9 written at slot 20, a's token 4 (block 5, offset 0): the cache there holds
    a's key, not b's: the data record names slot 20 and block 5, not the table's 17 and 4."""
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["slot_mapping"].__setitem__(11, 20))
    new_key = load_file(str(path / "step-0000.safetensors"))["layer0.new_key"]
    diff = float((new_key[4] - new_key[11]).abs().max())  # what slot 20 holds (a's token 4) against b's key
    code, found = violations(capsys, path)
    assert code == 1 and [tuple(v[k] for k in FIELDS) for v in found] == [
        ("slot", "b", 9, 2, 4, 20, byte_of(20), "slot_mapping[11] = 20; block table gives 4 x 4 + 1 = 17"),
        ("collision", "b", 9, 2, 5, 20, byte_of(20), "slot 20 is written by request a token 4 too"),
        ("data", "b", 9, 2, 5, 20, byte_of(20), f"layer 0: the key written for this token is not at slot 20 through the 'vllm-cpu' layout (max |diff| {diff:.3g})"),
    ], found
    assert found[-1]["layer"] == 0


def test_a_slot_on_a_block_not_stored_is_skipped_and_the_next_tokens_read(tmp_path, capsys):
    """a's token 3 written at slot 8 (block 2: no table holds it, the bundle did not store
    it, so there is nothing to read back); a's token 5 (block 5, slot 21) wrote a key one off."""
    path = hand_bundle(tmp_path / "b")

    def edit(t):
        t["slot_mapping"][3] = 8
        t["layer0.new_key"][5] += 1.0

    edit_step(path, edit)
    assert 2 not in load_file(str(path / "step-0000.safetensors"))["blocks"].tolist()
    code, found = violations(capsys, path)
    assert code == 1 and [tuple(v[k] for k in FIELDS) for v in found] == [
        ("slot", "a", 3, 0, 3, 8, byte_of(8), "slot_mapping[3] = 8; block table gives 3 x 4 + 3 = 15"),
        ("data", "a", 5, 1, 5, 21, byte_of(21), "layer 0: the key written for this token is not at slot 21 through the 'vllm-cpu' layout (max |diff| 1)"),
    ], found
