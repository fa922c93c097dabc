"""What `run` tells a person: which backend was checked how, row counts, marks, and the
tolerance of its check fed a real error just over and just under it, per dtype."""

import json

import pytest
import torch
from conftest import cli

from pagetrace.views.run import hidden_rows
from pagetrace.attention.report import TOLERANCES, compare


def test_torch_backend_claims_no_kernel_check(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38", "--backend", "torch")
    text = " ".join(out.split())
    assert code == 0, err
    assert "every slot the kernel read" not in text and "paged - contiguous" not in text
    assert "no kernel ran" in text and "not checked" in text
    code, out, _ = cli(capsys, "run", "--tokens", "38", "--backend", "torch", "--json")
    checks = json.loads(out)["checks"]
    assert checks["slots_checked"] is False and "no kernel ran" in checks["compared"]


def test_kernel_backend_states_its_checks(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38")
    text = " ".join(out.split())
    assert code == 0, err
    assert "every slot the kernel read matches the block table" in text and "paged - contiguous" in text
    assert json.loads(cli(capsys, "run", "--tokens", "38", "--json")[1])["checks"]["slots_checked"] is True


def test_hidden_row_grammar():
    assert str(hidden_rows(1, "rows", 9)[-1]) == "1 row hidden"
    assert str(hidden_rows(2, "rows", 9)[-1]) == "2 rows hidden"
    assert str(hidden_rows(1, "blocks", 2)[-1]) == "1 block hidden"


def test_traced_token_that_is_the_max_shows_both_marks(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38", "--token", "9")
    assert code == 0, err
    assert "◀ traced + max" in out


def test_output_norm_names_its_sequence_and_head(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38,20", "--backend", "torch")
    text = " ".join(out.split())
    assert code == 0, err
    assert "output vector norm" in text
    norm = text.split("output vector norm", 1)[1].split("check", 1)[0]
    assert "(sequence 0, head 0)" in norm


# --- the check's tolerance, fed a known error -------------------------------------------
# The kernel's output element [0, 0, 0] is forced to 0 (exact in every dtype) and the
# reference's to delta = factor * tol: |diff| = delta against the bound tol * (1 + delta),
# so factor 1.05 is over the bound for every dtype and 0.95 under it.
OVER, UNDER = 1.05, 0.95
# the documented tolerances (README, `pagetrace run`), written here rather than read from
# report.TOLERANCES, so that a changed table cannot agree with itself
# (fp8 caches: the reference dequantises the same fp8 values, so fp16's bound holds)
DOCUMENTED = {"fp32": 1e-5, "fp16": 1e-3, "bf16": 1.6e-2, "fp8_e4m3": 1e-3, "fp8_e5m2": 1e-3}


def test_tolerances_are_the_documented_ones():
    assert TOLERANCES == DOCUMENTED


@pytest.mark.parametrize("dtype", sorted(TOLERANCES))
@pytest.mark.parametrize("factor, passes", [(OVER, False), (UNDER, True)])
def test_compare_at_the_tolerance(dtype, factor, passes):
    tol = DOCUMENTED[dtype]
    want = torch.randn(2, 3, 8, dtype=torch.float64)
    got = want.clone()
    got[0, 0, 0], want[0, 0, 0] = 0.0, factor * tol
    worst, reported_tol, passed = compare(got, want, dtype)
    assert passed is passes and worst == pytest.approx(factor * tol)


@pytest.fixture
def known_error(monkeypatch):
    from pagetrace.attention import api as attention, reference

    real_attention, real_reference = attention.paged_attention, reference.reference_attention
    state = {}

    def kernel(*args, **kwargs):
        out, trace = real_attention(*args, **kwargs)
        out[0, 0, 0] = 0
        return out, trace

    def contiguous(*args, **kwargs):
        ref = real_reference(*args, **kwargs)
        # the other elements keep their real difference (far below tolerance): only [0,0,0] is forced
        ref.output[0, 0, 0] = state["delta"]
        return ref

    monkeypatch.setattr(attention, "paged_attention", kernel)
    monkeypatch.setattr(reference, "reference_attention", contiguous)
    return state


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("factor, code", [(OVER, 1), (UNDER, 0)])
def test_run_exits_1_just_over_the_tolerance(capsys, known_error, dtype, factor, code):
    known_error["delta"] = factor * DOCUMENTED[dtype]
    got, out, err = cli(capsys, "run", "--tokens", "38", "--dtype", dtype, "--backend", "torch", "--json")
    assert got == code, err
    doc = json.loads(out)
    assert doc["checks"]["passed"] is (code == 0)
    assert doc["checks"]["max_abs_diff"] >= known_error["delta"] * 0.999
    if code == 1:
        assert len(err.strip().splitlines()) == 1 and "tolerance" in err


def test_refusal_follows_the_available_memory(capsys, monkeypatch):
    """The same run is refused (exit 2, before any allocation) when the machine says it has
    less memory available than the cache takes, and runs when it has enough."""
    from pagetrace.attention import workload

    args = ("run", "--tokens", "38", "--num-blocks", "20000", "--backend", "torch")  # a 20 MiB cache
    monkeypatch.setattr(workload, "available_memory_bytes", lambda: 8 << 20)
    code, out, err = cli(capsys, *args)
    assert code == 2 and out == "" and "--num-blocks" in err and "available" in err
    monkeypatch.setattr(workload, "available_memory_bytes", lambda: 64 << 30)
    assert cli(capsys, *args)[0] == 0


def test_large_cache_gets_a_memory_note(monkeypatch):
    from types import SimpleNamespace

    from pagetrace.attention import traced_run as run_command
    from pagetrace.paging.plan import plan_tables

    monkeypatch.setattr("pagetrace.paging.plan.available_memory_bytes", lambda: 3 << 30)
    setup = SimpleNamespace(plan=plan_tables([38], None, 16, 4194304), kv_heads=1, head_dim=8, dtype="fp32")
    note = run_command.memory_note(setup)
    assert "4.0 GiB" in note and "4,194,304 blocks" in note and "3.0 GiB of memory available" in note
    assert run_command.memory_note(SimpleNamespace(plan=plan_tables([38], None, 16), kv_heads=1, head_dim=8, dtype="fp32")) is None


def test_a_wrong_slot_fails_the_run(capsys, monkeypatch):
    """A kernel that read token 5 from the wrong slot: exit 1 naming the slot, and the JSON lists it."""
    from pagetrace.attention import api as attention

    real = attention.paged_attention

    def misread(*args, **kwargs):
        out, trace = real(*args, **kwargs)
        trace.slots[0, 5] += 1
        return out, trace

    monkeypatch.setattr(attention, "paged_attention", misread)
    code, out, err = cli(capsys, "run", "--tokens", "38")
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "sequence 0 token 5: kernel read slot 118, block table says 117" in err
    code, out, err = cli(capsys, "run", "--tokens", "38", "--json")
    checks = json.loads(out)["checks"]
    assert code == 1 and checks["slots_match"] is False and len(checks["slot_mismatches"]) == 1
