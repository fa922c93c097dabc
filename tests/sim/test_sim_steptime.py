"""The step-time model (pagetrace/sim/steptime.py): least squares on a recording's step lines,
its error on a second recording, and the latency estimates it gives a simulated run."""

from __future__ import annotations

import json
import random

import pytest
from conftest import assert_usage_error, cli

from pagetrace.sim import steptime

TRUE = (0.004, 2e-6, 3e-4, 5e-8)  # seconds: per step, per token, per request, per K/V token read


def recording(seed: int, n: int = 300, idle_every: int = 50, noise: float = 2e-4) -> dict[int, dict]:
    """Step lines as the recorder writes them, their times from TRUE plus noise, an idle gap now and then."""
    rng = random.Random(seed)
    steps, t = {}, 0.0
    for k in range(n):
        tokens, requests = rng.choice([1, 4, 16, 300, 2048]), rng.randint(1, 16)
        context = rng.randint(0, 20000)
        steps[k] = {"time": round(t, 6), "tokens": tokens, "requests": requests, "context_tokens": context}
        t += TRUE[0] + TRUE[1] * tokens + TRUE[2] * requests + TRUE[3] * (context + tokens) + rng.gauss(0, noise)
        if idle_every and k % idle_every == idle_every - 1:
            t += 5.0  # the engine waited for a request: not a step's time
    return steps


def test_least_squares_is_numpys():
    np = pytest.importorskip("numpy")
    rng = random.Random(1)
    xs = [(rng.random() * 1e4, rng.random() * 10, rng.random() * 1e6) for _ in range(50)]
    ys = [rng.random() for _ in range(50)]
    ref, *_ = np.linalg.lstsq(np.array([(1.0, *x) for x in xs]), np.array(ys), rcond=None)
    assert steptime.least_squares(xs, ys) == pytest.approx(list(ref), rel=1e-6, abs=1e-12)


def test_the_fit_recovers_the_model_and_leaves_idle_gaps_out():
    model = steptime.fit(recording(0), "a")
    assert model.left_out >= 5  # the six 5 s gaps
    assert model.coefficients == pytest.approx(TRUE, rel=0.15, abs=2e-4)
    check = steptime.evaluate(model, recording(1), "b")
    assert check["mae_seconds"] < 3e-4 and abs(check["total_relative_error"]) < 0.01
    assert steptime.evaluate(model, recording(1, idle_every=0), "b")["steps"] == 299


def test_too_few_steps_is_refused():
    with pytest.raises(ValueError, match="needs at least 8"):
        steptime.fit(recording(0, n=5), "a")


def write(tmp_path, name, steps, requests=()):
    lines = [{"format": "pagetrace-trace", "version": 1, "block_size": 16}, *requests]
    lines += [{"step": k, **v} for k, v in steps.items()]
    path = tmp_path / name
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def test_simulate_reports_the_model_its_check_and_latency_estimates(tmp_path, capsys):
    fit_on = write(tmp_path, "a.jsonl", recording(0), [{"prompt": [1, 2, 3], "output_len": 1}])
    check = write(tmp_path, "b.jsonl", recording(1), [{"prompt": [1, 2, 3], "output_len": 1}])
    work = write(tmp_path, "w.jsonl", {}, [{"prompt": list(range(1, 41)), "output_len": 10, "arrival": 5 * i} for i in range(8)])
    code, out, err = cli(capsys, "simulate", "--trace", work, "--step-model", fit_on, "--step-model-check", check, "--json")
    assert code == 0, err
    doc = json.loads(out)["step_model"]
    assert doc["model"]["steps_fitted"] > 250 and doc["check"]["steps"] > 250
    lat = doc["latency"]
    assert lat["requests"] == 8 and 0 < lat["ttft_seconds"]["p50"] <= lat["e2e_seconds"]["p50"] <= lat["e2e_seconds"]["p99"]
    # each request runs alone: 1 prefill step of 40 tokens, then 9 decode steps; by the model itself
    per = [TRUE[0] + TRUE[1] * 40 + TRUE[2] + TRUE[3] * 48] + [TRUE[0] + TRUE[1] + TRUE[2] + TRUE[3] * 48] * 9
    assert lat["e2e_seconds"]["p50"] == pytest.approx(sum(per), rel=0.2)
    code, out, err = cli(capsys, "simulate", "--trace", work, "--step-model", fit_on)
    assert code == 0 and "estimates of this model for this run" in out and "TTFT p50" in out


def test_bad_step_model_input_exits_2(tmp_path, capsys):
    work = write(tmp_path, "w.jsonl", {}, [{"prompt": [1, 2, 3], "output_len": 1}])
    few = write(tmp_path, "few.jsonl", recording(0, n=4))
    assert_usage_error(cli(capsys, "simulate", "--trace", work, "--step-model", few), "--step-model")
    assert_usage_error(cli(capsys, "simulate", "--trace", work, "--step-model-check", few), "--step-model-check")
    assert_usage_error(cli(capsys, "simulate", "--trace", work, "--step-model", str(tmp_path / "missing")), "--step-model")
