"""Random create/reserve/commit/fork/truncate/free programs on a tiny pool.

A simulated arena (one token id per slot) stands in for KV data: the engine's writes go
to slot_mapping slots, copy ops are applied, and every committed token of every sequence,
and every cached block, must still read back correctly.
"""

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (Bundle, RuleBasedStateMachine, consumes, initialize,
                                 invariant, precondition, rule)

from edge_slm_node.kv import KVBlockManager, NoFreeBlocksError

NUM_BLOCKS = 8
BLOCK_SIZE = 4
SHARED_PREFIXES = ([], [1] * 8, [0, 1, 2, 0, 1, 2, 0, 1], [0, 1, 2, 0])  # so prompts hit
tokens_strategy = st.builds(lambda prefix, tail: prefix + tail, st.sampled_from(SHARED_PREFIXES),
                            st.lists(st.integers(0, 2), max_size=6)).filter(bool)


class KVMachine(RuleBasedStateMachine):
    seqs = Bundle("seqs")

    @initialize(enable_prefix_cache=st.booleans())
    def setup(self, enable_prefix_cache):
        self.manager = KVBlockManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_cache)
        self.arena = np.full(NUM_BLOCKS * BLOCK_SIZE, -1, dtype=np.int64)
        self.next_id = 0
        self.pinned = []

    def snapshot(self):
        manager = self.manager
        tables = {s: (manager.block_table(s), manager.token_ids(s)) for s in manager._seqs}
        return manager.stats(), tables, list(manager.pool._cached), list(manager.pool._free)

    def write(self, seq_id, tokens):
        """Engine writes KV for the next tokens into reserved, private, unhashed blocks."""
        start = self.manager.num_tokens(seq_id)
        slots = self.manager.slot_mapping(seq_id, start, len(tokens))
        for block_id in set((slots // BLOCK_SIZE).tolist()):
            pool = self.manager.pool
            assert pool.ref_count(block_id) == 1 and not pool.is_pinned(block_id)
            assert not pool.is_hashed(block_id)
        self.arena[slots] = tokens

    def apply_copies(self, copies):
        for src, dst in copies:
            self.arena[dst * BLOCK_SIZE:(dst + 1) * BLOCK_SIZE] = \
                self.arena[src * BLOCK_SIZE:(src + 1) * BLOCK_SIZE]

    @rule(target=seqs, prompt=tokens_strategy, commit_now=st.booleans())
    def create(self, prompt, commit_now):
        seq_id = self.next_id
        self.next_id += 1
        before = self.snapshot()
        try:
            cached = self.manager.allocate_prompt(seq_id, prompt)
        except NoFreeBlocksError:
            assert self.snapshot() == before
            return None
        assert cached % BLOCK_SIZE == 0 and cached < len(prompt)
        slots = self.manager.slot_mapping(seq_id, 0, cached)
        assert self.arena[slots].tolist() == prompt[:cached]  # a hit served the right KV
        if commit_now:
            self.write(seq_id, prompt[cached:])
            self.manager.commit(seq_id, prompt[cached:])
        return seq_id

    @rule(seq_id=seqs, tokens=st.lists(st.integers(0, 2), min_size=1, max_size=6),
          fail_step=st.booleans())
    def append(self, seq_id, tokens, fail_step):
        if seq_id is None or not self.manager.has_seq(seq_id):
            return
        before = self.snapshot()
        needed = self.manager.blocks_needed(seq_id, len(tokens))
        try:
            copies = self.manager.reserve(seq_id, len(tokens))
        except NoFreeBlocksError as error:
            assert error.needed == needed and not self.manager.can_allocate(needed)
            assert self.snapshot() == before
            return
        self.apply_copies(copies)
        if fail_step:  # engine wrote garbage, then rolls back
            self.write(seq_id, [-7] * len(tokens))
            self.manager.truncate(seq_id, self.manager.num_tokens(seq_id))
        else:
            self.write(seq_id, tokens)
            self.manager.commit(seq_id, tokens)

    @rule(target=seqs, parent=seqs)
    def fork(self, parent):
        manager = self.manager
        if parent is None or not manager.has_seq(parent):
            return None
        if manager.num_reserved_tokens(parent) > manager.num_tokens(parent):
            return None
        child = self.next_id
        self.next_id += 1
        manager.fork(parent, child)
        return child

    @rule(seq_id=seqs, data=st.data())
    def truncate(self, seq_id, data):
        if seq_id is None or not self.manager.has_seq(seq_id):
            return
        keep = data.draw(st.integers(0, self.manager.num_tokens(seq_id)))
        self.manager.truncate(seq_id, keep)

    @rule(seq_id=consumes(seqs))
    def free(self, seq_id):
        if seq_id is not None and self.manager.has_seq(seq_id):
            available = self.manager.pool.num_available
            freed = self.manager.free(seq_id)
            assert self.manager.pool.num_available == available + freed

    @precondition(lambda self: not self.pinned)
    @rule(seq_id=seqs)
    def pin(self, seq_id):
        if seq_id is not None and self.manager.has_seq(seq_id):
            self.pinned = self.manager.pin_sequence(seq_id)

    @rule()
    def unpin(self):
        self.manager.unpin(self.pinned)
        self.pinned = []

    @invariant()
    def consistent(self):
        manager = self.manager
        manager.check_invariants()
        for seq_id in manager._seqs:
            slots = manager.slot_mapping(seq_id, 0, manager.num_tokens(seq_id))
            assert self.arena[slots].tolist() == manager.token_ids(seq_id)
        for block_id, tokens in manager.pool._tokens_of_block.items():
            block = self.arena[block_id * BLOCK_SIZE:(block_id + 1) * BLOCK_SIZE]
            assert tuple(block.tolist()) == tokens, f"cached block {block_id} corrupted"

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for seq_id in list(self.manager._seqs):
            self.manager.free(seq_id)
        self.manager.unpin(self.pinned)
        self.manager.check_invariants()
        stats = self.manager.stats()
        assert stats.free_blocks + stats.cached_blocks == NUM_BLOCKS
        assert (stats.used_blocks, stats.pinned_blocks, stats.shared_blocks) == (0, 0, 0)


KVMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                       deadline=None,
                                       suppress_health_check=[HealthCheck.too_slow])
TestKVMachine = KVMachine.TestCase
