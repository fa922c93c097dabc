// tokens.js: the run and replay pages: sequences, rows, one selected token.
function runModel(doc) {
  const c = doc.config;
  const group = c.heads / c.kv_heads;
  return {
    blockSize: c.block_size, numBlocks: c.num_blocks, layout: c.layout, dtype: c.dtype, elementSize: c.element_size,
    heads: doc.shown_heads.map((h, pos) => ({ label: `query head ${h} (KV head ${Math.floor(h / group)})`, pos, kv: Math.floor(h / group) })),
    sequences: doc.sequences.map((q) => ({ name: `sequence ${q.index}`, seqLen: q.seq_len, table: q.block_table, rows: q.rows,
      query: q.query.index, queries: everyQuery(q, c), newTokens: c.query_lens[q.index], kept: q.rows_kept || null,
      mass: massOf(q), massPeak: Math.max(1e-30, ...(massOf(q) || [0])),
      note: `query: new token ${q.query.index} at position ${q.query.position}` })),
    weight: (row, head) => row.weights[head.pos], score: (row, head) => row.scores[head.pos], headDim: c.head_dim,
    start: doc.token ? { seq: doc.token.sequence, token: doc.token.token } : { seq: 0, token: null },
    maskMap: doc.mask_map || [], summary: doc.page_summary || null,
    config: `${doc.sequences.length} sequence(s), tokens ${c.tokens.length <= 8 ? c.tokens.join(", ") : `${int(Math.min(...c.tokens))} to ${int(Math.max(...c.tokens))} (the Sequence menu lists each)`} · block size ${c.block_size} · head_dim ${c.head_dim} · ` +
      `${c.heads} head(s) / ${c.kv_heads} KV head(s) · ${c.dtype} · layout ${c.layout} · pool ${int(c.num_blocks)} blocks · backend ${c.backend} · ` +
      checkWords(doc.checks),
  };
}
// Every new token of a prefill, reachable: `queries` (--json's, with their own scores and weights: at most 32, within
// a budget of numbers) and, for each other new token, its mask alone, from the run's rule (query at position p sees
// keys j <= p, and j > p - W under --sliding-window W), its numbers null: `run --query i --json` has them.
function everyQuery(q, c) {
  if (!q.queries) return null;
  const newTokens = c.query_lens[q.index], first = q.seq_len - newTokens, have = new Map(q.queries.map((e) => [e.index, e]));
  const out = [];
  for (let i = 0; i < newTokens; i++) {
    if (have.has(i)) { out.push(have.get(i)); continue; }
    const p = first + i, masked = [];
    if (c.sliding_window && p - c.sliding_window >= 0) masked.push([0, p - c.sliding_window, "window"]);
    if (p + 1 <= q.seq_len - 1) masked.push([p + 1, q.seq_len - 1, "causal"]);
    out.push({ index: i, position: p, row: null, scores: null, weights: null, masked, derived: true });
  }
  return out;
}

// a sequence's attention mass per logical block: --json's coverage, or a summarised page's block_mass (the same numbers)
function massOf(q) {
  if (q.block_mass) return q.block_mass;
  return q.coverage ? q.coverage.map((e) => e.attention_mass) : null;
}

