"""The one KV arena: fp16 keys and values for every block, allocated once at start."""
from __future__ import annotations

import numpy as np

from ..model.config import ModelConfig

BYTES_PER_VALUE = 2   # fp16, stored as uint16 bit patterns


def bytes_per_token(config: ModelConfig) -> int:
    return config.num_layers * 2 * config.num_kv_heads * config.head_dim * BYTES_PER_VALUE


class KVArena:
    """data: (layers, 2, num_blocks, block_size, kv_heads, head_dim) uint16; index 0 = K, 1 = V.

    That is the indexing order; in memory each (block, kv_head) tile of block_size x head_dim
    is contiguous (storage order layers, 2, blocks, kv_heads, block_size, head_dim), so the
    attention kernel reads one tile per block and head as one stream. `data` is a strided view
    of that storage: index it, slice it, assign into it; don't reshape it expecting a copy-free view.
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"KV arena needs >= 1 block of >= 1 token (got {num_blocks} x {block_size})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token(config)
        self.bytes_per_block = self.bytes_per_token * block_size
        # np.zeros maps untouched pages lazily; touch them now so the pool's memory is real at
        # start (an OOM shows up at launch, not mid-shift).
        storage = np.zeros((config.num_layers, 2, num_blocks, config.num_kv_heads, block_size,
                            config.head_dim), np.uint16)
        storage.fill(0)
        self.storage = storage
        self.data = storage.transpose(0, 1, 2, 4, 3, 5)

    @classmethod
    def from_megabytes(cls, config: ModelConfig, pool_mb: float, block_size: int) -> "KVArena":
        num_blocks = int(pool_mb * 1024 * 1024) // (bytes_per_token(config) * block_size)
        if num_blocks < 1:
            raise ValueError(f"kv_pool_mb={pool_mb} holds no block of {block_size} tokens "
                             f"({bytes_per_token(config) * block_size} bytes per block)")
        return cls(config, num_blocks, block_size)

    @property
    def num_bytes(self) -> int:
        return self.data.nbytes

    def copy_blocks(self, copies: list) -> None:
        """Apply copy-on-write ops [(src_block, dst_block), ...] across all layers and K/V."""
        for src, dst in copies:
            self.data[:, :, dst] = self.data[:, :, src]
