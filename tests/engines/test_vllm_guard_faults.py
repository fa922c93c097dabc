"""The guard at the fault, on a real `vllm serve`: no false positive on a hard clean run, a
planted collision and a bad row whose client id another request shares in report mode, and
`raise` against planted entries at every distance.

Three servers, each started by test_vllm_serve's `server` (the tiny random Llama, block size
32, a pool of 24 blocks (`--num-gpu-blocks-override`, 23 usable: block 0 is the null block; the hard run 17),
prefix caching, 127.0.0.1 on a free port, stopped by its PID in a `finally`; every wait with a
timeout). Request ids are the X-Request-Id header, so the bundle's `client_requests` name each
request as the test sent it (`cmpl-<id>-0`).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: pip install -e '.[vllm]' to run the guard against a real server", allow_module_level=True)

from test_vllm_serve import NUM_BLOCKS, complete, get, guard_lines, index, load, manifest, model, server  # noqa: E402,F401  (model: the fixture)

pytestmark = pytest.mark.vllm
BLOCK = 32
CHUNK = 64  # --max-num-batched-tokens: a prompt longer than this is prefilled in chunks
A = list(range(1, 97))  # three full blocks, longer than CHUNK
SHARED = list(range(200, 264))  # the phase-2 prompts' common prefix: two full blocks
B = list(range(400, 480))  # the n=3 request's prompt
FAR = 5_000_000  # a table entry far outside any pool
HARD_POOL = 17  # the hard run's pool: 16 usable blocks hold one max-model-len (512) request, as vLLM demands; phase 2 needs about 34


def send(port: int, rid: str, prompt: list[int], max_tokens: int, timeout: float = 120, **body) -> tuple[int, dict | str]:
    """One completion (token ids, no tokenizer); the X-Request-Id is `rid`."""
    doc = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True, **body}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(doc).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": rid})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, repr(exc)


def metric(port: int, name: str) -> float:
    """A counter of vLLM's own Prometheus /metrics (v1/metrics/loggers.py), summed over its labels."""
    text = get(port, "/metrics")[1]
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{") or line.startswith(name + " "))


def at_once(port: int, jobs: dict[str, tuple], rid: str | None = None) -> dict[str, tuple[int, dict | str]]:
    """send(port, key, *args, **kwargs) for every key at once (the X-Request-Id: the key, or `rid`
    for all); each thread has its own timeout."""
    out: dict = {}
    threads = [threading.Thread(target=lambda k=k, a=a: out.__setitem__(k, send(port, rid or k, *a[0], **a[1]))) for k, a in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return out


def steps_with_tensors(bundle: Path):
    """(manifest entry, its index tensors) for every step of the bundle, in order."""
    for s in manifest(bundle)["steps"]:
        yield s, index(bundle, s["file"])


def rows(t: dict) -> list[tuple[int, int]]:
    """(query_len, seq_len) of each request of a step."""
    qsl = t["query_start_loc"].tolist()
    return [(qsl[r + 1] - qsl[r], int(t["seq_lens"][r])) for r in range(len(qsl) - 1)]


# -- 1. no false positive on a hard clean run --------------------------------------------------

@pytest.fixture(scope="module")
def hard_run(model, tmp_path_factory):
    """Report mode with capture, on a server that preempts, prefills in chunks, evicts cached
    prefixes, samples n=3 and salts. Phase 1, one request at a time, reading vLLM's prefix
    cache counter between them: A, A again, A salted, A salted again. Phase 2, at once: six
    prompts on a shared prefix, 120 tokens each, and an n=3 request: far more than the pool.
    Phase 3: A once more. The pool: 17 blocks. (bundle, log, results, counter deltas, preemptions)"""
    tmp = tmp_path_factory.mktemp("hard")
    bundle, log = tmp / "capture.bundle", tmp / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "report", "PAGETRACE_RING_MIB": "512"}
    extra = ("--max-num-batched-tokens", str(CHUNK), "--max-num-seqs", "16", "--num-gpu-blocks-override", str(HARD_POOL))  # the last override wins
    results, hits = {}, {}
    with server(model, log, env, extra=extra) as (proc, port):
        def one(rid, prompt, **body):
            before = metric(port, "vllm:prefix_cache_hits_total")
            results[rid] = send(port, rid, prompt, 8, **body)
            hits[rid] = metric(port, "vllm:prefix_cache_hits_total") - before

        one("a0", A)
        one("a1", A)
        one("s0", A, cache_salt="tenant-1")  # the completions API's `cache_salt` (entrypoints/openai/completion/protocol.py)
        one("s1", A, cache_salt="tenant-1")
        jobs = {f"p{i}": ((SHARED + [300 + i] * (4 + i), 120), {}) for i in range(6)}
        jobs["n3"] = ((B, 40), {"n": 3, "temperature": 1.0})
        results.update(at_once(port, jobs))
        one("a2", A)
        preempted = metric(port, "vllm:num_preemptions_total")
        alive = get(port, "/health")[0]
    print(f"hard run: prefix cache hits {hits}, {preempted:g} preemptions", file=sys.stderr)
    return bundle, log, results, hits, preempted, alive


def test_every_request_of_the_hard_run_is_served_and_the_guard_names_nothing(hard_run):
    bundle, log, results, hits, preempted, alive = hard_run
    assert alive == 200 and all(code == 200 for code, _ in results.values()), {k: v for k, v in results.items() if v[0] != 200}
    assert [c["index"] for c in results["n3"][1]["choices"]] == [0, 1, 2]
    text = log.read_text()
    assert "pagetrace: guard report, capture to" in text
    assert guard_lines(log) == [] and "made safe before the forward" not in text, guard_lines(log)[:5]  # no false positive
    assert manifest(bundle).get("closed") is None and not Path(f"{bundle}.2").exists()  # nothing flagged: nothing closed the bundle


def test_the_hard_run_really_preempted_chunked_evicted_salted_and_sampled_three(hard_run):
    """Each condition, proven from the engine's own counters or the bundle's tensors."""
    bundle, log, results, hits, preempted, alive = hard_run
    # preemption: vLLM's own counter (vllm:num_preemptions, v1/metrics/loggers.py)
    assert preempted >= 1, f"the pool of {HARD_POOL - 1} usable blocks should have run out"
    # prefix caching, from vLLM's vllm:prefix_cache_hits counter (tokens), one request at a time: the
    # first A hits nothing; the second hits A's first two blocks (a hit stops at prompt_len - 1 tokens,
    # floored to whole blocks: v1/core/kv_cache_manager.py get_computed_blocks); a salt starts its own
    # cache (0, then 64); after phase 2 cycled the pool, A hits nothing: its cached blocks were evicted
    assert (hits["a0"], hits["a1"], hits["s0"], hits["s1"], hits["a2"]) == (0, 2 * BLOCK, 0, 2 * BLOCK, 0), hits
    steps = list(steps_with_tensors(bundle))
    assert steps[0][0]["step"] == 0, "the ring should hold the whole run"
    seen = {}  # client id -> [(step, query_len, seq_len, block_table row)] over the steps that hold it
    for s, t in steps:
        for r, (c, (q, n)) in enumerate(zip(s["client_requests"], rows(t))):
            seen.setdefault(c, []).append((s["step"], q, n, t["block_table"][r].tolist()))
    # preemption, in the bundle too: a request that decoded, then came back with new tokens to compute
    # (vLLM frees a preempted request's blocks and recomputes it: v1/core/sched/scheduler.py _preempt_request)
    resumed = [c for c, v in seen.items() if any(q > 1 and any(q0 == 1 for _, q0, _, _ in v[:k]) for k, (_, q, _, _) in enumerate(v))]
    assert resumed, "no request prefilled again after decoding"
    # chunked prefill: A (96 tokens) came in a chunk of CHUNK tokens, then the rest
    a0 = seen["cmpl-a0-0"]
    assert [(q, n) for _, q, n, _ in a0[:2]] == [(CHUNK, CHUNK), (len(A) - CHUNK, len(A))], a0[:2]
    # the salted A shares no block with the unsalted one; the second salted A shares the first's two blocks
    prompt_blocks = {c: set(v[-1][3][:3]) for c, v in seen.items() if c in ("cmpl-a1-0", "cmpl-s0-0", "cmpl-s1-0")}
    assert not prompt_blocks["cmpl-s0-0"] & prompt_blocks["cmpl-a1-0"] and len(prompt_blocks["cmpl-s0-0"] & prompt_blocks["cmpl-s1-0"]) == 2
    # eviction, in the bundle too: the block that held A's first block (cached: a1 hit it) is later in the
    # used part of a table of a phase-2 request, whose prompt shares nothing with A: evicted and rewritten
    a_first = seen["cmpl-a1-0"][-1][3][0]
    reused = sorted({c for c, v in seen.items() if not c.startswith(("cmpl-a", "cmpl-s")) for _, _, n, row in v if a_first in row[: -(-n // BLOCK)]})
    assert reused, f"block {a_first} (A's first) was never handed to another prompt"
    # n=3: the parent's three samples (vLLM's child ids `<index>_<parent>`, v1/engine/parallel_sampling.py) in one step,
    # on the same prompt blocks (prefix caching shares B's full blocks)
    together = [(s, t) for s, t in steps if sum(bool(re.match(r"^[012]_cmpl-n3-0-", r)) for r in s["requests"]) == 3]
    assert together, "no step holds the n=3 request's three samples"
    s, t = together[-1]
    rows3 = [t["block_table"][i].tolist()[:2] for i, r in enumerate(s["requests"]) if re.match(r"^[012]_cmpl-n3-0-", r)]
    assert rows3[0] == rows3[1] == rows3[2], rows3


def test_check_passes_on_the_hard_runs_bundle(hard_run, capsys):
    bundle, *_ = hard_run
    code, out, err = cli(capsys, "check", str(bundle), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], [s for s in doc["steps"] if s["violations"]][:2]
    assert len(doc["steps"]) == len(manifest(bundle)["steps"])


# -- 2. a collision, live, in report mode, and a bad row whose client id another request shares --

TWIN_STEP = 20


def test_a_planted_collision_and_a_bad_twin_row_are_made_safe_named_and_refused(model, tmp_path, capsys):
    """Six requests at once, all with one X-Request-Id (`twin`: a client may reuse one; vLLM keeps
    them apart by a random suffix). Step 0 is the first prefill (nothing is cached yet):
    slot_mapping[5] -= 1 makes request 0's token 5 write its token 4's slot (one block holds both:
    5 < 32). Step 20 (six requests decoding): row 3's first entry on block 5,000,000. Report
    mode: the guard names each (by vLLM's own id where the client's is ambiguous) and makes that
    row safe, not its twin's (before the fix, the name led to row 0 and the kernel read block
    5,000,000: "Segfault encountered"); the server serves every request; each step's bundle is
    closed, `check` names the collision and the entry, `replay` of step 0 exits 1."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "report", "PAGETRACE_RING_MIB": "16",
           "PAGETRACE_GUARD_PLANT": f"0:slot:5:-1,{TWIN_STEP}:table:3:0:{FAR}"}
    with server(model, log, env) as (proc, port):
        results = at_once(port, {f"twin{i}": ((list(range(1, 65)) + [100 + i] * (3 + i), 150), {}) for i in range(6)}, rid="twin")
        assert all(code == 200 for code, _ in results.values()), (results, log.read_text()[-3000:])
        assert get(port, "/health")[0] == 200 and complete(port, 0)[0] == 200
    text = log.read_text()
    assert "Segfault" not in text and "died unexpectedly" not in text and "EngineCore encountered a fatal error" not in text, text[-3000:]
    lines = guard_lines(log)
    assert {int(x.split()[3]) for x in lines} == {0, TWIN_STEP}, lines  # nothing else flagged
    m = manifest(bundle)
    assert m["closed"] == "guard, step 0" and [s["step"] for s in m["steps"]] == [0]
    entry = m["steps"][0]
    t = index(bundle, entry["file"])
    assert int(t["slot_mapping"][5]) == int(t["slot_mapping"][4]) >= 0  # the evidence: the slots as the kernel would have had them
    clients = entry["client_requests"]  # (step 0 may hold only the first request to arrive: then its client id is no one else's)
    first = entry["requests"][0] if clients.count(clients[0]) > 1 else clients[0]
    assert any(x.startswith(f"pagetrace guard: step 0 · collision · request {first} · token 5 · ") for x in lines), lines
    assert entry["guard"]["made_safe"]["requests"] == [first] and entry["guard"]["affected"] == [entry["requests"][0]]
    code, out, err = cli(capsys, "check", str(bundle), "--json")
    found = json.loads(out)["steps"][0]["violations"]
    collision = [v for v in found if v["check"] == "collision"]
    assert code == 1 and [(v["token"], v["slot"]) for v in collision] == [(5, int(t["slot_mapping"][4]))], found
    code, out, err = cli(capsys, "replay", str(bundle), "--step", "0", "--backend", "torch")
    assert code == 1 and "step 0 (the guard flagged it): " in err and "collision" in err, err
    second = manifest(tmp_path / "capture.bundle.2")
    twin = second["steps"][-1]
    assert second["closed"] == f"guard, step {TWIN_STEP}" and twin["step"] == TWIN_STEP and len(set(twin["client_requests"])) == 1
    bad = twin["requests"][3]
    assert twin["guard"]["made_safe"]["requests"] == [bad] and twin["guard"]["made_safe"]["table_entries"] == [{"row": 3, "column": 0, "was": FAR}]
    assert any(x.startswith(f"pagetrace guard: step {TWIN_STEP} · pool · request {bad} · ") and f"physical block {FAR}" in x for x in lines), lines
    code, out, err = cli(capsys, "check", str(tmp_path / "capture.bundle.2"), "--step", str(TWIN_STEP), "--json")
    found = json.loads(out)["steps"][0]["violations"]
    assert code == 1 and ("pool", bad, FAR) in {(v["check"], v["request"], v["physical_block"]) for v in found}, found


# -- 3. raise against entries at every distance -------------------------------------------------

RAISE_STEP = 20
# one step, five rows, one plant each: far outside the pool, one past it, negative, the null block, a slot a million past
RAISE_PLANTS = [f"table:0:0:{FAR}", f"table:1:0:{NUM_BLOCKS}", "table:2:0:-1", "table:3:0:0", "slot:4:1000000"]


def test_raise_stops_the_step_before_the_kernel_reads_any_distance(model, tmp_path, capsys):
    """Raise mode stops vLLM's engine at the first flagged step (the test of test_vllm_serve), so
    the distances share one step: rows 0..4 of step 20 (six requests decoding) each carry one.
    The guard names all five and raises before the forward; the engine stops on the exception
    (vLLM's "EngineCore encountered a fatal error"), not on a signal: no segfault. The bundle
    that holds the step is closed, and `check` names each violation at its row."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "raise", "PAGETRACE_RING_MIB": "16",
           "PAGETRACE_GUARD_PLANT": ",".join(f"{RAISE_STEP}:{p}" for p in RAISE_PLANTS)}
    with server(model, log, env) as (proc, port):
        results = load(port)
        proc.wait(timeout=60)  # the engine died; vLLM's API server exits
    assert any(code != 200 for code, _ in results.values()), results
    text = log.read_text()
    # a kernel that read a bad entry: "Segfault encountered", and vLLM's "Worker proc VllmWorker-0 died unexpectedly
    # (exit code: -11)" (v1/executor/multiproc_executor.py); seen when the stop is planted away
    assert "Segfault" not in text and "died unexpectedly" not in text, text[-3000:]
    assert f"pagetrace guard stopped step {RAISE_STEP} before the kernel read it" in text and "EngineCore encountered a fatal error" in text
    m = manifest(bundle)
    entry = m["steps"][-1]
    assert m["closed"] == f"guard, step {RAISE_STEP}" and entry["step"] == RAISE_STEP and "stopped by the guard" in entry["note"]
    assert len(entry["requests"]) == 6 and entry["guard"]["made_safe"] is None
    t = index(bundle, entry["file"])
    assert rows(t) == [(1, n) for _, n in rows(t)], "step 20 should be a decode of every request"
    clients = entry["requests"]  # check names requests by their engine ids
    code, out, err = cli(capsys, "check", str(bundle), "--step", str(RAISE_STEP), "--json")
    found = json.loads(out)["steps"][0]["violations"]
    named = {(v["check"], v["request"], v["physical_block"]) for v in found if v["check"] in ("pool", "null")}
    want = {("pool", clients[0], FAR), ("pool", clients[1], NUM_BLOCKS), ("pool", clients[2], -1), ("null", clients[3], 0)}
    assert code == 1 and want <= named, (want - named, found)
    assert any(v["check"] == "slot" and v["request"] == clients[4] and v["slot"] == int(t["slot_mapping"][4]) for v in found), found
    assert int(t["slot_mapping"][4]) >= NUM_BLOCKS * BLOCK  # the planted slot, a million past, kept as it was
    logged = {x.split(" · ")[1] for x in guard_lines(log)}
    assert {"pool", "null", "slot"} <= logged, guard_lines(log)
