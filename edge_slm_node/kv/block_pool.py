"""Block pool bookkeeping: ref counts, free list, content hashes, LRU of cached blocks.

Pure counting; KV data lives in an arena elsewhere, indexed by block id.
Every block is in exactly one state:
  free       ref 0, no hash, in the free list
  cached     ref 0, hashed, in the LRU (evictable, contents kept until reused)
  referenced ref > 0 (held by sequences and/or by a pin), may carry a hash
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from typing import Iterable, Optional, Sequence

BLOCK_HASH_BYTES = 16
ROOT_PARENT_HASH = bytes(BLOCK_HASH_BYTES)


class NoFreeBlocksError(RuntimeError):
    """Raised when a request needs more blocks than the pool can supply."""

    def __init__(self, free: int, needed: int):
        super().__init__(f"KV pool has {free} free blocks, request needs {needed}")
        self.free = free
        self.needed = needed


def block_hash(parent_hash: Optional[bytes], token_ids: Sequence[int]) -> bytes:
    """Chained content hash of one full block; stable across processes and platforms."""
    digest = hashlib.blake2b(digest_size=BLOCK_HASH_BYTES)
    digest.update(ROOT_PARENT_HASH if parent_hash is None else parent_hash)
    digest.update(struct.pack(f"<{len(token_ids)}i", *token_ids))
    return digest.digest()


class BlockPool:
    """Fixed set of `num_blocks` KV blocks of `block_size` tokens each."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError(
                f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.evictions = 0
        self._ref_counts = [0] * num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # head = least recently freed
        self._hash_of_block: dict[int, bytes] = {}
        self._tokens_of_block: dict[int, tuple[int, ...]] = {}
        self._block_of_hash: dict[bytes, int] = {}
        self._pinned: set[int] = set()

    # ---- counts -------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_available(self) -> int:
        return len(self._free) + len(self._cached)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_available

    @property
    def num_pinned(self) -> int:
        return len(self._pinned)

    @property
    def num_shared(self) -> int:
        return sum(1 for block_id in range(self.num_blocks) if self.is_shared(block_id))

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def is_pinned(self, block_id: int) -> bool:
        return block_id in self._pinned

    def is_shared(self, block_id: int) -> bool:
        """True when writing into the block would be seen by another holder (or a pin)."""
        return self._ref_counts[block_id] > 1 or block_id in self._pinned

    def is_hashed(self, block_id: int) -> bool:
        return block_id in self._hash_of_block

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._cached

    # ---- allocation and references ------------------------------------------------------
    def allocate(self, num_blocks: int) -> list[int]:
        """Take `num_blocks` blocks (ref 1, no hash): all of them or NoFreeBlocksError."""
        if num_blocks < 0:
            raise ValueError(f"cannot allocate {num_blocks} blocks")
        if num_blocks > self.num_available:
            raise NoFreeBlocksError(self.num_available, num_blocks)
        block_ids = []
        for _ in range(num_blocks):
            if self._free:
                block_id = self._free.popleft()
            else:
                block_id, _ = self._cached.popitem(last=False)
                self._drop_hash(block_id)
                self.evictions += 1
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def incref(self, block_id: int) -> None:
        """Add a holder to a block that is already referenced (sharing on fork)."""
        assert self._ref_counts[block_id] > 0, f"incref of unreferenced block {block_id}"
        self._ref_counts[block_id] += 1

    def decref(self, block_id: int) -> bool:
        """Drop one holder; returns True when the block went back to the pool."""
        assert self._ref_counts[block_id] > 0, f"decref of unreferenced block {block_id}"
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] > 0:
            return False
        if block_id in self._hash_of_block:
            self._cached[block_id] = None
        else:
            self._free.append(block_id)
        return True

    def free(self, block_ids: Iterable[int]) -> int:
        """Decref each block in order; returns how many went back to the pool."""
        return sum(1 for block_id in block_ids if self.decref(block_id))

    def pin(self, block_ids: Iterable[int]) -> None:
        """Hold an extra pool-owned reference so the blocks are never freed nor evicted."""
        for block_id in block_ids:
            if block_id in self._pinned:
                continue
            if block_id in self._cached:
                self.acquire_cached(block_id)
            else:
                self.incref(block_id)
            self._pinned.add(block_id)

    def unpin(self, block_ids: Iterable[int]) -> int:
        """Release pins; returns how many blocks went back to the pool."""
        released = 0
        for block_id in block_ids:
            if block_id in self._pinned:
                self._pinned.remove(block_id)
                released += self.decref(block_id)
        return released

    # ---- prefix cache -------------------------------------------------------------------
    def register_full_block(self, block_id: int, block_hash: bytes,
                            token_ids: Sequence[int]) -> bool:
        """Record a referenced full block's hash and tokens; False if the hash is taken."""
        assert self._ref_counts[block_id] > 0, f"register of unreferenced block {block_id}"
        assert len(token_ids) == self.block_size, (
            f"block {block_id} registered with {len(token_ids)} tokens, "
            f"block_size {self.block_size}")
        existing_hash = self._hash_of_block.get(block_id)
        if existing_hash is not None:
            assert existing_hash == block_hash, f"block {block_id} re-registered with a new hash"
            return True
        if block_hash in self._block_of_hash:
            return False  # same content already cached elsewhere (or a collision): keep first
        self._hash_of_block[block_id] = block_hash
        self._tokens_of_block[block_id] = tuple(token_ids)
        self._block_of_hash[block_hash] = block_id
        return True

    def lookup(self, block_hash: bytes, token_ids: Sequence[int]) -> Optional[int]:
        """Block holding exactly these tokens under this hash, else None."""
        block_id = self._block_of_hash.get(block_hash)
        if block_id is None or self._tokens_of_block[block_id] != tuple(token_ids):
            return None
        return block_id

    def acquire_cached(self, block_id: int) -> None:
        """Take a reference to a hashed block, pulling it out of the LRU if it was free."""
        assert block_id in self._hash_of_block, f"acquire of unhashed block {block_id}"
        if block_id in self._cached:
            del self._cached[block_id]
        self._ref_counts[block_id] += 1

    def forget_hash(self, block_id: int) -> None:
        """Unregister a referenced block's hash before its contents are overwritten."""
        assert self._ref_counts[block_id] > 0, f"forget_hash of unreferenced block {block_id}"
        self._drop_hash(block_id)

    def _drop_hash(self, block_id: int) -> None:
        block_hash = self._hash_of_block.pop(block_id, None)
        if block_hash is not None:
            del self._tokens_of_block[block_id]
            del self._block_of_hash[block_hash]

    # ---- checks -------------------------------------------------------------------------
    def check_invariants(self) -> None:
        free_set = set(self._free)
        assert len(free_set) == len(self._free), "duplicate block in free list"
        assert not free_set & self._cached.keys(), "block both free and cached"
        for block_id, ref_count in enumerate(self._ref_counts):
            assert ref_count >= 0, f"block {block_id} ref count {ref_count}"
            states = (block_id in free_set) + (block_id in self._cached) + (ref_count > 0)
            assert states == 1, f"block {block_id} is in {states} states (ref {ref_count})"
        assert all(block_id not in self._hash_of_block for block_id in free_set), \
            "free-list block carries a hash"
        assert all(block_id in self._hash_of_block for block_id in self._cached), \
            "cached block has no hash"
        assert all(self._ref_counts[block_id] > 0 for block_id in self._pinned), \
            "pinned block unreferenced"
        assert len(self._block_of_hash) == len(self._hash_of_block) == len(self._tokens_of_block)
        for block_hash, block_id in self._block_of_hash.items():
            assert self._hash_of_block[block_id] == block_hash, f"hash index of block {block_id}"
