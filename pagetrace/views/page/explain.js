// explain.js: a short "what am I looking at" for each page, with this page's own numbers.
function explainBox(id, summary) {
  const body = el("div", { id: `${id}-body` });
  return [el("details", { class: "explain panel", id, open: "" }, el("summary", { text: summary }), body), body];
}

// run and replay: the two-level lookup of the selected token, then where the query and the output are
function explainToken(body, m, q, row, t, headDim) {
  if (row === null && (t === null || t === undefined)) {
    body.replaceChildren(el("p", { text: "A paged KV cache keeps each sequence's keys and values in fixed-size blocks scattered over one pool. " +
      "A block table maps the sequence's logical blocks (0, 1, 2, …) to physical blocks. Pick a token to follow it." }));
    return;
  }
  const bs = m.blockSize, lb = Math.floor(t / bs), off = t % bs, phys = q.table[lb];
  const parts = [
    `Token ${t} of ${q.name}: its keys and values are not stored next to its neighbours' but in a block of ${bs} slots. ` +
    `Two lookups find them: logical block = ${t} // ${bs} = ${lb}, offset = ${t} % ${bs} = ${off}; then the block table says ` +
    `block_table[${lb}] = ${phys}, so the token sits in slot ${off} of physical block ${phys} (pool slot ${phys} × ${bs} + ${off} = ${phys * bs + off}).`,
    `The query is the sequence's new token (${q.note.replace(/^query: /, "")}); its vector q meets every key k it may see: ` +
    `score = q·k/√d with d = ${headDim ?? "head_dim"}, a softmax over the scores gives the weights (the table's last columns), and the output is ` +
    `the weighted sum of the values. Nothing is copied into one contiguous tensor: the kernel walks the block table.`,
  ];
  body.replaceChildren(...parts.map((text) => el("p", { text })));
}

function explainLookup(doc) {
  const [box, body] = explainBox("explain", "What am I looking at?");
  const bs = doc.block_size, a = doc.key;
  body.append(el("p", { text: `A paged KV cache stores token ${doc.token}'s key and value in block ${doc.physical_block} of the pool, not at position ${doc.token} of one long array. ` +
    `Step 1: logical block ${doc.token} // ${bs} = ${doc.logical_block}, offset ${doc.token} % ${bs} = ${doc.offset}. Step 2: the block table maps logical block ${doc.logical_block} ` +
    `to physical block ${doc.physical_block}. Step 3: slot = ${doc.physical_block} × ${bs} + ${doc.offset} = ${doc.slot}. Step 4: the cache's layout (${doc.layout}) turns ` +
    `(block, head, slot, dim) into an element offset: element = Σ index × stride over its factors; for dim 0 of the key that is element ${int(a.element_offset)}, byte ${int(a.byte_offset)}.` }),
    el("p", { text: a.contiguous ? "Here the key vector is one contiguous run." : `Here the key vector is scattered: ${a.chunks.length} runs` +
      (a.chunk_stride_elements ? `, ${int(a.chunk_stride_elements)} elements apart` : "") + " (the grid below shows where every element of the block lives)." }));
  return box;
}

function explainSimulate() {
  const [box, body] = explainBox("explain", "What am I looking at?");
  body.append(el("p", { text: "A serving engine's block manager, simulated without a model: each request's KV cache lives in fixed-size blocks of one pool, " +
    "its block table lists them. A block is used while some request's table holds it, shared when several do (a common prompt prefix), " +
    "cached when no table holds it but it still carries its prefix hash, so a later request with the same prefix takes it back instead of " +
    "recomputing it (a prefix-cache hit); a cached block is evicted when the pool hands it out again. When the pool runs out, a running request is " +
    "preempted: its blocks are freed and it is recomputed later." }));
  return box;
}
