"""The GPU path, proven without a GPU: every launch `paged_attention` makes on a GPU,
compiled for sm_90 and sm_80 with the ptxas in Triton's wheel.

The launches come from the launcher itself (`attention.plan_kernel` on meta tensors)
and go through Triton's own argument binder, so the tile choices and specialisations
are the real ones. By default a representative set compiles (about half a minute on two
cores, then cached); PAGETRACE_COMPILE_FULL=1 compiles the full matrix of
pagetrace/attention/compile_matrix.py (about 1,600 distinct variants: tens of minutes on 2 cores).
"""

import os

import pytest

from pagetrace.attention.compile_matrix import UNSUPPORTED, compile_configs, full_matrix, production, representative
from pagetrace.attention.gpu_compile import ARCHS, Config

FULL = os.environ.get("PAGETRACE_COMPILE_FULL", "0") == "1"
CONTEXTS = [(n,) * batch for batch in (1, 16) for n in (1000, 1024, 3000, 4096, 16384, 131072)]


@pytest.fixture(scope="module")
def compiled():
    records, missing = compile_configs(full_matrix() if FULL else representative())
    if missing:
        pytest.skip(missing)
    return records


def test_every_launch_compiles(compiled):
    """Every launch compiles, except where Triton cannot (fp8 e4m3 before sm_89): there the
    partition kernel must fail for that reason, which is why `paged_attention` refuses it."""
    wrong, refused = [], 0
    for r in compiled:
        reason = UNSUPPORTED.get((r.arch, r.config.cache_dtype)) if r.kernel.endswith("partition") else None
        refused += reason is not None
        if (reason is None and r.error) or (reason is not None and reason not in r.error):
            wrong.append(f"{r.arch} {r.config.label} {r.kernel}: {r.error or 'compiled'}")
    assert not wrong, "\n".join(wrong)
    assert {r.arch for r in compiled} == set(ARCHS)
    assert refused, "the set should hold an fp8 e4m3 cache on sm_80"


def test_shared_memory_fits_each_arch(compiled):
    over = [f"{r.arch} {r.config.label}: {r.shared_bytes} B" for r in compiled if r.shared_bytes > ARCHS[r.arch].shared_bytes]
    assert not over, "\n".join(over)
    assert all(r.programs_per_sm >= 1 for r in compiled if not r.error)


def test_production_decode_never_spills(compiled):
    prod = [r for r in compiled if production(r.config)]
    assert len(prod) >= 24  # nhd/hnd/vllm x fp16/bf16 x head_dim 64/128, both kernels, both archs
    spilled = [f"{r.arch} {r.config.label} {r.kernel}: {r.spill_bytes} B, {r.registers} registers" for r in prod if r.spill_bytes]
    assert not spilled, "\n".join(spilled)


def test_production_keys_and_values_load_16_bytes_at_a_time_in_every_layout(compiled):
    parts = [r for r in compiled if production(r.config) and r.kernel.endswith("partition")]
    assert {r.config.layout for r in parts} == {"nhd", "hnd", "vllm"}
    # vllm values come in runs of a block's tokens: 16 bytes need a block size with a factor of 8
    runs = [r for r in parts if r.config.layout != "vllm" or r.config.block_size % 8 == 0]
    narrow = [f"{r.arch} {r.config.label}: {r.loads}" for r in parts if r.loads.get("k") != "16B cp.async"]
    narrow += [f"{r.arch} {r.config.label}: {r.loads}" for r in runs if r.loads.get("v") != "16B cp.async"]
    assert not narrow, "\n".join(narrow)


def test_prefill_never_spills(compiled):
    """Prefill tiles (several query tokens x the group) fit the registers for every dtype:
    64-row tiles spilled 144 B (fp16, sm_80) to 36 KB (fp32) per thread."""
    prefill = [r for r in compiled if not r.config.decode and not r.error]
    seen = {(r.config.cache_dtype or r.config.dtype, r.config.head_dim) for r in prefill}
    assert {("fp32", 64), ("fp32", 128), ("bf16", 64), ("bf16", 128), ("fp16", 128), ("fp8", 128), ("fp8_e5m2", 128)} <= seen
    assert {r.config.num_heads // r.config.num_kv_heads for r in prefill} >= {1, 4, 8}
    assert {r.arch for r in prefill if r.config.cache_dtype == "fp8"} == {"sm_90"}  # e4m3 only compiles from sm_89
    spilled = [f"{r.arch} {r.config.label} {r.kernel}: {r.spill_bytes} B, {r.registers} registers" for r in prefill if r.spill_bytes]
    assert not spilled, "\n".join(spilled)


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


def test_offline_figures_match_the_driver_on_a_gpu():
    """On a GPU (scripts/gpu_check.sh): a real call compiles the very variants the offline
    compile named (same Triton hash), and the driver's registers, shared memory and
    spill-freeness are the ones reported offline."""
    torch = pytest.importorskip("torch")
    from conftest import ON_GPU

    if not ON_GPU:
        pytest.skip("needs a CUDA GPU: compares the offline figures with the driver's")
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    if arch not in ARCHS:
        pytest.skip(f"{arch} is not one of the compiled archs {sorted(ARCHS)}")
    from pagetrace import paged_attention
    from pagetrace.attention.api import load_kernel
    from pagetrace.attention.gpu_compile import meta_inputs

    config = Config("nhd", "fp16", 16, 128, 32, 8, (4096,) * 4)
    shapes = [t.shape for t in meta_inputs(config)]
    q, kc, vc = (torch.randn(s, dtype=torch.float16, device="cuda") for s in shapes[:3])
    tables = torch.arange(shapes[3].numel(), dtype=torch.int32, device="cuda").view(shapes[3])
    paged_attention(q, kc, vc, tables, torch.full(shapes[4], 4096, dtype=torch.int32, device="cuda"), backend="triton")

    kernel = load_kernel(interpret=False)
    loaded = {
        compiled.hash: compiled
        for fn in (kernel._paged_attention_partition, kernel._paged_attention_reduce)
        for compiled in fn.device_caches[torch.cuda.current_device()][0].values()
    }
    records, missing = compile_configs([config], archs=(arch,), jobs=1)
    if missing:
        pytest.skip(missing)
    assert len(records) == 2
    for r in records:
        assert r.key in loaded, f"the GPU compiled another {r.kernel} variant than the offline compile"
        real = loaded[r.key]
        real._init_handles()
        assert (r.registers, r.shared_bytes) == (real.n_regs, real.metadata.shared), r.kernel
        assert (r.spill_bytes == 0) == (real.n_spills == 0), r.kernel
