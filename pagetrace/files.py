"""Output files: checked before any work, then written whole or not at all.

Every command that writes a file uses these two steps:

    check_outputs({"--svg": path, ...})   up front, before any work: UsageError (exit 2)
    write_outputs([(path, data), ...])    at the end: every file whole, or RuntimeFailure

What a path may be, and how it is written:

- `-`: stdout. Only one option may take it, and not together with `--json` (whose
  document is stdout).
- a new path or a regular file: written to a temporary file beside it, then renamed over
  it, so a reader never sees half a file and a failed write leaves the old file whole; a
  replaced file keeps its permissions (a new one gets 0666 less the umask).
- a symbolic link: followed; what it points to is written by these rules (the link stays
  a link).
- a FIFO or a character device (`/dev/null`, `/dev/stdout`, a terminal): written through,
  in place; such a file is never replaced.
- anything else (a directory, a block device, a socket) is refused.

Refused up front, each as one line naming the option and the path: an empty path, a value
that starts with `--` (an option taken as the file name: `--svg --json`), a name over
the file system's limit (255 bytes) or a path over PATH_MAX, a folder that does not exist,
is not a folder, or that this user cannot search or write, and an existing file this user
cannot write. The temporary name never outgrows the limit: a long name gets a short one.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from typing import Any

from .errors import RuntimeFailure, UsageError

STDOUT = "-"
NAME_MAX = 255  # where pathconf cannot tell
PATH_MAX = 4096
_TEMP_SUFFIX = ".tmp"
_TEMP_RANDOM = 8  # the characters mkstemp adds


def _limit(folder: str, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError, AttributeError):
        return default


def _kind(mode: int) -> str | None:
    """How a file of this mode is written: "replace", "through", or None (refused)."""
    if stat.S_ISREG(mode):
        return "replace"
    if stat.S_ISFIFO(mode) or stat.S_ISCHR(mode):
        return "through"
    return None


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def check_output(option: str, path: str) -> None:
    """Refuse a path that cannot be written, before any work: UsageError names the option."""
    if not path.strip():
        raise UsageError(option, path, "is empty; give a file path")
    if path == STDOUT:
        return
    if path.startswith("--"):
        raise UsageError(option, path, f"looks like an option, not a file; give a file path (./{path} for a file of that name)")
    if "\0" in path:
        raise UsageError(option, path, "contains a NUL byte")
    if path.endswith(("/", os.sep)):
        raise UsageError(option, path, "is a directory; give a file path")
    real = os.path.realpath(path)
    folder, name = os.path.split(real)
    folder = folder or os.sep
    path_max = _limit(folder, "PC_PATH_MAX", PATH_MAX) if os.path.isdir(folder) else PATH_MAX
    if len(os.fsencode(real)) >= path_max:
        raise UsageError(option, path, f"is {len(os.fsencode(real))} bytes long; paths here are limited to {path_max - 1}")
    _check_folder(option, path, folder)
    name_max = _limit(folder, "PC_NAME_MAX", NAME_MAX)
    if len(os.fsencode(name)) > name_max:
        raise UsageError(option, path, f"has a file name of {len(os.fsencode(name))} bytes; names here are limited to {name_max}")
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UsageError(option, path, f"cannot be read: {exc.strerror or exc}") from None
    if mode is None or _kind(mode) == "replace":
        if not os.access(folder, os.W_OK | os.X_OK):
            raise UsageError(option, path, f"directory {folder!r} is not writable")
    elif _kind(mode) is None:
        raise UsageError(option, path, f"is {_what(mode)}; give a file path")
    if mode is not None and not os.access(real, os.W_OK):
        raise UsageError(option, path, "exists and is not writable")


def _check_folder(option: str, path: str, folder: str) -> None:
    try:
        mode = os.stat(folder).st_mode
    except FileNotFoundError:
        raise UsageError(option, path, f"directory {folder!r} does not exist") from None
    except NotADirectoryError:
        raise UsageError(option, path, f"{folder!r} is not a directory") from None
    except PermissionError:
        raise UsageError(option, path, f"directory {folder!r} cannot be reached: a folder above it has no search permission") from None
    except OSError as exc:
        raise UsageError(option, path, f"directory {folder!r}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(mode):
        raise UsageError(option, path, f"{folder!r} is not a directory")
    if not os.access(folder, os.X_OK):
        raise UsageError(option, path, f"directory {folder!r} has no search permission")


# the format each file option writes, and the extensions that name a format
OPTION_FORMATS = {"--svg": "svg", "--png": "png", "--dot": "dot", "--chart": "svg", "--tables-svg": "svg", "--tables-png": "png", "--html": "html"}
EXTENSION_FORMATS = {".svg": "svg", ".png": "png", ".dot": "dot", ".gv": "dot", ".jpg": "jpeg", ".jpeg": "jpeg", ".pdf": "pdf", ".gif": "gif", ".webp": "webp", ".json": "json", ".html": "html"}
OPTION_FOR_FORMAT = {"svg": "--svg", "png": "--png", "dot": "--dot"}


def check_format(option: str, path: str) -> None:
    """A file whose extension names another format than the option writes is refused
    (`--svg x.png` would put SVG text in a .png file); no extension, or one that names no
    format, is taken as given."""
    writes = OPTION_FORMATS.get(option)
    named = EXTENSION_FORMATS.get(os.path.splitext(path)[1].lower())
    if writes is None or named is None or named == writes or path == STDOUT:
        return
    other = None if option == "--chart" else OPTION_FOR_FORMAT.get(named)
    if other and option.startswith("--tables-"):
        other = f"--tables-{named}" if f"--tables-{named}" in OPTION_FORMATS else None
    hint = f"use {other} for {named.upper()}, or " if other else ""
    raise UsageError(option, path, f"names a .{named} file, but {option} writes {writes.upper()}; {hint}give the file a .{writes} name")


def check_outputs(paths: dict[str, str], stdout_taken_by: str | None = None) -> None:
    """`check_output` and `check_format` for each (option -> path), and no file given twice:
    at most one on stdout (`-`), none when `stdout_taken_by` (e.g. "--json") writes stdout already."""
    seen: dict[str, str] = {}
    for option, path in paths.items():
        check_output(option, path)
        check_format(option, path)
        if path == STDOUT and stdout_taken_by is not None:
            raise UsageError(option, path, f"writes to stdout, where {stdout_taken_by} writes its document; give a file path")
        key = path if path == STDOUT else os.path.realpath(path)
        if key in seen:
            same = f"writes to stdout, as {seen[key]} does" if path == STDOUT else f"is the same file as {seen[key]}"
            raise UsageError(option, path, f"{same}; give each output its own path")
        seen[key] = option


def _temp_prefix(name: str, name_max: int) -> str:
    prefix = f".{name}."
    if len(os.fsencode(prefix)) + _TEMP_RANDOM + len(_TEMP_SUFFIX) > name_max:
        return ".pagetrace."
    return prefix


def _stage(real: str, path: str, data: bytes) -> str:
    """Write `data` to a temporary file beside `real`; return the temporary file's name."""
    import tempfile

    folder, name = os.path.split(real)
    folder = folder or os.sep
    prefix = _temp_prefix(name, _limit(folder, "PC_NAME_MAX", NAME_MAX))
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=_TEMP_SUFFIX)
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _mode_for(real))
    except OSError as exc:
        _remove(tmp)
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    return tmp


