"""`capacity --gpu-memory`: the KV budget as vLLM computes it on a device, each term shown,
checked against what vLLM itself printed for a named model and GPU.

vllm#10517 (RTX 3090, meta-llama/Llama-3.1-8B-Instruct, gpu_memory_utilization 0.90, vLLM's log):
    Loading model weights took 14.9888 GB          (vLLM prints GiB: its format_gib)
    total_gpu_memory=23.58GiB peak_torch_memory=17.06GiB non_torch_memory=0.35GiB
    kv_cache_size=3.81GiB   # GPU blocks: 1952   (block size 16)
peak_torch_memory holds the weights, so the activation peak is 17.06 - 14.9888 = 2.07 GiB.
"""

from __future__ import annotations

import json

import pytest

from conftest import assert_usage_error, cli
from pagetrace.sim.capacity import parameter_count, read_config

LLAMA_31_8B = {  # meta-llama/Llama-3.1-8B-Instruct's config.json, the fields that size it
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
VLLM_BLOCKS = 1952


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_31_8B))
    return str(path)


def budget(capsys, *args):
    code, out, err = cli(capsys, "capacity", "--gpu-memory", "23.58GiB", "--gpu-memory-utilization", "0.9",
                         "--activation", "2.07GiB", "--non-torch", "0.35GiB", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_vllms_own_figures_give_vllms_block_count(capsys, config):
    doc = budget(capsys, "--config", config, "--weights", "14.9888GiB")
    # the log rounds its GiB to two decimals: 23.58 x 0.9 is known to +-0.0045 GiB, about 2 blocks
    assert abs(doc["num_blocks"] - VLLM_BLOCKS) <= 2, doc["num_blocks"]
    assert abs(doc["budget"]["kv_cache_bytes"] / 2**30 - 3.81) < 0.01


def test_weights_counted_from_the_config_land_within_one_percent(capsys, config):
    assert parameter_count(read_config(config), config) == 8_030_261_248  # Llama-3.1-8B: 8.03 B parameters
    doc = budget(capsys, "--config", config)
    assert doc["budget"]["weights_bytes"] == 8_030_261_248 * 2
    assert abs(doc["budget"]["weights_bytes"] / 2**30 - 14.9888) / 14.9888 < 0.005
    assert abs(doc["num_blocks"] - VLLM_BLOCKS) / VLLM_BLOCKS < 0.01, doc["num_blocks"]


def test_tied_embeddings_and_biases_count(tmp_path):
    tied = dict(LLAMA_31_8B, tie_word_embeddings=True)
    qwen = dict(LLAMA_31_8B, architectures=["Qwen2ForCausalLM"])
    paths = []
    for i, cfg in enumerate((tied, qwen)):
        p = tmp_path / f"c{i}.json"
        p.write_text(json.dumps(cfg))
        paths.append(str(p))
    assert parameter_count(read_config(paths[0]), paths[0]) == 8_030_261_248 - 128256 * 4096  # one vocab x hidden matrix fewer
    assert parameter_count(read_config(paths[1]), paths[1]) == 8_030_261_248 + 32 * (4096 + 2 * 1024)  # q, k, v biases per layer


def test_each_term_is_printed(capsys, config):
    code, out, _ = cli(capsys, "capacity", "--config", config, "--gpu-memory", "80GB")
    assert code == 0
    for words in ("× 0.9 = 72,000,000,000", "- weights", "8,030,261,248 parameters", "- activation peak", "estimate: 8,192 tokens", "= KV cache budget"):
        assert words in " ".join(out.split()), words


@pytest.mark.parametrize("args, option", [
    (["--gpu-memory", "20GB"], "--weights"),  # no config: no weights to count
    (["--gpu-memory", "20GB", "--weights", "15GiB"], "--activation"),
    (["--gpu-memory", "16GiB", "--weights", "15GiB", "--activation", "1GiB"], "--gpu-memory"),  # nothing left for the cache
    (["--gpu-memory", "80GB", "--gpu-memory-utilization", "1.5", "--weights", "1GB", "--activation", "1GB"], "--gpu-memory-utilization"),
    (["--weights", "15GiB"], "--weights"),  # a device term without a device
])
def test_refusals_name_the_term(capsys, args, option):
    assert_usage_error(cli(capsys, "capacity", *args), option)


def test_a_mixture_of_experts_is_not_guessed(capsys, tmp_path):
    p = tmp_path / "moe.json"
    p.write_text(json.dumps(dict(LLAMA_31_8B, num_local_experts=8)))
    assert_usage_error(cli(capsys, "capacity", "--config", str(p), "--gpu-memory", "80GB"), "--config")
