"""The GPU path, proven without a GPU: every launch `paged_attention` makes on a GPU,
compiled for sm_90 and sm_80 with the ptxas in Triton's wheel.

The launches come from the launcher itself (`attention.plan_kernel` on meta tensors)
and go through Triton's own argument binder, so the tile choices and specialisations
are the real ones. By default a representative set compiles (about half a minute on two
cores, then cached); PAGETRACE_COMPILE_FULL=1 compiles the full matrix of
pagetrace/compile_matrix.py (about 800 variants; long).
"""

import os

import pytest

from pagetrace.compile_matrix import compile_configs, full_matrix, production, representative
from pagetrace.gpu_compile import ARCHS, Config

FULL = os.environ.get("PAGETRACE_COMPILE_FULL", "0") == "1"
CONTEXTS = [(n,) * batch for batch in (1, 16) for n in (1000, 1024, 3000, 4096, 16384, 131072)]


@pytest.fixture(scope="module")
def compiled():
    records, missing = compile_configs(full_matrix() if FULL else representative())
    if missing:
        pytest.skip(missing)
    return records


def test_every_launch_compiles(compiled):
    failed = [f"{r.arch} {r.config.label} {r.kernel}: {r.error}" for r in compiled if r.error]
    assert not failed, "\n".join(failed)
    assert {r.arch for r in compiled} == set(ARCHS)


def test_shared_memory_fits_each_arch(compiled):
    over = [f"{r.arch} {r.config.label}: {r.shared_bytes} B" for r in compiled if r.shared_bytes > ARCHS[r.arch].shared_bytes]
    assert not over, "\n".join(over)
    assert all(r.programs_per_sm >= 1 for r in compiled if not r.error)


def test_production_decode_never_spills(compiled):
    prod = [r for r in compiled if production(r.config)]
    assert len(prod) >= 24  # nhd/hnd/vllm x fp16/bf16 x head_dim 64/128, both kernels, both archs
    spilled = [f"{r.arch} {r.config.label} {r.kernel}: {r.spill_bytes} B, {r.registers} registers" for r in prod if r.spill_bytes]
    assert not spilled, "\n".join(spilled)


def test_production_keys_load_16_bytes_at_a_time_in_every_layout(compiled):
    parts = [r for r in compiled if production(r.config) and r.kernel.endswith("partition")]
    assert {r.config.layout for r in parts} == {"nhd", "hnd", "vllm"}
    narrow = [f"{r.arch} {r.config.label}: {r.loads}" for r in parts if not r.loads.get("k", "").startswith("16B")]
    assert not narrow, "\n".join(narrow)


def test_growing_contexts_reuse_one_compiled_variant():
    """A context that grows (and the batch's longest sequence with it) changes the grid and
    the partition length, never the compiled kernel."""
    configs = [Config("nhd", "fp16", 16, 128, 32, 8, lens) for lens in CONTEXTS]
    records, missing = compile_configs(configs, archs=("sm_90",), jobs=1)
    if missing:
        pytest.skip(missing)
    assert len({r.grid for r in records}) > 4  # the contexts do differ where they should
    for kernel in {r.kernel for r in records}:
        assert len({r.key for r in records if r.kernel == kernel}) == 1, kernel
