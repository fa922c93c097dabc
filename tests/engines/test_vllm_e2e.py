"""End to end with the real vLLM engine: capture, check, replay, look up.

Runs examples/vllm_capture.py once per CPU attention ISA (a tiny random Llama, vLLM V1 on
the CPU, prefix caching, two prompts sharing 69 tokens = two full 32-token blocks, prefill
+ 3 decode steps): as vLLM picks it on this machine, then forced to vec, vec16 and amx (the
page layout follows the ISA, so every machine tests every layout). Each bundle is checked
against references written here, independent of pagetrace's layout table: the CPU
backend's pages decoded by hand from vLLM's writer (vec: K column-major, V row-major; amx:
the tiles of csrc/cpu/cpu_attn_amx.hpp).
"""

from __future__ import annotations

import html
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import cli

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed: pip install -e '.[vllm]' to run the real-engine test", allow_module_level=True)

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]
BF16_TOL = 1.6e-2


def run_example(out: Path, *extra: str) -> Path:
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "vllm_capture.py"), "--out", str(out), *extra], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    print(f"vLLM capture {' '.join(extra)} took {time.perf_counter() - start:.1f} s")
    return out


def amx_ready() -> bool:
    return torch.cpu._is_amx_tile_supported()


# None: the ISA vLLM picks on this machine. amx's attention kernel runs AMX tile instructions,
# so forcing it needs a CPU with AMX; its layout is still checked everywhere against the
# formula (tests/paging/test_layout_model.py) and, where vLLM's _C loads, against the writer itself.
ISAS = [None, "vec", "vec16", pytest.param("amx", marks=pytest.mark.skipif(not amx_ready(), reason="forcing amx runs AMX tile instructions; this CPU has no AMX"))]


@pytest.fixture(scope="module", params=ISAS, ids=lambda isa: isa or "picked")
def bundle(request, tmp_path_factory) -> Path:
    extra = ("--isa", request.param) if request.param else ()
    return run_example(tmp_path_factory.mktemp("vllm") / "capture.bundle", *extra)


def load(bundle: Path, step: int) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    return json.loads((bundle / "manifest.json").read_text()), load_file(str(bundle / f"step-{step:04d}.safetensors"))


def isa_of(bundle: Path) -> str:
    return json.loads((bundle / "manifest.json").read_text())["engine"]["isa"]


