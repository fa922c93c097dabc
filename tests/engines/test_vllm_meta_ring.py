"""The metadata ring on a live vLLM server: PAGETRACE_PAGES=flagged for over 10,000 steps.

One `python -m vllm.entrypoints.openai.api_server` (the helpers of test_vllm_serve.py) with
the guard in report mode and a table entry planted 5,000,000 blocks out at step PLANT, past
10,000 steps of traffic: rounds of ROUND_REQUESTS completions at once, each a distinct prompt of
PROMPT tokens and MAX_TOKENS new ones. The bundle the guard closes holds the flagged step with
its pages and the ring of every step before it; the reference is the traffic the test sent:
each request's steps run from its prompt (prefill from 0: no prompt shares a block) to
prompt + MAX_TOKENS - 1 (vLLM never feeds back the last token), one more token each step
(under vLLM's async scheduling, one step past it at most).
Then SIGUSR1: the next step is kept with its pages and the second bundle closes with the
ring of the steps since.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request

import pytest

from conftest import cli

pytest.importorskip("vllm", reason="vllm is not installed: pip install -e '.[vllm]' to run the real-server test")

from test_vllm_serve import get, manifest, model, server, wait_for, worker_pid  # noqa: E402,F401 - the fixture too

pytestmark = pytest.mark.vllm
PROMPT = 40
MAX_TOKENS = 1_000
ROUND_REQUESTS = 4
PLANT = 10_050


def complete(port: int, name: str, first: int, timeout: float = 300) -> tuple[int, dict | str]:
    body = {"model": "tiny", "prompt": [(first + k) % 511 + 1 for k in range(PROMPT)], "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": name})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except Exception as exc:  # noqa: BLE001 - the test reports what the client saw
        return 0, repr(exc)


def rounds(port: int, count: int, start: int = 0) -> dict[str, int]:
    codes: dict[str, int] = {}
    for k in range(start, start + count):
        names = [f"r{k}q{i}" for i in range(ROUND_REQUESTS)]
        threads = [threading.Thread(target=lambda n=n, i=i: codes.__setitem__(n, complete(port, n, (k * ROUND_REQUESTS + i) * 10)[0]))
                   for i, n in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=360)
    return codes


def test_the_ring_holds_every_step_before_the_fault_and_check_reads_them(model, tmp_path, capsys):
    bundle, log = tmp_path / "ring.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_PAGES": "flagged", "PAGETRACE_GUARD": "report",
           "PAGETRACE_GUARD_PLANT": f"{PLANT}:table:0:0:5000000", "PAGETRACE_RING_MIB": "8",
           "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}  # the tiny model's config says 512 positions; its random weights take 2,048
    extra = ("--max-model-len", "2048", "--num-gpu-blocks-override", "256", "--max-num-seqs", "8")
    started = time.monotonic()
    with server(model, log, env, extra=extra) as (proc, port):
        codes, k = {}, 0
        while f"pagetrace guard: step {PLANT}: made safe" not in log.read_text():  # rounds of 1,000 steps or more, past PLANT
            assert k < 60, f"step {PLANT} not reached after {k} rounds"
            codes |= rounds(port, 1, start=k)
            k += 1
        assert all(c == 200 for c in codes.values()), (codes, log.read_text()[-3000:])
        worker = worker_pid(proc.pid)
        os.kill(worker, signal.SIGUSR1)
        assert rounds(port, 1, start=k) and get(port, "/health")[0] == 200
        wait_for(log, "pagetrace: signal SIGUSR1: ", timeout=60)
        print(f"ring run: {time.monotonic() - started:.1f} s", file=sys.stderr)
    m = manifest(bundle)
    ring = m["ring"]
    assert m["closed"] == f"guard, step {PLANT}" and [s["step"] for s in m["steps"]] == [PLANT]  # pages: the flagged step only
    assert m["steps"][0]["layers"] and m["steps"][0]["guard"]["mode"] == "report"
    assert ring["first"] == 0 and ring["last"] == PLANT and ring["steps"] == PLANT + 1 and ring["bytes"] <= ring["bound_bytes"] == 8 << 20
    assert ring["bytes"] == sum((bundle / s["file"]).stat().st_size for s in ring["segments"])
    assert sorted(p.name for p in bundle.glob("ring-*.bin")) == [s["file"] for s in ring["segments"]]
    print(f"metadata ring: {ring['steps']} steps in {ring['bytes']} bytes ({ring['bytes'] / ring['steps']:.0f} a step), "
          f"{len(ring['segments'])} segments", file=sys.stderr)

    code, out, err = cli(capsys, "check", str(bundle), "--ring", "--no-data", "--json")
    doc = json.loads(out)
    assert code == 1 and [s["step"] for s in doc["steps"]] == list(range(PLANT + 1)), err
    bad = {s["step"]: {v["check"] for v in s["violations"]} for s in doc["steps"] if s["violations"]}
    assert bad == {PLANT: {"pool"}}, bad  # the planted entry, at its step, in the ring and in the step file; nothing else

    # the reference: the traffic itself, request by request
    from pagetrace.engines.bundle import read_manifest, read_step

    seen: dict[str, list[tuple[int, int, int]]] = {}
    man = read_manifest(bundle)
    for n in range(PLANT):
        st = read_step(bundle, man, n)
        for r, rid in enumerate(st.requests):
            seen.setdefault(rid, []).append((n, st.seq_lens[r], st.query_len(r)))
    last = PROMPT + MAX_TOKENS - 1  # vLLM never feeds back the last token
    finished = [rid for rid, rows in seen.items() if any(n == last for _, n, _ in rows)]
    # a round's requests run together, or (seen on a loaded machine) one after another: 1,000 steps each
    assert len(finished) >= PLANT // (MAX_TOKENS + 10) - 1, len(finished)
    for rid in finished:
        rows = seen[rid]
        assert rows[0][1] == rows[0][2] == PROMPT, (rid, rows[:3])  # the whole prompt in its first step, from 0
        assert all(b[1] == a[1] + b[2] for a, b in zip(rows, rows[1:])), rid  # each step adds its new tokens
        # vLLM's async scheduling (on by default: vllm/config/vllm.py) may schedule a finished request
        # one step more before it sees its last token, whose output it then drops
        assert rows[-1][1] - last in (0, 1), (rid, rows[-3:])
    code, out, err = cli(capsys, "lookup", "--from", str(bundle), "--request", "r0q1", "--token", "10", "--json")
    assert code == 0 and json.loads(out)["token"] == 10 and json.loads(out)["request"].startswith("cmpl-r0q1-"), err

    second = tmp_path / "ring.bundle.2"
    m2 = manifest(second)
    assert m2["closed"] == "signal SIGUSR1" and len(m2["steps"]) == 1 and m2["steps"][0]["forced"] == "signal" and m2["steps"][0]["layers"]
    assert m2["ring"]["first"] == PLANT + 1 and m2["ring"]["last"] == m2["steps"][0]["step"]
    code, out, err = cli(capsys, "replay", str(second), "--backend", "torch")
    assert code == 0 and "passed" in out, err
