import dataclasses

import numpy as np
import pytest

from edge_slm_node.kv import KVBlockManager, NoFreeBlocksError

BLOCK_SIZE = 4


def prefill(manager, seq_id, prompt):
    """allocate_prompt + commit of the computed part (as the engine would)."""
    cached = manager.allocate_prompt(seq_id, prompt)
    manager.commit(seq_id, prompt[cached:])
    return cached


def decode(manager, seq_id, tokens):
    copies = manager.reserve(seq_id, len(tokens))
    manager.commit(seq_id, tokens)
    return copies


def snapshot(manager):
    tables = {seq_id: manager.block_table(seq_id) for seq_id in manager._seqs}
    return manager.stats(), tables, list(manager.pool._cached), list(manager.pool._free)


def test_prompt_without_cache_hit_reserves_then_commits():
    manager = KVBlockManager(8, BLOCK_SIZE)
    assert manager.allocate_prompt("a", list(range(10))) == 0
    assert manager.num_blocks("a") == 3
    assert manager.num_tokens("a") == 0 and manager.num_reserved_tokens("a") == 10
    manager.commit("a", list(range(10)))
    assert manager.num_tokens("a") == 10
    assert manager.pool.num_cached == 0 and sum(map(manager.pool.is_hashed, range(8))) == 2
    manager.check_invariants()


def test_prefix_hit_reuses_leading_full_blocks():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "a", list(range(10)))
    assert manager.allocate_prompt("b", list(range(8)) + [50, 51, 52]) == 8
    assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
    assert manager.num_shared_blocks("b") == 2 and manager.token_ids("b") == list(range(8))
    stats = manager.stats()
    assert (stats.prefix_query_tokens, stats.prefix_hit_tokens) == (21, 8)
    manager.check_invariants()


@pytest.mark.parametrize("prompt_length, expected_cached", [(8, 4), (9, 8), (4, 0), (5, 4)])
def test_full_cache_hit_still_computes_at_least_one_token(prompt_length, expected_cached):
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "a", list(range(12)))
    cached = manager.allocate_prompt("b", list(range(prompt_length)))
    assert cached == expected_cached and cached % BLOCK_SIZE == 0 and cached < prompt_length
    manager.commit("b", list(range(cached, prompt_length)))
    manager.check_invariants()


def test_prompt_hit_on_freed_blocks_comes_from_lru():
    manager = KVBlockManager(4, BLOCK_SIZE)
    prefill(manager, "a", list(range(9)))
    assert manager.free("a") == 3
    assert manager.pool.num_cached == 2 and manager.pool.num_free == 2
    assert manager.prompt_blocks_needed(list(range(9))) == 3
    assert manager.allocate_prompt("b", list(range(9))) == 8
    assert manager.pool.num_cached == 0 and manager.stats().evictions == 0
    manager.check_invariants()


def test_allocate_prompt_failure_changes_nothing():
    manager = KVBlockManager(4, BLOCK_SIZE)
    prefill(manager, "a", list(range(8)))
    manager.free("a")  # two cached blocks
    prefill(manager, "x", [90])  # one used block, one free
    before = snapshot(manager)
    with pytest.raises(NoFreeBlocksError) as info:
        manager.allocate_prompt("b", list(range(8)) + list(range(100, 109)))
    assert (info.value.free, info.value.needed) == (3, 5)
    assert snapshot(manager) == before and not manager.has_seq("b")
    manager.check_invariants()


def test_fork_then_reserve_returns_copy_on_write_op():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "parent", list(range(6)))
    manager.fork("parent", "child")
    assert manager.block_table("child") == manager.block_table("parent")
    assert manager.num_shared_blocks("child") == 2
    shared_partial = manager.block_table("parent")[1]
    copies = manager.reserve("child", 1)
    new_block = manager.block_table("child")[1]
    assert copies == [(shared_partial, new_block)] and new_block != shared_partial
    assert manager.block_table("child")[0] == manager.block_table("parent")[0]
    manager.commit("child", [60])
    assert decode(manager, "parent", [70]) == []  # parent now owns its block alone
    assert manager.block_table("parent")[1] == shared_partial
    manager.check_invariants()


def test_fork_at_block_boundary_needs_no_copy():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "parent", list(range(8)))
    manager.fork("parent", "child")
    assert decode(manager, "child", [1, 2]) == []
    assert manager.num_blocks("child") == 3 and manager.num_shared_blocks("child") == 2


def test_fork_with_uncommitted_reservation_is_refused():
    manager = KVBlockManager(8, BLOCK_SIZE)
    manager.allocate_prompt("parent", [1, 2, 3])
    with pytest.raises(ValueError, match="3 tokens reserved, only 0 committed"):
        manager.fork("parent", "child")


def test_reserve_failure_changes_nothing():
    manager = KVBlockManager(3, BLOCK_SIZE)
    prefill(manager, "parent", list(range(6)))
    manager.fork("parent", "child")
    before = snapshot(manager)
    assert manager.blocks_needed("child", 3) == 2 and not manager.can_allocate(2)
    with pytest.raises(NoFreeBlocksError) as info:
        manager.reserve("child", 3)  # COW of the partial block + one new block
    assert (info.value.free, info.value.needed) == (1, 2)
    assert snapshot(manager) == before
    manager.check_invariants()


