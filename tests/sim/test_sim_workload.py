"""Workloads (pagetrace/sim/workload.py): a trace's requests as written, each refusal of a bad
trace word for word (the option, the value shown and the reason a user reads), and the
synthetic workload's token ids; SGLang's parallel-sampling split (sim/parallel.py).

The expectations are the trace lines read by hand: ids, prompts, outputs, arrivals, the
order within a step, the cache salt and LoRA keys, a hashes-only trace's stand-in tokens.
"""

from __future__ import annotations

import json

import pytest

from pagetrace.errors import UsageError
from pagetrace.sim.parallel import split_parallel_groups
from pagetrace.sim.request import SimRequest
from pagetrace.sim.workload import (MAX_REQUESTS, UNIQUE_STRIDE, SyntheticSpec, SyntheticTokens, parse_trace,
                                    read_trace, synthetic)

HEADER = '{"format": "pagetrace-trace", "version": 1}'
PRIVATE = '{"format": "pagetrace-trace", "version": 1, "hashes_only": true, "block_size": 4}'


def lines(*objs):
    return "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objs)


def refusal(text, block_size=4, source="t.jsonl"):
    with pytest.raises(UsageError) as caught:
        read_trace(text, block_size, source)
    e = caught.value
    return e.option, e.value, e.reason


P = {"prompt": [1, 2], "output_len": 1}  # a good line
PAD = "x" * 40  # an unknown field: a line longer than the 40 characters a refusal shows of it

