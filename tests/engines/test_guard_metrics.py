"""guard_metrics without a server: the exposition as prometheus_client's own parser reads it, in
both of the ways the counts reach vLLM's /metrics (a file the API server's collector reads, and
prometheus_client's multiprocess files), and when the worker writes (only when the counts
changed; a flagged step at once). prometheus_client comes with the vllm extra: these run in the
vLLM step of CI (marked vllm) and are skipped without it."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from pagetrace.engines import guard_metrics  # noqa: E402
from pagetrace.engines.check import Violation  # noqa: E402

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def parsed(text: str) -> dict:
    """{(sample name, sorted labels): value} of the pagetrace_guard_ families, and their types."""
    samples, types_ = {}, {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("pagetrace_guard_"):
            types_[family.name] = family.type
            for s in family.samples:
                samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return {"samples": samples, "types": types_}


def scrape(collector) -> dict:
    registry = CollectorRegistry()
    registry.register(collector)
    return parsed(generate_latest(registry).decode())


def key(name: str, **labels) -> tuple:
    return name, tuple(sorted(labels.items()))


class FakeTap:
    """The Tap's counters as vllm.Tap keeps them."""

    def __init__(self) -> None:
        self.guard_steps, self.guard_seconds, self.affected, self.failed = 0, 0.0, [], 0


class Recording:
    def __init__(self) -> None:
        self.writes: list[dict] = []

    def write(self, counts: dict) -> None:
        self.writes.append(json.loads(json.dumps(counts)))


def found(*checks: str) -> list[Violation]:
    return [Violation(c, 7, "planted") for c in checks]


def test_two_ranks_counts_are_scraped_with_their_labels(tmp_path):
    counts = {0: dict(steps_checked=1000, seconds=0.25, violations={"pool": 2, "slot": 0}, flagged_steps=1, requests_made_safe=3, requests_failed=1),
              1: dict(steps_checked=999, seconds=0.5, violations={"guard": 1}, flagged_steps=1, requests_made_safe=0, requests_failed=0)}
    for rank, c in counts.items():
        guard_metrics.FileSink(str(tmp_path), rank).write(dict(c, rank=rank))
    doc = scrape(guard_metrics.FileCollector(str(tmp_path)))
    assert set(doc["types"].values()) == {"counter"} and len(doc["types"]) == 6
    for rank, c in counts.items():
        r = str(rank)
        assert doc["samples"][key("pagetrace_guard_steps_checked_total", rank=r)] == c["steps_checked"]
        assert doc["samples"][key("pagetrace_guard_seconds_total", rank=r)] == c["seconds"]
        assert doc["samples"][key("pagetrace_guard_flagged_steps_total", rank=r)] == c["flagged_steps"]
        assert doc["samples"][key("pagetrace_guard_requests_made_safe_total", rank=r)] == c["requests_made_safe"]
        assert doc["samples"][key("pagetrace_guard_requests_failed_total", rank=r)] == c["requests_failed"]
        for check, n in c["violations"].items():
            assert doc["samples"][key("pagetrace_guard_violations_total", rank=r, check=check)] == n
    assert len(doc["samples"]) == 2 * 5 + 3  # nothing else
    # a file rewritten: the scrape shows the new counts, whole
    guard_metrics.FileSink(str(tmp_path), 0).write(dict(counts[0], rank=0, steps_checked=1001))
    assert scrape(guard_metrics.FileCollector(str(tmp_path)))["samples"][key("pagetrace_guard_steps_checked_total", rank="0")] == 1001
    assert sorted(os.listdir(tmp_path)) == ["rank0.json", "rank1.json"]  # no temporary file left


def test_no_worker_yet_no_samples_and_a_torn_file_is_skipped(tmp_path):
    assert scrape(guard_metrics.FileCollector(str(tmp_path)))["samples"] == {}
    assert scrape(guard_metrics.FileCollector(str(tmp_path / "gone")))["samples"] == {}
    (tmp_path / "rank0.json").write_text('{"rank": 0, "steps_che')
    assert scrape(guard_metrics.FileCollector(str(tmp_path)))["samples"] == {}


