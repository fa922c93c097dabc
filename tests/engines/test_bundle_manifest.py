"""The bundle loader itself (engines/bundle.py), called as the Python API calls it: every
manifest field read back, every refusal word for word (a user fixes the field the one line
names), and the boundaries a real capture reaches: one layer, one KV head, a block of one
token, a window of one token, the last layer index and one past it, a slot_mapping exactly
as long as the tokens, unsigned index tensors.

The manifest here is written out by hand (the fields of docs/engines.md); the expected
messages are typed out, not built from the loader's own format strings."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file

from pagetrace.engines.bundle import BundleError, BundleWriter, LiveBundle, Manifest, Step, read_layer, read_manifest, read_step
from pagetrace.errors import UsageError
from pagetrace.paging.layouts import LAYOUTS


def doc(**top):
    """A valid manifest: a model of 2 layers, 4 query heads on 2 KV heads of 8 dims, a bf16
    'vllm-cpu' cache of 16 blocks of 4 tokens, one step of two requests."""
    d = {
        "format": "pagetrace-capture", "version": 1,
        "engine": {"name": "vllm", "version": "0.32.0"},
        "model": {"num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8},
        "kv_cache": {"dtype": "bf16", "layout": "vllm-cpu", "block_size": 4, "num_blocks": 16, "null_block": 0,
                     "table_padding": 0, "slot_padding": -1, "sharing": "full-blocks"},
        "attention": {"scale": 0.25, "causal": True, "sliding_window": None},
        "layers": [{"index": 0, "name": "model.layers.0.attn"}, {"index": 1, "name": "model.layers.1.attn"}],
        "steps": [{"step": 3, "file": "step-0003.safetensors", "requests": ["a", "b"], "layers": [0, 1]},
                  {"step": 5, "file": "step-0005.safetensors", "requests": ["a"], "layers": [1]}],
    }
    d.update(top)
    return d


def write(folder, d) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(d) if not isinstance(d, str) else d)


def refusal(tmp_path, edit) -> str:
    """The one line read_manifest refuses the edited manifest with."""
    d = doc()
    edit(d)
    write(tmp_path / "b", d)
    with pytest.raises(BundleError) as caught:
        read_manifest(tmp_path / "b")
    text = str(caught.value)
    prefix = f"malformed bundle: {tmp_path / 'b' / 'manifest.json'}: "
    assert text.startswith(prefix), text
    return text[len(prefix):]


def test_every_manifest_field_is_read_back(tmp_path):
    d = doc()
    d["kv_cache"].update(kernel_block_size=2, k_scale=0.5, v_scale=2, null_block=7)
    d["attention"]["sliding_window"] = 9
    write(tmp_path / "b", d)
    m = read_manifest(tmp_path / "b")
    assert isinstance(m, Manifest)
    assert (m.engine, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.dtype) == ({"name": "vllm", "version": "0.32.0"}, 2, 4, 2, 8, "bf16")
    assert m.layout is LAYOUTS["vllm-cpu"]
    assert (m.block_size, m.kernel_block_size, m.num_blocks, m.null_block, m.table_padding, m.slot_padding, m.sharing) == (4, 2, 16, 7, 0, -1, "full-blocks")
    assert (m.scale, m.k_scale, m.v_scale, m.sliding_window) == (0.25, 0.5, 2.0, 9)
    assert type(m.v_scale) is float and type(m.k_scale) is float
    assert m.layers == {0: "model.layers.0.attn", 1: "model.layers.1.attn"}
    assert m.steps == d["steps"]
    assert m.element_size == 2


def test_the_optional_fields_take_their_defaults(tmp_path):
    d = doc()
    del d["kv_cache"]["null_block"]  # absent: no null block
    del d["attention"]["sliding_window"]
    d["attention"]["scale"] = 1  # an integer scale is a number
    write(tmp_path / "b", d)
    m = read_manifest(tmp_path / "b")
    assert (m.kernel_block_size, m.k_scale, m.v_scale, m.null_block, m.sliding_window) == (4, 1.0, 1.0, None, None)
    assert m.scale == 1.0 and type(m.scale) is float
    # null, like absent
    d["kv_cache"].update(kernel_block_size=None, k_scale=None, v_scale=None, null_block=None)
    write(tmp_path / "b", d)
    m = read_manifest(tmp_path / "b")
    assert (m.kernel_block_size, m.k_scale, m.v_scale, m.null_block) == (4, 1.0, 1.0, None)


def test_the_smallest_model_and_cache_a_capture_can_have(tmp_path):
    """One layer, one head on one KV head of one dim, a pool of one block of one token, a
    window of one token, fp32: every lower bound exactly."""
    d = doc(layers=[{"index": 0, "name": "l"}], steps=[{"step": 0, "file": "s", "requests": [], "layers": [0]}])
    d["model"] = {"num_layers": 1, "num_heads": 1, "num_kv_heads": 1, "head_dim": 1}
    d["kv_cache"].update(dtype="fp32", block_size=1, num_blocks=1, sharing="none")
    d["attention"]["sliding_window"] = 1
    write(tmp_path / "b", d)
    m = read_manifest(tmp_path / "b")
    assert (m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.block_size, m.num_blocks, m.sliding_window, m.sharing) == (1, 1, 1, 1, 1, 1, 1, "none")
    assert m.element_size == 4 and m.layers == {0: "l"}


@pytest.mark.parametrize("dtype,size", [("fp32", 4), ("fp16", 2), ("bf16", 2)])
def test_each_cache_dtype_and_its_element_size(tmp_path, dtype, size):
    d = doc()
    d["kv_cache"]["dtype"] = dtype
    write(tmp_path / "b", d)
    assert read_manifest(tmp_path / "b").element_size == size


def test_a_layout_of_an_earlier_release_reads_as_its_new_name(tmp_path):
    d = doc()
    d["kv_cache"]["layout"] = "flash-attn"
    write(tmp_path / "b", d)
    assert read_manifest(tmp_path / "b").layout is LAYOUTS["flash"]


def test_a_step_file_in_a_sub_folder_of_the_bundle_is_allowed(tmp_path):
    d = doc()
    d["steps"][0]["file"] = "steps/step-0003.safetensors"
    write(tmp_path / "b", d)
    assert read_manifest(tmp_path / "b").steps[0]["file"] == "steps/step-0003.safetensors"


LAYOUT_NAMES = "blocks, nhd, hnd, vllm, flash, flash-hnd, flashinfer, flashinfer-hnd, vllm-hnd, vllm-nhd, vllm-cpu, vllm-cpu-amx"


@pytest.mark.parametrize("edit,said", [
    # the document and its version
    (lambda d: d.update(format="pagetrace"), "format: must be 'pagetrace-capture'"),
    (lambda d: d.pop("format"), "format: must be 'pagetrace-capture'"),
    (lambda d: d.pop("version"), "version: is missing"),
    (lambda d: d.update(version=None), "version: is missing"),
    (lambda d: d.update(version="1"), "version: must be an integer, got '1'"),
    (lambda d: d.update(version=True), "version: must be an integer, got True"),
    (lambda d: d.update(version=1.0), "version: must be an integer, got 1.0"),
    (lambda d: d.update(version=2), "version: this pagetrace reads version 1"),
    (lambda d: d.update(version=0), "version: this pagetrace reads version 1"),
    (lambda d: d.pop("model"), "model: is missing"),
    (lambda d: d.update(model=[1]), "model: must be a dict, got list"),
    (lambda d: d.update(kv_cache="bf16"), "kv_cache: must be a dict, got str"),
    (lambda d: d.pop("attention"), "attention: is missing"),
    (lambda d: d.update(attention=["scale"]), "attention: must be a dict, got list"),
    (lambda d: d.update(engine="vllm"), "engine: must be a dict, got str"),
    (lambda d: d.pop("engine"), "engine: is missing"),
    # the model
    (lambda d: d["model"].pop("head_dim"), "model.head_dim: is missing"),
    (lambda d: d["model"].update(num_layers=0), "model.num_layers: must be at least 1, got 0"),
    (lambda d: d["model"].update(num_heads=0), "model.num_heads: must be at least 1, got 0"),
    (lambda d: d["model"].update(num_kv_heads=0), "model.num_kv_heads: must be at least 1, got 0"),
    (lambda d: d["model"].update(head_dim=-1), "model.head_dim: must be at least 1, got -1"),
    (lambda d: d["model"].update(num_kv_heads=3), "model.num_heads: 4 is not a multiple of num_kv_heads 3"),
    (lambda d: d["model"].update(num_heads=6, num_kv_heads=4), "model.num_heads: 6 is not a multiple of num_kv_heads 4"),
    (lambda d: d["model"].update(head_dim=8.0), "model.head_dim: must be an integer, got 8.0"),
    # the cache
    (lambda d: d["kv_cache"].update(dtype="fp8"), "kv_cache.dtype: 'fp8': choose one of fp32, fp16, bf16"),
    (lambda d: d["kv_cache"].update(dtype=2), "kv_cache.dtype: must be a str, got int"),
    (lambda d: d["kv_cache"].pop("dtype"), "kv_cache.dtype: is missing"),
    (lambda d: d["kv_cache"].update(layout="vllm-cpux"), f"kv_cache.layout: 'vllm-cpux': choose one of {LAYOUT_NAMES}"),
    (lambda d: d["kv_cache"].pop("layout"), "kv_cache.layout: is missing"),
    (lambda d: d["kv_cache"].update(layout=11), "kv_cache.layout: must be a str, got int"),
    (lambda d: d["kv_cache"].update(layout=["vllm-cpu"]), "kv_cache.layout: must be a str, got list"),
    (lambda d: d["kv_cache"].update(block_size="4"), "kv_cache.block_size: must be an integer, got '4'"),
    (lambda d: d["kv_cache"].update(num_blocks=16.0), "kv_cache.num_blocks: must be an integer, got 16.0"),
    (lambda d: d["kv_cache"].update(sharing=1), "kv_cache.sharing: must be a str, got int"),
    (lambda d: d["kv_cache"].update(table_padding="0"), "kv_cache.table_padding: must be an integer, got '0'"),
    (lambda d: d["kv_cache"].update(slot_padding=-1.0), "kv_cache.slot_padding: must be an integer, got -1.0"),
    (lambda d: d["kv_cache"].update(block_size=0), "kv_cache.block_size: must be at least 1, got 0"),
    (lambda d: d["kv_cache"].update(num_blocks=0), "kv_cache.num_blocks: must be at least 1, got 0"),
    (lambda d: d["kv_cache"].pop("num_blocks"), "kv_cache.num_blocks: is missing"),
    (lambda d: d["kv_cache"].update(sharing="all"), "kv_cache.sharing: 'all': choose one of none, full-blocks"),
    (lambda d: d["kv_cache"].pop("sharing"), "kv_cache.sharing: is missing"),
    (lambda d: d["kv_cache"].update(kernel_block_size="4"), "kv_cache.kernel_block_size: must be an integer, got '4'"),
    (lambda d: d["kv_cache"].update(null_block=0.0), "kv_cache.null_block: must be an integer, got 0.0"),
    (lambda d: d["kv_cache"].pop("table_padding"), "kv_cache.table_padding: is missing"),
    (lambda d: d["kv_cache"].pop("slot_padding"), "kv_cache.slot_padding: is missing"),
    (lambda d: d["kv_cache"].update(k_scale=float("inf")), "kv_cache.k_scale: must be a finite number, got inf"),
    (lambda d: d["kv_cache"].update(v_scale="1"), "kv_cache.v_scale: must be a finite number, got '1'"),
    (lambda d: d["kv_cache"].update(layout="vllm-cpu-amx"),  # amx splits the slot axis in 16s; a block of 4 is not one
     "kv_cache.layout: 'vllm-cpu-amx': the 'vllm-cpu-amx' layout splits the key's slot as slot/16 (16 with bf16); use a multiple of 16"),
    # the attention
    (lambda d: d["attention"].update(scale=float("nan")), "attention.scale: must be a finite number, got nan"),
    (lambda d: d["attention"].update(scale=True), "attention.scale: must be a finite number, got True"),
    (lambda d: d["attention"].pop("scale"), "attention.scale: is missing"),
    (lambda d: d["attention"].update(sliding_window=0), "attention.sliding_window: 0: a window holds at least 1 token; write null for none"),
    (lambda d: d["attention"].update(sliding_window=-4), "attention.sliding_window: -4: a window holds at least 1 token; write null for none"),
    (lambda d: d["attention"].update(sliding_window=4.5), "attention.sliding_window: must be an integer, got 4.5"),
    # the layers
    (lambda d: d.pop("layers"), "layers: is missing"),
    (lambda d: d.update(layers={"index": 0}), "layers: must be a list, got dict"),
    (lambda d: d["layers"].__setitem__(1, 1), "layers[1]: must be an object with index and name"),
    (lambda d: d["layers"][1].pop("index"), "layers[1].index: is missing"),
    (lambda d: d["layers"][1].update(index=2), "layers[1].index: 2 is outside 0..1"),  # one past the last layer
    (lambda d: d["layers"][1].update(index="1"), "layers[1].index: must be an integer, got '1'"),
    (lambda d: d["layers"][0].update(index=-1), "layers[0].index: -1 is outside 0..1"),
    (lambda d: d["layers"][1].update(name=1), "layers[1].name: must be a str, got int"),
    (lambda d: d["layers"][0].pop("name"), "layers[0].name: is missing"),
    # the steps
    (lambda d: d.pop("steps"), "steps: is missing"),
    (lambda d: d.update(steps=[]), "steps: is empty: the bundle holds no step"),
    (lambda d: d.update(steps={"step": 3}), "steps: must be a list, got dict"),
    (lambda d: d["steps"][1].update(file=5), "steps[1].file: must be a str, got int"),
    (lambda d: d["steps"][0].update(layers="0"), "steps[0].layers: must be a list, got str"),
    (lambda d: d["steps"].__setitem__(1, "step-0005.safetensors"), "steps[1]: must be an object"),
    (lambda d: d["steps"][1].update(step="5"), "steps[1].step: must be an integer, got '5'"),
    (lambda d: d["steps"][1].pop("file"), "steps[1].file: is missing"),
    (lambda d: d["steps"][1].update(file="/tmp/step.safetensors"), "steps[1].file: '/tmp/step.safetensors': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(file="../step.safetensors"), "steps[1].file: '../step.safetensors': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(file="."), "steps[1].file: '.': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(file="a//b"), "steps[1].file: 'a//b': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(file="a/"), "steps[1].file: 'a/': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(file=""), "steps[1].file: '': name a file inside the bundle folder"),
    (lambda d: d["steps"][1].update(requests="a"), "steps[1].requests: must be a list, got str"),
    (lambda d: d["steps"][1].update(requests=["a", 0]), "steps[1].requests: must be a list of strings"),
    (lambda d: d["steps"][1].pop("layers"), "steps[1].layers: is missing"),
    (lambda d: d["steps"][0].update(layers=[0, 2]), "steps[0].layers[1]: layer 2 is not in the manifest's layers"),
    (lambda d: d["steps"][0].update(layers=[True]), "steps[0].layers[0]: layer True is not in the manifest's layers"),
    (lambda d: d["steps"][0].update(layers=["0"]), "steps[0].layers[0]: layer '0' is not in the manifest's layers"),
])
def test_a_malformed_manifest_is_refused_in_one_line_naming_the_field(tmp_path, edit, said):
    assert refusal(tmp_path, edit) == said


def test_a_layer_index_the_model_has_but_the_manifest_does_not_list_is_refused(tmp_path):
    d = doc(layers=[{"index": 1, "name": "only"}])
    write(tmp_path / "b", d)
    with pytest.raises(BundleError, match=r"steps\[0\]\.layers\[0\]: layer 0 is not in the manifest's layers$"):
        read_manifest(tmp_path / "b")


def test_the_file_itself_unreadable_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "b"
    file = folder / "manifest.json"
    with pytest.raises(UsageError) as caught:
        read_manifest(folder)
    assert not isinstance(caught.value, BundleError)
    assert str(caught.value) == f"invalid value for BUNDLE: {str(folder)!r}: is not a folder; a capture bundle is a folder with manifest.json"
    folder.mkdir()
    with pytest.raises(BundleError) as caught:
        read_manifest(folder)
    assert str(caught.value) == f"malformed bundle: {file}: is missing"
    file.mkdir()
    with pytest.raises(BundleError) as caught:
        read_manifest(folder)
    assert str(caught.value) == f"malformed bundle: {file}: is a folder, not a file"
    file.rmdir()
    for text in ("{", "[1, 2]", "null", '"pagetrace-capture"'):
        file.write_text(text)
        with pytest.raises(BundleError) as caught:
            read_manifest(folder)
        said = str(caught.value)
        if text == "{":
            assert said.startswith(f"malformed bundle: {file}: is not readable JSON (") and said.endswith(")")
        else:  # JSON, but not an object: the format is what is wrong
            assert said == f"malformed bundle: {file}: format: must be 'pagetrace-capture'"


def test_a_bundle_error_is_a_usage_error_naming_the_file_and_field():
    e = BundleError("b/manifest.json", "kv_cache.dtype", "is missing")
    assert isinstance(e, UsageError)
    assert (e.option, e.value, e.reason) == ("b/manifest.json: kv_cache.dtype", "", "is missing")
    assert str(e) == "malformed bundle: b/manifest.json: kv_cache.dtype: is missing" and e.args == (str(e),)
    whole = BundleError("b/step-0000.safetensors", None, "is missing")
    assert (whole.option, str(whole)) == ("b/step-0000.safetensors", "malformed bundle: b/step-0000.safetensors: is missing")


# -- the manifest's own words ------------------------------------------------------------


def manifest_of(**over) -> Manifest:
    fields = dict(engine={"name": "vllm"}, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=8, dtype="bf16", layout=LAYOUTS["vllm-cpu"],
                  block_size=4, kernel_block_size=4, num_blocks=16, null_block=0, table_padding=0, slot_padding=-1, sharing="none",
                  scale=1.0, k_scale=1.0, v_scale=1.0, sliding_window=None, layers={0: "l0"}, steps=[{"step": 0}])
    fields.update(over)
    return Manifest(**fields)


@pytest.mark.parametrize("engine,words", [
    ({"name": "vllm", "version": "0.32.0", "backend": "CPU_ATTN", "isa": "amx"}, "vllm 0.32.0 CPU_ATTN isa amx"),
    ({"name": "vllm", "version": "0.32.0", "backend": "CPU_ATTN", "isa": ""}, "vllm 0.32.0 CPU_ATTN"),
    ({"name": "flashinfer"}, "flashinfer"),
    ({"name": "sglang", "backend": "triton"}, "sglang triton"),  # no version: no gap
    ({"name": "hand", "version": 0, "isa": "avx512"}, "hand isa avx512"),  # a version 0 says nothing
    ({}, ""),
])
def test_engine_words_have_the_fields_the_bundle_has_and_no_gaps(engine, words):
    assert manifest_of(engine=engine).engine_words == words


def test_the_geometry_is_the_engines_whole_cache_or_the_stored_pages():
    m = manifest_of()
    whole, stored = m.geometry(), m.geometry(3)
    assert (whole.layout, whole.num_blocks, whole.block_size, whole.num_kv_heads, whole.head_dim, whole.dtype) == (LAYOUTS["vllm-cpu"], 16, 4, 2, 8, "bf16")
    assert stored.num_blocks == 3 and stored.raw_shape("key") == (3, 2, 4, 16)  # per (block, head): 4 slots x (8 K + 8 V)
    assert m.geometry(0).num_blocks == 0  # a step that stored no page


# -- steps: finding one, its requests ---------------------------------------------------


def step_of(**over) -> Step:
    fields = dict(step=4, file=None, requests=["cmpl-a-0-1f2e", "cmpl-ab-0-9c8d", "7"], layers=[0], query_start_loc=[0, 3, 4, 5],
                  seq_lens=[3, 9, 2], block_table=[[1], [2, 3, 4], [5]], block_counts=[1, 3, 1], slot_mapping=[4, 5, 6, 20, 21], positions=[0, 1, 2, 8, 1],
                  blocks=[1, 2, 3, 4, 5])
    fields.update(over)
    return Step(**fields)


def test_a_step_counts_its_tokens_and_each_requests_new_tokens():
    s = step_of()
    assert s.num_tokens == 5 and [s.query_len(r) for r in range(3)] == [3, 1, 1]
    assert step_of(query_start_loc=[]).num_tokens == 0
    assert step_of().dtypes == {}


@pytest.mark.parametrize("given,row", [
    ("cmpl-a-0-1f2e", 0),  # the whole id
    ("cmpl-a-0", 0),  # what the client knows: vLLM's random suffix dropped
    ("cmpl-ab-0", 1),
    ("cmpl-ab", 1),
    ("7", 2),  # an id that is also a row number: the id wins
    ("0", 0), ("1", 1),  # row numbers
    ("2", 2),  # the last row
])
def test_a_request_is_found_by_its_id_its_prefix_or_its_row(given, row):
    assert step_of().request_index(given) == row


@pytest.mark.parametrize("given", ["cmpl", "3", "cmpl-a-", "", "-1", "8"])
def test_a_request_the_step_does_not_hold_is_refused_naming_its_requests(given):
    with pytest.raises(UsageError) as caught:
        step_of().request_index(given)
    assert str(caught.value) == f"invalid value for --request: {given!r}: step 4 holds requests cmpl-a-0-1f2e, cmpl-ab-0-9c8d, 7"
    with pytest.raises(UsageError) as caught:
        step_of().request_index(given, option="REQUEST")
    assert caught.value.option == "REQUEST"


def test_a_prefix_two_requests_share_is_not_a_request():
    s = step_of(requests=["cmpl-x-0-aa", "cmpl-x-0-bb"])
    with pytest.raises(UsageError, match="step 4 holds requests cmpl-x-0-aa, cmpl-x-0-bb"):
        s.request_index("cmpl-x-0")


# -- step files --------------------------------------------------------------------------


def index_tensors(**over):
    """Step 3 of doc(): request a prefills 5 tokens (blocks 2, 6), b decodes its token 4 (blocks 1, 3)."""
    t = {
        "query_start_loc": np.array([0, 5, 6], dtype=np.int32), "seq_lens": np.array([5, 5], dtype=np.int32),
        "block_table": np.array([[2, 6, 0], [1, 3, 0]], dtype=np.int32), "block_counts": np.array([2, 2], dtype=np.int32),
        "slot_mapping": np.array([8, 9, 10, 11, 24, 12, -1], dtype=np.int64), "positions": np.array([0, 1, 2, 3, 4, 4], dtype=np.int64),
        "blocks": np.array([1, 2, 3, 6], dtype=np.int64),
    }
    t.update(over)
    return {k: v for k, v in t.items() if v is not None}


def bundle(tmp_path, tensors=None, d=None):
    folder = tmp_path / "b"
    write(folder, d or doc())
    save_numpy(index_tensors() if tensors is None else tensors, str(folder / "step-0003.safetensors"))
    return folder, read_manifest(folder)


def read_refusal(file, read, *args) -> str:
    """What `read(*args)` refuses, after the "malformed bundle: FILE: " every refusal starts with."""
    with pytest.raises(BundleError) as caught:
        read(*args)
    prefix = f"malformed bundle: {file}: "
    assert str(caught.value).startswith(prefix), str(caught.value)
    return str(caught.value)[len(prefix):]


def step_refusal(tmp_path, **over) -> str:
    folder, m = bundle(tmp_path, index_tensors(**over))
    return read_refusal(folder / "step-0003.safetensors", read_step, folder, m, 3)


def test_a_step_file_is_read_back_entry_by_entry(tmp_path):
    folder, m = bundle(tmp_path)
    s = read_step(folder, m)  # no step named: the first
    assert (s.step, s.file, s.requests, s.layers) == (3, folder / "step-0003.safetensors", ["a", "b"], [0, 1])
    assert (s.query_start_loc, s.seq_lens, s.block_table, s.block_counts) == ([0, 5, 6], [5, 5], [[2, 6, 0], [1, 3, 0]], [2, 2])
    assert (s.slot_mapping, s.positions, s.blocks) == ([8, 9, 10, 11, 24, 12, -1], [0, 1, 2, 3, 4, 4], [1, 2, 3, 6])
    assert s.dtypes == {"query_start_loc": "int32", "seq_lens": "int32", "block_table": "int32", "block_counts": "int32",
                        "slot_mapping": "int64", "positions": "int64", "blocks": "int64"}
    assert all(type(x) is int for x in s.slot_mapping + s.query_start_loc) and type(s.block_table[0]) is list
    assert read_step(folder, m, 3).step == 3


def test_unsigned_index_tensors_and_a_slot_mapping_exactly_as_long_as_the_tokens_are_read(tmp_path):
    tensors = index_tensors(slot_mapping=np.array([8, 9, 10, 11, 24, 12], dtype=np.int64), blocks=np.array([1, 2, 3, 6], dtype=np.uint8),
                            block_counts=np.array([2, 2], dtype=np.uint32))
    folder, m = bundle(tmp_path, tensors)
    s = read_step(folder, m, 3)
    assert s.slot_mapping == [8, 9, 10, 11, 24, 12] and s.blocks == [1, 2, 3, 6] and s.dtypes["blocks"] == "uint8"


def test_a_step_the_bundle_does_not_hold_is_refused_naming_its_steps(tmp_path):
    folder, m = bundle(tmp_path)
    for step in (4, 0, -3):
        with pytest.raises(UsageError) as caught:
            read_step(folder, m, step)
        assert not isinstance(caught.value, BundleError)
        assert str(caught.value) == f"invalid value for --step: {step!r}: the bundle holds steps 3, 5"


@pytest.mark.parametrize("over,said", [
    (dict(positions=None), "positions: is missing"),
    (dict(blocks=None), "blocks: is missing"),
    (dict(query_start_loc=None), "query_start_loc: is missing"),
    (dict(block_table=np.array([2, 6, 0, 1, 3, 0], dtype=np.int32)), "block_table: has 1 dims, needs 2"),
    (dict(seq_lens=np.array([[5, 5]], dtype=np.int32)), "seq_lens: has 2 dims, needs 1"),
    (dict(blocks=np.array(3, dtype=np.int64)), "blocks: has 0 dims, needs 1"),
    (dict(seq_lens=np.array([5, 5], dtype=np.float32)), "seq_lens: must hold integers, got float32"),
    (dict(positions=np.array([0, 1, 2, 3, 4, 4], dtype=np.bool_)), "positions: must hold integers, got bool"),
    (dict(query_start_loc=np.array([0, 5], dtype=np.int32)), "query_start_loc: has 2 rows; the step's 2 requests need 3"),
    (dict(seq_lens=np.array([5, 5, 1], dtype=np.int32)), "seq_lens: has 3 rows; the step's 2 requests need 2"),
    (dict(block_table=np.array([[2, 6, 0]], dtype=np.int32)), "block_table: has 1 rows; the step's 2 requests need 2"),
    (dict(block_counts=np.array([2], dtype=np.int32)), "block_counts: has 1 rows; the step's 2 requests need 2"),
    (dict(positions=np.array([0, 1, 2, 3, 4], dtype=np.int64)), "positions: has 5 entries and slot_mapping 7; query_start_loc ends at 6 tokens"),
    (dict(positions=np.array([0, 1, 2, 3, 4, 4, 0], dtype=np.int64)), "positions: has 7 entries and slot_mapping 7; query_start_loc ends at 6 tokens"),
    (dict(slot_mapping=np.array([8, 9, 10, 11, 24], dtype=np.int64)), "positions: has 6 entries and slot_mapping 5; query_start_loc ends at 6 tokens"),
])
def test_a_malformed_step_file_is_refused_in_one_line_naming_the_tensor(tmp_path, over, said):
    assert step_refusal(tmp_path, **over) == said


def test_a_step_file_missing_or_unreadable_is_refused_naming_it(tmp_path):
    folder, m = bundle(tmp_path)
    file = folder / "step-0003.safetensors"
    file.unlink()
    with pytest.raises(BundleError) as caught:
        read_step(folder, m, 3)
    assert str(caught.value) == f"malformed bundle: {file}: file: is missing"
    file.write_bytes(b"not safetensors")
    with pytest.raises(BundleError) as caught:
        read_step(folder, m, 3)
    assert str(caught.value).startswith(f"malformed bundle: {file}: file: is not a readable safetensors file (")
    file.unlink()
    file.mkdir()
    with pytest.raises(BundleError) as caught:
        read_step(folder, m, 3)
    assert str(caught.value).startswith(f"malformed bundle: {file}: file: is not a readable safetensors file (")


def test_a_bf16_index_tensor_is_an_unreadable_file_on_every_safetensors(tmp_path):
    """NumPy has no bfloat16: safetensors 0.4 raises AttributeError reading one into NumPy,
    newer releases TypeError; either way one line naming the file, not an internal error."""
    folder, m = bundle(tmp_path)
    file = folder / "step-0003.safetensors"
    from safetensors.torch import load_file

    tensors = load_file(str(file))
    tensors["seq_lens"] = tensors["seq_lens"].to(torch.bfloat16)
    save_file(tensors, str(file))
    with pytest.raises(BundleError) as caught:
        read_step(folder, m, 3)
    assert str(caught.value).startswith(f"malformed bundle: {file}: file: is not a readable safetensors file (")


# -- a layer's tensors -------------------------------------------------------------------


def layer_bundle(tmp_path, layout="vllm-cpu", **floats):
    """Step 3 with 4 stored blocks of the bf16 cache, and layer tensors for layers 0 and 1."""
    d = doc()
    d["kv_cache"]["layout"] = layout
    folder = tmp_path / "b"
    write(folder, d)
    tensors = {k: torch.from_numpy(v) for k, v in index_tensors().items()}
    pages = {"vllm-cpu": {"kv": (4, 2, 4, 16)}, "nhd": {"key": (4, 4, 2, 8), "value": (4, 4, 2, 8)},
             # vLLM's first paged attention: key [N, H, D/x, bs, x] with x = 16 bytes of bf16 = 8, value [N, H, D, bs]
             "vllm": {"key": (4, 2, 1, 4, 8), "value": (4, 2, 8, 4)}}[layout]
    for layer in (0, 1):
        for name, shape in pages.items():
            tensors[f"layer{layer}.{name}"] = torch.full(shape, float(layer), dtype=torch.bfloat16)
        tensors[f"layer{layer}.query"] = torch.zeros(6, 4, 8)
        tensors[f"layer{layer}.output"] = torch.zeros(6, 4, 8)
        tensors[f"layer{layer}.new_key"] = torch.zeros(6, 2, 8)
        tensors[f"layer{layer}.new_value"] = torch.zeros(6, 2, 8)
    for name, t in floats.items():
        name = name.replace("__", ".")
        if t is None:
            del tensors[name]
        else:
            tensors[name] = t
    save_file(tensors, str(folder / "step-0003.safetensors"))
    m = read_manifest(folder)
    return m, read_step(folder, m, 3)


def layer_refusal(tmp_path, layout="vllm-cpu", **floats) -> str:
    m, s = layer_bundle(tmp_path, layout, **floats)
    return read_refusal(s.file, read_layer, m, s, 1)


def test_a_layers_tensors_are_its_own_without_the_prefix(tmp_path):
    m, s = layer_bundle(tmp_path)
    out = read_layer(m, s, 1)
    assert sorted(out) == ["kv", "new_key", "new_value", "output", "query"]
    assert out["kv"].shape == (4, 2, 4, 16) and bool((out["kv"] == 1).all())  # layer 1's pages, not layer 0's
    m, s = layer_bundle(tmp_path, "nhd")
    out = read_layer(m, s, 0)
    assert sorted(out) == ["key", "new_key", "new_value", "output", "query", "value"] and bool((out["value"] == 0).all())
    m, s = layer_bundle(tmp_path, "vllm")  # key and value of different shapes
    out = read_layer(m, s, 1)
    assert (out["key"].shape, out["value"].shape) == ((4, 2, 1, 4, 8), (4, 2, 8, 4))


def test_the_optional_layer_tensors_may_all_be_absent(tmp_path):
    m, s = layer_bundle(tmp_path, layer1__query=None, layer1__output=None, layer1__new_key=None, layer1__new_value=None)
    assert sorted(read_layer(m, s, 1)) == ["kv"]


def test_a_layer_the_step_did_not_capture_is_refused_naming_its_layers(tmp_path):
    m, s = layer_bundle(tmp_path)
    s.layers = [1]
    with pytest.raises(UsageError) as caught:
        read_layer(m, s, 0)
    assert str(caught.value) == "invalid value for --layer: 0: step 3 holds layers 1"
    s.layers = [0, 1]
    with pytest.raises(UsageError) as caught:
        read_layer(m, s, 2)
    assert str(caught.value) == "invalid value for --layer: 2: step 3 holds layers 0, 1"


@pytest.mark.parametrize("layout,floats,said", [
    ("vllm-cpu", dict(layer1__kv=None), "layer1.kv: is missing"),
    ("nhd", dict(layer1__value=None), "layer1.value: is missing"),
    ("nhd", dict(layer1__key=None), "layer1.key: is missing"),
    ("vllm-cpu", dict(layer1__kv=torch.zeros(3, 2, 4, 16, dtype=torch.bfloat16)),
     "layer1.kv: has shape (3, 2, 4, 16); 'vllm-cpu' with 4 stored blocks needs (4, 2, 4, 16)"),
    ("nhd", dict(layer1__value=torch.zeros(4, 4, 1, 8, dtype=torch.bfloat16)),
     "layer1.value: has shape (4, 4, 1, 8); 'nhd' with 4 stored blocks needs (4, 4, 2, 8)"),
    ("vllm", dict(layer1__value=torch.zeros(4, 2, 1, 4, 8, dtype=torch.bfloat16)),  # the value shaped as the key
     "layer1.value: has shape (4, 2, 1, 4, 8); 'vllm' with 4 stored blocks needs (4, 2, 8, 4)"),
    ("vllm", dict(layer1__key=torch.zeros(4, 2, 8, 4, dtype=torch.bfloat16)),
     "layer1.key: has shape (4, 2, 8, 4); 'vllm' with 4 stored blocks needs (4, 2, 1, 4, 8)"),
    ("vllm-cpu", dict(layer1__kv=torch.zeros(4, 2, 4, 16, dtype=torch.float16)), "layer1.kv: is torch.float16; the manifest's kv_cache.dtype is bf16"),
    ("nhd", dict(layer1__value=torch.zeros(4, 4, 2, 8)), "layer1.value: is torch.float32; the manifest's kv_cache.dtype is bf16"),
    ("vllm-cpu", dict(layer1__new_value=None), "layer1.new_value: is missing; a step stores the new keys and values together"),
    ("vllm-cpu", dict(layer1__new_key=None), "layer1.new_key: is missing; a step stores the new keys and values together"),
    ("vllm-cpu", dict(layer1__query=torch.zeros(6, 2, 8)), "layer1.query: has shape (6, 2, 8), needs (6, 4, 8)"),  # KV heads, not query heads
    ("vllm-cpu", dict(layer1__output=torch.zeros(5, 4, 8)), "layer1.output: has shape (5, 4, 8), needs (6, 4, 8)"),
    ("vllm-cpu", dict(layer1__new_key=torch.zeros(6, 4, 8)), "layer1.new_key: has shape (6, 4, 8), needs (6, 2, 8)"),
    ("vllm-cpu", dict(layer1__new_value=torch.zeros(6, 2, 7)), "layer1.new_value: has shape (6, 2, 7), needs (6, 2, 8)"),
    ("vllm-cpu", dict(layer1__query=torch.zeros(6, 4, 8, dtype=torch.int32)), "layer1.query: is torch.int32; it must hold floats"),
    ("vllm-cpu", dict(layer1__new_value=torch.zeros(6, 2, 8, dtype=torch.int8)), "layer1.new_value: is torch.int8; it must hold floats"),
])
def test_a_malformed_layer_is_refused_in_one_line_naming_the_tensor(tmp_path, layout, floats, said):
    assert layer_refusal(tmp_path, layout, **floats) == said


def test_a_layer_file_gone_unreadable_is_refused_naming_it(tmp_path):
    m, s = layer_bundle(tmp_path)
    s.file.write_bytes(b"\x08" + b"\x00" * 7 + b"{}")
    with pytest.raises(BundleError) as caught:
        read_layer(m, s, 1)
    assert str(caught.value).startswith(f"malformed bundle: {s.file}: file: is not a readable safetensors file (")


# -- writing -----------------------------------------------------------------------------


def small_manifest():
    d = doc()
    for key in ("format", "version", "steps"):
        del d[key]
    return d


def test_a_written_bundle_appears_whole_at_close_and_reads_back(tmp_path):
    path = tmp_path / "w.bundle"
    writer = BundleWriter(path, small_manifest())
    assert not path.exists() and writer.tmp.parent == tmp_path and writer.tmp.name.startswith(".w.bundle.")
    strided = torch.arange(12, dtype=torch.int64).reshape(2, 6).t()[:, 0]  # a non-contiguous view is stored contiguous
    tensors = {k: torch.from_numpy(v) for k, v in index_tensors().items()}
    tensors["slot_mapping"] = torch.tensor([8, 9, 10, 11, 24, 12], dtype=torch.int64)
    writer.add_step(3, ["a", "b"], [0, 1], tensors, note="first")
    writer.add_step(5, ["a"], [1], {"x": strided})
    assert not path.exists()
    assert writer.close() == path and not writer.tmp.exists()
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["format"], manifest["version"]) == ("pagetrace-capture", 1)
    assert manifest["steps"] == [{"step": 3, "file": "step-0003.safetensors", "requests": ["a", "b"], "layers": [0, 1], "note": "first"},
                                 {"step": 5, "file": "step-0005.safetensors", "requests": ["a"], "layers": [1]}]
    assert (path / "manifest.json").read_text().endswith("}\n") and '\n  "engine"' in (path / "manifest.json").read_text()
    m = read_manifest(path)
    assert read_step(path, m, 3).slot_mapping == [8, 9, 10, 11, 24, 12]
    from safetensors.torch import load_file

    assert load_file(str(path / "step-0005.safetensors"))["x"].tolist() == [0, 1, 2, 3, 4, 5]


def test_a_writer_never_replaces_a_path_and_an_abort_leaves_nothing(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")  # a dangling link is a path too
    for name in ("taken", "link"):
        with pytest.raises(UsageError) as caught:
            BundleWriter(tmp_path / name, small_manifest())
        assert str(caught.value) == f"invalid value for bundle: {str(tmp_path / name)!r}: already exists; choose a new folder"
    writer = BundleWriter(tmp_path / "new", small_manifest())
    writer.add_step(0, [], [], {"x": torch.zeros(1)})
    writer.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "taken"]


def test_a_live_bundle_writes_nothing_before_its_first_step_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "live"
    live = LiveBundle(path, small_manifest())
    live.set("closed", "early")  # before the first step: kept for the manifest, nothing written
    assert not path.exists()
    tensors = {k: torch.from_numpy(v) for k, v in index_tensors().items()}
    live.add(3, ["a", "b"], [0, 1], tensors, note="x")
    doc_ = json.loads((path / "manifest.json").read_text())
    assert doc_["closed"] == "early" and (doc_["format"], doc_["version"]) == ("pagetrace-capture", 1)
    assert doc_["steps"] == [{"step": 3, "file": "step-0003.safetensors", "requests": ["a", "b"], "layers": [0, 1], "note": "x"}]
    live.add(5, ["a"], [1], tensors, drop=[3, 99])  # a step never written is no error
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "step-0005.safetensors"]
    text = (path / "manifest.json").read_text()
    assert text.endswith("}\n") and '\n  "engine": {\n    "name": "vllm",' in text  # indented for a reader, as BundleWriter's
    live.set("closed", "signal")
    text = (path / "manifest.json").read_text()
    assert json.loads(text)["closed"] == "signal" and text.endswith("}\n") and '\n  "closed": "signal"' in text
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", "step-0005.safetensors"]
    assert [s["step"] for s in read_manifest(path).steps] == [5]
    with pytest.raises(FileExistsError):  # a folder made since: never written into
        LiveBundle(path, small_manifest()).add(0, [], [], tensors)


def test_client_names_an_n2_parent_the_x_request_id_and_a_chat_id():
    """vLLM's ids (0.32): `cmpl-<X-Request-Id>-<prompt>-<8 hex>`, samples of n > 1 `<k>_<parent>`, chat `chatcmpl-`."""
    s = step_of(requests=["0_cmpl-w2-0-1a2b3c4d", "1_cmpl-w2-0-5e6f7a8b", "cmpl-load3-0-0badcafe", "chatcmpl-talk-0-deadbeef"])
    assert s.request_index("0_cmpl-w2-0") == 0 and s.request_index("1_cmpl-w2") == 1
    assert s.request_index("load3") == 2 and s.request_index("talk") == 3 and s.request_index("chatcmpl-talk") == 3
    with pytest.raises(UsageError) as caught:
        s.request_index("cmpl-w2")  # the id the n = 2 response carries: both samples
    assert "names 2 requests of step 4 (the samples of an n > 1 request): 0_cmpl-w2-0-1a2b3c4d, 1_cmpl-w2-0-5e6f7a8b; name one" in str(caught.value)
    with pytest.raises(UsageError):
        s.request_index("load")  # a prefix of the X-Request-Id is no name of it


