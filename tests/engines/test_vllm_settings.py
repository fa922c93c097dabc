"""The server plugin's settings parsed in-process (engines/vllm_plugin.py, no vLLM): every
PAGETRACE_* value a user writes, read back or refused word for word, at its boundaries
(step 0, a range of one step, an open range, layer 0, a ring of exactly the smallest step).
test_vllm_plugin.py runs the same refusals through the entry point in a fresh process."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from pagetrace.engines.vllm_plugin import DEFAULT_RING_MIB, Settings, parse_layers, parse_plants, parse_steps
from pagetrace.errors import UsageError


def refusal(call) -> str:
    with pytest.raises(UsageError) as caught:
        call()
    return str(caught.value)


@pytest.mark.parametrize("text,steps", [
    ("0", [(0, 0)]),
    ("5-5", [(5, 5)]),  # a range of one step
    ("0-", [(0, None)]),
    (" 3 - 4 ,7", [(3, 4), (7, 7)]),
    ("10-20,2", [(10, 20), (2, 2)]),  # kept in the order written
])
def test_steps_are_numbers_and_ranges(text, steps):
    assert parse_steps(text) == steps


@pytest.mark.parametrize("text,said", [
    ("x", "'x' is not a step or a range: write N, N-M or N- (steps count from 0)"),
    ("1,,2", "'' is not a step or a range: write N, N-M or N- (steps count from 0)"),
    ("-3", "'-3' is not a step or a range: write N, N-M or N- (steps count from 0)"),  # '-' splits first: no first step
    ("3-x", "'3-x' is not a step or a range: write N, N-M or N- (steps count from 0)"),
    ("5-4", "'5-4': a range runs from its first step to its last, both 0 or more"),  # one below the first
    ("0-9, 10-2", "'10-2': a range runs from its first step to its last, both 0 or more"),
])
def test_bad_steps_are_refused_naming_the_part(text, said):
    assert refusal(lambda: parse_steps(text)) == f"invalid value for PAGETRACE_STEPS: {text!r}: {said}"


def test_layers_are_sorted_and_distinct_and_may_be_layer_zero():
    assert parse_layers("3,0,3, 1") == [0, 1, 3]
    assert parse_layers("0") == [0]
    assert refusal(lambda: parse_layers("0,a")) == "invalid value for PAGETRACE_LAYERS: '0,a': name attention layer indices, comma-separated (0,1)"
    assert refusal(lambda: parse_layers("1,-1")) == "invalid value for PAGETRACE_LAYERS: '1,-1': layer indices are 0 or more"


def metadata():
    return SimpleNamespace(block_table=torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]]), slot_mapping=torch.tensor([40, 41, 80]),
                           seq_lens=torch.tensor([33, 18]))


def test_plants_edit_the_named_entry_and_undo_it():
    plants = parse_plants("3:table:1:0:9, 3:slot:2:-3,7:table:0:last:6")
    assert sorted(plants) == [3, 7] and [len(plants[3]), len(plants[7])] == [2, 1]
    md = metadata()
    undo = [edit(md) for edit in plants[3]]
    assert md.block_table.tolist() == [[1, 2, 3, 0], [9, 5, 0, 0]] and md.slot_mapping.tolist() == [40, 41, 77]
    for u in reversed(undo):
        u()
    assert md.block_table.tolist() == [[1, 2, 3, 0], [4, 5, 0, 0]] and md.slot_mapping.tolist() == [40, 41, 80]
    # `last`: the row's last used block, where its newest token (32, with blocks of 16 outside a server) goes
    undo = plants[7][0](md)
    assert md.block_table.tolist()[0] == [1, 2, 6, 0]
    undo()
    md.seq_lens[0] = 32  # token 31 is the last of logical block 1
    plants[7][0](md)
    assert md.block_table.tolist()[0] == [1, 6, 3, 0]


@pytest.mark.parametrize("text,part", [
    ("3:table:1:0", "3:table:1:0"),  # a table edit needs 5 fields
    ("3:table:1:0:9:1", "3:table:1:0:9:1"),
    ("3:slot:1", "3:slot:1"),
    ("3:slot:1:+1:2", "3:slot:1:+1:2"),
    ("3:row:1:1", "3:row:1:1"),
    ("x:slot:1:1", "x:slot:1:1"),
    ("3", "3"),
    ("3:slot:0:1,4:table:0:first:1", "4:table:0:first:1"),  # the part that is wrong
])
def test_bad_plants_are_refused_naming_the_part(text, part):
    assert refusal(lambda: parse_plants(text)) == (f"invalid value for PAGETRACE_GUARD_PLANT: {text!r}: {part!r}: "
                                                   "write STEP:table:ROW:LOGICAL:BLOCK or STEP:slot:INDEX:DELTA")


def test_settings_read_back_every_value(tmp_path):
    env = {"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_GUARD": "raise", "PAGETRACE_STEPS": "0-2,9", "PAGETRACE_LAYERS": "1,0",
           "PAGETRACE_REQUESTS": " cmpl-a , ,cmpl-b", "PAGETRACE_RING_MIB": "0.5", "PAGETRACE_GUARD_PLANT": "4:slot:0:1"}
    s = Settings.from_env(env)
    assert (s.capture, s.guard, s.steps, s.layers, s.requests, s.ring_mib, s.steps_text) == (
        str(tmp_path / "b"), "raise", [(0, 2), (9, 9)], [0, 1], ["cmpl-a", "cmpl-b"], 0.5, "0-2,9")
    assert sorted(s.plants) == [4] and len(s.plants[4]) == 1
    assert s.words() == f"guard raise, capture to {tmp_path / 'b'} (steps 0-2,9, layers 0,1, requests cmpl-a,cmpl-b, ring 0.5 MiB)"


def test_pages_flagged_keeps_the_metadata_ring_at_its_smallest_bound(tmp_path):
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_PAGES": "flagged", "PAGETRACE_RING_MIB": "0.0625",
                           "PAGETRACE_GUARD": "report"})
    assert (s.pages, s.ring_mib) == ("flagged", 0.0625)
    assert s.words() == f"guard report, capture to {tmp_path / 'b'} (pages of the flagged steps, layers all, metadata ring 0.0625 MiB)"
    assert s.problem_with(config()) is None  # 0.0625 MiB is far below a page-carrying step of this model: no pages to hold
    assert Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b")}).pages == "all"
    assert Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": "0.0625"}).problem_with(config(block_size=4096)) is not None


def test_settings_defaults(tmp_path):
    s = Settings.from_env({"PAGETRACE_GUARD": "report"})
    assert (s.capture, s.guard, s.steps, s.layers, s.requests, s.ring_mib, s.plants, s.steps_text) == (None, "report", None, None, None, 256.0, {}, None)
    assert DEFAULT_RING_MIB == 256.0 and s.words() == "guard report, no capture"
    empty = {"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_GUARD": "", "PAGETRACE_STEPS": "", "PAGETRACE_LAYERS": "", "PAGETRACE_REQUESTS": "",
             "PAGETRACE_RING_MIB": "", "PAGETRACE_GUARD_PLANT": ""}  # set but empty: as if unset
    s = Settings.from_env(empty)
    assert (s.guard, s.steps, s.layers, s.requests, s.ring_mib, s.plants) == (None, None, None, None, 256.0, {})
    assert s.words() == f"no guard, capture to {tmp_path / 'b'} (steps all, layers all, ring 256 MiB)"
    assert Settings.from_env({"PAGETRACE_CAPTURE": "b.bundle"}).capture == "b.bundle"  # in the current folder


@pytest.mark.parametrize("env,said", [
    ({"PAGETRACE_GUARD": "stop"}, "invalid value for PAGETRACE_GUARD: 'stop': choose raise (stop the step), report (make it safe, log and go on) or abort (as report, "
                                 "and fail the affected requests)"),
    ({"PAGETRACE_GUARD": "report", "PAGETRACE_REQUESTS": " , "}, "invalid value for PAGETRACE_REQUESTS: ' , ': name request ids, comma-separated"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "lots"}, "invalid value for PAGETRACE_RING_MIB: 'lots': must be a number of MiB (e.g. 256)"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "0"}, "invalid value for PAGETRACE_RING_MIB: '0': must be a positive number of MiB"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "-1"}, "invalid value for PAGETRACE_RING_MIB: '-1': must be a positive number of MiB"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "nan"}, "invalid value for PAGETRACE_RING_MIB: 'nan': must be a positive number of MiB"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "inf"}, "invalid value for PAGETRACE_RING_MIB: 'inf': must be a positive number of MiB"),
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_STEPS": "1"}, "invalid value for PAGETRACE_STEPS: '1': chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too"),
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_LAYERS": "0"}, "invalid value for PAGETRACE_LAYERS: '0': chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too"),
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_REQUESTS": "a"}, "invalid value for PAGETRACE_REQUESTS: 'a': chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too"),
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_RING_MIB": "8"}, "invalid value for PAGETRACE_RING_MIB: '8': chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_GUARD_PLANT": "3:slot:0:1"},
     "invalid value for PAGETRACE_GUARD_PLANT: '3:slot:0:1': plants bugs for the guard to find; set PAGETRACE_GUARD too"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_PAGES": "some"},
     "invalid value for PAGETRACE_PAGES: 'some': choose all (every kept step with its cache pages) or flagged (pages only for the steps the guard "
     "flags and on SIGUSR1; every step's metadata in the ring)"),
    ({"PAGETRACE_GUARD": "report", "PAGETRACE_PAGES": "flagged"},
     "invalid value for PAGETRACE_PAGES: 'flagged': chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_PAGES": "flagged", "PAGETRACE_STEPS": "0-9"},
     "invalid value for PAGETRACE_STEPS: '0-9': chooses which steps keep their pages; with PAGETRACE_PAGES=flagged only the guard and SIGUSR1 choose"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_PAGES": "flagged", "PAGETRACE_RING_MIB": "0.0624"},
     "invalid value for PAGETRACE_RING_MIB: '0.0624': the metadata ring needs at least 0.0625 MiB (64 KiB); 1 MiB holds thousands of decode steps of 256 requests (bench/README.md)"),
    ({"PAGETRACE_CAPTURE": "{tmp}/taken"}, "invalid value for PAGETRACE_CAPTURE: '{tmp}/taken': already exists; choose a new bundle folder"),
    ({"PAGETRACE_CAPTURE": "{tmp}/link"}, "invalid value for PAGETRACE_CAPTURE: '{tmp}/link': already exists; choose a new bundle folder"),
    ({"PAGETRACE_CAPTURE": "{tmp}/tp"},
     "invalid value for PAGETRACE_CAPTURE: '{tmp}/tp': tp.rank0 already exists beside it (a rank's bundle); choose a new bundle folder"),
    ({"PAGETRACE_CAPTURE": "{tmp}/no/b"}, "invalid value for PAGETRACE_CAPTURE: '{tmp}/no/b': its folder '{tmp}/no' does not exist"),
    ({"PAGETRACE_CAPTURE": "{tmp}/file/b"}, "invalid value for PAGETRACE_CAPTURE: '{tmp}/file/b': its folder '{tmp}/file' does not exist"),
])
def test_bad_settings_are_refused_in_one_line(tmp_path, env, said):
    (tmp_path / "taken").mkdir()
    (tmp_path / "tp.rank0").mkdir()
    (tmp_path / "tp.rank1").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    assert refusal(lambda: Settings.from_env(env)) == said.format(tmp=tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_capture_into_a_folder_it_cannot_write_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        assert refusal(lambda: Settings.from_env({"PAGETRACE_CAPTURE": str(ro / "b")})) == (
            f"invalid value for PAGETRACE_CAPTURE: {str(ro / 'b')!r}: its folder {str(ro)!r} is not writable")
    finally:
        ro.chmod(0o700)


def config(layers=2, block_size=16, dtype=torch.bfloat16):
    """What problem_with reads of vLLM's VllmConfig: 8 query heads on 2 KV heads of 64 dims."""
    mc = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=layers), dtype=dtype,
                         get_num_attention_heads=lambda pc: 8, get_num_kv_heads=lambda pc: 2, get_head_size=lambda: 64)
    return SimpleNamespace(model_config=mc, parallel_config=None, cache_config=SimpleNamespace(block_size=block_size))


