"""The public API keeps its import paths when modules move between rooms (docs/architecture.md):
what docs/python-api.md and the examples import, each from the path a user writes, in a fresh
interpreter so that nothing another test imported first can make it pass."""

import subprocess
import sys

import pytest

# (the import a user writes, a name it must bind)
PUBLIC = [
    ("from pagetrace import paged_attention", "paged_attention"),
    ("from pagetrace import trace_token", "trace_token"),
    ("from pagetrace import locate, slot_mapping, coverage, TokenLocation", "locate"),
    ("from pagetrace import LAYOUTS, make_geometry, vector_address", "LAYOUTS"),
    ("from pagetrace import UsageError, RuntimeFailure", "UsageError"),
    ("from pagetrace.engines import flashinfer", "flashinfer.write_bundle"),
    ("from pagetrace.engines import sglang", "sglang.write_bundle"),
    ("from pagetrace.engines.export import write_bundle", "write_bundle"),
    ("from pagetrace.engines.views import as_tensors", "as_tensors"),
    ("from pagetrace.engines.bundle import read_manifest, read_step", "read_manifest"),
    ("from pagetrace.sim import simulate, SimRequest", "simulate"),
    ("from pagetrace.cli import app, main", "app"),
]


@pytest.mark.parametrize(("statement", "name"), PUBLIC, ids=[s for s, _ in PUBLIC])
def test_public_import_paths(statement, name):
    code = f"{statement}\nassert callable({name}) or isinstance({name}, (dict, type))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_paged_attention_is_the_attention_package_one():
    import pagetrace
    from pagetrace.attention.api import paged_attention

    assert pagetrace.paged_attention is paged_attention


def test_engine_vllm_adapter_imports_without_vllm():
    """The vLLM adapter's module imports (its vLLM imports are inside the functions)."""
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['vllm'] = None; from pagetrace.engines import vllm; print(vllm.capture)"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
