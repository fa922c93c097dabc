"""Record the requests a `vllm serve` receives as a trace `simulate --trace` reads (sim/trace.py).

`PAGETRACE_TRACE=PATH` (vllm_plugin.py) patches vLLM 0.32's v1 `Scheduler`
(vllm/v1/core/sched/scheduler.py) in the engine-core process, the one that schedules:

- `schedule()` is counted: the scheduler's own step number (the engine core calls it only
  when it has requests, v1/engine/core.py `step`, as the simulator skips idle steps);
- `add_request(request)` notes the request's arrival step (the number of `schedule()` calls
  before it), its arrival time and the order it came in;
- `_free_request(request)`, which every finished request passes through (a stop or a length
  limit from `update_from_output`, an abort from `finish_requests`), writes its line: prompt
  token ids (or, `PAGETRACE_TRACE_PRIVATE=1`, only the prompt length and vLLM's own block
  hashes, `request.block_hashes`, as its KV events carry them), the output token ids, max_tokens,
  cache_salt, LoRA name, priority, and the client's request id.

vLLM's API server SIGKILLs the engine core right after SIGTERM (v1/utils.py `shutdown`), so
nothing can be written at stop: the header goes down when the scheduler is made, and each
finished request is one appended line, flushed and fsynced, so a killed engine leaves a valid
trace up to its last finished request. vLLM runs `n > 1` as n child requests (`0_ID`, `1_ID`:
v1/engine/parallel_sampling.py), so a trace from the server has one line per sample, n = 1.
"""

from __future__ import annotations

import json
import os
import re
import time

TARGET = "vllm.v1.core.sched.scheduler"
_RANDOM_SUFFIX = re.compile(r"-[0-9a-zA-Z]{8}$")  # input_processor.py assign_request_id: ID + "-" + 8 random chars


def problem_with(path: str) -> str | None:
    """What makes PATH unusable for a trace, or None (checked in the API server before vLLM starts)."""
    if os.path.lexists(path):
        return "already exists; choose a new trace file"
    parent = os.path.dirname(path) or "."
    if not os.path.isdir(parent):
        return f"its folder {parent!r} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"its folder {parent!r} is not writable"
    return None


def client_id(request_id: str) -> str:
    """The client's id (`cmpl-X-0`) of vLLM's internal one (`cmpl-X-0-1a2b3c4d`)."""
    return _RANDOM_SUFFIX.sub("", request_id)


class SchedulerTrace:
    """One engine core's trace file: the header at start, then one line per finished request."""

    def __init__(self, path: str, private: bool, scheduler) -> None:
        from ..sim.trace import TraceHeader, TraceWriter
        from ..sim.vllm_hash import server_seed

        cache = scheduler.cache_config
        import vllm

        self.header = TraceHeader(block_size=int(scheduler.hash_block_size), hashes_only=private,
                                  hash_algo=str(cache.prefix_caching_hash_algo), hash_seed=server_seed(),
                                  source={"recorder": "pagetrace vllm_plugin (Scheduler hook)", "engine": f"vllm {vllm.__version__}",
                                          "prefix_caching": bool(cache.enable_prefix_caching)})
        self.writer = TraceWriter(self.header)
        self.steps = 0  # schedule() calls so far
        self.seq = 0
        self.t0: float | None = None
        self.arrived: dict[str, tuple[int, float, int]] = {}  # request id -> (step, time, seq)
        # O_EXCL: never replaces a file or follows a link made since the server's check
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        self._append(self.header.to_json())

    def _append(self, doc: dict) -> None:
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]
        os.fsync(self.fd)

    def arrive(self, request) -> None:
        if request.request_id in self.arrived:  # a streaming session's next chunk: the same request
            return
        t = float(request.arrival_time)
        if self.t0 is None:
            self.t0 = min(t, time.time())
        self.arrived[request.request_id] = (self.steps, t - self.t0, self.seq)
        self.seq += 1

    def finish(self, request) -> None:
        from ..sim.trace import TraceRecord
        from ..sim.vllm_hash import external

        got = self.arrived.pop(request.request_id, None)
        if got is None:
            return
        step, t, seq = got
        lora = request.lora_request
        record = TraceRecord(id=request.request_id, prompt=list(request.prompt_token_ids or []), max_tokens=int(request.max_tokens),
                             arrival=step, time=max(t, 0.0), outputs=[list(request.output_token_ids)], n=1,
                             cache_salt=request.cache_salt, lora_name=lora.lora_name if lora is not None else None,
                             priority=int(request.priority), seq=seq, client_id=client_id(request.request_id))
        if self.header.hashes_only:
            record.block_hashes = [h if isinstance(h, int) else external(bytes(h)) for h in request.block_hashes]
        if not record.outputs[0]:  # aborted before its first token: its length is what it asked for
            record.outputs = None
        self._append(self.writer.line(record))


_TRACE: SchedulerTrace | None = None


def patch_scheduler(module, path: str, private: bool, log=None) -> None:
    """Wrap Scheduler.__init__, schedule, add_request and _free_request (see the module doc)."""
    cls = module.Scheduler
    if getattr(cls, "_pagetrace_traced", False):
        return
    init, schedule, add_request, free = cls.__init__, cls.schedule, cls.add_request, cls._free_request

    def __init__(self, *args, **kwargs):
        global _TRACE
        init(self, *args, **kwargs)
        _TRACE = SchedulerTrace(path, private, self)
        self._pagetrace_trace = _TRACE
        if log is not None:
            log(f"pagetrace: recording every request to the trace {path} ({'block hashes only' if private else 'token ids'}, "
                f"blocks of {_TRACE.header.block_size})")

    def schedule_(self, *args, **kwargs):
        out = schedule(self, *args, **kwargs)
        trace = getattr(self, "_pagetrace_trace", None)
        if trace is not None:
            trace.steps += 1
        return out

    def add_request_(self, request, *args, **kwargs):
        trace = getattr(self, "_pagetrace_trace", None)
        if trace is not None:
            trace.arrive(request)
        return add_request(self, request, *args, **kwargs)

    def _free_request(self, request, *args, **kwargs):
        trace = getattr(self, "_pagetrace_trace", None)
        if trace is not None:
            trace.finish(request)
        return free(self, request, *args, **kwargs)

    cls.__init__, cls.schedule, cls.add_request, cls._free_request = __init__, schedule_, add_request_, _free_request
    cls._pagetrace_traced = True
