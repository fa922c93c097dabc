"""The simulate page as a picture, in a real browser: the pool block by block at the chosen step
(each block's state and holders as `simulate --at N --json` says), the chart over the whole run
(click to jump), the summary, and a 20,000-request run whose every kept step, the last included,
carries its block tables. The browser and its helpers: tests/browser.py.
"""

import json

from browser import Opened, browser, embedded, shots  # noqa: F401 (fixtures)
from conftest import cli

PRESSURE = ["--requests", "60", "--num-blocks", "120", "--shared-prefix", "64"]


def grid_states(p) -> dict[int, str]:
    return {int(b): s for b, s in p.evaluate("[...document.querySelectorAll('#pool-grid rect.blk')].map(r => [r.dataset.block, r.dataset.state])")}


def test_the_pool_block_by_block(browser, capsys, tmp_path, shots):
    page = tmp_path / "sim.html"
    code, out, err = cli(capsys, "simulate", *PRESSURE, "--html", str(page), "--json")
    assert code == 0, err
    doc, data = json.loads(out), embedded(page)
    h = data["history"]
    steps = h["steps"]
    o = Opened(browser, page)
    p = o.page
    evicted = next(i for i, s in enumerate(steps) if s["evicted"])
    for i in sorted({0, 1, evicted, len(steps) // 2, len(steps) - 1}):
        n = steps[i]["step"]
        code, text, err = cli(capsys, "simulate", *PRESSURE, "--at", str(n), "--json")
        assert code == 0, err
        at = json.loads(text)
        holders: dict[int, list[str]] = {}
        for rid, blocks in at["tables_at"][str(n)].items():
            for b in blocks:
                holders.setdefault(b, []).append(rid)
        p.locator("#step").fill(str(i))
        states = grid_states(p)
        assert len(states) == doc["config"]["num_blocks"] and states[0] == "null"
        for b, s in states.items():  # used and shared from --at N's tables, block by block
            if b:
                want = "shared" if len(holders.get(b, ())) > 1 else "used" if holders.get(b) else ("free", "cached")
                assert s == want or s in want, (n, b, s, holders.get(b))
        free, used, cached, shared = h["pool"][i]  # the history's own count, a pass over the pool's ref counts and hashes
        counts = {k: int(p.get_attribute("#pool-grid", f"data-{k}")) for k in ("free", "cached", "used", "shared")}
        assert counts == {"free": free, "cached": cached, "used": used - shared, "shared": shared}, n
        record = next(s for s in at["steps"] if s["step"] == n)
        assert counts["free"] + counts["cached"] == record["free_blocks"]  # --json's free_blocks holds the cached ones too
        assert "free_blocks" in p.inner_text("#pool-counts")
        b = max(holders, key=lambda x: (len(holders[x]), x)) if holders else 1
        p.click(f"#pool-grid rect.blk[data-block='{b}']")
        assert p.get_attribute("#block-info", "data-block") == str(b)
        for rid in holders.get(b, ()):
            assert rid in p.inner_text("#b-holders")
        assert p.inner_text("#b-ref").startswith(str(len(holders.get(b, ()))))
    # one Tab stop for the grid, the arrow keys inside it
    assert p.locator("#pool-grid rect.blk[tabindex='0']").count() == 1
    p.focus("#pool-grid rect.blk[tabindex='0']")
    before = int(p.evaluate("document.activeElement.dataset.block"))
    p.keyboard.press("ArrowRight")
    assert int(p.evaluate("document.activeElement.dataset.block")) == before + 1 == int(p.get_attribute("#block-info", "data-block"))
    # the summary and the waste table against Orca
    assert f"{doc['summary']['preemptions']} preemption(s)" in p.inner_text("#sim-summary")
    assert p.locator("#waste tbody tr").count() == len(doc["summary"]["waste"])
    # the chart: a click near its right end goes to the last kept step, one at its left edge to the first
    p.locator("#step").fill(str(len(steps) // 2))
    p.locator("#chart-svg").scroll_into_view_if_needed()
    box = p.locator("#chart-svg").bounding_box()
    p.mouse.click(box["x"] + box["width"] - 1, box["y"] + box["height"] / 2)
    assert p.input_value("#step") == str(len(steps) - 1) and p.inner_text("#s-step") == str(steps[-1]["step"])
    p.mouse.click(box["x"] + 1, box["y"] + box["height"] / 2)
    assert p.input_value("#step") == "0"
    assert p.locator("#chart-svg line.mark-preempt").count() == min(400, sum(1 for s in doc["steps"] if s["preempted"]))
    # block ids are never split across lines
    assert p.evaluate("getComputedStyle(document.querySelector('#table-list .blocks')).wordBreak") != "break-all"
    p.screenshot(path=str(shots / "simulate-grid-1280x800.png"), full_page=True)
    o.close()


def test_20000_requests_every_kept_step_has_its_tables(browser, capsys, tmp_path, shots):
    page = tmp_path / "sim.html"
    last = 63_864  # the seeded default workload's last step (checked below); one run gives the page and --at's tables
    code, text, err = cli(capsys, "simulate", "--requests", "20000", "--at", str(last), "--html", str(page), "--json")
    assert code == 0, err
    data = embedded(page)
    h = data["history"]
    assert page.stat().st_size < 900_000
    assert data["steps_total"] - 1 == last, "the default workload changed: set `last` to its last step"
    assert h["steps"][-1]["step"] == last and h["tables_until"] is None  # the last step reachable, tables at every kept step
    assert len(h["tables"]) == len(h["steps"]) and len(h["chart"]) > 500 and h["chart"][-1][0] == last
    want = {rid: ",".join(map(str, b)) for rid, b in json.loads(text)["tables_at"][str(last)].items() if b}
    o = Opened(browser, page)
    p = o.page
    p.focus("#step")
    p.keyboard.press("End")
    assert p.inner_text("#s-step") == str(last)
    items = p.locator("#table-list li")
    got = {items.nth(j).get_attribute("data-request"): items.nth(j).get_attribute("data-blocks") for j in range(items.count())}
    assert got == want
    assert "the chart covers the whole run" in p.inner_text("#summary-note")
    p.screenshot(path=str(shots / "simulate-20000-1280x800.png"))
    o.close()
