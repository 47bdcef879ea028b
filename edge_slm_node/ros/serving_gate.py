"""Who may use the engine right now: callbacks enter, lifecycle transitions close the gate.

A callback takes the engine (or the reason it may not) in one step and holds it for the few
calls it makes; closing waits until every callback inside has left, so a transition that
closes the gate and then cancels every request sees all requests submitted before it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional, Tuple


class ServingGate:
    def __init__(self, refusal: str):
        self._cond = threading.Condition()
        self._users = 0
        self._engine = None
        self._refusal = refusal

    @property
    def refusal(self) -> str:
        return self._refusal

    def open(self, engine) -> None:
        with self._cond:
            self._engine, self._refusal = engine, ""

    def close(self, refusal: str, timeout_s: float = 30.0) -> bool:
        """Refuse new entries with `refusal`; -> whether every user left within the timeout."""
        with self._cond:
            self._engine, self._refusal = None, refusal
            return self._cond.wait_for(lambda: self._users == 0, timeout_s)

    def set_refusal(self, refusal: str) -> None:
        """While closed: the reason given to callers (the lifecycle state)."""
        with self._cond:
            if self._engine is None:
                self._refusal = refusal

    @contextlib.contextmanager
    def enter(self) -> Iterator[Tuple[Optional[object], str]]:
        """-> (engine, "") while open, else (None, why not)."""
        with self._cond:
            engine, refusal = self._engine, self._refusal
            if engine is not None:
                self._users += 1
        try:
            yield engine, refusal
        finally:
            if engine is not None:
                with self._cond:
                    self._users -= 1
                    if self._users == 0:
                        self._cond.notify_all()
