"""Bad input to `check`, `replay`, `simulate` and `capacity`, each case one the fuzz
(`test_fuzz_bundles.py`, `test_fuzz_sim.py`) or a user found: a clear message naming the
option or file and the value, the documented exit code, and with --json one document."""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli
from bundles import edit_step, write_bundle


def test_replay_json_on_an_unstored_block_says_why_as_check_does(tmp_path, capsys):
    """Block 2 is in the pool but not stored: check lists it, replay --json prints a document."""
    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["block_table"].__setitem__((1, 1), 2))
    code, out, err = cli(capsys, "check", str(path), "--json", "--no-data")
    found = json.loads(out)["steps"][0]["violations"]
    assert code == 1 and [(v["check"], v["request"], v["logical_block"], v["physical_block"]) for v in found] == [("stored", "b", 1, 2)], found
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["passed"] is False and doc["step"] == 0 and doc["layer"] == 0
    assert [(v["check"], v["physical_block"]) for v in doc["violations"]] == [("stored", 2)]
    assert "block 2, whose page the bundle did not store" in doc["error"]
    assert err.strip() == f"pagetrace: {doc['error']}"
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch")
    assert code == 1 and out == "" and "did not store" in err and len(err.strip().splitlines()) == 1, err


def test_replay_json_on_a_broken_query_start_loc_prints_one_document(tmp_path, capsys):
    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t["query_start_loc"].__setitem__(1, 50))
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json", "--token", "3")
    doc = json.loads(out)
    assert code == 1 and not doc["passed"] and {v["check"] for v in doc["violations"]} == {"query"}, doc


def test_replay_json_on_a_clean_bundle_names_its_step(tmp_path, capsys):
    path = write_bundle(tmp_path / "b")
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"] and doc["step"] == 0 and "violations" not in doc


def test_check_on_a_folder_without_manifest_names_it_once(tmp_path, capsys):
    (tmp_path / "e").mkdir()
    code, out, err = cli(capsys, "check", str(tmp_path / "e"))
    assert_usage_error((code, out, err), "manifest.json")
    assert err.count("manifest.json") == 1 and err.strip().endswith("manifest.json: is missing"), err


@pytest.mark.parametrize("text", [b'{"version": ' + b"9" * 5000 + b"}", b"\xff\xfe", b"{"])
def test_an_unreadable_manifest_is_a_malformed_bundle(tmp_path, capsys, text):
    path = write_bundle(tmp_path / "b")
    (path / "manifest.json").write_bytes(text)
    for command in ("check", "replay"):
        assert_usage_error(cli(capsys, command, str(path)), "manifest.json: is not readable JSON")


def test_a_manifest_folder_is_a_malformed_bundle(tmp_path, capsys):
    path = write_bundle(tmp_path / "b")
    (path / "manifest.json").unlink()
    (path / "manifest.json").mkdir()
    assert_usage_error(cli(capsys, "check", str(path)), "manifest.json: is a folder")


@pytest.mark.parametrize("scale", [float("nan"), float("inf")])
def test_a_non_finite_scale_is_a_malformed_bundle(tmp_path, capsys, scale):
    path = write_bundle(tmp_path / "b")
    doc = json.loads((path / "manifest.json").read_text())
    doc["attention"]["scale"] = scale
    (path / "manifest.json").write_text(json.dumps(doc))
    assert_usage_error(cli(capsys, "replay", str(path), "--backend", "torch"), "attention.scale: must be a finite number")


# -- simulate ---------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "what"), [("", "is empty"), ("\n  \n", "holds only blank lines")])
def test_simulate_an_empty_trace_names_the_file(tmp_path, capsys, text, what):
    trace = tmp_path / "empty.jsonl"
    trace.write_text(text)
    code, out, err = cli(capsys, "simulate", "--trace", str(trace))
    assert_usage_error((code, out, err), "--trace")
    assert repr(str(trace)) in err and what in err, err


