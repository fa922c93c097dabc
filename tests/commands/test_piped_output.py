"""Output that is not a terminal keeps every column whole: the binary, piped, with no COLUMNS."""

import os
import subprocess
import sys


def piped(*args, columns=None):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns:
        env["COLUMNS"] = str(columns)
    done = subprocess.run([sys.executable, "-m", "pagetrace", *args], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


SIMULATE = ("simulate", "--requests", "30", "--num-blocks", "64", "--shared-prefix", "32", "--explain")
REASON = "tokens hit again after preemption"


def test_simulate_explain_keeps_its_why_column_whole_in_a_pipe():
    text = piped(*SIMULATE)
    assert REASON in text  # one line, not wrapped in its cell
    assert "…" not in text
    assert max(map(len, text.splitlines())) > 80  # the table is as wide as it needs


def test_columns_still_sets_the_width():
    text = piped(*SIMULATE, columns=80)
    assert max(map(len, text.splitlines())) <= 80
    assert REASON not in text  # at 80 columns the reason wraps in its cell


def test_lookup_lines_are_not_wrapped_in_a_pipe():
    text = piped("layouts", "--layout", "vllm-cpu-amx", "--block-size", "32", "--head-dim", "64", "--kv-heads", "2", "--dtype", "bf16")
    assert "        block:4:8192  slot:(2,16):(1,32)  head:2:4096  dim:(16,4):(2,512)  + 2048\n" in text
