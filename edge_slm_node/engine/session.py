"""Per-session conversation state (the KV itself is a sequence in the block manager)."""
from __future__ import annotations

import hmac
import time
from dataclasses import dataclass, field
from typing import Iterable, Optional

from .llama_calls import ComputedCalls
from .sampling import InvalidRequestError


class SessionOwnershipError(InvalidRequestError):
    """A call on an owned session without its owner key."""


@dataclass
class Session:
    """What a conversation is; its requests are the scheduler's, its KV the block manager's."""
    session_id: str
    system_prompt: Optional[str]        # None = no system message
    prefix_ids: list                    # tokens every first turn with this system prompt starts with
    uses_shared_prefix: bool            # forks the engine's pinned prefix sequence
    keep_history: bool
    owner_key: str = ""                 # set: every call on the session must carry it
    auto_created: bool = False          # made by a command for an unknown id, not by create_session
    messages: list = field(default_factory=list)
    pending_tool_calls: dict = field(default_factory=dict)   # call_id -> tool name, until its result comes
    last_used: float = field(default_factory=time.monotonic)
    calls: ComputedCalls = field(default_factory=ComputedCalls)   # how its KV was computed (llama_calls.py)

    def touch(self) -> None:
        self.last_used = time.monotonic()

    def authorize(self, owner_key: str) -> None:
        if self.owner_key and not hmac.compare_digest(self.owner_key.encode(), (owner_key or "").encode()):
            what = "no owner_key" if not owner_key else "a wrong owner_key"
            raise SessionOwnershipError(f"session {self.session_id!r} is owned; the call carried {what}")


def eviction_victim(idle: Iterable[Session], for_owned: bool) -> Optional[Session]:
    """Which of the idle sessions to give up when max_sessions is reached, or None.

    Owned sessions are evicted only to make room for another owned session, so a flood of
    anonymous sessions (commands to new ids, create_session without a key) can take only its
    own kind. Cheapest loss first: unowned before owned, never used for a turn before used,
    auto-created before created; least recently used within each."""
    candidates = [s for s in idle if for_owned or not s.owner_key]
    if not candidates:
        return None
    return min(candidates, key=lambda s: (bool(s.owner_key), bool(s.messages), not s.auto_created, s.last_used))


def common_prefix_length(a: list, b: list) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
