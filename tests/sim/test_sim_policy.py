"""vLLM's block manager in the simulator (`VllmPrefixCaching`), called as the scheduler calls it,
at the boundaries a user's pool hits: a request that needs exactly the free blocks, one block
more, a one-token prompt into a full pool, a decode step that starts a block with none free,
and `full_sequence_must_fit` (vLLM's `scheduler_reserve_full_isl`) for a chunked prompt.

The pool follows vLLM's block_pool.py: block 0 is the null block, so `num_blocks` blocks give
`num_blocks - 1` to requests, handed out from the head of the free queue (1, 2, 3, ...).
"""

from __future__ import annotations

from pagetrace.sim.policy import VllmPrefixCaching
from pagetrace.sim.request import SimRequest


def ids(start, n):
    return list(range(start, start + n))


def test_a_prompt_needing_exactly_the_free_blocks_gets_them_one_more_waits():
    policy = VllmPrefixCaching(num_blocks=5, block_size=4)  # 4 usable blocks, 16 slots
    assert policy.pool.num_free == 4
    big = SimRequest("big", ids(0, 17), [1])  # 17 tokens: 5 blocks
    assert policy.allocate_slots(big, 17) is None
    assert policy.block_ids("big") == [] and policy.pool.num_free == 4  # nothing taken
    exact = SimRequest("exact", ids(100, 16), [1])  # exactly 4 blocks
    assert policy.allocate_slots(exact, 16) == [1, 2, 3, 4]
    assert policy.block_ids("exact") == [1, 2, 3, 4] and policy.pool.num_free == 0


def test_a_one_token_prompt_into_a_full_pool_waits():
    policy = VllmPrefixCaching(num_blocks=3, block_size=4)
    assert policy.allocate_slots(SimRequest("a", ids(0, 8), [1]), 8) == [1, 2]
    one = SimRequest("one", [500], [1])
    assert policy.allocate_slots(one, 1) is None
    assert policy.block_ids("one") == [] and "one" not in policy.num_cached_block


def test_a_decode_step_starting_a_block_takes_the_last_free_one_then_waits():
    policy = VllmPrefixCaching(num_blocks=3, block_size=4, enable_caching=False)
    a = SimRequest("a", ids(0, 4), [7, 8, 9, 10, 11])
    assert policy.allocate_slots(a, 4) == [1]
    a.num_computed = 4
    a.num_generated = 1  # token 4 starts the second block: the last free one
    assert policy.allocate_slots(a, 1) == [2]
    assert policy.pool.num_free == 0
    for n in (5, 6, 7):  # tokens 5..7 fit in block 2
        a.num_computed, a.num_generated = n, n - 3
        assert policy.allocate_slots(a, 1) == []
    a.num_computed, a.num_generated = 8, 5  # token 8 needs a third block: none free
    assert policy.allocate_slots(a, 1) is None
    assert policy.block_ids("a") == [1, 2]


def test_full_sequence_must_fit_refuses_a_chunk_whose_whole_prompt_does_not_fit():
    """A 12-token prompt in chunks of 4 with 2 free blocks: the chunk fits, the prompt (3
    blocks) does not; without the option the chunk is admitted."""
    policy = VllmPrefixCaching(num_blocks=3, block_size=4)
    req = SimRequest("r", ids(0, 12), [1])
    assert policy.allocate_slots(req, 4, full_sequence_must_fit=True) is None
    assert policy.block_ids("r") == []
    assert policy.allocate_slots(req, 4) == [1]
    other = VllmPrefixCaching(num_blocks=4, block_size=4)  # 3 free: the whole prompt fits exactly
    assert other.allocate_slots(SimRequest("r", ids(0, 12), [1]), 4, full_sequence_must_fit=True) == [1]


def test_freed_blocks_are_handed_out_again_and_a_freed_request_holds_none():
    policy = VllmPrefixCaching(num_blocks=4, block_size=4, enable_caching=False)
    a = SimRequest("a", ids(0, 12), [1])
    assert policy.allocate_slots(a, 12) == [1, 2, 3]
    policy.free(a)
    assert policy.block_ids("a") == [] and policy.pool.num_free == 3
    b = SimRequest("b", ids(50, 12), [1])
    assert sorted(policy.allocate_slots(b, 12)) == [1, 2, 3]


def test_full_sequence_must_fit_for_a_running_request_counts_the_blocks_it_holds():
    """The second chunk of a 12-token prompt with 2 blocks free: it holds 1 of the prompt's 3
    blocks, so the rest (2) fits exactly."""
    policy = VllmPrefixCaching(num_blocks=4, block_size=4)
    req = SimRequest("r", ids(0, 12), [1])
    assert policy.allocate_slots(req, 4) == [1]
    req.num_computed = 4
    assert policy.pool.num_free == 2
    assert policy.allocate_slots(req, 4, full_sequence_must_fit=True) == [2]
    req.num_computed = 8
    assert policy.allocate_slots(req, 4, full_sequence_must_fit=True) == [3]
    assert policy.block_ids("r") == [1, 2, 3] and policy.pool.num_free == 0
