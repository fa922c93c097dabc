"""More of `check`'s records, field by field and word for word: a query_start_loc off by
one or running backwards (only the query records: the per-token checks would read the wrong
rows), a request with no new tokens, an index tensor of the wrong dtype, two bad entries in
one table row, a wrong position, and new tokens past a short table. The hand bundle of
tests/bundles.py: vllm-cpu, blocks of 4, tables a [3, 5, 1], b [3, 5, 4]; a prefills tokens
0-10 (rows 0-10), b decodes token 9 (row 11, slot 17); rows 12, 13 are padding."""

from __future__ import annotations

import torch
from test_bundle_documents import FIELDS, byte_of, cache, violations

from bundles import edit_step, write_bundle as hand_bundle
from pagetrace.engines.export import write_bundle

BS = 4


def records(capsys, path, *extra):
    code, found = violations(capsys, path, "--no-data", *extra)
    return code, [tuple(v[k] for k in FIELDS) for v in found]


def test_a_query_start_loc_one_row_late_gives_only_the_query_record(tmp_path, capsys):
    """Every offset one too far (an off-by-one in the engine): rows 1-11 read as a's, 12 as b's.
    Their slots and positions are not those tokens', but check says only what is wrong."""
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t.update(query_start_loc=torch.tensor([1, 12, 13], dtype=torch.int32),
                                       positions=torch.cat([torch.tensor([0]), t["positions"]])))
    assert records(capsys, path) == (1, [("query", None, None, None, None, None, None, "query_start_loc starts at 1, not 0")])


def test_a_query_start_loc_running_past_the_rows_and_back(tmp_path, capsys):
    """[0, 15, 12]: a would have 15 new tokens, b -3; the last offset, 12, is within the 14 rows."""
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["query_start_loc"].__setitem__(1, 15))
    assert records(capsys, path) == (1, [
        ("query", "a", None, None, None, None, None, "15 new tokens but seq_len 11"),
        ("query", "b", None, None, None, None, None, "query_start_loc decreases at request 1: 15 then 12")])


def test_a_request_with_no_new_tokens_is_no_violation(tmp_path, capsys):
    """Request 0 is in the batch with nothing to compute this step (query_start_loc 0, 0, 1)."""
    raw = cache("flashinfer")
    path = write_bundle(tmp_path / "b", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=[[3, 5], [1]], seq_lens=[6, 3], query_lens=[0, 1])
    assert records(capsys, path) == (0, [])  # replayed in test_replay_requests.py


def test_an_index_tensor_of_the_wrong_dtype(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t.update(slot_mapping=t["slot_mapping"].int(), seq_lens=t["seq_lens"].long()))
    assert records(capsys, path) == (1, [
        ("dtype", None, None, None, None, None, None, "seq_lens is int64; the kernels read int32"),
        ("dtype", None, None, None, None, None, None, "slot_mapping is int32; the kernels read int64")])


def test_two_bad_entries_in_one_row_are_both_reported(tmp_path, capsys):
    """b's logical block 0 on block 6 (outside the pool 0..5), its block 1 on block 2 (in the
    pool, not stored): the second is found after the first."""
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: (t["block_table"].__setitem__((1, 0), 6), t["block_table"].__setitem__((1, 1), 2)))
    assert records(capsys, path) == (1, [
        ("pool", "b", 0, 0, 6, 24, None, "logical block 0 maps to physical block 6, outside the pool 0..5"),
        ("stored", "b", 4, 1, 2, 8, byte_of(8), "logical block 1 maps to physical block 2, whose page the bundle did not store")])


def test_a_wrong_position_word_for_word(tmp_path, capsys):
    path = hand_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["positions"].__setitem__(3, 7))
    assert records(capsys, path) == (1, [
        ("position", "a", 3, 0, 3, 15, byte_of(15), "positions[3] = 7; new token 3 of a 11-token sequence is at 3")])


def test_new_tokens_past_a_short_table_still_have_their_positions_checked(tmp_path, capsys):
    """seq_len 10 needs 3 blocks of 4, the row has 2: new tokens 8 and 9 both lie past it;
    token 9's position is wrong too."""
    raw = cache("flashinfer")
    path = write_bundle(tmp_path / "b", engine="mine", layout="flashinfer", cache=raw, block_size=BS, num_heads=4,
                        tables=[[3, 5]], seq_lens=[10], query_lens=[2], slot_mapping=[5 * BS + 2, 5 * BS + 3])
    edit_step(path, lambda t: t["positions"].__setitem__(1, 4))
    code, found = records(capsys, path)
    assert code == 1 and found == [
        ("capacity", "0", 9, 2, -1, None, None, "seq_len 10 needs 3 blocks of 4; the row has 2 entries, 3 counted"),
        ("position", "0", 9, 2, None, None, None, "positions[1] = 4; new token 1 of a 10-token sequence is at 9")], found
