"""The browser the --html page tests drive: Chromium through Playwright for Python (the `page` extra),
the system's own binary (never a downloaded one). Shared by tests/views/test_page*.py.

Without Playwright or Chromium a test skips with a reason, unless PAGETRACE_REQUIRE_PAGE_TESTS=1
(.ci/run) asks for them, where it fails. Screenshots go to $PAGETRACE_SCREENSHOTS or a temporary folder.
"""

import json
import os
import re
import tempfile
import zlib
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("PAGETRACE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]


def embedded(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    found = re.search(r'<script type="application/json" id="pagetrace-data">(.*?)</script>', text, re.S)
    assert found, "the page holds no data"
    return json.loads(found.group(1))


def skip_or_fail(reason: str):
    """Skip, unless the run promised these tests (.ci/run sets PAGETRACE_REQUIRE_PAGE_TESTS=1)."""
    if os.environ.get("PAGETRACE_REQUIRE_PAGE_TESTS") == "1":
        pytest.fail(reason + ", and PAGETRACE_REQUIRE_PAGE_TESTS=1 asks for these tests to run")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright import sync_api
    except ImportError:
        skip_or_fail("Playwright for Python is not installed (pip install -e '.[page]')")
    if not os.access(CHROMIUM, os.X_OK):
        skip_or_fail(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PAGETRACE_CHROMIUM)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def shots():
    folder = os.environ.get("PAGETRACE_SCREENSHOTS") or tempfile.mkdtemp(prefix="pagetrace-pages-")
    os.makedirs(folder, exist_ok=True)
    print(f"\nscreenshots of the pages: {folder}")
    return Path(folder)


class Opened:
    def __init__(self, browser, path: Path, width=1280, height=800, dark=False):
        self.context = browser.new_context(viewport={"width": width, "height": height}, color_scheme="dark" if dark else "light")
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.url = path.resolve().as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready='1']", timeout=10_000)

    def close(self):
        assert self.errors == [], self.errors
        assert self.requests == [self.url], self.requests  # the file itself, nothing else
        self.context.close()


def not_blank(png: bytes) -> bool:
    """A blank page compresses to almost nothing and holds two or three byte values."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    data, i = b"", 8
    while i < len(png):
        n = int.from_bytes(png[i : i + 4], "big")
        if png[i + 4 : i + 8] == b"IDAT":
            data += png[i + 8 : i + 8 + n]
        i += 12 + n
    return len(set(zlib.decompress(data))) > 32
