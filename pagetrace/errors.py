"""The two kinds of failure pagetrace reports to its users.

`UsageError` is bad input (the CLI exits 2 and names the option and its value);
`RuntimeFailure` is a run that went wrong (exit 1 with a clear message).
Both are plain exceptions so the Python API raises them too.
"""

from __future__ import annotations


class UsageError(ValueError):
    """Input that cannot describe a paged KV cache: `option` names the flag or argument."""

    def __init__(self, option: str, value: object, reason: str) -> None:
        self.option = option
        self.value = value
        self.reason = reason
        super().__init__(f"invalid value for {option}: {value!r}: {reason}")


class RuntimeFailure(RuntimeError):
    """A run that could not finish or whose result failed its check."""


def plural(count: int, noun: str, many: str | None = None) -> str:
    """`1 block`, `2 blocks`: the one way messages count things."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"
