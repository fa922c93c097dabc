"""The Typer `app` object behaves like the `pagetrace` binary: same exit codes, same
one-line errors, whether run by `CliRunner`, by `run_cli` or as `python -m pagetrace`."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pagetrace import __version__
from pagetrace.cli import app
from pagetrace.errors import RuntimeFailure

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def binary(*args):
    proc = subprocess.run([sys.executable, "-m", "pagetrace", *args], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line(code, out, err, option, want=2):
    assert code == want, (code, out, err)
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in err, err


def test_app_reports_a_usage_error_like_the_binary():
    app_result = invoke("lookup", "--token", "-1")
    assert_one_line(*app_result, "--token")
    assert binary("lookup", "--token", "-1") == app_result


def test_app_without_arguments_prints_help_like_the_binary():
    code, out, err = invoke()
    assert code == 0 and "lookup" in out and "Usage" in out and err == ""
    assert binary()[0] == 0


def test_unknown_command_and_option_are_usage_errors():
    assert_one_line(*invoke("nope"), "nope")
    assert_one_line(*invoke("lookup", "--nope"), "--nope")


def test_runtime_failure_exits_1_with_one_line(monkeypatch):
    import pagetrace.commands.lookup as lookup_command

    def broken(*args, **kwargs):
        raise RuntimeFailure("the disk is on fire")

    monkeypatch.setattr(lookup_command, "trace_token", broken)
    assert_one_line(*invoke("lookup"), "the disk is on fire", want=1)


def test_version():
    for code, out, err in (invoke("--version"), binary("--version")):
        assert code == 0 and out == f"pagetrace {__version__}\n" and err == ""


def test_completion_is_on():
    code, out, _ = invoke("--help")
    assert code == 0 and "--install-completion" in out and "--version" in out


@pytest.mark.parametrize("value", ["٣", "１６", "1_0", " 7", "7 ", "+7", "0x10", "1e3", "٣.5"])
@pytest.mark.parametrize(
    "command, option",
    [("lookup", "--token"), ("lookup", "--block-size"), ("lookup", "--num-blocks"), ("run", "--heads"), ("run", "--seed"), ("diagram", "--block-size")],
)
def test_integers_are_ascii_digits_only(command, option, value):
    assert_one_line(*invoke(command, option, value), option)


def numeric_options():
    """Every (command, option, kind) whose function declares an int or float option, read from
    the command functions' own signatures, so an option added without `IntOption` or
    `FloatOption` is caught here."""
    import importlib
    import types
    import typing

    import typer

    from pagetrace.cli import COMMANDS, app

    root = typer.main.get_command(app)
    found = []
    for command in COMMANDS:
        function = getattr(importlib.import_module(f"pagetrace.commands.{command.replace('-', '_')}"), command.replace("-", "_"))
        opts = {param.name: param.opts[0] for param in root.get_command(None, command).params}
        for name, hint in typing.get_type_hints(function, include_extras=True).items():
            base = typing.get_args(hint)[0] if hasattr(hint, "__metadata__") else hint
            kinds = set(typing.get_args(base)) - {type(None)} if isinstance(base, types.UnionType) else {base}
            if kinds in ({int}, {float}) and name in opts:
                found.append((command, opts[name], kinds.pop().__name__))
    return found


def test_numeric_options_are_found():
    found = numeric_options()
    assert ("lookup", "--token", "int") in found and ("run", "--scale", "float") in found and len(found) >= 50


@pytest.mark.parametrize("command, option, kind", numeric_options())
def test_every_numeric_option_takes_ascii_only(command, option, kind):
    for value in ("٣", "1_0"):  # int() and float() take both
        code, out, err = invoke(command, option, value)
        assert_one_line(code, out, err, option)
        assert "ASCII digits" in err, err  # refused as written, not for the number it would have been


@pytest.mark.parametrize("value", ["٣", "1_0", " 0.5", "inf", "nan"])
def test_floats_are_ascii_only(value):
    assert_one_line(*invoke("run", "--scale", value), "--scale")


@pytest.mark.parametrize(
    "given, canonical",
    [("fp32", "fp32"), ("FLOAT32", "fp32"), ("float", "fp32"), ("Half", "fp16"), ("float16", "fp16"), ("bfloat16", "bf16"),
     ("BF16", "bf16"), ("fp8", "fp8_e4m3"), ("FP8_E4M3", "fp8_e4m3"), ("fp8_e5m2", "fp8_e5m2")],
)
def test_dtype_aliases(given, canonical):
    code, out, err = invoke("lookup", "--dtype", given, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["dtype"] == canonical
    assert doc["element_size"] == {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}[canonical]


@pytest.mark.parametrize(
    "args, option",
    [(["lookup", "--dtype", "int4"], "--dtype"), (["lookup", "--layout", "paged"], "--layout"), (["run", "--layout", "flash"], "--layout"),
     (["run", "--backend", "cuda"], "--backend"), (["run", "--device", "gpu"], "--device"), (["run", "--device", "cuda:x"], "--device"),
     (["run", "--device", "cuda:"], "--device")],
)
def test_choices_refuse_with_one_line(args, option):
    assert_one_line(*invoke(*args), option)


def test_choices_are_case_insensitive_and_listed_in_help():
    code, out, err = invoke("lookup", "--layout", "NHD", "--kv-heads", "2", "--json")
    assert code == 0 and json.loads(out)["layout"] == "nhd", err
    code, out, _ = invoke("run", "--help")
    for listed in ("fp8_e4m3", "interpret", "vllm", "cuda:N"):
        assert listed in out.replace("\n", "").replace("│", "").replace(" ", "") or listed in out


def test_abort_and_internal_errors_are_one_line(monkeypatch):
    import typer

    import pagetrace.commands.lookup as lookup_command

    def abort(*args, **kwargs):
        raise typer.Abort()

    monkeypatch.setattr(lookup_command, "trace_token", abort)
    assert_one_line(*invoke("lookup"), "aborted", want=1)

    def bug(*args, **kwargs):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(lookup_command, "trace_token", bug)
    code, out, err = invoke("lookup")
    assert code == 1 and "internal error: ZeroDivisionError" in err and "Traceback" not in err
