"""The run page with many sequences, a long prefill, and the small faults of issue 31 (a partly
filled last block, an empty or out-of-range Token box, a sequence switch), in a real browser.
The browser and its helpers: tests/browser.py.
"""

import contextlib
import io
import json

import pytest
from browser import Opened, browser, embedded, shots  # noqa: F401 (fixtures)
from conftest import cli

LENGTHS = [1000 + 37 * i for i in range(64)]


def run_page(folder, *args):
    from pagetrace.cli import run_cli

    page = folder / "run.html"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_cli(["run", *args, "--html", str(page), "--json"]) == 0
    return page, json.loads(buf.getvalue())


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    return run_page(tmp_path_factory.mktemp("many"), "--tokens", ",".join(map(str, LENGTHS)))


def test_64_sequences_page_keeps_what_it_says(browser, many, shots):
    page, doc = many
    data = embedded(page)
    assert page.stat().st_size < 900_000  # the page's aim (it was 1.87 MB, 1.2 MB of it coverage, never drawn)
    assert all("coverage" not in s for s in data["sequences"])
    for full, kept in zip(doc["sequences"], data["sequences"]):
        tokens = {r["token"] for r in kept["rows"]}
        weight = sorted(full["rows"], key=lambda r: -r["weights"][0])
        assert {r["token"] for r in weight[:3]} <= tokens, f"sequence {full['index']}: its heaviest rows are left out"
        assert kept["block_mass"] == [c["attention_mass"] for c in full["coverage"]]
    assert len(data["page_summary"]) < 400
    o = Opened(browser, page)
    p = o.page
    assert p.evaluate("document.documentElement.scrollWidth") <= 1280  # the title's 64 lengths made it 3,592 px
    assert "64 sequences of 1,000 to 3,331" in p.inner_text("h1")
    assert p.locator("#tokens").bounding_box()["y"] < 800  # the table above the fold
    p.select_option("#seq-select", "1")
    heavy = max(doc["sequences"][1]["rows"], key=lambda r: r["weights"][0])
    p.click(f"tr[data-token='{heavy['token']}']")
    assert f"{heavy['weights'][0]:.6f}" in p.inner_text("#d-weight")
    p.screenshot(path=str(shots / "run-64-sequences-1280x800.png"))
    o.close()


def test_sequence_switch_clears_token_and_owners(browser, many):
    page, doc = many
    o = Opened(browser, page)
    p = o.page
    p.click("tr[data-token='5']")
    block = doc["sequences"][0]["block_table"][0]
    p.click(f"#picture rect.pool[data-block='{block}']")
    assert p.get_attribute("#owners", "data-block") == str(block)
    p.select_option("#seq-select", "3")
    assert p.input_value("#goto") == "" and p.inner_text("#owners").strip() == ""
    assert "No token traced" in p.inner_text("#d-none")
    o.close()


def test_long_prefill_every_query_reachable(browser, capsys, tmp_path):
    page, doc = run_page(tmp_path, "--tokens", "20000", "--query-len", "64")
    o = Opened(browser, page)
    p = o.page
    options = p.locator("#query-select option")
    assert options.count() == 64  # --json holds one query's numbers; all 64 are offered
    rows = p.locator("#mask-map g.mask-row")
    assert rows.count() == 64 and p.locator("#mask-map text.gap").count() == 0
    # each row's mask, per key block, as `run --query i --json` says it (its kernel trace), at a few queries
    for i in (0, 62):
        code, out, err = cli(capsys, "run", "--tokens", "20000", "--query-len", "64", "--query", str(i), "--json")
        assert code == 0, err
        seq = json.loads(out)["sequences"][0]
        want = "".join("█" if c["causal_masked"] == 0 else ("·" if c["causal_masked"] == c["last_token"] - c["first_token"] + 1 else "░") for c in seq["coverage"])
        assert rows.nth(i).get_attribute("data-blocks") == want, i
        rows.nth(i).click()  # a click on a mask row picks its query
        assert p.input_value("#query-select") == str(i)
        assert f"position {19936 + i}" in p.inner_text("#table-note")
        if i != 63:
            assert "not on this page" in p.inner_text("#table-note")
    # the mask map's own rows (16 of them in --json) agree with the drawn ones
    for r in doc["mask_map"]:
        assert p.locator(f"#mask-map g.mask-row[data-position='{r['position']}']").get_attribute("data-blocks") == r["blocks"]
    box = p.locator("#mask-map").bounding_box()
    assert box["width"] <= 1280 / 2 + 40  # the causal edge on screen: a row fits its panel
    o.close()