def page_offsets(isa: str, bs: int, d: int, element_size: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """[bs, D] element offsets of K and V inside one (block, head) page of 2*bs*D, written
    out from vLLM's writer (csrc/cpu): vec/vec16 K column-major, V row-major after bs*D keys;
    amx K in 16-slot groups of dword pairs, V in 16-dim groups of slot pairs (p = 4 / element size)."""
    s, e = torch.meshgrid(torch.arange(bs), torch.arange(d), indexing="ij")
    if isa == "amx":
        p = 4 // element_size
        k = (s // 16) * 16 * d + (e // p) * 16 * p + (s % 16) * p + e % p
        v = bs * d + (e // 16) * 16 * bs + (s // p) * 16 * p + (e % 16) * p + s % p
        return k, v
    return e * bs + s, bs * d + s * d + e


def pages_by_hand(kv: torch.Tensor, bs: int, d: int, isa: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU backend's [N, H, bs, 2D] pages as K and V [N, bs, H, D], decoded element by element."""
    n, h = kv.shape[:2]
    page = kv.reshape(n, h, 2 * bs * d)
    ko, vo = page_offsets(isa, bs, d)
    return page[:, :, ko].permute(0, 2, 1, 3), page[:, :, vo].permute(0, 2, 1, 3)


def key_byte(isa: str, physical: int, slot: int) -> int:
    """Byte of (physical block, slot, KV head 0, dim 0)'s key in the [N, H=2, bs=32, 2D=64] bf16 cache."""
    return (physical * 2 * 32 * 64 + int(page_offsets(isa, 32, 32)[0][slot, 0])) * 2


def test_capture_holds_prefill_decode_and_shared_prefix(bundle):
    manifest, t0 = load(bundle, 0)
    isa = manifest["engine"]["isa"]
    assert manifest["engine"]["name"] == "vllm" and manifest["kv_cache"]["layout"] == ("vllm-cpu-amx" if isa == "amx" else "vllm-cpu")
    proof = manifest["kv_cache"]["layout_proof"]
    assert proof["method"] == "writer" and proof["isa"] == isa and proof["explained_by"] == [manifest["kv_cache"]["layout"]]
    assert proof["elements"] == 2 * 3 * 32 * 2 * 32  # K and V of 3 blocks x 32 slots x 2 heads x 32 dims, every one placed
    assert len(manifest["steps"]) == 4
    assert {s["positions"] for s in manifest["steps"]} == {"model input"}  # what the model received, not derived
    qsl = t0["query_start_loc"].tolist()
    assert qsl[1] - qsl[0] > 1  # a prefill
    _, t1 = load(bundle, 1)
    assert t1["query_start_loc"].tolist() == [0, 1, 2]  # a decode step
    table = t1["block_table"]
    assert table[0, :2].tolist() == table[1, :2].tolist() and 0 not in table[0, :2].tolist()  # two full blocks shared


def test_check_passes_on_the_real_capture(bundle, capsys):
    code, out, err = cli(capsys, "check", str(bundle), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], doc
    assert [s["step"] for s in doc["steps"]] == [0, 1, 2, 3]


def test_pages_decoded_by_hand_hold_what_vllm_wrote(bundle):
    """The layout claim itself, against data: each new token's K/V at its slot."""
    _, t = load(bundle, 0)
    k, v = pages_by_hand(t["layer0.kv"], 32, 32, isa_of(bundle))
    compact = {b: i for i, b in enumerate(t["blocks"].tolist())}
    for i, slot in enumerate(t["slot_mapping"].tolist()):
        b, o = compact[slot // 32], slot % 32
        assert torch.equal(k[b, o], t["layer0.new_key"][i]) and torch.equal(v[b, o], t["layer0.new_value"][i])


@pytest.mark.parametrize("step,layer", [(1, 0), (3, 1), (0, 1)])
def test_replay_matches_vllm_and_contiguous_attention(bundle, capsys, step, layer):
    code, out, err = cli(capsys, "replay", str(bundle), "--step", str(step), "--layer", str(layer), "--backend", "interpret", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], doc
    for r in doc["requests"]:
        assert r["max_diff_engine"] <= BF16_TOL and r["max_diff_contiguous"] <= BF16_TOL
    # and the engine's output against attention written here over the hand-decoded pages
    _, t = load(bundle, step)
    k, v = pages_by_hand(t[f"layer{layer}.kv"], 32, 32, isa_of(bundle))
    compact = {b: i for i, b in enumerate(t["blocks"].tolist())}
    qsl, lens, table = t["query_start_loc"].tolist(), t["seq_lens"].tolist(), t["block_table"].tolist()
    for r in range(len(lens)):
        for j, i in enumerate(range(qsl[r], qsl[r + 1])):
            n = lens[r] - (qsl[r + 1] - qsl[r]) + j + 1
            idx = [compact[table[r][p // 32]] for p in range(n)]
            keys = k[idx, [p % 32 for p in range(n)]].float().repeat_interleave(2, dim=1)  # GQA: 4 heads over 2 KV heads
            vals = v[idx, [p % 32 for p in range(n)]].float().repeat_interleave(2, dim=1)
            q = t[f"layer{layer}.query"][i].float()
            w = torch.softmax(torch.einsum("hd,thd->ht", q, keys) * 32**-0.5, dim=-1)
            want = torch.einsum("ht,thd->hd", w, vals)
            got = t[f"layer{layer}.output"][i].float()
            assert (got - want).abs().max() <= BF16_TOL * (1 + want.abs().max())
            assert w.max() > 0.1  # attention is sharp: a wrong layout cannot pass by averaging


def test_replay_diagram_shows_shared_blocks(bundle, capsys, tmp_path):
    svg = tmp_path / "tables.svg"
    code, out, err = cli(capsys, "replay", str(bundle), "--step", "1", "--request", "1", "--svg", str(svg), "--backend", "interpret")
    assert code == 0, err
    text = html.unescape(svg.read_text())
    assert "ref count 2" in text and "req 1-" in text and "req 0-" in text
    assert "x2" in out  # the per-request table marks shared blocks with their count


def test_lookup_from_bundle_gives_the_real_byte(bundle, capsys):
    code, out, err = cli(capsys, "lookup", "--from", str(bundle), "--request", "1", "--token", "40", "--json")
    doc = json.loads(out)
    assert code == 0, err
    manifest, t = load(bundle, 0)
    isa = manifest["engine"]["isa"]
    physical = t["block_table"][1, 1].item()
    assert doc["physical_block"] == physical and doc["slot"] == physical * 32 + 8
    # [N, H=2, bs=32, 2D=64] bf16: block base + head 0 + the writer's place of (slot 8, dim 0)
    ko, vo = page_offsets(isa, 32, 32)
    base = physical * 2 * 32 * 64
    assert doc["key"]["byte_offset"] == key_byte(isa, physical, 8) == (base + int(ko[8, 0])) * 2
    assert doc["value"]["byte_offset"] == (base + int(vo[8, 0])) * 2
    # every element of the vector, run by run: the bytes there (in the stored page) are the key
    # vLLM wrote for that token, and the last byte is the last byte of the vector's last element
    kv = t["layer0.kv"].reshape(-1)
    page = t["blocks"].tolist().index(physical) * 2 * 32 * 64
    at = lambda e: kv[page + e - base]  # noqa: E731
    key = torch.stack([at(c["element_offset"] + j) for c in doc["key"]["chunks"] for j in range(c["elements"])])
    assert sum(c["elements"] for c in doc["key"]["chunks"]) == 32
    assert doc["key"]["last_byte"] == (base + int(ko[8].max())) * 2 + 1
    # request 1 reuses request 0's prefix blocks: token 40 was written by request 0 (token row 40)
    assert t["seq_lens"][0].item() - t["query_start_loc"][1].item() == 0
    assert torch.equal(key, t["layer0.new_key"][40, 0])


def copy_with(bundle: Path, tmp_path: Path, step: int, edit) -> Path:
    from safetensors.torch import save_file

    out = tmp_path / "edited.bundle"
    shutil.copytree(bundle, out)
    _, tensors = load(out, step)
    edit(tensors)
    save_file(tensors, str(out / f"step-{step:04d}.safetensors"))
    return out


@pytest.mark.parametrize("claimed", ["vllm-hnd", "other-isa"])
def test_wrong_layout_is_caught(bundle, capsys, tmp_path, claimed):
    """A label that does not match the pages is found by check (data) and by replay (vs vLLM):
    vllm-hnd has the same raw shape; the other ISA's layout is the mislabel an AMX machine made."""
    wrong = tmp_path / "wrong.bundle"
    shutil.copytree(bundle, wrong)
    manifest = json.loads((wrong / "manifest.json").read_text())
    if claimed == "other-isa":
        claimed = "vllm-cpu" if manifest["kv_cache"]["layout"] == "vllm-cpu-amx" else "vllm-cpu-amx"
    manifest["kv_cache"]["layout"] = claimed
    (wrong / "manifest.json").write_text(json.dumps(manifest))
    code, out, _ = cli(capsys, "check", str(wrong), "--step", "1", "--json")
    assert code == 1 and {v["check"] for v in json.loads(out)["steps"][0]["violations"]} == {"data"}
    code, out, _ = cli(capsys, "replay", str(wrong), "--step", "1", "--backend", "interpret", "--json")
    doc = json.loads(out)
    assert code == 1 and not doc["passed"] and max(r["max_diff_engine"] for r in doc["requests"]) > 0.1


def test_the_backends_own_python_view_is_refused_as_the_cpu_layout(bundle):
    """vLLM's Python view of the CPU cache ([N, H, 2bs, D] chunked) has the right shape and
    row-major K strides; the C++ writers store K column-major (vec) or tiled (amx), so the
    claim must fail either way."""
    from pagetrace.engines.views import check_view, describe, expected_view, geometry, verify
    from pagetrace.errors import UsageError

    manifest, t = load(bundle, 1)
    kv = t["layer0.kv"]
    n, h, bs, d2 = kv.shape
    naive_k = kv.view(n, h, 2 * bs, d2 // 2).chunk(2, dim=2)[0].permute(0, 2, 1, 3)
    naive_v = kv.view(n, h, 2 * bs, d2 // 2).chunk(2, dim=2)[1].permute(0, 2, 1, 3)
    layout = manifest["kv_cache"]["layout"]
    if layout == "vllm-cpu":
        key = expected_view(geometry("vllm-cpu", n, bs, h, d2 // 2, "bf16"), "key")
        with pytest.raises(UsageError, match="slot stride is 32 elements; the 'vllm-cpu' layout has 1"):
            check_view(describe(naive_k, kv, "key"), key, "vllm-cpu")
    else:
        with pytest.raises(UsageError, match="is tiled: no strided view reads it"):
            verify(naive_k, naive_v, kv, layout)


def test_a_changed_table_entry_is_named(bundle, capsys, tmp_path):
    def edit(t):
        t["block_table"][1, 2] = 9  # request 1's last block, where its decode token (position 74) is written
    bad = copy_with(bundle, tmp_path, 1, edit)
    code, out, _ = cli(capsys, "check", str(bad), "--step", "1", "--no-data", "--json")
    doc = json.loads(out)
    violations = doc["steps"][0]["violations"]
    # block 9 is in the pool but not in the bundle: the slot check names the token, the stored check the block
    assert code == 1 and sorted(v["check"] for v in violations) == ["slot", "stored"], violations
    v = next(v for v in violations if v["check"] == "slot")
    assert (v["check"], v["request"], v["token"], v["logical_block"], v["physical_block"]) == ("slot", doc["steps"][0]["requests"][1], 74, 2, 9)
    _, t = load(bundle, 1)
    written = t["block_table"][1, 2].item() * 32 + 74 % 32  # the slot vLLM wrote, by the table before the edit
    assert v["slot"] == written and v["byte"] == key_byte(isa_of(bundle), written // 32, written % 32)  # the byte of that slot
    stored = next(v for v in violations if v["check"] == "stored")
    assert (stored["request"], stored["logical_block"], stored["physical_block"]) == (v["request"], 2, 9)


def test_a_changed_slot_is_named(bundle, capsys, tmp_path):
    def edit(t):
        t["slot_mapping"][0] += 1
    bad = copy_with(bundle, tmp_path, 2, edit)
    code, out, _ = cli(capsys, "check", str(bad), "--step", "2", "--no-data", "--json")
    doc = json.loads(out)
    violations = doc["steps"][0]["violations"]
    _, t = load(bundle, 2)
    physical = t["block_table"][0, 2].item()
    assert code == 1 and len(violations) == 1, violations
    v = violations[0]
    assert (v["check"], v["request"], v["token"], v["physical_block"], v["slot"]) == ("slot", doc["steps"][0]["requests"][0], 73, physical, t["slot_mapping"][0].item() + 1)
    slot = v["slot"]
    assert v["byte"] == key_byte(isa_of(bundle), slot // 32, slot % 32)  # the byte of the slot the engine wrote


def test_chunked_prefill_and_mixed_steps(tmp_path, capsys):
    """40 tokens per step: vLLM prefills the 72- and 74-token prompts in chunks, and a later
    step mixes a decode with the last chunk. Each step is checked and replayed."""
    chunked = run_example(tmp_path / "chunked.bundle", "--max-batched-tokens", "40")
    capsys.readouterr()  # the timing line
    code, out, err = cli(capsys, "check", str(chunked), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["passed"], doc
    kinds = set()
    for entry in doc["steps"]:
        _, t = load(chunked, entry["step"])
        qlens = (t["query_start_loc"][1:] - t["query_start_loc"][:-1]).tolist()
        lens = t["seq_lens"].tolist()
        chunk = any(1 < q < n for q, n in zip(qlens, lens))
        mixed = 1 in qlens and any(q > 1 for q in qlens)
        if chunk or mixed:
            kinds |= {"chunk"} if chunk else set()
            kinds |= {"mixed"} if mixed else set()
            code, out, err = cli(capsys, "replay", str(chunked), "--step", str(entry["step"]), "--backend", "interpret", "--json")
            replayed = json.loads(out)
            assert code == 0 and replayed["passed"], replayed
            assert all(r["max_diff_engine"] <= BF16_TOL for r in replayed["requests"])
    assert kinds == {"chunk", "mixed"}
