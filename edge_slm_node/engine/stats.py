"""Snapshots of pool and session state for status topics and benchmarks."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SessionStats:
    session_id: str
    num_tokens: int
    num_blocks: int
    shared_blocks: int
    state: str                 # idle, queued, prefill, decode
    owned: bool = False
    auto_created: bool = False


@dataclass(frozen=True)
class EngineStats:
    block_size: int
    bytes_per_block: int
    bytes_per_token: int
    total_blocks: int
    free_blocks: int           # never used or evicted
    cached_blocks: int         # unreferenced, keep contents + hash (evictable)
    used_blocks: int           # referenced by a sequence or pinned
    pinned_blocks: int
    shared_blocks: int         # referenced more than once or pinned
    prefix_query_tokens: int
    prefix_hit_tokens: int
    evictions: int
    preemptions: int
    queue_length: int
    running: int
    weights_bytes: int
    arena_bytes: int
    locked_bytes: int = 0       # mlocked by lock_memory (weights, KV arena, buffers)
    sessions_evicted: int = 0   # idle sessions given up to make room at max_sessions
    sessions: list = field(default_factory=list)

    @property
    def usage_ratio(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def kv_bytes_in_use(self) -> int:
        return self.used_blocks * self.bytes_per_block
