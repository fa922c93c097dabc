"""`lookup --from` and `bundle_lookup` as a user calls them: a bundle of two steps (the
default is the first; `--step 1` reads the second, where the request has grown a token), the
Python call with its defaults, a layout with separate key and value buffers, and the printed
lines word for word. Addresses are computed here from each layout's memory order."""

from __future__ import annotations

import json
import shutil

import torch
from conftest import cli

from bundles import engine_buffer, write_bundle as hand_bundle
from pagetrace.engines.address import bundle_lookup
from pagetrace.engines.export import write_bundle

NB, BS, H, D = 6, 4, 2, 8


def two_steps(tmp_path):
    """One request decoding on the `nhd` layout: step 0 at 4 tokens (table [2], one full
    block), step 1 at 5 tokens (table [2, 3]: its token 4 opens block 3)."""
    torch.manual_seed(0)
    k, v = torch.randn(NB, BS, H, D), torch.randn(NB, BS, H, D)
    raw = engine_buffer("nhd", k, v)
    common = dict(engine="mine", layout="nhd", cache=raw, block_size=BS, num_heads=4)
    first = write_bundle(tmp_path / "b", tables=[[2]], seq_lens=[4], **common)
    second = write_bundle(tmp_path / "s1", tables=[[2, 3]], seq_lens=[5], **common)
    shutil.copy(second / "step-0000.safetensors", first / "step-0001.safetensors")
    manifest = json.loads((first / "manifest.json").read_text())
    manifest["steps"].append({**manifest["steps"][0], "step": 1, "file": "step-0001.safetensors"})
    (first / "manifest.json").write_text(json.dumps(manifest))
    return first


def nhd_element(block, slot, head, dim=0):
    return ((block * BS + slot) * H + head) * D + dim


def test_lookup_from_reads_the_step_asked_for_and_the_first_by_default(tmp_path, capsys):
    path = two_steps(tmp_path)
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "4", "--step", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["step"], doc["seq_len"], doc["block_table"], doc["physical_block"], doc["slot"]) == (1, 5, [2, 3], 3, 3 * BS)
    # token 4 does not exist yet in step 0, the default
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "4")
    assert (code, out, err.strip()) == (2, "", "pagetrace: invalid value for --token: 4: request 0 holds tokens 0..3 in step 0"), err
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "0", "--token", "3", "--json")
    assert code == 0 and json.loads(out)["step"] == 0, err


def test_bundle_lookup_called_with_its_defaults(tmp_path):
    """The Python call: step None (the first), head 0; nhd keeps K and V in two buffers."""
    path = two_steps(tmp_path)
    doc = bundle_lookup(str(path), "0", 2)
    assert (doc["step"], doc["head"], doc["num_blocks"], doc["block_size"], doc["physical_block"], doc["slot"]) == (0, 0, NB, BS, 2, 2 * BS + 2)
    for which in ("key", "value"):
        a = doc[which]
        first = nhd_element(2, 2, 0)
        assert (a["which"], a["buffer"], a["element_offset"], a["byte_offset"]) == (which, which, first, first * 4)
        assert a["last_byte"] == (first + D - 1) * 4 + 3
    doc = bundle_lookup(str(path), "0", 4, step=1, head=1)
    assert (doc["step"], doc["head"], doc["physical_block"]) == (1, 1, 3)
    assert doc["key"]["element_offset"] == nhd_element(3, 0, 1)


def test_lookup_from_prints_each_vectors_runs(tmp_path, capsys):
    """The hand bundle (vllm-cpu, blocks of 4, 2 KV heads, head_dim 8): request b's token 6 is
    offset 2 of block 5. Per (block, head) page of 2 x 4 x 8 elements the key is column-major
    (dim d at d x 4 + slot), the value row-major after it (4 x 8 + slot x 8 + d)."""
    path = hand_bundle(tmp_path / "b")
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "6", "--json")
    assert code == 0, err
    doc = json.loads(out)
    page = 5 * H * 2 * BS * D  # block 5, head 0
    key, value = page + 2, page + BS * D + 2 * D
    assert (doc["key"]["element_offset"], doc["value"]["element_offset"]) == (key, value)
    code, out, err = cli(capsys, "lookup", "--from", str(path), "--request", "b", "--token", "6")
    assert code == 0, err
    lines = out.splitlines()
    assert f"    key (KV head 0) at element {key} = byte {key * 4} of the kv buffer; {doc['key']['formula']}; 8 single elements, " \
           f"4 elements (16 bytes) apart, at {key}, {key + 4}, {key + 8}, {key + 12}, ..." in lines, lines
    assert f"    value (KV head 0) at element {value} = byte {value * 4} of the kv buffer; {doc['value']['formula']}; contiguous, 8 elements" in lines, lines
