"""An unmodified vLLM server with pagetrace's plugin on: capture, the guard, bad settings.

Each test starts `python -m vllm.entrypoints.openai.api_server` (vLLM's default
multiprocessing: API server, engine core and worker are three processes) on a free port
of 127.0.0.1 with the tiny random Llama of examples/vllm_capture.py, a pool of 24 blocks of
32 (`--num-gpu-blocks-override`), and prefix caching; sends six completions that share a
64-token prefix (token ids, no tokenizer), 150 tokens each, at once, so the pool runs out
and vLLM preempts; then stops the server by its PID (SIGTERM, SIGKILL after 30 s) whatever
happened. Every wait has a timeout.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: pip install -e '.[vllm]' to run the real-server test", allow_module_level=True)


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "pagetrace.engines.vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins"))


if not _plugin_installed():
    pytest.skip("pagetrace's vllm.general_plugins entry point is not installed (pip install -e .): vLLM finds plugins by package metadata",
                allow_module_level=True)

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
BF16_TOL = 1.6e-2
SHARED = list(range(1, 65))  # two full blocks of 32
REQUESTS = 6
MAX_TOKENS = 150
START_TIMEOUT = 240
NUM_BLOCKS = 24


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from vllm_capture import make_tiny_llama
    finally:
        sys.path.pop(0)
    return make_tiny_llama(tmp_path_factory.mktemp("serve") / "model")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def complete(port: int, i: int, timeout: float = 120) -> tuple[int, dict | str]:
    body = {"model": "tiny", "prompt": SHARED + [100 + i] * (3 + i), "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True,
            "return_token_ids": True}
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "X-Request-Id": f"load{i}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        return 0, repr(exc)


def load(port: int) -> dict[int, tuple[int, dict | str]]:
    """The six completions at once; each thread has its own timeout."""
    out: dict = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(port, i))) for i in range(REQUESTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return out


@contextmanager
def server(model: Path, log: Path, env: dict, expect_start: bool = True, extra: tuple = ()):
    """The server, started with `env`, healthy (or, expect_start=False, exited); stopped by PID."""
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    clean.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # vLLM's default: the engine in its own processes
    clean.pop("TRITON_INTERPRET", None)
    args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(port), "--block-size", "32", "--max-model-len", "512", "--enforce-eager",
            "--skip-tokenizer-init", "--enable-prefix-caching", "--num-gpu-blocks-override", str(NUM_BLOCKS), "--gpu-memory-utilization", "0.1", *extra]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=dict(clean, **env), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    try:
        while time.monotonic() - start < START_TIMEOUT:
            if proc.poll() is not None:
                break
            try:
                if get(port, "/health", timeout=2)[0] == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        if expect_start:
            assert proc.poll() is None, f"the server exited ({proc.returncode}): {log.read_text()[-3000:]}"
            assert get(port, "/health")[0] == 200, f"not healthy after {START_TIMEOUT} s"
        print(f"server {'healthy' if expect_start else 'exited'} after {time.monotonic() - start:.1f} s", file=sys.stderr)
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the engine core and worker too
                proc.wait(timeout=30)


def worker_pid(server: int) -> int:
    """vLLM's worker process (it names itself VLLM::Worker) under the server."""
    import psutil  # vLLM's dependency

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for child in psutil.Process(server).children(recursive=True):
            try:
                if "VLLM::Worker" in child.name() or "VLLM::Worker" in " ".join(child.cmdline()):
                    return child.pid
            except psutil.Error:
                continue
        time.sleep(0.5)
    raise AssertionError("no VLLM::Worker process under the server")


