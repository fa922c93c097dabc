"""A property-based fuzz of the command line over the argument space of `lookup`,
`where`, `run`, `diagram` and `layouts` (malformed and extreme numbers, tables, paths, option
clashes); what every invocation must do is in `fuzzing.py`. `run` cases stay tiny (torch
backend, small pools) so a few hundred examples take seconds. PAGETRACE_FUZZ_EXAMPLES=10000
for a long local run; PAGETRACE_FUZZ_TIMEOUT (seconds, default 120) makes a hang fail.
"""

import pytest
from fuzzing import check_invocation, dtype, fuzz_settings, html_path, number, options, path
from hypothesis import given
from hypothesis import strategies as st

entry = st.one_of(st.integers(0, 40).map(str), st.sampled_from(["-1", "4000000", "4194304", "x", "", " 3", "٣", "1_0"]))
table = st.one_of(st.lists(st.integers(0, 40), min_size=1, max_size=6).map(lambda t: ",".join(map(str, t))), st.lists(entry, min_size=1, max_size=4).map(",".join))
tokens = st.one_of(st.lists(st.integers(1, 40), min_size=1, max_size=3).map(lambda t: ",".join(map(str, t))), st.sampled_from(["0", "-5", "", "38,", "1_0", "٣8", "2147483648"]))
layout = st.sampled_from(["blocks", "nhd", "HND", "vllm", "flash", "flash-hnd", "flashinfer", "flashinfer-hnd", "vllm-cpu", "VLLM-CPU-AMX",
                          "vllm-hnd", "vllm-nhd", "flash-attn", "paged", ""])
GEOMETRY = {"--block-size": number, "--head-dim": number, "--kv-heads": number, "--num-blocks": number, "--dtype": dtype, "--layout": layout}
LOOKUP = {"--token": number, "--table": table, "--head": number, "--json": None, "--svg": path, "--dot": path, "--html": html_path, **GEOMETRY}
WHERE = {"--slot": number, "--byte": number, "--cache": st.sampled_from(["key", "VALUE", "both"]), "--table": table, "--json": None, **GEOMETRY}
tiny = st.one_of(st.integers(1, 9).map(str), st.sampled_from(["0", "-1", "٣", "65537", ""]))
RUN = {
    "--tokens": tokens, "--table": table, "--block-size": tiny, "--head-dim": st.sampled_from(["4", "8", "16", "0", "3", "17000", "x"]),
    "--heads": tiny, "--kv-heads": tiny, "--num-blocks": st.sampled_from(["8", "41", "64", "0", "4194305", "1_0"]), "--dtype": dtype,
    "--layout": layout, "--seed": number, "--scale": st.sampled_from(["0.5", "-1", "1e7", "nan", "inf", "٣", ""]), "--token": number,
    "--seq": tiny, "--rows": st.sampled_from(["3", "all", "0", "-1", "x"]), "--show-heads": st.sampled_from(["0", "all", "0,0", "9", ""]),
    "--device": st.sampled_from(["cpu", "CPU", "cuda", "cuda:7", "tpu"]), "--json": None, "--dot": path, "--html": html_path,
}
LAYOUTS = {"--block-size": number, "--head-dim": number, "--kv-heads": number, "--num-blocks": number, "--dtype": dtype,
           "--layout": layout, "--json": None, "--markdown": None}
DIAGRAM = {
    "--tokens": tokens, "--table": table, "--block-size": number, "--num-blocks": number, "--seed": number, "--token": number,
    "--seq": number, "--slots": None, "--no-slots": None, "--json": None, "--svg": path, "--dot": path,
}

command_line = st.one_of(
    options(LOOKUP).map(lambda a: ["lookup", *a]),
    options(WHERE).map(lambda a: ["where", *a]),
    options(RUN).map(lambda a: ["run", "--backend", "torch", *a]),
    options(DIAGRAM).map(lambda a: ["diagram", *a]),
    options(LAYOUTS).map(lambda a: ["layouts", *a]),
)


VALUE_OPTIONS = {name for pairs in (LOOKUP, WHERE, RUN, DIAGRAM, LAYOUTS) for name, values in pairs.items() if values is not None}


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    return tmp_path


@fuzz_settings()
@given(argv=command_line)
def test_cli_never_crashes(in_tmp, argv):
    check_invocation(argv, VALUE_OPTIONS)
