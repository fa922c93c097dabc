"""The server plugin's settings, without vLLM: off unless asked, and bad input refused in one
line at start (tests/engines/test_vllm_serve.py runs it in a real server)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from pagetrace.engines.vllm_plugin import Settings, parse_plants, parse_steps
from pagetrace.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]


def test_the_entry_point_does_nothing_and_imports_nothing_unless_asked():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    code = "import sys; import pagetrace.engines.vllm_plugin as p; p.register(); print(sorted(m for m in ('torch', 'vllm', 'safetensors', 'numpy') if m in sys.modules), len(sys.meta_path))"
    done = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("[] "), done.stderr
    plain = subprocess.run([sys.executable, "-c", "import sys; print(len(sys.meta_path))"], capture_output=True, text=True, timeout=60)
    assert done.stdout.split()[-1] == plain.stdout.strip()  # no import hook either


@pytest.mark.parametrize("env,option", [
    ({"PAGETRACE_STEPS": "0-9"}, "PAGETRACE_STEPS"),  # set alone: nothing to do
    ({"PAGETRACE_GUARD": "stop"}, "PAGETRACE_GUARD"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_STEPS": "10-5"}, "PAGETRACE_STEPS"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_STEPS": "x"}, "PAGETRACE_STEPS"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_LAYERS": "0,a"}, "PAGETRACE_LAYERS"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "0"}, "PAGETRACE_RING_MIB"),
    ({"PAGETRACE_CAPTURE": "{tmp}/b", "PAGETRACE_RING_MIB": "lots"}, "PAGETRACE_RING_MIB"),
    ({"PAGETRACE_CAPTURE": "{tmp}/exists"}, "PAGETRACE_CAPTURE"),
    ({"PAGETRACE_CAPTURE": "{tmp}/tp"}, "PAGETRACE_CAPTURE"),  # tp.rank1 is there: a rank's bundle from an earlier run
    ({"PAGETRACE_CAPTURE": "{tmp}/no/such/folder/b"}, "PAGETRACE_CAPTURE"),
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_LAYERS": "0"}, "PAGETRACE_LAYERS"),  # chooses what a capture keeps
    ({"PAGETRACE_GUARD": "raise", "PAGETRACE_GUARD_PLANT": "3:table:0"}, "PAGETRACE_GUARD_PLANT"),
    ({"PAGETRACE_TRACE": "{tmp}/exists"}, "PAGETRACE_TRACE"),  # a folder
    ({"PAGETRACE_TRACE": "{tmp}/file"}, "PAGETRACE_TRACE"),  # a file: never replaced
    ({"PAGETRACE_TRACE": "{tmp}/link"}, "PAGETRACE_TRACE"),  # a dangling link
    ({"PAGETRACE_TRACE": "{tmp}/file/trace.jsonl"}, "PAGETRACE_TRACE"),  # its folder is a file
    ({"PAGETRACE_TRACE": "{tmp}/no/such/trace.jsonl"}, "PAGETRACE_TRACE"),
    ({"PAGETRACE_TRACE_PRIVATE": "1"}, "PAGETRACE_TRACE"),  # private, but no trace
    ({"PAGETRACE_TRACE": "{tmp}/t.jsonl", "PAGETRACE_TRACE_PRIVATE": "yes"}, "PAGETRACE_TRACE_PRIVATE"),
])
def test_bad_settings_refuse_to_start_in_one_line(tmp_path, env, option):
    (tmp_path / "exists").mkdir()
    (tmp_path / "tp.rank1").mkdir()
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    done = subprocess.run([sys.executable, "-c", "import pagetrace.engines.vllm_plugin as p; p.register()"],
                          env=dict(clean, PYTHONPATH=str(ROOT), **env), capture_output=True, text=True, timeout=60)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("pagetrace: refusing to start vLLM: ") and option in lines[0], lines


def test_a_trace_setting_imports_nothing_heavy_and_hooks_only_the_scheduler(tmp_path):
    code = ("import sys; import pagetrace.engines.vllm_plugin as p; p.register(); "
            "print(sorted(m for m in ('torch', 'vllm', 'numpy') if m in sys.modules), sorted(p.PATCHES))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    done = subprocess.run([sys.executable, "-c", code], env=dict(clean, PYTHONPATH=str(ROOT), PAGETRACE_TRACE=str(tmp_path / "t.jsonl")),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "['vllm.v1.core.sched.scheduler']"]
    assert not (tmp_path / "t.jsonl").exists()  # the engine core's Scheduler makes it


def test_client_ids():
    from pagetrace.engines.vllm_trace import client_id

    assert client_id("cmpl-load3-0-a12eca2a") == "cmpl-load3-0"
    assert client_id("0_cmpl-samples-0-b9fd55cd") == "0_cmpl-samples-0"
    assert client_id("plain") == "plain"


def test_steps_and_plants_parse():
    assert parse_steps("0-9, 100,40000-") == [(0, 9), (100, 100), (40000, None)]
    plants = parse_plants("3:table:1:last:7,3:slot:0:+1,9:slot:2:-3")
    assert sorted(plants) == [3, 9] and len(plants[3]) == 2


def test_a_plant_is_undone_after_the_step():
    md = SimpleNamespace(block_table=torch.tensor([[1, 2, 3]]), slot_mapping=torch.tensor([64, 65]), seq_lens=torch.tensor([70]))
    undo = [edit(md) for edit in parse_plants("0:table:0:1:9,0:slot:1:+2")[0]]
    assert md.block_table.tolist() == [[1, 9, 3]] and md.slot_mapping.tolist() == [64, 67]
    for u in reversed(undo):
        u()
    assert md.block_table.tolist() == [[1, 2, 3]] and md.slot_mapping.tolist() == [64, 65]


def config(layers=2):
    """What `problem_with` reads of vLLM's VllmConfig (the tiny Llama of the tests: 4 heads, 2 KV heads, head_dim 32, bf16)."""
    mc = SimpleNamespace(hf_text_config=SimpleNamespace(num_hidden_layers=layers), dtype=torch.bfloat16,
                         get_num_attention_heads=lambda pc: 4, get_num_kv_heads=lambda pc: 2, get_head_size=lambda: 32)
    return SimpleNamespace(model_config=mc, parallel_config=None, cache_config=SimpleNamespace(block_size=32))


