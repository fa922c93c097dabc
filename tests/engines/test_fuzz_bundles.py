"""A property-based fuzz of `check` and `replay` on corrupted capture bundles.

Each example copies one small valid bundle (`test_engines.write_bundle`: two requests,
shared blocks, 4 of 6 blocks stored) and corrupts it: manifest fields set to odd values or
removed, the manifest or step file replaced, missing or garbage, step tensors deleted,
recast, reshaped or given odd entries (table entries outside the pool or on blocks the
bundle did not store, query_start_loc and seq_lens that disagree, NaN in the cache). The
rules every invocation must keep are in `fuzzing.py`; an exit-2 line may name the bundle
file instead of an option. `replay` runs on the torch backend, so each example takes a
fraction of a second.
"""

import json
import shutil

import pytest
import torch
from fuzzing import check_invocation, fuzz_settings, number, options
from hypothesis import given
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file
from bundles import write_bundle

DELETE = object()
ODD_VALUES = [0, -1, 1, 2, 3, 4, 6, 8, 2**31, 10**30, 1e308, float("nan"), float("inf"), 1.5, -0.0, "", "x", "4", True, None, [], {}, [0], ["a", "b"], DELETE]
NAMES = ["fp16", "bf16", "fp32", "fp8", "vllm-hnd", "nhd", "flash", "vllm-cpu-amx", "none", "full-blocks", "step-0000.safetensors",
         "manifest.json", ".", "..", "/dev/null", "missing.safetensors", "a", "b"]
FIELDS = [
    ("format",), ("version",), ("engine",), ("model",), ("model", "num_layers"), ("model", "num_heads"), ("model", "num_kv_heads"),
    ("model", "head_dim"), ("kv_cache",), ("kv_cache", "dtype"), ("kv_cache", "layout"), ("kv_cache", "block_size"),
    ("kv_cache", "kernel_block_size"), ("kv_cache", "num_blocks"), ("kv_cache", "null_block"), ("kv_cache", "table_padding"),
    ("kv_cache", "slot_padding"), ("kv_cache", "sharing"), ("kv_cache", "k_scale"), ("kv_cache", "v_scale"), ("attention",),
    ("attention", "scale"), ("attention", "sliding_window"), ("layers",), ("layers", 0), ("layers", 0, "index"), ("layers", 0, "name"),
    ("steps",), ("steps", 0), ("steps", 0, "step"), ("steps", 0, "file"), ("steps", 0, "requests"), ("steps", 0, "layers"),
    ("steps", 0, "requests", 0), ("steps", 0, "layers", 0),
]
INDEX = ["query_start_loc", "seq_lens", "block_table", "block_counts", "slot_mapping", "positions", "blocks"]
FLOATS = ["layer0.kv", "layer0.query", "layer0.output", "layer0.new_key", "layer0.new_value"]
DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool]
ENTRIES = [-2**31, -5, -1, 0, 1, 2, 3, 5, 6, 7, 11, 12, 50, 2**31 - 1, 2**40]
RAW = [b"", b"{", b"\xff\xfe", b"[]", b"null", b'{"format": "pagetrace-capture"}', b"garbage, not safetensors", b"\x08" + b"\x00" * 7 + b"{}",
       b'{"version": ' + b"9" * 5000 + b"}"]

manifest_edit = st.tuples(st.just("manifest"), st.sampled_from(FIELDS), st.one_of(st.sampled_from(ODD_VALUES), st.sampled_from(NAMES)))
tensor_edit = st.one_of(
    st.tuples(st.just("set"), st.sampled_from(INDEX), st.integers(0, 40), st.sampled_from(ENTRIES)),
    st.tuples(st.just("set"), st.sampled_from(FLOATS), st.integers(0, 400), st.sampled_from([float("nan"), float("inf"), 1e30])),
    st.tuples(st.just("dtype"), st.sampled_from(INDEX + FLOATS), st.sampled_from(DTYPES)),
    st.tuples(st.just("shape"), st.sampled_from(INDEX + FLOATS), st.sampled_from(["drop", "extend", "flatten", "unsqueeze", "scalar", "empty"])),
    st.tuples(st.just("delete"), st.sampled_from(INDEX + FLOATS)),
)
# the faults the engines' bugs produce: a table entry on an unstored block (2) or outside the pool (6, 9, -1), and
# query_start_loc / seq_lens / slot_mapping that disagree
semantic_edit = st.one_of(
    st.tuples(st.just("set"), st.just("block_table"), st.integers(0, 7), st.sampled_from([2, 6, 9, -1, 0])),
    st.tuples(st.just("set"), st.just("query_start_loc"), st.integers(0, 2), st.sampled_from([-1, 0, 1, 5, 11, 12, 13, 50])),
    st.tuples(st.just("set"), st.just("seq_lens"), st.integers(0, 1), st.sampled_from([0, 1, 9, 10, 12, 13, 100, 2**31 - 1])),
    st.tuples(st.just("set"), st.just("slot_mapping"), st.integers(0, 13), st.sampled_from([-1, 0, 23, 24, 100])),
)
file_edit = st.tuples(st.just("file"), st.sampled_from(["manifest.json", "step-0000.safetensors"]),
                      st.one_of(st.sampled_from(["delete", "directory", "truncate"]), st.sampled_from(RAW)))
