"""A step-time model fitted from a recorded server: seconds per engine step as a linear function
of what the step ran, and the latencies it implies for a simulated run (estimates, not measures).

A trace recorded inside `vllm serve` (engines/vllm_trace.py) has a line per `schedule()` call
with its wall-clock `time` and what it scheduled. Step k's duration is `time[k+1] - time[k]`
(the model's forward pass and the scheduler around it). It is fitted by least squares as

    seconds = c0 + c1 * tokens + c2 * requests + c3 * kv_tokens

`tokens`: the tokens the step computed (prefill and decode); `requests`: the requests it ran;
`kv_tokens`: the tokens of K/V those requests read (their context before the step plus the step's
own tokens). These are the prefill tokens, decode requests and context tokens of a step,
written in the terms the simulator's steps also have (StepRecord: `tokens`, `scheduled`,
`used_blocks` x block size), so one model prices both. A duration that spans an idle gap (the
engine waited for a request) is not a step's: durations over `IDLE_FACTOR` times the median are
left out of the fit, and again after a first fit, those `OUTLIER_MADS` residual MADs away.

The fit's error is reported on a second recording of the same server (`evaluate`): mean absolute
error per step, and the relative error of the total time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

FEATURES = ("tokens", "requests", "kv_tokens")
IDLE_FACTOR = 20.0
OUTLIER_MADS = 6.0


def features_of_server_step(line: dict) -> tuple[float, float, float]:
    tokens = line.get("tokens", 0)
    return float(tokens), float(line.get("requests", 0)), float(line.get("context_tokens", 0) + tokens)


def server_samples(steps: dict[int, dict]) -> tuple[list[tuple[float, float, float]], list[float]]:
    """(features, duration) of every recorded step followed by another with a time."""
    xs, ys = [], []
    for k in sorted(steps):
        nxt = steps.get(k + 1)
        if nxt is None or "time" not in steps[k] or "time" not in nxt:
            continue
        xs.append(features_of_server_step(steps[k]))
        ys.append(float(nxt["time"]) - float(steps[k]["time"]))
    return xs, ys


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting; a singular column gets coefficient 0."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        if abs(m[p][c]) < 1e-12 * max(1.0, max(abs(v) for row in m for v in row[:n])):
            for r in range(n):
                m[r][c] = 0.0
            m[c][c], m[c][n] = 1.0, 0.0
            continue
        m[c], m[p] = m[p], m[c]
        for r in range(n):
            if r != c and m[r][c]:
                f = m[r][c] / m[c][c]
                for k in range(c, n + 1):
                    m[r][k] -= f * m[c][k]
    return [m[i][n] / m[i][i] for i in range(n)]


def least_squares(xs: list[tuple[float, ...]], ys: list[float]) -> list[float]:
    """Coefficients [c0, c1, ...] minimising sum (c0 + sum c_i x_i - y)^2 (normal equations, columns scaled)."""
    rows = [(1.0, *x) for x in xs]
    d = len(rows[0])
    scale = [max(max(abs(r[j]) for r in rows), 1e-30) for j in range(d)]
    z = [[r[j] / scale[j] for j in range(d)] for r in rows]
    ata = [[sum(r[i] * r[j] for r in z) for j in range(d)] for i in range(d)]
    atb = [sum(r[i] * y for r, y in zip(z, ys)) for i in range(d)]
    return [c / s for c, s in zip(_solve(ata, atb), scale)]


@dataclass(slots=True)
class StepModel:
    coefficients: list[float]  # c0 (seconds), then per FEATURES
    samples: int  # steps fitted
    left_out: int  # durations left out (idle gaps, outliers)
    mae: float  # mean absolute error on the fitted steps (seconds)
    source: str = ""
    extra: dict = field(default_factory=dict)

    def seconds(self, tokens: float, requests: float, kv_tokens: float) -> float:
        c0, c1, c2, c3 = self.coefficients
        return max(c0 + c1 * tokens + c2 * requests + c3 * kv_tokens, 0.0)

    def to_json(self) -> dict:
        return {"source": self.source, "formula": "seconds = c0 + c1*tokens + c2*requests + c3*kv_tokens",
                "coefficients": dict(zip(("c0", "c1", "c2", "c3"), self.coefficients)), "steps_fitted": self.samples,
                "steps_left_out": self.left_out, "mae_seconds": self.mae, **self.extra}


def fit(steps: dict[int, dict], source: str = "") -> StepModel:
    """The model of a recording's step lines (ValueError if it has fewer than 8 timed steps)."""
    xs, ys = server_samples(steps)
    if len(ys) < 8:
        raise ValueError(f"{source or 'the trace'} has {len(ys)} timed steps; a step-time model needs at least 8 "
                         "(a trace recorded inside vllm serve by PAGETRACE_TRACE has a line per step)")
    median = statistics.median(ys)
    keep = [i for i, y in enumerate(ys) if y <= IDLE_FACTOR * max(median, 1e-6)]
    coef = least_squares([xs[i] for i in keep], [ys[i] for i in keep])
    model = StepModel(coef, len(keep), len(ys) - len(keep), 0.0, source)
    res = [ys[i] - model.seconds(*xs[i]) for i in keep]
    mad = statistics.median(abs(r) for r in res) or 1e-9
    keep2 = [i for i, r in zip(keep, res) if abs(r) <= OUTLIER_MADS * mad]
    if len(keep2) >= 8:
        keep = keep2
        model.coefficients = least_squares([xs[i] for i in keep], [ys[i] for i in keep])
    model.samples, model.left_out = len(keep), len(ys) - len(keep)
    model.mae = sum(abs(ys[i] - model.seconds(*xs[i])) for i in keep) / len(keep)
    return model


