"""A screenshot of the worked example's --html page, for the README (examples/page.png).

    pagetrace run --html /tmp/run.html && python examples/page_screenshot.py /tmp/run.html

Drives the system's Chromium (/usr/bin/chromium, or $PAGETRACE_CHROMIUM) with Playwright for
Python (the `page` extra); nothing is downloaded. Token 20 is clicked, as a reader would.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

OUT = Path(__file__).with_name("page.png")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run"]


def main(page_path: str, out: Path = OUT) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("PAGETRACE_CHROMIUM", "/usr/bin/chromium"), args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(Path(page_path).resolve().as_uri())
        page.wait_for_selector("body[data-ready='1']")
        page.click("tr[data-token='20']")
        page.screenshot(path=str(out), clip={"x": 0, "y": 0, "width": 1280, "height": 800})
        browser.close()
    try:  # a palette of 64 colours: a third of the bytes, for the README (Pillow, where it is installed)
        from PIL import Image

        Image.open(out).convert("RGB").quantize(colors=64, method=Image.Quantize.FASTOCTREE).save(out, optimize=True)
    except ImportError:
        pass
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.stderr.write("usage: python examples/page_screenshot.py PAGE.html [OUT.png]  (make the page with: pagetrace run --html PAGE.html)\n")
        sys.exit(2)
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else OUT)
