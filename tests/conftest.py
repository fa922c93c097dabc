"""Shared test settings: which kernel backend this machine runs.

On a machine without CUDA the kernel runs under Triton's interpreter, which must be
chosen before triton is first imported; on a GPU the same tests run compiled.
"""

import os
import random

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


def scrambled_tables(seq_lens, block_size, seed, spare=3):
    """Block tables drawn at random from a pool `spare` times larger than the sequences
    need: (tables, pool size). The blocks left over stay unused (NaN in the tests' caches)."""
    needed = [-(-n // block_size) for n in seq_lens]
    pool = spare * sum(needed) + 1
    blocks = list(range(pool))
    random.Random(seed).shuffle(blocks)
    tables, start = [], 0
    for n in needed:
        tables.append(blocks[start : start + n])
        start += n
    return tables, pool
