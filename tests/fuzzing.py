"""What every fuzzed invocation must do, shared by the fuzz tests.

An invocation runs in-process through `CliRunner` on `app`, under an alarm, and must:
  * exit 0, 1 or 2, with no traceback and no "internal error" anywhere;
  * on exit 2, print nothing on stdout and one line on stderr that names an option
    (or, for an error in a file the command read, that file);
  * with --json, print on stdout exactly one strict JSON document (no NaN), or nothing
    when the input was refused.
PAGETRACE_FUZZ_EXAMPLES (default 300) sets the example count of the lookup/where/run/
diagram fuzz; the other commands' fuzz runs a share of it (`examples`).
PAGETRACE_FUZZ_TIMEOUT (seconds, default 120) makes a hang fail the example.
"""

from __future__ import annotations

import json
import os
import re
import signal

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pagetrace.cli import app

EXAMPLES = int(os.environ.get("PAGETRACE_FUZZ_EXAMPLES", "300"))
TIMEOUT_S = int(os.environ.get("PAGETRACE_FUZZ_TIMEOUT", "120"))
OPTION = re.compile(r"--[a-z]")


def fuzz_settings(share: float = 1.0) -> settings:
    """`share` of PAGETRACE_FUZZ_EXAMPLES examples, no deadline (the first call imports torch)."""
    return settings(
        max_examples=max(1, round(EXAMPLES * share)), deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    )


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang(f"an invocation ran past {TIMEOUT_S} s")


def invoke(argv: list[str]):
    """Run the CLI on `argv` in-process; a run past TIMEOUT_S raises `Hang`."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIMEOUT_S)
    try:
        return CliRunner().invoke(app, argv)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def json_flag(argv: list[str], value_options: set[str]) -> bool:
    """--json given as the flag, not as the value of an option such as --svg."""
    return any(a == "--json" and argv[i - 1] not in value_options for i, a in enumerate(argv) if i)


def _strict(constant):
    raise ValueError(f"non-standard JSON constant {constant}")


def check_invocation(argv: list[str], value_options: set[str], files: tuple[str, ...] = ()):
    """Invoke and assert the rules above; `files` are names an exit-2 line may cite
    instead of an option (a bundle folder, a trace). Returns the result."""
    result = invoke(argv)
    out, err = result.stdout, result.stderr
    context = f"argv={argv!r}\nexit={result.exit_code}\nstdout={out[-2000:]!r}\nstderr={err[-2000:]!r}"
    assert result.exit_code in (0, 1, 2), context
    assert result.exception is None or isinstance(result.exception, SystemExit), context + f"\nexception={result.exception!r}"
    assert "Traceback" not in out and "Traceback" not in err and "internal error" not in err, context
    if result.exit_code == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1, context
        assert OPTION.search(lines[0]) or any(f in lines[0] for f in files), context
    if json_flag(argv, value_options) and out:
        json.loads(out, parse_constant=_strict)  # exactly one document: trailing text fails here
    return result


# -- strategies the fuzz tests share --

# numbers: ordinary, boundary, past every limit, and text that only looks like a number
ODD_NUMBERS = ["0", "-1", "-0", "65536", "65537", "4194305", "2147483648", "9223372036854775808", "1" + "0" * 45,
               "٣", "１６", "1_0", " 7", "7 ", "", "abc", "1e3", "+3", "0x10", "1.5", "--json", "-"]
small = st.integers(-2, 40).map(str)
number = st.one_of(small, small, st.sampled_from(ODD_NUMBERS))
dtype = st.sampled_from(["fp32", "FP16", "half", "bfloat16", "float", "fp8", "fp8_e5m2", "int8", ""])
# `-` is stdout, a value starting with `--` is refused, and so is a name over the OS limit
# (a 10,000-example run before the file-safety fix found `--dot xxx...x.svg`, 300 bytes,
# exiting 1 as an internal error)
path = st.sampled_from(["out.svg", "out.dot", "no/such/dir/x.svg", "", "sub", "-", "--json", "x" * 300 + ".svg"])
html_path = st.sampled_from(["out.html", "page", "out.svg", "no/such/dir/x.html", "", "sub", "-", "--json", "x" * 300 + ".html"])  # --html


def options(pairs: dict) -> st.SearchStrategy[list[str]]:
    """A random subset of `pairs` (option -> value strategy, or None for a flag), shuffled."""
    def one(name, values):
        return st.just([name]) if values is None else values.map(lambda v: [name, v])

    chosen = st.lists(st.sampled_from(sorted(pairs)), max_size=len(pairs))
    return chosen.flatmap(lambda names: st.tuples(*(one(n, pairs[n]) for n in names)) if names else st.just(())).map(
        lambda parts: [arg for part in parts for arg in part]
    )
