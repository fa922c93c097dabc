import re
import json
import subprocess
import sys

import pytest
from conftest import assert_usage_error, cli


def test_lookup_worked_example(capsys):
    code, out, err = cli(capsys, "lookup", "--token", "20", "--table", "7,2,15")
    assert code == 0 and err == ""
    for text in ("logical block = 20 // 16 = 1", "offset = 20 % 16 = 4", "block_table[1] = 2", "slot = 2 × 16 + 4 = 36", "288", "1152"):
        assert text in out


def test_lookup_json_is_one_document(capsys):
    code, out, err = cli(capsys, "lookup", "--token", "20", "--table", "7,2,15", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["logical_block"], doc["offset"], doc["physical_block"], doc["slot"]) == (1, 4, 2, 36)
    assert doc["key"]["element_offset"] == 288 and doc["key"]["byte_offset"] == 1152 and doc["key"]["contiguous"]
    assert doc["capacity"] == 48 and doc["num_blocks"] == 16


def test_lookup_json_vllm(capsys):
    code, out, _ = cli(capsys, "lookup", "--layout", "vllm", "--dtype", "fp16", "--head-dim", "16", "--kv-heads", "2", "--head", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["x"] == 8
    assert [c["element_offset"] for c in doc["key"]["chunks"]] == [1312, 1440] and doc["key"]["chunk_stride_elements"] == 128
    assert doc["value"]["chunk_stride_elements"] == 16 and len(doc["value"]["chunks"]) == 16


@pytest.mark.parametrize(
    "args, option",
    [
        (["--table", "7,,2"], "--table"),
        (["--table", "a"], "--table"),
        (["--table", ""], "--table"),
        (["--table", "7, 2"], "--table"),
        (["--table", "7,-2,15"], "--table"),
        (["--table", "7,2,15", "--num-blocks", "10"], "--table"),
        (["--table", "7,2,7"], "--table"),
        (["--token", "-1"], "--token"),
        (["--token", "48"], "--token"),
        (["--block-size", "0"], "--block-size"),
        (["--head-dim", "0"], "--head-dim"),
        (["--kv-heads", "2", "--layout", "nhd", "--head", "2"], "--head"),
        (["--layout", "vllm", "--head-dim", "6"], "--head-dim"),
        (["--layout", "weird"], "--layout"),
        (["--dtype", "fp64"], "--dtype"),
        (["--token", "abc"], "--token"),
        (["--bogus"], "--bogus"),
    ],
)
def test_lookup_bad_input_is_one_line_exit_2(capsys, args, option):
    assert_usage_error(cli(capsys, "lookup", *args), option)


def test_capacity_is_named(capsys):
    _, _, err = cli(capsys, "lookup", "--token", "48")
    assert "capacity 48" in err


def test_help_shows_an_example(capsys):
    for command in ("lookup", "run"):
        code, out, _ = cli(capsys, command, "--help")
        assert code == 0 and "Example: pagetrace " + command in " ".join(out.split())


def test_lookup_imports_neither_torch_nor_triton():
    probe = "import sys; from pagetrace.cli import run_cli; run_cli(['lookup', '--json']); print(sorted(m for m in ('torch', 'triton') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("[]")


def test_python_dash_m(tmp_path):
    result = subprocess.run([sys.executable, "-m", "pagetrace", "lookup", "--json"], capture_output=True, text=True)
    assert result.returncode == 0 and json.loads(result.stdout)["slot"] == 36


def test_console_script_exit_code_and_one_line():
    result = subprocess.run([sys.executable, "-m", "pagetrace", "lookup", "--table", "7,,2"], capture_output=True, text=True)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.parametrize("width", [80, 100, 200])
def test_wide_numbers_are_never_cut(width):
    """At 80 columns a table of six-digit blocks elides whole entries ('N more'), never digits."""
    from rich.console import Console

    from pagetrace.paging.lookup import trace_token
    from pagetrace.views.text import render_lookup

    table = list(range(100001, 100014))
    console = Console(width=width, record=True, color_system=None)
    console.print(render_lookup(trace_token(100, table, layout="vllm", dtype="fp16", head_dim=64, kv_heads=8, head=7, num_blocks=4194304)))
    text = console.export_text()
    assert all(len(line) <= width for line in text.splitlines())
    assert re.search(r"[0-9]…|…[0-9]", text) is None, text
    strip = text.split("block table", 1)[1]
    physical = [line for line in strip.splitlines() if line.strip().startswith("physical")][0].split()[1:]
    shown = [int(w) for w in physical if w.isdigit() and int(w) > 1000]
    assert 100007 in shown and all(p in table for p in shown)  # every shown entry whole, the traced one among them
    for number in ("4194304", "[block=4194304,"):
        assert number in text


def test_seq_len_draws_the_sequence_and_bounds_the_token(capsys):
    code, out, _ = cli(capsys, "lookup", "--seq-len", "38")
    assert code == 0 and "38 tokens in 3 blocks" in out and "32-37 (6/16)" in out and "table's capacity" not in out
    code, out, _ = cli(capsys, "lookup")
    assert code == 0 and "48 tokens in 3 blocks" in out and "(drawn at the table's capacity, 48 tokens; --seq-len N draws a sequence of N)" in out
    code, out, _ = cli(capsys, "lookup", "--seq-len", "48", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == 48  # exactly the capacity: allowed
    assert_usage_error(cli(capsys, "lookup", "--seq-len", "49"), "--seq-len")  # one past the capacity
    assert_usage_error(cli(capsys, "lookup", "--seq-len", "20"), "--token")  # token 20 is one past the end
    assert_usage_error(cli(capsys, "lookup", "--seq-len", "0"), "--seq-len")
