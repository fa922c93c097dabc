"""The guard's counts on a real vLLM server's own /metrics (guard_metrics.py), in both of the
ways vLLM serves Prometheus: its default registry in the API server, and prometheus_client's
multiprocess mode (PROMETHEUS_MULTIPROC_DIR, set here by hand as a user may; vLLM sets it for
more than one API server). The server, the model and the load are test_vllm_serve's: six
completions at once on a pool of 24 blocks, the guard with one bad table entry planted far outside
the pool: in report mode on the default registry, in abort mode (the planted request fails) in
multiprocess mode, so every counter is seen move. The counts are held to the worker's own log: its SIGUSR2 line
("paused after step N; K steps checked so far, X µs each") and its violation lines.
"""

from __future__ import annotations

import collections
import os
import re
import signal
import time

import pytest

from test_vllm_serve import REQUESTS, get, guard_lines, load, model, server, wait_for, worker_pid  # noqa: F401  (model: the fixture)

pytestmark = pytest.mark.vllm
CHECKS = ("query", "capacity", "pool", "null", "slot", "position", "collision", "sharing")
PLANT_STEP = 20


def scrape(port: int) -> dict:
    """The pagetrace_guard_ samples of one scrape, parsed by prometheus_client's own parser:
    {(sample name, labels as sorted tuples): value}, and each family's type."""
    from prometheus_client.parser import text_string_to_metric_families

    code, text = get(port, "/metrics")
    assert code == 200, text[:500]
    samples, types = {}, {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("pagetrace_guard_"):
            types[family.name] = family.type
            for s in family.samples:
                samples[s.name, tuple(sorted(s.labels.items()))] = s.value
    return {"samples": samples, "types": types, "vllm": "vllm:" in text}


def value(doc: dict, name: str, **labels) -> float:
    return doc["samples"][name, tuple(sorted(dict(rank="0", **labels).items()))]


def violations(doc: dict) -> dict[str, float]:
    return {dict(labels)["check"]: v for (name, labels), v in doc["samples"].items() if name == "pagetrace_guard_violations_total"}


@pytest.mark.parametrize("mode,multiprocess", [("report", False), ("abort", True)], ids=["report-registry", "abort-multiprocess"])
def test_metrics_count_the_steps_the_planted_violation_and_the_time(model, tmp_path, mode, multiprocess):
    log = tmp_path / "server.log"
    env = {"PAGETRACE_GUARD": mode, "PAGETRACE_GUARD_PLANT": f"{PLANT_STEP}:table:0:0:5000000"}
    if multiprocess:
        (tmp_path / "prom").mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "prom")
    with server(model, log, env) as (proc, port):
        before = scrape(port)
        results = load(port)
        failed = sorted(i for i, (code, _) in results.items() if code != 200)
        assert len(failed) == (mode == "abort"), results  # abort: the planted request fails, alone
        os.kill(worker_pid(proc.pid), signal.SIGUSR2)  # pause the guard: the log line gives its own count
        wait_for(log, "pagetrace guard: paused")
        paused = re.search(r"pagetrace guard: paused after step (\d+); (\d+) steps checked so far, (\d+) µs each", log.read_text())
        assert paused, log.read_text()[-2000:]
        steps, us = int(paused[2]), int(paused[3])
        deadline = time.monotonic() + 15  # the worker writes its counts once a second
        after = scrape(port)
        while value(after, "pagetrace_guard_steps_checked_total") != steps and time.monotonic() < deadline:
            time.sleep(0.2)
            after = scrape(port)
    assert before["vllm"] and after["vllm"]  # vLLM's own metrics are still there, on the same page
    # every series from the start, at 0 (the health check passed before any step ran)
    assert value(before, "pagetrace_guard_steps_checked_total") == 0
    assert violations(before) == dict.fromkeys(CHECKS, 0.0)
    assert set(after["types"]) == {"pagetrace_guard_steps_checked", "pagetrace_guard_seconds", "pagetrace_guard_violations",
                                   "pagetrace_guard_flagged_steps", "pagetrace_guard_requests_made_safe", "pagetrace_guard_requests_failed"}
    assert set(after["types"].values()) == {"counter"}
    # the steps the worker checked, as its own log counts them
    assert steps > PLANT_STEP and value(after, "pagetrace_guard_steps_checked_total") == steps
    per_step = value(after, "pagetrace_guard_seconds_total") / steps * 1e6
    assert abs(per_step - us) <= 0.5 + 1e-6, (per_step, us)  # the log rounds to whole µs
    # exactly the planted violation, as the worker's violation lines name it
    logged = collections.Counter(line.split(" · ")[1] for line in guard_lines(log))
    assert logged == {"pool": 1}, guard_lines(log)
    assert {k: v for k, v in violations(after).items() if v} == {"pool": 1.0}
    assert set(violations(after)) == set(CHECKS)
    assert value(after, "pagetrace_guard_flagged_steps_total") == 1
    assert value(after, "pagetrace_guard_requests_made_safe_total") == 1  # row 0's request, for that step
    assert value(after, "pagetrace_guard_requests_failed_total") == len(failed)  # report fails nobody
    assert len(results) == REQUESTS
