"""The one layout table, held to properties no entry can fake and to formulas written out here.

- every layout puts each (which, block, slot, head, dim) on its own element, and together
  they cover the buffer exactly (a bijection), for random dims and every dtype;
- `where`'s decoding inverts `lookup`'s offsets for every layout, tiled ones included;
- vLLM's CPU amx pages against the formula from csrc/cpu/cpu_attn_amx.hpp, written out here
  independently of the factor notation (so the entry is checked on machines where vLLM's
  amx writer cannot run);
- the probe learns a layout from a writer written here in plain torch, and refuses a writer
  no entry explains, naming the element;
- the layout table in docs/layouts.md is the table.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pagetrace.errors import UsageError
from pagetrace.paging.layouts import AXES, LAYOUTS, CacheGeometry, check_factors, make_geometry, table_markdown, vector_address
from pagetrace.paging.where import where_byte

ROOT = Path(__file__).resolve().parents[2]
SIZES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}


def fitting_geometry(name: str, dtype: str, data) -> CacheGeometry:
    """Random dims that the layout's splits accept: block size and head_dim multiples of 16
    for the tiled entry, head_dim a multiple of x for vLLM's split key."""
    lay = LAYOUTS[name]
    unit_s = 16 if lay.tiled else 1
    unit_d = 16 if lay.tiled else (16 // SIZES[dtype] if "dim%x" in lay.key else 1)
    return make_geometry(
        name, data.draw(st.integers(1, 4)), unit_s * data.draw(st.integers(1, 3 if lay.tiled else 9)),
        1 if lay.single_head else data.draw(st.integers(1, 3)), unit_d * data.draw(st.integers(1, 3 if unit_d > 1 else 12)), dtype,
    )


def all_offsets(geom: CacheGeometry, which: str) -> np.ndarray:
    b, s, h, d = np.meshgrid(*(np.arange(n) for n in (geom.num_blocks, geom.block_size, geom.num_kv_heads, geom.head_dim)), indexing="ij")
    return np.asarray(geom.element(which, b, s, h, d)).reshape(-1)


@settings(max_examples=120, deadline=None)
@given(name=st.sampled_from(sorted(LAYOUTS)), dtype=st.sampled_from(sorted(SIZES)), data=st.data())
def test_every_layout_is_a_bijection_onto_its_buffer(name, dtype, data):
    geom = fitting_geometry(name, dtype, data)
    k, v = all_offsets(geom, "key"), all_offsets(geom, "value")
    per_cache = geom.num_blocks * geom.block_size * geom.num_kv_heads * geom.head_dim
    assert len(np.unique(k)) == len(k) == per_cache and len(np.unique(v)) == per_cache
    if geom.layout.combined:  # K and V share the buffer: together they are every element once
        assert geom.numel("key") == geom.numel("value") == 2 * per_cache
        assert np.array_equal(np.sort(np.concatenate([k, v])), np.arange(2 * per_cache))
    else:
        assert np.array_equal(np.sort(k), np.arange(geom.numel("key"))) and np.array_equal(np.sort(v), np.arange(geom.numel("value")))
    n = 1
    for size in geom.raw_shape():
        n *= size
    assert n == geom.numel("key")  # the engine's shape holds the same elements


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(LAYOUTS)), dtype=st.sampled_from(sorted(SIZES)), data=st.data())
def test_where_inverts_lookup_for_every_layout(name, dtype, data):
    geom = fitting_geometry(name, dtype, data)
    block, slot = data.draw(st.integers(0, geom.num_blocks - 1)), data.draw(st.integers(0, geom.block_size - 1))
    head = data.draw(st.integers(0, geom.num_kv_heads - 1))
    for which in ("key", "value"):
        addr = vector_address(geom, which, block, slot, head)
        assert sum(c.elements for c in addr.chunks) == geom.head_dim
        dim = data.draw(st.integers(0, geom.head_dim - 1))
        chunk = next(c for c in addr.chunks if c.first_dim <= dim < c.first_dim + c.elements)
        element = chunk.element_offset + dim - chunk.first_dim
        assert element == geom.element(which, block, slot, head, dim)
        byte = element * geom.element_size + data.draw(st.integers(0, geom.element_size - 1))
        place = where_byte(geom, byte, None if geom.layout.combined else which, [[block]])
        assert (place.which, place.block, place.offset, place.head, place.dim) == (which, block, slot, head, dim)
        assert [(o.sequence, o.token) for o in place.owners] == [(0, slot)]


