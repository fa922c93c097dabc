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
