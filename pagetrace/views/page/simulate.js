// simulate.js: the simulate page.
function simulatePage(doc) {
  const c = doc.config, h = doc.history, steps = h.steps, sum = doc.summary;
  document.getElementById("config").textContent =
    `${c.policy} cache · ${int(c.num_blocks)} blocks of ${c.block_size} · ${int(sum.requests)} requests · ${int(sum.steps)} steps · ` +
    `prefix caching ${c.prefix_caching ? "on" : "off"} · chunked prefill ${c.chunked_prefill ? "on" : "off"} · hit rate ${fmt(sum.hit_rate, 3)}`;
  const names = doc.requests ? doc.requests.map((r) => r.id) : doc.request_ids;
  const byId = doc.requests ? new Map(doc.requests.map((r) => [r.id, r])) : new Map();
  const slider = el("input", { type: "range", id: "step", min: 0, max: steps.length - 1, value: 0, step: 1, "aria-label": "step" });
  const play = el("button", { id: "play", type: "button", text: "▶ play" });
  const speed = el("select", { id: "speed", "aria-label": "play speed" }, ...[["1", "1×"], ["4", "4×"], ["16", "16×"]].map(([v, t]) => el("option", { value: v, text: t })));
  const prev = el("button", { type: "button", text: "◀ step", "aria-label": "previous step" });
  const next = el("button", { type: "button", text: "step ▶", "aria-label": "next step" });
  const label = el("output", { id: "step-label", for: "step" });
  const stats = el("div", { class: "panel", id: "stats", "aria-live": "polite" });
  const pool = el("div", { class: "panel", id: "pool" });
  const grid = el("div", { class: "panel", id: "pool-grid" });
  const blockBox = el("div", { class: "panel", id: "block-info", "aria-live": "polite" }, el("p", { text: "Click a block in the grid (or Tab to the grid and use the arrow keys) to see who holds it." }));
  const chart = el("div", { class: "panel", id: "chart" });
  const tables = el("div", { class: "panel scroll", id: "tables" });
  app.replaceChildren(
    el("p", { text: "Drag the slider (or focus it and use the arrow keys), press play, or click the chart: the pool's blocks, every running request's block table and the step's events follow the run." }),
    el("div", { class: "controls" }, el("label", { for: "step", text: "Step" }), slider, prev, next, play, el("label", { for: "speed", text: "Speed" }), speed, label),
    el("p", { id: "summary-note", text: h.note || "" }),
    summaryBox(doc),
    el("h2", { text: "The pool over the whole run" }), chart,
    legend([["var(--free)", "light grey: free"], ["var(--cached)", "bluish green: free but still cached (a prefix hit can reuse it)"],
            ["var(--used)", "blue: used by one request"], ["var(--shared)", "reddish purple: shared by several requests"]]),
    el("div", { class: "grid" },
      el("section", { "aria-label": "the step" }, el("h2", { text: "This step" }), stats, el("h2", { text: "Pool by state" }), pool,
        el("h2", { text: "The pool, block by block" }), grid, el("h2", { text: "The block picked" }), blockBox),
      el("section", { "aria-label": "block tables" }, el("h2", { text: "Running requests' block tables" }), tables)));

  // the hashed blocks at kept step i (cached = hashed and held by no table): a bitmap now and then, changes between
  const hashedCache = new Map();
  function hashedAt(i) {
    if (!h.caches) return null;
    if (hashedCache.has(i)) return hashedCache.get(i);
    let k = i;
    while (k > 0 && !h.caches[k].bits) k--;
    let cur = decodeBits(h.caches[k].bits || "");
    for (let j = k + 1; j <= i; j++) { const d = h.caches[j]; if (d.bits) cur = decodeBits(d.bits); else { for (const b of d.drop) cur.delete(b); for (const b of d.add) cur.add(b); } }
    if (hashedCache.size > 64) hashedCache.clear();
    hashedCache.set(i, cur);
    return cur;
  }
  function decodeBits(text) {
    const out = new Set(), raw = atob(text);
    for (let i = 0; i < raw.length; i++) { const byte = raw.charCodeAt(i); if (byte) for (let b = 0; b < 8; b++) if (byte & (1 << b)) out.add(i * 8 + b); }
    return out;
  }

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
      for (const [r, bl] of d.set || []) cur.set(r, unruns(bl));
      for (const [r, bl] of d.add || []) cur.get(r).push(...unruns(bl));
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
        el("dt", { text: "finished" }), el("dd", { text: list(s.finished, s.finished_count ?? s.finished.length) }),
        ...missesAt(s)));
    drawPool(p);
    const cur = tablesAt(i);
    if (cur === null) { tables.replaceChildren(el("p", { text: `Block tables are kept for the first ${h.tables_until + 1} kept steps only (the page would be too large); the counts go on.` })); grid.replaceChildren(); markChart(i); return; }
    const items = [...cur.entries()].filter(([, b]) => b.length).map(([r, b]) =>
      el("li", { "data-request": names[r], "data-blocks": b.join(",") }, el("b", { text: names[r] }), ` (${b.length} blocks): `, el("span", { class: "blocks", text: b.join(" ") })));
    tables.replaceChildren(el("p", { id: "t-count", text: `${items.length} request(s) hold blocks after step ${s.step}` }), el("ul", { class: "reqlist", id: "table-list" }, ...items));
    drawGrid(i, cur);
    if (state.block !== null) showBlock(state.block);
    markChart(i);
  }
  function drawPool(p) {
    const [free, used, counted, shared] = p;
    const cached = counted === null ? 0 : counted; // null: a pool too large to count them (free includes them)
    const total = free + cached + used, W = 640;
    const svg = sv("svg", { viewBox: `0 0 ${W} 28`, role: "img", "aria-label": `pool: ${free} free, ${cached} cached, ${used} used (${shared} of them shared)` });
    let x = 0;
    for (const [n, colour] of [[free, "var(--free)"], [cached, "var(--cached)"], [used - shared, "var(--used)"], [shared, "var(--shared)"]]) {
      const w = total ? (W * n) / total : 0;
      svg.append(sv("rect", { x, y: 0, width: w, height: 28, fill: colour, stroke: "#333", "stroke-width": 0.5 }, undefined));
      x += w;
    }
    const queue = c.policy === "vllm" && counted !== null ? ` — --json's free_blocks (${int(free + cached)}) is free + cached: vLLM's free queue holds both, a cached block is evicted when it is reused` : "";
    pool.replaceChildren(svg, el("p", { id: "pool-counts", text: `free ${int(free)} · cached ${counted === null ? "not counted (free includes them)" : int(cached)} · used by one request ${int(used - shared)} · shared ${int(shared)}  (of ${int(total)} usable blocks)${queue}` }));
    pool.dataset.free = free; pool.dataset.used = used; pool.dataset.cached = cached; pool.dataset.shared = shared;
  }

  // each admitted request's prompt tokens by cause (--json's prompt_tokens_by_cause, `--explain`'s reasons): its misses at this step
  function missesAt(s) {
    const rows = s.admitted.map((id) => byId.get(id)).filter((r) => r && r.prompt_tokens_by_cause && r.first_scheduled === s.step);
    if (!rows.length) return [];
    const says = rows.slice(0, 8).map((r) => `${r.id}: ` + Object.entries(r.prompt_tokens_by_cause).filter(([, n]) => n).map(([k, n]) => `${int(n)} ${k}`).join(", "));
    return [el("dt", { text: "why each admitted prompt missed (or hit)" }), el("dd", { id: "s-misses", text: says.join("; ") + (rows.length > 8 ? ` … (${rows.length})` : "") })];
  }

  // ---- the pool block by block at the kept step: free, cached, used, shared (block 0 is vLLM's null block)
  const state = { block: null, centre: 0, holders: new Map(), hashed: null, i: 0 };
  const STATE_FILL = { free: "var(--free)", cached: "var(--cached)", used: "var(--used)", shared: "var(--shared)", null: "#777" };
  function blockState(b) {
    if (b === 0) return "null";
    const n = (state.holders.get(b) || []).length;
    return n > 1 ? "shared" : n === 1 ? "used" : state.hashed && state.hashed.has(b) ? "cached" : "free";
  }
  function drawGrid(i, cur) {
    state.i = i;
    state.holders = new Map();
    for (const [r, bl] of cur) bl.forEach((b, pos) => { if (!state.holders.has(b)) state.holders.set(b, []); state.holders.get(b).push([r, pos]); });
    state.hashed = hashedAt(i);
    // a small pool in bigger cells, numbered; a large one 64 to a row, its window around the picked block
    const n = c.num_blocks, cols = n <= 256 ? 16 : n <= 1024 ? 32 : 64, W = 640, cw = W / cols - 1, label = cols <= 16;
    const win = poolWindow(n, state.centre, cols), svg = sv("svg", { role: "img", "aria-label": `the pool at step ${steps[i].step}, block by block` });
    let y = 0;
    if (win.n < n) {
      const used = [...state.holders.keys()].sort((a, b) => a - b);
      const lo = (v) => { let a = 0, b = used.length; while (a < b) { const k = (a + b) >> 1; if (used[k] < v) a = k + 1; else b = k; } return a; };
      const [g, yy] = poolOverview(n, win, (a, b) => lo(b) - lo(a), (b) => { state.centre = b + MAX_POOL / 2; drawGrid(state.i, cur); }, W, 12,
        `the whole pool, ${int(n)} blocks (shade: the share in use; click to draw that part)`);
      svg.append(g);
      y = yy + 8;
    }
    svg.append(sv("text", { x: 0, y: y + 10, class: "title", id: "grid-title" }, `blocks ${int(win.from)} to ${int(win.from + win.n - 1)} at step ${steps[i].step}` +
      (state.hashed ? "" : " (cached blocks not told apart: free includes them)")));
    y += 16;
    const cells = [], counts = { free: 0, cached: 0, used: 0, shared: 0 };
    for (let k = 0; k < win.n; k++) {
      const b = win.from + k, st = blockState(b), x = (k % cols) * (cw + 1), yy = y + Math.floor(k / cols) * (cw + 1);
      if (st in counts) counts[st]++;
      const r = sv("rect", { x, y: yy, width: cw, height: cw, class: "cell blk" + (b === state.block ? " on" : ""), fill: STATE_FILL[st], "data-block": b, "data-state": st, role: "button",
        "aria-label": `block ${b}: ${st}` });
      cells.push(r);
      svg.append(r);
      if (label) svg.append(sv("text", { x: x + 3, y: yy + cw / 2 + 4, "pointer-events": "none", class: st === "used" || st === "null" ? "on-dark" : null }, `${b}`));
    }
    y += Math.ceil(win.n / cols) * (cw + 1);
    svg.setAttribute("viewBox", `0 0 ${W} ${y + 2}`);
    const stop = state.block !== null && state.block >= win.from && state.block < win.from + win.n ? state.block - win.from : 0;
    rovingGrid(svg, cells, cols, stop, (k) => { state.block = win.from + k; for (const x of cells) x.classList.remove("on"); cells[k].classList.add("on"); showBlock(state.block); });
    grid.replaceChildren(svg);
    Object.assign(grid.dataset, counts);
  }
  // a block's story up to kept step i: the kept steps at which it was last allocated (no table held it at the kept step
  // before) and last lost its hash (evicted for reuse, or freed before it was full)
  function blockStory(b, i) {
    const holders = new Set();
    let held = false, hashed = false, allocated = null, evicted = null;
    for (let k = 0; k <= Math.min(i, h.tables.length - 1); k++) {
      const d = h.tables[k] || {};
      for (const r of d.drop || []) holders.delete(r);
      for (const [r, bl] of d.set || []) { if (hasBlock(bl, b)) holders.add(r); else holders.delete(r); }
      for (const [r, bl] of d.add || []) if (hasBlock(bl, b)) holders.add(r);
      if (holders.size && !held) allocated = k;
      held = holders.size > 0;
      if (h.caches) {
        const e = h.caches[k], now = e.bits ? decodeBits(e.bits).has(b) : e.add.includes(b) ? true : e.drop.includes(b) ? false : hashed;
        if (hashed && !now) evicted = k;
        hashed = now;
      }
    }
    return { allocated, evicted };
  }
  function showBlock(b) {
    const st = blockState(b), who = state.holders.get(b) || [], story = blockStory(b, state.i);
    const at = (k) => (k === null ? "not within the kept steps" : k === 0 ? `by step ${steps[0].step}` : `between steps ${steps[k - 1].step} and ${steps[k].step}`);
    const items = [
      ["block", `${b}${b === 0 ? " (vLLM's null block: never handed out)" : ""}`, "b-id"],
      ["state", st, "b-state"],
      ["reference count", `${who.length} (the requests whose table holds it)`, "b-ref"],
      ["holders", who.length ? who.map(([r, pos]) => `${names[r]} (its logical block ${pos})`).join(", ") : "none", "b-holders"],
      ["hash", state.hashed === null ? "not known (the pool is too large to follow block by block)" : state.hashed.has(b) ? "held: a full block's prefix hash (a prefix hit can reuse it)" : "none", "b-hash"],
      ["last allocated", at(story.allocated), "b-allocated"],
      ["last lost its hash", state.hashed === null ? "not known" : at(story.evicted), "b-evicted"],
    ];
    const dl = el("dl", {});
    for (const [k, v, id] of items) dl.append(el("dt", { text: k }), el("dd", { id, text: v }));
    blockBox.replaceChildren(dl);
    blockBox.dataset.block = b;
  }

  // ---- the chart: used, cached and free over the whole run; preemptions (top) and evictions (bottom) marked; click to jump
  const CW = 640, CH = 120, first = h.chart.length ? h.chart[0][0] : 0, lastStep = h.chart.length ? h.chart[h.chart.length - 1][0] : 1;
  const xOf = (step) => (CW * (step - first)) / Math.max(1, lastStep - first);
  const usable = c.num_blocks - 1;
  const chartSvg = sv("svg", { viewBox: `0 -10 ${CW} ${CH + 26}`, role: "img", id: "chart-svg", "aria-label": "blocks used, cached and free over the whole run; click to go to that step" });
  (function drawChart() {
    const yOf = (v) => CH - (CH * v) / Math.max(1, usable);
    const area = (lo, hi, fill, name) => {
      const top = h.chart.map((p) => `${xOf(p[0]).toFixed(1)},${yOf(hi(p)).toFixed(1)}`), bottom = h.chart.map((p) => `${xOf(p[0]).toFixed(1)},${yOf(lo(p)).toFixed(1)}`).reverse();
      chartSvg.append(sv("polygon", { points: [...top, ...bottom].join(" "), fill, "data-series": name }));
    };
    area(() => 0, (p) => p[2], "var(--used)", "used");
    area((p) => p[2], (p) => p[2] + (p[3] || 0), "var(--cached)", "cached");
    area((p) => p[2] + (p[3] || 0), () => usable, "var(--free)", "free");
    for (const [step, n] of h.marks.preempted) chartSvg.append(sv("line", { x1: xOf(step), x2: xOf(step), y1: -10, y2: -2, class: "mark-preempt", "data-step": step, "data-n": n }));
    for (const [step, n] of h.marks.evicted) chartSvg.append(sv("line", { x1: xOf(step), x2: xOf(step), y1: CH + 2, y2: CH + 10, class: "mark-evict", "data-step": step, "data-n": n }));
    chartSvg.append(sv("text", { x: 0, y: CH + 24 }, `step ${int(first)}`));
    chartSvg.append(sv("text", { x: CW, y: CH + 24, "text-anchor": "end" }, `step ${int(lastStep)}`));
    chartSvg.append(sv("line", { id: "chart-now", x1: 0, x2: 0, y1: -10, y2: CH + 10, class: "now" }));
    chartSvg.addEventListener("click", (ev) => {
      const box = chartSvg.getBoundingClientRect(), step = first + ((ev.clientX - box.left) / box.width) * (lastStep - first);
      stop(); show(nearestKept(step));
    });
    chart.replaceChildren(chartSvg, legend([["var(--used)", "used (one request or shared)"], ["var(--cached)", "cached"], ["var(--free)", "free"],
      ["#D55E00", "tick above: preemptions"], ["#000", "tick below: evictions"]]));
  })();
  function nearestKept(step) {
    let a = 0, b = steps.length - 1;
    while (a < b) { const k = (a + b) >> 1; if (steps[k].step < step) a = k + 1; else b = k; }
    return a > 0 && Math.abs(steps[a - 1].step - step) < Math.abs(steps[a].step - step) ? a - 1 : a;
  }
  function markChart(i) {
    const line = chartSvg.querySelector("#chart-now"), x = xOf(steps[i].step);
    line.setAttribute("x1", x); line.setAttribute("x2", x);
    chart.dataset.step = steps[i].step;
  }

  let timer = null;
  function stop() { if (timer) { clearInterval(timer); timer = null; play.textContent = "▶ play"; } }
  play.addEventListener("click", () => {
    if (timer) return stop();
    if (+slider.value >= steps.length - 1) show(0); // play at the end starts again from the first step
    play.textContent = "❚❚ pause";
    timer = setInterval(() => { const i = +slider.value + +speed.value; if (i >= steps.length) { show(steps.length - 1); return stop(); } show(i); }, 120);
  });
  slider.addEventListener("input", () => { stop(); show(+slider.value); });
  prev.addEventListener("click", () => { stop(); show(Math.max(0, +slider.value - 1)); });
  next.addEventListener("click", () => { stop(); show(Math.min(steps.length - 1, +slider.value + 1)); });
  app.prepend(explainSimulate());
  show(0);
}

