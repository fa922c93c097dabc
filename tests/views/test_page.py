"""The --html pages: their data is the command's --json document, and in a real browser (Chromium,
driven by Playwright) they show what that document says, with no network request.

The browser tests skip with a reason when Playwright (the `page` extra) or Chromium is missing;
CI installs both (.ci/run). Screenshots go to a temporary folder, printed (a CI artefact), or to
$PAGETRACE_SCREENSHOTS. The browser and its helpers: tests/browser.py.
"""

import json
import os
from pathlib import Path

import pytest
from browser import Opened, browser, embedded, not_blank, shots  # noqa: F401 (fixtures)
from conftest import assert_usage_error, cli


def test_run_page_holds_the_json_document(capsys, tmp_path):
    page = tmp_path / "run.html"
    code, out, err = cli(capsys, "run", "--json", "--html", str(page))
    assert code == 0, err
    assert embedded(page) == json.loads(out)  # one run, one document: the page's numbers are --json's


def test_page_is_self_contained(capsys, tmp_path):
    page = tmp_path / "run.html"
    assert cli(capsys, "run", "--html", str(page))[0] == 0
    text = page.read_text(encoding="utf-8")
    without_namespace = text.replace("http://www.w3.org/2000/svg", "")
    for needle in ("http://", "https://", "<link", " src=", "url(", "@import", "fetch(", "XMLHttpRequest"):
        assert needle not in without_namespace, needle
    assert "default-src 'none'" in text  # the page may not load anything, even if it tried
    assert len(text.encode()) < 100_000


