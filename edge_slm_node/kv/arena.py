"""The one KV arena: fp16 keys and values for every block, allocated once at start."""
from __future__ import annotations

import numpy as np

BYTES_PER_VALUE = 2   # fp16, stored as uint16 bit patterns
GUARD_WORD = 0x7E5A   # fills the guard rows: an fp16 NaN with a payload no conversion writes


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    """K and V of one token in every layer."""
    return num_layers * 2 * num_kv_heads * head_dim * BYTES_PER_VALUE


class KVArena:
    """data: (layers, 2, num_blocks, block_size, kv_heads, head_dim) uint16; index 0 = K, 1 = V.

    That is the indexing order; in memory each (block, kv_head) tile of block_size x head_dim
    is contiguous (storage order layers, 2, blocks, kv_heads, block_size, head_dim), so the
    attention kernel reads one tile per block and head as one stream. `data` is a strided view
    of that storage: index it, slice it, assign into it; don't reshape it expecting a copy-free view.
    guard_rows > 0 puts that many rows of GUARD_WORD after every tile (a debug aid: a kernel
    writing past a block's end hits them; guard_breaches() finds them).
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int, block_size: int,
                 guard_rows: int = 0):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV arena needs >= 1 block of >= 1 token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token(num_layers, num_kv_heads, head_dim)
        self.bytes_per_block = self.bytes_per_token * block_size
        # np.zeros maps untouched pages lazily; touch them now so the pool's memory is real at
        # start (an OOM shows up at launch, not mid-shift).
        storage = np.zeros((num_layers, 2, num_blocks, num_kv_heads, block_size + guard_rows, head_dim), np.uint16)
        storage.fill(0)
        storage[..., block_size:, :] = GUARD_WORD
        self.storage = storage
        self.data = storage[..., :block_size, :].transpose(0, 1, 2, 4, 3, 5)

    def guard_breaches(self, blocks=None) -> list:
        """(layer, 0 = K / 1 = V, block, kv_head) of every tile (of `blocks`, default all) whose
        guard rows were overwritten."""
        guards = self.storage[..., self.block_size:, :]
        if guards.size == 0:
            return []
        if blocks is not None:
            blocks = np.asarray(sorted(blocks), np.int64)
            guards = guards[:, :, blocks]
        broken = (guards != GUARD_WORD).any(axis=(4, 5))
        found = [tuple(int(i) for i in where) for where in np.argwhere(broken)]
        return found if blocks is None else [(l, kv, int(blocks[b]), h) for l, kv, b, h in found]

    @classmethod
    def from_megabytes(cls, num_layers: int, num_kv_heads: int, head_dim: int, pool_mb: float,
                       block_size: int, guard_rows: int = 0) -> "KVArena":
        per_block = bytes_per_token(num_layers, num_kv_heads, head_dim) * block_size
        num_blocks = int(pool_mb * 1024 * 1024) // per_block
        if num_blocks < 1:
            raise ValueError(f"kv_pool_mb={pool_mb} holds no block of {block_size} tokens ({per_block} bytes per block)")
        return cls(num_layers, num_kv_heads, head_dim, num_blocks, block_size, guard_rows)

    @property
    def num_bytes(self) -> int:
        return self.data.nbytes

    def copy_blocks(self, copies: list) -> None:
        """Apply copy-on-write ops [(src_block, dst_block), ...] across all layers and K/V."""
        for src, dst in copies:
            self.data[:, :, dst] = self.data[:, :, src]
