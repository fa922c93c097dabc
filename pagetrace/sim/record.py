"""Record a real server's workload from the client side, with its KV events.

A load generator that writes down what it sent: each request goes to the server's
OpenAI-compatible `/v1/completions` with its prompt as token ids (the server may run with
`--skip-tokenizer-init`), `max_tokens`, `n`, `cache_salt`, `priority`, `ignore_eos` and
`return_token_ids` (a vLLM extension: the answer carries the generated token ids, which
decide the hashes of the blocks a request fills while decoding). Meanwhile a thread takes
the server's KV events (events.py `listen`). The trace (trace.py) and the events file
(events.py) are what `simulate --trace T --events E` compares.

`sequential=True` sends a request when the previous one has answered, so the server runs
one request at a time and its schedule does not depend on timing: each request's `arrival`
step is then placed after the previous one's last step (a request takes at most one step
per token). Concurrent sending (`sequential=False`) records times; arrival steps are then
the times divided by `step_seconds`, an estimate, and a comparison says where the server's
timing made it differ.

A hook inside the server (the live-capture plugin) can write the same trace with
`TraceWriter` and exact arrival steps.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from ..errors import RuntimeFailure
from .events import file_bytes, listen
from .trace import TraceHeader, TraceRecord, TraceWriter


@dataclass(slots=True)
class Send:
    """One request to send."""

    id: str
    prompt: list[int]
    max_tokens: int
    n: int = 1
    cache_salt: str | None = None
    priority: int = 0


def complete(url: str, model: str, send: Send, timeout: float) -> list[list[int]]:
    """POST one completion; the generated token ids of each sample, in index order."""
    body = {"model": model, "prompt": send.prompt, "max_tokens": send.max_tokens, "n": send.n, "ignore_eos": True,
            "return_token_ids": True, "temperature": 0}
    if send.n > 1:  # vLLM refuses n > 1 with greedy sampling; the samples' tokens are recorded whatever they are
        body.update(temperature=1.0, seed=0)
    if send.cache_salt is not None:
        body["cache_salt"] = send.cache_salt
    if send.priority:
        body["priority"] = send.priority
    req = urllib.request.Request(f"{url.rstrip('/')}/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", "X-Request-Id": send.id})  # the server's own trace names it
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            doc = json.loads(r.read())
    except urllib.error.HTTPError as exc:
        raise RuntimeFailure(f"{url}: request {send.id} failed: HTTP {exc.code} {exc.read()[:200]!r}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise RuntimeFailure(f"{url}: request {send.id} failed: {getattr(exc, 'reason', exc)}") from None
    choices = sorted(doc.get("choices", []), key=lambda c: c.get("index", 0))
    outs = [c.get("token_ids") for c in choices]
    if len(outs) != send.n or any(not isinstance(o, list) for o in outs):
        raise RuntimeFailure(f"{url}: request {send.id}: the answer has no token_ids for each of its {send.n} samples (a vLLM server answers return_token_ids)")
    return outs


def record(url: str, model: str, sends: list[Send], *, block_size: int | None = None, hashes_only: bool = False,
           events: str | None = None, events_bind: bool = False, sequential: bool = True, step_seconds: float = 0.05,
           timeout: float = 120.0, events_idle: float = 2.0, hash_seed: str | None = None) -> tuple[TraceWriter, bytes | None]:
    """Send every request, record the trace; with `events`, the KV events file's bytes too."""
    header = TraceHeader(block_size=block_size, hashes_only=hashes_only, hash_seed=hash_seed,
                         source={"recorder": "pagetrace.sim.record", "server": url, "sequential": sequential})
    writer = TraceWriter(header)
    got: list = []
    done = threading.Event()
    listener = None
    failure: list[BaseException] = []
    if events is not None:
        ready = threading.Event()

        def run() -> None:
            try:
                listen(events, bind=events_bind, idle_timeout=timeout * 10, max_seconds=timeout * (len(sends) + 2),
                       on_message=lambda f, t: got.append((f, t)), stop=lambda: done.is_set(), on_ready=ready.set)
            except BaseException as exc:  # reported after the sends
                failure.append(exc)
                ready.set()

        listener = threading.Thread(target=run, daemon=True, name="kv-events")
        listener.start()
        if not ready.wait(10):
            raise RuntimeFailure(f"could not open the KV events socket {events} within 10 s")
        time.sleep(0.5)  # ZMQ's slow joiner: the connection (or the publisher's reconnect) takes a moment
    start = time.monotonic()
    arrival = 0
    threads = []
    lock = threading.Lock()

    def one(send: Send, t: float, step: int) -> None:
        try:
            outs = complete(url, model, send, timeout)
        except BaseException as exc:  # raised after every request has been sent
            failure.append(exc)
            return
        with lock:
            writer.add(TraceRecord(send.id, list(send.prompt), send.max_tokens, step, t, outs, send.n, send.cache_salt, None, send.priority))

    try:
        for send in sends:
            t = time.monotonic() - start
            if failure:
                break
            if sequential:
                one(send, t, arrival)
                arrival += len(send.prompt) + send.max_tokens + 1  # at most one step per token, then idle
            else:
                th = threading.Thread(target=one, args=(send, t, int(t / step_seconds)), daemon=True)
                th.start()
                threads.append(th)
        for th in threads:
            th.join(timeout)
        if events is not None:
            last = len(got)
            quiet_since = time.monotonic()
            while time.monotonic() - quiet_since < events_idle:  # the last step's message may still be on its way
                time.sleep(0.1)
                if len(got) != last:
                    last, quiet_since = len(got), time.monotonic()
    finally:
        done.set()
        if listener is not None:
            listener.join(5)
    if failure:
        raise failure[0]
    writer.records.sort(key=lambda r: (r.arrival, r.time or 0.0))
    return writer, (file_bytes(got) if events is not None else None)
