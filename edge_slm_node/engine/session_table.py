"""The sessions by id: creation checks, eviction choice at max_sessions, idle expiry (no KV here)."""
from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Callable, Optional

from .config import EngineConfig
from .sampling import InvalidRequestError
from .session import Session, eviction_victim

MAX_OWNER_KEY_CHARS = 256


class UnknownSessionError(KeyError):
    def __str__(self):
        return self.args[0]


class SessionTable(Mapping):
    """A read-only mapping session_id -> Session for callers; the engine changes it."""

    def __init__(self, config: EngineConfig, max_context: int, prompts, shared_prefix_ids: list):
        self.config = config
        self.max_context = max_context
        self.prompts = prompts                  # PromptBuilder: renders custom system prompts
        self.shared_prefix_ids = shared_prefix_ids
        self.by_id: dict[str, Session] = {}
        self.evicted = 0                        # sessions given up at max_sessions

    def __getitem__(self, session_id: str) -> Session:
        return self.by_id[session_id]

    def __iter__(self):
        return iter(self.by_id)

    def __len__(self) -> int:
        return len(self.by_id)

    def lookup(self, session_id: str) -> Session:
        session = self.by_id.get(session_id)
        if session is None:
            raise UnknownSessionError(f"unknown session {session_id!r}")
        return session

    def prepare(self, session_id: str, system_prompt: Optional[str], keep_history: bool, owner_key: str,
                auto_created: bool, is_idle: Callable[[Session], bool]) -> tuple[Session, Optional[Session]]:
        """-> (the new session, not yet added; the session to evict first or None). Raises
        InvalidRequestError, changing nothing. system_prompt None = the shared one, "" = none."""
        session_id = session_id or uuid.uuid4().hex[:12]
        if session_id in self.by_id:
            raise InvalidRequestError(f"session {session_id!r} already exists")
        if system_prompt is not None and len(system_prompt) > self.config.max_input_chars:
            raise InvalidRequestError(f"system prompt has {len(system_prompt)} characters, "
                                      f"limit max_input_chars={self.config.max_input_chars}")
        if len(owner_key) > MAX_OWNER_KEY_CHARS:
            raise InvalidRequestError(f"owner_key has {len(owner_key)} characters, at most {MAX_OWNER_KEY_CHARS}")
        if system_prompt is None:
            system_prompt = self.config.system_prompt or None
        elif system_prompt == "":
            system_prompt = None
        shared = system_prompt is not None and system_prompt == self.config.system_prompt
        prefix = self.shared_prefix_ids if shared else (self.prompts.prefix(system_prompt) if system_prompt else [])
        if len(prefix) >= self.max_context:
            raise InvalidRequestError(f"system prompt is {len(prefix)} tokens, context limit {self.max_context}")
        victim = None
        if len(self.by_id) >= self.config.max_sessions:
            owned = bool(owner_key)
            victim = eviction_victim([s for s in self.by_id.values() if is_idle(s)], for_owned=owned)
            if victim is None:
                which = "session is busy" if owned else "session without an owner_key is busy (owned ones are kept)"
                raise InvalidRequestError(f"max_sessions={self.config.max_sessions} reached and every {which}")
        return Session(session_id, system_prompt, prefix, shared, keep_history, owner_key, auto_created), victim

    def add(self, session: Session) -> Session:
        self.by_id[session.session_id] = session
        return session

    def remove(self, session_id: str) -> None:
        del self.by_id[session_id]

    def expired(self, idle_timeout_s: float, auto_idle_timeout_s: float,
                is_idle: Callable[[Session], bool]) -> list:
        """[(session, seconds idle)] past their timeout (0 = never), nothing queued or running."""
        now = time.monotonic()
        found = []
        for session in self.by_id.values():
            timeout = auto_idle_timeout_s if session.auto_created else idle_timeout_s
            if timeout > 0 and now - session.last_used > timeout and is_idle(session):
                found.append((session, now - session.last_used))
        return found
