"""The metadata ring (engines/meta_ring.py): what it says it holds, it holds, value for value.

The reference is the step itself: each step's tensors are kept aside in the test (as plain
lists) and every step the ring states is decoded and compared with them. The steps come from
a small persistent batch like vLLM's: requests arrive (chunked prefill), decode, leave, and a
row is taken by a new request; slots follow the tables, with padding after the real tokens.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pagetrace.engines import meta_ring
from pagetrace.engines.bundle import LiveBundle, read_manifest, read_step, step_entries, steps_holding
from pagetrace.engines.meta_ring import MetaRing, read_segment

BS = 16


class Batch:
    """A persistent batch over a pool: rows keep their request until it finishes."""

    def __init__(self, rows: int, seed: int, width: int = 64, chunk: int = 48) -> None:
        self.rng = np.random.default_rng(seed)
        self.rows, self.width, self.chunk = rows, width, chunk
        self.table = torch.zeros(rows, width, dtype=torch.int32)
        self.reqs: list[dict | None] = [None] * rows
        self.serial, self.next_block = 0, 1

    def block(self) -> int:
        self.next_block = self.next_block % 50_000 + 1
        return self.next_block

    def step(self) -> dict:
        for r in range(self.rows):
            req = self.reqs[r]
            if req is None or req["done"] >= req["total"]:
                if self.rng.random() < 0.7:
                    prompt = int(self.rng.integers(1, 300))
                    self.reqs[r] = {"id": f"cmpl-{self.serial}-0-{self.serial * 2654435761 % (1 << 32):08x}", "prompt": prompt,
                                    "total": prompt + int(self.rng.integers(1, 200)), "done": 0}
                    self.serial += 1
                else:
                    self.reqs[r] = None
        live = [r for r in range(self.rows) if self.reqs[r] is not None]
        qsl, lens, slots, positions, ids = [0], [], [], [], []
        table = torch.zeros(len(live), self.width, dtype=torch.int32)
        for i, r in enumerate(live):
            req = self.reqs[r]
            q = min(self.chunk, req["prompt"] - req["done"]) if req["done"] < req["prompt"] else 1
            n = req["done"] + q
            need = -(-n // BS)
            for j in range(need):
                if j >= -(-req["done"] // BS) or (req["done"] == 0):
                    if j >= -(-req["done"] // BS):
                        self.table[r, j] = self.block()
            table[i] = self.table[r]
            for p in range(req["done"], n):
                slots.append(int(self.table[r, p // BS]) * BS + p % BS)
                positions.append(p)
            req["done"] = n
            qsl.append(qsl[-1] + q)
            lens.append(n)
            ids.append(req["id"])
        pad = int(self.rng.integers(0, 5))
        return {"requests": ids, "query_start_loc": torch.tensor(qsl, dtype=torch.int32), "seq_lens": torch.tensor(lens, dtype=torch.int32),
                "block_table": table, "slot_mapping": torch.tensor(slots + [-1] * pad, dtype=torch.int64),
                "positions": torch.tensor(positions, dtype=torch.int64)}


def plain(step: dict) -> dict:
    """The parts of a step the ring keeps, as lists (the used part of each table row)."""
    lens = step["seq_lens"].tolist()
    return {"requests": list(step["requests"]), "query_start_loc": step["query_start_loc"].tolist(), "seq_lens": lens,
            "table": [step["block_table"][r, : -(-n // BS)].tolist() for r, n in enumerate(lens)],
            "slot_mapping": step["slot_mapping"].tolist(), "positions": step["positions"].tolist()}


def decoded(s: dict) -> dict:
    lens = s["seq_lens"].tolist()
    return {"requests": s["requests"], "query_start_loc": s["query_start_loc"].tolist() if lens else [0], "seq_lens": lens,
            "table": [s["block_table"][r, : -(-n // BS)].tolist() for r, n in enumerate(lens)],
            "slot_mapping": s["slot_mapping"].tolist(), "positions": s["positions"].tolist()}


class Files:
    """A sink that keeps the segment files as the plugin's bundle does."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.index: dict | None = None

    def __call__(self, name, data, index, dropped) -> None:
        if name is not None:
            self.files[name] = data
        for d in dropped:
            del self.files[d]
        self.index = index


