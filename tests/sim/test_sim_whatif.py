"""`simulate --what-if` (pagetrace/sim/whatif.py): every refusal word for word, each setting
kind at its boundary, and each row's figures against hand-counted runs."""

from __future__ import annotations

import json

import pytest
from conftest import assert_usage_error, cli

from pagetrace.errors import UsageError
from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import POLICIES, simulate
from pagetrace.sim.whatif import KEYS, Setting, outcome, parse_what_if

BASE = Setting(num_blocks=7, block_size=4, policy="vllm", prefix_caching=True, max_num_batched_tokens=4096, max_num_seqs=256)
KEY_LIST = "num-blocks, block-size, policy, prefix-caching, max-num-batched-tokens, max-num-seqs"


@pytest.mark.parametrize("spec, reason", [
    ("num-blocks", f"give key=value pairs separated by commas, keys: {KEY_LIST}"),
    ("colour=red", f"give key=value pairs separated by commas, keys: {KEY_LIST}"),
    ("block-size=8,", f"give key=value pairs separated by commas, keys: {KEY_LIST}"),
    ("policy=orca", "policy must be one of: vllm, sglang"),
    ("prefix-caching=maybe", "prefix-caching is on or off"),
    ("prefix-caching=ON", "prefix-caching is on or off"),
    ("num-blocks=1", "num-blocks must be a positive integer of at least 2"),
    ("num-blocks=1=2", "num-blocks must be a positive integer of at least 2"),  # the value is '1=2', not the key 'num-blocks=1'
    ("block-size=0", "block-size must be a positive integer"),
    ("block-size=abc", "block-size must be a positive integer"),
    ("block-size=\u0663", "block-size must be a positive integer"),  # ARABIC-INDIC DIGIT THREE: a digit, not ASCII
    ("max-num-seqs=0", "max-num-seqs must be a positive integer"),
    ("max-num-batched-tokens=-1", "max-num-batched-tokens must be a positive integer"),
    ("block-size=16,policy=orca", "policy must be one of: vllm, sglang"),
])
def test_each_what_if_refusal_names_option_value_and_reason(spec, reason):
    with pytest.raises(UsageError) as caught:
        parse_what_if(spec, BASE, POLICIES)
    assert (caught.value.option, caught.value.value, caught.value.reason) == ("--what-if", spec, reason)
    assert str(caught.value) == f"invalid value for --what-if: {spec!r}: {reason}"


def test_a_what_if_refusal_on_the_command_line_is_one_line(tmp_path, capsys):
    path = trace(tmp_path)
    for spec, reason in (("num-blocks=1", "num-blocks must be a positive integer of at least 2"), ("policy=orca", "policy must be one of: vllm, sglang"),
                         ("prefix-caching=maybe", "prefix-caching is on or off")):
        result = cli(capsys, "simulate", "--trace", path, "--block-size", "4", "--num-blocks", "7", "--what-if", spec)
        assert_usage_error(result, "--what-if")
        assert result[2].strip() == f"pagetrace: invalid value for --what-if: {spec!r}: {reason}"


def test_each_setting_kind_at_its_lowest_value_is_taken():
    off = Setting(7, 4, "vllm", False, 4096, 256)
    assert parse_what_if("num-blocks=2", BASE, POLICIES).num_blocks == 2
    assert parse_what_if("block-size=1", BASE, POLICIES).block_size == 1
    assert parse_what_if("max-num-seqs=1", BASE, POLICIES).max_num_seqs == 1
    assert parse_what_if("max-num-batched-tokens=1", BASE, POLICIES).max_num_batched_tokens == 1
    assert parse_what_if("policy=sglang", BASE, POLICIES).policy == "sglang"
    assert parse_what_if("prefix-caching=on", off, POLICIES).prefix_caching is True
    assert parse_what_if("prefix-caching=off", BASE, POLICIES).prefix_caching is False
    both = parse_what_if("block-size=16, num-blocks=64", BASE, POLICIES)  # a space after the comma
    assert both == Setting(64, 16, "vllm", True, 4096, 256)
    assert BASE == Setting(7, 4, "vllm", True, 4096, 256)  # the base is not changed


def test_labels_name_what_differs_from_the_base_in_key_order():
    off = Setting(7, 4, "vllm", False, 4096, 256)
    assert BASE.label() == "as given" and BASE.label(BASE) == "as given"
    assert parse_what_if("num-blocks=7", BASE, POLICIES).label(BASE) == "as given"  # the base's own value
    assert parse_what_if("prefix-caching=on", off, POLICIES).label(off) == "prefix-caching=on"
    assert parse_what_if("prefix-caching=off", BASE, POLICIES).label(BASE) == "prefix-caching=off"
    spec = "max-num-seqs=1,policy=sglang,max-num-batched-tokens=8,block-size=2,num-blocks=9"
    assert parse_what_if(spec, BASE, POLICIES).label(BASE) == \
        "num-blocks=9,block-size=2,policy=sglang,max-num-batched-tokens=8,max-num-seqs=1"
    assert KEYS == ("num-blocks", "block-size", "policy", "prefix-caching", "max-num-batched-tokens", "max-num-seqs")