REFUSALS = [
    # JSON and objects
    (lines(P, "{oops" + "x" * 40), ("--trace", ("{oops" + "x" * 40)[:40], "trace line 2 is not JSON (Expecting property name enclosed in double quotes)")),
    (lines(list(range(30))), ("--trace", json.dumps(list(range(30)))[:40], "trace line 1 is not a JSON object")),
    (lines(P, HEADER), ("--trace", HEADER[:40], "trace line 2: a header line ('format') is allowed only as the first line")),
    (lines({"id": "a", **P}, {"id": "a", **P}), ("--trace", "a", "trace line 2, field 'id' repeats an earlier request id")),
    # the fields: null, types, minimums
    (lines({"prompt_len": None, "output_len": 1}), ("--trace", None, "trace line 1, field 'prompt_len' is null")),
    (lines({"prompt": [1], "output_len": 1, "cache_salt": None}), ("--trace", None, "trace line 1, field 'cache_salt' is null")),
    (lines({"prompt_len": True, "output_len": 1}), ("--trace", True, "trace line 1, field 'prompt_len' must be an integer")),
    (lines({"prompt_len": 2.0, "output_len": 1}), ("--trace", 2.0, "trace line 1, field 'prompt_len' must be an integer")),
    (lines({"prompt_len": 0, "output_len": 1}), ("--trace", 0, "trace line 1, field 'prompt_len': value must be at least 1")),
    (lines({"prompt": [], "output_len": 1}), ("--trace", 0, "trace line 1, field 'prompt': length must be at least 1")),
    (lines({"prompt": [1, True] + list(range(20)), "output_len": 1}),
     ("--trace", str([1, True] + list(range(20)))[:40], "trace line 1, field 'prompt' must be a list of integer token ids")),
    (lines({"prompt": "12", "output_len": 1}), ("--trace", "12", "trace line 1, field 'prompt' must be a list of integer token ids")),
    (lines({"prompt": [1], "output_len": 0}), ("--trace", 0, "trace line 1, field 'output_len': value must be at least 1")),
    (lines({"prompt": [1], "max_tokens": 0}), ("--trace", 0, "trace line 1, field 'max_tokens': value must be at least 1")),
    (lines({"prompt": [1], "output": []}), ("--trace", 0, "trace line 1, field 'output': length must be at least 1")),
    (lines({"prompt": [1], "output_len": 1, "n": 0}), ("--trace", 0, "trace line 1, field 'n': value must be at least 1")),
    (lines({"prompt": [1], "output_len": 1, "arrival": -1}), ("--trace", -1, "trace line 1, field 'arrival': value must be at least 0")),
    (lines({"prompt": [1], "output_len": 1, "seq": -1}), ("--trace", -1, "trace line 1, field 'seq': value must be at least 0")),
    (lines({"prompt": [1], "output_len": 1, "cache_salt": 3}), ("--trace", 3, "trace line 1, field 'cache_salt' must be a string")),
    (lines({"prompt": [1], "output_len": 1, "lora_name": 3}), ("--trace", 3, "trace line 1, field 'lora_name' must be a string")),
    (lines({"prompt": [1], "output_len": 1, "priority": "high"}), ("--trace", "high", "trace line 1, field 'priority' must be an integer")),
    (lines(P, {"prompt": [1], "output_len": 1, "cache_salt": ""}),
     ("--trace", "", "trace line 2, field 'cache_salt' must be a non-empty string if given (vLLM rejects an empty salt)")),
    (lines({"prompt": [1], "output_len": 1, "time": -0.5}), ("--trace", -0.5, "trace line 1, field 'time' must be a number of seconds >= 0")),
    (lines({"prompt": [1], "output_len": 1, "time": True}), ("--trace", True, "trace line 1, field 'time' must be a number of seconds >= 0")),
    (lines({"prompt": [1], "output_len": 1, "time": "1"}), ("--trace", "1", "trace line 1, field 'time' must be a number of seconds >= 0")),
    # what a line must hold
    (lines({"output_len": 2, "note": PAD}), ("--trace", json.dumps({"output_len": 2, "note": PAD})[:40], "trace line 1 needs 'prompt' or 'prompt_len'")),
    (lines({"prompt": [1, 2], "note": PAD}), ("--trace", json.dumps({"prompt": [1, 2], "note": PAD})[:40], "trace line 1 needs 'output_len' or 'output'")),
    (lines({"prompt_len": 5, "shared_prefix": 6, "output_len": 1}), ("--trace", 6, "trace line 1, field 'shared_prefix' exceeds prompt_len 5")),
    (lines({"prompt_len": 5, "shared_prefix": -1, "output_len": 1}), ("--trace", -1, "trace line 1, field 'shared_prefix': value must be at least 0")),
    (lines({"prompt": [1], "n": 2, "outputs": [list(range(30))]}),
     ("--trace", str([list(range(30))])[:40], "trace line 1, field 'outputs' must hold one list of token ids per sample (n=2)")),
    (lines({"prompt": [1], "outputs": {"a": 1}}),
     ("--trace", "{'a': 1}", "trace line 1, field 'outputs' must hold one list of token ids per sample (n=1)")),
    (lines({"prompt": [1], "n": 2, "outputs": [[1], []]}), ("--trace", 0, "trace line 1, field 'outputs': length must be at least 1")),
    # hashes
    (lines({"prompt_len": 4, "output_len": 1, "block_hashes": [1]}),
     ("--trace", '{"prompt_len": 4, "output_len": 1, "bloc', "trace line 1 has 'block_hashes' but the header does not say hashes_only")),
    (lines(PRIVATE, {"prompt": [1], "output_len": 1, "note": PAD}),
     ("--trace", json.dumps({"prompt": [1], "output_len": 1, "note": PAD})[:40], "trace line 2 has 'prompt' token ids in a hashes-only trace")),
    (lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "note": PAD}),
     ("--trace", json.dumps({"prompt_len": 4, "output_len": 1, "note": PAD})[:40], "trace line 2 needs 'block_hashes' (the trace is hashes only)")),
    (lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "block_hashes": list(range(20)) + [-1]}),
     ("--trace", str(list(range(20)) + [-1])[:40], "trace line 2, field 'block_hashes' must be a list of non-negative integer block hashes")),
    (lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "block_hashes": [False]}),
     ("--trace", "[False]", "trace line 2, field 'block_hashes' must be a list of non-negative integer block hashes")),
    (lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "n": 3, "block_hashes": [[1], [2]]}),
     ("--trace", 2, "trace line 2, field 'block_hashes' has 2 lists for n=3 samples")),
]


@pytest.mark.parametrize(("text", "expected"), REFUSALS, ids=[r[1][2][:60] for r in REFUSALS])
def test_a_bad_trace_is_refused_naming_its_line_field_and_value(text, expected):
    assert refusal(text) == expected


def test_a_hashes_only_trace_of_other_blocks_names_the_block_size_to_use():
    assert refusal(lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "block_hashes": [1]}), block_size=16) == (
        "--block-size", 16, "the trace holds hashes of 4-token blocks (hashes only, no token ids); simulate it with --block-size 4")


@pytest.mark.parametrize(("text", "what"), [("", "is empty"), ("\n  \n", "holds only blank lines"), (HEADER + "\n\n", "holds only its header")])
def test_a_trace_without_requests_names_the_file(text, what):
    assert refusal(text, source="mine.jsonl") == ("--trace", "mine.jsonl", f"the file {what}: a trace has one JSON request per line")