def test_the_exporter_counts_kinds_and_requests_and_writes_only_what_changed():
    tap, sink = FakeTap(), Recording()
    exporter = guard_metrics.Exporter(tap, 0, sink, interval=3600)
    exporter.flush()
    exporter.flush()  # nothing changed: no second write
    assert len(sink.writes) == 1 and sink.writes[0]["violations"] == dict.fromkeys(guard_metrics.CHECKS, 0)
    planted = [("pool", "pool", "slot"), ("null",), ("guard",)]
    for n, checks in enumerate(planted):
        tap.guard_steps += 10
        tap.guard_seconds += 0.001
        exporter.flagged(found(*checks))  # written at once, before the forward
        assert len(sink.writes) == 2 + n and sink.writes[-1]["flagged_steps"] == n + 1
        tap.affected.append((tap.guard_steps, [f"req{n}-{i}" for i in range(n + 1)]))
    tap.failed = 2
    exporter.flush()
    last = sink.writes[-1]
    want = collections.Counter(c for checks in planted for c in checks)
    assert {k: v for k, v in last["violations"].items() if v} == want
    assert (last["steps_checked"], last["flagged_steps"], last["requests_made_safe"], last["requests_failed"]) == (30, 3, 1 + 2 + 3, 2)
    assert abs(last["seconds"] - 0.003) < 1e-12
    exporter.flush()
    assert len(sink.writes) == 5  # still nothing new


def test_the_exporters_thread_writes_a_step_within_its_interval_and_nothing_while_idle():
    tap, sink = FakeTap(), Recording()
    exporter = guard_metrics.Exporter(tap, 0, sink, interval=0.05).start()
    try:
        tap.guard_steps = 5
        deadline = time.monotonic() + 5
        while sink.writes[-1]["steps_checked"] != 5:
            assert time.monotonic() < deadline, sink.writes
            time.sleep(0.01)
        before = len(sink.writes)
        time.sleep(0.3)  # six intervals, idle
        assert len(sink.writes) == before
    finally:
        exporter.stop()
    assert not exporter.thread.is_alive()


def test_a_sink_that_fails_is_told_once_and_never_raises():
    class Broken:
        def write(self, counts):
            raise OSError("No space left on device")

    told = []
    exporter = guard_metrics.Exporter(FakeTap(), 0, Broken(), log=told.append)
    exporter.flagged(found("pool"))
    exporter.tap.guard_steps = 3
    exporter.flush()
    assert told == ["pagetrace guard: cannot export the guard's counts to /metrics: No space left on device"]


def test_serve_registers_the_collector_once_in_the_first_process(monkeypatch):
    from prometheus_client import REGISTRY

    monkeypatch.setitem(sys.modules, "vllm", sys.modules.get("vllm") or types.ModuleType("vllm"))  # as when vLLM loads the plugin
    env: dict = {}
    guard_metrics.serve(env)
    collector = next(c for c in list(REGISTRY._collector_to_names) if isinstance(c, guard_metrics.FileCollector))
    try:
        folder = env[guard_metrics.DIR_ENV]
        assert os.path.isdir(folder) and collector.folder == folder
        guard_metrics.serve(env)  # a child process: the folder is named already
        assert sum(isinstance(c, guard_metrics.FileCollector) for c in REGISTRY._collector_to_names) == 1
        sink = guard_metrics.sink_for(3, env)
        assert isinstance(sink, guard_metrics.FileSink)
        sink.write(dict(rank=3, steps_checked=4, seconds=0.0, violations={}, flagged_steps=0, requests_made_safe=0, requests_failed=0))
        doc = parsed(generate_latest(REGISTRY).decode())
        assert doc["samples"][key("pagetrace_guard_steps_checked_total", rank="3")] == 4
        multi = {guard_metrics.MULTIPROC_ENV: "/x"}
        guard_metrics.serve(multi)  # multiprocess mode: vLLM serves the folder's files, not REGISTRY
        assert guard_metrics.DIR_ENV not in multi
        assert guard_metrics.sink_for(0, {}) is None  # nobody serves: nothing to write
    finally:
        REGISTRY.unregister(collector)
        guard_metrics._SERVED.cleanup()