def test_the_smallest_step_counted_by_hand(tmp_path):
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b")})
    # per layer: a page of K and V, 16 slots x 2 KV heads x 64 dims x 2 bytes each (8,192), and one token's
    # query and output (8 heads) and new K, V (2 heads): 20 x 64 x 2 = 2,560; the index tensors: 44 bytes
    assert s.smallest_step(3, 8, 2, 64, 16, 2) == 3 * (8192 + 2560) + 44
    assert s.smallest_step(1, 1, 1, 1, 1, 4) == (2 * 4) + (2 + 2) * 4 + 44
    s.layers = [0]  # only the kept layers count
    assert s.smallest_step(3, 8, 2, 64, 16, 2) == 8192 + 2560 + 44


def test_a_ring_of_exactly_the_smallest_step_holds_it(tmp_path, monkeypatch):
    need = 2 * (8192 + 2560) + 44
    for ring, ok in ((need / (1 << 20), True), ((need - 1) / (1 << 20), False)):
        monkeypatch.setenv("PAGETRACE_RING_MIB", repr(ring))
        s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": repr(ring)})
        problem = s.problem_with(config())
        if ok:
            assert problem is None
        else:
            assert problem == (f"invalid value for PAGETRACE_RING_MIB: {repr(ring)!r}: holds no step; the smallest step of this model "
                               f"(one token, one block per kept layer) is {need} bytes (0.0205 MiB)")
    # fp32 doubles every byte but the index tensors'
    monkeypatch.setenv("PAGETRACE_RING_MIB", repr(need / (1 << 20)))
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": repr(need / (1 << 20))})
    assert f"is {2 * (need - 44) + 44} bytes" in s.problem_with(config(dtype=torch.float32))