def test_small_faults(browser, capsys, tmp_path):
    """`--seq-len 38`'s lookup page draws slots 38 to 47 empty; an emptied Token box traces nothing;
    a token out of range says so; a weight at 100,000 tokens is not 0.0000."""
    page = tmp_path / "lookup.html"
    code, out, err = cli(capsys, "lookup", "--token", "20", "--seq-len", "38", "--table", "7,2,15", "--html", str(page), "--json")
    assert code == 0, err
    o = Opened(browser, page)
    p = o.page
    p.locator("svg rect.slot").first.wait_for()
    # token 20 is in block 1 (tokens 16..31): all its slots hold tokens; the last block's are drawn on demand below
    assert p.locator("svg rect.slot.empty").count() == 0
    o.close()
    code, out, err = cli(capsys, "lookup", "--token", "36", "--seq-len", "38", "--table", "7,2,15", "--html", str(page), "--json")
    assert code == 0, err
    o = Opened(browser, page)
    empty = sorted(int(o.page.locator("svg rect.slot.empty").nth(i).get_attribute("data-slot")) for i in range(o.page.locator("svg rect.slot.empty").count()))
    assert empty == list(range(6, 16))  # tokens 38..47 do not exist: slots 6..15 of block 15
    o.close()
    run = tmp_path / "run.html"
    assert cli(capsys, "run", "--html", str(run))[0] == 0
    o = Opened(browser, run)
    p = o.page
    p.click("tr[data-token='20']")
    p.fill("#goto", "")
    p.press("#goto", "Enter")
    assert "No token traced" in p.inner_text("#d-none") and p.locator("svg rect.slot.on").count() == 0
    for bad in ("99", "-3"):
        p.fill("#goto", bad)
        p.press("#goto", "Enter")
        assert f"Token {bad} is out of range" in p.inner_text("#d-none") and "0 to 37" in p.inner_text("#d-none")
    o.close()


@pytest.mark.parametrize("name, args", [
    ("vllm-cpu-amx", ["--layout", "vllm-cpu-amx", "--dtype", "bf16", "--block-size", "32", "--head-dim", "32", "--kv-heads", "2", "--head", "1", "--token", "52"]),
    ("vllm", ["--layout", "vllm", "--dtype", "fp16", "--head-dim", "64", "--token", "20"]),
])
def test_lookup_element_grid(browser, capsys, tmp_path, shots, name, args):
    """The tiled and split layouts' grid of the block's memory: the traced token's row holds, at each
    run's first dim, that run's element as --json's chunks say; every cell a different element."""
    page = tmp_path / "lookup.html"
    code, out, err = cli(capsys, "lookup", *args, "--table", "7,2,15", "--html", str(page), "--json")
    assert code == 0, err
    doc = json.loads(out)
    for width in (1280, 800):
        o = Opened(browser, page, width, 900)
        p = o.page
        for which in ("key", "value"):
            cells = p.evaluate(f"[...document.querySelectorAll('#{which}-cute td')].map(td => [+td.dataset.slot, +td.dataset.dim, +td.dataset.element])")
            assert len(cells) == doc["block_size"] * doc["head_dim"] and len({e for _, _, e in cells}) == len(cells)  # one element each
            at = {(s, d): e for s, d, e in cells}
            for c in doc[which]["chunks"]:
                for k in range(c["elements"]):
                    assert at[(doc["offset"], c["first_dim"] + k)] == c["element_offset"] + k
        assert "What am I looking at" in p.inner_text("#explain")
        assert f"slot = {doc['physical_block']} × {doc['block_size']} + {doc['offset']} = {doc['slot']}" in p.inner_text("#explain")
        p.screenshot(path=str(shots / f"lookup-grid-{name}-{width}.png"), full_page=True)
        o.close()


def test_dark_mode_keeps_the_text_readable(browser, capsys, tmp_path):
    page = tmp_path / "run.html"
    assert cli(capsys, "run", "--html", str(page))[0] == 0
    o = Opened(browser, page, dark=True)
    p = o.page
    bg = p.evaluate("getComputedStyle(document.body).backgroundColor")
    ink = p.evaluate("getComputedStyle(document.body).color")
    assert bg == "rgb(21, 21, 21)" and ink == "rgb(230, 230, 230)"
    o.close()