def test_each_axis_is_tiled_exactly_by_its_factors():
    """Divisors are the products of the inner sizes; the sizes multiply to the axis; the
    factors before `kv` are the same for K and V (where decodes K or V from them)."""
    for lay in LAYOUTS.values():
        geom = CacheGeometry(lay, 3, 32, 1 if lay.single_head else 2, 64, "bf16")
        check_factors(geom)
        for which in ("key", "value"):
            for axis in AXES:
                mine = sorted((f for f in geom.factors(which) if f.axis == axis), key=lambda f: f.div)
                if axis == "head" and lay.single_head:
                    continue
                reach = 1
                for f in mine:
                    assert f.div == reach, (lay.name, which, f)
                    reach *= f.size
                assert reach == geom.axis_size(axis), (lay.name, which, axis)
        if lay.combined:
            cut = lay.key.index("kv") + 1
            assert lay.key[:cut] == lay.value[:cut], lay.name


# vLLM's amx pages, from csrc/cpu/cpu_attn_amx.hpp (issue 17 gives the same): page = (b*H + h) * 2*bs*D,
# p = 4 / element size; K in groups of 16 slots, each group D/p rows of 16 dword pairs; V after the
# bs*D keys, in groups of 16 dims, each bs/p rows of 16 slot pairs.
def amx_by_hand(b, s, h, d, H, bs, D, size):
    p = 4 // size
    page = (b * H + h) * 2 * bs * D
    key = page + (s // 16) * 16 * D + (d // p) * 16 * p + (s % 16) * p + d % p
    value = page + bs * D + (d // 16) * 16 * bs + (s // p) * 16 * p + (d % 16) * p + s % p
    return key, value


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("bs, H, D", [(32, 2, 32), (64, 1, 64), (16, 3, 128), (32, 4, 16)])
def test_amx_entry_is_the_writers_formula(dtype, bs, H, D):
    geom = make_geometry("vllm-cpu-amx", 3, bs, H, D, dtype)
    b, s, h, d = np.meshgrid(np.arange(3), np.arange(bs), np.arange(H), np.arange(D), indexing="ij")
    want_k, want_v = amx_by_hand(b, s, h, d, H, bs, D, SIZES[dtype])
    assert np.array_equal(geom.element("key", b, s, h, d), want_k)
    assert np.array_equal(geom.element("value", b, s, h, d), want_v)
    # what lookup prints for the bf16 key of (block 2, slot 17, head 0): runs of p elements, 16p apart
    addr = vector_address(geom, "key", 2, 17, 0)
    p = 4 // SIZES[dtype]
    assert [(c.first_dim, c.elements) for c in addr.chunks[:2]] == [(0, p), (p, p)] and addr.chunk_stride == 16 * p


@pytest.mark.parametrize("bs, D, option", [(8, 32, "--block-size"), (24, 32, "--block-size"), (32, 8, "--head-dim")])
def test_amx_refuses_dims_its_tiles_cannot_hold(bs, D, option):
    with pytest.raises(UsageError) as err:
        make_geometry("vllm-cpu-amx", 3, bs, 2, D, "bf16")
    assert err.value.option == option and "vllm-cpu-amx" in err.value.reason


def test_the_formula_is_cute_shape_and_stride():
    geom = make_geometry("vllm-cpu-amx", 4, 32, 2, 64, "bf16")
    assert geom.formula("key") == "block:4:8192  slot:(16,2):(2,1024)  head:2:4096  dim:(2,32):(1,32)  + 0"
    assert geom.formula("value") == "block:4:8192  slot:(2,16):(1,32)  head:2:4096  dim:(16,4):(2,512)  + 2048"
    assert make_geometry("vllm", 4, 16, 2, 16, "fp16").formula("key") == "block:4:512  slot:16:8  head:2:256  dim:(8,2):(1,128)  + 0"
    assert geom.affine("key") is None and make_geometry("vllm-cpu", 4, 32, 2, 64, "bf16").affine("key") == ((8192, 1, 4096, 32), 0)


def tagged_writer(layout: str, shift: tuple[int, int] | None = None, value_col_major: bool = False, key_dims_reversed: bool = False):
    """A cache writer in plain torch that lays K/V out as `layout` would, written from the
    vec formula (K at d*bs + s, V after the keys at s*D + d). Planted faults: `shift` swaps the
    key of (slot 0, dim 0) with another element; `value_col_major` writes V like K;
    `key_dims_reversed` writes key dim d where dim D-1-d belongs."""
    def write(key, value, kv_cache, slot_mapping):
        n, h, bs, d2 = kv_cache.shape
        d = d2 // 2
        page = kv_cache.view(n, h, 2 * bs * d)
        dims = torch.arange(d)
        for t, slot in enumerate(slot_mapping.tolist()):
            b, s = divmod(slot, bs)
            for hh in range(h):
                page[b, hh, (dims.flip(0) if key_dims_reversed else dims) * bs + s] = key[t, hh]
                page[b, hh, bs * d + (dims * bs + s if value_col_major else s * d + dims)] = value[t, hh]
        if shift is not None:
            flat = kv_cache.view(-1)
            a, b_ = shift
            flat[a], flat[b_] = flat[b_].clone(), flat[a].clone()

    return write


def test_probe_learns_the_layout_a_writer_uses():
    from pagetrace.engines.probe import learn_layout

    scratch = torch.empty(3, 2, 16, 2 * 16, dtype=torch.bfloat16)
    found = learn_layout(tagged_writer("vllm-cpu"), scratch, lambda t: t, block_size=16, num_kv_heads=2, head_dim=16, dtype="bf16",
                         expected=None, writer="test writer")
    assert found.layout == "vllm-cpu" and found.explained_by == ["vllm-cpu"] and found.elements == 2 * 3 * 16 * 2 * 16
    assert "vllm-cpu-amx" in found.misses and "vllm-hnd" in found.misses


def test_probe_refuses_a_writer_no_layout_explains_and_names_the_element():
    from pagetrace.engines.probe import ProbeRefused, learn_layout

    scratch = torch.empty(3, 2, 16, 2 * 8, dtype=torch.bfloat16)
    with pytest.raises(ProbeRefused) as err:  # key (block 0, slot 0, head 0, dim 0) moved to element 5
        learn_layout(tagged_writer("vllm-cpu", shift=(0, 5)), scratch, lambda t: t, block_size=16, num_kv_heads=2, head_dim=8, dtype="bf16",
                     expected="vllm-cpu", writer="test writer", isa="vec")
    message = str(err.value)
    assert "test writer (isa vec)" in message and "Capture refused" in message
    assert "key (block 0, slot 0, head 0, dim 0): the 'vllm-cpu' layout puts it at element 0; the writer put it at element 5" in message


@pytest.mark.parametrize("fault, first", [
    ({"value_col_major": True}, "value (block 0, slot 0, head 0, dim 1): the 'vllm-cpu' layout puts it at element 257"),
    ({"key_dims_reversed": True}, "key (block 0, slot 0, head 0, dim 0): the 'vllm-cpu' layout puts it at element 0; the writer put it at element 240"),
])
def test_probe_holds_values_and_dims_too(fault, first):
    """A writer right about the keys but not the values, or right about slots and heads but not
    dims, is explained by no entry."""
    from pagetrace.engines.probe import ProbeRefused, learn_layout

    scratch = torch.empty(3, 2, 16, 2 * 16, dtype=torch.bfloat16)
    with pytest.raises(ProbeRefused) as err:
        learn_layout(tagged_writer("vllm-cpu", **fault), scratch, lambda t: t, block_size=16, num_kv_heads=2, head_dim=16, dtype="bf16",
                     expected="vllm-cpu", writer="test writer")
    assert first in str(err.value)


def test_the_tags_survive_bf16_for_big_dims():
    """Passes carry base-128 digits: a head_dim of 256 (two digits) still decodes exactly."""
    from pagetrace.engines.probe import read_back

    scratch = torch.empty(3, 1, 16, 2 * 256, dtype=torch.bfloat16)
    named = read_back(tagged_writer("vllm-cpu"), scratch, lambda t: t, 16, 1, 256)
    bs, d = 16, 256
    element = 0 * 2 * bs * d + 200 * bs + 5  # key of block 0, slot 5, dim 200
    assert (int(named["sign"][element]), int(named["token"][element]), int(named["dim"][element])) == (1, 5, 200)


def test_the_documented_layout_table_is_the_table():
    text = (ROOT / "docs" / "layouts.md").read_text()
    found = re.search(r"<!-- layouts:begin -->\n(.*?)<!-- layouts:end -->", text, re.S)
    assert found, "docs/layouts.md has no <!-- layouts:begin --> ... <!-- layouts:end --> section"
    assert found.group(1) == table_markdown(), "docs/layouts.md's table differs: paste `pagetrace layouts --markdown` between the markers"


def test_one_layout_table_in_the_package():
    """No second table or naming scheme: only layouts.py builds a `Layout`, and the names the
    engines' adapters and the CLI offer are the table's."""
    from pagetrace.commands.options import layout_choice

    for path in (ROOT / "pagetrace").rglob("*.py"):
        text = path.read_text()
        assert "ENGINE_LAYOUTS" not in text, path
        if path.name != "layouts.py":
            assert not re.search(r"\bLayout\(\s*\"", text), path
    assert set(layout_choice().choices) >= set(LAYOUTS)


@pytest.mark.parametrize("layout", ["vllm-cpu", "vllm-cpu-amx", "flash"])
def test_the_kernel_refuses_a_layout_it_cannot_stride_and_says_what_to_do(layout):
    import pagetrace

    q, cache = torch.zeros(1, 2, 16), torch.zeros(2, 2, 16, 32)
    with pytest.raises(UsageError) as err:
        pagetrace.paged_attention(q, cache, cache, torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), layout=layout)
    assert err.value.option == "layout" and "as_tensors" in err.value.reason


def test_as_tensors_of_amx_pages_feed_the_kernel():
    """The tiled pages read through a copy give the kernel the same answer as the same K/V in nhd."""
    import pagetrace
    from pagetrace.engines.views import as_tensors, geometry

    gen = torch.Generator().manual_seed(3)
    geom = geometry("vllm-cpu-amx", 3, 16, 2, 16, "bf16")
    raw = torch.randn(*geom.raw_shape(), generator=gen).to(torch.bfloat16)
    key, value = as_tensors(raw, "vllm-cpu-amx", 16, 2, 16)
    flat = raw.reshape(-1)
    b, s, h, d = 2, 9, 1, 5
    assert key[b, s, h, d] == flat[int(amx_by_hand(b, s, h, d, 2, 16, 16, 2)[0])] and value[b, s, h, d] == flat[int(amx_by_hand(b, s, h, d, 2, 16, 16, 2)[1])]
    q = torch.randn(1, 4, 16, generator=gen).to(torch.bfloat16)
    table, lens = torch.tensor([[2, 0]], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    got = pagetrace.paged_attention(q, key, value, table, lens, layout="nhd", backend="torch")
    k = torch.cat([key[2], key[0, :4]]).float().repeat_interleave(2, dim=1)
    v = torch.cat([value[2], value[0, :4]]).float().repeat_interleave(2, dim=1)
    w = torch.softmax(torch.einsum("hd,thd->ht", q[0].float(), k) / 4, -1)
    torch.testing.assert_close(got[0].float(), torch.einsum("ht,thd->hd", w, v), atol=2e-2, rtol=2e-2)


def test_runs_of_a_tiled_vector_are_said_as_groups():
    from pagetrace.paging.layouts import runs_text

    geom = make_geometry("vllm-cpu-amx", 16, 32, 2, 32, "bf16")
    value = vector_address(geom, "value", 7, 20, 0)
    runs = [(c.element_offset, c.elements) for c in value.chunks]
    assert runs_text(runs, 2) == (
        "32 single elements in 2 groups of 16, 2 elements (4 bytes) apart within a group, "
        "the groups 512 elements (1024 bytes) apart, at 30016, 30018, 30020, 30022, ..."
    )
    assert runs_text([(0, 8)], 2) == "contiguous, 8 elements"
    assert runs_text([(0, 1), (3, 1), (4, 1)], 4) == "3 single elements at irregular gaps (1, 3 elements), at 0, 3, 4"


# --- the probe at its edges: what a user's engine writer can do wrong, and the figures it reports


def _learn(write, scratch, raw_of=lambda t: t, *, bs=16, h=1, d=8, expected="vllm-cpu", writer="test writer", isa=None):
    from pagetrace.engines.probe import learn_layout

    return learn_layout(write, scratch, raw_of, block_size=bs, num_kv_heads=h, head_dim=d, dtype="bf16",
                        expected=expected, writer=writer, isa=isa)


@pytest.mark.parametrize("exc, reason", [
    (RuntimeError("amx needs a block size that is a multiple of 32\n  at cpu_attn.cpp:88"), "amx needs a block size that is a multiple of 32"),
    (RuntimeError("   "), "RuntimeError"),
])
def test_probe_names_a_writer_that_refuses_the_dims_by_its_first_line(exc, reason):
    from pagetrace.errors import RuntimeFailure

    def write(key, value, kv_cache, slot_mapping):
        raise exc

    with pytest.raises(RuntimeFailure) as err:
        _learn(write, torch.empty(3, 2, 16, 2 * 8, dtype=torch.bfloat16), h=2)
    assert str(err.value) == f"the engine's cache writer refused block size 16, 2 KV heads, head_dim 8: {reason}"


def test_probe_refuses_a_buffer_not_in_memory_order_naming_its_strides():
    from pagetrace.errors import RuntimeFailure

    scratch = torch.empty(3, 1, 16, 2 * 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeFailure) as err:
        _learn(tagged_writer("vllm-cpu"), scratch, lambda t: t.transpose(2, 3))
    assert str(err.value) == "the probe reads the raw buffer in memory order; this one has strides (256, 256, 1, 16)"


def test_probe_does_not_explain_a_writer_that_skips_a_pass():
    """The writer ignores its second call (the head pass: with one KV head every head digit is 0,
    so the unwritten read-back even looks right). Only the sign kept across all passes sees that
    no element was written every time."""
    from pagetrace.engines.probe import ProbeRefused

    base, calls = tagged_writer("vllm-cpu"), []

    def write(key, value, kv_cache, slot_mapping):
        calls.append(1)
        if len(calls) != 2:
            base(key, value, kv_cache, slot_mapping)

    with pytest.raises(ProbeRefused) as err:
        _learn(write, torch.empty(3, 1, 16, 2 * 8, dtype=torch.bfloat16))
    assert len(calls) == 3  # token, head, dim: one base-128 digit each
    assert "key (block 0, slot 0, head 0, dim 0): the 'vllm-cpu' layout puts it at element 0; the writer did not write it" in str(err.value)


def test_probe_finds_a_misplaced_element_past_block_0_where_the_writer_put_it():
    """Key (block 1, slot 3, dim 0) swapped with key (block 1, slot 12, dim 2): in vllm-cpu's
    page of 2 * 16 * 8 elements (one head) they sit at 256 + 0 * 16 + 3 = 259 and
    256 + 2 * 16 + 12 = 300."""
    from pagetrace.engines.probe import ProbeRefused

    with pytest.raises(ProbeRefused) as err:
        _learn(tagged_writer("vllm-cpu", shift=(259, 300)), torch.empty(3, 1, 16, 2 * 8, dtype=torch.bfloat16), isa="vec")
    message = str(err.value)
    assert message.startswith("test writer (isa vec): no layout of pagetrace's table explains where it wrote the 768 tagged elements; ")
    assert "key (block 1, slot 3, head 0, dim 0): the 'vllm-cpu' layout puts it at element 259; the writer put it at element 300" in message
    assert message.endswith(". Capture refused: a bundle would misread this cache")


def test_probe_names_a_buffer_shape_no_layout_has():
    from pagetrace.engines.probe import ProbeRefused

    with pytest.raises(ProbeRefused) as err:
        _learn(tagged_writer("vllm-cpu"), torch.empty(3, 1, 16, 2 * 8, dtype=torch.bfloat16), lambda t: t.view(3, 16, 16))
    assert "768 tagged elements; no layout of the table has the raw shape [3, 16, 16]. Capture refused" in str(err.value)


def test_probe_goes_on_past_a_layout_that_cannot_split_these_dims():
    """head_dim 4 in bf16: 'vllm' (keys split by 16 bytes, 8 elements) cannot hold it, and it comes
    before 'vllm-cpu' in the table; the probe still tries every later entry (amx cannot hold it either)."""
    found = _learn(tagged_writer("vllm-cpu"), torch.empty(3, 1, 16, 2 * 4, dtype=torch.bfloat16), d=4)
    assert (found.layout, found.explained_by, list(found.misses)) == ("vllm-cpu", ["vllm-cpu"], ["vllm-hnd"])


def test_probe_tries_only_the_combined_layouts_of_the_buffers_shape():
    """[3, 2, 32, 32] (bf16, head_dim 16) is the raw shape of vllm-hnd (K and V side by side in the
    last axis), vllm-cpu and vllm-cpu-amx; no other entry is compared, so the misses name those
    two alone, and the probe's JSON says what it did."""
    found = _learn(tagged_writer("vllm-cpu"), torch.empty(3, 2, 32, 2 * 16, dtype=torch.bfloat16), bs=32, h=2, d=16)
    assert (found.layout, found.explained_by, list(found.misses)) == ("vllm-cpu", ["vllm-cpu"], ["vllm-hnd", "vllm-cpu-amx"])
    assert found.to_json() == {"method": "writer", "writer": "test writer", "isa": None, "scratch_blocks": 3,
                               "elements": 2 * 3 * 32 * 2 * 16, "layout": "vllm-cpu", "explained_by": ["vllm-cpu"]}


@pytest.mark.parametrize("bs, h, d, passes", [
    (42, 1, 128, 3),   # 126 tokens, 1 head, 128 dims: one digit each
    (43, 1, 128, 4),   # 129 tokens: two token digits
    (16, 1, 129, 4),   # 129 dims: two dim digits
    (16, 128, 8, 3),   # exactly 128 heads: one digit
])
def test_probe_takes_one_pass_per_base_128_digit(bs, h, d, passes):
    """Each pass runs the engine's writer once: as many as the largest coordinate needs digits, no more."""
    calls = []
    base = tagged_writer("vllm-cpu")

    def write(*args):
        calls.append(1)
        base(*args)

    from pagetrace.engines.probe import read_back

    scratch = torch.empty(3, h, bs, 2 * d, dtype=torch.bfloat16)
    named = read_back(write, scratch, lambda t: t, bs, h, d)
    assert len(calls) == passes
    last = (3 * bs - 1, h - 1, d - 1)  # the value of the last token, head and dim decodes exactly
    page = h * 2 * bs * d
    v = 2 * page + (h - 1) * 2 * bs * d + bs * d + (bs - 1) * d + (d - 1)  # block 2, last slot, vec formula
    assert (int(named["sign"][v]), int(named["token"][v]), int(named["head"][v]), int(named["dim"][v])) == (-1, *last)


def test_probe_keeps_the_expected_layout_when_two_coincide():
    """At block size 1, vllm-cpu (K at d * bs + s) and vllm-hnd (K at s * 2D + d) put every element
    in the same place: both explain the write, and the layout the engine says it uses is kept (with
    none said, the first in the table)."""
    found = _learn(tagged_writer("vllm-cpu"), torch.empty(3, 2, 1, 2 * 8, dtype=torch.bfloat16), bs=1, h=2, expected="vllm-cpu")
    assert (found.layout, found.explained_by) == ("vllm-cpu", ["vllm-hnd", "vllm-cpu"])
    assert _learn(tagged_writer("vllm-cpu"), torch.empty(3, 2, 1, 2 * 8, dtype=torch.bfloat16), bs=1, h=2, expected=None).layout == "vllm-hnd"


def test_probe_refusal_without_an_isa_names_the_writer_alone():
    from pagetrace.engines.probe import ProbeRefused

    with pytest.raises(ProbeRefused) as err:
        _learn(tagged_writer("vllm-cpu", shift=(0, 5)), torch.empty(3, 1, 16, 2 * 8, dtype=torch.bfloat16))
    assert str(err.value).startswith("test writer: no layout of pagetrace's table explains where it wrote the 768 tagged elements; key (block 0, slot 0")