WORKER = """
import sys
from types import SimpleNamespace
from pagetrace.engines import guard_metrics
from pagetrace.engines.check import Violation
tap = SimpleNamespace(guard_steps=0, guard_seconds=0.0, affected=[], failed=0)
sink = guard_metrics.sink_for(int(sys.argv[1]))
assert sink.reaches()
exporter = guard_metrics.Exporter(tap, int(sys.argv[1]), sink, interval=3600)
exporter.flush()
tap.guard_steps, tap.guard_seconds = 40, 0.002
exporter.flagged([Violation("pool", 20, "x"), Violation("pool", 20, "y")])
tap.affected.append((20, ["a"]))
tap.guard_steps, tap.guard_seconds, tap.failed = 100, 0.005, 1
exporter.flagged([Violation("collision", 70, "z")])
exporter.flush()
"""


def test_multiprocess_mode_the_workers_counters_sum_to_their_counts(tmp_path):
    """Two workers (ranks 0 and 1) in processes of their own with PROMETHEUS_MULTIPROC_DIR, each
    writing four times; read as vLLM's API server reads them (a MultiProcessCollector on that folder)."""
    from prometheus_client import multiprocess

    env = {k: v for k, v in os.environ.items() if k not in (guard_metrics.DIR_ENV,)}
    env.update(PROMETHEUS_MULTIPROC_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    for rank in (0, 1):
        done = subprocess.run([sys.executable, "-c", WORKER, str(rank)], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(tmp_path))
    doc = parsed(generate_latest(registry).decode())
    assert set(doc["types"].values()) == {"counter"} and len(doc["types"]) == 6
    for r in ("0", "1"):
        s = doc["samples"]
        assert s[key("pagetrace_guard_steps_checked_total", rank=r)] == 100  # the last count, not the sum of the writes
        assert abs(s[key("pagetrace_guard_seconds_total", rank=r)] - 0.005) < 1e-12
        assert s[key("pagetrace_guard_flagged_steps_total", rank=r)] == 2
        assert s[key("pagetrace_guard_requests_made_safe_total", rank=r)] == 1
        assert s[key("pagetrace_guard_requests_failed_total", rank=r)] == 1
        kinds = {dict(labels)["check"]: v for (name, labels), v in s.items() if name == "pagetrace_guard_violations_total" and dict(labels)["rank"] == r}
        assert kinds == dict(dict.fromkeys(guard_metrics.CHECKS, 0.0), pool=2.0, collision=1.0)


LATE = """
import multiprocessing, os, sys
import prometheus_client  # loaded first, as vLLM's parent does, then the variable set
os.environ["PROMETHEUS_MULTIPROC_DIR"] = sys.argv[1]

def worker():
    from types import SimpleNamespace
    from pagetrace.engines import guard_metrics
    told = []
    tap = SimpleNamespace(guard_steps=0, guard_seconds=0.0, affected=[], failed=0)
    print(guard_metrics.start(tap, 0, log=told.append), told)

if __name__ == "__main__":
    p = multiprocessing.get_context("fork").Process(target=worker)
    p.start()
    p.join()
"""


def test_a_worker_forked_before_the_variable_reached_prometheus_client_says_its_counts_cannot_reach_metrics(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_MULTIPROC_DIR", guard_metrics.DIR_ENV)}
    script = tmp_path / "late.py"
    script.write_text(LATE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=dict(env, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("None [\"pagetrace guard: the guard's counts cannot reach /metrics: prometheus_client was loaded in this process before "), done.stdout
    assert not list(tmp_path.glob("*.db"))
