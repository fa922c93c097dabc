"""The server trace's writer (engines/vllm_trace.py) on vLLM's own `Request` objects, in process:
the private form writes vLLM's block hashes, which equal pagetrace's own (sim/vllm_hash.py),
and the trace reads back. The live server test is tests/sim/test_sim_server_events.py."""

from __future__ import annotations

import importlib.util
import json
import types

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed: pip install -e '.[vllm]' to test the trace hook on vLLM's requests", allow_module_level=True)

pytestmark = pytest.mark.vllm


@pytest.mark.parametrize("private", [False, True])
def test_a_finished_request_is_one_line_with_vllms_own_hashes(tmp_path, private):
    from vllm.config import CacheConfig
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from pagetrace.engines.vllm_trace import SchedulerTrace
    from pagetrace.sim.vllm_hash import block_hashes
    from pagetrace.sim.workload import read_trace

    init_none_hash(sha256)
    scheduler = types.SimpleNamespace(cache_config=CacheConfig(block_size=4, enable_prefix_caching=True), hash_block_size=4)
    path = tmp_path / "trace.jsonl"
    trace = SchedulerTrace(str(path), private, scheduler)
    hasher = get_request_block_hasher(4, sha256)
    a = Request("cmpl-a-0-abcdef12", list(range(10)), SamplingParams(max_tokens=4), None, cache_salt="s", block_hasher=hasher)
    b = Request("cmpl-b-0-12345678", list(range(9)), SamplingParams(max_tokens=2), None, block_hasher=hasher)
    trace.arrive(a)
    trace.steps += 3  # three schedule() calls
    trace.arrive(b)
    b.append_output_token_ids([7, 8])
    trace.finish(b)  # b ends first: written first, ordered by seq when read
    a.append_output_token_ids([50, 51, 52])
    trace.finish(a)
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert rows[0]["hashes_only"] is private and rows[0]["block_size"] == 4
    assert [(r["id"], r["client_id"], r["arrival"], r["seq"], r["output_len"]) for r in rows[1:]] == [
        ("cmpl-b-0-12345678", "cmpl-b-0", 3, 1, 2), ("cmpl-a-0-abcdef12", "cmpl-a-0", 0, 0, 3)]
    if private:
        assert "prompt\"" not in path.read_text() and "cache_salt" not in path.read_text()
        assert rows[2]["block_hashes"] == block_hashes(list(range(10)) + [50, 51, 52], 4, "s")  # vLLM's = pagetrace's
        assert rows[1]["block_hashes"] == block_hashes(list(range(9)) + [7, 8], 4)
    else:
        assert rows[2]["prompt"] == list(range(10)) and rows[2]["output"] == [50, 51, 52] and rows[2]["cache_salt"] == "s"
    got = read_trace(path.read_text(), 4)
    assert [r.request_id for r in got.requests] == ["cmpl-a-0-abcdef12", "cmpl-b-0-12345678"]