// a block list as sim_data.runs packs it: [5, -3, 20] is [5, 6, 7, 8, 20]
function unruns(packed) {
  const out = [];
  for (const x of packed) { if (x < 0) { const a = out[out.length - 1]; for (let k = 1; k <= -x; k++) out.push(a + k); } else out.push(x); }
  return out;
}
function hasBlock(packed, b) {
  for (let i = 0; i < packed.length; i++) {
    const x = packed[i];
    if (x === b) return true;
    if (x < 0 && b > packed[i - 1] && b <= packed[i - 1] - x) return true;
  }
  return false;
}

// the run's summary: hit rate, preemptions, evictions, the waste table against Orca (summary.waste)
function summaryBox(doc) {
  const s = doc.summary;
  const facts = el("p", { id: "sim-summary", text: `hit rate ${fmt(s.hit_rate, 3)} · ${int(s.preemptions)} preemption(s) of ${int(s.preempted_requests)} request(s) · ` +
    `${int(s.evictions)} eviction(s) · peak ${int(s.peak_used_blocks)} of ${int(s.usable_blocks)} blocks used · peak ${int(s.peak_running)} running` });
  const kinds = ["token states", "reservation", "internal fragmentation", "external fragmentation"];
  const waste = (s.waste || []).length ? el("table", { id: "waste", class: "factors" },
    el("caption", { text: "KV slot-steps by what they hold, against Orca's reservations (shares of each system's total)" }),
    el("thead", {}, el("tr", {}, el("th", { scope: "col", text: "system" }), ...kinds.map((k) => el("th", { scope: "col", text: k })), el("th", { scope: "col", text: "steps" }))),
    el("tbody", {}, ...s.waste.map((w) => el("tr", {}, el("td", { style: "text-align:left", text: w.system }), ...kinds.map((k) => el("td", { text: fmt(w.shares[k], 3) })), el("td", { text: int(w.steps) }))))) : null;
  return el("div", { class: "panel", id: "summary" }, el("h2", { text: "The run" }), facts, waste);
}