def test_the_last_layer_is_a_layer_and_one_past_it_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGETRACE_LAYERS", "0,1")
    assert Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_LAYERS": "0,1"}).problem_with(config()) is None
    monkeypatch.setenv("PAGETRACE_LAYERS", "2,3")
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_LAYERS": "2,3"})
    assert s.problem_with(config()) == "invalid value for PAGETRACE_LAYERS: '2,3': layer 2 does not exist; the model has layers 0..1"
    # without a capture nothing is kept: no ring to check (the guard alone)
    assert Settings.from_env({"PAGETRACE_GUARD": "raise"}).problem_with(config(layers=1)) is None


def test_the_smallest_step_counts_the_heads_of_this_rank(tmp_path, monkeypatch):
    """With tensor parallelism vLLM's model config gives each rank its share of the heads
    (`get_num_kv_heads(parallel_config)`): two ranks hold 4 query and 1 KV head each."""
    cfg = config()
    pc = SimpleNamespace(tensor_parallel_size=2)
    cfg.parallel_config = pc
    cfg.model_config.get_num_attention_heads = lambda p: 8 // p.tensor_parallel_size
    cfg.model_config.get_num_kv_heads = lambda p: 2 // p.tensor_parallel_size
    # per layer: a page of 2 x 16 x 1 x 64 x 2 = 4,096 bytes, a token's (2 x 4 + 2 x 1) x 64 x 2 = 1,280
    need = 2 * (4096 + 1280) + 44
    monkeypatch.setenv("PAGETRACE_RING_MIB", repr((need - 1) / (1 << 20)))
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": repr((need - 1) / (1 << 20))})
    assert f"is {need} bytes" in s.problem_with(cfg)


def test_a_last_block_plant_uses_the_servers_block_size(monkeypatch):
    """In a server `last` is found with the engine's block size (here 4), not the default 16."""
    import pagetrace.engines.vllm_plugin as plugin

    monkeypatch.setattr(plugin, "_SESSION", SimpleNamespace(recorder=SimpleNamespace(block_size=4)))
    md = SimpleNamespace(block_table=torch.tensor([[1, 2, 3, 0]]), slot_mapping=torch.tensor([40]), seq_lens=torch.tensor([9]))
    parse_plants("0:table:0:last:7")[0][0](md)  # token 8 is in logical block 2 of blocks of 4 (0 of blocks of 16)
    assert md.block_table.tolist() == [[1, 2, 7, 0]]
