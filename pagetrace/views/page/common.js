// common.js: the page's shared helpers: the document, elements, SVG, numbers, legends.
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
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (typeof v === "function" && k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  if (text !== undefined) e.textContent = text;
  return e;
}
const fmt = (x, d = 4) => (x === null || x === undefined ? "n/a" : Number(x).toFixed(d));
// a weight: four decimals, or three significant digits where four decimals would print 0.0000 (a long sequence's weights)
const fmtWeight = (x) => (x === null || x === undefined ? "n/a" : x !== 0 && Math.abs(x) < 5e-4 ? Number(x).toExponential(2) : Number(x).toFixed(4));
const int = (x) => (x === null || x === undefined ? "n/a" : Number(x).toLocaleString("en-US"));
function legend(items) {
  return el("ul", { class: "legend", "aria-label": "what the colours mean" },
    ...items.map(([colour, words, extra]) => el("li", {}, el("span", { class: "swatch", style: `background:${colour};${extra || ""}` }), words)));
}

const MAX_POOL = 4096; // pool cells drawn at once; a larger pool is drawn as the window around the block in question

// The pool's window: all of it, or MAX_POOL blocks around `centre`, starting at a row's first column.
function poolWindow(numBlocks, centre, cols) {
  if (numBlocks <= MAX_POOL) return { from: 0, n: numBlocks };
  // rows begin at multiples of `cols`; the last window may be shorter, so that it still ends at the pool's last block
  const want = Math.max(0, Math.round(centre || 0) - MAX_POOL / 2), last = Math.ceil((numBlocks - MAX_POOL) / cols) * cols;
  const from = Math.min(want - (want % cols), last);
  return { from, n: Math.min(MAX_POOL, numBlocks - from) };
}

// One Tab stop for a grid of cells (a roving tabindex): the arrow keys move by a cell or a row,
// Page Up/Down by eight rows, Home/End to the ends; each move (and a click, Enter or Space) picks the cell.
// The listeners sit on `box` (one each, however many cells), which must hold no other grid.
function rovingGrid(box, cells, cols, stop, onPick) {
  let now = stop;
  cells.forEach((c, i) => { c.tabIndex = i === stop ? 0 : -1; c.dataset.cell = i; });
  const of = (ev) => { const c = ev.target.closest ? ev.target.closest("[data-cell]") : null; return c && cells[+c.dataset.cell] === c ? +c.dataset.cell : null; };
  box.addEventListener("click", (ev) => { const i = of(ev); if (i !== null) { move(i); onPick(i); } });
  box.addEventListener("keydown", (ev) => {
    const i = of(ev);
    if (i === null) return;
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, PageDown: 8 * cols, PageUp: -8 * cols }[ev.key];
    let j = null;
    if (step) j = Math.max(0, Math.min(cells.length - 1, i + step));
    else if (ev.key === "Home") j = 0;
    else if (ev.key === "End") j = cells.length - 1;
    else if (ev.key === "Enter" || ev.key === " ") j = i;
    if (j === null) return;
    ev.preventDefault();
    move(j);
    onPick(j);
  });
  function move(j) {
    if (cells[now]) cells[now].tabIndex = -1;
    now = j;
    cells[j].tabIndex = 0;
    cells[j].focus();
  }
}

// A strip over the whole of a large pool, `bins` cells of equal share, each shaded by how many of its blocks
// `count(from, to)` says are in use; the drawn window outlined. Click a cell: `onPick(block)` (its first block).
function poolOverview(numBlocks, win, count, onPick, W, y, words) {
  const bins = Math.min(256, numBlocks), per = numBlocks / bins, bw = W / bins, g = sv("g", { class: "overview", "data-bins": bins });
  g.append(sv("text", { x: 0, y, class: "title" }, words));
  y += 4;
  for (let i = 0; i < bins; i++) {
    const a = Math.floor(i * per), b = Math.floor((i + 1) * per), share = count(a, b) / Math.max(1, b - a);
    const r = sv("rect", { x: i * bw, y, width: bw + 0.3, height: 14, fill: share ? "var(--seq)" : "var(--free)", "fill-opacity": share ? 0.25 + 0.75 * share : 1, "data-first": a });
    r.append(sv("title", {}, `blocks ${int(a)} to ${int(b - 1)}: ${Math.round(100 * share)}% in use; click to draw them`));
    r.addEventListener("click", () => onPick(a));
    g.append(r);
  }
  g.append(sv("rect", { x: (W * win.from) / numBlocks, y: y - 1, width: Math.max(2, (W * win.n) / numBlocks), height: 16, class: "window", fill: "none" }));
  return [g, y + 16];
}