def evaluate(model: StepModel, steps: dict[int, dict], source: str = "") -> dict:
    """The model against another recording: per-step error, and the total time of its steps (idle gaps left out as in `fit`)."""
    xs, ys = server_samples(steps)
    if not ys:
        raise ValueError(f"{source or 'the trace'} has no timed step")
    median = statistics.median(ys)
    keep = [i for i, y in enumerate(ys) if y <= IDLE_FACTOR * max(median, 1e-6)]
    pred = [model.seconds(*xs[i]) for i in keep]
    real = [ys[i] for i in keep]
    total_real, total_pred = sum(real), sum(pred)
    return {"source": source, "steps": len(keep), "mae_seconds": sum(abs(p - r) for p, r in zip(pred, real)) / len(keep),
            "mean_step_seconds": total_real / len(keep), "total_seconds": total_real, "predicted_total_seconds": total_pred,
            "total_relative_error": (total_pred - total_real) / total_real if total_real else 0.0}


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    if not s:
        return 0.0
    k = (len(s) - 1) * q
    lo = int(k)
    return s[lo] + (s[min(lo + 1, len(s) - 1)] - s[lo]) * (k - lo)


def latencies(result, model: StepModel, block_size: int, budget: int) -> dict:
    """Each simulated step priced by the model (its tokens, requests and the K/V held), the clock
    standing still over the steps the simulator skipped as idle; then per request: end-to-end
    latency from the start of its arrival step to the end of its finishing step, and time to first
    token to the end of the step its prefill is done by (its first step plus the steps its
    uncached prompt needs at the token budget: a lower bound when others share the budget).
    Percentiles in seconds: estimates of the model, not measurements."""
    import bisect

    starts, ends, clock = [], [], 0.0
    for s in result.steps:
        starts.append(s.step)
        dt = model.seconds(s.tokens, s.scheduled, s.used_blocks * block_size)
        clock += dt
        ends.append(clock)

    def end_of(step: int) -> float:  # the clock at the end of `step` (or of the last step before it)
        i = bisect.bisect_right(starts, step) - 1
        return ends[i] if i >= 0 else 0.0

    def start_of(step: int) -> float:
        return end_of(step - 1)

    ttft, e2e = [], []
    for r in result.requests:
        if r.finished_step is None or r.first_scheduled is None:
            continue
        t0 = start_of(r.arrival)
        e2e.append(end_of(r.finished_step) - t0)
        todo = max(r.prompt_len - (r.num_cached_tokens or 0), 1)
        ttft.append(end_of(r.first_scheduled + -(-todo // budget) - 1) - t0)
    qs = (0.5, 0.9, 0.99)
    return {"estimate_of": model.source, "requests": len(e2e), "total_seconds": clock,
            "ttft_seconds": {f"p{round(q * 100)}": percentile(ttft, q) for q in qs},
            "e2e_seconds": {f"p{round(q * 100)}": percentile(e2e, q) for q in qs}}


__all__ = ["FEATURES", "StepModel", "evaluate", "fit", "latencies", "least_squares", "server_samples"]