def two_requests():
    """Block size 4. A and B: tokens 1-8 and one of their own (9 prompt tokens), 2 outputs,
    both at step 0. 6 usable blocks: A takes 3, B finds A's 2 full blocks cached and takes 1
    (hits 8 of the 18 prompt tokens); both finish at step 1: used [4, 0]."""
    shared = list(range(1, 9))
    return [SimRequest("A", shared + [100], [1, 2]), SimRequest("B", shared + [200], [1, 2])]


def trace(tmp_path):
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps({"prompt": r.prompt, "output_len": 2}) + "\n" for r in two_requests()))
    return str(path)


def row(label, setting, hit_rate, hit_tokens, peak, mean, preemptions, steps, evictions):
    s = setting
    return {"label": label, "num_blocks": s.num_blocks, "block_size": s.block_size, "policy": s.policy, "prefix_caching": s.prefix_caching,
            "max_num_batched_tokens": s.max_num_batched_tokens, "max_num_seqs": s.max_num_seqs, "hit_rate": hit_rate,
            "hit_tokens": hit_tokens, "prompt_tokens": 18, "peak_used_blocks": peak, "mean_used_share": mean,
            "preemptions": preemptions, "steps": steps, "evictions": evictions}


def test_what_if_rows_field_by_field(tmp_path, capsys):
    """As given (7 blocks): used [4, 0], mean 4 / 2 / 6 usable = 1/3. Prefix caching off: A
    and B take 3 blocks each, [6, 0], mean 1/2, no hit. num-blocks=4 (3 usable): B cannot get
    its block while A runs; A finishes at step 1, B then hits A's 2 cached blocks: [3, 0, 3, 0],
    mean 6 / 4 / 3 = 1/2, 4 steps. max-num-seqs=1: the same order, [3, 0, 3, 0] over 6 usable
    blocks: 1/4. Hit rate 8 / 18 wherever caching is on."""
    code, out, err = cli(capsys, "simulate", "--trace", trace(tmp_path), "--block-size", "4", "--num-blocks", "7", "--json",
                         "--what-if", "prefix-caching=off", "--what-if", "num-blocks=4", "--what-if", "max-num-seqs=1")
    assert code == 0, err
    got = json.loads(out)["what_if"]
    assert got == [
        row("as given", BASE, 8 / 18, 8, 4, 1 / 3, 0, 2, 0),
        row("prefix-caching=off", Setting(7, 4, "vllm", False, 4096, 256), 0.0, 0, 6, 0.5, 0, 2, 0),
        row("num-blocks=4", Setting(4, 4, "vllm", True, 4096, 256), 8 / 18, 8, 3, 0.5, 0, 4, 0),
        row("max-num-seqs=1", Setting(7, 4, "vllm", True, 4096, 1), 8 / 18, 8, 3, 0.25, 0, 4, 0),
    ]


def test_outcome_counts_evictions_and_preemptions():
    """Block size 4, 3 usable blocks. C (8 tokens + 1) takes blocks 1-3 and finishes at step 1:
    blocks 1, 2 cached. D (other 9 tokens) takes the free block and evicts the two cached ones:
    2 evictions. E, F: a 4-token prompt each, 5 outputs, 2 usable blocks: a block each at step
    0; at step 1 each needs a second one: F is preempted, E takes its block and finishes at
    step 4 (8 tokens stored), F runs again from step 5: 1 preemption, 9 steps."""
    from pagetrace.sim.scheduler import SchedulerConfig

    c = SimRequest("C", list(range(1, 9)) + [50], [1, 2])
    d = SimRequest("D", list(range(60, 69)), [1, 2], arrival=2)
    got = outcome("x", Setting(4, 4, "vllm", True, 4096, 256), simulate([c, d], 4, 4))
    assert (got.evictions, got.preemptions, got.hit_tokens, got.prompt_tokens, got.steps) == (2, 0, 0, 18, 4)
    assert got.used_over_time == [3, 0, 3, 0] and got.peak_used == 3 and got.mean_used_share == 0.5
    e, f = SimRequest("E", [1, 2, 3, 4], [1, 2, 3, 4, 5]), SimRequest("F", [5, 6, 7, 8], [1, 2, 3, 4, 5])
    got = outcome("y", Setting(3, 4, "vllm", True, 4096, 256), simulate([e, f], 3, 4, SchedulerConfig(4096, 256, True)))
    assert (got.preemptions, got.steps, got.peak_used, got.used_over_time) == (1, 9, 2, [2, 2, 2, 2, 0, 2, 2, 2, 0])
    assert got.mean_used_share == 14 / 9 / 2


def test_an_empty_workload_has_zero_figures():
    got = outcome("as given", BASE, simulate([], 7, 4))
    assert (got.hit_rate, got.hit_tokens, got.prompt_tokens, got.peak_used, got.mean_used_share, got.steps) == (0.0, 0, 0, 0, 0.0, 0)
    assert got.used_over_time == []
