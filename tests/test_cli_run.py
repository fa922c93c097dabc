import json

import pytest
from conftest import ON_GPU, assert_usage_error, cli


def test_run_reproduces_the_worked_example(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38")
    assert code == 0, err
    text = " ".join(out.split())
    assert "key vector norm at token 20 1.6488" in text
    assert "max attention weight 0.1318 at position 9" in text
    assert "output vector norm 0.7807" in text
    for line in (
        "logical block 0 -> physical block 7: tokens 0 to 15",
        "logical block 1 -> physical block 2: tokens 16 to 31",
        "logical block 2 -> physical block 15: tokens 32 to 37",
    ):
        assert line in text
    assert "equal" in text and ("interpret" in text or ON_GPU)


def test_run_json_carries_every_row(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38", "--json")
    assert code == 0, err
    doc = json.loads(out)
    seq = doc["sequences"][0]
    assert len(seq["rows"]) == 38 and seq["block_table"] == [7, 2, 15]
    row = seq["rows"][20]
    assert (row["logical_block"], row["offset"], row["physical_block"], row["slot"]) == (1, 4, 2, 36)
    assert round(seq["heads"][0]["max_weight"], 4) == 0.1318 and seq["heads"][0]["argmax"] == 9
    assert round(doc["token"]["key_norm"], 4) == 1.6488
    assert doc["checks"]["passed"] and doc["checks"]["slots_match"]
    assert abs(sum(r["weights"][0] for r in seq["rows"]) - 1) < 1e-5


def test_run_long_sequence_hides_rows_and_extends_table(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "300", "--rows", "12", "--backend", "torch", "--device", "cpu")
    assert code == 0, err
    assert "rows hidden" in out and "logical block 3 -> physical block" in out


def test_run_gqa_several_sequences_json(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "40,17", "--heads", "8", "--kv-heads", "2", "--head-dim", "16", "--layout", "vllm", "--dtype", "fp16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [s["seq_len"] for s in doc["sequences"]] == [40, 17]
    assert len(doc["sequences"][1]["heads"]) == 8 and doc["shown_heads"] == [0]


def test_shared_and_repeated_blocks(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "20,20", "--table", "3,4", "--table", "3,5", "--json")
    assert code == 0 and json.loads(out)["shared_blocks"] == {"3": 2}
    code, out, err = cli(capsys, "run", "--tokens", "20", "--table", "3,3")
    assert code == 0 and "more than once" in err and "mapped twice" in out


def test_failed_check_exits_1(capsys, monkeypatch):
    from pagetrace.attention import report

    monkeypatch.setitem(report.TOLERANCES, "fp32", 0.0)
    code, out, err = cli(capsys, "run", "--tokens", "38", "--json")
    doc = json.loads(out)
    if doc["checks"]["max_abs_diff"] == 0:
        pytest.skip("kernel and reference agreed to the last bit")
    assert code == 1 and "differs from contiguous attention" in err and not doc["checks"]["passed"]


@pytest.mark.parametrize(
    "args, option",
    [
        (["--tokens", "38,10", "--table", "7,2,15"], "--table"),
        (["--tokens", "38", "--table", "7,2"], "--table"),
        (["--tokens", "38", "--table", "7,2,99", "--num-blocks", "20"], "--table"),
        (["--heads", "6", "--kv-heads", "4"], "--heads"),
        (["--tokens", "0"], "--tokens"),
        (["--tokens", "x"], "--tokens"),
        (["--rows", "zero"], "--rows"),
        (["--token", "38"], "--token"),
        (["--dtype", "int8"], "--dtype"),
        (["--backend", "cuda-magic"], "--backend"),
        (["--backend", "triton", "--device", "cpu"], "--backend"),
        (["--device", "tpu"], "--device"),
        (["--tokens", "2000000", "--num-blocks", "9000000", "--head-dim", "4096", "--backend", "torch"], "--num-blocks"),
        (["--scale", "inf"], "--scale"),
        (["--scale", "1e38"], "--scale"),
        (["--rows", "²"], "--rows"),
        (["--seed", "99999999999999999999999"], "--seed"),
        (["--heads", "99999999999999999"], "--heads"),
        (["--heads", "0"], "--heads"),
        (["--kv-heads", "0"], "--kv-heads"),
        (["--seq", "3"], "--seq"),
        (["--device", "cuda:7"], "--device"),
        (["--tokens", "100000000000"], "--tokens"),
        (["--num-blocks", "1000000000"], "--num-blocks"),
        (["--head-dim", "4096", "--backend", "interpret"], "--head-dim"),
        (["--svg", "/nonexistent-dir/x.svg"], "--svg"),
    ],
)
def test_run_bad_input_is_one_line_exit_2(capsys, args, option):
    assert_usage_error(cli(capsys, "run", *args), option)


def test_memory_refusal_says_how_much(capsys):
    code, _, err = cli(capsys, "run", "--tokens", "2000000", "--num-blocks", "4000000", "--head-dim", "16384", "--kv-heads", "64", "--heads", "64", "--backend", "torch")
    assert code == 2 and "--num-blocks" in err and "needs" in err and "TiB" in err


def test_run_draws_the_mapping_with_attention_mass(capsys, tmp_path):
    from pagetrace.views.diagram import find_engine

    if find_engine() is None:  # scripts/gpu_check.sh runs this file on a GPU image without Graphviz
        pytest.skip("no Graphviz engine")
    svg = tmp_path / "run.svg"
    code, out, err = cli(capsys, "run", "--tokens", "38", "--svg", str(svg), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["diagrams"] == [str(svg)]
    text = svg.read_text()
    masses = [round(100 * c["attention_mass"], 1) for c in doc["sequences"][0]["coverage"]]
    for mass in masses:  # each logical block's share, as the kernel's weights give it
        assert f"attn {mass:.1f}%" in text
    assert "tokens 32&#45;37 (6/16)" in text  # Graphviz escapes the hyphen


def test_run_prints_the_terminal_mapping(capsys):
    code, out, _ = cli(capsys, "run", "--tokens", "38")
    assert code == 0 and "pool · 16 blocks · 3 used · 13 free" in out and "34.2%" in out


@pytest.fixture
def nan_result(monkeypatch):
    """Make the kernel's output and one logit NaN, as a read of an unused slot would."""
    from pagetrace.attention import api as attention

    real = attention.paged_attention

    def poisoned(*args, **kwargs):
        out, trace = real(*args, **kwargs)
        out[0, 0, 0] = float("nan")
        trace.logits[0, 0, 3] = float("nan")
        return out, trace

    monkeypatch.setattr(attention, "paged_attention", poisoned)


def test_a_nan_result_fails_cleanly_and_json_still_appears(capsys, nan_result):
    """A NaN output must exit 1 with one line, and --json must still print its document,
    with the non-finite numbers as null."""
    code, out, err = cli(capsys, "run", "--tokens", "38")
    assert code == 1 and len(err.strip().splitlines()) == 1 and "differs from contiguous attention" in err
    assert "NOT equal" in out
    code, out, err = cli(capsys, "run", "--tokens", "38", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["checks"]["passed"] is False and doc["sequences"][0]["rows"][3]["scores"][0] is None


def test_repeated_block_with_traced_token_runs_with_a_warning(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "38", "--table", "7,7,7")
    assert code == 0, err
    assert "more than once" in err and len(err.strip().splitlines()) == 1 and "mapped twice" in out


def test_rows_limit_is_exact_and_applies_to_coverage(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "3000", "--rows", "1", "--backend", "torch", "--device", "cpu")
    assert code == 0, err
    table = out.split("sequence 0: 3000 tokens")[1].split("block coverage")[0]
    rows = [line.split()[0] for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2 and "20" in rows  # the heaviest row, and the traced token 20
    assert table.count("rows hidden") == 3 and "blocks hidden" in out


def test_show_heads_are_deduplicated(capsys):
    code, out, _ = cli(capsys, "run", "--tokens", "20", "--heads", "2", "--kv-heads", "2", "--show-heads", "1,1", "--json")
    assert code == 0 and json.loads(out)["shown_heads"] == [1]


def test_a_nan_result_with_diagrams_still_prints_and_fails_cleanly(capsys, nan_result, tmp_path):
    from pagetrace.views.diagram import find_engine

    if find_engine() is None:
        pytest.skip("no Graphviz engine")
    code, out, err = cli(capsys, "run", "--tokens", "38", "--json", "--svg", str(tmp_path / "p.svg"), "--dot", str(tmp_path / "p.dot"))
    assert code == 1 and "differs from contiguous attention" in err and "internal error" not in err
    assert json.loads(out)["checks"]["passed"] is False and (tmp_path / "p.svg").exists()


def test_rows_are_per_table_and_the_traced_token_is_always_shown(capsys):
    code, out, err = cli(capsys, "run", "--tokens", "300", "--heads", "4", "--kv-heads", "2", "--rows", "3", "--backend", "torch")
    assert code == 0, err
    tables = out.split("query head ")[1:]
    assert len(tables) == 4
    for table in tables:
        body = table.split("block coverage")[0].splitlines()[1:]  # past the title's head number
        rows = [line.split()[0] for line in body if line.strip()[:1].isdigit()]
        assert len(rows) == 4 and "20" in rows  # 3 rows + the traced token 20
    code, out, err = cli(capsys, "run", "--tokens", "5000", "--token", "1234", "--rows", "6", "--backend", "torch")
    assert code == 0, err
    assert "◀ traced" in out and any(line.split()[:1] == ["1234"] for line in out.splitlines())
    assert "logical block 77 -> physical block" in out  # the traced token's block, in the coverage list


def test_run_working_memory_is_refused_before_allocating(capsys):
    code, _, err = cli(capsys, "run", "--tokens", "400000", "--heads", "4096", "--head-dim", "1", "--backend", "torch")
    assert code == 2 and "--tokens" in err and "the run" in err and len(err.strip().splitlines()) == 1
