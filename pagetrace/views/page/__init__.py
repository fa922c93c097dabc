"""`--html FILE`: one self-contained page (script, style and data inline) for run, replay, simulate and lookup.

The page's data is the command's own `--json` document (the same builder), so every number the
page shows is one `--json` prints; the page's script (SCRIPTS: common.js, tokens.js, ...) only lays it out and draws it.
Nothing is fetched: no CDN, no font, no image; the file opens from disk with no network.

    check_page_path(html, others, json)   before any work (UsageError names --html)
    page_bytes(kind, doc, title)          the page, as bytes
    write_page(path, kind, doc, title)    whole or not at all (pagetrace.files)
"""

from __future__ import annotations

KINDS = ("run", "replay", "simulate", "lookup")
# the page's script, one file per concern, joined in this order inside one function (its own scope)
SCRIPTS = ("common.js", "tokens.js", "simulate.js", "lookup.js", "explain.js", "main.js")


def _asset(name: str) -> str:
    from importlib import resources  # here, not at the top: `lookup` imports this module for check_page_path alone

    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def check_page_path(html: str | None, others: dict[str, str] | None = None, json_output: bool = False) -> None:
    """Refuse an --html path that cannot be written (or that another option writes), before any work."""
    if html is None:
        return
    from ...files import check_outputs

    check_outputs({**(others or {}), "--html": html}, stdout_taken_by="--json" if json_output else None)


def _script_json(doc) -> str:
    """JSON safe inside <script>: no `</script>`, no `<!--`, and JavaScript's line separators escaped."""
    import json

    try:
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or infinity: null, as --json prints them
        from ...files import json_safe

        text = json.dumps(json_safe(doc), separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page_bytes(kind: str, doc: dict, title: str) -> bytes:
    if kind not in KINDS:
        raise ValueError(f"unknown page kind {kind!r}")
    from html import escape

    page = _asset("page.html")
    page = page.replace("{{title}}", escape(title))
    page = page.replace("{{style}}", _asset("page.css"))
    page = page.replace("{{kind}}", kind)
    script = _script()
    # the data and the script are put in last, so nothing inside them is ever taken for a placeholder
    head, _, tail = page.partition("{{data}}")
    head2, _, tail2 = tail.partition("{{script}}")
    return (head + _script_json(doc) + head2 + script + tail2).encode("utf-8")


def _script() -> str:
    """The page's script: SCRIPTS in order, in one strict-mode function, so nothing leaks to the window."""
    return '(function () {\n"use strict";\n' + "\n".join(_asset(name) for name in SCRIPTS) + "})();\n"


def fixed_bytes() -> int:
    """What a page costs besides its data: the template, the style and the script."""
    return len(_asset("page.html").encode("utf-8")) + len(_asset("page.css").encode("utf-8")) + len(_script().encode("utf-8"))


def write_page(path: str, kind: str, doc: dict, title: str) -> str:
    from ...files import write_output

    return write_output(path, page_bytes(kind, doc, title))
