"""`pagetrace simulate` and `pagetrace capacity` from the command line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
from conftest import assert_usage_error, cli

SMALL = ["--requests", "30", "--num-blocks", "128", "--prompt-len", "20:80", "--output-len", "4:40", "--arrival-rate", "1"]


def test_simulate_json(capsys):
    code, out, err = cli(capsys, "simulate", *SMALL, "--shared-prefix", "40", "--n", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    s = doc["summary"]
    assert s["requests"] == 60 and len(doc["requests"]) == 60
    assert s["prompt_tokens"] == sum(r["prompt_tokens"] for r in doc["requests"])
    assert sum(s["prompt_tokens_by_cause"].values()) == s["prompt_tokens"]
    # every request after the first finds the 32-token (2-block) part of the 40-token system prompt
    cached = [r["num_cached_tokens"] for r in doc["requests"]]
    assert cached[0] == 0 and min(cached[1:]) >= 32
    for w in s["waste"]:
        assert sum(w["shares"].values()) == pytest.approx(1.0)
    paged = s["waste"][0]
    assert paged["system"] == "vLLM (paged)" and paged["shares"]["reservation"] == 0 == paged["shares"]["external fragmentation"]
    assert len(doc["steps"]) == s["steps"] and s["peak_used_blocks"] <= 127


def test_simulate_text_and_pictures(capsys, tmp_path):
    svg, png, chart = tmp_path / "pool.svg", tmp_path / "pool.png", tmp_path / "chart.svg"
    code, out, err = cli(capsys, "simulate", *SMALL, "--svg", str(svg), "--png", str(png), "--chart", str(chart), "--at", "3")
    assert code == 0, err
    assert "Step timeline" in out and "Block tables after step 3" in out and "Orca (Pow2)" in out
    for path in (svg, chart):
        root = ET.parse(path).getroot()
        assert root.tag.endswith("svg") and len(root) > 10
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    assert str(chart) in err


def test_simulate_trace(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    prefix = list(range(1, 70))
    lines = [{"id": "a", "prompt": prefix + [5, 6, 7], "output_len": 5}, {"id": "b", "prompt": prefix + [8, 9], "output_len": 5}]
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--num-blocks", "64", "--block-size", "32", "--at", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["tables_at"]["0"] == {"a": [1, 2, 3], "b": [1, 2, 4]}
    assert [r["num_cached_tokens"] for r in doc["requests"]] == [0, 64]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--prompt-len", "-3"], "--prompt-len"),
        (["--output-len", "9:2"], "--output-len"),
        (["--num-blocks", "100000000"], "--num-blocks"),
        (["--num-blocks", "8"], "--num-blocks"),  # a request longer than the pool
        (["--block-size", "0"], "--block-size"),
        (["--max-model-len", "100"], "--max-model-len"),
        (["--at", "999999"], "--at"),
        (["--tables-svg", "x.svg"], "--tables-svg"),
        (["--chart", "/nonexistent/dir/c.svg"], "--chart"),
        (["--arrival-rate", "nan"], "--arrival-rate"),
        (["--no-chunked-prefill", "--max-num-batched-tokens", "20"], "--max-num-batched-tokens"),  # vLLM refuses it
    ],
)
def test_simulate_bad_options(capsys, args, option):
    assert_usage_error(cli(capsys, "simulate", *SMALL, *args), option)


def test_simulate_bad_trace_line(capsys, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_len": 10, "output_len": 3}\n{"prompt_len": -4, "output_len": 3}\n')
    result = cli(capsys, "simulate", "--trace", str(trace))
    assert_usage_error(result, "--trace")
    assert "line 2" in result[2] and "prompt_len" in result[2]
    assert_usage_error(cli(capsys, "simulate", "--trace", str(tmp_path / "missing.jsonl")), "--trace")
    assert_usage_error(cli(capsys, "simulate", "--trace", str(trace), "--requests", "4"), "--requests")


def test_capacity_llama_8b(capsys):
    """Llama-3-8B-like: 32 layers x 8 KV heads x 128, bf16: 128 KiB per token, 2 MiB per 16-token block."""
    code, out, err = cli(capsys, "capacity", "--memory", "16GiB", "--length", "4000", "--json")
    assert code == 0, err
    c = json.loads(out)
    assert c["bytes_per_token"] == 32 * 8 * 2 * 128 * 2 == 131072
    assert c["bytes_per_block"] == 2 * 2**20 and c["num_blocks"] == 8192 and c["usable_blocks"] == 8191
    assert c["blocks_per_request"] == 250 and c["requests"] == 32  # 8191 // 250
    assert c["requests_closed_form"] == pytest.approx(16 * 2**30 / (131072 * 4000))
    code, out, _ = cli(capsys, "capacity", "--memory", "16GiB", "--dtype", "fp8", "--json")
    assert json.loads(out)["num_blocks"] == 16384


def test_capacity_from_config(capsys, tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                               "hidden_size": 3584, "torch_dtype": "bfloat16"}))
    code, out, err = cli(capsys, "capacity", "--config", str(cfg), "--memory", "1GiB", "--block-size", "32", "--length", "100")
    assert code == 0, err
    assert "28 layers × 4 KV heads × head_dim 128" in out and "bytes per block" in out
    code, out, _ = cli(capsys, "capacity", "--config", str(cfg), "--memory", "1GiB", "--block-size", "32", "--json")
    assert json.loads(out)["bytes_per_block"] == 28 * 4 * 2 * 128 * 2 * 32


@pytest.mark.parametrize(("args", "option"), [(["--memory", "lots"], "--memory"), (["--dtype", "int3"], "--dtype"),
                                              (["--layers", "0"], "--layers"), (["--config", "/nonexistent.json"], "--config")])
def test_capacity_bad_options(capsys, args, option):
    assert_usage_error(cli(capsys, "capacity", *args), option)


def test_simulate_and_capacity_import_no_heavy_modules():
    import subprocess
    import sys

    probe = (
        "import sys; from pagetrace.cli import run_cli; run_cli(['capacity', '--json']); "
        "run_cli(['simulate', '--requests', '5', '--json']); "
        "print(sorted(m for m in ('torch', 'triton', 'graphviz', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


def test_an_arrival_past_the_step_limit_is_a_usage_error(tmp_path, capsys):
    trace = tmp_path / "far.jsonl"
    trace.write_text('{"prompt_len": 10, "output_len": 5, "arrival": 1000000000000}\n')
    assert_usage_error(cli(capsys, "simulate", "--trace", str(trace), "--num-blocks", "64"), "--trace")
    assert_usage_error(cli(capsys, "simulate", "--requests", "2", "--arrival-rate", "1e-9", "--num-blocks", "64"), "--arrival-rate")