def test_without_step_the_steps_that_hold_the_request_are_found_and_listed(tmp_path):
    from pagetrace.engines.bundle import read_manifest, step_for_request

    path = tmp_path / "b"
    path.mkdir()
    steps = [{"step": n, "file": f"step-{n:04d}.safetensors", "requests": reqs, "layers": []}
             for n, reqs in [(0, ["cmpl-a-0-11111111"]), (1, ["cmpl-a-0-11111111", "cmpl-b-0-22222222"]), (2, ["cmpl-b-0-22222222"]),
                             (5, ["cmpl-b-0-22222222"])]]
    (path / "manifest.json").write_text(json.dumps({
        "format": "pagetrace-capture", "version": 1, "engine": {"name": "vllm"},
        "model": {"num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 8},
        "kv_cache": {"dtype": "fp32", "layout": "nhd", "block_size": 4, "num_blocks": 8, "null_block": 0, "table_padding": 0, "slot_padding": -1,
                     "sharing": "none"},
        "attention": {"scale": 1.0}, "layers": [], "steps": steps}))
    m = read_manifest(path)
    told = []
    assert step_for_request(m, None, "cmpl-a", told.append) is None and told == []  # in the first step: as before
    assert step_for_request(m, None, "b", told.append) == 1 and told == ["request b is in steps 1-2, 5 of this bundle; reading step 1 (--step picks another)"]
    assert step_for_request(m, 2, "a", told.append) == 2
    with pytest.raises(UsageError) as caught:
        step_for_request(m, None, "c")
    assert "no step of the bundle holds it" in str(caught.value)


def test_a_tensor_parallel_base_path_lists_the_rank_bundles(tmp_path):
    from pagetrace.engines.bundle import read_manifest

    for r in (0, 1):
        (tmp_path / f"tp.bundle.rank{r}").mkdir()
    with pytest.raises(UsageError) as caught:
        read_manifest(tmp_path / "tp.bundle")
    assert f"each rank wrote its own bundle: {tmp_path}/tp.bundle.rank0, {tmp_path}/tp.bundle.rank1; name one" in str(caught.value)