def test_a_layer_the_model_lacks_and_a_ring_that_holds_no_step_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PAGETRACE_LAYERS", "1,2")
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_LAYERS": "1,2"})
    assert s.problem_with(config()) == "invalid value for PAGETRACE_LAYERS: '1,2': layer 2 does not exist; the model has layers 0..1"
    # one step of 2 layers: a page of 2 x 32 x 2 x 32 bf16 (8192 bytes) + 1 token's q, out (2 x 128) and new k, v (2 x 64) x 2 bytes
    smallest = 2 * (8192 + (2 * 4 + 2 * 2) * 32 * 2) + 44
    ring = (smallest - 1) / (1 << 20)
    monkeypatch.setenv("PAGETRACE_RING_MIB", repr(ring))
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": repr(ring)})
    assert f"holds no step; the smallest step of this model (one token, one block per kept layer) is {smallest} bytes" in s.problem_with(config())
    s = Settings.from_env({"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_RING_MIB": repr(smallest / (1 << 20))})
    assert s.problem_with(config()) is None


def test_settings_words(tmp_path):
    s = Settings.from_env({"PAGETRACE_CAPTURE": f"{tmp_path}/x.bundle", "PAGETRACE_GUARD": "report", "PAGETRACE_STEPS": "5-"})
    assert s.words() == f"guard report, capture to {tmp_path}/x.bundle (steps 5-, layers all, ring 256 MiB)"
    with pytest.raises(UsageError, match="PAGETRACE_GUARD"):
        Settings.from_env({"PAGETRACE_GUARD": "Raise"})


def test_the_recorder_keeps_the_chosen_steps_and_requests():
    from pagetrace.engines.vllm import Recorder

    r = Recorder(steps=[(0, 2), (10, None)], requests=["cmpl-b"])
    assert [s for s in range(15) if r.wants(s, ["cmpl-b-0"])] == [0, 1, 2, 10, 11, 12, 13, 14]
    assert not r.wants(1, ["cmpl-a-0", "cmpl-bb-0"])  # cmpl-bb is not cmpl-b
    assert Recorder(steps=[3, 5]).wants(5, []) and not Recorder(steps=[]).wants(0, [])


def test_a_live_bundle_is_whole_after_every_step_and_the_ring_drops_the_oldest(tmp_path):
    from pagetrace.engines.bundle import LiveBundle, read_manifest, read_step

    def step_tensors(first_block):
        return {
            "query_start_loc": torch.tensor([0, 1], dtype=torch.int32), "seq_lens": torch.tensor([5], dtype=torch.int32),
            "block_table": torch.tensor([[first_block, first_block + 1]], dtype=torch.int32), "block_counts": torch.tensor([2], dtype=torch.int32),
            "slot_mapping": torch.tensor([(first_block + 1) * 4], dtype=torch.int64), "positions": torch.tensor([4]),
            "blocks": torch.tensor([first_block, first_block + 1]), "layer0.kv": torch.zeros(2, 1, 4, 16, dtype=torch.bfloat16),
        }

    path = tmp_path / "live.bundle"
    live = LiveBundle(path, {
        "engine": {"name": "vllm"}, "model": {"num_layers": 1, "num_heads": 1, "num_kv_heads": 1, "head_dim": 8},
        "kv_cache": {"dtype": "bf16", "layout": "vllm-cpu", "block_size": 4, "num_blocks": 16, "null_block": 0, "table_padding": 0,
                     "slot_padding": -1, "sharing": "none"},
        "attention": {"scale": 1.0, "causal": True, "sliding_window": None}, "layers": [{"index": 0, "name": "l0"}]})
    assert not path.exists()  # created at the first step
    for step in range(4):
        live.add(step, [f"r-{step}"], [0], step_tensors(1 + 2 * step), drop=[step - 2] if step >= 2 else [])
        m = read_manifest(path)
        assert [s["step"] for s in m.steps] == list(range(max(0, step - 1), step + 1))
        for s in m.steps:
            read_step(path, m, s["step"])
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "step-0002.safetensors", "step-0003.safetensors"]
    live.set("closed", "signal SIGUSR1")
    assert json_of(path)["closed"] == "signal SIGUSR1"


def json_of(path):
    import json

    return json.loads((path / "manifest.json").read_text())
