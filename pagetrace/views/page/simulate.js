// simulate.js: the simulate page.
function simulatePage(doc) {
  const c = doc.config, h = doc.history, steps = h.steps;
  document.getElementById("config").textContent =
    `${c.policy} cache · ${int(c.num_blocks)} blocks of ${c.block_size} · ${int(doc.summary.requests)} requests · ${int(doc.summary.steps)} steps · ` +
    `prefix caching ${c.prefix_caching ? "on" : "off"} · chunked prefill ${c.chunked_prefill ? "on" : "off"} · hit rate ${fmt(doc.summary.hit_rate, 3)}`;
  const names = doc.requests ? doc.requests.map((r) => r.id) : doc.request_ids;
  const slider = el("input", { type: "range", id: "step", min: 0, max: steps.length - 1, value: 0, step: 1, "aria-label": "step" });
  const play = el("button", { id: "play", type: "button", text: "▶ play" });
  const prev = el("button", { type: "button", text: "◀ step", "aria-label": "previous step" });
  const next = el("button", { type: "button", text: "step ▶", "aria-label": "next step" });
  const label = el("output", { id: "step-label", for: "step" });
  const stats = el("div", { class: "panel", id: "stats", "aria-live": "polite" });
  const pool = el("div", { class: "panel", id: "pool" });
  const tables = el("div", { class: "panel scroll", id: "tables" });
  app.replaceChildren(
    el("p", { text: "Drag the slider (or focus it and use the arrow keys), or press play: the pool, every running request's block table and the step's events follow the run." }),
    el("div", { class: "controls" }, el("label", { for: "step", text: "Step" }), slider, prev, next, play, label),
    el("p", { id: "summary-note", text: h.note || "" }),
    legend([["var(--free)", "light grey: free"], ["var(--cached)", "bluish green: free but still cached (a prefix hit can reuse it)"],
            ["var(--used)", "blue: used by one request"], ["var(--shared)", "reddish purple: shared by several requests"]]),
    el("div", { class: "grid" },
      el("section", { "aria-label": "the step" }, el("h2", { text: "This step" }), stats, el("h2", { text: "Pool by state" }), pool),
      el("section", { "aria-label": "block tables" }, el("h2", { text: "Running requests' block tables" }), tables)));

  // block tables by replaying the per-step changes from step 0 (checkpoints every 64 kept steps)
  const checkpoints = new Map(); // kept step -> the tables before its changes (never handed out: copied both ways)
  const copyTables = (m) => new Map([...m].map(([r, b]) => [r, b.slice()]));
  function tablesAt(i) {
    if (h.tables_until !== null && i > h.tables_until) return null;
    let start = 0, cur = new Map();
    for (let k = i - (i % 64); k > 0; k -= 64) if (checkpoints.has(k)) { start = k; cur = copyTables(checkpoints.get(k)); break; }
    for (let k = start; k <= i; k++) {
      if (k % 64 === 0 && k > 0 && !checkpoints.has(k)) checkpoints.set(k, copyTables(cur));
      const d = h.tables[k];
      if (!d) continue;
      for (const r of d.drop || []) cur.delete(r);
      for (const [r, bl] of d.set || []) cur.set(r, bl.slice());
      for (const [r, bl] of d.add || []) cur.get(r).push(...bl);
    }
    return cur;
  }
  function show(i) {
    const s = steps[i], p = h.pool[i];
    slider.value = i;
    label.textContent = `step ${s.step} (${i + 1} of ${steps.length} kept)`;
    slider.setAttribute("aria-valuetext", `step ${s.step}`);
    const list = (xs, n) => (xs.length ? xs.slice(0, 8).map((x) => x).join(", ") + (n > xs.length || xs.length > 8 ? ` … (${int(n)})` : "") : "none");
    stats.replaceChildren(
      el("span", { class: "stat" }, "step ", el("b", { id: "s-step", text: s.step })),
      el("span", { class: "stat" }, "running ", el("b", { id: "s-running", text: s.running })),
      el("span", { class: "stat" }, "waiting ", el("b", { text: s.waiting })),
      el("span", { class: "stat" }, "tokens ", el("b", { text: int(s.tokens) })),
      el("span", { class: "stat" }, "hit rate so far ", el("b", { id: "s-hit", text: fmt(h.hit_rate[i], 3) })),
      el("dl", {},
        el("dt", { text: "admitted" }), el("dd", { id: "s-admitted", text: list(s.admitted, s.admitted_count ?? s.admitted.length) }),
        el("dt", { text: "prefix-cache hits" }), el("dd", { text: `${int(s.hit_tokens)} tokens` }),
        el("dt", { text: "evicted (cached blocks reused)" }), el("dd", { text: int(s.evicted) }),
        el("dt", { text: "preempted" }), el("dd", { id: "s-preempted", text: list(s.preempted, s.preempted_count ?? s.preempted.length) }),
        el("dt", { text: "finished" }), el("dd", { text: list(s.finished, s.finished_count ?? s.finished.length) })));
    drawPool(p);
    const cur = tablesAt(i);
    if (cur === null) { tables.replaceChildren(el("p", { text: `Block tables are kept for the first ${h.tables_until + 1} kept steps only (the page would be too large); the counts go on.` })); return; }
    const items = [...cur.entries()].filter(([, b]) => b.length).map(([r, b]) =>
      el("li", { "data-request": names[r], "data-blocks": b.join(",") }, el("b", { text: names[r] }), ` (${b.length} blocks): `, el("span", { class: "blocks", text: b.join(" ") })));
    tables.replaceChildren(el("p", { id: "t-count", text: `${items.length} request(s) hold blocks after step ${s.step}` }), el("ul", { class: "reqlist", id: "table-list" }, ...items));
  }
  function drawPool(p) {
    const [free, used, counted, shared] = p;
    const cached = counted === null ? 0 : counted; // null: a pool too large to count them (free includes them)
    const total = free + cached + used, W = 640;
    const svg = sv("svg", { viewBox: `0 0 ${W} 28`, role: "img", "aria-label": `pool: ${free} free, ${cached} cached, ${used} used (${shared} of them shared)` });
    let x = 0;
    for (const [n, colour, words] of [[free, "var(--free)", "free"], [cached, "var(--cached)", "cached"], [used - shared, "var(--used)", "used"], [shared, "var(--shared)", "shared"]]) {
      const w = total ? (W * n) / total : 0;
      svg.append(sv("rect", { x, y: 0, width: w, height: 28, fill: colour, stroke: "#333", "stroke-width": 0.5 }, undefined));
      x += w;
    }
    pool.replaceChildren(svg, el("p", { id: "pool-counts", text: `free ${int(free)} · cached ${counted === null ? "not counted (free includes them)" : int(cached)} · used by one request ${int(used - shared)} · shared ${int(shared)}  (of ${int(total)} usable blocks)` }));
    pool.dataset.free = free; pool.dataset.used = used; pool.dataset.cached = cached; pool.dataset.shared = shared;
  }
  let timer = null;
  function stop() { if (timer) { clearInterval(timer); timer = null; play.textContent = "▶ play"; } }
  play.addEventListener("click", () => {
    if (timer) return stop();
    play.textContent = "❚❚ pause";
    timer = setInterval(() => { const i = +slider.value + 1; if (i >= steps.length) return stop(); show(i); }, 120);
  });
  slider.addEventListener("input", () => { stop(); show(+slider.value); });
  prev.addEventListener("click", () => { stop(); show(Math.max(0, +slider.value - 1)); });
  next.addEventListener("click", () => { stop(); show(Math.min(steps.length - 1, +slider.value + 1)); });
  show(0);
}
