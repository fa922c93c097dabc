"""`capacity` and `where`: every refusal word for word (the option, the value, the reason a
user reads), and the fields of what they print on success that the other tests leave free."""

from __future__ import annotations

import json

import pytest
from conftest import cli

from pagetrace.sim.capacity import (ModelDims, activation_estimate, capacity, device_budget, dims_of, dtype_bytes,
                                parameter_count, parse_memory, read_config)
from pagetrace.errors import UsageError
from pagetrace.paging.layouts import make_geometry
from pagetrace.paging.where import where_byte, where_geometry, where_slot


def message(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as caught:
        call(*args, **kwargs)
    return str(caught.value)


# -- capacity ----------------------------------------------------------------------------------

def test_memory_refusals():
    assert message(parse_memory, "lots") == "invalid value for --memory: 'lots': give bytes with an optional unit: 80GiB, 512MiB, 16GB, 1e9"
    assert message(parse_memory, "1e400", "--weights") == "invalid value for --weights: '1e400': is too large to be a number of bytes"
    assert message(parse_memory, "0.5") == "invalid value for --memory: '0.5': must be at least 1 byte"
    assert parse_memory("1") == 1 and parse_memory("1.5") == 1
    assert parse_memory(str(2**60)) == 2**60
    assert message(parse_memory, str(2**60 + 2**10)) == (
        f"invalid value for --memory: '{2**60 + 2**10}': is more than 1 EiB ({2**60:,} bytes); no KV cache is that large")
    assert message(dtype_bytes, "int3") == (
        "invalid value for --dtype: 'int3': use one of fp32, fp16, bf16, fp8_e4m3, fp8_e5m2 (or float32, float16, half, bfloat16, fp8)")


def test_config_refusals(tmp_path):
    missing = tmp_path / "none.json"
    assert message(read_config, str(missing)) == f"invalid value for --config: '{missing}': No such file or directory"
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert message(read_config, str(bad)).startswith(f"invalid value for --config: '{bad}': not JSON (Expecting property name")
    bad.write_text("[1]")
    assert message(read_config, str(bad)) == f"invalid value for --config: '{bad}': not a JSON object"
    bad.write_text('{"text_config": 3}')
    assert message(read_config, str(bad)) == f"invalid value for --config: '{bad}': text_config is not a JSON object"
    nested = tmp_path / "mm.json"
    nested.write_text(json.dumps({"text_config": {"num_hidden_layers": 2}, "vision_config": {}}))
    assert read_config(str(nested)) == {"num_hidden_layers": 2}
    flat = {"num_hidden_layers": 2, "text_config": {"num_hidden_layers": 9}}
    nested.write_text(json.dumps(flat))
    assert read_config(str(nested)) == flat  # a text model's own config wins over a nested one
    assert message(dims_of, {"num_attention_heads": 4}, "c.json") == "invalid value for --config: 'c.json': num_hidden_layers is missing"
    assert message(dims_of, {"num_hidden_layers": 1, "num_attention_heads": 0}, "c.json") == (
        "invalid value for --config: 'c.json': num_attention_heads must be a positive integer, got 0")
    assert message(dims_of, {"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 4}, "c.json") == (
        "invalid value for --config: 'c.json': hidden_size 4 / num_attention_heads 8 is no head size; give head_dim")
    assert message(dims_of, {"num_hidden_layers": 2, "num_attention_heads": 8, "head_dim": 4, "torch_dtype": "int8"}, "c.json") == (
        "invalid value for --config: 'c.json': torch_dtype 'int8' is not a cache dtype; give --dtype")


def test_config_dims_at_their_boundaries():
    one = dims_of({"num_hidden_layers": 1, "num_attention_heads": 8, "hidden_size": 8}, "c.json")
    assert one == ModelDims(1, 8, 1, "bf16")  # a head size of exactly 1, heads as KV heads, bf16 by default
    assert dims_of({"num_hidden_layers": 1, "num_attention_heads": 8, "hidden_size": 60, "dtype": "float16"}, "c.json") == ModelDims(1, 8, 7, "float16")
    assert dims_of({"num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 3}, "c.json", "fp8").num_kv_heads == 1


def test_capacity_refusals_name_each_option():
    dims = ModelDims(2, 1, 4, "fp16")
    for bad, option in ((ModelDims(0, 1, 4, "fp16"), "--layers"), (ModelDims(2, 0, 4, "fp16"), "--kv-heads"), (ModelDims(2, 1, 0, "fp16"), "--head-dim")):
        assert message(capacity, bad, 10**6) == f"invalid value for {option}: 0: must be at least 1"
    assert message(capacity, dims, 10**6, block_size=0) == "invalid value for --block-size: 0: must be at least 1"
    assert message(capacity, dims, 10**6, length=0) == "invalid value for --length: 0: must be at least 1"
    assert message(capacity, ModelDims(4097, 1, 4, "fp16"), 10**9) == "invalid value for --layers: 4097: must be at most 4,096"
    assert message(capacity, dims, 1023) == (
        "invalid value for --memory: 1023: holds 1 block of 512 bytes; a pool needs at least 2 (block 0 is the null block), so at least 1,024 bytes")
    cap = capacity(dims, 1024)
    assert (cap.block_size, cap.length, cap.blocks_per_request, cap.requests, cap.requests_closed_form) == (16, None, None, None, None)


def test_device_budget_refusals():
    assert message(device_budget, 100, 1.5, 0, "w", 0, "a", 0) == (
        "invalid value for --gpu-memory-utilization: 1.5: is a share of the device's memory: above 0, at most 1")
    assert message(device_budget, 1000, 0.5, 300, "w", 100, "a", 100) == (
        "invalid value for --gpu-memory: 1000: x 0.5 = 500 bytes leaves nothing for the KV cache after the weights (300), "
        "activations (100) and non-torch memory (100)")
    assert device_budget(1000, 0.5, 300, "w", 100, "a", 99).kv_cache_bytes == 1


def test_parameter_count_each_term():
    base = {"hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 10, "intermediate_size": 16}
    # per layer: q 8x8, k and v 8x8 each (2 KV heads of 4), o 8x8, MLP 3 x 8 x 16, norms 2 x 8
    per_layer = 64 + 2 * 64 + 64 + 3 * 128 + 16
    assert parameter_count(base, "c") == 10 * 8 + 2 * per_layer + 8 + 10 * 8
    gqa = {**base, "num_key_value_heads": 1, "head_dim": 2, "tie_word_embeddings": True}
    q, kv = 2 * 2, 1 * 2
    assert parameter_count(gqa, "c") == 10 * 8 + 2 * (8 * q + 2 * 8 * kv + q * 8 + 3 * 128 + 16) + 8
    assert parameter_count({**base, "attention_bias": True}, "c") == parameter_count(base, "c") + 2 * (8 + 2 * 8)
    assert parameter_count({**base, "architectures": ["Qwen2ForCausalLM"]}, "c") == parameter_count(base, "c") + 2 * 24
    assert parameter_count({**base, "architectures": ["LlamaForCausalLM"]}, "c") == parameter_count(base, "c")
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size"):
        assert message(parameter_count, {**base, key: 8}, "c.json") == (
            "invalid value for --config: 'c.json': is a mixture of experts; its weights are not counted here, give --weights")
    assert message(parameter_count, {**base, "vocab_size": None}, "c.json") == "invalid value for --config: 'c.json': vocab_size is missing"


def test_activation_estimate_is_the_documented_formula():
    cfg = {"hidden_size": 10, "intermediate_size": 30}
    assert activation_estimate(cfg, "c", 7, 2) == 7 * (2 * 30 + 4 * 10) * 2
    assert message(activation_estimate, {"hidden_size": 10}, "c.json", 7, 2) == "invalid value for --config: 'c.json': intermediate_size is missing"
    assert message(activation_estimate, {"intermediate_size": 10}, "c.json", 7, 2) == "invalid value for --config: 'c.json': hidden_size is missing"


# -- where -------------------------------------------------------------------------------------

def test_where_refusals():
    geom = where_geometry("blocks", "fp32", 16, 1, 8, None, [[7, 2, 15]])
    assert message(where_slot, geom, 256, []) == (
        "invalid value for --slot: 256: the pool has slots 0..255 (16 blocks x 16); raise --num-blocks")
    assert message(where_byte, geom, 16 * 16 * 8 * 4, None, []) == (
        "invalid value for --byte: 8192: the key cache has bytes 0..8191 (16x16x8 elements of 4 bytes); raise --num-blocks")
    assert message(where_byte, geom, 16 * 16 * 8 * 4, "value", []).startswith("invalid value for --byte: 8192: the value cache has bytes 0..8191")
    flash = where_geometry("flash", "fp16", 16, 2, 8, 4, [])
    assert message(where_byte, flash, 0, "key", []) == (
        "invalid value for --cache: 'key': the 'flash' layout holds K and V in one tensor: the byte itself says which")
    size = 2 * 4 * 16 * 2 * 8 * 2
    assert message(where_byte, flash, size, None, []) == (
        f"invalid value for --byte: {size}: the combined K/V tensor has bytes 0..{size - 1} (2x4x16x2x8 elements of 2 bytes); raise --num-blocks")


def test_where_tables_may_repeat_a_block_and_must_fit_the_pool():
    geom = where_geometry("blocks", "fp32", 16, 1, 8, None, [[3, 3, 1]])  # a table reused across sequences or a repeat: allowed here
    assert geom.num_blocks == 4
    place = where_slot(geom, 3 * 16 + 2, [[3, 3, 1]])
    assert [(o.sequence, o.logical_block, o.token) for o in place.owners] == [(0, 0, 2), (0, 1, 18)]
    assert message(where_geometry, "blocks", "fp32", 16, 1, 8, 3, [[3, 1]]).startswith("invalid value for --table: '3,1': entry 0 is physical block 3")


def test_where_json_fields_of_a_slot_and_of_a_byte(capsys):
    code, out, err = cli(capsys, "where", "--slot", "37", "--table", "7,2,15", "--json")
    doc = json.loads(out)
    assert code == 0 and (doc["slot"], doc["physical_block"], doc["offset"], doc["byte"], doc["index"], doc["axes"], doc["cache"]) == (
        37, 2, 5, None, None, None, None)
    # hnd fp16, 2 KV heads, head_dim 8, 16 blocks of 16: the value cache [16, 2, 16, 8]; byte 2 of element (3, 1, 4, 6)
    element = ((3 * 2 + 1) * 16 + 4) * 8 + 6
    code, out, err = cli(capsys, "where", "--byte", str(element * 2 + 1), "--layout", "hnd", "--dtype", "fp16", "--kv-heads", "2",
                         "--cache", "value", "--json")
    doc = json.loads(out)
    assert code == 0, err
    assert (doc["byte"], doc["element"], doc["byte_in_element"], doc["cache"], doc["physical_block"], doc["offset"], doc["head"], doc["dim"]) == (
        element * 2 + 1, element, 1, "value", 3, 4, 1, 6)
    assert doc["axes"] == list(make_geometry("hnd", 16, 16, 2, 8, "fp16").layout.shown_axes("value")) and doc["index"] == [3, 1, 4, 6]
    assert doc["slot"] == 3 * 16 + 4 and doc["owners"] is None
    code, out, err = cli(capsys, "where", "--byte", str(element * 2 + 1), "--layout", "hnd", "--dtype", "fp16", "--kv-heads", "2")
    assert "of the key cache" in " ".join(out.split()) and "KV head 1" in " ".join(out.split())  # --cache defaults to key


def test_where_in_vllms_split_key_and_its_value_cache(capsys):
    """vLLM's layout, fp16 (x = 8), head_dim 16, 2 KV heads, 16 blocks of 16: the key cache is
    [16, 2, 2, 16, 8] (block, head, dim/x, slot, dim%x), the value cache [16, 2, 16, 16]
    (block, head, dim, slot). Element (block 3, head 1, slot 4, dim 10) in each."""
    args = ["where", "--layout", "vllm", "--dtype", "fp16", "--kv-heads", "2", "--head-dim", "16", "--json"]
    key_element = (((3 * 2 + 1) * 2 + 1) * 16 + 4) * 8 + 2
    code, out, err = cli(capsys, *args, "--byte", str(key_element * 2), "--cache", "key")
    doc = json.loads(out)
    assert code == 0, err
    assert (doc["cache"], doc["physical_block"], doc["offset"], doc["head"], doc["dim"], doc["index"]) == ("key", 3, 4, 1, 10, [3, 1, 1, 4, 2])
    assert doc["axes"] == ["block", "head", "dim/x", "slot", "dim%x"]
    assert {k: doc[k] for k in ("layout", "dtype", "element_size", "num_blocks", "block_size", "kv_heads", "head_dim")} == {
        "layout": "vllm", "dtype": "fp16", "element_size": 2, "num_blocks": 16, "block_size": 16, "kv_heads": 2, "head_dim": 16}
    value_element = ((3 * 2 + 1) * 16 + 10) * 16 + 4
    code, out, err = cli(capsys, *args, "--byte", str(value_element * 2), "--cache", "value")
    doc = json.loads(out)
    assert (doc["cache"], doc["physical_block"], doc["offset"], doc["head"], doc["dim"], doc["index"]) == ("value", 3, 4, 1, 10, [3, 1, 10, 4])
    assert doc["axes"] == ["block", "head", "dim", "slot"]
    geom = where_geometry("vllm", "fp16", 16, 2, 16, None, [])
    assert message(where_byte, geom, 16 * 2 * 16 * 16 * 2, "key", []) == (
        "invalid value for --byte: 16384: the key cache has bytes 0..16383 (16x2x2x16x8 elements of 2 bytes); raise --num-blocks")
    assert message(where_byte, geom, 16 * 2 * 16 * 16 * 2, "value", []) == (
        "invalid value for --byte: 16384: the value cache has bytes 0..16383 (16x2x16x16 elements of 2 bytes); raise --num-blocks")


def test_capacity_keeps_the_length_it_was_given():
    cap = capacity(ModelDims(2, 1, 4, "fp16"), 10 * 512, block_size=16, length=17)
    assert (cap.length, cap.block_size, cap.memory_bytes) == (17, 16, 5120)
