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

The header's `server` object is the scheduler's settings, read from vLLM 0.32's own objects
once `Scheduler.__init__` has made them (`scheduler_settings`). Each `schedule()` also appends a
step line: its time, the tokens it scheduled (`SchedulerOutput.num_scheduled_tokens`, v1/core/
sched/output.py), how many were prefill and how many requests decoded, and the context they read.

`PAGETRACE_EVENTS=PATH` records vLLM's KV events from the same scheduler: its publisher
(`Scheduler.kv_event_publisher`, made by `EventPublisherFactory.create`, vllm/distributed/
kv_events.py) is wrapped so every `KVEventBatch` it is given goes to PATH as well, encoded as
`ZmqEventPublisher` encodes it (`msgspec.msgpack.Encoder`, sequence numbers from 0, the topic of
the server's `--kv-events-config`), in pagetrace's file form (sim/events.py), the settings first.
KV events need no `--kv-events-config`: without one the scheduler is made with
`KVEventsConfig(enable_kv_cache_events=True, publisher="null")` (vllm/config/kv_events.py), so the
cache manager records them and nothing is published on the network.

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


def scheduler_settings(scheduler) -> dict:
    """The settings `simulate` needs, from a made v1 `Scheduler` (vllm/v1/core/sched/scheduler.py
    `__init__`, vLLM 0.32): the pool is `kv_cache_config.num_blocks` (v1/kv_cache_interface.py
    `KVCacheConfig`, the null block included, as the simulator counts it); the step budget is the
    scheduler's own `max_num_scheduled_tokens` (scheduler_config's `max_num_scheduled_tokens`, else
    its `max_num_batched_tokens`); `max_num_running_reqs` is `max_num_seqs`; `max_model_len` is the
    model config's. Chunked prefill and prefix caching are the scheduler and cache configs' flags
    (vllm/config/scheduler.py, vllm/config/cache.py)."""
    import vllm

    from ..sim.vllm_hash import server_seed

    cache, sched, model = scheduler.cache_config, scheduler.scheduler_config, scheduler.vllm_config.model_config
    kv = scheduler.kv_cache_config
    return {
        "block_size": int(scheduler.block_size), "hash_block_size": int(scheduler.hash_block_size or scheduler.block_size),
        "num_blocks": int(kv.num_blocks), "kv_cache_groups": len(kv.kv_cache_groups),
        "max_num_batched_tokens": int(scheduler.max_num_scheduled_tokens), "max_num_seqs": int(scheduler.max_num_running_reqs),
        "max_model_len": int(scheduler.max_model_len), "chunked_prefill": bool(sched.enable_chunked_prefill),
        "prefix_caching": bool(cache.enable_prefix_caching), "hash_algo": str(cache.prefix_caching_hash_algo),
        "hash_seed": server_seed(), "vllm": str(vllm.__version__), "model": str(model.served_model_name or model.model),
    }


def step_line(step: int, t: float, scheduler, output) -> dict:
    """What one `schedule()` ran: after it returns, each scheduled request's `num_computed_tokens`
    already counts this step's tokens (`_update_after_schedule`), so its context is that minus them."""
    prefill = decode = context = 0
    requests = scheduler.requests
    for rid, n in output.num_scheduled_tokens.items():
        req = requests.get(rid)
        if req is None:
            continue
        before = req.num_computed_tokens - n
        context += before
        if n == 1 and before >= req.num_prompt_tokens:
            decode += 1
        else:
            prefill += n
    return {"step": step, "time": round(t, 6), "tokens": int(output.total_num_scheduled_tokens),
            "requests": len(output.num_scheduled_tokens), "prefill_tokens": prefill, "decode_requests": decode, "context_tokens": context}


class EventsFile:
    """PAGETRACE_EVENTS: the scheduler's KV event batches, as its ZMQ publisher would send them."""

    def __init__(self, path: str, settings: dict, topic: str) -> None:
        import msgspec  # vLLM's own dependency: its publisher encodes with it

        from ..sim.events import FILE_MAGIC, settings_record

        self.encode = msgspec.msgpack.Encoder().encode
        self.topic = topic.encode()
        self.seq = 0
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        self._write(FILE_MAGIC + settings_record(settings, time.time()))

    def _write(self, data: bytes) -> None:  # unbuffered: a SIGKILLed engine core loses nothing written
        while data:
            data = data[os.write(self.fd, data):]

    def publish(self, batch) -> None:
        from ..sim.events import encode_record

        frames = [self.topic, self.seq.to_bytes(8, "big"), self.encode(batch)]
        self.seq += 1
        self._write(encode_record(frames, time.time()))


class RecordingPublisher:
    """The scheduler's publisher, with every batch also written to an `EventsFile`."""

    def __init__(self, inner, events: EventsFile) -> None:
        self._inner, self._events = inner, events

    def publish(self, batch) -> None:
        self._events.publish(batch)
        self._inner.publish(batch)

    def __getattr__(self, name):  # shutdown, get_publisher_config, ...: the server's own publisher
        return getattr(self._inner, name)


class SchedulerTrace:
    """One engine core's trace file: the header at start, then one line per finished request
    and one per step."""

    def __init__(self, path: str, private: bool, scheduler) -> None:
        from ..sim.trace import TraceHeader, TraceWriter

        cache = scheduler.cache_config
        import vllm

        self.settings = scheduler_settings(scheduler)
        self.header = TraceHeader(block_size=int(scheduler.hash_block_size), hashes_only=private,
                                  hash_algo=str(cache.prefix_caching_hash_algo), hash_seed=self.settings["hash_seed"],
                                  source={"recorder": "pagetrace vllm_plugin (Scheduler hook)", "engine": f"vllm {vllm.__version__}",
                                          "prefix_caching": bool(cache.enable_prefix_caching)},
                                  server=self.settings)
        self.writer = TraceWriter(self.header)
        self.steps = 0  # schedule() calls so far
        self.seq = 0
        self.t0: float | None = None
        self.arrived: dict[str, tuple[int, float, int]] = {}  # request id -> (step, time, seq)
        # O_EXCL: never replaces a file or follows a link made since the server's check
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        self._append(self.header.to_json())

    def _append(self, doc: dict, sync: bool = True) -> None:
        data = (json.dumps(doc, separators=(",", ":")) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data):]
        if sync:
            os.fsync(self.fd)

    def step(self, scheduler, output, started: float) -> None:
        """A step line (not fsynced: one write per step; a killed process keeps what it wrote)."""
        if self.t0 is None:
            self.t0 = started
        self._append(step_line(self.steps, started - self.t0, scheduler, output), sync=False)

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