def test_run_json_addresses_match_lookup(capsys):
    """Each row's key/value element and byte, per KV head, are `lookup`'s for that token and head."""
    code, out, err = cli(capsys, "run", "--tokens", "21,40", "--heads", "4", "--kv-heads", "2", "--layout", "vllm", "--dtype", "fp16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    n = doc["config"]["num_blocks"]
    for seq in doc["sequences"]:
        table = ",".join(map(str, seq["block_table"]))
        for row in (seq["rows"][0], seq["rows"][15], seq["rows"][16], seq["rows"][-1]):
            for head in range(2):
                code, text, err = cli(capsys, "lookup", "--token", str(row["token"]), "--table", table, "--kv-heads", "2", "--head", str(head),
                                      "--layout", "vllm", "--dtype", "fp16", "--num-blocks", str(n), "--json")
                assert code == 0, err
                want = json.loads(text)
                assert row["key_element"][head] == want["key"]["element_offset"] and row["key_byte"][head] == want["key"]["byte_offset"]
                assert row["value_element"][head] == want["value"]["element_offset"] and row["value_byte"][head] == want["value"]["byte_offset"]


@pytest.mark.parametrize("layout", ["vllm-cpu", "vllm-cpu-amx", "flashinfer-hnd", "nhd"])
def test_replay_json_addresses_match_lookup_from(capsys, tmp_path, monkeypatch, layout):
    """Every traced token's key/value element and byte, per KV head, are `lookup --from`'s: the
    bundle's own layout and real block ids (a column-major key, a tiled page, a combined HND
    buffer, two tensors)."""
    import bundles

    tables = None
    if layout == "vllm-cpu-amx":  # its tiles group 16 slots and 16 dims: the helper's bundle at 32 slots of 32 dims,
        monkeypatch.setattr(bundles, "BS", 32)  # one block per request (a partly filled block is never shared:
        monkeypatch.setattr(bundles, "D", 32)  # replay refuses a step with violations)
        tables = [[3], [4]]
    bundle = bundles.write_bundle(tmp_path / "b", layout, tables=tables)
    for request in ("a", "b"):
        code, out, err = cli(capsys, "replay", str(bundle), "--request", request, "--backend", "torch", "--json")
        assert code == 0, err
        rows = json.loads(out)["traced"]["tokens"]
        assert len(rows) == {"a": 11, "b": 10}[request]
        for row in rows:
            for head in range(2):
                code, text, err = cli(capsys, "lookup", "--from", str(bundle), "--request", request, "--token", str(row["token"]),
                                      "--head", str(head), "--json")
                assert code == 0, err
                want = json.loads(text)
                assert (row["physical_block"], row["offset"]) == (want["physical_block"], want["offset"])
                assert row["key_element"][head] == want["key"]["element_offset"] and row["key_byte"][head] == want["key"]["byte_offset"]
                assert row["value_element"][head] == want["value"]["element_offset"] and row["value_byte"][head] == want["value"]["byte_offset"]


@pytest.mark.parametrize("args, option", [
    (["--html", "x.svg"], "--html"),
    (["--html", "-", "--json"], "--html"),
    (["--html", "same", "--svg", "same"], "--html"),
    (["--html", "/no/such/folder/x.html"], "--html"),
])
def test_bad_html_paths_are_usage_errors(capsys, tmp_path, monkeypatch, args, option):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(cli(capsys, "run", *args), option)
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- in a real browser


@pytest.fixture(scope="module")
def worked_page(tmp_path_factory):
    """The worked example's page and its --json document (one run)."""
    from pagetrace.cli import run_cli

    folder = tmp_path_factory.mktemp("run")
    page = folder / "run.html"
    code = run_cli(["run", "--html", str(page), "--json"])
    assert code == 0
    return page, embedded(page)


def test_token_20_lights_block_2_slot_4_byte_1152(browser, worked_page, shots):
    page, doc = worked_page
    o = Opened(browser, page)
    p = o.page
    p.click("tr[data-token='20']")
    slot = p.locator("svg rect.slot.on")
    assert slot.count() == 1 and (slot.get_attribute("data-block"), slot.get_attribute("data-slot")) == ("2", "4")
    assert p.locator("svg rect.pool.on").get_attribute("data-block") == "2"
    assert p.locator("svg rect.lblock.on").get_attribute("data-logical") == "1"
    assert p.locator("#d-key").get_attribute("data-byte") == "1152"
    assert "byte 1,152" in p.inner_text("#d-key") and "element 288" in p.inner_text("#d-key")
    assert p.locator("svg path[data-path='token']").count() == 1
    assert "0.020756" in p.inner_text("#d-weight")
    assert "tokens 16 to 31" in p.inner_text("#owners")
    png = p.screenshot(path=str(shots / "run-1280x800.png"), full_page=True)
    assert not_blank(png)
    o.close()


def test_every_token_lights_its_own_slot(browser, worked_page):
    page, doc = worked_page
    o = Opened(browser, page)
    for row in doc["sequences"][0]["rows"]:
        o.page.click(f"tr[data-token='{row['token']}']")
        slot = o.page.locator("svg rect.slot.on")
        assert (int(slot.get_attribute("data-block")), int(slot.get_attribute("data-slot"))) == (row["physical_block"], row["offset"])
        assert int(o.page.locator("#d-key").get_attribute("data-byte")) == row["key_byte"][0]
        assert int(o.page.locator("svg rect.pool.on").get_attribute("data-block")) == row["slot"] // doc["config"]["block_size"]
    o.close()


def test_keyboard_moves_the_trace(browser, worked_page):
    page, _ = worked_page
    o = Opened(browser, page)
    p = o.page
    p.focus("tr[data-token='20']")
    p.keyboard.press("ArrowDown")
    assert p.locator("tr.on").get_attribute("data-token") == "21"
    assert p.evaluate("document.activeElement.dataset.token") == "21"
    p.keyboard.press("End")
    assert p.locator("svg rect.slot.on").get_attribute("data-slot") == "5"  # token 37: slot 5 of block 15
    p.focus("svg rect.pool[data-block='7']")
    p.keyboard.press("Enter")
    assert p.get_attribute("#owners", "data-block") == "7" and "logical block 0, tokens 0 to 15" in p.inner_text("#owners")
    o.close()


def test_shared_block_lists_every_owner_and_heads_switch(browser, capsys, tmp_path, shots):
    page = tmp_path / "shared.html"
    code, out, err = cli(capsys, "run", "--tokens", "38,20", "--table", "7,2,15", "--table", "7,3", "--heads", "4", "--kv-heads", "2",
                         "--html", str(page), "--json")
    assert code == 0, err
    doc = json.loads(out)
    o = Opened(browser, page, 390, 844)
    p = o.page
    p.click("svg rect.pool[data-block='7']")
    owners = p.locator("#owners-list li")
    assert owners.count() == 2 and "(shared)" in p.inner_text("#owners-title")
    assert sorted(owners.nth(i).get_attribute("data-seq") for i in range(2)) == ["0", "1"]
    p.select_option("#head-select", "3")  # query head 3 reads KV head 1
    p.click("tr[data-token='5']")
    row = doc["sequences"][0]["rows"][5]
    assert int(p.locator("#d-key").get_attribute("data-byte")) == row["key_byte"][1]
    assert f"{row['weights'][3]:.6f}" in p.inner_text("#d-weight")
    p.select_option("#seq-select", "1")
    p.click("tr[data-token='19']")
    assert p.locator("svg rect.pool.on").get_attribute("data-block") == "3"
    assert not_blank(p.screenshot(path=str(shots / "run-shared-390x844.png"), full_page=True))
    width = p.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width}px wide on a 390px screen"
    o.close()


