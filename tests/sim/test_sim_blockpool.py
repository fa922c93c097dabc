"""The simulator's copy of vLLM's block pool (block_pool.py, kv_cache_utils.py `FreeBlockQueue`):
which block a request gets next after frees, what is in the free queue, duplicate hashes, an
empty queue, and the refusal of more blocks than are free."""

from __future__ import annotations

import pytest

from pagetrace.sim.blockpool import BlockPool, FreeBlockQueue


def test_a_new_pool_caches_frees_uncached_blocks_first_and_has_evicted_nothing():
    pool = BlockPool(6)  # the defaults: caching on, uncached blocks freed to the front
    assert pool.num_free == 5 and pool.queue.order() == [1, 2, 3, 4, 5] and pool.evictions == 0
    a = pool.get_new_blocks(3)
    assert a == [1, 2, 3] and all(b not in pool.queue for b in a) and 4 in pool.queue
    pool.cache_block(1, 111)
    pool.cache_block(2, 222)
    pool.free_blocks([3, 2, 1])  # tail first: 3 has no hash (front), 2 and 1 are cached (back, in that order)
    assert pool.queue.order() == [3, 4, 5, 2, 1]
    assert all(b in pool.queue for b in (1, 2, 3))
    assert pool.get_new_blocks(4) == [3, 4, 5, 2]  # 2 is reused: its hash is dropped, one eviction
    assert pool.evictions == 1 and pool.cached_items() == [(111, [1])]


@pytest.mark.parametrize("uncached_first,order", [(True, [3, 4, 5, 2, 1]), (False, [4, 5, 3, 2, 1])])
def test_freed_blocks_in_the_queue_with_and_without_uncached_first(uncached_first, order):
    pool = BlockPool(6, True, uncached_first)
    pool.get_new_blocks(3)
    pool.cache_block(1, 111)
    pool.cache_block(2, 222)
    pool.free_blocks([3, 2, 1])
    assert pool.queue.order() == order


def test_without_caching_freed_blocks_go_to_the_front():
    pool = BlockPool(6, enable_caching=False)
    pool.get_new_blocks(3)
    pool.free_blocks([3, 2, 1])
    assert pool.queue.order() == [3, 2, 1, 4, 5]


def test_a_hit_on_a_free_cached_block_takes_it_out_of_the_queue():
    pool = BlockPool(5)
    pool.get_new_blocks(2)
    pool.cache_block(1, 111)
    pool.free_blocks([2, 1])
    pool.touch([1])  # a new request hits block 1 while it is free
    assert 1 not in pool.queue and pool.num_free == 3 and pool.queue.order() == [2, 3, 4]
    assert pool.ref_cnt[1] == 1


def test_two_blocks_with_one_hash_are_both_listed():
    pool = BlockPool(5)
    pool.get_new_blocks(3)
    for b in (1, 2, 3):
        pool.cache_block(b, 7)
    assert pool.cached_items() == [(7, [1, 2, 3])]


def test_an_empty_queue_and_asking_for_more_than_is_free():
    queue = FreeBlockQueue(0)
    assert queue.order() == [] and queue.num_free == 0
    pool = BlockPool(5)
    with pytest.raises(ValueError, match=r"^cannot get 5 free blocks from the pool$"):
        pool.get_new_blocks(5)
    assert pool.num_free == 4


def test_a_fresh_queue_is_linked_at_both_ends():
    """Block 0 is free and first in a fresh queue (the pool pops it as the null block), so taking
    it out of the middle, or asking for it, must work before anything else has moved."""
    q = FreeBlockQueue(3)
    assert 0 in q and 2 in q and q.order() == [0, 1, 2]
    q.remove(0)
    assert q.order() == [1, 2] and 0 not in q and q.num_free == 2
    q.remove(2)
    q.append_n([0])
    assert q.order() == [1, 0] and q.popleft_n(2) == [1, 0] and q.order() == []
