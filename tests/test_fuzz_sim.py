"""A property-based fuzz of `simulate` and `capacity`: their options, and the files they
read (a --trace JSONL with odd lines; a --config JSON with odd values: zeros, negatives,
strings, huge numbers, missing keys). The rules every invocation must keep are in
`fuzzing.py`. Workloads stay small (a few requests unless a value is meant to be huge),
so each example takes a fraction of a second; a value that would make the run hang is
what the timeout is there to catch.
"""

import json

import pytest
from fuzzing import check_invocation, dtype, fuzz_settings, html_path, number, options, path
from hypothesis import given
from hypothesis import strategies as st

BIG = "__5000 digits__"  # json_text writes it as a number Python refuses to parse (over 4,300 digits)
HUGE = [10**9, 10**30, float("inf"), float("-inf"), float("nan"), BIG]
ODD = [0, -1, 1, 2, 3, 8, 16, 100, 1.5, "8", "x", "", True, None, [], {}, [1, 2]]
FIELD_VALUE = st.one_of(st.sampled_from(ODD), st.sampled_from(HUGE), st.integers(-3, 64))
TOKEN_LIST = st.one_of(st.lists(st.integers(-2, 100), max_size=12), st.sampled_from([[], ["x"], [1.5], [10**30], [True], "1,2", None]))


def json_text(value) -> str:
    """JSON as a sloppy writer makes it: NaN, Infinity and numbers of any length allowed."""
    return json.dumps(value).replace(json.dumps(BIG), "9" * 5000)


TRACE_KEYS = {"prompt_len": FIELD_VALUE, "output_len": FIELD_VALUE, "arrival": FIELD_VALUE, "n": FIELD_VALUE, "id": st.sampled_from(["a", "b", 1, None, [], "a"]),
              "cache_salt": st.sampled_from(["s", "", 1, None]), "prompt": TOKEN_LIST, "output": TOKEN_LIST, "shared_prefix": FIELD_VALUE}
request_line = st.fixed_dictionaries({}, optional=TRACE_KEYS).map(json_text)
odd_line = st.sampled_from(["", "   ", "{", "[]", "null", "1", '"x"', "NaN", "{}", '{"prompt_len": NaN, "output_len": 1}', "\ufeff{\"prompt_len\": 4, \"output_len\": 2}",
                            '{"prompt_len": 4, "output_len": 2}', '{"prompt_len": 4, "output_len": 2, "arrival": 3}', "\x00", "\u2028"])
trace_text = st.lists(st.one_of(request_line, request_line, odd_line), max_size=6).map("\n".join)
trace_bytes = st.one_of(trace_text.map(str.encode), trace_text.map(lambda t: b"\xef\xbb\xbf" + t.encode()), st.sampled_from([b"", b"\n", b"\xff\xfe{}", b"\x00" * 4]))
TRACE = st.sampled_from(["trace.jsonl", "trace.jsonl", "trace.jsonl", "missing.jsonl", "sub", "", "-"])
length = st.sampled_from(["1", "8", "1:16", "16:1", "0", "0:4", "-3", "a:b", "1:2:3", "", "1e3", "5:", ":5", "99999999999", "4:4"])
SIMULATE = {
    "--requests": st.one_of(st.integers(1, 12).map(str), st.sampled_from(["0", "-1", "1000000000", "x"])), "--trace": TRACE,
    "--num-blocks": st.sampled_from(["2", "3", "8", "64", "1024", "0", "1", "-1", "4000001", "x"]),
    "--block-size": st.sampled_from(["1", "4", "16", "0", "-1", "65537", "1000000"]), "--prompt-len": length, "--output-len": length,
    "--shared-prefix": st.sampled_from(["0", "4", "100", "-1", "1000000000"]), "--n": st.sampled_from(["1", "2", "4", "0", "-1", "1000000000"]),
    "--arrival-rate": st.sampled_from(["0", "0.5", "2", "1e-9", "1e9", "nan", "inf", "-1", "1e-300"]), "--seed": number,
    "--max-num-batched-tokens": st.sampled_from(["1", "8", "4096", "0", "-1", "1000000000000"]), "--max-num-seqs": st.sampled_from(["1", "2", "256", "0"]),
    "--max-model-len": st.sampled_from(["1", "16", "2048", "0", "-1", "1000000000000"]), "--prefix-caching": None, "--no-prefix-caching": None,
    "--chunked-prefill": None, "--no-chunked-prefill": None, "--at": st.sampled_from(["0", "1", "5", "-1", "100000"]),
    "--timeline-rows": st.sampled_from(["0", "1", "30", "-1", "1000000000"]), "--svg": path, "--png": path, "--chart": path,
    "--tables-svg": path, "--tables-png": path, "--json": None, "--html": html_path,
    "--policy": st.sampled_from(["vllm", "sglang", "sglang", "", "lru", "SGLANG"]),
}
CONFIG_KEYS = {k: FIELD_VALUE for k in ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size")}
CONFIG_KEYS["torch_dtype"] = st.sampled_from(["float16", "bfloat16", "float32", "fp8", "int4", "", 16, None])
config_doc = st.fixed_dictionaries({}, optional=CONFIG_KEYS)
config_text = st.one_of(config_doc.map(json_text), config_doc.map(lambda d: json_text({"text_config": d})),
                        st.sampled_from(["", "{", "[]", "null", "1", '"x"', '{"text_config": 1}', '{"num_hidden_layers": ' + "9" * 5000 + "}"]))
MEMORY = st.sampled_from(["16GiB", "0", "1", "1e400", "1e999GiB", "nan", "-1", "1.5", "512MiB", "1e-9", "9" * 400, "", " 1 GiB ", "1 gib", "1e3kb", "inf", "1e308TiB"])
CAPACITY = {
    "--memory": MEMORY, "--layers": number, "--kv-heads": number, "--head-dim": number, "--dtype": st.one_of(dtype, st.sampled_from(["float64", "int4"])),
    "--config": st.sampled_from(["config.json", "config.json", "missing.json", "sub", ""]), "--block-size": number, "--length": number, "--json": None,
}
VALUE_OPTIONS = {name for pairs in (SIMULATE, CAPACITY) for name, values in pairs.items() if values is not None}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir(exist_ok=True)
    return tmp_path


def small_workload(argv: list[str]) -> list[str]:
    """A synthetic workload of a few requests unless the example names its size."""
    return argv if "--trace" in argv or "--requests" in argv else ["--requests", "4", *argv]


@fuzz_settings(0.3)
@given(trace=trace_bytes, argv=options(SIMULATE))
def test_simulate_never_crashes(in_tmp, trace, argv):
    (in_tmp / "trace.jsonl").write_bytes(trace)
    check_invocation(["simulate", *small_workload(argv)], VALUE_OPTIONS, files=("trace.jsonl",))


@fuzz_settings(0.3)
@given(config=config_text, argv=options(CAPACITY))
def test_capacity_never_crashes(in_tmp, config, argv):
    (in_tmp / "config.json").write_text(config)
    check_invocation(["capacity", *argv], VALUE_OPTIONS, files=("config.json",))