// what the check compared, in the JSON's own words: the kernel against contiguous attention, or (backend torch)
// the torch path against the same gather in float64, no kernel run and no slot checked
function checkWords(ch) {
  const verdict = ch.passed ? "equal" : "NOT equal";
  const slots = ch.slots_checked ? (ch.slots_match ? "; the kernel read the slots the tables give" : "; the kernel read OTHER slots than the tables give") : "; slots not checked";
  return `check: ${ch.compared || "paged vs contiguous"}: ${verdict} (max |diff| ${Number(ch.max_abs_diff).toExponential(2)})${slots}`;
}
function replayModel(doc) {
  const traced = doc.requests.findIndex((r) => r.request === doc.traced.request);
  return {
    blockSize: doc.block_size, numBlocks: doc.num_blocks, layout: doc.layout, dtype: doc.dtype, elementSize: doc.element_size,
    // the weights are the mean over the query heads; the addresses are one KV head's, picked here
    heads: (doc.traced.tokens.length && doc.traced.tokens[0].key_element ? doc.traced.tokens[0].key_element : [0]).map((_, kv) =>
      ({ label: `mean over the heads · addresses of KV head ${kv}`, pos: 0, kv })), unit: "Request",
    sequences: doc.requests.map((r, i) => ({ name: `request ${r.request}`, seqLen: r.seq_len, table: r.block_table,
      rows: i === traced ? doc.traced.tokens : null, note: `${r.new_tokens} new token(s); ${r.passed ? "equal" : "DIFFERS"}` })),
    weight: (row) => row.weight, score: (row) => row.score,
    start: { seq: Math.max(traced, 0), token: doc.traced.tokens.some((r) => r.token === doc.traced.token) ? doc.traced.token : null },
    maskMap: [],
    config: `step ${doc.step} · layer ${doc.layer} · ${doc.dtype} · layout ${doc.layout} · block size ${doc.block_size} · backend ${doc.backend} · ` +
      `check: ${doc.backend === "torch" ? "the torch path (no kernel ran)" : "the kernel"} vs contiguous attention` +
      `${doc.requests.some((r) => r.max_diff_engine !== null && r.max_diff_engine !== undefined) ? " vs the engine's own output" : ""}: ${doc.passed ? "passed" : "FAILED"} (tolerance ${doc.tolerance})`,
  };
}

const MAX_ROWS = 1024; // table rows drawn at once; the keys and the "Token" box reach the rest