def test_commit_beyond_reservation_raises_with_values():
    manager = KVBlockManager(8, BLOCK_SIZE)
    manager.allocate_prompt("a", [1, 2, 3])
    with pytest.raises(ValueError, match="commit of 4 tokens exceeds reservation"):
        manager.commit("a", [1, 2, 3, 4])


def test_slot_mapping_follows_block_table():
    manager = KVBlockManager(8, BLOCK_SIZE)
    manager.pool.allocate(1)  # so the sequence does not start at block 0
    manager.allocate_prompt("a", list(range(6)))
    table = manager.block_table("a")
    slots = manager.slot_mapping("a", 2, 4)
    assert slots.dtype == np.int32
    expected = [table[p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in range(2, 6)]
    assert slots.tolist() == expected
    assert manager.slot_mapping("a", 6, 0).size == 0
    with pytest.raises(ValueError, match=r"\[4, 7\)"):
        manager.slot_mapping("a", 4, 3)


def test_truncate_releases_blocks_and_rolls_back_reservation():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "a", list(range(10)))
    manager.reserve("a", 7)  # failed step: roll back
    assert manager.num_blocks("a") == 5
    assert manager.truncate("a", manager.num_tokens("a")) == 2
    assert manager.num_blocks("a") == 3 and manager.num_reserved_tokens("a") == 10
    assert manager.truncate("a", 4) == 2
    assert manager.token_ids("a") == [0, 1, 2, 3] and manager.num_blocks("a") == 1
    with pytest.raises(ValueError, match="cannot truncate to 5 tokens"):
        manager.truncate("a", 5)
    manager.check_invariants()


def test_truncate_into_private_hashed_block_forgets_its_hash_on_write():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "a", list(range(8)))
    manager.truncate("a", 6)
    assert decode(manager, "a", [99, 98]) == []
    manager.free("a")
    assert manager.allocate_prompt("b", list(range(8)) + [1]) == 4  # block 1 no longer cached
    manager.check_invariants()


def test_truncate_into_shared_hashed_block_copies_on_write():
    manager = KVBlockManager(8, BLOCK_SIZE)
    prefill(manager, "a", list(range(8)))
    prefill(manager, "b", list(range(8)) + [5])
    manager.truncate("a", 6)
    block = manager.block_table("a")[1]
    copies = decode(manager, "a", [99, 98])
    assert copies == [(block, manager.block_table("a")[1])]
    assert manager.block_table("b")[1] == block and manager.pool.is_hashed(block)
    manager.check_invariants()


def test_pinned_system_prompt_survives_free_and_eviction_pressure():
    manager = KVBlockManager(6, BLOCK_SIZE)
    system_prompt = list(range(10))
    prefill(manager, "system", system_prompt)
    pinned = manager.pin_sequence("system")
    assert len(pinned) == 2 and manager.stats().pinned_blocks == 2
    manager.free("system")
    for round_index in range(3):  # churn through every other block
        prefill(manager, "user", [100 + round_index] * 16)
        manager.free("user")
    assert all(manager.pool.ref_count(block) == 1 for block in pinned)
    assert manager.allocate_prompt("session", system_prompt + [7]) == 8
    assert manager.block_table("session")[:2] == pinned
    manager.free("session")
    assert manager.unpin(pinned) == 2
    assert manager.stats().free_blocks + manager.stats().cached_blocks == 6
    manager.check_invariants()


def test_free_returns_blocks_that_went_back_and_baseline_is_restored():
    manager = KVBlockManager(8, BLOCK_SIZE)
    baseline = manager.stats()
    prefill(manager, "a", list(range(9)))
    manager.fork("a", "b")
    decode(manager, "b", [1, 2, 3, 4])  # copies block 2, adds block 3
    assert manager.free("a") == 1  # blocks 0 and 1 are still held by b
    assert manager.free("b") == 4
    stats = manager.stats()
    assert stats.free_blocks + stats.cached_blocks == baseline.free_blocks == 8
    assert (stats.used_blocks, stats.shared_blocks, stats.num_sequences) == (0, 0, 0)
    manager.check_invariants()


def test_prefix_cache_disabled_never_hashes():
    manager = KVBlockManager(8, BLOCK_SIZE, enable_prefix_cache=False)
    prefill(manager, "a", list(range(9)))
    assert manager.allocate_prompt("b", list(range(9))) == 0
    manager.free("a")
    assert manager.pool.num_cached == 0
    manager.check_invariants()


def test_errors_name_the_sequence():
    manager = KVBlockManager(8, BLOCK_SIZE)
    with pytest.raises(KeyError, match="'ghost'"):
        manager.num_tokens("ghost")
    prefill(manager, 7, [1])
    with pytest.raises(ValueError, match="7 already exists"):
        manager.allocate_prompt(7, [1])
    with pytest.raises(ValueError, match="no tokens"):
        manager.allocate_prompt(8, [])


def test_stats_is_frozen_dataclass():
    stats = KVBlockManager(8, BLOCK_SIZE).stats()
    assert dataclasses.asdict(stats)["total_blocks"] == 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.free_blocks = 1
