"""KV block bookkeeping: a pool of ref-counted blocks and per-sequence block tables."""

from edge_slm_node.kv.block_manager import KVBlockManager, KVStats, SequenceBlocks
from edge_slm_node.kv.block_pool import BlockPool, NoFreeBlocksError, block_hash

__all__ = ["BlockPool", "KVBlockManager", "KVStats", "NoFreeBlocksError", "SequenceBlocks",
           "block_hash"]
