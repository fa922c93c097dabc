"""A screenshot of the worked example's --html page, for the README (examples/page.png), and the
screenshots docs/pages.md shows (the simulate page, the lookup page's element grid), at 800 and 1,920 px.

    pagetrace run --html /tmp/run.html && python examples/page_screenshot.py /tmp/run.html
    python examples/page_screenshot.py --docs          # makes the pages itself; writes docs/images/*.png

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


DOCS = Path(__file__).resolve().parent.parent / "docs" / "images"
# (name, the command's arguments, what a reader does before the shot, the part shot: None for the whole page)
DOC_PAGES = [
    ("simulate", ["simulate", "--requests", "60", "--num-blocks", "120", "--shared-prefix", "64"],
     ["#step=fill:200", "#pool-grid rect.blk[data-block='9']=click"], None),
    ("lookup-grid", ["lookup", "--layout", "vllm-cpu-amx", "--dtype", "bf16", "--block-size", "32", "--head-dim", "32", "--kv-heads", "2",
                     "--head", "1", "--token", "52", "--table", "7,2,15"], [], "#key-cute"),
]


def _small(out: Path) -> None:
    try:  # a palette of 64 colours: a third of the bytes (Pillow, where it is installed)
        from PIL import Image

        Image.open(out).convert("RGB").quantize(colors=64, method=Image.Quantize.FASTOCTREE).save(out, optimize=True)
    except ImportError:
        pass


def docs(folder: Path = DOCS) -> None:
    """Each DOC_PAGES page made now (python -m pagetrace ... --html) and shot at 800 and 1,920 px wide."""
    import subprocess
    import tempfile

    folder.mkdir(parents=True, exist_ok=True)
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=os.environ.get("PAGETRACE_CHROMIUM", "/usr/bin/chromium"), args=ARGS)
        for name, args, actions, part in DOC_PAGES:
            html = Path(tmp) / f"{name}.html"
            subprocess.run([sys.executable, "-m", "pagetrace", *args, "--html", str(html)], check=True, cwd=root,
                           stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=str(root)))
            for width in (800, 1920):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(html.resolve().as_uri())
                page.wait_for_selector("body[data-ready='1']")
                for act in actions:
                    where, _, what = act.rpartition("=")
                    verb, _, value = what.partition(":")
                    page.locator(where).fill(value) if verb == "fill" else page.locator(where).click()
                out = folder / f"{name}-{width}.png"
                page.locator(part).screenshot(path=str(out)) if part else page.screenshot(path=str(out), full_page=True)
                page.close()
                _small(out)
                print(f"wrote {out}")
        browser.close()


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
    if sys.argv[1:] == ["--docs"]:
        docs()
        sys.exit(0)
    if len(sys.argv) not in (2, 3):
        sys.stderr.write("usage: python examples/page_screenshot.py PAGE.html [OUT.png]  (make the page with: pagetrace run --html PAGE.html)\n")
        sys.exit(2)
    main(sys.argv[1], Path(sys.argv[2]) if len(sys.argv) > 2 else OUT)