def _enable_events(args, kwargs) -> None:
    """Make the scheduler record KV events when the server was started without them."""
    from vllm.config import KVEventsConfig

    vllm_config = kwargs.get("vllm_config", args[0] if args else None)
    config = vllm_config.kv_events_config
    if config is None or not config.enable_kv_cache_events:
        vllm_config.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="null")


def patch_scheduler(module, path: str | None, private: bool, log=None, events_path: str | None = None) -> None:
    """Wrap Scheduler.__init__, schedule, add_request and _free_request (see the module doc).
    `path`: the trace (None: only the events); `events_path`: PAGETRACE_EVENTS."""
    cls = module.Scheduler
    if getattr(cls, "_pagetrace_traced", False):
        return
    init, schedule, add_request, free = cls.__init__, cls.schedule, cls.add_request, cls._free_request

    def __init__(self, *args, **kwargs):
        global _TRACE
        if events_path:
            _enable_events(args, kwargs)
        init(self, *args, **kwargs)
        if path:
            _TRACE = SchedulerTrace(path, private, self)
            self._pagetrace_trace = _TRACE
        if events_path:
            config = self.kv_events_config
            recorder = EventsFile(events_path, scheduler_settings(self), (config.topic if config is not None else "") or "")
            self.kv_event_publisher = RecordingPublisher(self.kv_event_publisher, recorder)
            if log is not None:
                log(f"pagetrace: recording the KV events to {events_path}")
        if path and log is not None:
            s = _TRACE.settings
            log(f"pagetrace: recording every request to the trace {path} ({'block hashes only' if private else 'token ids'}, "
                f"blocks of {_TRACE.header.block_size}; pool {s['num_blocks']} blocks, max_num_batched_tokens {s['max_num_batched_tokens']}, "
                f"max_num_seqs {s['max_num_seqs']})")

    def schedule_(self, *args, **kwargs):
        started = time.time()
        out = schedule(self, *args, **kwargs)
        trace = getattr(self, "_pagetrace_trace", None)
        if trace is not None:
            trace.step(self, out, started)
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
