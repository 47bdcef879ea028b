"""How a decode-only step runs (split over threads, on one thread, or on the thread pool), from measured times."""
from __future__ import annotations

import enum
import statistics
from collections import deque
from typing import Optional


class DecodeWay(str, enum.Enum):
    SPLIT = "split"              # sequences in parts, one per thread, each part's layers in one kernel call
    ONE_THREAD = "one thread"    # all sequences on the engine thread, layers in one kernel call
    POOL = "thread pool"         # the Python layer loop, big kernels on numba's thread pool


class DecodePolicy:
    """Per number of decoding sequences, the last `window` step times of each way. It first
    measures every way `warmup` times (in turn), then uses the one with the lowest median. An
    exploration re-measures another way (the one explored longest ago) for `warmup` steps in a
    row (a majority of its window, so its median is current) after `explore_every` steps; each
    exploration that leaves the choice unchanged doubles that
    interval up to `max_explore_every` (a way that keeps losing costs almost nothing), and a
    change of choice resets it, so the choice follows the machine's load (split needs every
    core; with another busy process one thread is faster). Medians keep one slow outlier (a
    page fault, a preemption) from deciding. `forced` fixes the way (benchmarks; falls back to
    ONE_THREAD where it cannot apply); steps are recorded either way."""

    def __init__(self, window: int = 5, warmup: int = 3, explore_every: int = 16, max_explore_every: int = 256):
        self.window = window
        self.warmup = warmup
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.forced: Optional[DecodeWay] = None
        self._times: dict = {}           # (sequences, way) -> deque of seconds per step
        self._state: dict = {}           # sequences -> _Choice

    @staticmethod
    def ways(sequences: int, can_split: bool) -> tuple:
        if can_split and sequences >= 2:
            return (DecodeWay.SPLIT, DecodeWay.ONE_THREAD, DecodeWay.POOL)
        return (DecodeWay.ONE_THREAD, DecodeWay.POOL)

    def choose(self, sequences: int, can_split: bool) -> DecodeWay:
        ways = self.ways(sequences, can_split)
        if self.forced is not None:
            return self.forced if self.forced in ways else DecodeWay.ONE_THREAD
        state = self._state.setdefault(sequences, _Choice(self.explore_every))
        state.steps += 1
        if state.steps <= self.warmup * len(ways) or any(self.estimate(sequences, w) is None for w in ways):
            return ways[(state.steps - 1) % len(ways)]
        if state.explore_left:
            state.explore_left -= 1
            return state.exploring
        best = min(ways, key=lambda w: self.estimate(sequences, w))
        if best is not state.best:
            state.best, state.interval = best, self.explore_every
            state.since_explore = 0
        state.since_explore += 1
        if state.since_explore < state.interval:
            return best
        state.since_explore = 0
        state.interval = min(2 * state.interval, self.max_explore_every)
        others = [w for w in ways if w is not best]
        state.exploring = min(others, key=lambda w: state.last_explored.get(w, 0))
        state.last_explored[state.exploring] = state.steps
        state.explore_left = self.warmup - 1
        return state.exploring

    def record(self, sequences: int, way: DecodeWay, seconds: float) -> None:
        self._times.setdefault((sequences, way), deque(maxlen=self.window)).append(seconds)

    def estimate(self, sequences: int, way: DecodeWay) -> Optional[float]:
        """Median of the recent step times of that way (None before any)."""
        times = self._times.get((sequences, way))
        return statistics.median(times) if times else None


class _Choice:
    def __init__(self, interval: int):
        self.steps = 0                    # steps decided for this number of sequences
        self.best: Optional[DecodeWay] = None
        self.interval = interval          # steps between explorations
        self.since_explore = 0
        self.last_explored: dict = {}     # way -> step it was last explored at
        self.exploring: Optional[DecodeWay] = None
        self.explore_left = 0             # further steps of the current exploration
