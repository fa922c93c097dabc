// lookup.js: the lookup page: one token's four steps, down to the element and byte.
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
      el("section", { "aria-label": "the key's and the value's address" }, ...["key", "value"].map((w) => addressBox(w, doc[w], size)))),
    ...["key", "value"].map((w) => cuteGrid(doc, w)).filter(Boolean));
  app.prepend(explainLookup(doc));

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
  const small = numBlocks > 256;
  const pcols = small ? 4 * perRow : perRow, pc = small ? Math.floor(W / pcols) - gap : cw, ph = small ? pc : ch;
  // a pool too large to draw whole: the window of blocks around the physical block
  const win = poolWindow(numBlocks, phys, pcols), N = win.n, pfrom = win.from;
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
    // a slot past the sequence's last token (--seq-len) holds nothing yet
    const used = doc.seq_len === null || doc.seq_len === undefined || lb * bs + s < doc.seq_len;
    svg.append(sv("rect", { x, y: yy, width: cw, height: ch, class: "cell slot" + (s === off ? " on" : "") + (used ? "" : " empty"), fill: used ? "var(--seq)" : "#fff",
      "data-block": phys, "data-slot": s, "aria-label": `slot ${s}${used ? `: token ${lb * bs + s}` : ": empty"}` }));
    svg.append(sv("text", { x: x + 3, y: yy + 15 }, used ? `${lb * bs + s}` : "·"));
  }
  const sx = (off % perRow) * (cw + gap) + cw / 2, sy = slotTop + Math.floor(off / perRow) * (ch + gap);
  if (a && b) svg.insertBefore(sv("path", { d: `M${a[0]},${a[1]} L${b[0]},${b[1]} M${b[0]},${b[1] + ph} L${sx},${sy}`, class: "path", "data-path": "token" }), svg.firstChild);
  y = slotTop + Math.ceil(bs / perRow) * (ch + gap) + 8;
  svg.setAttribute("viewBox", `-2 0 ${W + 4} ${y}`);
  picture.replaceChildren(svg);
}

// The block's memory for one vector kind, in the manner of CuTe's layout pictures: a cell per (slot, dim), holding the
// element's offset from the block's first element, by the layout's own factors (axis names as --json gives them:
// "slot", "dim", "dim/x" and "dim%x" for a split axis, "kv" for key 0 / value 1). Cells of one contiguous run share a shade.
const CUTE_SLOTS = 32, CUTE_DIMS = 64;
function cuteGrid(doc, which) {
  const a = doc[which], bs = doc.block_size, hd = doc.head_dim;
  if (!hd || a.contiguous) return null;
  const shapeOf = new Map(a.axes.map((x, i) => [x, a.shape[i]]));
  const base = { block: doc.physical_block, head: doc.head, kv: which === "value" ? 1 : 0 };
  function offset(slot, dim) {
    const v = { slot, dim, ...base };
    let e = 0;
    a.axes.forEach((axis, i) => {
      let x;
      const m = axis.match(/^(\w+)([/%])(\w+)$/);
      if (!m) x = v[axis] ?? 0;
      else {
        const by = /^\d+$/.test(m[3]) ? +m[3] : m[2] === "/" ? shapeOf.get(`${m[1]}%${m[3]}`) : a.shape[i];
        x = m[2] === "/" ? Math.floor(v[m[1]] / by) : v[m[1]] % by;
      }
      e += x * a.strides[i];
    });
    return e;
  }
  if (offset(doc.offset, 0) !== a.element_offset) return null; // factors this page reads otherwise: no grid rather than a wrong one
  const slots = Math.min(bs, CUTE_SLOTS), dims = Math.min(hd, CUTE_DIMS), run = a.chunks[0].elements;
  const body = el("tbody", {});
  for (let s = 0; s < slots; s++) {
    const tr = el("tr", { class: s === doc.offset ? "on" : null }, el("th", { scope: "row", text: `slot ${s}` }));
    for (let d = 0; d < dims; d++) {
      const e = offset(s, d) - a.block_base_element;
      tr.append(el("td", { class: `run${Math.floor(e / run) % 2}` + (s === doc.offset && d === 0 ? " on" : ""), text: e,
        title: `(slot ${s}, dim ${d}) → element ${int(e + a.block_base_element)}`, "data-slot": s, "data-dim": d, "data-element": e + a.block_base_element }));
    }
    body.append(tr);
  }
  const head = el("thead", {}, el("tr", {}, el("th", { text: "" }), ...Array.from({ length: dims }, (_, d) => el("th", { scope: "col", text: `d${d}` }))));
  const formula = `(${a.axes.join(", ")}) = (${a.shape.join(", ")}) : (${a.strides.join(", ")})`;
  return el("div", { class: "panel cute", id: `${which}-cute` },
    el("h2", { text: `The ${which}s of block ${doc.physical_block}, element by element` }),
    el("p", { text: `Each cell is (slot, dim) → the element's offset from the block's first ${which} element (${int(a.block_base_element)}); ` +
      `the layout as shape : stride, outermost factor first (CuTe writes its modes the other way, fastest first): ${formula}. ` +
      `Cells of one contiguous run share a shade; token ${doc.token}'s row (slot ${doc.offset}) is outlined.` +
      (slots < bs || dims < hd ? ` The first ${slots} slots and ${dims} dims are drawn.` : "") }),
    el("div", { class: "scroll", tabindex: 0, "aria-label": `${which}: the block's elements (scroll with the arrow keys)` },
      el("table", {}, el("caption", { class: "visually-hidden", text: `${which}: the block's elements by slot and dim` }), head, body)));
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