PREFILL = ["--tokens", "38,20", "--query-len", "6,1", "--heads", "2", "--sliding-window", "34", "--backend", "torch"]


def test_prefill_page_picks_the_query(browser, capsys, tmp_path, shots):
    """Picking new token i of a prefill shows the weights and masked keys that `run --query i --json`
    gives for that query (a separate run, through the rows the tables always showed)."""
    page = tmp_path / "prefill.html"
    code, out, err = cli(capsys, "run", *PREFILL, "--html", str(page), "--json")
    assert code == 0, err
    doc = json.loads(out)
    choices = doc["sequences"][0]["queries"]
    assert [c["index"] for c in choices] == list(range(6)) and "queries" not in doc["sequences"][1]  # a decode has one query
    o = Opened(browser, page)
    p = o.page
    assert p.locator("#query-select").is_visible() and p.input_value("#query-select") == "5"
    for i in range(6):
        code, out, err = cli(capsys, "run", *PREFILL, "--query", str(i), "--json")
        assert code == 0, err
        rows = json.loads(out)["sequences"][0]["rows"]
        assert [c for c in choices if c["index"] == i][0]["weights"][1] == [r["weights"][1] for r in rows]
        if i == 0:
            p.select_option("#query-select", "0")
        else:  # the keyboard: a focused select moves to the next query with the arrow key
            p.focus("#query-select")
            p.keyboard.press("ArrowDown")
        assert p.input_value("#query-select") == str(i)
        for head in (0, 1):
            p.select_option("#head-select", str(head))
            got = p.evaluate("[...document.querySelectorAll('#tokens tbody tr')].map(tr => [+tr.dataset.token, +tr.dataset.weight, tr.dataset.mask])")
            assert got == [[r["token"], r["weights"][head], r["mask"]] for r in rows], f"query {i}, head {head}"
        masked = [r["token"] for r in rows if r["mask"] != "visible"]
        assert masked and p.locator("#tokens tbody tr.masked").count() == len(masked)
        if i == 2:
            assert not_blank(p.screenshot(path=str(shots / "run-prefill-1280x800.png"), full_page=True))
        t = masked[-1]
        p.click(f"tr[data-token='{t}']")
        assert "does not see it" in p.inner_text("#d-mask") and f"position {32 + i}" in p.inner_text("#d-weight")
    p.select_option("#seq-select", "1")
    assert not p.locator("#query-select").is_visible()
    o.close()


def test_replay_page(browser, tmp_path, shots):
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    bundle = tmp_path / "step.bundle"
    done = subprocess.run([sys.executable, str(root / "examples" / "flashinfer_bundle.py"), "--out", str(bundle)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(root)))
    assert done.returncode == 0, done.stderr
    page = tmp_path / "replay.html"
    done = subprocess.run([sys.executable, "-m", "pagetrace", "replay", str(bundle), "--html", str(page), "--json"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(root)), cwd=root)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert embedded(page) == doc
    o = Opened(browser, page)
    rows = doc["traced"]["tokens"]
    heads = len(rows[0]["key_element"])
    for head in range(heads):  # the head selector picks whose addresses show
        o.page.select_option("#head-select", str(head))
        for row in rows:  # every token: its slot, and its key and value element and byte in the bundle's layout
            o.page.click(f"tr[data-token='{row['token']}']")
            slot = o.page.locator("svg rect.slot.on")
            assert (int(slot.get_attribute("data-block")), int(slot.get_attribute("data-slot"))) == (row["physical_block"], row["offset"])
            key = o.page.locator("#d-key")
            assert (int(key.get_attribute("data-element")), int(key.get_attribute("data-byte"))) == (row["key_element"][head], row["key_byte"][head])
            value = o.page.locator("#d-value")
            assert (int(value.get_attribute("data-element")), int(value.get_attribute("data-byte"))) == (row["value_element"][head], row["value_byte"][head])
            assert f"byte {row['value_byte'][head]:,}" in value.inner_text()
    assert not_blank(o.page.screenshot(path=str(shots / "replay-1280x800.png"), full_page=True))
    o.close()


