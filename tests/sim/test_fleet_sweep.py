"""Fleet sweeps (sim/fleet_sweep.py, `pagetrace fleet-sweep`): each point is the fleet run it names,
whichever way it ran (this process, local processes, Ray tasks); a sweep interrupted keeps its
finished points and runs only the rest when started again."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pagetrace.cli import app
from pagetrace.sim.conversation import ConversationSpec, conversations
from pagetrace.sim.fleet import run_fleet
from pagetrace.sim.fleet_sweep import Point, Settings, grid, read_results, run_point, run_sweep
from pagetrace.sim.router import make_router
from pagetrace.sim.scheduler import SchedulerConfig

runner = CliRunner()
SYN = {"sessions": 12, "turns": 3, "seed": 5}
SETTINGS = Settings(synthetic=SYN)
POINTS = grid(["synthetic"], ["round-robin", "prefix-aware"], [2, 3], [64, 256], [("local", 0), ("pooled", 0)])


def _direct(p: Point) -> float:
    reqs, sessions = conversations(ConversationSpec(**SYN))
    r = run_fleet(reqs, make_router(p.router, 1.0, sessions), p.instances, p.num_blocks, 16, SchedulerConfig(4096, 256),
                  max_model_len=(p.num_blocks - 1) * 16, cache=p.cache)
    return r.to_json()["hit_rate"]


def test_a_point_is_the_fleet_run_it_names():
    for p in POINTS[::3]:
        row = run_point(p, SETTINGS)
        assert row["hit_rate"] == _direct(p) and row["point"]["router"] == p.router
        assert row["capacity_tokens"] == (p.num_blocks - 1) * 16
    assert len({json.dumps(run_point(p, SETTINGS)["hit_rate"]) for p in POINTS}) > 4  # the grid's points differ


def test_local_processes_give_this_process_results(tmp_path):
    alone = run_sweep(POINTS[:6], SETTINGS, workers=1)
    pooled = run_sweep(POINTS[:6], SETTINGS, workers=2)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(alone) == strip(pooled)


def test_an_interrupted_sweep_keeps_its_points_and_resumes(tmp_path):
    results = tmp_path / "sweep.jsonl"
    ran = []

    def stop_after_two(row, k, n):
        ran.append(row["point"])
        if len(ran) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(POINTS, SETTINGS, str(results), workers=1, on_result=stop_after_two)
    assert len(read_results(str(results))) == 2
    with open(results, "a") as f:
        f.write('{"point": {"trace": "synthetic", "rou')  # a line cut mid-write: run again, not read
    again = []
    rows = run_sweep(POINTS, SETTINGS, str(results), workers=1, on_result=lambda row, k, n: again.append(row["point"]))
    assert len(again) == len(POINTS) - 2 and not any(p in again for p in ran)
    assert [r["point"] for r in rows] == [json.loads(p.key()) for p in POINTS]
    assert len(read_results(str(results))) == len(POINTS)
    nothing = []
    run_sweep(POINTS, SETTINGS, str(results), workers=2, on_result=lambda row, k, n: nothing.append(row))
    assert nothing == []  # every point done: none runs


def test_ray_tasks_give_the_same_table(tmp_path):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'pagetrace[ray]'; .ci/run installs it)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        results = tmp_path / "ray.jsonl"
        rows = run_sweep(POINTS[:4], SETTINGS, str(results), ray_address="auto")
        local = run_sweep(POINTS[:4], SETTINGS, workers=1)
        assert [r["hit_rate"] for r in rows] == [r["hit_rate"] for r in local]
        assert len(read_results(str(results))) == 4
        trace = tmp_path / "t.jsonl"  # a trace file: shipped to the tasks through Ray's object store
        trace.write_text("\n".join(json.dumps({"prompt": list(range(1, 40)), "output_len": 3, "arrival": i}) for i in range(6)) + "\n")
        p = Point(str(trace), "round-robin", 2, 16)
        assert run_sweep([p], SETTINGS, ray_address="auto")[0]["hit_rate"] == run_point(p, SETTINGS)["hit_rate"]
    finally:
        ray.shutdown()


def test_cli_sweep_table_chart_and_json(tmp_path):
    results, chart = tmp_path / "s.jsonl", tmp_path / "s.svg"
    args = ["fleet-sweep", "--sessions", "8", "--turns", "2", "--num-blocks", "64,128", "--instances", "2", "--caches", "local,store:320",
            "--results", str(results), "--chart", str(chart), "--workers", "1"]
    res = runner.invoke(app, [*args, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["points"]) == 8 and doc["written"] == [str(chart)]
    assert chart.read_text().count("<polyline") == 4  # 2 routers x 2 caches, each over 2 capacities
    res = runner.invoke(app, args)
    assert res.exit_code == 0 and "fleet sweep: 8 points" in res.stdout


@pytest.mark.parametrize("args, option", [
    (["--caches", "global"], "--caches"), (["--caches", "store:8"], "--caches"), (["--instances", "0"], "--instances"),
    (["--instances", "2,x"], "--instances"), (["--routers", "as-recorded"], "--routers"), (["--num-blocks", "1"], "--num-blocks"),
    (["--trace", "/nonexistent/t.jsonl"], "--trace"),
])
def test_cli_sweep_refusals(args, option):
    res = runner.invoke(app, ["fleet-sweep", *args])
    assert res.exit_code == 2 and option in res.output and len(res.output.strip().splitlines()) == 1, res.output