step_edit = st.tuples(st.just("second step"), st.sampled_from([1, 0, -1]))
edits = st.lists(st.one_of(semantic_edit, semantic_edit, tensor_edit, manifest_edit, file_edit, step_edit), max_size=3)


def _set_field(doc, path, value):
    *parents, last = path
    for key in parents:
        doc = doc[key]
    if value is DELETE:
        del doc[last]
    else:
        doc[last] = value


def _reshape(t: torch.Tensor, how: str) -> torch.Tensor:
    if t.dim() == 0:  # an earlier edit made it a scalar
        t = t.reshape(1)
    if how == "drop":
        return t[:-1].clone()
    if how == "extend":
        return torch.cat([t, t[:1]])
    if how == "flatten":
        return t.reshape(-1).clone()
    if how == "unsqueeze":
        return t.unsqueeze(0).clone()
    if how == "scalar":
        return t.reshape(-1)[0].clone() if t.numel() else t.sum().to(t.dtype)
    return t[:0].clone()


def corrupt(bundle, edit) -> None:
    """Apply one edit; an edit that no longer applies (its field or tensor is gone) is skipped."""
    kind = edit[0]
    manifest = bundle / "manifest.json"
    step = bundle / "step-0000.safetensors"
    if kind in ("manifest", "second step"):
        try:
            doc = json.loads(manifest.read_text())
            if kind == "manifest":
                _set_field(doc, edit[1], edit[2])
            else:
                doc["steps"].append(dict(doc["steps"][0], step=edit[1]))
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            return
        manifest.write_text(json.dumps(doc))
    elif kind == "file":
        path = bundle / edit[1]
        if path.is_dir():
            return
        how = edit[2]
        if how == "delete":
            path.unlink(missing_ok=True)
        elif how == "directory":
            path.unlink(missing_ok=True)
            path.mkdir()
        elif how == "truncate":
            if path.exists():
                path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        else:
            path.write_bytes(how)
    else:
        try:
            tensors = load_file(str(step))
        except Exception:  # the step file is already broken: nothing to edit
            return
        name = edit[1]
        if name not in tensors:
            return
        t = tensors[name]
        if kind == "delete":
            del tensors[name]
        elif kind == "dtype":
            tensors[name] = t.to(edit[2])
        elif kind == "shape":
            tensors[name] = _reshape(t, edit[2])
        elif t.numel():
            flat = t.reshape(-1).clone()
            try:
                flat[edit[2] % flat.numel()] = edit[3]
            except (RuntimeError, OverflowError):  # a value the dtype cannot hold
                return
            tensors[name] = flat.reshape(t.shape)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(step))


REQUEST = st.sampled_from(["a", "b", "0", "1", "2", "-1", "x", "", "a-1"])
BACKEND = st.sampled_from(["torch", "torch", "torch", "TORCH", "cuda", "triton", ""])
STEP = st.one_of(st.sampled_from(["0", "1", "-1"]), number)
CHECK = {"--step": STEP, "--data": None, "--no-data": None, "--json": None}
REPLAY = {"--step": STEP, "--layer": st.one_of(st.sampled_from(["0", "1"]), number), "--request": REQUEST, "--token": st.one_of(st.sampled_from(["0", "9", "10", "11"]), number),
          "--json": None, "--dot": st.sampled_from(["out.dot", "-", "no/such/dir/x.dot", "b"])}
VALUE_OPTIONS = {name for pairs in (CHECK, REPLAY) for name, values in pairs.items() if values is not None} | {"--backend"}


@pytest.fixture(scope="module")
def clean_bundle(tmp_path_factory):
    return write_bundle(tmp_path_factory.mktemp("clean") / "clean.bundle")


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fresh_copy(clean, here):
    bundle = here / "b"
    if bundle.exists():
        shutil.rmtree(bundle)
    shutil.copytree(clean, bundle)
    return bundle


@fuzz_settings(0.3)
@given(changes=edits, argv=options(CHECK))
def test_check_never_crashes(clean_bundle, in_tmp, changes, argv):
    bundle = fresh_copy(clean_bundle, in_tmp)
    for edit in changes:
        corrupt(bundle, edit)
    check_invocation(["check", "b", *argv], VALUE_OPTIONS, files=("b/", "BUNDLE"))


@fuzz_settings(0.3)
@given(changes=edits, backend=BACKEND, argv=options(REPLAY))
def test_replay_never_crashes(clean_bundle, in_tmp, changes, backend, argv):
    bundle = fresh_copy(clean_bundle, in_tmp)
    for edit in changes:
        corrupt(bundle, edit)
    check_invocation(["replay", "b", "--backend", backend, *argv], VALUE_OPTIONS, files=("b/", "BUNDLE"))
