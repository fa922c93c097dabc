"""vLLM's block hashes bit for bit (pagetrace/sim/vllm_hash.py) against vLLM's own hasher.

The reference is vLLM's request with its block hasher, as the engine core builds it
(vllm/v1/request.py `Request(..., block_hasher=get_request_block_hasher(...))`,
vllm/v1/core/kv_cache_utils.py, vLLM 0.32): no engine runs, only vLLM's hashing code. Skips
with the reason where vLLM is not installed.
"""

from __future__ import annotations

import pytest

from pagetrace.sim import vllm_hash as vh

u = pytest.importorskip("vllm.v1.core.kv_cache_utils", reason="vLLM is not installed: its block hasher is the reference")
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.request import Request  # noqa: E402


@pytest.fixture
def seed(request, monkeypatch):
    """PYTHONHASHSEED as a server would have it, and vLLM's NONE_HASH set from it."""
    value = getattr(request, "param", None)
    if value is None:
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    else:
        monkeypatch.setenv("PYTHONHASHSEED", value)
    u.init_none_hash(sha256)
    return value


def vllm_request(prompt, block_size, output=(), salt=None, lora=None):
    req = Request("r", list(prompt), SamplingParams(max_tokens=max(len(output), 1)), None, cache_salt=salt,
                  lora_request=LoRARequest(lora[0], 1, lora[1]) if lora else None,
                  block_hasher=u.get_request_block_hasher(block_size, sha256))
    if output:
        req.append_output_token_ids(list(output))
    return req


def vllm_hashes(req) -> list[int]:
    return [u.maybe_convert_block_hash(h) for h in req.block_hashes]


@pytest.mark.parametrize("seed", [None, "0", "7"], indirect=True)
@pytest.mark.parametrize("length", [15, 16, 17, 47, 48, 49])
def test_prompt_hashes_at_the_block_boundaries(seed, length):
    prompt = list(range(500, 500 + length))
    want = vllm_hashes(vllm_request(prompt, 16))
    assert len(want) == length // 16
    assert vh.block_hashes(prompt, 16, None, seed) == want


@pytest.mark.parametrize("seed", [None, "7"], indirect=True)
def test_salt_lora_and_output_tokens(seed):
    prompt, output = list(range(1000, 1040)), [7, 8, 9, 10, 11, 12, 13, 14, 15]  # 49 tokens: 3 blocks of 16
    for salt in (None, "tenant-a"):
        for lora in (None, ("sql", "/adapters/sql")):
            req = vllm_request(prompt, 16, output, salt, lora)
            want = vllm_hashes(req)
            assert len(want) == 3
            assert vh.block_hashes(prompt + output, 16, salt, seed, lora) == want, (salt, lora)
    # a salt changes every hash (the chain carries block 0's); another LoRA path too
    plain = vh.block_hashes(prompt, 16, None, seed)
    salted = vh.block_hashes(prompt, 16, "tenant-a", seed)
    assert all(a != b for a, b in zip(plain, salted))
    assert vh.block_hashes(prompt, 16, None, seed, ("sql", "/a")) != vh.block_hashes(prompt, 16, None, seed, ("sql", "/b"))


@pytest.mark.parametrize("seed", [None], indirect=True)
def test_one_token_blocks_and_an_empty_prompt(seed):
    prompt = [3, 1, 4, 1, 5]
    assert vh.block_hashes(prompt, 1, None, seed) == vllm_hashes(vllm_request(prompt, 1))
    assert vh.block_hashes([], 16) == []


@pytest.mark.parametrize("seed", [None, "7", ""], indirect=True)
def test_none_hash_is_vllms(seed):
    assert vh.none_hash(seed) == u.NONE_HASH
    assert vh.server_seed() == seed
    assert vh.none_hash(vh.server_seed()) == u.NONE_HASH
    assert vh.DEFAULT_SEED == u.DEFAULT_NONE_HASH_SEED


@pytest.mark.parametrize("seed", [None], indirect=True)
def test_extra_keys_are_vllms(seed):
    req = vllm_request(range(40), 16, salt="s", lora=("sql", "/adapters/sql"))
    for i in range(2):
        want, _ = u.generate_block_hash_extra_keys(req, i * 16, (i + 1) * 16, 0)
        assert vh.extra_keys(i, "s", ("sql", "/adapters/sql")) == want
    assert vh.extra_keys(0, "s") == (("cache_salt", "s"),) and vh.extra_keys(1, "s") is None
    assert vh.extra_keys(0, None) is None and vh.extra_keys(0, "") is None  # vLLM: `if ... and request.cache_salt`
    assert vh.extra_keys(3, None, ("a", "/p")) == (("lora", "a", "/p"),)


def test_external_is_the_low_64_bits_big_endian():
    for digest in (b"\xff" * 32, bytes(31) + b"\x01", b"\x01" + bytes(31), bytes(range(32)), bytes(24) + b"\x80" + bytes(7)):
        assert vh.external(digest) == u.maybe_convert_block_hash(digest)
    assert vh.external(b"\xff" * 32) == 2**64 - 1
    assert vh.external(b"\x01" + bytes(31)) == 0
    assert vh.external(bytes(range(32))) == int.from_bytes(bytes(range(24, 32)), "big")
