"""Per-sequence block tables over a BlockPool, with prefix caching and copy-on-write.

Growth is two-phase because the engine computes KV between the calls:
  allocate_prompt / reserve  -> claim slots (and report copy-on-write ops)
  engine writes KV into slot_mapping(...)
  commit                     -> mark those tokens computed; full blocks get hashed
A failed step is rolled back with truncate(seq_id, num_tokens(seq_id)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Hashable, Sequence

import numpy as np

from edge_slm_node.kv.block_pool import BlockPool, NoFreeBlocksError, block_hash


@dataclass
class SequenceBlocks:
    block_ids: list[int] = field(default_factory=list)  # block table
    token_ids: list[int] = field(default_factory=list)  # tokens whose KV is committed
    num_reserved_tokens: int = 0  # committed + claimed-but-uncommitted positions
    block_hashes: list[bytes] = field(default_factory=list)  # chain over full committed blocks

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class KVStats:
    total_blocks: int
    free_blocks: int
    cached_blocks: int
    used_blocks: int
    pinned_blocks: int
    shared_blocks: int
    num_sequences: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int


class KVBlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True):
        self.pool = BlockPool(num_blocks, block_size)
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.prefix_query_tokens = 0
        self.prefix_hit_tokens = 0
        self._seqs: dict[Hashable, SequenceBlocks] = {}

    # ---- queries ------------------------------------------------------------------------
    def has_seq(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def num_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_tokens

    def num_reserved_tokens(self, seq_id: Hashable) -> int:
        return self._seq(seq_id).num_reserved_tokens

    def token_ids(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).token_ids)

    def num_blocks(self, seq_id: Hashable) -> int:
        return len(self._seq(seq_id).block_ids)

    def num_shared_blocks(self, seq_id: Hashable) -> int:
        return sum(1 for b in self._seq(seq_id).block_ids if self.pool.is_shared(b))

    def block_table(self, seq_id: Hashable) -> list[int]:
        return list(self._seq(seq_id).block_ids)

    def slot_mapping(self, seq_id: Hashable, start: int, count: int) -> np.ndarray:
        """Arena slots (block_id * block_size + offset) of positions [start, start + count)."""
        seq = self._seq(seq_id)
        if start < 0 or count < 0 or start + count > seq.num_reserved_tokens:
            raise ValueError(f"positions [{start}, {start + count}) outside sequence {seq_id!r} "
                             f"with {seq.num_reserved_tokens} reserved tokens")
        positions = np.arange(start, start + count, dtype=np.int64)
        table = np.asarray(seq.block_ids, dtype=np.int64)
        slots = table[positions // self.block_size] * self.block_size + positions % self.block_size
        return slots.astype(np.int32)

    def can_allocate(self, num_new_blocks: int) -> bool:
        return num_new_blocks <= self.pool.num_available

    def blocks_needed(self, seq_id: Hashable, num_new_tokens: int) -> int:
        """Blocks reserve(seq_id, num_new_tokens) would take from the pool (growth + COW)."""
        seq = self._seq(seq_id)
        copy_on_write = self._growth_and_cow(seq, num_new_tokens)[1]
        return self._growth_blocks(seq, num_new_tokens) + len(copy_on_write)

    def prompt_blocks_needed(self, token_ids: Sequence[int]) -> int:
        """Blocks allocate_prompt(token_ids) would take from the available pool."""
        reused = self._find_cached_prefix(token_ids)[0]
        fresh = -(-len(token_ids) // self.block_size) - len(reused)
        return fresh + sum(1 for b in reused if self.pool.is_cached(b))

    def stats(self) -> KVStats:
        pool = self.pool
        return KVStats(pool.num_blocks, pool.num_free, pool.num_cached, pool.num_used,
                       pool.num_pinned, pool.num_shared, len(self._seqs),
                       self.prefix_query_tokens, self.prefix_hit_tokens, pool.evictions)

    # ---- growth -------------------------------------------------------------------------
    def allocate_prompt(self, seq_id: Hashable, token_ids: Sequence[int]) -> int:
        """Create a sequence for a prompt; returns num_cached_tokens (a block multiple).

        Reuses the longest cached run of leading full blocks, but never the whole prompt:
        at least one token is left to compute. Positions [num_cached_tokens, len(token_ids))
        are reserved; commit them after writing their KV. Atomic on NoFreeBlocksError.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id!r} already exists")
        if len(token_ids) == 0:
            raise ValueError(f"sequence {seq_id!r}: prompt has no tokens")
        token_ids = [int(token) for token in token_ids]
        reused, hashes = self._find_cached_prefix(token_ids)
        fresh = -(-len(token_ids) // self.block_size) - len(reused)
        needed = fresh + sum(1 for b in reused if self.pool.is_cached(b))
        if needed > self.pool.num_available:
            raise NoFreeBlocksError(self.pool.num_available, needed)
        for block_id in reused:
            self.pool.acquire_cached(block_id)
        num_cached_tokens = len(reused) * self.block_size
        self._seqs[seq_id] = SequenceBlocks(
            block_ids=reused + self.pool.allocate(fresh),
            token_ids=list(token_ids[:num_cached_tokens]),
            num_reserved_tokens=len(token_ids), block_hashes=hashes)
        self.prefix_query_tokens += len(token_ids)
        self.prefix_hit_tokens += num_cached_tokens
        return num_cached_tokens

    def reserve(self, seq_id: Hashable, num_new_tokens: int) -> list[tuple[int, int]]:
        """Make room for positions [num_tokens, num_tokens + num_new_tokens).

        Returns (src_block, dst_block) copies the engine must apply to the arena before
        writing: a shared block holding committed tokens is replaced by a private copy.
        Never shrinks an existing reservation. Atomic on NoFreeBlocksError.
        """
        if num_new_tokens < 0:
            raise ValueError(f"cannot reserve {num_new_tokens} tokens")
        seq = self._seq(seq_id)
        in_place, copy_on_write = self._growth_and_cow(seq, num_new_tokens)
        growth = self._growth_blocks(seq, num_new_tokens)
        needed = growth + len(copy_on_write)
        if needed > self.pool.num_available:
            raise NoFreeBlocksError(self.pool.num_available, needed)
        copies = []
        for index in copy_on_write:
            src = seq.block_ids[index]
            (dst,) = self.pool.allocate(1)
            seq.block_ids[index] = dst
            self.pool.decref(src)
            if index * self.block_size < seq.num_tokens:
                copies.append((src, dst))
        for index in in_place:  # private block about to be overwritten: its hash goes stale
            self.pool.forget_hash(seq.block_ids[index])
        seq.block_ids.extend(self.pool.allocate(growth))
        seq.num_reserved_tokens = max(seq.num_reserved_tokens, seq.num_tokens + num_new_tokens)
        return copies

    def commit(self, seq_id: Hashable, token_ids: Sequence[int]) -> None:
        """Mark reserved positions as computed; register every block that became full."""
        seq = self._seq(seq_id)
        if seq.num_tokens + len(token_ids) > seq.num_reserved_tokens:
            raise ValueError(f"sequence {seq_id!r}: commit of {len(token_ids)} tokens exceeds "
                             f"reservation ({seq.num_tokens} committed, "
                             f"{seq.num_reserved_tokens} reserved)")
        seq.token_ids.extend(int(token) for token in token_ids)
        if not self.enable_prefix_cache:
            return
        size = self.block_size
        for index in range(len(seq.block_hashes), seq.num_tokens // size):
            tokens = seq.token_ids[index * size:(index + 1) * size]
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(block_hash(parent, tokens))
            self.pool.register_full_block(seq.block_ids[index], seq.block_hashes[-1], tokens)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """Child shares the parent's committed blocks; COW happens in the next reserve.

        The parent must have no uncommitted reservation (its slots could become shared).
        """
        if child_id in self._seqs:
            raise ValueError(f"sequence {child_id!r} already exists")
        parent = self._seq(parent_id)
        if parent.num_reserved_tokens > parent.num_tokens:
            raise ValueError(f"cannot fork {parent_id!r}: {parent.num_reserved_tokens} tokens "
                             f"reserved, only {parent.num_tokens} committed")
        shared = parent.block_ids[:-(-parent.num_tokens // self.block_size)]
        for block_id in shared:
            self.pool.incref(block_id)
        self._seqs[child_id] = SequenceBlocks(list(shared), list(parent.token_ids),
                                              parent.num_tokens, list(parent.block_hashes))

    # ---- release ------------------------------------------------------------------------
    def free(self, seq_id: Hashable) -> int:
        """Drop the sequence; returns how many blocks went back to the pool (ref hit 0)."""
        seq = self._seq(seq_id)
        del self._seqs[seq_id]
        return self.pool.free(reversed(seq.block_ids))  # tail blocks are evicted first

    def truncate(self, seq_id: Hashable, num_tokens: int) -> int:
        """Keep the first num_tokens committed tokens, drop the rest and any reservation.

        Returns how many blocks went back to the pool.
        """
        seq = self._seq(seq_id)
        if not 0 <= num_tokens <= seq.num_tokens:
            raise ValueError(f"sequence {seq_id!r}: cannot truncate to {num_tokens} tokens "
                             f"(has {seq.num_tokens})")
        keep_blocks = -(-num_tokens // self.block_size)
        dropped = seq.block_ids[keep_blocks:]
        del seq.block_ids[keep_blocks:]
        del seq.token_ids[num_tokens:]
        del seq.block_hashes[num_tokens // self.block_size:]
        seq.num_reserved_tokens = num_tokens
        return self.pool.free(reversed(dropped))

    def pin_sequence(self, seq_id: Hashable) -> list[int]:
        """Pin the sequence's full committed blocks (system prompt); returns their ids."""
        seq = self._seq(seq_id)
        full = seq.block_ids[:seq.num_tokens // self.block_size]
        self.pool.pin(full)
        return full

    def unpin(self, block_ids: Sequence[int]) -> int:
        """Release pins; returns how many blocks went back to the pool."""
        return self.pool.unpin(block_ids)

    # ---- internals ----------------------------------------------------------------------
    def _seq(self, seq_id: Hashable) -> SequenceBlocks:
        seq = self._seqs.get(seq_id)
        if seq is None:
            raise KeyError(f"unknown sequence {seq_id!r}")
        return seq

    def _growth_blocks(self, seq: SequenceBlocks, num_new_tokens: int) -> int:
        end = max(seq.num_reserved_tokens, seq.num_tokens + num_new_tokens)
        return -(-end // self.block_size) - len(seq.block_ids)

    def _growth_and_cow(self, seq: SequenceBlocks, num_new_tokens: int):
        """Existing table indices written by the reservation: (private+hashed, shared)."""
        in_place, copy_on_write = [], []
        if num_new_tokens == 0:
            return in_place, copy_on_write
        first = seq.num_tokens // self.block_size
        last = min(len(seq.block_ids), -(-(seq.num_tokens + num_new_tokens) // self.block_size))
        for index in range(first, last):
            block_id = seq.block_ids[index]
            if self.pool.is_shared(block_id):
                copy_on_write.append(index)
            elif self.pool.is_hashed(block_id):
                in_place.append(index)
        return in_place, copy_on_write

    def _find_cached_prefix(self, token_ids: Sequence[int]) -> tuple[list[int], list[bytes]]:
        """Cached blocks for the leading full blocks, leaving at least one token to compute."""
        reused: list[int] = []
        hashes: list[bytes] = []
        if not self.enable_prefix_cache:
            return reused, hashes
        size = self.block_size
        for index in range((len(token_ids) - 1) // size):
            tokens = token_ids[index * size:(index + 1) * size]
            current = block_hash(hashes[-1] if hashes else None, tokens)
            block_id = self.pool.lookup(current, tokens)
            if block_id is None:
                break
            reused.append(block_id)
            hashes.append(current)
        return reused, hashes

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        holders = [0] * self.pool.num_blocks
        for seq_id, seq in self._seqs.items():
            assert seq.num_tokens <= seq.num_reserved_tokens, f"{seq_id!r} over-committed"
            assert len(seq.block_ids) == -(-seq.num_reserved_tokens // self.block_size), \
                f"{seq_id!r}: {len(seq.block_ids)} blocks for {seq.num_reserved_tokens} tokens"
            assert len(set(seq.block_ids)) == len(seq.block_ids), f"{seq_id!r} repeats a block"
            expected_hashes = seq.num_tokens // self.block_size if self.enable_prefix_cache else 0
            assert len(seq.block_hashes) == expected_hashes, f"{seq_id!r} hash chain length"
            for block_id in seq.block_ids:
                holders[block_id] += 1
        for block_id, count in enumerate(holders):
            expected = count + self.pool.is_pinned(block_id)
            assert self.pool.ref_count(block_id) == expected, (
                f"block {block_id}: ref {self.pool.ref_count(block_id)}, holders {expected}")
