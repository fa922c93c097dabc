import json

import pytest
from conftest import ON_GPU

from pagetrace.cli import run_cli


def cli(capsys, *args):
    code = run_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


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
    from pagetrace import report

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
        (["--dtype", "fp8"], "--dtype"),
        (["--backend", "cuda-magic"], "--backend"),
        (["--backend", "triton", "--device", "cpu"], "--backend"),
        (["--device", "tpu"], "--device"),
        (["--tokens", "2000000", "--num-blocks", "9000000", "--head-dim", "4096", "--backend", "torch"], "--num-blocks"),
    ],
)
def test_run_bad_input_is_one_line_exit_2(capsys, args, option):
    code, out, err = cli(capsys, "run", *args)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and option in lines[0] and "Traceback" not in err


def test_memory_refusal_says_how_much(capsys):
    _, _, err = cli(capsys, "run", "--tokens", "2000000", "--num-blocks", "9000000", "--head-dim", "4096", "--backend", "torch")
    assert "needs" in err and "TiB" in err


def test_run_draws_the_mapping_with_attention_mass(capsys, tmp_path):
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
