"""Output files (`pagetrace.files` and the --svg/--png/--dot options): checked before any
work, written whole, `-` for stdout, and never a link, FIFO or device replaced.

The tests run as whatever user the machine gives (often root, who may write anywhere),
so a folder without permission is simulated by patching `os.access`/`os.stat` where the
refusal needs it; everything else is real: links, FIFOs, device nodes, sockets.
"""

from __future__ import annotations

import os
import socket
import stat
import threading
from pathlib import Path

import pytest
from conftest import assert_usage_error, cli

from pagetrace import files
from pagetrace.errors import UsageError

DIAGRAM = ("diagram", "--tokens", "38", "--table", "7,2,15", "--num-blocks", "16")


@pytest.fixture
def no_kernel(monkeypatch):
    """Fail the test if `run` reaches its kernel: the path checks come first."""
    from pagetrace.attention import api as attention

    def kernel(*args, **kwargs):
        raise AssertionError("the kernel ran before the paths were checked")

    monkeypatch.setattr(attention, "paged_attention", kernel)


# -- links, FIFOs, devices: written through, never replaced --------------------------


def test_a_symlink_stays_a_link_and_its_target_gets_the_file(capsys, tmp_path):
    real = tmp_path / "real.dot"
    real.write_text("old")
    link = tmp_path / "link.dot"
    link.symlink_to(real)
    code, _, err = cli(capsys, *DIAGRAM, "--dot", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().startswith("digraph pagetrace {")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.dot", "real.dot"]  # no temporary left


def test_a_dangling_symlink_creates_its_target(capsys, tmp_path):
    link = tmp_path / "link.dot"
    link.symlink_to(tmp_path / "new.dot")
    code, _, err = cli(capsys, *DIAGRAM, "--dot", str(link))
    assert code == 0, err
    assert link.is_symlink() and (tmp_path / "new.dot").read_text().startswith("digraph")


def test_a_fifo_is_written_through(capsys, tmp_path):
    fifo = tmp_path / "pipe.dot"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    code, _, err = cli(capsys, *DIAGRAM, "--dot", str(fifo))
    reader.join(timeout=10)
    if reader.is_alive():  # nobody wrote to the FIFO: open it once so the reader ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)) if stat.S_ISFIFO(os.lstat(fifo).st_mode) else None
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert got and got[0].startswith(b"digraph pagetrace {")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_a_character_device_is_written_through_not_replaced(capsys, tmp_path):
    """A node of the null device in tmp_path: as root, a rename would replace it."""
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    code, _, err = cli(capsys, *DIAGRAM, "--dot", str(null))
    assert code == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_a_socket_is_refused_up_front(capsys, tmp_path):
    path = tmp_path / "s.dot"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(path))
        assert_usage_error(cli(capsys, *DIAGRAM, "--dot", str(path)), "--dot")
        assert stat.S_ISSOCK(os.lstat(path).st_mode)


def test_dev_stdout_is_written_through(capsys, tmp_path):
    """/dev/stdout: a link to this process's stdout, whatever it is; never a rename."""
    out = tmp_path / "out.txt"
    import subprocess
    import sys

    with out.open("wb") as sink:
        done = subprocess.run(
            [sys.executable, "-m", "pagetrace", *DIAGRAM, "--dot", "/dev/stdout"], stdout=sink, stderr=subprocess.PIPE, timeout=60
        )
    assert done.returncode == 0, done.stderr
    assert out.read_text().startswith("digraph pagetrace {")


# -- `-` is stdout -------------------------------------------------------------------


def test_dash_writes_the_file_to_stdout_and_nothing_else(capsys):
    code, out, err = cli(capsys, *DIAGRAM, "--dot", "-")
    from pagetrace.views.diagram import MappingView, SequenceMap, dot_source

    view = MappingView(16, 16, [SequenceMap("seq 0", 38, [7, 2, 15])])
    assert code == 0, err
    assert out == dot_source(view) and err == ""


def test_lookup_with_dash_keeps_stdout_for_the_file(capsys):
    code, out, err = cli(capsys, "lookup", "--token", "20", "--dot", "-")
    assert code == 0, err
    assert out.startswith("digraph pagetrace {") and out.rstrip().endswith("}")
    assert "physical block" in err  # the lookup report went to stderr