LOOKUPS = {  # a tiled layout (vLLM's CPU AMX pages: runs of 2 bf16 elements, 32 apart) and a split one (vLLM's x-packed key)
    "vllm-cpu-amx": ["--layout", "vllm-cpu-amx", "--dtype", "bf16", "--block-size", "32", "--head-dim", "32", "--kv-heads", "2", "--head", "1",
                     "--token", "52", "--table", "7,2,15"],
    "vllm": ["--layout", "vllm", "--dtype", "fp16", "--head-dim", "64", "--token", "20", "--table", "7,2,15"],
}


@pytest.mark.parametrize("name", LOOKUPS)
def test_lookup_page_shows_the_json_address(browser, capsys, tmp_path, shots, name):
    page = tmp_path / "lookup.html"
    code, out, err = cli(capsys, "lookup", *LOOKUPS[name], "--html", str(page), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert embedded(page) == doc
    for width, height in ((1280, 800), (390, 844)):
        o = Opened(browser, page, width, height)
        p = o.page
        slot = p.locator("svg rect.slot.on")
        assert (int(slot.get_attribute("data-block")), int(slot.get_attribute("data-slot"))) == (doc["physical_block"], doc["offset"])
        assert int(p.locator("svg rect.pool.on").get_attribute("data-block")) == doc["physical_block"]
        assert int(p.locator("svg rect.lblock.on").get_attribute("data-logical")) == doc["logical_block"]
        assert f"= {doc['slot']}" in p.inner_text("#d-slot")
        for which in ("key", "value"):
            a = doc[which]
            dd = p.locator(f"#d-{which}")
            assert (int(dd.get_attribute("data-element")), int(dd.get_attribute("data-byte"))) == (a["element_offset"], a["byte_offset"])
            assert f"element {a['element_offset']:,} = byte {a['byte_offset']:,}" in dd.inner_text()
            box = p.inner_text(f"#{which}-address")
            assert f"element {a['element_offset']:,}, byte {a['byte_offset']:,}" in box and f"= {a['element_offset']:,};" in box
            runs = p.locator(f"#{which}-runs tbody tr")
            assert runs.count() == min(64, len(a["chunks"])) and len(a["chunks"]) > 1  # neither vector is one run here
            for i in (0, runs.count() - 1):
                cells = runs.nth(i).locator("td").all_inner_texts()
                c = a["chunks"][i]
                assert cells[2:] == [f"{c['element_offset']:,}", f"{c['byte_offset']:,}"]
            assert p.locator(f"#{which}-address rect.run").count() == len(a["chunks"])
        assert not_blank(p.screenshot(path=str(shots / f"lookup-{name}-{width}x{height}.png"), full_page=True))
        assert p.evaluate("document.documentElement.scrollWidth") <= width
        o.close()


def test_lookup_from_a_bundle_writes_the_page(capsys, tmp_path):
    from bundles import write_bundle

    bundle = write_bundle(tmp_path / "b", "vllm-cpu")
    page = tmp_path / "lookup.html"
    code, out, err = cli(capsys, "lookup", "--from", str(bundle), "--request", "a", "--token", "9", "--html", str(page), "--json")
    assert code == 0, err
    assert embedded(page) == json.loads(out)
    assert_usage_error(cli(capsys, "lookup", "--html", str(tmp_path / "x.svg")), "--html")


SIMULATIONS = {
    "default": [],
    # a small pool: preemptions, prefix-cache hits of a shared system prompt, evictions
    "pressure": ["--requests", "60", "--num-blocks", "120", "--shared-prefix", "64"],
    "sglang": ["--requests", "40", "--num-blocks", "120", "--shared-prefix", "64", "--policy", "sglang"],
}


@pytest.mark.parametrize("name", SIMULATIONS)
def test_simulate_slider_shows_the_tables_of_at_n(browser, capsys, tmp_path, shots, name):
    args = SIMULATIONS[name]
    page = tmp_path / "sim.html"
    code, out, err = cli(capsys, "simulate", *args, "--html", str(page), "--json")
    assert code == 0, err
    doc, data = json.loads(out), embedded(page)
    assert {k: v for k, v in data.items() if k not in ("history", "steps_total", "written", "request_ids")} == \
        {k: v for k, v in doc.items() if k not in ("steps", "written")}
    from pagetrace.views.page.sim_data import MAX_STEPS

    everything = doc["steps"]
    steps = data["history"]["steps"]  # what the slider holds
    assert data["steps_total"] == len(everything)
    if len(everything) <= MAX_STEPS:
        assert steps == everything
    else:  # evenly spaced, each its own step's record
        by_step = {s["step"]: s for s in everything}
        assert MAX_STEPS // 2 <= len(steps) <= MAX_STEPS and all(by_step[s["step"]] == s for s in steps if "admitted_count" not in s)
    events = [i for i, s in enumerate(steps) if s["preempted"]][:2] + [i for i, s in enumerate(steps) if s["hit_tokens"]][:1]
    picks = sorted({0, 1, 63, 64, 65, len(steps) // 2, len(steps) - 1, *events} & set(range(len(steps))))
    o = Opened(browser, page)
    p = o.page
    answers = {}
    for i in picks + picks[::-1]:  # forward, then back: the page's checkpoints must not leak between visits
        n = steps[i]["step"]
        if n not in answers:
            code, out, err = cli(capsys, "simulate", *args, "--at", str(n), "--json")
            assert code == 0, err
            answers[n] = json.loads(out)
        at = answers[n]
        want = {rid: ",".join(map(str, b)) for rid, b in at["tables_at"][str(n)].items() if b}
        p.locator("#step").fill(str(i))
        assert p.inner_text("#s-step") == str(n)
        items = p.locator("#table-list li")
        got = {items.nth(j).get_attribute("data-request"): items.nth(j).get_attribute("data-blocks") for j in range(items.count())}
        assert got == want, f"step {n}"
        record = next(s for s in at["steps"] if s["step"] == n)
        free, used, cached, shared = (int(p.get_attribute("#pool", f"data-{k}")) for k in ("free", "used", "cached", "shared"))
        assert used == record["used_blocks"] and 0 <= shared <= used
        if "sglang" not in args:  # vLLM's free queue holds the cached blocks too
            assert free + cached == record["free_blocks"]
        assert p.inner_text("#s-running") == str(record["running"])
        if record["preempted"]:
            assert record["preempted"][0] in p.inner_text("#s-preempted")
    p.focus("#step")
    p.keyboard.press("Home")
    p.keyboard.press("ArrowRight")
    assert p.inner_text("#s-step") == str(steps[1]["step"])
    p.click("#play")
    for _ in range(100):  # play advances a step every 120 ms (the page's CSP refuses wait_for_function's eval)
        if int(p.input_value("#step")) > 3:
            break
        p.wait_for_timeout(50)
    p.click("#play")
    assert int(p.input_value("#step")) > 3
    assert not_blank(p.screenshot(path=str(shots / f"simulate-{name}-1280x800.png"), full_page=True))
    o.close()


def test_large_run_page_is_summarised(browser, capsys, tmp_path, shots):
    """A 6,000-token prefill's page stays under 1 MB: it keeps the first and last blocks, the traced
    token, the heaviest rows and evenly spaced ones, each row and each kept query's weight the
    --json document's own; the page says so, the keyboard walks the kept rows, and a token left out
    still shows its block and slot."""
    from pagetrace.views.page.run_data import HEAVIEST

    page = tmp_path / "large.html"
    code, out, err = cli(capsys, "run", "--tokens", "6000", "--query-len", "64", "--backend", "torch", "--html", str(page), "--json")
    assert code == 0, err
    doc, data = json.loads(out), embedded(page)
    assert page.stat().st_size < 1_000_000
    full, kept = doc["sequences"][0], data["sequences"][0]
    by_token = {r["token"]: r for r in full["rows"]}
    tokens = [r["token"] for r in kept["rows"]]
    assert kept["rows_kept"] == {"kept": len(tokens), "of": 6000} and 1000 < len(tokens) < 6000
    assert all(by_token[r["token"]] == r for r in kept["rows"]) and tokens == sorted(tokens)
    heaviest = sorted(full["rows"], key=lambda r: -r["weights"][0])[:HEAVIEST]
    assert {*range(16), *range(5984, 6000), 20, *(r["token"] for r in heaviest)} <= set(tokens)
    assert [q["index"] for q in kept["queries"]] == [q["index"] for q in full["queries"]]  # every query --json holds stays reachable
    for q in kept["queries"]:  # a kept query: its weights at the kept rows, in their order; a left-out one its mask only
        want = next(w for w in full["queries"] if w["index"] == q["index"])
        assert q["masked"] == want["masked"]
        assert q["weights"] is None or q["weights"][0] == [want["weights"][0][t] for t in tokens]
    kept["queries"] = [q for q in kept["queries"] if q["weights"] is not None]
    assert "6000" not in data["page_summary"] and "of 6,000 rows" in data["page_summary"]
    assert {k: v for k, v in data.items() if k not in ("sequences", "page_summary")} == {k: v for k, v in doc.items() if k != "sequences"}
    o = Opened(browser, page)
    p = o.page
    assert "summarised" in p.inner_text("#summary-note")
    q = kept["queries"][0]
    p.select_option("#query-select", str(q["index"]))
    got = p.evaluate("[...document.querySelectorAll('#tokens tbody tr')].map(tr => [+tr.dataset.token, +tr.dataset.weight])")
    want = [[t, w] for t, w in zip(tokens, q["weights"][0])]
    start = tokens.index(got[0][0])  # the table draws 1,024 kept rows at a time, a run of them
    assert len(got) == min(1024, len(tokens)) and got == want[start : start + len(got)]
    gap = next(i for i in range(len(tokens) - 1) if tokens[i + 1] > tokens[i] + 1)
    p.click(f"tr[data-token='{tokens[gap]}']")
    p.keyboard.press("ArrowDown")  # to the next kept row, over the ones left out
    assert p.locator("tr.on").get_attribute("data-token") == str(tokens[gap + 1])
    missing = tokens[gap] + 1
    p.mouse.move(0, 0)  # off the table: a hovered row previews its own token in the picture
    p.fill("#goto", str(missing))
    p.press("#goto", "Enter")
    assert "not on this page" in p.inner_text("#d-none")
    slot = p.locator("svg rect.slot.on")
    assert (int(slot.get_attribute("data-block")), int(slot.get_attribute("data-slot"))) == (full["block_table"][missing // 16], missing % 16)
    assert not_blank(p.screenshot(path=str(shots / "run-large-1280x800.png")))
    o.close()


def test_large_simulate_page_is_summarised(capsys, tmp_path):
    from pagetrace.views.page.sim_data import MAX_STEPS

    page = tmp_path / "sim.html"
    # a pool over EXACT_POOL_BLOCKS: used and shared blocks are counted from the tables
    code, out, err = cli(capsys, "simulate", "--requests", "3000", "--arrival-rate", "4", "--num-blocks", "70000", "--html", str(page), "--json")
    assert code == 0, err
    doc, data = json.loads(out), embedded(page)
    h = data["history"]
    assert len(doc["steps"]) > MAX_STEPS and len(h["steps"]) == MAX_STEPS and data["steps_total"] == len(doc["steps"])
    by_step = {s["step"]: s for s in doc["steps"]}
    for s in h["steps"][:: MAX_STEPS // 10]:
        full = by_step[s["step"]]
        assert {k: v for k, v in s.items() if not k.endswith("_count") and k not in ("admitted", "preempted", "finished")} == \
            {k: v for k, v in full.items() if k not in ("admitted", "preempted", "finished")}
    assert "evenly spaced" in h["note"] and "counted from the tables" in h["note"]
    for s, (free, used, cached, shared) in zip(h["steps"], h["pool"]):  # vLLM: used = blocks some table holds
        assert used == s["used_blocks"] and free == s["free_blocks"] and cached is None and 0 <= shared <= used
    assert page.stat().st_size < 1_000_000


def test_the_docs_page_sizes_are_made_not_typed(capsys, tmp_path):
    """docs/pages.md's table of page sizes is bench/bench_page.py --sizes's: its first row is the worked
    example's page as written now (a change to the page or its data asks for the table to be made again)."""
    root = Path(__file__).resolve().parents[2]
    text = (root / "docs" / "pages.md").read_text(encoding="utf-8")
    table = text.split("<!-- page-sizes: written by python bench/bench_page.py --sizes -->")[1].split("<!-- /page-sizes -->")[0]
    first = table.strip().splitlines()[2]
    assert first.startswith("| the worked example |") and "`pagetrace run --html page.html`" in first
    page = tmp_path / "page.html"
    assert cli(capsys, "run", "--html", str(page))[0] == 0
    said = int(first.split("|")[2].strip().replace(",", ""))
    # within a few bytes: the document's time_s (and the backend's float digits) vary from run to run
    assert abs(said - page.stat().st_size) <= 32, f"docs/pages.md says {said:,} bytes, the page is {page.stat().st_size:,}: python bench/bench_page.py --sizes writes them"