def _mode_for(real: str) -> int:
    """The permissions a written file gets: those of the file it replaces (a 0600 file stays 0600),
    or, for a new file, 0666 less the umask, as open() would give it."""
    try:
        return stat.S_IMODE(os.stat(real).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _plan(path: str) -> tuple[str, str]:
    """(how, where): "stdout"; or "replace"/"through" and the path the link points to."""
    if path == STDOUT:
        return "stdout", path
    real = os.path.realpath(path)
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return "replace", real
    except OSError as exc:
        raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    how = _kind(mode)
    if how is None:
        raise RuntimeFailure(f"cannot write {path}: it is {_what(mode)}")
    return how, real


def write_outputs(outputs: list[tuple[str, bytes]]) -> list[str]:
    """Write every output; return their paths. Regular files and new paths are staged
    beside their targets first, then renamed over them: all of them or none. FIFOs and
    devices are then written through, and stdout (`-`) last."""
    plans = [(_plan(path), path, data) for path, data in outputs]
    staged: list[tuple[str, str, str]] = []  # (temporary, real, path)
    try:
        for (how, real), path, data in plans:
            if how == "replace":
                staged.append((_stage(real, path, data), real, path))
        for i, (tmp, real, path) in enumerate(staged):
            try:
                os.replace(tmp, real)
            except OSError as exc:
                raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
            staged[i] = ("", real, path)
    finally:
        for tmp, _, _ in staged:
            if tmp:
                _remove(tmp)
    for (how, real), path, data in plans:
        if how == "through":
            try:
                with open(real, "wb") as f:
                    f.write(data)
            except OSError as exc:
                raise RuntimeFailure(f"cannot write {path}: {exc.strerror or exc}") from None
    for (how, _), _, data in plans:
        if how == "stdout":
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
    return [path for path, _ in outputs]


def write_output(path: str, data: bytes) -> str:
    """Write one output by the rules above; return its path."""
    return write_outputs([(path, data)])[0]


def json_safe(value: Any) -> Any:
    """The document with NaN and infinities as null: JSON has no such numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
