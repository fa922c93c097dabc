"""The CLI's option types: one integer parser and case-insensitive choices with aliases.

Click's INT takes whatever Python's `int()` takes: `٣` (Arabic-Indic three), `１６`
(full-width), `1_0` and ` 7` all become numbers. `ASCII_INT` accepts an optional `-`
and ASCII digits only, the same rule `--table` applies to its entries, so every integer
option reads the same way. `AliasChoice` lists an Enum's values in `--help` and in
shell completion, and also takes the aliases and any case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum

try:  # newer Typer carries its own copy of click
    from typer._click import core, exceptions, shell_completion, types
except ImportError:  # older Typer depends on click
    from click import core, exceptions, shell_completion, types

_ASCII_INT = re.compile(r"-?[0-9]+")
MAX_DIGITS = 40  # far past any size pagetrace accepts; keeps int() on a typo cheap


class AsciiInt(types.ParamType):
    name = "integer"

    def convert(self, value, param, ctx):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        text = str(value)
        if not _ASCII_INT.fullmatch(text):
            self.fail(f"{text!r} is not an integer (ASCII digits 0-9, optionally a leading -)", param, ctx)
        if len(text) > MAX_DIGITS:
            self.fail(f"{text[:12]}... has {len(text)} digits; no size is that large", param, ctx)
        return int(text)


ASCII_INT = AsciiInt()

_ASCII_FLOAT = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")


class AsciiFloat(types.ParamType):
    name = "float"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value)
        if len(text) > MAX_DIGITS or not _ASCII_FLOAT.fullmatch(text):
            self.fail(f"{text[:MAX_DIGITS]!r} is not a decimal number (ASCII digits, such as 0.125 or 1e-3)", param, ctx)
        return float(text)


ASCII_FLOAT = AsciiFloat()


class AliasChoice(types.ParamType):
    """An Enum's values (or a list of names) as choices, plus aliases, matched
    case-insensitively; returns the canonical value as a plain string. The choices
    show in `--help` as `[a|b|c]` and complete in the shell."""

    name = "choice"

    def __init__(self, choices: type[Enum] | Iterable[str], aliases: dict[str, str] | None = None) -> None:
        is_enum = isinstance(choices, type) and issubclass(choices, Enum)
        self.choices = [member.value for member in choices] if is_enum else list(choices)
        self.aliases = {k.lower(): v for k, v in (aliases or {}).items()}

    def get_metavar(self, param=None, ctx=None) -> str:
        """`[a|b|c]`; a long list gets spaces around its bars, so help at 80 columns wraps it
        between choices instead of cutting one in two."""
        tight = "[" + "|".join(self.choices) + "]"
        return tight if len(tight) <= 24 else "[" + " | ".join(self.choices) + "]"

    def convert(self, value, param, ctx):
        if isinstance(value, Enum):
            value = value.value
        text = str(value)
        canonical = self.aliases.get(text.lower(), text)
        for choice in self.choices:
            if choice.lower() == canonical.lower():
                return choice
        extra = f" (or the aliases {', '.join(self.aliases)})" if self.aliases else ""
        self.fail(f"{text!r} is not one of {', '.join(self.choices)}{extra}", param, ctx)

    def shell_complete(self, ctx, param, incomplete):
        return [shell_completion.CompletionItem(c) for c in self.choices if c.startswith(incomplete.lower())]


class DeviceType(types.ParamType):
    """auto, cpu, cuda or cuda:N. Not an Enum: `cuda:N` is a family of values, so the
    option takes a string checked against this pattern (whether the device exists is
    checked later, when torch is imported)."""

    name = "device"
    _PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]{1,4})?")

    def get_metavar(self, param=None, ctx=None) -> str:
        return "[auto|cpu|cuda|cuda:N]"

    def convert(self, value, param, ctx):
        text = str(value)
        if not self._PATTERN.fullmatch(text.lower()):
            self.fail(f"{text!r} is not a device; use auto, cpu, cuda or cuda:N", param, ctx)
        return text.lower()

    def shell_complete(self, ctx, param, incomplete):
        return [shell_completion.CompletionItem(c) for c in ("auto", "cpu", "cuda", "cuda:0") if c.startswith(incomplete)]


DEVICE = DeviceType()


def dtype_choice() -> AliasChoice:
    from ..paging.dtypes import ALIASES, CacheDtype

    return AliasChoice(CacheDtype, ALIASES)


def layout_choice(kernel_only: bool = False) -> AliasChoice:
    from ..paging.layouts import KERNEL_LAYOUTS, LAYOUTS, OLD_NAMES

    return AliasChoice(KERNEL_LAYOUTS, {}) if kernel_only else AliasChoice(LAYOUTS, OLD_NAMES)
