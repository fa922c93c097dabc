"""Hybrid models' rules against vLLM's own functions, no engine: the KV cache groups
(vllm/v1/core/kv_cache_utils.py `_get_kv_cache_groups_uniform_page_size`) and a sliding
group's admission cap (vllm/v1/kv_cache_interface.py
`SlidingWindowSpec.max_admission_blocks_per_request`), vLLM 0.32; and the layer options'
parsing. Skips the vLLM comparisons with the reason where vLLM is not installed.
"""

from __future__ import annotations

import random

import pytest

from pagetrace.sim.hybrid import FULL, SLIDING, KVGroup, LayerKind, kv_cache_groups, layers_from_config, parse_layers, sliding_admission_cap

F, S40, S64 = LayerKind(FULL), LayerKind(SLIDING, 40), LayerKind(SLIDING, 64)


def vllm_specs():
    torch = pytest.importorskip("torch")
    kvi = pytest.importorskip("vllm.v1.kv_cache_interface", reason="vLLM is not installed: its grouping is the reference")

    def spec(kind: LayerKind):
        common = dict(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16)
        return kvi.FullAttentionSpec(**common) if kind.window is None else kvi.SlidingWindowSpec(**common, sliding_window=kind.window)
    return spec


def vllm_groups(layers: list[LayerKind]) -> list[tuple[LayerKind, int]]:
    spec = vllm_specs()
    from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size

    groups = _get_kv_cache_groups_uniform_page_size({f"layer.{i}": spec(k) for i, k in enumerate(layers)})
    out = []
    for g in groups:
        s = g.kv_cache_spec
        kind = LayerKind(FULL) if type(s).__name__ == "FullAttentionSpec" else LayerKind(SLIDING, s.sliding_window)
        out.append((kind, len(g.layer_names)))
    return out


@pytest.mark.parametrize("layers", [
    [F] * 2 + [S40] * 3,  # 3 = 1.5 x 2: not under it -> group size 2, the sliding bucket padded
    [F] * 2 + [S40] * 2,  # equal buckets: one group each
    [S40] * 3 + [F] * 2,  # the order of first appearance decides the groups' order
    [F] * 4 + [S40] * 5,  # 5 < 6: group size 5, the full bucket padded
    [F] * 4 + [S40] * 6,  # 6 = 1.5 x 4 exactly: group size 4
    [F] + [S40] * 5 + [F] + [S40] * 5,  # Gemma 3's 5:1
    [F] * 2 + [S40] * 4 + [S64] * 2,  # two windows: two sliding buckets
    [S64, F, S40, F, S64, S40, S40],
])
def test_groups_are_vllms(layers):
    groups, size = kv_cache_groups(layers)
    assert [(g.kind, g.layers) for g in groups] == vllm_groups(layers)
    buckets = [layers.count(k) for k in dict.fromkeys(layers)]
    assert size == (max(buckets) if max(buckets) < 1.5 * min(buckets) else min(buckets))


def test_groups_of_random_models_are_vllms():
    rng = random.Random(23)
    for _ in range(30):
        layers = [rng.choice([F, S40, S64]) for _ in range(rng.randint(2, 14))]
        if len(set(layers)) < 2:
            continue
        assert [(g.kind, g.layers) for g in kv_cache_groups(layers)[0]] == vllm_groups(layers), layers


def test_one_kind_is_one_group_and_none_is_refused():
    assert kv_cache_groups([S40] * 3) == ([KVGroup(S40, 3)], 3)
    assert kv_cache_groups([F]) == ([KVGroup(F, 1)], 1)
    with pytest.raises(ValueError) as exc:
        kv_cache_groups([])
    assert str(exc.value) == "a model with no attention layer has no KV cache"


@pytest.mark.parametrize("window", [1, 2, 15, 16, 17, 31, 32, 33, 40, 4096])
@pytest.mark.parametrize("block_size", [1, 16])
def test_the_admission_cap_is_vllms(window, block_size):
    spec = vllm_specs()
    kvi = pytest.importorskip("vllm.v1.kv_cache_interface")
    import torch

    s = kvi.SlidingWindowSpec(block_size=block_size, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, sliding_window=window)
    for in_flight in (1, 16, 17, 4096):
        for mml in (8, 64, 100, 1 << 20):
            assert sliding_admission_cap(window, block_size, in_flight, mml) == s.max_admission_blocks_per_request(in_flight, mml), (in_flight, mml)
    del spec


def test_the_admission_cap_by_hand():
    # window 17, block 16, 16 in flight: min(16 + 16, 1000) = 32 tokens -> 2 blocks + 1 of offset
    assert sliding_admission_cap(17, 16, 16, 1000) == 3
    assert sliding_admission_cap(17, 16, 17, 1000) == 4  # 33 tokens: one past two blocks
    assert sliding_admission_cap(4096, 16, 4096, 100) == 8  # capped by the model length: cdiv(100, 16) + 1


def test_labels():
    assert F.label() == "full attention" and S40.label() == "sliding window 40"