def test_simulate_a_trace_number_past_the_digit_limit_is_not_json(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_len": ' + "9" * 5000 + ', "output_len": 4}\n')
    assert_usage_error(cli(capsys, "simulate", "--trace", str(trace)), "trace line 1 is not JSON")


# -- capacity ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"num_hidden_layers": 2, "num_attention_heads": 0, "hidden_size": 64}, "num_attention_heads must be a positive integer, got 0"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 0, "hidden_size": 64}, "num_key_value_heads must be a positive integer, got 0"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": -8}, "head_dim must be a positive integer, got -8"),
        ({"num_hidden_layers": "32", "num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers must be a positive integer, got '32'"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 1e400}, "hidden_size must be a positive integer, got inf"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4}, "hidden_size is missing"),
        ({"num_attention_heads": 4, "hidden_size": 64}, "num_hidden_layers is missing"),
        ({"num_hidden_layers": 2, "num_attention_heads": 128, "hidden_size": 64}, "hidden_size 64 / num_attention_heads 128 is no head size"),
        ({"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "torch_dtype": "int4"}, "torch_dtype 'int4' is not a cache dtype"),
        ({"text_config": 3}, "text_config is not a JSON object"),
    ],
)
def test_capacity_config_names_the_bad_field(tmp_path, capsys, config, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out, err = cli(capsys, "capacity", "--config", str(path))
    assert_usage_error((code, out, err), "--config")
    assert field in err and "division" not in err, err


def test_capacity_config_defaults_kv_heads_and_head_dim_only_when_absent(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": None, "hidden_size": 64, "head_dim": None}))
    code, out, err = cli(capsys, "capacity", "--config", str(path), "--json")
    assert code == 0, err
    dims = json.loads(out)["dims"]
    assert (dims["num_kv_heads"], dims["head_dim"]) == (4, 16)


@pytest.mark.parametrize("memory", ["1e400", "1e300TiB"])
def test_capacity_memory_past_any_float_is_refused(capsys, memory):
    assert_usage_error(cli(capsys, "capacity", "--memory", memory), "--memory")


def test_capacity_config_number_past_the_digit_limit_is_not_json(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{"num_hidden_layers": ' + "9" * 5000 + "}")
    assert_usage_error(cli(capsys, "capacity", "--config", str(path)), "not JSON")


@pytest.mark.parametrize(("args", "option"), [(["--requests", "1000000000"], "--requests"), (["--requests", "2", "--n", "1000000000"], "--n"),
                                              (["--n", "600"], "--n"), (["--requests", "100001"], "--requests")])
def test_simulate_a_workload_too_large_to_run_is_refused_at_once(capsys, args, option):
    """These hung (a billion requests built one by one) before the bound."""
    code, out, err = cli(capsys, "simulate", *args)
    assert_usage_error((code, out, err), option)
    assert "the simulator runs at most 100,000" in err, err


def test_simulate_a_trace_too_large_to_run_is_refused_at_once(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_len": 4, "output_len": 2}\n{"prompt_len": 4, "output_len": 2, "n": 1000000000}\n')
    code, out, err = cli(capsys, "simulate", "--trace", str(trace))
    assert_usage_error((code, out, err), "--trace")
    assert "trace line 2" in err and "100,000" in err, err


def test_replay_a_step_with_no_layer_is_refused_with_a_document(tmp_path, capsys):
    """It raised IndexError (an internal error) before."""
    path = write_bundle(tmp_path / "b")
    doc = json.loads((path / "manifest.json").read_text())
    doc["steps"][0]["layers"] = []
    (path / "manifest.json").write_text(json.dumps(doc))
    code, out, err = cli(capsys, "replay", str(path), "--backend", "torch", "--json")
    assert code == 1 and "stored no layer" in err and "internal error" not in err, err
    assert json.loads(out) == {"bundle": str(path), "step": 0, "layer": None, "passed": False, "error": err.strip()[len("pagetrace: "):], "violations": []}


@pytest.mark.parametrize("gone", ["new_key", "new_value"])
def test_new_keys_without_new_values_is_a_malformed_bundle(tmp_path, capsys, gone):
    """The data check read both (a KeyError, an internal error, before); found by the fuzz."""
    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t.pop(f"layer0.{gone}"))
    assert_usage_error(cli(capsys, "check", str(path)), f"step-0000.safetensors: layer0.{gone}: is missing")
    assert cli(capsys, "check", str(path), "--no-data")[0] == 0


@pytest.mark.parametrize("layer", [[], {}, True, "0"])
def test_a_step_layer_that_is_not_a_layer_index_is_a_malformed_bundle(tmp_path, capsys, layer):
    """A list here raised TypeError (unhashable) before; found by the fuzz."""
    path = write_bundle(tmp_path / "b")
    doc = json.loads((path / "manifest.json").read_text())
    doc["steps"][0]["layers"] = [layer]
    (path / "manifest.json").write_text(json.dumps(doc))
    assert_usage_error(cli(capsys, "check", str(path)), "manifest.json: steps[0].layers[0]")


@pytest.mark.parametrize(("tensor", "dtype", "said"), [("kv", "int8", "the manifest's kv_cache.dtype is fp32"), ("kv", "float16", "kv_cache.dtype is fp32"),
                                                       ("query", "int8", "it must hold floats")])
def test_layer_tensors_of_the_wrong_dtype_are_a_malformed_bundle(tmp_path, capsys, tensor, dtype, said):
    """An int8 cache reached the kernel's own check, which named its `query` argument; found by the fuzz."""
    import torch

    path = write_bundle(tmp_path / "b")
    edit_step(path, lambda t: t.update({f"layer0.{tensor}": t[f"layer0.{tensor}"].to(getattr(torch, dtype))}))
    for command in ("check", "replay"):
        code, out, err = cli(capsys, command, str(path), "--backend", "torch") if command == "replay" else cli(capsys, command, str(path))
        assert_usage_error((code, out, err), f"step-0000.safetensors: layer0.{tensor}: is torch.{dtype}")
        assert said in err, err


@pytest.mark.parametrize("name", [".", "", "/dev/null", "../b/step-0000.safetensors", "x//y"])
def test_a_step_file_outside_the_bundle_is_a_malformed_bundle(tmp_path, capsys, name):
    """'.' named the bundle folder itself (a message naming no file); found by the fuzz."""
    path = write_bundle(tmp_path / "b")
    doc = json.loads((path / "manifest.json").read_text())
    doc["steps"][0]["file"] = name
    (path / "manifest.json").write_text(json.dumps(doc))
    assert_usage_error(cli(capsys, "replay", str(path), "--backend", "torch"), "manifest.json: steps[0].file")


@pytest.mark.parametrize("args, option", [
    (["simulate", "--block-size", "99999999"], "--block-size"),
    (["simulate", "--max-num-seqs", "70000"], "--max-num-seqs"),
    (["capacity", "--head-dim", "100000"], "--head-dim"),
    (["capacity", "--layers", "99999999999"], "--layers"),
    (["capacity", "--kv-heads", "5000"], "--kv-heads"),
    (["capacity", "--block-size", "65537"], "--block-size"),
    (["capacity", "--memory", "1e30"], "--memory"),
    (["capacity", "--memory", "1MiB", "--length", "100"], "--memory"),  # holds no block: 2 MiB per block of this model
    (["capacity", "--memory", "4194303"], "--memory"),  # one byte short of two blocks
    (["capacity", "--length", "0"], "--length"),  # (a bound check once let 0 through as 1: the fuzz test found it)
])
def test_the_size_limits_hold_in_every_command(capsys, args, option):
    assert_usage_error(cli(capsys, *args), option)


def test_two_blocks_exactly_are_a_pool(capsys):
    code, out, err = cli(capsys, "capacity", "--memory", "4194304", "--json")
    doc = json.loads(out)
    assert code == 0, err
    assert (doc["num_blocks"], doc["usable_blocks"], doc["tokens"]) == (2, 1, 16)
