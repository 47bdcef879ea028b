import subprocess
import sys
from pathlib import Path

import pytest

from edge_slm_node.kv.block_pool import BlockPool, NoFreeBlocksError, block_hash


def counts(pool):
    return (pool.num_free, pool.num_cached, pool.num_available, pool.num_used,
            pool.num_pinned, pool.num_shared, pool.evictions)


def hashed_blocks(pool, count, first_token=0):
    """Allocate `count` blocks and register each under its own content hash."""
    block_ids = pool.allocate(count)
    for index, block_id in enumerate(block_ids):
        tokens = [first_token + index] * pool.block_size
        pool.register_full_block(block_id, block_hash(None, tokens), tokens)
    return block_ids


def test_error_carries_values():
    error = NoFreeBlocksError(free=3, needed=9)
    assert isinstance(error, RuntimeError)
    assert (error.free, error.needed) == (3, 9)
    assert str(error) == "KV pool has 3 free blocks, request needs 9"


def test_allocate_is_atomic():
    pool = BlockPool(4, 2)
    pool.allocate(3)
    before = counts(pool)
    with pytest.raises(NoFreeBlocksError) as info:
        pool.allocate(2)
    assert (info.value.free, info.value.needed) == (1, 2)
    assert counts(pool) == before
    pool.check_invariants()


def test_atomic_failure_does_not_evict_cached_blocks():
    pool = BlockPool(4, 2)
    pool.free(hashed_blocks(pool, 2))
    pool.allocate(1)
    before = counts(pool)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(4)
    assert counts(pool) == before and pool.evictions == 0


def test_free_list_first_then_lru_head():
    pool = BlockPool(4, 2)
    first, second = hashed_blocks(pool, 2)
    pool.free([second, first])  # second freed first -> LRU head
    assert pool.num_cached == 2 and pool.num_free == 2
    plain = pool.allocate(2)
    assert set(plain).isdisjoint({first, second}) and pool.evictions == 0
    assert pool.allocate(1) == [second]
    assert pool.evictions == 1 and not pool.is_hashed(second)
    assert pool.lookup(block_hash(None, [1, 1]), [1, 1]) is None
    assert pool.allocate(1) == [first] and pool.evictions == 2
    pool.check_invariants()


def test_cached_block_keeps_hash_and_is_reacquired():
    pool = BlockPool(2, 2)
    (block_id,) = hashed_blocks(pool, 1, first_token=7)
    pool.free([block_id])
    assert pool.is_cached(block_id) and pool.num_available == 2
    found = pool.lookup(block_hash(None, [7, 7]), [7, 7])
    assert found == block_id
    pool.acquire_cached(found)
    assert pool.ref_count(block_id) == 1 and not pool.is_cached(block_id)
    assert pool.num_available == 1
    pool.acquire_cached(found)
    assert pool.ref_count(block_id) == 2 and pool.is_shared(block_id)
    pool.check_invariants()


def test_lookup_rejects_collision_with_different_tokens():
    pool = BlockPool(2, 4)
    (block_id,) = pool.allocate(1)
    forced_hash = b"\x01" * 16
    pool.register_full_block(block_id, forced_hash, [1, 2, 3, 4])
    assert pool.lookup(forced_hash, [1, 2, 3, 4]) == block_id
    assert pool.lookup(forced_hash, [9, 9, 9, 9]) is None
    assert pool.lookup(b"\x02" * 16, [1, 2, 3, 4]) is None


def test_register_duplicate_hash_keeps_first_block():
    pool = BlockPool(2, 2)
    first, second = pool.allocate(2)
    digest = block_hash(None, [5, 5])
    assert pool.register_full_block(first, digest, [5, 5])
    assert not pool.register_full_block(second, digest, [5, 5])
    assert not pool.is_hashed(second)
    pool.free([first, second])
    assert pool.num_cached == 1 and pool.num_free == 1
    pool.check_invariants()


def test_pinned_blocks_are_never_freed_nor_evicted():
    pool = BlockPool(3, 2)
    pinned = hashed_blocks(pool, 1)
    pool.pin(pinned)
    pool.pin(pinned)  # idempotent
    assert pool.ref_count(pinned[0]) == 2 and pool.num_pinned == 1 and pool.num_shared == 1
    assert pool.free(pinned) == 0
    assert not pool.is_cached(pinned[0])
    assert pinned[0] not in pool.allocate(2)
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(1)
    assert pool.unpin(pinned) == 1 and pool.is_cached(pinned[0])
    pool.check_invariants()


def test_pin_a_cached_block_takes_it_out_of_the_lru():
    pool = BlockPool(2, 2)
    block_ids = hashed_blocks(pool, 1)
    pool.free(block_ids)
    pool.pin(block_ids)
    assert pool.num_cached == 0 and pool.ref_count(block_ids[0]) == 1
    pool.check_invariants()


def test_ref_counts_never_negative():
    pool = BlockPool(2, 2)
    (block_id,) = pool.allocate(1)
    assert pool.decref(block_id)
    with pytest.raises(AssertionError):
        pool.decref(block_id)
    with pytest.raises(AssertionError):
        pool.incref(block_id)
    pool.check_invariants()


def test_counts_and_baseline():
    pool = BlockPool(6, 4)
    plain = pool.allocate(2)
    hashed = hashed_blocks(pool, 2)
    pool.incref(plain[0])
    assert (pool.num_used, pool.num_free, pool.num_shared) == (4, 2, 1)
    pool.free(plain + hashed + plain[:1])
    assert pool.num_available == 6 and pool.num_used == 0 and pool.num_cached == 2
    pool.check_invariants()


def test_block_hash_chained_and_stable_across_processes():
    root = block_hash(None, [1, 2, 3, 4])
    child = block_hash(root, [5, 6, 7, 8])
    assert len(root) == 16 and root != child
    assert block_hash(block_hash(None, [0, 2, 3, 4]), [5, 6, 7, 8]) != child
    code = ("from edge_slm_node.kv.block_pool import block_hash;"
            "print(block_hash(block_hash(None, [1, 2, 3, 4]), [5, 6, 7, 8]).hex())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": "123",
                                "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert other.stdout.strip() == child.hex()


def test_invalid_sizes_raise_with_values():
    with pytest.raises(ValueError, match="0, 4"):
        BlockPool(0, 4)
