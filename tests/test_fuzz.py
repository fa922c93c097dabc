"""A property-based fuzz of the command line, in-process through `CliRunner` on `app`.

Over the argument space of `lookup`, `where`, `run` and `diagram` (malformed and
extreme numbers, tables, paths, option clashes) every invocation must:
  * exit 0, 1 or 2, with no traceback anywhere;
  * on exit 2, print nothing on stdout and one line on stderr that names an option;
  * with --json, print on stdout exactly one strict JSON document (no NaN), or nothing
    when the input was refused.
`run` cases stay tiny (torch backend, small pools) so a few hundred examples take
seconds. The example count is a setting: PAGETRACE_FUZZ_EXAMPLES=10000 for a long
local run; PAGETRACE_FUZZ_TIMEOUT (seconds, default 120) makes a hang fail the example.
"""

import json
import os
import re
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pagetrace.cli import app

EXAMPLES = int(os.environ.get("PAGETRACE_FUZZ_EXAMPLES", "300"))
TIMEOUT_S = int(os.environ.get("PAGETRACE_FUZZ_TIMEOUT", "120"))

# numbers: ordinary, boundary, past every limit, and text that only looks like a number
ODD_NUMBERS = ["0", "-1", "-0", "65536", "65537", "4194305", "2147483648", "9223372036854775808", "1" + "0" * 45,
               "٣", "１６", "1_0", " 7", "7 ", "", "abc", "1e3", "+3", "0x10", "1.5", "--json", "-"]
small = st.integers(-2, 40).map(str)
number = st.one_of(small, small, st.sampled_from(ODD_NUMBERS))
entry = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["-1", "4000000", "4194304", "x", "", " 3", "٣", "1_0"]))
table = st.one_of(st.lists(st.integers(0, 40), min_size=1, max_size=6).map(lambda t: ",".join(map(str, t))), st.lists(entry, min_size=1, max_size=4).map(",".join))
tokens = st.one_of(st.lists(st.integers(1, 40), min_size=1, max_size=3).map(lambda t: ",".join(map(str, t))), st.sampled_from(["0", "-5", "", "38,", "1_0", "٣8", "2147483648"]))
dtype = st.sampled_from(["fp32", "FP16", "half", "bfloat16", "float", "fp8", "fp8_e5m2", "int8", ""])
layout = st.sampled_from(["blocks", "nhd", "HND", "vllm", "flash", "flash-hnd", "flashinfer", "flashinfer-hnd", "paged", ""])
# `-` is stdout, a value starting with `--` is refused, and so is a name over the OS limit
# (a 10,000-example run before the file-safety fix found `--dot xxx...x.svg`, 300 bytes,
# exiting 1 as an internal error)
path = st.sampled_from(["out.svg", "out.dot", "no/such/dir/x.svg", "", "sub", "-", "--json", "x" * 300 + ".svg"])


def options(pairs: dict) -> st.SearchStrategy[list[str]]:
    """A random subset of `pairs` (option -> value strategy, or None for a flag), shuffled."""
    def one(name, values):
        return st.just([name]) if values is None else values.map(lambda v: [name, v])

    chosen = st.lists(st.sampled_from(sorted(pairs)), max_size=len(pairs))
    return chosen.flatmap(lambda names: st.tuples(*(one(n, pairs[n]) for n in names)) if names else st.just(())).map(
        lambda parts: [arg for part in parts for arg in part]
    )


GEOMETRY = {"--block-size": number, "--head-dim": number, "--kv-heads": number, "--num-blocks": number, "--dtype": dtype, "--layout": layout}
LOOKUP = {"--token": number, "--table": table, "--head": number, "--json": None, "--svg": path, "--dot": path, **GEOMETRY}
WHERE = {"--slot": number, "--byte": number, "--cache": st.sampled_from(["key", "VALUE", "both"]), "--table": table, "--json": None, **GEOMETRY}
tiny = st.one_of(st.integers(1, 9).map(str), st.sampled_from(["0", "-1", "٣", "65537", ""]))
RUN = {
    "--tokens": tokens, "--table": table, "--block-size": tiny, "--head-dim": st.sampled_from(["4", "8", "16", "0", "3", "17000", "x"]),
    "--heads": tiny, "--kv-heads": tiny, "--num-blocks": st.sampled_from(["8", "41", "64", "0", "4194305", "1_0"]), "--dtype": dtype,
    "--layout": layout, "--seed": number, "--scale": st.sampled_from(["0.5", "-1", "1e7", "nan", "inf", "٣", ""]), "--token": number,
    "--seq": tiny, "--rows": st.sampled_from(["3", "all", "0", "-1", "x"]), "--show-heads": st.sampled_from(["0", "all", "0,0", "9", ""]),
    "--device": st.sampled_from(["cpu", "CPU", "cuda", "cuda:7", "tpu"]), "--json": None, "--dot": path,
}
DIAGRAM = {
    "--tokens": tokens, "--table": table, "--block-size": number, "--num-blocks": number, "--seed": number, "--token": number,
    "--seq": number, "--slots": None, "--no-slots": None, "--json": None, "--svg": path, "--dot": path,
}

command_line = st.one_of(
    options(LOOKUP).map(lambda a: ["lookup", *a]),
    options(WHERE).map(lambda a: ["where", *a]),
    options(RUN).map(lambda a: ["run", "--backend", "torch", *a]),
    options(DIAGRAM).map(lambda a: ["diagram", *a]),
)


VALUE_OPTIONS = {name for pairs in (LOOKUP, WHERE, RUN, DIAGRAM) for name, values in pairs.items() if values is not None}


def json_flag(argv: list[str]) -> bool:
    """--json given as the flag, not as the value of an option such as --svg."""
    return any(a == "--json" and argv[i - 1] not in VALUE_OPTIONS for i, a in enumerate(argv) if i)


def _strict(constant):
    raise ValueError(f"non-standard JSON constant {constant}")


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"an invocation ran past {TIMEOUT_S} s")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    return tmp_path


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(argv=command_line)
def test_cli_never_crashes(in_tmp, argv):
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        result = CliRunner().invoke(app, argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = result.stdout, result.stderr
    context = f"argv={argv!r}\nexit={result.exit_code}\nstdout={out[-2000:]!r}\nstderr={err[-2000:]!r}"
    assert result.exit_code in (0, 1, 2), context
    assert result.exception is None or isinstance(result.exception, SystemExit), context + f"\nexception={result.exception!r}"
    assert "Traceback" not in out and "Traceback" not in err and "internal error" not in err, context
    if result.exit_code == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1, context
        assert re.search(r"--[a-z]", lines[0]), context
    if json_flag(argv) and out:
        json.loads(out, parse_constant=_strict)  # exactly one document: trailing text fails here