def test_svg_on_stdout(capsys):
    code, out, err = cli(capsys, *DIAGRAM, "--svg", "-")
    assert code == 0, err
    assert out.lstrip().startswith("<?xml") and out.rstrip().endswith("</svg>")


@pytest.mark.parametrize("command", [DIAGRAM, ("lookup",), ("run", "--tokens", "38")])
@pytest.mark.parametrize("option", ["--svg", "--png", "--dot"])
def test_dash_with_json_is_a_usage_error(capsys, no_kernel, command, option):
    assert_usage_error(cli(capsys, *command, option, "-", "--json"), option)


def test_two_files_on_stdout_is_a_usage_error(capsys):
    assert_usage_error(cli(capsys, *DIAGRAM, "--svg", "-", "--dot", "-"), "--dot")


# -- paths refused up front: exit 2, one line, before any work ----------------------------


@pytest.mark.parametrize("command", [("lookup",), DIAGRAM, ("run", "--tokens", "38")])
def test_an_option_taken_as_the_file_name_is_a_usage_error(capsys, tmp_path, monkeypatch, no_kernel, command):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(cli(capsys, *command, "--svg", "--json"), "--svg")
    assert list(tmp_path.iterdir()) == []


def test_a_file_named_like_an_option_can_still_be_written(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli(capsys, *DIAGRAM, "--dot", "./--json")
    assert code == 0, err
    assert (tmp_path / "--json").read_text().startswith("digraph")


def test_a_name_over_255_bytes_is_refused_before_the_kernel(capsys, tmp_path, no_kernel):
    path = tmp_path / ("a" * 256 + ".svg")
    assert_usage_error(cli(capsys, "run", "--tokens", "38", "--svg", str(path)), "--svg")
    assert list(tmp_path.iterdir()) == []


def test_a_name_of_multibyte_characters_counts_bytes(capsys, tmp_path):
    path = tmp_path / ("é" * 126 + ".dot")  # 252 + 4 bytes, 130 characters
    assert_usage_error(cli(capsys, *DIAGRAM, "--dot", str(path)), "--dot")


def test_a_long_name_still_gets_a_temporary_file_that_fits(capsys, tmp_path):
    """A 250-byte name is legal; `.<name>.XXXXXXXX.tmp` beside it would not be."""
    path = tmp_path / ("b" * 246 + ".dot")
    code, _, err = cli(capsys, *DIAGRAM, "--dot", str(path))
    assert code == 0, err
    assert path.read_text().startswith("digraph") and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_path_over_path_max_is_refused(capsys, tmp_path):
    deep = str(tmp_path) + "/x" * 2100 + ".dot"
    assert_usage_error(cli(capsys, *DIAGRAM, "--dot", deep), "--dot")


def test_a_missing_folder_is_refused_before_the_kernel(capsys, tmp_path, no_kernel):
    assert_usage_error(cli(capsys, "run", "--tokens", "38", "--png", str(tmp_path / "no" / "m.png")), "--png")


def test_a_folder_without_search_permission_is_refused(capsys, tmp_path, monkeypatch, no_kernel):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(files.os, "access", lambda p, mode, **kw: False if Path(p) == locked and mode & os.X_OK else real(p, mode, **kw))
    result = cli(capsys, "run", "--tokens", "38", "--svg", str(locked / "m.svg"))
    assert_usage_error(result, "--svg")
    assert "search permission" in result[2]


def test_a_folder_above_without_search_permission_is_refused(capsys, tmp_path, monkeypatch):
    """stat fails with EACCES when a folder on the way cannot be searched."""
    inner = tmp_path / "locked" / "inner"
    inner.mkdir(parents=True)
    real = os.stat

    def stat_(p, *args, **kwargs):
        if str(p).startswith(str(tmp_path / "locked") + os.sep):
            raise PermissionError(13, "Permission denied", str(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(files.os, "stat", stat_)
    result = cli(capsys, *DIAGRAM, "--dot", str(inner / "m.dot"))
    assert_usage_error(result, "--dot")
    assert "cannot be reached" in result[2]


def test_a_read_only_file_is_refused(tmp_path, monkeypatch):
    target = tmp_path / "m.dot"
    target.write_text("old")
    real = os.access
    monkeypatch.setattr(files.os, "access", lambda p, mode, **kw: False if Path(p) == target and mode & os.W_OK else real(p, mode, **kw))
    with pytest.raises(UsageError, match="not writable"):
        files.check_output("--dot", str(target))
    assert target.read_text() == "old"


# -- the API ---------------------------------------------------------------------------


def test_write_output_replaces_a_regular_file_whole(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    files.check_output("--out", str(target))
    assert files.write_output(str(target), b"new") == str(target)
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_write_outputs_to_stdout_last(capsysbinary, tmp_path):
    target = tmp_path / "a.txt"
    files.write_outputs([("-", b"to stdout"), (str(target), b"to a file")])
    assert capsysbinary.readouterr().out == b"to stdout" and target.read_bytes() == b"to a file"


@pytest.mark.parametrize("path, reason", [("", "empty"), ("--x", "looks like an option"), ("a\0b", "NUL")])
def test_check_output_reasons(path, reason):
    with pytest.raises(UsageError, match=reason):
        files.check_output("--out", path)


@pytest.mark.parametrize("option", ["--chart", "--tables-svg"])
def test_simulate_names_its_own_file_options(capsys, tmp_path, option):
    """simulate's extra file options are checked up front under their own names."""
    result = cli(capsys, "simulate", "--requests", "3", "--at", "1", option, str(tmp_path / "no" / "x.svg"))
    assert_usage_error(result, option)


def test_simulate_keeps_stdout_for_its_report(capsys):
    assert_usage_error(cli(capsys, "simulate", "--requests", "3", "--svg", "-"), "--svg")


@pytest.mark.parametrize("args, option, hint", [
    (["run", "--svg", "x.png"], "--svg", "use --png for PNG"),
    (["run", "--png", "x.SVG"], "--png", "use --svg for SVG"),
    (["lookup", "--dot", "x.svg"], "--dot", "use --svg for SVG"),
    (["simulate", "--svg", "pool.png"], "--svg", "use --png for PNG"),
    (["simulate", "--chart", "waste.png"], "--chart", "give the file a .svg name"),
    (["simulate", "--at", "3", "--tables-svg", "t.dot"], "--tables-svg", "give the file a .svg name"),
])
def test_a_file_named_for_another_format_is_refused(tmp_path, capsys, monkeypatch, args, option, hint):
    """`--svg x.png` would write SVG text into a .png file: exit 2, naming the option and both formats, no file."""
    monkeypatch.chdir(tmp_path)
    result = cli(capsys, *args)
    assert_usage_error(result, option)
    assert "writes" in result[2] and hint in result[2]
    assert list(tmp_path.iterdir()) == []


def test_names_that_say_no_format_are_taken_as_given(tmp_path, capsys):
    out = tmp_path / "mapping.picture"
    code, _, err = cli(capsys, "lookup", "--svg", str(out))
    assert code == 0, err
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_replaced_file_keeps_its_mode(tmp_path, mode):
    """Replacing an output keeps the permissions of the file replaced (a 0600 page stayed 0644 before),
    through a symbolic link too; a new file gets 0666 less the umask."""
    target = tmp_path / "page.html"
    target.write_bytes(b"old")
    os.chmod(target, mode)
    link = tmp_path / "link.html"
    link.symlink_to(target)
    files.write_outputs([(str(target), b"new")])
    assert stat.S_IMODE(os.stat(target).st_mode) == mode and target.read_bytes() == b"new"
    files.write_outputs([(str(link), b"again")])
    assert stat.S_IMODE(os.stat(target).st_mode) == mode and link.is_symlink() and target.read_bytes() == b"again"
    umask = os.umask(0o022)
    try:
        files.write_outputs([(str(tmp_path / "new.html"), b"x")])
    finally:
        os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "new.html").st_mode) == 0o644


@pytest.mark.parametrize("args, option", [(["run", "--html"], "page.html"), (["run", "--svg"], "map.svg"), (["simulate", "--requests", "5", "--chart"], "chart.svg")])
def test_commands_keep_the_mode_of_the_file_they_replace(capsys, tmp_path, args, option):
    from conftest import cli

    out = tmp_path / option
    out.write_text("old")
    os.chmod(out, 0o600)
    code, _, err = cli(capsys, *args, str(out))
    assert code == 0, err
    assert out.read_text() != "old" and stat.S_IMODE(os.stat(out).st_mode) == 0o600
