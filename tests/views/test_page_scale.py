"""The --html pages at the scale where they broke (issue 31), in a real browser: a pool over 4,096
blocks (100,000 and 1,000,000 tokens), the picture and the panel naming the same token after keys,
jumps and scrolls, and a header that says which check ran.

Each test asserts what a user sees (the outlined cell, the panel's words) against the command's own
--json document. The browser and its helpers: tests/browser.py.
"""

import json

import pytest
from browser import Opened, browser, embedded, not_blank, shots  # noqa: F401 (fixtures)
from conftest import cli

MAX_POOL = 4096  # the pool cells a page draws at once (common.js)


def traced_in_picture(p) -> dict:
    """What the picture outlines: the pool cell, the slot's block and slot, and whether the path is drawn."""
    return p.evaluate("""() => {
      const pool = document.querySelector('#picture rect.pool.on'), slot = document.querySelector('#picture rect.slot.on');
      return { pool: pool ? +pool.dataset.block : null, slotBlock: slot ? +slot.dataset.block : null, slot: slot ? +slot.dataset.slot : null,
               path: document.querySelectorAll('#picture path[data-path=token]').length,
               panel: (document.querySelector('#d-token') || {}).textContent || null,
               selected: (document.querySelector('tr.on') || {dataset: {}}).dataset.token ?? null };
    }""")


def go_to(p, token: int):
    p.fill("#goto", str(token))
    p.press("#goto", "Enter")


@pytest.fixture(scope="module")
def page_100k(tmp_path_factory):
    """`run --tokens 100000`: 6,250 logical blocks in a pool of 7,824, half of them past block 4,096; backend auto picks torch."""
    from pagetrace.cli import run_cli

    page = tmp_path_factory.mktemp("scale") / "run.html"
    out = page.with_suffix(".json")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_cli(["run", "--tokens", "100000", "--html", str(page), "--json"]) == 0
    out.write_text(buf.getvalue())
    return page, json.loads(buf.getvalue())


