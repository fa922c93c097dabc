"""The CLI's option types: one integer parser and case-insensitive choices with aliases.

They are plain callables handed to Typer's public `parser=` (and completions to its
`autocompletion=`), so nothing here imports Click or Typer's internals: the same code runs
on every Typer from pyproject's minimum to the newest (CI runs the suite at both ends).

Python's `int()` takes `٣` (Arabic-Indic three), `１６` (full-width), `1_0` and ` 7`.
`ascii_int` accepts an optional `-` and ASCII digits only, the same rule `--table` applies to
its entries, so every integer option reads the same way; `IntOption` and `FloatOption` are
`typer.Option` with that parser (tests/commands/test_bad_input.py holds every numeric option
of every command to it). `AliasChoice` lists an Enum's values in `--help` and in shell
completion, and also takes the aliases and any case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum
from typing import Any

import typer

_ASCII_INT = re.compile(r"-?[0-9]+")
MAX_DIGITS = 40  # far past any size pagetrace accepts; keeps int() on a typo cheap


def ascii_int(value: Any) -> int:
    """An integer written in ASCII digits with an optional leading `-`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    text = str(value)
    if not _ASCII_INT.fullmatch(text):
        raise typer.BadParameter(f"{text!r} is not an integer (ASCII digits 0-9, optionally a leading -)")
    if len(text) > MAX_DIGITS:
        raise typer.BadParameter(f"{text[:12]}... has {len(text)} digits; no size is that large")
    return int(text)


_ASCII_FLOAT = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


def ascii_float(value: Any) -> float:
    """A decimal number in ASCII digits: 0.125, .5, 1e-3, -2."""
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    text = str(value)
    if len(text) > MAX_DIGITS or not _ASCII_FLOAT.fullmatch(text):
        raise typer.BadParameter(f"{text[:MAX_DIGITS]!r} is not a decimal number (ASCII digits, such as 0.125 or 1e-3)")
    return float(text)


def IntOption(*param_decls: str, metavar: str = "INTEGER", **kwargs: Any) -> Any:
    """`typer.Option` for an integer, read by `ascii_int`."""
    return typer.Option(*param_decls, parser=ascii_int, metavar=metavar, **kwargs)


def FloatOption(*param_decls: str, metavar: str = "FLOAT", **kwargs: Any) -> Any:
    """`typer.Option` for a decimal number, read by `ascii_float`."""
    return typer.Option(*param_decls, parser=ascii_float, metavar=metavar, **kwargs)


class AliasChoice:
    """An Enum's values (or a list of names) as choices, plus aliases, matched
    case-insensitively; called on the text given, returns the canonical value as a plain
    string. The choices show in `--help` as `[a|b|c]` and complete in the shell."""

    __name__ = "choice"  # Typer before 0.16 names a parser's type after its __name__

    def __init__(self, choices: type[Enum] | Iterable[str], aliases: dict[str, str] | None = None) -> None:
        is_enum = isinstance(choices, type) and issubclass(choices, Enum)
        self.choices = [member.value for member in choices] if is_enum else list(choices)
        self.aliases = {k.lower(): v for k, v in (aliases or {}).items()}

    @property
    def metavar(self) -> str:
        """`[a|b|c]`; a long list gets spaces around its bars, so help at 80 columns wraps it
        between choices instead of cutting one in two."""
        tight = "[" + "|".join(self.choices) + "]"
        return tight if len(tight) <= 24 else "[" + " | ".join(self.choices) + "]"

    def __call__(self, value: Any) -> str:
        if isinstance(value, Enum):
            value = value.value
        text = str(value)
        canonical = self.aliases.get(text.lower(), text)
        for choice in self.choices:
            if choice.lower() == canonical.lower():
                return choice
        extra = f" (or the aliases {', '.join(self.aliases)})" if self.aliases else ""
        raise typer.BadParameter(f"{text!r} is not one of {', '.join(self.choices)}{extra}")

    def complete(self, incomplete: str) -> list[str]:
        return [c for c in self.choices if c.startswith(incomplete.lower())]


def ChoiceOption(choice: AliasChoice | DeviceChoice, *param_decls: str, **kwargs: Any) -> Any:
    """`typer.Option` whose value is read by `choice` (an `AliasChoice` or `DEVICE`)."""
    return typer.Option(*param_decls, parser=choice, metavar=choice.metavar, autocompletion=choice.complete, **kwargs)


class DeviceChoice:
    """auto, cpu, cuda or cuda:N. Not an Enum: `cuda:N` is a family of values, so the
    option takes a string checked against this pattern (whether the device exists is
    checked later, when torch is imported)."""

    __name__ = "device"
    metavar = "[auto|cpu|cuda|cuda:N]"
    _PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]{1,4})?")

    def __call__(self, value: Any) -> str:
        text = str(value)
        if not self._PATTERN.fullmatch(text.lower()):
            raise typer.BadParameter(f"{text!r} is not a device; use auto, cpu, cuda or cuda:N")
        return text.lower()

    def complete(self, incomplete: str) -> list[str]:
        return [c for c in ("auto", "cpu", "cuda", "cuda:0") if c.startswith(incomplete)]


DEVICE = DeviceChoice()


def dtype_choice() -> AliasChoice:
    from ..paging.dtypes import ALIASES, CacheDtype

    return AliasChoice(CacheDtype, ALIASES)


def layout_choice(kernel_only: bool = False) -> AliasChoice:
    from ..paging.layouts import KERNEL_LAYOUTS, LAYOUTS, OLD_NAMES

    return AliasChoice(KERNEL_LAYOUTS, {}) if kernel_only else AliasChoice(LAYOUTS, OLD_NAMES)
