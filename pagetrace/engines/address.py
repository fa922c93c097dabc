"""`lookup --from BUNDLE`: one token of a captured request, down to the byte of that
engine's cache, through the same layout arithmetic as `lookup`. Plain Python and NumPy: no torch."""

from __future__ import annotations

from ..errors import RuntimeFailure, UsageError
from ..paging.blocks import locate
from ..paging.layouts import runs_text, vector_address
from ..paging.lookup import address_json
from .bundle import read_manifest, read_step, step_for_request


def bundle_lookup(path: str, request: str, token: int, step: int | None = None, head: int = 0, note=None) -> dict:
    """One token's address in the engine's cache. Without `step`: the first step that holds the
    request (`note`, when given, is told which steps hold it if that is not the bundle's first)."""
    manifest = read_manifest(path)
    st = read_step(path, manifest, step_for_request(manifest, step, request, note))
    r = st.request_index(request)
    n = st.seq_lens[r]
    if not 0 <= token < n:
        raise UsageError("--token", token, f"request {st.requests[r]} holds tokens 0..{n - 1} in step {st.step}")
    if not 0 <= head < manifest.num_kv_heads:
        raise UsageError("--head", head, f"the cache has KV heads 0..{manifest.num_kv_heads - 1}")
    bs = manifest.block_size
    table = st.block_table[r][: -(-n // bs)]
    loc = locate(token, table, bs)
    here = violations_at(manifest, st, r, token)
    if not 0 <= loc.physical_block < manifest.num_blocks:  # an address outside the cache is no answer
        named = "".join(f"; {v.check} violation: {v.message}" for v in here)
        raise RuntimeFailure(
            f"request {st.requests[r]} token {token}: block_table[{loc.logical_block}] = {loc.physical_block} is outside "
            f"the pool of {manifest.num_blocks} blocks in step {st.step}{named}; `pagetrace check {path} --step {st.step}` lists every violation"
        )
    geom = manifest.geometry()

    def address(which: str) -> dict:
        addr = vector_address(geom, which, loc.physical_block, loc.offset, head)
        return {
            "which": which,
            "buffer": manifest.layout.buffer(which),
            "formula": geom.formula(which),
            "element_size": geom.element_size,
            **address_json(addr),
            "last_byte": addr.last_element_offset * geom.element_size + geom.element_size - 1,
        }

    return {
        "bundle": str(path),
        "engine": manifest.engine,
        "step": st.step,
        "request": st.requests[r],
        "token": token,
        "seq_len": n,
        "block_table": table,
        "block_size": bs,
        "num_blocks": manifest.num_blocks,
        "logical_block": loc.logical_block,
        "offset": loc.offset,
        "physical_block": loc.physical_block,
        "slot": loc.slot,
        "layout": manifest.layout.name,
        "raw_shape": list(geom.raw_shape()),
        "dtype": manifest.dtype,
        "head": head,
        "key": address("key"),
        "value": address("value"),
        "violations": [v.to_json() for v in here],
        **({"guard": st.guard} if st.guard else {}),
    }


def violations_at(manifest, st, r: int, token: int) -> list:
    """`check`'s index violations of the step at this request's token: at the token itself, or
    at the table entry (logical block) that holds it."""
    from .check import Checker

    checker = Checker(manifest, st)
    checker.run()
    name, logical = st.requests[r], token // manifest.block_size
    return [v for v in checker.found if v.request == name and (v.token == token or (v.logical_block == logical and v.check in ("pool", "null", "stored", "sharing")))]


def render_bundle_lookup(doc: dict) -> str:
    lines = [
        f"{doc['engine'].get('name')} request {doc['request']} token {doc['token']} (step {doc['step']}, {doc['seq_len']} tokens) · "
        f"layout {doc['layout']} {doc['raw_shape']} · {doc['dtype']}",
        f" 1  logical block = {doc['token']} // {doc['block_size']} = {doc['logical_block']}    offset = {doc['token']} % {doc['block_size']} = {doc['offset']}",
        f" 2  physical block = block_table[{doc['logical_block']}] = {doc['physical_block']}    (table {doc['block_table']})",
        f" 3  slot = {doc['physical_block']} x {doc['block_size']} + {doc['offset']} = {doc['slot']}",
    ]
    for which in ("key", "value"):
        a = doc[which]
        how = runs_text([(c["element_offset"], c["elements"]) for c in a["chunks"]], a["element_size"])
        lines.append(
            f"    {which} (KV head {doc['head']}) at element {a['element_offset']} = byte {a['byte_offset']} of the {a['buffer']} buffer; "
            f"{a['formula']}; {how}"
        )
    for v in doc.get("violations", []):
        lines.append(f"    {v['check']} violation at this token (step {doc['step']}): {v['message']}")
    return "\n".join(lines)