def test_tokens_past_block_4096_are_outlined(browser, page_100k, shots):
    page, doc = page_100k
    seq = doc["sequences"][0]
    table, bs, n = seq["block_table"], doc["config"]["block_size"], doc["config"]["num_blocks"]
    assert n > MAX_POOL and sum(b >= MAX_POOL for b in table) > 1000  # the scale where it broke
    # tokens in the pool's highest blocks, one in block 4,096 itself (a boundary) and the sequence's last
    far = sorted(range(len(table)), key=lambda l: -table[l])[:3]
    picks = [far[0] * bs, far[1] * bs + 7, far[2] * bs + bs - 1, table.index(MAX_POOL) * bs + 3, 99_999]
    o = Opened(browser, page)
    p = o.page
    p.mouse.move(0, 0)
    for t in picks:
        go_to(p, t)
        want = table[t // bs]
        got = traced_in_picture(p)
        assert got["pool"] == want and (got["slotBlock"], got["slot"]) == (want, t % bs) and got["path"] == 1, (t, got)
        title = p.locator("#picture text#pool-title").text_content()
        lo, hi = (int(x.replace(",", "")) for x in title.split("(blocks ")[1].split(" drawn")[0].split(" to "))
        assert lo <= want <= hi and MAX_POOL - 64 < hi - lo + 1 <= MAX_POOL, title
        assert f"block {want}, slot by slot" in p.locator("#picture svg").text_content()
    # the overview of the whole pool: a click on its last cell draws the pool's last blocks
    cell = p.locator("#picture g.overview rect[data-first]").last
    cell.click()
    title = p.locator("#picture text#pool-title").text_content()
    assert f"to {n - 1:,} drawn" in title, title
    assert p.locator("#picture rect.pool[data-block='%d']" % (n - 1)).count() == 1
    assert not_blank(p.screenshot(path=str(shots / "run-100k-1280x800.png")))
    o.close()


def test_the_pool_is_one_tab_stop(browser, page_100k):
    page, doc = page_100k
    o = Opened(browser, page)
    p = o.page
    go_to(p, 20)  # token 20: block 2 (the table begins 7, 2, 15)
    assert p.locator("#picture rect.pool[tabindex='0']").count() == 1
    assert p.locator("#picture rect.pool[tabindex='0']").get_attribute("data-block") == str(doc["sequences"][0]["block_table"][1])
    p.focus("#picture rect.pool[tabindex='0']")
    p.keyboard.press("ArrowRight")
    assert p.evaluate("document.activeElement.dataset.block") == "3" and p.get_attribute("#owners", "data-block") == "3"
    p.keyboard.press("Tab")  # one press leaves the pool (4,096 cells were 4,096 Tab stops)
    assert p.evaluate("document.activeElement.closest('#picture') === null")
    o.close()


def test_picture_and_panel_name_the_same_token(browser, page_100k):
    """A resting pointer over the table never overrides the selection: after a click, Home, End,
    Page Down, arrows and a typed jump, with the pointer left on another row, the outlined slot is
    the panel's token."""
    page, doc = page_100k
    seq = doc["sequences"][0]
    table, bs = seq["block_table"], doc["config"]["block_size"]
    data = embedded(page)["sequences"][0]["rows"]
    kept = [r["token"] for r in data]
    o = Opened(browser, page)
    p = o.page
    p.click("tr[data-token='5']")
    p.hover("tr[data-token='7']")  # and leave the pointer there
    seen = []

    def agree(expect):
        got = traced_in_picture(p)
        assert got["panel"] and got["panel"].startswith(f"{expect} of "), got
        assert got["selected"] == str(expect), got
        assert (got["slotBlock"], got["slot"]) == (table[expect // bs], expect % bs) and got["pool"] == table[expect // bs], (expect, got)
        seen.append(expect)

    agree(5)
    p.focus("tr[data-token='5']")
    for key, expect in (("Home", kept[0]), ("End", kept[-1]), ("Home", kept[0]), ("PageDown", kept[16]), ("ArrowDown", kept[17]), ("ArrowUp", kept[16])):
        p.keyboard.press(key)
        p.wait_for_timeout(30)  # a frame: the browser's hover update after the scroll
        agree(expect)
    t = kept[len(kept) // 2]
    go_to(p, t)
    p.hover(f"tr[data-token='{kept[kept.index(t) + 2]}']")
    p.mouse.wheel(0, 400)
    p.wait_for_timeout(50)
    agree(t)
    assert len(seen) == 8
    o.close()


def test_header_says_which_check_ran(browser, page_100k, capsys, tmp_path):
    page, doc = page_100k
    assert doc["config"]["backend"] == "torch" and doc["checks"]["slots_checked"] is False  # auto picked torch: no kernel ran
    o = Opened(browser, page)
    header = o.page.inner_text("#config")
    assert "no kernel ran" in header and "slots not checked" in header and "backend torch" in header
    assert "paged = contiguous" not in header and "the kernel read" not in header
    o.close()
    small = tmp_path / "kernel.html"
    code, out, err = cli(capsys, "run", "--backend", "interpret", "--html", str(small), "--json")
    assert code == 0, err
    assert json.loads(out)["checks"]["slots_checked"] is True
    o = Opened(browser, small)
    header = o.page.inner_text("#config")
    assert "kernel vs contiguous" in header and "the kernel read the slots the tables give" in header and "no kernel ran" not in header
    o.close()


def test_a_million_tokens_every_block_traceable(browser, tmp_path):
    """1,000,000 tokens: 62,500 logical blocks in a pool of 78,128, 95% of them past block 4,096
    (no --json here: the page's own data holds the whole block table)."""
    from pagetrace.cli import run_cli

    page = tmp_path / "run.html"
    assert run_cli(["run", "--tokens", "1000000", "--html", str(page)]) == 0
    doc = embedded(page)
    table, bs = doc["sequences"][0]["block_table"], doc["config"]["block_size"]
    assert len(table) == 62_500 and page.stat().st_size < 1_000_000
    o = Opened(browser, page)
    p = o.page
    top = max(range(len(table)), key=lambda l: table[l])
    for t in (top * bs + 5, 999_999, 500_000):
        go_to(p, t)
        got = traced_in_picture(p)
        assert got["pool"] == table[t // bs] and (got["slotBlock"], got["slot"]) == (table[t // bs], t % bs) and got["path"] == 1, (t, got)
    o.close()