def test_exactly_max_requests_are_read_and_one_more_is_refused(monkeypatch):
    """The bound counts requests after n-fold expansion, earlier lines included (lowered to
    1,000 here for speed; the documented bound is 100,000)."""
    from pagetrace.sim import workload

    assert MAX_REQUESTS == 100_000
    monkeypatch.setattr(workload, "MAX_REQUESTS", 1000)
    text = lines({"prompt": [1], "output_len": 1}, {"prompt": [1], "output_len": 1, "n": 999})
    assert len(parse_trace(text, 4)) == 1000
    assert refusal(lines({"prompt": [1], "output_len": 1}, {"prompt": [1], "output_len": 1, "n": 1000})) == (
        "--trace", 1000, "trace line 2: the trace makes more than 1,000 requests (n included), more than the simulator runs")


def test_a_trace_read_field_by_field():
    text = lines(
        HEADER,
        {"id": "late", "prompt": [7, 8, 9], "output": [5, 6], "arrival": 3},                    # line 2
        {"prompt_len": 6, "shared_prefix": 2, "max_tokens": 2, "n": 2, "cache_salt": "s"},      # line 3: id "1"
        {"id": "x", "prompt": [1], "output_len": 2, "lora_name": "ad", "priority": 5, "time": 0.25},  # line 4
        "",
        {"id": "first", "prompt": [4], "outputs": [[9]], "seq": 1, "arrival": 3, "cache_salt": "t", "lora_name": "ad"},  # line 6
        {"id": "nul", "prompt": [4], "output_len": 1, "arrival": None, "time": 0},  # line 7: a null arrival is the default
    )
    trace = read_trace(text, 4)
    got = [(r.request_id, list(r.prompt[0:len(r.prompt)]), list(r.output), r.arrival, r.cache_salt, r.group) for r in trace.requests]
    base3, base4 = 4 * UNIQUE_STRIDE, 5 * UNIQUE_STRIDE  # (line + 1) * stride: the request's own ids
    out3 = base3 + UNIQUE_STRIDE // 2  # outputs: half a stride on, a 64th of a stride apart per sample
    assert got == [
        ("1.0", [1, 2, base3, base3 + 1, base3 + 2, base3 + 3], [out3, out3 + 1], 0, "s", "1"),
        ("1.1", [1, 2, base3, base3 + 1, base3 + 2, base3 + 3], [out3 + UNIQUE_STRIDE // 64, out3 + UNIQUE_STRIDE // 64 + 1], 0, "s", "1"),
        ("x", [1], [base4 + UNIQUE_STRIDE // 2, base4 + UNIQUE_STRIDE // 2 + 1], 0, "\x00lora:ad", None),
        ("nul", [4], [8 * UNIQUE_STRIDE + UNIQUE_STRIDE // 2], 0, None, None),
        ("first", [4], [9], 3, "t\x00lora:ad", None),  # seq 1 before line 2's default seq (its line number)
        ("late", [7, 8, 9], [5, 6], 3, None, None),
    ]
    assert trace.header is not None and trace.header.version == 1 and not trace.header.hashes_only
    assert trace.lora == {"x": "ad", "first": "ad"} and trace.priority == {"x": 5} and trace.given_hashes == {}


def test_a_hashes_only_trace_stands_in_tokens_for_its_hashes():
    """Block size 4: full block i of a sample is (hash i, -1, -1, -1); the tokens past its
    hashes are -(base + position + 2), base = (line + 1) * stride, plus a 64th of a stride a
    sample. A per-sample list gives each sample its own hashes; the salt is inside them."""
    text = lines(PRIVATE, {"id": "q", "prompt_len": 5, "output_len": 2, "block_hashes": [11], "cache_salt": "s"},
                 {"id": "p", "prompt_len": 4, "output": [0, 0], "n": 2, "block_hashes": [[7], [8, 9]]})
    trace = read_trace(text, 4)
    got = {r.request_id: (list(r.prompt), list(r.output), r.cache_salt, r.group) for r in trace.requests}
    b2, b3 = 3 * UNIQUE_STRIDE, 4 * UNIQUE_STRIDE
    assert got == {
        "q": ([11, -1, -1, -1, -(b2 + 4 + 2)], [-(b2 + 5 + 2), -(b2 + 6 + 2)], None, None),
        "p.0": ([7, -1, -1, -1], [-(b3 + 4 + 2), -(b3 + 5 + 2)], None, "p"),
        "p.1": ([8, -1, -1, -1], [9, -1], None, "p"),
    }
    assert trace.given_hashes == {"q": [11], "p.0": [7], "p.1": [8, 9]}
    # a plain prompt_len needs no header hashes when not hashes-only
    assert read_trace(lines({"prompt_len": 2, "output_len": 1}), 4).header is None


def test_shared_prefix_exactly_the_prompt_and_the_synthetic_tokens():
    reqs = parse_trace(lines({"prompt_len": 3, "shared_prefix": 3, "output_len": 1}), 4)
    assert list(reqs[0].prompt[0:3]) == [1, 2, 3]
    t = SyntheticTokens(3, 1000, 6)  # system prompt 1, 2, 3, then 1000, 1001, 1002
    assert len(t) == 6 and t[0:6] == (1, 2, 3, 1000, 1001, 1002)
    assert t[2:4] == (3, 1000) and t[3:5] == (1000, 1001) and t[0:3] == (1, 2, 3) and t[4:] == (1001, 1002)
    assert t.run(0, 3) == range(1, 4) and t.run(3, 6) == range(1000, 1003) and t.run(2, 4) == (3, 1000)
    assert t.run(1, 2) == range(2, 3) and t.run(4, 5) == range(1001, 1002)


def test_synthetic_requests_ids_lengths_and_arrivals():
    spec = SyntheticSpec(requests=3, prompt_len=(2, 2), output_len=(3, 3), shared_prefix=1, seed=5)
    reqs = synthetic(spec)
    s = UNIQUE_STRIDE
    assert [(r.request_id, r.prompt[0:3], list(r.output), r.arrival, r.group) for r in reqs] == [
        (str(i), (1, (i + 1) * s, (i + 1) * s + 1), [(i + 1) * s + s // 2 + k for k in range(3)], 0, None) for i in range(3)]
    two = synthetic(SyntheticSpec(requests=2, prompt_len=(1, 1), output_len=(1, 1), n=2, arrival_rate=1e-9, seed=1))
    assert [(r.request_id, r.group) for r in two] == [("0.0", "0"), ("0.1", "0"), ("1.0", "1"), ("1.1", "1")]
    assert two[1].output[0] - two[0].output[0] == s // 64 and two[0].prompt is two[1].prompt
    assert two[0].arrival > 1000  # a rate of 1e-9 a step: the first arrival is far off (not at 0)
    defaults = SyntheticSpec()
    assert (defaults.requests, defaults.prompt_len, defaults.output_len, defaults.shared_prefix, defaults.n,
            defaults.arrival_rate, defaults.seed) == (200, (64, 512), (16, 256), 0, 1, 0.0, 0)


def test_parallel_groups_become_a_prefix_request_each_in_the_first_samples_place():
    reqs = [SimRequest("a", [1, 2], [3]), SimRequest("g.0", [5, 6], [7, 8], arrival=2, group="g", cache_salt="s"),
            SimRequest("b", [1], [3], arrival=2), SimRequest("g.1", [5, 6], [9, 8], arrival=2, group="g", cache_salt="s"),
            SimRequest("g.prefix", [4], [3], arrival=2)]  # a trace request already named like the prefix request
    feed, held = split_parallel_groups(reqs)
    assert [r.request_id for r in feed] == ["a", "g.prefix.prefix", "b", "g.prefix"]
    prefix = feed[1]
    assert (list(prefix.prompt), list(prefix.output), prefix.arrival, prefix.cache_salt, prefix.group) == ([5, 6], [7], 2, "s", None)
    assert {k: [r.request_id for r in v] for k, v in held.items()} == {"g.prefix.prefix": ["g.0", "g.1"]}


def test_two_groups_never_get_the_same_prefix_request_id():
    """Through the Python API (a trace cannot hold both): a plain request "g.prefix", group "g"
    and group "g.prefix". g's prefix request becomes "g.prefix.prefix" (its first choice is
    taken); group "g.prefix" would choose that too, so it takes "g.prefix.prefix.prefix"."""
    reqs = [SimRequest("g.prefix", [1], [2]), SimRequest("g.0", [5], [6], group="g"), SimRequest("g.1", [5], [7], group="g"),
            SimRequest("g.prefix.0", [8], [9], group="g.prefix"), SimRequest("g.prefix.1", [8], [9], group="g.prefix")]
    feed, held = split_parallel_groups(reqs)
    assert [r.request_id for r in feed] == ["g.prefix", "g.prefix.prefix", "g.prefix.prefix.prefix"]
    assert {k: [r.request_id for r in v] for k, v in held.items()} == {
        "g.prefix.prefix": ["g.0", "g.1"], "g.prefix.prefix.prefix": ["g.prefix.0", "g.prefix.1"]}


def test_the_time_of_a_request_is_a_number_not_below_zero():
    import math

    option, value, reason = refusal('{"prompt": [1], "output_len": 1, "time": NaN}')  # Python's json reads NaN
    assert (option, math.isnan(value), reason) == ("--trace", True, "trace line 1, field 'time' must be a number of seconds >= 0")
    assert len(parse_trace('{"prompt": [1], "output_len": 1, "time": 0}', 4)) == 1


def test_a_number_past_pythons_digit_limit_is_not_json():
    try:
        int("9" * 5000)
    except ValueError as exc:
        why = str(exc).split(";")[0]  # "Exceeds the limit (4300 digits) for integer string conversion..."
    line = '{"prompt_len": ' + "9" * 5000 + "}"
    assert refusal(line) == ("--trace", line[:40], f"trace line 1 is not JSON ({why})")


def test_one_output_for_every_sample_and_an_empty_hash_list():
    """`output` with n = 2 is each sample's output; a hashes-only prompt shorter than a block
    has no hash (an empty list): all its tokens stand-ins, -(base + position + 2)."""
    reqs = parse_trace('{"id": "o", "prompt": [1], "output": [5, 6], "n": 2}', 4)
    assert [(r.request_id, list(r.output)) for r in reqs] == [("o.0", [5, 6]), ("o.1", [5, 6])]
    reqs = parse_trace(lines(PRIVATE, {"prompt_len": 3, "output_len": 1, "block_hashes": []}), 4)
    b = 3 * UNIQUE_STRIDE
    assert (list(reqs[0].prompt), list(reqs[0].output)) == ([-(b + 2), -(b + 3), -(b + 4)], [-(b + 5)])


def test_poisson_arrivals_accumulate_their_gaps():
    """Rate 1 a step: the arrival of request i is the (floored) sum of i + 1 exponential gaps
    of mean 1, so the steps never go down and 20 requests span about 20 steps (here 12, seed 7);
    independent draws would rarely exceed 3 and go up and down."""
    arrivals = [r.arrival for r in synthetic(SyntheticSpec(requests=20, prompt_len=(1, 1), output_len=(1, 1), arrival_rate=1.0, seed=7))]
    assert arrivals == sorted(arrivals) and arrivals[-1] >= 10


def test_parse_trace_names_no_file_by_default_and_reads_a_private_trace_at_its_block_size():
    with pytest.raises(UsageError) as caught:
        parse_trace("", 4)
    assert (caught.value.value, caught.value.reason) == ("", "the file is empty: a trace has one JSON request per line")
    assert [list(r.prompt) for r in parse_trace(lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "block_hashes": [3]}), 4)] == [[3, -1, -1, -1]]


def test_headers_blank_lines_and_defaults_of_a_trace():
    """A header after blank lines is still the first line (its errors name its own line); a
    second header is refused; read_trace names no file by default; a prompt_len without
    shared_prefix is all the request's own ids, (line + 1) * stride on; hash 0 is a hash."""
    assert refusal('\n\n{"format": "pagetrace-trace", "version": 0}\n' + json.dumps(P)) == (
        "--trace", 0, "trace line 3: 'version' must be a positive integer")
    assert refusal(lines(HEADER, HEADER, P)) == (
        "--trace", HEADER[:40], "trace line 2: a header line ('format') is allowed only as the first line")
    with pytest.raises(UsageError) as caught:
        read_trace("", 4)
    assert caught.value.value == ""
    (req,) = parse_trace(lines({"prompt_len": 2, "output_len": 1}), 4)
    assert list(req.prompt[0:2]) == [2 * UNIQUE_STRIDE, 2 * UNIQUE_STRIDE + 1]
    (req,) = parse_trace(lines(PRIVATE, {"prompt_len": 4, "output_len": 1, "block_hashes": [0]}), 4)
    assert list(req.prompt) == [0, -1, -1, -1]


def test_one_hash_list_for_every_sample_and_their_own_stand_in_ids():
    """n = 2 with one flat list: both samples have its hashes; past them each sample's
    stand-ins are its own, a 64th of a stride apart: -(base + k * stride // 64 + position + 2)."""
    reqs = parse_trace(lines(PRIVATE, {"id": "s", "prompt_len": 5, "output_len": 1, "n": 2, "block_hashes": [6]}), 4)
    b = 3 * UNIQUE_STRIDE
    assert [(r.request_id, list(r.prompt), list(r.output)) for r in reqs] == [
        ("s.0", [6, -1, -1, -1, -(b + 4 + 2)], [-(b + 5 + 2)]),
        ("s.1", [6, -1, -1, -1, -(b + UNIQUE_STRIDE // 64 + 4 + 2)], [-(b + UNIQUE_STRIDE // 64 + 5 + 2)]),
    ]
