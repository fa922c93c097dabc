"""examples/flashinfer_bundle.py and examples/sglang_bundle.py run as a user runs them: each
builds a bundle from that engine's own tensors, then `check` passes and `replay` equals the
attention the example wrote by hand over the engine's page table."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script, layout", [("flashinfer_bundle.py", "layout flashinfer"), ("sglang_bundle.py", "layout nhd")])
def test_example_builds_checks_and_replays_a_bundle(tmp_path, script, layout):
    out = tmp_path / "step.bundle"
    done = subprocess.run([sys.executable, str(ROOT / "examples" / script), "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, COLUMNS="100", PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (out / "manifest.json").is_file()
    text = done.stdout
    assert layout in text and "passed: every invariant holds" in text and "(data checked on layer 0)" in text
    # the verdict names what ran: --backend auto may pick the torch path on a CPU, and then no kernel ran
    ran = "torch path" if "backend torch (no kernel ran)" in text else "kernel"
    assert f"passed: {ran} = contiguous attention = engine output" in text and ("kernel =" in text) == (ran == "kernel")
    assert "  step 0" not in text  # no gap where a bundle has no engine version
