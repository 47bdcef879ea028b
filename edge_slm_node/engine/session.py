"""Per-session conversation state (the KV itself is a sequence in the block manager)."""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Session:
    session_id: str
    system_prompt: Optional[str]        # None = no system message
    prefix_ids: list                    # tokens of the rendered system prompt alone
    uses_shared_prefix: bool            # forks the engine's pinned prefix sequence
    keep_history: bool
    messages: list = field(default_factory=list)
    has_kv: bool = False                # a sequence exists in the block manager
    active: Optional[object] = None     # the Request being served
    queued: deque = field(default_factory=deque)
    last_used: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    @property
    def busy(self) -> bool:
        return self.active is not None or bool(self.queued)


def common_prefix_length(a: list, b: list) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
