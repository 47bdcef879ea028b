"""Hold back streamed text that might be the start of a stop string."""
from __future__ import annotations


class StopStringMatcher:
    """feed(text) -> (text safe to emit, stopped); once stopped, the stop string and all after it are dropped."""

    def __init__(self, stops):
        self.stops = tuple(stops)
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self.stops:
            return text, False
        self.pending += text
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            emitted, self.pending = self.pending[:cut], ""
            return emitted, True
        hold = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(stop[:length]):
                    hold = max(hold, length)
                    break
        emitted = self.pending[:len(self.pending) - hold]
        self.pending = self.pending[len(self.pending) - hold:]
        return emitted, False

    def flush(self) -> str:
        rest, self.pending = self.pending, ""
        return rest
