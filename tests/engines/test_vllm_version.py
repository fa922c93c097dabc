"""The plugin refuses a vLLM it was not written for, in one line, before patching anything:
checked with a stand-in `vllm` package whose version differs (no real vLLM needed)."""

import os
import subprocess
import sys

import pytest

from pagetrace.engines.vllm_plugin import SUPPORTED_VLLM, vllm_version_problem


def run_register(tmp_path, version: str, **env):
    stand_in = tmp_path / "stand_in" / "vllm"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text(f"__version__ = {version!r}\n")
    code = "import vllm; from pagetrace.engines.vllm_plugin import register, PATCHES; register(); print(sorted(PATCHES))"  # as vLLM calls it
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    environ.update(PYTHONPATH=str(stand_in.parent), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ, cwd=tmp_path)


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.32.0", "dev"])
def test_another_vllm_is_refused_in_one_line_naming_both(tmp_path, version):
    done = run_register(tmp_path, version, PAGETRACE_GUARD="report")
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("pagetrace: refusing to start vLLM: ") and f"vLLM {version} is installed" in lines[0]
    assert f"{SUPPORTED_VLLM[-1]}.x" in lines[0]


def test_the_trace_alone_checks_the_version_too(tmp_path):
    done = run_register(tmp_path, "0.31.0", PAGETRACE_TRACE=str(tmp_path / "t.jsonl"))
    assert done.returncode == 1 and "vLLM 0.31.0 is installed" in done.stderr


@pytest.mark.parametrize("version", ["0.32.0", "0.32.1", "0.32.0+cpu"])
def test_a_supported_release_goes_on(tmp_path, version):
    done = run_register(tmp_path, version, PAGETRACE_TRACE=str(tmp_path / "t.jsonl"))
    assert done.returncode == 0, done.stderr
    assert "vllm.v1.core.sched.scheduler" in done.stdout  # patched: the version was let through


def test_outside_vllm_nothing_is_imported_to_check(tmp_path):
    stand_in = tmp_path / "stand_in" / "vllm"
    stand_in.mkdir(parents=True)
    (stand_in / "__init__.py").write_text("raise SystemExit('imported')\n")
    code = "import sys; from pagetrace.engines.vllm_plugin import register; register(); print('vllm' in sys.modules)"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAGETRACE_")}
    environ.update(PYTHONPATH=str(stand_in.parent), PAGETRACE_GUARD="report")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=environ, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_nothing_set_reads_no_version(tmp_path):
    done = run_register(tmp_path, "0.1.0")
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_rule():
    assert vllm_version_problem("0.32.5") is None and vllm_version_problem("0.320.0") is not None
