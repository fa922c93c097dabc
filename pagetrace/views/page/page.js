// pagetrace's page: lays out and draws the command's --json document (embedded above). No network.
(function () {
  "use strict";
  const DOC = JSON.parse(document.getElementById("pagetrace-data").textContent);
  const KIND = document.body.dataset.kind;
  const app = document.getElementById("app");
  const SVGNS = "http://www.w3.org/2000/svg";

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") e.textContent = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
    }
    for (const k of kids) if (k !== null && k !== undefined) e.append(k);
    return e;
  }
  function sv(tag, attrs, text) {
    const e = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  const fmt = (x, d = 4) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d));
  const int = (x) => (x === null || x === undefined ? "n/a" : Number(x).toLocaleString("en-US"));
  function legend(items) {
    return el("ul", { class: "legend", "aria-label": "what the colours mean" },
      ...items.map(([colour, words, extra]) => el("li", {}, el("span", { class: "swatch", style: `background:${colour};${extra || ""}` }), words)));
  }

  // ---------- run and replay: sequences, rows, one selected token ----------
  function runModel(doc) {
    const c = doc.config;
    const group = c.heads / c.kv_heads;
    return {
      blockSize: c.block_size, numBlocks: c.num_blocks, layout: c.layout, dtype: c.dtype, elementSize: c.element_size,
      heads: doc.shown_heads.map((h, pos) => ({ label: `query head ${h} (KV head ${Math.floor(h / group)})`, pos, kv: Math.floor(h / group) })),
      sequences: doc.sequences.map((q) => ({ name: `sequence ${q.index}`, seqLen: q.seq_len, table: q.block_table, rows: q.rows,
        query: q.query.index, queries: q.queries || null, newTokens: c.query_lens[q.index], kept: q.rows_kept || null,
        note: `query: new token ${q.query.index} at position ${q.query.position}` })),
      weight: (row, head) => row.weights[head.pos], score: (row, head) => row.scores[head.pos],
      start: doc.token ? { seq: doc.token.sequence, token: doc.token.token } : { seq: 0, token: null },
      maskMap: doc.mask_map || [], summary: doc.page_summary || null,
      config: `${doc.sequences.length} sequence(s), tokens ${c.tokens.join(",")} · block size ${c.block_size} · head_dim ${c.head_dim} · ` +
        `${c.heads} head(s) / ${c.kv_heads} KV head(s) · ${c.dtype} · layout ${c.layout} · pool ${c.num_blocks} blocks · backend ${c.backend} · ` +
        `check: ${doc.checks.passed ? "paged = contiguous" : "NOT equal"} (max |diff| ${Number(doc.checks.max_abs_diff).toExponential(2)})`,
    };
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
      start: { seq: Math.max(traced, 0), token: null },
      maskMap: [],
      config: `step ${doc.step} · layer ${doc.layer} · ${doc.dtype} · layout ${doc.layout} · block size ${doc.block_size} · backend ${doc.backend} · ` +
        `${doc.passed ? "passed" : "FAILED"}: kernel vs contiguous vs engine (tolerance ${doc.tolerance})`,
    };
  }

  const MAX_ROWS = 4096; // table rows drawn at once; a "go to token" box reaches the rest
  const MAX_POOL = 4096; // pool cells drawn

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
    const maskBox = el("div", { id: "mask" });
    app.replaceChildren(
      m.summary ? el("p", { id: "summary-note", class: "summary-note", text: m.summary }) : "",
      el("p", { text: "Click a token (or focus the table and use the arrow keys) to trace it: its logical block, the block-table entry, the physical block and the slot light up, and its address and weight show. Click a physical block (or Tab to it, then Enter) to list its owners." }),
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
        text: `new token ${e.index} of ${q.newTokens}, at position ${e.position}${e.index === q.query ? " (the rows' query)" : ""}` })));
      querySel.value = state.query === null ? "" : state.query;
      querySel.hidden = queryLabel.hidden = !list.length;
    }
    querySel.addEventListener("change", () => { state.query = +querySel.value; drawTable(state.token); select(state.token); });
    fillQueries();
    seqSel.value = state.seq;
    seqSel.addEventListener("change", () => { state.seq = +seqSel.value; state.token = null; fillQueries(); drawTable(); select(null); drawMask(); });
    headSel.addEventListener("change", () => { state.head = +headSel.value; drawTable(); select(state.token); });
    goto.addEventListener("change", () => { const t = +goto.value; if (Number.isInteger(t)) { drawTable(t); select(t, true); } });

    // the chosen query's entry (its own scores, weights and masked runs), or null: the rows' own values
    function chosen() {
      const q = m.sequences[state.seq];
      return q.queries && state.query !== null ? q.queries.find((e) => e.index === state.query) || null : null;
    }
    // a query's scores and weights follow the rows' order (every token, or the kept rows of a summarised page)
    const rowIndex = m.sequences.map((q) => new Map((q.rows || []).map((r, i) => [r.token, i])));
    const weightOf = (r, head) => { const e = chosen(); return e ? e.weights[head.pos][rowIndex[state.seq].get(r.token)] : m.weight(r, head); };
    const scoreOf = (r, head) => { const e = chosen(); return e ? e.scores[head.pos][rowIndex[state.seq].get(r.token)] : m.score(r, head); };
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
          el("td", { text: fmt(w) }), el("td", { style: "text-align:left" }, el("span", { class: "bar", style: `width:${Math.round(60 * (w || 0) / peak)}px` })));
        tr.addEventListener("click", () => select(r.token, true));
        tr.addEventListener("mouseenter", () => preview(r.token));
        tr.addEventListener("keydown", onKey);
        rowByToken.set(r.token, tr);
        body.append(tr);
      }
      const head_ = el("thead", {}, el("tr", {}, ...["token", "logical", "offset", "physical", "pool slot", "score", ...(hasMask ? ["mask"] : []), "weight", ""].map((t) => el("th", { scope: "col", class: t === "pool slot" || t === "score" ? "opt" : null, text: t }))));
      const e = chosen();
      const caption = el("caption", { class: "visually-hidden", text: `${q.name}, ${head.label}${e ? `, query at position ${e.position}` : ""}: every token, where it lives and its attention weight` });
      const table = el("table", { id: "tokens" }, caption, head_, body);
      table.addEventListener("mouseleave", () => preview(null));
      const note = q.rows.length > rows.length ? el("p", { text: `rows ${rows[0].token} to ${rows[rows.length - 1].token} of ${q.rows.length} shown; type a token above to go to it` }) : null;
      const kept = q.kept ? el("p", { class: "summary-note", text: `${q.kept.kept.toLocaleString("en-US")} of ${q.kept.of.toLocaleString("en-US")} rows are on this page (summarised: see the note above); a row left out still shows its blocks and slot when you type its token` }) : null;
      const says = e ? `query: new token ${e.index} at position ${e.position}; it sees ${q.seqLen - e.masked.reduce((n, [a, b]) => n + b - a + 1, 0)} of the keys` : q.note;
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
    function preview(t) { drawPicture(t === null ? state.token : t); }
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
      if (t !== null && t !== undefined) goto.value = t;
      drawDetail(t);
      drawPicture(t);
      const row = rowOf(t);
      if (row) showOwners(row.physical_block);
    }

    function drawDetail(t) {
      const q = m.sequences[state.seq], head = m.heads[state.head], row = rowOf(t);
      if (!row) {
        const left = t !== null && t !== undefined && q.kept && t >= 0 && t < q.seqLen;
        detail.replaceChildren(el("p", { id: "d-none", text: left ? `Token ${t} is not on this page (summarised): its blocks and slot are drawn below; \`pagetrace run --json\` has its row, \`pagetrace lookup --token ${t}\` its address.`
          : "No token traced: pick one in the table." }));
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
        svg.append(sv("rect", { x, y: yy, width: cw, height: ch, class: "cell lblock" + (on ? " on" : ""), fill: "#fff", "data-logical": l }));
        svg.append(sv("text", { x: x + 4, y: yy + 15 }, `L${l}`));
        const shared = new Set((owners.get(q.table[l]) || []).map((o) => o.seq)).size > 1;
        svg.append(sv("rect", { x, y: yy + ch, width: cw, height: ch, class: "cell tentry" + (on ? " on" : ""), fill: shared ? "var(--shared)" : "var(--seq)", "data-logical": l }));
        svg.append(sv("text", { x: x + 4, y: yy + ch + 15 }, `${q.table[l]}`));
        lpos.set(l, [x + cw / 2, yy + 2 * ch]);
      }
      y += Math.ceil((to - from) / perRow) * (2 * ch + 10) + 22;
      // the pool
      const N = Math.min(m.numBlocks, MAX_POOL);
      const small = N > 256;
      const pcols = small ? 4 * perRow : perRow, pc = small ? Math.floor(W / pcols) - gap : cw, ph = small ? pc : ch;
      svg.append(sv("text", { x: 0, y, class: "title" }, `the pool: ${m.numBlocks} physical blocks${N < m.numBlocks ? ` (first ${N} drawn)` : ""}`));
      y += 6;
      const poolTop = y;
      const mine = new Set(q.table);
      const ppos = new Map();
      for (let p = 0; p < N; p++) {
        const x = (p % pcols) * (pc + gap), yy = poolTop + Math.floor(p / pcols) * (ph + gap);
        const ow = owners.get(p) || [];
        const shared = new Set(ow.map((o) => o.seq)).size > 1;
        const fill = shared ? "var(--shared)" : mine.has(p) ? "var(--seq)" : ow.length ? "#c9dbe8" : "var(--free)";
        const words = shared ? "shared" : mine.has(p) ? `used by ${q.name}` : ow.length ? "used by another sequence" : "free";
        const r = sv("rect", { x, y: yy, width: pc, height: ph, class: "cell pool" + (p === phys ? " on" : ""), fill, tabindex: 0, role: "button",
          "data-block": p, "aria-label": `physical block ${p}: ${words}` });
        r.append(sv("title", {}, `physical block ${p}: ${words}`));
        r.addEventListener("click", () => showOwners(p));
        r.addEventListener("keydown", (ev) => { if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); showOwners(p); } });
        svg.append(r);
        if (!small) svg.append(sv("text", { x: x + 4, y: yy + 15, "pointer-events": "none" }, `${p}`));
        ppos.set(p, [x + pc / 2, yy]);
      }
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
            "data-block": phys, "data-slot": s, "aria-label": `slot ${s}${used ? `: token ${tok}` : ": empty"}` }));
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

    function drawMask() {
      if (!m.maskMap.length) return;
      const q = m.sequences[state.seq], e = chosen();
      const at = e ? e.position : null;
      maskBox.replaceChildren(el("h2", { text: "Mask map: a row per query position, a cell per key block" + (state.seq === m.start.seq ? "" : ` (of ${m.sequences[m.start.seq].name})`) }),
        el("pre", { class: "panel", id: "mask-map", text: m.maskMap.map((r) => `${r.position === at && state.seq === m.start.seq ? "▶" : " "} p=${String(r.position).padEnd(6)} ${r.blocks}`).join("\n") +
          "\n█ every key visible  ░ some visible  · causal-masked  w window-masked" + (at !== null && state.seq === m.start.seq ? "  ▶ the query picked above" : "") }));
    }
    querySel.addEventListener("change", drawMask);
    drawMask();
    drawTable();
    select(state.token);
    if (state.token === null) drawPicture(null);
  }

  // ---------- simulate: a step slider over the run ----------
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

  // ---------- lookup: one token's four steps, down to the element and byte ----------
  function lookupPage(doc) {
    const bs = doc.block_size, lb = doc.logical_block, off = doc.offset, phys = doc.physical_block, table = doc.block_table;
    const size = doc.element_size ?? doc.key.element_size;
    const numBlocks = doc.num_blocks ?? Math.max(...table) + 1;
    document.getElementById("config").textContent = (doc.engine ? `${doc.engine.name || "engine"} bundle ${doc.bundle}, step ${doc.step}, request ${doc.request} · ` : "") +
      `token ${doc.token} · block size ${bs} · layout ${doc.layout} · ${doc.dtype} (${size} B per element)` +
      (doc.head_dim ? ` · head_dim ${doc.head_dim}` : "") + (doc.kv_heads ? ` · ${doc.kv_heads} KV head(s)` : "") + ` · KV head ${doc.head}`;
    const steps = el("dl", { id: "steps" });
    const add = (k, v, id, extra) => { steps.append(el("dt", { text: k }), el("dd", Object.assign({ id, text: v }, extra || {}))); };
    add("1 · logical block, offset", `${doc.token} // ${bs} = ${lb},   ${doc.token} % ${bs} = ${off}`, "d-logical");
    add("2 · block table", `block_table[${lb}] = ${phys}   (table ${table.length <= 32 ? "[" + table.join(", ") + "]" : `of ${table.length} entries`})`, "d-physical");
    add("3 · slot", `${phys} × ${bs} + ${off} = ${doc.slot}   (slot ${off} of physical block ${phys})`, "d-slot");
    for (const which of ["key", "value"]) {
      const a = doc[which];
      add(`4 · ${which}`, `element ${int(a.element_offset)} = byte ${int(a.byte_offset)}` + (a.buffer ? ` of the ${a.buffer} buffer` : "") +
        (a.contiguous ? `: ${a.chunks[0].elements} elements in one run` : `: ${a.chunks.length} runs` + (a.chunk_stride_elements ? ` ${int(a.chunk_stride_elements)} elements apart` : "")),
        `d-${which}`, { "data-element": a.element_offset, "data-byte": a.byte_offset });
    }
    const picture = el("div", { class: "panel", id: "picture" });
    app.replaceChildren(
      el("p", { text: "One token through the paged cache: the block table gives its physical block, the block and offset give its slot, and the cache's layout gives the element and byte where its key and value vectors start (and the runs they lie in)." }),
      legend([["var(--trace)", "orange, thick black outline: this token's logical block, table entry, physical block and slot"],
              ["var(--seq)", "sky blue: a block of this sequence's table"], ["var(--free)", "light grey: a block the table does not use"],
              ["var(--used)", "blue: the elements of the vector (its runs)"]]),
      el("div", { class: "grid" },
        el("section", { "aria-label": "the four steps" }, el("h2", { text: "The four steps" }), el("div", { class: "panel", id: "detail" }, steps),
          el("h2", { text: "Block table, pool, slot" }), picture),
        el("section", { "aria-label": "the key's and the value's address" }, ...["key", "value"].map((w) => addressBox(w, doc[w], size)))));

    // the picture: logical blocks over the table, the pool, the block slot by slot
    const cw = 38, ch = 22, gap = 2, perRow = picture.clientWidth && picture.clientWidth < 520 ? 8 : 16, W = perRow * (cw + gap);
    const svg = sv("svg", { role: "img", "aria-label": `token ${doc.token}: logical block ${lb}, physical block ${phys}, slot ${off}` });
    let y = 14;
    const from = table.length <= 64 ? 0 : Math.max(0, Math.min(table.length - 64, lb - 32)), to = Math.min(table.length, from + 64);
    svg.append(sv("text", { x: 0, y, class: "title" }, `logical blocks and the block table${from > 0 || to < table.length ? `, blocks ${from} to ${to - 1} of ${table.length}` : ""}`));
    y += 6;
    let a = null;
    for (let l = from; l < to; l++) {
      const i = l - from, x = (i % perRow) * (cw + gap), yy = y + Math.floor(i / perRow) * (2 * ch + 10), on = l === lb;
      svg.append(sv("rect", { x, y: yy, width: cw, height: ch, class: "cell lblock" + (on ? " on" : ""), fill: "#fff", "data-logical": l }));
      svg.append(sv("text", { x: x + 4, y: yy + 15 }, `L${l}`));
      svg.append(sv("rect", { x, y: yy + ch, width: cw, height: ch, class: "cell tentry" + (on ? " on" : ""), fill: "var(--seq)", "data-logical": l }));
      svg.append(sv("text", { x: x + 4, y: yy + ch + 15 }, `${table[l]}`));
      if (on) a = [x + cw / 2, yy + 2 * ch];
    }
    y += Math.ceil((to - from) / perRow) * (2 * ch + 10) + 22;
    const N = Math.min(numBlocks, MAX_POOL), small = N > 256;
    const pcols = small ? 4 * perRow : perRow, pc = small ? Math.floor(W / pcols) - gap : cw, ph = small ? pc : ch;
    // a pool too large to draw whole: the window of blocks around the physical block
    const pfrom = numBlocks <= MAX_POOL ? 0 : Math.max(0, Math.min(numBlocks - N, phys - N / 2));
    svg.append(sv("text", { x: 0, y, class: "title" }, `the pool: ${int(numBlocks)} physical blocks${N < numBlocks ? ` (blocks ${int(pfrom)} to ${int(pfrom + N - 1)} drawn)` : ""}`));
    y += 6;
    const mine = new Set(table);
    let b = null;
    for (let i = 0; i < N; i++) {
      const p = pfrom + i, x = (i % pcols) * (pc + gap), yy = y + Math.floor(i / pcols) * (ph + gap);
      const r = sv("rect", { x, y: yy, width: pc, height: ph, class: "cell pool" + (p === phys ? " on" : ""), fill: mine.has(p) ? "var(--seq)" : "var(--free)", "data-block": p });
      r.append(sv("title", {}, `physical block ${p}${mine.has(p) ? ": in the table" : ""}`));
      svg.append(r);
      if (!small) svg.append(sv("text", { x: x + 4, y: yy + 15, "pointer-events": "none" }, `${p}`));
      if (p === phys) b = [x + pc / 2, yy];
    }
    y += Math.ceil(N / pcols) * (ph + gap) + 24;
    svg.append(sv("text", { x: 0, y, class: "title" }, `physical block ${phys}, slot by slot`));
    y += 6;
    const slotTop = y;
    for (let s = 0; s < bs; s++) {
      const x = (s % perRow) * (cw + gap), yy = slotTop + Math.floor(s / perRow) * (ch + gap);
      svg.append(sv("rect", { x, y: yy, width: cw, height: ch, class: "cell slot" + (s === off ? " on" : ""), fill: "var(--seq)", "data-block": phys, "data-slot": s }));
      svg.append(sv("text", { x: x + 3, y: yy + 15 }, `${lb * bs + s}`));
    }
    const sx = (off % perRow) * (cw + gap) + cw / 2, sy = slotTop + Math.floor(off / perRow) * (ch + gap);
    if (a && b) svg.insertBefore(sv("path", { d: `M${a[0]},${a[1]} L${b[0]},${b[1]} M${b[0]},${b[1] + ph} L${sx},${sy}`, class: "path", "data-path": "token" }), svg.firstChild);
    y = slotTop + Math.ceil(bs / perRow) * (ch + gap) + 8;
    svg.setAttribute("viewBox", `-2 0 ${W + 4} ${y}`);
    picture.replaceChildren(svg);
  }

  const MAX_RUNS = 64; // runs listed (and drawn) per vector
  function addressBox(which, a, size) {
    // element = sum over the layout's factors of index × stride (the factors in the layout's shown order)
    const terms = a.axes.map((axis, i) => [axis, a.shape[i], a.strides[i], a.index[i]]);
    const sum = terms.reduce((n, t) => n + t[2] * t[3], 0);
    const rows = terms.map(([axis, n, stride, i]) => el("tr", {}, el("td", { style: "text-align:left", text: axis }), el("td", { text: int(n) }), el("td", { text: int(stride) }),
      el("td", { text: int(i) }), el("td", { text: int(i * stride) })));
    const factors = el("table", { class: "factors", id: `${which}-factors` },
      el("caption", { class: "visually-hidden", text: `${which}: the layout's factors` }),
      el("thead", {}, el("tr", {}, ...["factor", "size", "stride", "index", "index × stride"].map((t) => el("th", { scope: "col", text: t })))),
      el("tbody", {}, ...rows));
    const equal = sum === a.element_offset;
    // the vector's span in the buffer, its runs marked: a tiled or split layout scatters one vector
    const first = a.chunks[0].element_offset, lastRun = a.chunks[a.chunks.length - 1];
    const last = Math.max(...a.chunks.map((c) => c.element_offset + c.elements - 1));
    const span = last - first + 1, W = 640;
    const strip = sv("svg", { viewBox: `0 0 ${W} 34`, role: "img", "aria-label": `${which}: ${a.chunks.length} run(s) over elements ${first} to ${last}` });
    strip.append(sv("rect", { x: 0, y: 4, width: W, height: 18, fill: "var(--free)", stroke: "#333", "stroke-width": 0.5 }));
    for (const c of a.chunks.slice(0, 1024)) {
      const x = (W * (c.element_offset - first)) / span;
      strip.append(sv("rect", { x, y: 4, width: Math.max(1.5, (W * c.elements) / span), height: 18, fill: "var(--used)", class: "run", "data-element": c.element_offset }));
    }
    strip.append(sv("text", { x: 0, y: 33 }, `element ${int(first)}`));
    strip.append(sv("text", { x: W, y: 33, "text-anchor": "end" }, `element ${int(last)}`));
    const runs = a.chunks.slice(0, MAX_RUNS).map((c) => el("tr", {}, el("td", { text: `${c.first_dim}..${c.first_dim + c.elements - 1}` }), el("td", { text: int(c.elements) }),
      el("td", { text: int(c.element_offset) }), el("td", { text: int(c.byte_offset) })));
    return el("div", { class: "panel address", id: `${which}-address` },
      el("h2", { text: `${which === "key" ? "Key" : "Value"}: element ${int(a.element_offset)}, byte ${int(a.byte_offset)}` }),
      el("p", { text: (a.formula ? `${a.formula}. ` : "") + `element = the sum of index × stride over the layout's factors` + (equal ? ` = ${int(sum)}` : "") +
        `; byte = element × ${size} = ${int(a.byte_offset)}. This block's part begins at element ${int(a.block_base_element)} (byte ${int(a.block_base_byte)}).` }),
      factors,
      el("p", { text: a.contiguous ? "The vector is one run of contiguous elements:" : `The vector lies in ${a.chunks.length} runs` +
        (a.chunk_stride_elements ? `, ${int(a.chunk_stride_elements)} elements apart` : "") + ` (blue, over its span of ${int(span)} elements):` }),
      strip,
      el("div", { class: "scroll runs", tabindex: 0, "aria-label": `${which}: its runs (scroll with the arrow keys)` }, el("table", { id: `${which}-runs` },
        el("caption", { class: "visually-hidden", text: `${which}: its runs` }),
        el("thead", {}, el("tr", {}, ...["dims", "elements", "first element", "first byte"].map((t) => el("th", { scope: "col", text: t })))),
        el("tbody", {}, ...runs))),
      a.chunks.length > MAX_RUNS ? el("p", { text: `first ${MAX_RUNS} of ${a.chunks.length} runs listed; the last begins at element ${int(lastRun.element_offset)}` }) : null);
  }

  window.pagetrace = { doc: DOC };
  if (KIND === "run") tokenPage(runModel(DOC));
  else if (KIND === "replay") tokenPage(replayModel(DOC));
  else if (KIND === "simulate") simulatePage(DOC);
  else if (KIND === "lookup") lookupPage(DOC);
  document.body.dataset.ready = "1";
})();