def test_parse_layers_spelling():
    assert parse_layers(" FULL : 1 , Sliding:40:2,full:1") == [F, S40, S40, F]
    assert parse_layers("sliding:1:1") == [LayerKind(SLIDING, 1)]


@pytest.mark.parametrize("spec, message", [
    ("full:x", "'full:x' is not full:N or sliding:W:N (whole numbers, 0-9)"),
    ("full:\u0663", "'full:\u0663' is not full:N or sliding:W:N (whole numbers, 0-9)"),
    ("full:", "'full:' is not full:N or sliding:W:N (whole numbers, 0-9)"),
    ("full", "'full' is not full:N or sliding:W:N"),
    ("full:1:2", "'full:1:2' is not full:N or sliding:W:N"),
    ("sliding:40", "'sliding:40' is not full:N or sliding:W:N"),
    ("local:40:1", "'local:40:1' is not full:N or sliding:W:N"),
    ("sliding:0:2", "'sliding:0:2': a sliding window of 0 tokens holds no token (at least 1)"),
    ("full:0", "'full:0' holds no layer (at least 1)"),
    ("full:1, sliding:40:0", "'sliding:40:0' holds no layer (at least 1)"),
])
def test_parse_layers_names_the_item(spec, message):
    with pytest.raises(ValueError) as exc:
        parse_layers(spec)
    assert str(exc.value) == message


def test_layers_from_a_config():
    base = {"num_hidden_layers": 3, "sliding_window": 64}
    assert layers_from_config({**base, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}) == [S64, F, S64]
    assert layers_from_config({**base, "layer_types": ["full_attention"] * 3}) is None  # no sliding layer: a plain model
    assert layers_from_config({"num_hidden_layers": 2}) is None
    assert layers_from_config(base) == [S64] * 3  # Mistral 7B v0.1: one window, every layer slides
    assert layers_from_config({**base, "use_sliding_window": False}) is None  # Qwen2: the window is there but off
    assert layers_from_config({**base, "use_sliding_window": True}) == [S64] * 3
    assert layers_from_config({"layer_types": ["sliding_attention"], "sliding_window": 1}) == [LayerKind(SLIDING, 1)]


@pytest.mark.parametrize("cfg, message", [
    ({"num_hidden_layers": 2, "sliding_window": 64, "layer_types": "sliding_attention"}, "layer_types must be a non-empty list"),
    ({"num_hidden_layers": 2, "sliding_window": 64, "layer_types": []}, "layer_types must be a non-empty list"),
    ({"sliding_window": 64}, "layer_types must be a non-empty list"),  # every layer slides, but how many?
    ({"num_hidden_layers": 2, "sliding_window": 64, "layer_types": ["sliding_attention"]}, "layer_types lists 1 layers, num_hidden_layers is 2"),
    ({"num_hidden_layers": 1, "sliding_window": 0, "layer_types": ["sliding_attention"]}, "sliding_window=0: the sliding layers need a window of at least 1 token"),
    ({"num_hidden_layers": 1, "sliding_window": True, "layer_types": ["sliding_attention"]}, "sliding_window=True: the sliding layers need a window of at least 1 token"),
    ({"num_hidden_layers": 1, "sliding_window": "64", "layer_types": ["sliding_attention"]}, "sliding_window='64': the sliding layers need a window of at least 1 token"),
    ({"num_hidden_layers": 1, "layer_types": ["sliding_attention"]}, "sliding_window=None: the sliding layers need a window of at least 1 token"),
    ({"num_hidden_layers": 2, "sliding_window": 8, "layer_types": ["sliding_attention", "mamba"]},
     "layer_types holds 'mamba': pagetrace models full_attention and sliding_attention"),
])
def test_bad_configs_name_the_field(cfg, message):
    with pytest.raises(ValueError) as exc:
        layers_from_config(cfg)
    assert str(exc.value) == message


def test_tables_of_a_request_and_of_none():
    from pagetrace.sim.hybrid import HybridVllmPrefixCaching
    from pagetrace.sim.request import SimRequest

    policy = HybridVllmPrefixCaching([KVGroup(F, 1), KVGroup(LayerKind(SLIDING, 5), 1)], 20, 4)
    req = SimRequest("a", list(range(1, 11)), [1, 2], cache_salt="s")
    blocks, hit = policy.lookup(req)
    assert policy.allocate_slots(req, 10, blocks, hit) == [1, 2, 3, 4, 5, 6]  # cdiv(10, 4) = 3 blocks per group, full first
    assert policy.group_tables("a") == [[1, 2, 3], [4, 5, 6]] and policy.block_ids("a") == [1, 2, 3, 4, 5, 6]
    assert policy.group_tables("nobody") == [[], []] and policy.block_ids("nobody") == []
    assert policy.req_to_blocks == {"a": [1, 2, 3, 4, 5, 6]} and policy.held_by_group() == [3, 3]
    assert policy.ever_cached_content == {req.content_hashes[0], req.content_hashes[1]}  # a salted request's 2 full blocks
