"""`simulate --explain` (pagetrace/sim/explain.py): each request's prompt tokens by cause, the
evicted blocks with the step and the request that dropped them, and the hits on blocks stored
in the same step, on small hand-counted workloads."""

from __future__ import annotations

import json

from conftest import cli

from pagetrace.sim.explain import explain_requests
from pagetrace.sim.request import SimRequest
from pagetrace.sim.run import simulate

SHARED = list(range(1, 9))  # two blocks of 4


def causes(hit=0, partial=0, evicted=0, other_key=0, first=0):
    return {"hit": hit, "partial block": partial, "evicted": evicted, "different extra key": other_key, "first seen": first}


def evicting():
    """Block size 4, 3 usable blocks. A (tokens 1-8 and 50, 2 outputs) takes blocks 1-3 at
    step 0 and finishes at step 1: block 1 (tokens 1-4) and block 2 (5-8) stay cached, block 3
    is free. D (6 tokens of its own) at step 2 needs 2 blocks: the free one and block 2, the
    tail of A's chain (tail first), which drops its hash. E (tokens 1-8 and 70) at step 4
    finds block 1 still cached: 4 hits, the second block evicted (by D at step 2), its own
    token a partial block."""
    return [SimRequest("A", SHARED + [50], [1, 2]), SimRequest("D", list(range(60, 66)), [1, 2], arrival=2),
            SimRequest("E", SHARED + [70], [1, 2], arrival=4)]


def test_an_evicted_block_after_a_hit_names_the_step_and_the_request_that_dropped_it():
    got = explain_requests(simulate(evicting(), 4, 4, record_events=True), 4)
    assert got == [
        {"prompt_tokens_by_cause": causes(partial=1, first=8), "recomputed_hit_tokens": 0},
        {"prompt_tokens_by_cause": causes(partial=2, first=4), "recomputed_hit_tokens": 0},
        {"prompt_tokens_by_cause": causes(hit=4, partial=1, evicted=4), "recomputed_hit_tokens": 0,
         "hit_while_written": [],  # block 1 was stored at step 0, E was admitted at step 4
         "evicted_blocks": [{"block": 1, "step": 2, "by": "D"}]},
    ]


def test_without_events_only_the_causes_are_told():
    """Without the run's KV events there is nothing to tell 'hit while written' or who evicted
    a block by: the keys are absent (an empty list would say none was)."""
    got = explain_requests(simulate(evicting(), 4, 4), 4)
    assert [d["prompt_tokens_by_cause"] for d in got] == [causes(partial=1, first=8), causes(partial=2, first=4), causes(hit=4, partial=1, evicted=4)]
    assert all(set(d) == {"prompt_tokens_by_cause", "recomputed_hit_tokens"} for d in got)


def test_the_json_document_explains_with_the_events_only_when_asked(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"prompt": r.prompt, "output_len": 2, "arrival": r.arrival}) + "\n" for r in evicting()))
    base = ["simulate", "--trace", str(path), "--block-size", "4", "--num-blocks", "4", "--json"]
    vllm = causes(hit=4, partial=1, evicted=4)
    sglang = causes(partial=1, evicted=8)  # SGLang evicts A's leaf whole: both pages
    for extra, keys, why in (([], set(), vllm), (["--explain"], {"hit_while_written", "evicted_blocks"}, vllm),
                             (["--explain", "--policy", "sglang"], set(), sglang)):
        code, out, err = cli(capsys, *base, *extra)
        assert code == 0, err
        e = json.loads(out)["requests"][2]
        assert e["prompt_tokens_by_cause"] == why and e["recomputed_hit_tokens"] == 0, extra
        assert set(e) - {"id", "arrival", "prompt_tokens", "output_tokens", "num_cached_tokens", "first_scheduled", "finished",
                         "preemptions", "prompt_tokens_by_cause", "recomputed_hit_tokens"} == keys, extra


def test_a_hit_on_a_block_stored_in_the_same_step_is_hit_while_written():
    """F and G share tokens 1-8 and arrive together: F, scheduled first, stores both blocks at
    step 0 (vLLM caches a block when it is allocated) and G hits them in that step."""
    got = explain_requests(simulate([SimRequest("F", SHARED + [50], [1, 2]), SimRequest("G", SHARED + [60], [1, 2])], 16, 4, record_events=True), 4)
    assert got[1] == {"prompt_tokens_by_cause": causes(hit=8, partial=1), "recomputed_hit_tokens": 0,
                      "hit_while_written": [{"block": 0, "by": "F"}, {"block": 1, "by": "F"}]}
    assert "hit_while_written" not in got[0]


def test_block_size_one_with_no_hit_counts_evicted_blocks_from_the_first():
    """Block size 1, 4 usable blocks. A ([1, 2, 3], 2 outputs) stores 4 one-token blocks and
    finishes at step 1. D ([7, 8, 9]) at step 3 takes the 4 blocks, A's tail first: [1, 2, 3, 4]
    at step 3 (its prefill: 3 blocks), [1] at step 4 (its 4th token). E ([1, 2, 9]) at step 6
    looks up 2 blocks, both evicted: block 0 ([1]) by D at step 4, block 1 ([1, 2]) at step 3."""
    reqs = [SimRequest("A", [1, 2, 3], [4, 5]), SimRequest("D", [7, 8, 9], [4, 5], arrival=3), SimRequest("E", [1, 2, 9], [1, 2], arrival=6)]
    got = explain_requests(simulate(reqs, 5, 1, record_events=True), 1)
    assert got[2] == {"prompt_tokens_by_cause": causes(partial=1, evicted=2), "recomputed_hit_tokens": 0,
                      "evicted_blocks": [{"block": 0, "step": 4, "by": "D"}, {"block": 1, "step": 3, "by": "D"}]}