def test_after_10000_steps_the_ring_holds_exactly_what_it_states():
    batch, files = Batch(rows=8, seed=1), Files()
    ring = MetaRing(160 << 10, BS, sink=files, segment_steps=512)  # 160 KiB: the oldest segments must leave
    originals = {}
    for n in range(10_000):
        step = batch.step()
        originals[n] = plain(step)
        ring.add(n, step["requests"], step["query_start_loc"], step["seq_lens"], step["block_table"], step["slot_mapping"], step["positions"])
        for t in (step["query_start_loc"], step["seq_lens"], step["block_table"], step["slot_mapping"], step["positions"]):
            t.fill_(-99)  # vLLM fills the same buffers again at the next step: the ring must have kept its own copy
        assert ring.bytes <= ring.bound, n  # at every step, not only at the end
    info, data, dropped = ring.flush()
    for d in dropped:
        del files.files[d]
    held = dict(files.files)
    held[info["file"]] = data
    index = ring.index(info)
    got = {}
    for seg in index["segments"]:
        steps = read_segment(held[seg["file"]])
        assert [s["step"] for s in steps] == list(range(seg["first"], seg["last"] + 1)) and len(steps) == seg["steps"]
        got.update({s["step"]: decoded(s) for s in steps})
    assert sorted(held) == sorted(s["file"] for s in index["segments"])  # nothing kept that is not stated
    assert index["last"] == 9_999 and 0 < index["first"] and index["steps"] == 10_000 - index["first"]  # older steps left
    assert sorted(got) == list(range(index["first"], 10_000))
    assert index["bytes"] == sum(len(held[s["file"]]) for s in index["segments"]) <= index["bound_bytes"]
    assert index["bytes"] + max(s["bytes"] for s in index["segments"]) > index["bound_bytes"]  # and no segment left that fitted
    for n, want in got.items():
        assert want == originals[n], n