def wait_for(log: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, f"{text!r} not in the server's log after {timeout} s"
        time.sleep(0.2)


def guard_lines(log: Path) -> list[str]:
    """The guard's violation lines (`pagetrace guard: step N · check · ...`; not its paused/resumed or made-safe lines)."""
    return [line[line.index("pagetrace guard: step "):] for line in log.read_text().splitlines() if re.search(r"pagetrace guard: step \d+ · ", line)]


def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.fixture(scope="module")
def clean_run(model, tmp_path_factory):
    """Capture and the guard (raise) on; the load; the server stopped. (bundle, log, results, preemptions)."""
    tmp = tmp_path_factory.mktemp("clean")
    bundle, log = tmp / "capture.bundle", tmp / "server.log"
    start = time.monotonic()
    with server(model, log, {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "raise", "PAGETRACE_RING_MIB": "64"}) as (proc, port):
        results = load(port)
        metrics = get(port, "/metrics")[1]
    print(f"clean run: {time.monotonic() - start:.1f} s", file=sys.stderr)
    preempted = sum(float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("vllm:num_preemptions_total"))
    return bundle, log, results, preempted


def test_the_server_serves_every_request_and_preempts(clean_run):
    bundle, log, results, preempted = clean_run
    assert all(code == 200 for code, _ in results.values()), results
    assert {doc["id"] for _, doc in results.values()} == {f"cmpl-load{i}" for i in range(REQUESTS)}
    assert all(len(doc["choices"][0]["token_ids"]) == MAX_TOKENS for _, doc in results.values())
    assert preempted >= 1, "the pool of 24 blocks should have run out"
    text = log.read_text()
    assert "pagetrace: guard raise, capture to" in text and "layout vllm-cpu" in text
    assert guard_lines(log) == []  # a clean run reports nothing


def test_the_bundle_records_the_engine_and_the_proof(clean_run):
    bundle, *_ = clean_run
    m = manifest(bundle)
    assert m["engine"]["name"] == "vllm" and m["engine"]["version"] and m["engine"]["backend"] == "CPU_ATTN"
    assert m["engine"]["isa"] in ("amx", "vec", "vec16") and (m["engine"]["rank"], m["engine"]["world_size"]) == (0, 1)
    proof = m["kv_cache"]["layout_proof"]
    assert proof["method"] == "writer" and proof["explained_by"] == [m["kv_cache"]["layout"]] and proof["isa"] == m["engine"]["isa"]
    assert m["kv_cache"]["num_blocks"] == NUM_BLOCKS and m["kv_cache"]["sharing"] == "full-blocks"
    assert m["capture"]["hook"].startswith("vllm.general_plugins") and m["capture"]["guard"] == "raise"
    steps = m["steps"]
    assert [s["step"] for s in steps] == list(range(steps[0]["step"], steps[-1]["step"] + 1))  # the ring: consecutive steps
    # request ids as the client knows them: the X-Request-Id, vLLM's cmpl- prefix and the prompt index
    seen = {c for s in steps for c in s["client_requests"]}
    assert seen == {f"cmpl-load{i}-0" for i in range(REQUESTS)}
    for s in steps:
        assert all(r.startswith(c + "-") for r, c in zip(s["requests"], s["client_requests"]))


def test_check_passes_on_every_captured_step(clean_run, capsys):
    bundle, *_ = clean_run
    code, out, err = cli(capsys, "check", str(bundle), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], [s for s in doc["steps"] if s["violations"]][:2]
    assert len(doc["steps"]) == len(manifest(bundle)["steps"]) > 100


def index(bundle: Path, file: str) -> dict:
    """A step's index tensors (NumPy; the bf16 pages are not read)."""
    from safetensors import safe_open

    with safe_open(str(bundle / file), framework="numpy") as f:
        return {k: f.get_tensor(k) for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping")}


def interesting_steps(bundle: Path) -> dict[str, int]:
    """A prefill, the fullest decode, and a prefill after a preemption (a request seen decoding before)."""
    found, decoded = {}, set()
    for s in manifest(bundle)["steps"]:
        t = index(bundle, s["file"])
        qlens = (t["query_start_loc"][1:] - t["query_start_loc"][:-1]).tolist()
        for r, q in zip(s["client_requests"], qlens):
            if q > 1 and r in decoded:
                found.setdefault("after preemption", s["step"])
            if q > 1:
                found.setdefault("prefill", s["step"])
            else:
                decoded.add(r)
        if all(q == 1 for q in qlens) and len(qlens) == max(len(x["requests"]) for x in manifest(bundle)["steps"]):
            found.setdefault("decode", s["step"])
    return found


def test_replay_matches_vllms_attention_at_a_prefill_a_decode_and_after_preemption(clean_run, capsys, tmp_path):
    bundle, *_ = clean_run
    steps = interesting_steps(bundle)
    assert set(steps) == {"prefill", "decode", "after preemption"}, steps
    for what, step in steps.items():
        for layer in (0, 1):
            code, out, err = cli(capsys, "replay", str(bundle), "--step", str(step), "--layer", str(layer), "--backend", "interpret", "--json")
            doc = json.loads(out)
            assert code == 0 and doc["passed"], (what, step, doc)
            assert all(r["max_diff_engine"] <= BF16_TOL for r in doc["requests"]), (what, doc["requests"])
    svg = tmp_path / "tables.svg"  # the real block tables as a diagram
    code, out, err = cli(capsys, "replay", str(bundle), "--step", str(steps["decode"]), "--request", "cmpl-load3", "--backend", "interpret", "--svg", str(svg))
    assert code == 0 and "ref count" in svg.read_text(), err


def test_lookup_from_the_server_bundle_by_the_clients_id(clean_run, capsys):
    bundle, *_ = clean_run
    step = manifest(bundle)["steps"][-1]
    client = step["client_requests"][0].rsplit("-", 1)[0]  # cmpl-loadN: the id the response carried
    code, out, err = cli(capsys, "lookup", "--from", str(bundle), "--step", str(step["step"]), "--request", client, "--token", "40", "--json")
    doc = json.loads(out)
    assert code == 0, err
    t = index(bundle, step["file"])
    assert doc["physical_block"] == int(t["block_table"][0, 1]) and doc["slot"] == doc["physical_block"] * 32 + 8


def test_a_planted_bad_table_entry_and_bad_slot_are_caught_at_their_steps(model, tmp_path, capsys):
    """Report mode: the guard names each bug at its step, closes the bundle that holds the
    first, and the server goes on serving. The names are held to check's on that bundle."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    table_step, slot_step = 40, 70
    plant = f"{table_step}:table:0:last:{NUM_BLOCKS - 1},{slot_step}:slot:0:1"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "report", "PAGETRACE_GUARD_PLANT": plant, "PAGETRACE_RING_MIB": "64"}
    with server(model, log, env) as (proc, port):
        results = load(port)
        assert all(code == 200 for code, _ in results.values()), results  # report only: every request served
        assert get(port, "/health")[0] == 200 and complete(port, 0)[0] == 200
        worker = worker_pid(proc.pid)
        os.kill(worker, signal.SIGUSR1)  # close the bundle capture is writing now
        wait_for(log, "pagetrace: signal SIGUSR1: ")
        os.kill(worker, signal.SIGUSR2)  # pause the guard (signals are not queued: one at a time)
        wait_for(log, "pagetrace guard: paused")
        os.kill(worker, signal.SIGUSR2)  # and resume it
        wait_for(log, "pagetrace guard: resumed")
    second, third = manifest(tmp_path / "capture.bundle.2"), manifest(tmp_path / "capture.bundle.3")
    assert second["closed"] == f"guard, step {slot_step}" and second["steps"][0]["step"] == table_step + 1  # each flagged step closes its bundle
    assert third["closed"] == "signal SIGUSR1" and third["steps"][0]["step"] == slot_step + 1
    assert "pagetrace guard: paused after step" in log.read_text() and "µs each" in log.read_text()
    lines = guard_lines(log)
    at = {int(line.split("step ")[1].split(" ")[0]) for line in lines}
    assert at == {table_step, slot_step}, lines
    closed = manifest(bundle)
    assert closed["closed"] == f"guard, step {table_step}" and closed["steps"][-1]["step"] == table_step
    assert (tmp_path / "capture.bundle.2").is_dir()  # capture went on
    # check on the bundle names what the guard named, field for field
    code, out, err = cli(capsys, "check", str(bundle), "--step", str(table_step), "--no-data", "--json")
    found = json.loads(out)["steps"][0]["violations"]
    assert code == 1 and found, out
    t = index(bundle, closed["steps"][-1]["file"])
    first = found[0]
    seq_len = int(t["seq_lens"][0])
    want = ("slot", closed["steps"][-1]["requests"][0], seq_len - 1, (seq_len - 1) // 32, NUM_BLOCKS - 1, int(t["slot_mapping"][int(t["query_start_loc"][1]) - 1]))
    assert (first["check"], first["request"], first["token"], first["logical_block"], first["physical_block"], first["slot"]) == want
    line = next(x for x in lines if f"step {table_step} " in x)
    client = closed["steps"][-1]["client_requests"][0]
    assert line.startswith(f"pagetrace guard: step {table_step} · slot · request {client} · token {want[2]} · logical block {want[3]} · "
                           f"physical block {want[4]} · slot {want[5]} · byte {first['byte']}: "), line
    slot_line = next(x for x in lines if f"step {slot_step} " in x)
    assert " · slot · " in slot_line and "slot_mapping[0] = " in slot_line


PLANTS = {20: ("table:0:0:5000000", "pool", 5_000_000), 30: (f"table:1:0:{NUM_BLOCKS}", "pool", NUM_BLOCKS), 40: ("table:0:0:-1", "pool", -1),
          50: ("table:2:last:0", "null", 0), 60: ("slot:1:1000000", "slot", None)}


def test_report_mode_makes_far_bad_entries_safe_and_the_server_goes_on(model, tmp_path, capsys):
    """Report mode, entries far outside the pool, one past it, negative, the null block, a slot
    a million past: each step's evidence is written and its bundle closed before the forward,
    the entries made safe (the kernel never reads them), the server serves every request, and
    `check` names the violation from the bundle while `replay` refuses the step."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    plant = ",".join(f"{step}:{what}" for step, (what, _, _) in PLANTS.items())
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "report", "PAGETRACE_GUARD_PLANT": plant, "PAGETRACE_RING_MIB": "16"}
    with server(model, log, env) as (proc, port):
        results = load(port)
        assert all(code == 200 for code, _ in results.values()), (results, log.read_text()[-3000:])
        assert get(port, "/health")[0] == 200 and complete(port, 0)[0] == 200
    text = log.read_text()
    assert "Segmentation fault" not in text and "Segfault" not in text and "EngineCore encountered a fatal error" not in text
    made_safe = [x[x.index("pagetrace guard: step "):] for x in text.splitlines() if "made safe before the forward" in x]
    assert [int(x.split()[3].rstrip(":")) for x in made_safe] == sorted(PLANTS), made_safe
    for n, (step, (what, check, block)) in enumerate(sorted(PLANTS.items())):
        path = bundle if n == 0 else tmp_path / f"capture.bundle.{n + 1}"
        m = manifest(path)
        assert m["closed"] == f"guard, step {step}" and m["steps"][-1]["step"] == step, (path, m.get("closed"))
        entry = m["steps"][-1]
        assert entry["guard"]["mode"] == "report" and entry["guard"]["made_safe"]["requests"] and "flagged by the guard" in entry["note"]
        code, out, err = cli(capsys, "check", str(path), "--step", str(step), "--json")
        found = json.loads(out)["steps"][0]["violations"]
        assert code == 1 and check in {v["check"] for v in found}, (step, err, found)
        if block is not None:
            assert any(v["check"] == check and v["physical_block"] == block for v in found), (step, found)
        code, out, err = cli(capsys, "replay", str(path), "--step", str(step), "--backend", "torch")
        assert code == 1 and f"step {step} (the guard flagged it): " in err and "replay cannot judge attention here" in err, err


def test_abort_mode_fails_exactly_the_planted_request_and_the_server_goes_on(model, tmp_path, capsys):
    """Abort mode, an entry far outside the pool in row 0 at step 20: the step is made safe as in
    report, and the request of that row is failed through vLLM's scheduler (its block reported in
    KVConnectorOutput.invalid_block_ids): exactly that request gets an error, the other five
    their 150 tokens, and the server answers the next request."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "abort", "PAGETRACE_GUARD_PLANT": "20:table:0:0:5000000", "PAGETRACE_RING_MIB": "16"}
    with server(model, log, env) as (proc, port):
        results = load(port)
        assert get(port, "/health")[0] == 200 and complete(port, 0)[0] == 200
    text = log.read_text()
    fails = re.findall(r"pagetrace guard: step \d+: request (\S+) fails: its block \d+ is reported", text)
    assert len(fails) == 1, text[-3000:]
    planted = fails[0].rsplit("-", 2)[0]  # cmpl-loadN-0-<8 hex> -> cmpl-loadN
    failed = {i for i, (code, _) in results.items() if code != 200}
    assert failed == {int(planted.removeprefix("cmpl-load"))} and all(results[i][0] >= 500 for i in failed), (planted, results)  # vLLM's error response
    assert all(len(doc["choices"][0]["token_ids"]) == MAX_TOKENS for i, (code, doc) in results.items() if i not in failed)
    m = manifest(bundle)
    assert m["closed"] == "guard, step 20" and m["steps"][-1]["guard"]["mode"] == "abort"
    assert m["steps"][-1]["guard"]["affected"][0].startswith(planted + "-")


def test_raise_mode_stops_the_step_and_vllm_stops_the_engine(model, tmp_path):
    """A table entry outside the pool, planted at step 20: the guard raises before the kernel
    reads it. vLLM treats any exception in the model runner as fatal (v1/engine/core.py,
    run_engine_core: "EngineCore encountered a fatal error"): the requests in flight fail and
    the server shuts down. The bundle holds the bad step, its pages as they were."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "raise", "PAGETRACE_GUARD_PLANT": f"20:table:0:0:{NUM_BLOCKS + 1000}"}
    with server(model, log, env) as (proc, port):
        results = load(port)
        proc.wait(timeout=60)  # the engine died; vLLM's API server exits
    assert any(code != 200 for code, _ in results.values()), results
    lines = guard_lines(log)
    assert lines and lines[0].startswith(f"pagetrace guard: step 20 · pool · request cmpl-load") and f"physical block {NUM_BLOCKS + 1000}" in lines[0], lines
    assert "pagetrace guard stopped step 20 before the kernel read it" in log.read_text()
    m = manifest(bundle)
    assert m["steps"][-1]["step"] == 20 and "stopped by the guard" in m["steps"][-1]["note"] and m["closed"] == "guard, step 20"


def test_a_layer_the_model_lacks_refuses_to_start_in_one_line(model, tmp_path):
    log = tmp_path / "server.log"
    with server(model, log, {"PAGETRACE_CAPTURE": str(tmp_path / "b"), "PAGETRACE_LAYERS": "0,5"}, expect_start=False) as (proc, port):
        proc.wait(timeout=120)
    assert proc.returncode == 1
    # pagetrace's own lines only: its messages start "pagetrace: " or "pagetrace guard: " (at the line's start or after
    # vLLM's log prefix); a path that holds the word (a venv under a pagetrace checkout, named in vLLM's warnings) is not one
    lines = [x for x in log.read_text().splitlines() if re.search(r"(^|\s)pagetrace( guard)?: ", x)]
    assert lines == ["pagetrace: refusing to start vLLM: invalid value for PAGETRACE_LAYERS: '0,5': layer 5 does not exist; the model has layers 0..1"]
    assert "Traceback" not in log.read_text() and not (tmp_path / "b").exists()


CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2, reason="tensor parallelism 2 on vllm-cpu binds one CPU per rank; this process may use one")
def test_tensor_parallel_2_writes_one_bundle_per_rank(model, tmp_path, capsys):
    """TP 2 on the CPU: two workers (VLLM::Worker_TP0, _TP1), each with half the heads and its own
    cache; each writes its bundle, the rank in its manifest. vllm-cpu binds each rank's threads
    to a NUMA node and refuses with one node ("Not enough allowed NUMA nodes"), so the test binds
    them by hand, one CPU each (VLLM_CPU_OMP_THREADS_BIND, vllm/platforms/cpu.py)."""
    bundle, log = tmp_path / "capture.bundle", tmp_path / "server.log"
    env = {"PAGETRACE_CAPTURE": str(bundle), "PAGETRACE_GUARD": "raise", "VLLM_CPU_OMP_THREADS_BIND": f"{CPUS[0]}|{CPUS[1]}"}
    with server(model, log, env, extra=("--tensor-parallel-size", "2")) as (proc, port):
        results = load(port)
    assert all(code == 200 for code, _ in results.values()), results
    assert guard_lines(log) == []
    for rank in (0, 1):
        path = tmp_path / f"capture.bundle.rank{rank}"
        m = manifest(path)
        assert (m["engine"]["rank"], m["engine"]["world_size"]) == (rank, 2)
        assert (m["model"]["num_heads"], m["model"]["num_kv_heads"]) == (2, 1)  # 4 heads and 2 KV heads over 2 ranks
        code, out, err = cli(capsys, "check", str(path), "--no-data", "--json")
        assert code == 0 and json.loads(out)["passed"]
        step = m["steps"][len(m["steps"]) // 2]["step"]
        code, out, err = cli(capsys, "replay", str(path), "--step", str(step), "--backend", "interpret", "--json")
        doc = json.loads(out)
        assert code == 0 and doc["passed"] and all(r["max_diff_engine"] <= BF16_TOL for r in doc["requests"]), doc
    assert not bundle.exists()
    text = log.read_text()
    for rank in (0, 1):  # each rank's log line names the bundle it writes
        assert f"capture to {tmp_path}/capture.bundle.rank{rank} (" in text and f"rank {rank} of 2" in text
    code, out, err = cli(capsys, "check", str(bundle), "--no-data")  # the base path: the rank bundles to choose from
    assert code == 2 and f"{bundle}.rank0, {bundle}.rank1; name one" in err, err