function tokenPage(m) {
  document.getElementById("config").textContent = m.config;
  const state = { seq: m.start.seq, head: 0, token: m.start.token, block: null, query: null };
  const owners = new Map(); // physical block -> [{seq, logical, first, last}]
  m.sequences.forEach((q, s) => q.table.forEach((p, l) => {
    if (!owners.has(p)) owners.set(p, []);
    owners.get(p).push({ seq: s, logical: l, first: l * m.blockSize, last: Math.min(q.seqLen, (l + 1) * m.blockSize) - 1 });
  }));
  const seqSel = el("select", { id: "seq-select", "aria-label": "sequence" },
    ...m.sequences.map((q, i) => el("option", { value: i, text: `${q.name} (${q.seqLen} tokens)` })));
  const headSel = el("select", { id: "head-select", "aria-label": "head" }, ...m.heads.map((h, i) => el("option", { value: i, text: h.label })));
  const goto = el("input", { type: "number", id: "goto", min: 0, "aria-label": "go to token", style: "width:7em" });
  // a prefill's (or mixed batch's) new tokens: which query the weights and the mask are shown for
  const querySel = el("select", { id: "query-select", "aria-label": "query token" });
  const queryLabel = el("label", { for: "query-select", text: "Query" });
  const controls = el("div", { class: "controls" },
    el("label", { for: "seq-select", text: m.unit || "Sequence" }), seqSel,
    el("label", { for: "head-select", text: "Head" }), headSel, queryLabel, querySel,
    el("label", { for: "goto", text: "Token" }), goto);
  const tablePanel = el("div", { class: "panel scroll", id: "token-panel" });
  const detail = el("div", { class: "panel", id: "detail", "aria-live": "polite" });
  const ownersBox = el("div", { class: "panel", id: "owners", "aria-live": "polite" });
  const picture = el("div", { class: "panel", id: "picture" });
  const [explainBoxEl, explainBody] = explainBox("explain", "What am I looking at?");
  const maskBox = el("div", { id: "mask" });
  app.replaceChildren(
    m.summary ? el("p", { id: "summary-note", class: "summary-note", text: m.summary }) : "",
    explainBoxEl,
    el("p", { text: "Click a token (or focus the table and use the arrow keys), a logical block, a table entry or a slot in the picture to trace it: its logical block, the block-table entry, the physical block and the slot light up, and its address and weight show. Click a physical block (or Tab to the pool and use the arrow keys) to list its owners." }),
    controls,
    legend([["var(--trace)", "orange, thick black outline: the traced token, its blocks and its path"],
            ["var(--seq)", "sky blue: a block of the selected sequence"],
            ["var(--shared)", "reddish purple: a block more than one sequence uses (shared)"],
            ["#c9dbe8", "pale blue: a block of another sequence"], ["var(--free)", "light grey: a free block"],
            ["var(--mass)", "blue bar: attention weight"]]),
    el("div", { class: "grid" },
      el("section", { "aria-label": "tokens" }, el("h2", { text: "Tokens" }), tablePanel, maskBox),
      el("section", { "aria-label": "block mapping" }, el("h2", { text: "Block mapping" }), detail, picture, el("h2", { text: "Owners of a physical block" }), ownersBox)));

  function fillQueries() {
    const q = m.sequences[state.seq];
    const list = q.queries || [];
    state.query = list.length ? q.query : null;
    querySel.replaceChildren(...list.map((e) => el("option", { value: e.index,
      text: `new token ${e.index} of ${q.newTokens}, at position ${e.position}${e.index === q.query ? " (the rows' query)" : ""}${e.weights ? "" : " (mask only)"}` })));
    querySel.value = state.query === null ? "" : state.query;
    querySel.hidden = queryLabel.hidden = !list.length;
  }
  querySel.addEventListener("change", () => { state.query = +querySel.value; drawTable(state.token); select(state.token); });
  fillQueries();
  seqSel.value = state.seq;
  seqSel.addEventListener("change", () => { state.seq = +seqSel.value; state.token = null; state.poolCentre = undefined; state.block = null;
    ownersBox.replaceChildren(); delete ownersBox.dataset.block; fillQueries(); drawTable(); select(null); drawMask(); });
  headSel.addEventListener("change", () => { state.head = +headSel.value; drawTable(); select(state.token); });
  goto.addEventListener("change", () => {
    // an empty box traces nothing (not token 0); a token out of range is said to be so
    if (goto.value.trim() === "") { select(null, true); return; }
    const t = Number(goto.value);
    if (Number.isInteger(t)) { drawTable(t); select(t, true); }
  });

  // the chosen query's entry (its own scores, weights and masked runs), or null: the rows' own values
  function chosen() {
    const q = m.sequences[state.seq];
    return q.queries && state.query !== null ? q.queries.find((e) => e.index === state.query) || null : null;
  }
  // a query's scores and weights follow the rows' order (every token, or the kept rows of a summarised page)
  const rowIndex = m.sequences.map((q) => new Map((q.rows || []).map((r, i) => [r.token, i])));
  // a query a summarised page keeps the mask of only (weights null): its numbers are n/a, its mask still shown
  const weightOf = (r, head) => { const e = chosen(); return e ? (e.weights ? e.weights[head.pos][rowIndex[state.seq].get(r.token)] : null) : m.weight(r, head); };
  const scoreOf = (r, head) => { const e = chosen(); return e ? (e.scores ? e.scores[head.pos][rowIndex[state.seq].get(r.token)] : null) : m.score(r, head); };
  function maskOf(r) {
    const e = chosen();
    if (!e) return r.mask;
    for (const [a, b, kind] of e.masked) if (a <= r.token && r.token <= b) return kind;
    return "visible";
  }

  let rowByToken = new Map();
  function drawTable(around) {
    const q = m.sequences[state.seq], head = m.heads[state.head];
    rowByToken = new Map();
    if (!q.rows) {
      tablePanel.replaceChildren(el("p", { text: `The replay's JSON traces one request's tokens; pick ${m.sequences[m.start.seq].name} to see them. This request's block table is drawn on the right.` }));
      return;
    }
    let rows = q.rows;
    if (rows.length > MAX_ROWS) {
      const t0 = around === undefined || around === null ? (state.token || 0) : around;
      const centre = rowIndex[state.seq].has(t0) ? rowIndex[state.seq].get(t0) : Math.min(t0, rows.length - 1);
      const from = Math.max(0, Math.min(rows.length - MAX_ROWS, centre - MAX_ROWS / 2));
      rows = rows.slice(from, from + MAX_ROWS);
    }
    let peak = 1e-30;
    for (const r of q.rows) peak = Math.max(peak, weightOf(r, head) || 0);
    const hasMask = !!q.queries || q.rows.some((r) => r.mask && r.mask !== "visible");
    const body = el("tbody", {});
    for (const r of rows) {
      const w = weightOf(r, head), mask = maskOf(r);
      const tr = el("tr", { "data-token": r.token, tabindex: -1, class: mask && mask !== "visible" ? "masked" : null, "data-weight": String(w), "data-mask": mask },
        el("td", { text: r.token }), el("td", { text: r.logical_block }), el("td", { text: r.offset }), el("td", { text: r.physical_block }),
        el("td", { class: "opt", text: r.slot }), el("td", { class: "opt", text: fmt(scoreOf(r, head)) }), hasMask ? el("td", { text: mask }) : null,
        el("td", { text: fmtWeight(w) }), el("td", { style: "text-align:left" }, el("span", { class: "bar", style: `width:${Math.round(60 * (w || 0) / peak)}px` })));
      tr.addEventListener("click", () => select(r.token, true));
      tr.addEventListener("keydown", onKey);
      rowByToken.set(r.token, tr);
      body.append(tr);
    }
    const head_ = el("thead", {}, el("tr", {}, ...["token", "logical", "offset", "physical", "pool slot", "score", ...(hasMask ? ["mask"] : []), "weight", ""].map((t) => el("th", { scope: "col", class: t === "pool slot" || t === "score" ? "opt" : null, text: t }))));
    const e = chosen();
    const caption = el("caption", { class: "visually-hidden", text: `${q.name}, ${head.label}${e ? `, query at position ${e.position}` : ""}: every token, where it lives and its attention weight` });
    const table = el("table", { id: "tokens" }, caption, head_, body);
    const note = q.rows.length > rows.length ? el("p", { text: `rows ${rows[0].token} to ${rows[rows.length - 1].token} of ${q.rows.length} shown; type a token above to go to it` }) : null;
    const kept = q.kept ? el("p", { class: "summary-note", text: `${q.kept.kept.toLocaleString("en-US")} of ${q.kept.of.toLocaleString("en-US")} rows are on this page (summarised: see the note above); a row left out still shows its blocks and slot when you type its token` }) : null;
    const says = e ? `query: new token ${e.index} at position ${e.position}; it sees ${q.seqLen - e.masked.reduce((n, [a, b]) => n + b - a + 1, 0)} of the keys` +
      (e.weights ? "" : `; its weights are not on this page (summarised): \`pagetrace run --query ${e.index} --json\` has them`) : q.note;
    tablePanel.replaceChildren(...[el("p", { id: "table-note", text: `${q.name}: ${q.seqLen} tokens; ${says}` }), kept, table, note].filter(Boolean));
    const first = rowByToken.get(state.token) || body.firstChild;
    if (first) first.tabIndex = 0;
  }
  function onKey(ev) {
    const q = m.sequences[state.seq];
    const t = +ev.currentTarget.dataset.token;
    const step = { ArrowDown: 1, ArrowUp: -1, PageDown: 16, PageUp: -16 }[ev.key];
    const at = rowIndex[state.seq].get(t), last = q.rows.length - 1; // moves go row by row (a summarised page keeps some rows)
    let next = null;
    if (step) next = q.rows[Math.max(0, Math.min(last, at + step))].token;
    else if (ev.key === "Home") next = q.rows[0].token;
    else if (ev.key === "End") next = q.rows[last].token;
    else if (ev.key === "Enter" || ev.key === " ") next = t;
    if (next === null) return;
    ev.preventDefault();
    if (!rowByToken.has(next)) drawTable(next);
    select(next, true);
    const tr = rowByToken.get(next);
    if (tr) tr.focus();
  }

  function rowOf(t) {
    const q = m.sequences[state.seq];
    return q.rows ? q.rows.find((r) => r.token === t) || null : null;
  }
  function select(t, fromUser) {
    state.token = t;
    for (const tr of rowByToken.values()) { tr.classList.remove("on"); tr.removeAttribute("aria-selected"); tr.tabIndex = -1; }
    const tr = rowByToken.get(t);
    if (tr) {
      tr.classList.add("on"); tr.setAttribute("aria-selected", "true"); tr.tabIndex = 0;
      const top = tr.offsetTop - tablePanel.clientHeight / 2, bottom = tr.offsetTop + tr.offsetHeight;
      if (!fromUser || tr.offsetTop < tablePanel.scrollTop + 30 || bottom > tablePanel.scrollTop + tablePanel.clientHeight) tablePanel.scrollTop = Math.max(0, top);
    }
    else { const f = tablePanel.querySelector("tbody tr"); if (f) f.tabIndex = 0; }
    goto.value = t === null || t === undefined ? "" : t;
    drawDetail(t);
    drawPicture(t);
    explainToken(explainBody, m, m.sequences[state.seq], rowOf(t), t, m.headDim);
    const row = rowOf(t);
    if (row) showOwners(row.physical_block);
  }

  function drawDetail(t) {
    const q = m.sequences[state.seq], head = m.heads[state.head], row = rowOf(t);
    if (!row) {
      const given = t !== null && t !== undefined, inside = given && t >= 0 && t < q.seqLen;
      detail.replaceChildren(el("p", { id: "d-none", text: !given ? "No token traced: pick one in the table (or type its number in Token)."
        : !inside ? `Token ${t} is out of range: ${q.name} has ${int(q.seqLen)} tokens, 0 to ${int(q.seqLen - 1)}.`
        : q.rows ? `Token ${t} is not on this page (summarised): its blocks and slot are drawn below; \`pagetrace run --json\` has its row, \`pagetrace lookup --token ${t}\` its address.`
        : `Token ${t}: its blocks and slot are drawn below; this request's rows are not in the replay's JSON.` }));
      return;
    }
    const kv = head.kv;
    const items = [
      ["token", `${row.token} of ${q.name}`, "d-token"],
      ["logical block", `${row.logical_block} = ${row.token} // ${m.blockSize}`, "d-logical"],
      ["offset", `${row.offset} = ${row.token} % ${m.blockSize}`, "d-offset"],
      ["block table", q.table.length <= 16 ? `[${q.table.join(", ")}][${row.logical_block}] = ${row.physical_block}`
        : `block_table[${row.logical_block}] = ${row.physical_block} (a table of ${q.table.length} entries)`, "d-table"],
      ["physical block", `${row.physical_block}`, "d-physical"],
      ["slot", `${row.offset} of block ${row.physical_block} (pool slot ${row.slot} = ${row.physical_block} × ${m.blockSize} + ${row.offset})`, "d-slot"],
    ];
    if (row.key_element) {
      items.push(["key address", `element ${int(row.key_element[kv])}, byte ${int(row.key_byte[kv])} (KV head ${kv}, layout ${m.layout}, ${m.dtype}, ${m.elementSize} B each)`, "d-key"]);
      items.push(["value address", `element ${int(row.value_element[kv])}, byte ${int(row.value_byte[kv])}`, "d-value"]);
    }
    const e = chosen(), mask = maskOf(row);
    const whose = e ? `, the query at position ${e.position}` : "";
    items.push(["attention weight", `${fmt(weightOf(row, head), 6)} (score ${fmt(scoreOf(row, head))}, ${head.label}${whose})`, "d-weight"]);
    if (mask && mask !== "visible") items.push(["mask", mask + ": this query does not see it", "d-mask"]);
    if (row.refcount !== undefined) items.push(["reference count", `${row.refcount}`, "d-ref"]);
    const dl = el("dl", {});
    for (const [k, v, id] of items) dl.append(el("dt", { text: k }), el("dd", { id, text: v }));
    if (row.key_byte) {
      for (const which of ["key", "value"]) {
        const dd = dl.querySelector(`#d-${which}`);
        dd.dataset.element = row[`${which}_element`][kv];
        dd.dataset.byte = row[`${which}_byte`][kv];
      }
    }
    detail.replaceChildren(dl);
  }

  function showOwners(p) {
    state.block = p;
    const list = owners.get(p) || [];
    const items = list.map((o) => el("li", { "data-seq": o.seq, text: `${m.sequences[o.seq].name}: logical block ${o.logical}, tokens ${o.first} to ${o.last}` }));
    ownersBox.replaceChildren(
      el("p", { id: "owners-title", text: list.length ? `physical block ${p}: ${list.length} owner(s)${new Set(list.map((o) => o.seq)).size > 1 ? " (shared)" : ""}` : `physical block ${p}: free (no sequence maps it)` }),
      el("ul", { class: "reqlist", id: "owners-list" }, ...items));
    ownersBox.dataset.block = p;
  }

  // how many of the pool's blocks [a, b) some sequence maps (for the overview of a large pool)
  const usedSorted = [...owners.keys()].sort((x, y) => x - y);
  function usedIn(a, b) {
    const lo = (v) => { let i = 0, j = usedSorted.length; while (i < j) { const k = (i + j) >> 1; if (usedSorted[k] < v) i = k + 1; else j = k; } return i; };
    return lo(b) - lo(a);
  }

  function drawPicture(t) {
    const q = m.sequences[state.seq], bs = m.blockSize;
    const cw = 38, ch = 22, gap = 2, perRow = picture.clientWidth && picture.clientWidth < 520 ? 8 : 16, W = perRow * (cw + gap);
    const svg = sv("svg", { viewBox: `0 0 ${W} 100`, role: "img", "aria-label": `block mapping of ${q.name}` });
    const lb = t === null || t === undefined ? null : Math.floor(t / bs);
    const off = t === null || t === undefined ? null : t % bs;
    const phys = lb === null ? null : q.table[lb];
    let y = 14;
    // logical blocks and the block table, a window of 64 around the traced block when the table is long
    const nl = q.table.length;
    const from = nl <= 64 ? 0 : Math.max(0, Math.min(nl - 64, (lb || 0) - 32));
    const to = Math.min(nl, from + 64);
    svg.append(sv("text", { x: 0, y, class: "title" }, `${q.name}: logical blocks, block table${from > 0 || to < nl ? `, blocks ${from} to ${to - 1} of ${nl}` : ""}`));
    y += 6;
    const lpos = new Map();
    for (let l = from; l < to; l++) {
      const i = l - from, x = (i % perRow) * (cw + gap), yy = y + Math.floor(i / perRow) * (2 * ch + 10);
      const on = l === lb;
      const lr = sv("rect", { x, y: yy, width: cw, height: ch, class: "cell lblock" + (on ? " on" : ""), fill: "#fff", "data-logical": l });
      lr.append(sv("title", {}, `logical block ${l}: tokens ${l * bs} to ${Math.min(q.seqLen, (l + 1) * bs) - 1}${q.mass ? `; attention mass ${fmt(q.mass[l], 4)}` : ""} (click to trace its first token)`));
      svg.append(lr);
      svg.append(sv("text", { x: x + 4, y: yy + 15 }, `L${l}`));
      // the attention mass of the block (the weights of its tokens, summed; --json's coverage), as a bar along its bottom
      if (q.mass) svg.append(sv("rect", { x: x + 1, y: yy + ch - 4, width: Math.max(0.5, (cw - 2) * q.mass[l] / q.massPeak), height: 3, class: "massbar", "data-mass": q.mass[l] }));
      const shared = new Set((owners.get(q.table[l]) || []).map((o) => o.seq)).size > 1;
      svg.append(sv("rect", { x, y: yy + ch, width: cw, height: ch, class: "cell tentry" + (on ? " on" : ""), fill: shared ? "var(--shared)" : "var(--seq)", "data-logical": l }));
      for (const r of svg.querySelectorAll(`rect[data-logical="${l}"]`)) r.addEventListener("click", () => { const t0 = l * bs + (l === lb ? off : 0); drawTable(t0); select(t0, true); });
      svg.append(sv("text", { x: x + 4, y: yy + ch + 15 }, `${q.table[l]}`));
      lpos.set(l, [x + cw / 2, yy + 2 * ch]);
    }
    y += Math.ceil((to - from) / perRow) * (2 * ch + 10) + 22;
    // the pool: all of it, or the window of MAX_POOL blocks around the traced block (or the one picked in the overview)
    const small = m.numBlocks > 256;
    const pcols = small ? 4 * perRow : perRow, pc = small ? Math.floor(W / pcols) - gap : cw, ph = small ? pc : ch;
    if (phys !== null && phys !== undefined && state.windowFor !== t) { state.poolCentre = phys; state.windowFor = t; }
    const win = poolWindow(m.numBlocks, state.poolCentre ?? q.table[0], pcols), N = win.n;
    if (N < m.numBlocks) {
      const [g, yy] = poolOverview(m.numBlocks, win, usedIn, (b) => { state.poolCentre = b + MAX_POOL / 2; drawPicture(state.token); },
        W, y, `the whole pool, ${int(m.numBlocks)} blocks (shade: the share in use; click to draw that part)`);
      svg.append(g);
      y = yy + 20;
    }
    svg.append(sv("text", { x: 0, y, class: "title", id: "pool-title" }, `the pool: ${int(m.numBlocks)} physical blocks${N < m.numBlocks ? ` (blocks ${int(win.from)} to ${int(win.from + N - 1)} drawn)` : ""}`));
    y += 6;
    const poolTop = y;
    const mine = new Set(q.table);
    const ppos = new Map(), cells = [];
    for (let i = 0; i < N; i++) {
      const p = win.from + i, x = (i % pcols) * (pc + gap), yy = poolTop + Math.floor(i / pcols) * (ph + gap);
      const ow = owners.get(p) || [];
      const shared = new Set(ow.map((o) => o.seq)).size > 1;
      const fill = shared ? "var(--shared)" : mine.has(p) ? "var(--seq)" : ow.length ? "#c9dbe8" : "var(--free)";
      const words = shared ? "shared" : mine.has(p) ? `used by ${q.name}` : ow.length ? "used by another sequence" : "free";
      const r = sv("rect", { x, y: yy, width: pc, height: ph, class: "cell pool" + (p === phys ? " on" : ""), fill, role: "button",
        "data-block": p, "aria-label": `physical block ${p}: ${words}` });
      r.append(sv("title", {}, `physical block ${p}: ${words}`));
      cells.push(r);
      svg.append(r);
      if (!small) svg.append(sv("text", { x: x + 4, y: yy + 15, "pointer-events": "none" }, `${p}`));
      ppos.set(p, [x + pc / 2, yy]);
    }
    // one Tab stop for the pool (on the traced block, or the owners' block, or the first): the arrow keys move inside it
    const at = (b) => (b !== null && b !== undefined && b >= win.from && b < win.from + N ? b - win.from : -1);
    const stop = [at(state.block), at(phys), 0].find((i) => i >= 0);
    rovingGrid(svg, cells, pcols, stop, (i) => showOwners(win.from + i));
    y = poolTop + Math.ceil(N / pcols) * (ph + gap) + 24;
    // thin edges: table entry -> physical block
    if (to - from <= 16) for (let l = from; l < to; l++) {
      const a = lpos.get(l), b = ppos.get(q.table[l]);
      if (a && b && l !== lb) svg.insertBefore(sv("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: "edge" }), svg.firstChild);
    }
    // the traced token's block, slot by slot
    if (phys !== null && phys !== undefined) {
      svg.append(sv("text", { x: 0, y, class: "title" }, `block ${phys}, slot by slot (tokens of ${q.name})`));
      y += 6;
      const slotTop = y;
      for (let s = 0; s < bs; s++) {
        const x = (s % perRow) * (cw + gap), yy = slotTop + Math.floor(s / perRow) * (ch + gap);
        const tok = lb * bs + s;
        const used = tok < q.seqLen;
        svg.append(sv("rect", { x, y: yy, width: cw, height: ch, class: "cell slot" + (s === off ? " on" : ""), fill: used ? "var(--seq)" : "#fff",
          "data-block": phys, "data-slot": s, "aria-label": `slot ${s}${used ? `: token ${tok}` : ": empty"}`, onclick: used ? () => { drawTable(tok); select(tok, true); } : null }));
        svg.append(sv("text", { x: x + 3, y: yy + 15 }, used ? `${tok}` : "·"));
      }
      const slotEnd = slotTop + Math.ceil(bs / perRow) * (ch + gap);
      // the path: logical block -> table entry -> physical block -> slot
      const a = lpos.get(lb), b = ppos.get(phys);
      const sx = (off % perRow) * (cw + gap) + cw / 2, sy = slotTop + Math.floor(off / perRow) * (ch + gap);
      if (a && b) svg.insertBefore(sv("path", { d: `M${a[0]},${a[1]} L${b[0]},${b[1]} M${b[0]},${b[1] + ph} L${sx},${sy}`, class: "path", "data-path": "token" }), svg.firstChild);
      y = slotEnd + 8;
    }
    svg.setAttribute("viewBox", `-2 0 ${W + 4} ${y}`);
    picture.replaceChildren(svg);
  }

  // one query's mask as a character per key block, from its masked runs [first, last, kind]: as report.mask_map writes it
  function maskCells(q, masked) {
    const bs = m.blockSize, n = Math.ceil(q.seqLen / bs), hidden = new Array(n).fill(0), win = new Array(n).fill(false);
    for (const [a, b, kind] of masked) {
      for (let blk = Math.floor(a / bs); blk <= Math.floor(b / bs); blk++) {
        const lo = Math.max(a, blk * bs), hi = Math.min(b, (blk + 1) * bs - 1);
        hidden[blk] += hi - lo + 1;
        if (kind === "window") win[blk] = true;
      }
    }
    return hidden.map((h, blk) => { const size = Math.min(q.seqLen, (blk + 1) * bs) - blk * bs; return h === 0 ? "█" : h < size ? "░" : win[blk] ? "w" : "·"; }).join("");
  }
  const MASK_FILL = { "█": "var(--used)", "░": "var(--seq)", "·": "var(--free)", w: "var(--shared)" };
  // the mask map as a picture: a row per query position, the key blocks across (runs of one state as one bar), every
  // query of the sequence when the page has them (a click picks it), else `--json`'s mask_map rows with a mark where positions are left out
  function drawMask() {
    const q = m.sequences[state.seq], e = chosen();
    let rows;
    if (q.queries) rows = q.queries.map((x) => ({ position: x.position, blocks: maskCells(q, x.masked), query: x.index }));
    else if (m.maskMap.length && state.seq === m.start.seq) rows = m.maskMap.map((r) => ({ position: r.position, blocks: r.blocks, query: null }));
    else { maskBox.replaceChildren(); return; }
    const W = 640, L = 78, rh = 12, n = rows[0].blocks.length, cw = (W - L) / n;
    const svg = sv("svg", { id: "mask-map", role: "img", "aria-label": `mask map: ${rows.length} query rows by ${n} key blocks` });
    let y = 2;
    rows.forEach((r, i) => {
      if (i > 0 && r.position > rows[i - 1].position + 1) { // positions left out: say so
        svg.append(sv("text", { x: 0, y: y + 9, class: "gap", "data-gap": r.position - rows[i - 1].position - 1 }, `⋮ ${r.position - rows[i - 1].position - 1} positions not in the map`));
        y += rh;
      }
      const on = e && r.query === e.index;
      const g = sv("g", { class: "mask-row" + (on ? " on" : ""), "data-position": r.position, "data-query": r.query ?? "", "data-blocks": r.blocks });
      g.append(sv("text", { x: 0, y: y + 9 }, `${on ? "▶" : " "}p=${r.position}`));
      for (let a = 0; a < n;) {
        let b = a;
        while (b + 1 < n && r.blocks[b + 1] === r.blocks[a]) b++;
        g.append(sv("rect", { x: L + a * cw, y, width: (b - a + 1) * cw, height: rh - 2, fill: MASK_FILL[r.blocks[a]] || "#fff" }));
        a = b + 1;
      }
      if (on) g.append(sv("rect", { x: L, y: y - 1, width: W - L, height: rh, fill: "none", stroke: "#000", "stroke-width": 1.5 }));
      if (r.query !== null) g.addEventListener("click", () => { querySel.value = r.query; querySel.dispatchEvent(new Event("change")); });
      svg.append(g);
      y += rh;
    });
    svg.append(sv("text", { x: L, y: y + 10 }, "key block 0"));
    svg.append(sv("text", { x: W, y: y + 10, "text-anchor": "end" }, `key block ${n - 1}`));
    svg.setAttribute("viewBox", `0 0 ${W} ${y + 14}`);
    maskBox.replaceChildren(el("h2", { text: `Mask map of ${q.name}: a row per query position, the key blocks across` }),
      el("div", { class: "panel" }, svg, legend([["var(--used)", "every key of the block visible"], ["var(--seq)", "some visible"], ["var(--free)", "causal-masked"], ["var(--shared)", "window-masked"]]),
        q.queries ? el("p", { text: "Click a row to pick its query (or use the Query menu)." }) : null));
  }
  querySel.addEventListener("change", drawMask);
  drawMask();
  drawTable();
  select(state.token);
  if (state.token === null) drawPicture(null);
}