def test_a_batch_of_256_fits_100000_decode_steps_in_256_mib():
    rows, files = 256, Files()
    ring = MetaRing(256 << 20, BS, sink=files)
    lens = np.arange(rows) * 7 + 100
    table = torch.zeros(rows, 512, dtype=torch.int32)
    nxt = 1
    for r in range(rows):
        for j in range(-(-int(lens[r]) // BS)):
            table[r, j], nxt = nxt, nxt + 1
    ids = [f"cmpl-{r}-0-{r * 40503:08x}" for r in range(rows)]
    steps = 2_048
    for n in range(steps):
        lens = lens + 1
        for r in np.flatnonzero((lens - 1) % BS == 0):
            table[r, (lens[r] - 1) // BS], nxt = nxt, nxt + 1
        sl = torch.tensor(lens, dtype=torch.int32)
        slots = table[torch.arange(rows), (sl.long() - 1) // BS].long() * BS + (sl.long() - 1) % BS
        ring.add(n, ids, torch.arange(rows + 1, dtype=torch.int32), sl, table, slots, sl.long() - 1)
    per_step = ring.bytes / steps
    assert per_step * 100_000 <= 256 << 20, f"{per_step:.0f} bytes a step"


@pytest.mark.parametrize("value", [0, 1, -1, 127, 128, -128, -129, 32767, 32768, -32769, 2**31 - 1, 2**31, -(2**31) - 1, 5_000_000, 2**40, -(2**62)])
def test_every_value_comes_back_at_the_edges_of_each_integer_width(value):
    ring = MetaRing(1 << 20, BS, sink=Files())
    table = torch.tensor([[3, 4], [5, 6]], dtype=torch.int64)
    for n in range(3):  # whole, then the difference from a step with the value, then back
        v = value if n == 1 else 0
        t = table.clone()
        t[1, 1] = v
        ring.add(n, ["a", "b"], torch.tensor([0, 1, 2]), torch.tensor([17, 32]), t, torch.tensor([v, 7, -1]), torch.tensor([16, v]))
    info, data, _ = ring.flush()
    steps = read_segment(data)
    assert steps[1]["block_table"][1, 1] == value
    assert steps[1]["slot_mapping"].tolist() == [value, 7, -1] and steps[1]["positions"].tolist() == [16, value]
    assert steps[2]["slot_mapping"].tolist() == [0, 7, -1] and steps[0]["block_table"].tolist() == [[3, 4], [5, 0]]


def test_a_negative_table_entry_is_kept_apart_from_padding():
    """-1 marks an unused entry in the ring's own table; a table entry of -1 in a used slot must
    still come back (the guard's `pool` violation), not read as unused."""
    ring = MetaRing(1 << 20, BS)
    ring.add(0, ["a"], torch.tensor([0, 1]), torch.tensor([20]), torch.tensor([[9, -1, 0]]), torch.tensor([-1]))
    ring.add(1, ["a"], torch.tensor([0, 1]), torch.tensor([21]), torch.tensor([[9, -7, 0]]), torch.tensor([-1]))
    steps = read_segment(ring.flush()[1])
    assert steps[0]["block_table"].tolist() == [[9, -1]] and steps[1]["block_table"].tolist() == [[9, -7]]


def ring_bundle(tmp_path, plant_at: int | None = None, steps: int = 300, file_step: bool = False) -> tuple:
    """A bundle as the plugin writes it with PAGETRACE_PAGES=flagged: the ring's segments, no step file."""
    batch = Batch(rows=4, seed=3)
    manifest = {
        "engine": {"name": "vllm", "version": "0.32.0", "backend": "CPU_ATTN"},
        "model": {"num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "head_dim": 8},
        "kv_cache": {"dtype": "fp32", "layout": "vllm-cpu", "block_size": BS, "kernel_block_size": BS, "num_blocks": 60_000,
                     "null_block": 0, "table_padding": 0, "slot_padding": -1, "sharing": "none"},
        "attention": {"scale": 0.35, "causal": True, "sliding_window": None},
        "layers": [{"index": 0, "name": "model.layers.0.self_attn.attn"}],
    }
    live = LiveBundle(tmp_path / "b.bundle", manifest)
    ring = MetaRing(8 << 20, BS, sink=lambda name, data, index, dropped: live.add_ring(name, data, index, dropped), segment_steps=128)
    originals = {}
    for n in range(steps):
        step = batch.step()
        if n == plant_at:
            step["block_table"][0, 0] = 5_000_000
        originals[n] = plain(step)
        ring.add(n, step["requests"], step["query_start_loc"], step["seq_lens"], step["block_table"], step["slot_mapping"], step["positions"])
    if file_step:  # the last step also as a step file, as the guard writes the step it flags
        counts = (step["seq_lens"].long() + BS - 1) // BS
        blocks = torch.unique(torch.cat([step["block_table"][r, : int(c)].long() for r, c in enumerate(counts)]))
        live.add(steps - 1, step["requests"], [], {**{k: step[k] for k in ("query_start_loc", "seq_lens", "block_table", "slot_mapping", "positions")},
                                                   "block_counts": counts.to(torch.int32), "blocks": blocks})
    info, data, dropped = ring.flush()
    live.add_ring(info["file"], data, ring.index(info), dropped)
    return live.path, originals


def test_a_bundle_of_the_ring_alone_reads_every_step_as_it_was(tmp_path):
    path, originals = ring_bundle(tmp_path)
    manifest = read_manifest(path)
    assert [e["step"] for e in step_entries(manifest)] == list(range(300))
    for n in (0, 127, 128, 299):
        st = read_step(path, manifest, n)
        assert st.ring and st.layers == [] and st.requests == originals[n]["requests"]
        assert st.seq_lens == originals[n]["seq_lens"] and st.slot_mapping == originals[n]["slot_mapping"]
        assert [row[: st.block_counts[r]] for r, row in enumerate(st.block_table)] == originals[n]["table"]
        assert st.dtypes == {"query_start_loc": "int32", "seq_lens": "int32", "block_table": "int32", "slot_mapping": "int64", "positions": "int64"}
    request = originals[200]["requests"][0]
    holding = steps_holding(manifest, request)
    assert holding == [n for n in range(300) if request in originals[n]["requests"]]


def test_check_reads_the_ring_and_names_a_fault_in_it(tmp_path, capsys):
    from pagetrace.cli import run_cli as main

    path, originals = ring_bundle(tmp_path, plant_at=250)
    assert main(["check", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ring"]["steps"] == 300 and doc["ring"]["first"] == 0 and doc["ring"]["last"] == 299
    bad = [s for s in doc["steps"] if s["violations"]]
    assert [s["step"] for s in bad] == [250] and bad[0]["ring"] is True
    assert {v["check"] for v in bad[0]["violations"]} >= {"pool"} and "stored" not in {v["check"] for v in bad[0]["violations"]}
    assert main(["check", str(path), "--step", "249"]) == 0
    out = capsys.readouterr().out
    assert "metadata ring: steps 0..299 (300 steps" in out and "step 249:" in out and "clean (metadata ring)" in out


def test_replay_refuses_a_ring_step_and_lookup_reads_it(tmp_path, capsys):
    from pagetrace.cli import run_cli as main

    path, originals = ring_bundle(tmp_path)
    request = originals[100]["requests"][1]
    assert main(["replay", str(path), "--step", "100", "--request", request]) == 1
    err = capsys.readouterr().err
    assert "step 100 is in the bundle's metadata ring" in err and "no step of this bundle has pages" in err
    assert main(["lookup", "--from", str(path), "--step", "100", "--request", request, "--token", "0", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["step"] == 100 and doc["block_table"] == originals[100]["table"][1]


def test_a_request_of_the_rings_first_step_is_read_there_not_in_the_flagged_step_file(tmp_path, capsys):
    """The bundle of a flagged step: its step file is the manifest's first (and only) step, the
    ring's steps come before it. A request the ring's first step holds is read there."""
    from pagetrace.cli import run_cli as main

    path, originals = ring_bundle(tmp_path, file_step=True)
    assert [e["step"] for e in read_manifest(path).steps] == [299]
    request = originals[0]["requests"][0]
    assert request not in originals[299]["requests"]
    assert main(["lookup", "--from", str(path), "--request", request, "--token", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step"] == 0
    assert main(["check", str(path), "--json"]) == 0  # without --ring: the step file only
    assert [s["step"] for s in json.loads(capsys.readouterr().out)["steps"]] == [299]


def test_a_damaged_segment_is_named_not_a_traceback(tmp_path, capsys):
    from pagetrace.cli import run_cli as main

    path, _ = ring_bundle(tmp_path)
    seg = sorted(path.glob("ring-*.bin"))[0]
    seg.write_bytes(seg.read_bytes()[: len(meta_ring.MAGIC) + 40])
    assert main(["check", str(path), "--step", "3"]) == 2
    err = capsys.readouterr().err
    assert f"malformed bundle: {seg}: file: is not a readable metadata ring segment" in err
