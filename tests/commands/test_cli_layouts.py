"""`pagetrace layouts`: the table as the CLI shows it, its refusals, and the probe of vLLM's writer."""

import importlib.util
import json
import subprocess
import sys

import pytest

from conftest import assert_usage_error, cli
from pagetrace.paging.layouts import LAYOUTS, make_geometry, table_markdown

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def test_json_lists_every_layout_with_its_formula(capsys):
    code, out, err = cli(capsys, "layouts", "--json")
    doc = json.loads(out)
    assert code == 0 and err == ""
    assert [d["name"] for d in doc["layouts"]] == list(LAYOUTS)
    amx = next(d for d in doc["layouts"] if d["name"] == "vllm-cpu-amx")
    assert amx["tiled"] and not amx["kernel"] and amx["raw_shape"] == [4, 2, 32, 128]
    assert amx["key"]["formula"] == make_geometry("vllm-cpu-amx", 4, 32, 2, 64, "bf16").formula("key")
    assert amx["key"]["factors"] == ["block", "head", "kv", "slot/16", "dim/p", "slot%16", "dim%p"]
    assert [d["name"] for d in doc["layouts"] if d["kernel"]] == ["blocks", "nhd", "hnd", "vllm"]
    assert doc["probes"] == [] and doc["not_shown"] == []


def test_dims_a_layout_cannot_split_are_named_not_hidden(capsys):
    code, out, _ = cli(capsys, "layouts", "--block-size", "8", "--json")
    doc = json.loads(out)
    assert code == 0 and "vllm-cpu-amx" not in [d["name"] for d in doc["layouts"]]
    assert any(line.startswith("vllm-cpu-amx:") and "multiple of 16" in line for line in doc["not_shown"])
    code, out, _ = cli(capsys, "layouts", "--layout", "vllm-cpu", "--layout", "VLLM-CPU-AMX")
    assert code == 0 and "vllm-cpu-amx  [4, 2, 32, 128]" in out and "slot:(16,2):(2,1024)" in out and "\nnhd " not in out


def test_markdown_is_the_table(capsys):
    code, out, _ = cli(capsys, "layouts", "--markdown")
    assert code == 0 and out == table_markdown()


@pytest.mark.parametrize("args, option", [
    (["--layout", "tiles"], "--layout"), (["--probe", "avx9"], "--probe"), (["--block-size", "0"], "--block-size"),
    (["--dtype", "int4"], "--dtype"), (["--head-dim", "-1"], "--head-dim"),
    (["--markdown", "--json"], "--markdown"),  # --json is one JSON document (the fuzz test found this)
])
def test_bad_input_is_one_line(capsys, args, option):
    assert_usage_error(cli(capsys, "layouts", *args), option)


@pytest.mark.skipif(HAS_VLLM, reason="checks the message a user without the vllm extra gets")
def test_probe_without_vllm_says_what_to_install():
    done = subprocess.run([sys.executable, "-m", "pagetrace", "layouts", "--probe", "vec"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stdout == "" and "pip install 'pagetrace[vllm]'" in done.stderr and "Traceback" not in done.stderr


def _c_has(isa: str) -> bool:
    """Whether vLLM's _C extension loads here with a writer for `isa`: one tiny write through the op
    itself, not through pagetrace's probe (a broken probe must fail the test below, not skip it).
    The cache is [blocks, heads, block_size, 2 * head_dim] seen as K and V halves, as
    vllm/v1/attention/backends/cpu_attn.py's do_kv_cache_update passes it."""
    try:
        import torch
        from vllm import _custom_ops as ops

        cache = torch.zeros(1, 1, 32, 64, dtype=torch.bfloat16)
        key_cache, value_cache = cache.view(1, 1, 64, 32).chunk(2, dim=2)
        kv = torch.ones(1, 1, 32, dtype=torch.bfloat16)
        ops.cpu_attn_reshape_and_cache(kv, kv, key_cache, value_cache, torch.zeros(1, dtype=torch.int64), isa)
        return True
    except Exception:  # noqa: BLE001 - any failure to load or run vLLM's writer means: no writer here
        return False


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed: pip install -e '.[vllm]' to probe its writer")
@pytest.mark.parametrize("isa, want", [("vec", "vllm-cpu"), ("vec16", "vllm-cpu"), ("amx", "vllm-cpu-amx")])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_probe_of_vllms_own_writer(capsys, isa, want, dtype):
    """The writer is plain data movement: it runs for every ISA on any x86 CPU where vLLM's _C loads."""
    if not _c_has(isa):
        pytest.skip(f"vLLM's _C extension has no {isa} writer on this CPU")
    code, out, err = cli(capsys, "layouts", "--probe", isa, "--block-size", "64", "--kv-heads", "3", "--head-dim", "32", "--dtype", dtype, "--json")
    assert code == 0, err
    import vllm

    assert json.loads(out)["probes"] == [{
        "engine": "vllm", "version": vllm.__version__, "method": "writer", "writer": "vLLM cpu_attn_reshape_and_cache", "isa": isa, "scratch_blocks": 3,
        "elements": 2 * 3 * 64 * 3 * 32, "layout": want, "explained_by": [want],
    }]


@pytest.mark.skipif(HAS_VLLM, reason="checks what a user without the vllm extra gets from the example")
def test_the_vllm_example_without_vllm_says_what_to_install(tmp_path):
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "vllm_capture.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "c.bundle")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "pip install 'pagetrace[vllm]'" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "c.bundle").exists()
