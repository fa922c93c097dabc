"""Shared test settings: which kernel backend this machine runs.

On a machine without CUDA the kernel runs under Triton's interpreter, which must be
chosen before triton is first imported; on a GPU the same tests run compiled.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") != "1"
KERNEL_BACKEND = "triton" if ON_GPU else "interpret"
DEVICE = "cuda" if ON_GPU else "cpu"


def cli(capsys, *args):
    """Run the CLI in-process: (exit code, stdout, stderr)."""
    from pagetrace.cli import run_cli

    code = run_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(result, option):
    """Exit 2, nothing on stdout, one line on stderr that names the option."""
    code, out, err = result
    assert code == 2, err
    assert out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in err, err
