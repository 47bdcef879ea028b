"""How a decode-only step runs (split over threads or on one thread), from measured step times."""
from __future__ import annotations

import enum
import statistics
from collections import deque
from typing import Optional


class DecodeWay(str, enum.Enum):
    SPLIT = "split"              # sequences in parts, one per thread, each part's layers in one kernel call
    ONE_THREAD = "one thread"    # all sequences on the engine thread, layers in one kernel call


class DecodePolicy:
    """Per number of decoding sequences, the last `window` step times of each way; the way with
    the lowest median runs. Medians keep one slow outlier (a page fault, a preemption) from
    deciding. A way is measured in trials of up to `trials` steps in a row (a majority of its
    window, so its median is current), cut short as soon as a step is more than `margin` times
    the best other way's median: a clearly slower way costs one step. First every way runs once,
    then a trial of each that is not clearly slower. After that, every `explore_every` steps a
    trial re-measures another way (the one tried longest ago); each trial that leaves the choice
    unchanged doubles that interval up to `max_explore_every`, a change of choice resets it. So the
    choice follows the machine's load (split needs every core; with another busy process one
    thread is faster) at little cost once settled. `forced` fixes the way, candidate or not (benchmarks;
    SPLIT falls back to ONE_THREAD where it cannot split); steps are recorded either way."""

    def __init__(self, window: int = 5, trials: int = 3, margin: float = 1.25, explore_every: int = 16,
                 max_explore_every: int = 256):
        self.window = window
        self.trials = trials
        self.margin = margin
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.forced: Optional[DecodeWay] = None
        self._times: dict = {}           # (sequences, way) -> deque of seconds per step
        self._state: dict = {}           # sequences -> _Choice

    @staticmethod
    def ways(sequences: int, can_split: bool) -> tuple:
        """The candidates: split for 2+ sequences when there are side threads; one thread always.
        (The thread pool, a wake-up per kernel, never won a decode step here: README, "Threads".)"""
        if can_split and sequences >= 2:
            return (DecodeWay.SPLIT, DecodeWay.ONE_THREAD)
        return (DecodeWay.ONE_THREAD,)

    def choose(self, sequences: int, can_split: bool) -> DecodeWay:
        ways = self.ways(sequences, can_split)
        if self.forced is not None:
            return self.forced if self.forced is not DecodeWay.SPLIT or ways[0] is DecodeWay.SPLIT \
                else DecodeWay.ONE_THREAD
        if len(ways) == 1:
            return ways[0]
        state = self._state.setdefault(sequences, _Choice(self.explore_every))
        state.steps += 1
        unmeasured = [w for w in ways if self._count(sequences, w) == 0]
        if unmeasured:
            return unmeasured[0]
        if state.trial is not None:
            if state.trial_left > 0 and not self._clearly_slower(sequences, state.trial, ways):
                state.trial_left -= 1
                return state.trial
            state.trial = None
        if not state.settled:
            short = [w for w in ways if w not in state.last_trial and not self._clearly_slower(sequences, w, ways)]
            if short:
                return self._start_trial(state, short[0])
            state.settled = True
        best = min(ways, key=lambda w: self.estimate(sequences, w))
        if best is not state.best:
            state.best, state.interval, state.since_explore = best, self.explore_every, 0
        state.since_explore += 1
        if state.since_explore < state.interval:
            return best
        state.since_explore = 0
        state.interval = min(2 * state.interval, self.max_explore_every)
        return self._start_trial(state, min((w for w in ways if w is not best),
                                            key=lambda w: state.last_trial.get(w, 0)))

    def record(self, sequences: int, way: DecodeWay, seconds: float) -> None:
        self._times.setdefault((sequences, way), deque(maxlen=self.window)).append(seconds)

    def estimate(self, sequences: int, way: DecodeWay) -> Optional[float]:
        """Median of the recent step times of that way (None before any)."""
        times = self._times.get((sequences, way))
        return statistics.median(times) if times else None

    def _start_trial(self, state: "_Choice", way: DecodeWay) -> DecodeWay:
        state.trial, state.trial_left = way, self.trials - 1
        state.last_trial[way] = state.steps
        return way

    def _count(self, sequences: int, way: DecodeWay) -> int:
        return len(self._times.get((sequences, way), ()))

    def _clearly_slower(self, sequences: int, way: DecodeWay, ways: tuple) -> bool:
        """Its latest step took more than margin x the best other way's median."""
        latest = self._times[(sequences, way)][-1]
        return latest > self.margin * min(self.estimate(sequences, w) for w in ways if w is not way)


class _Choice:
    def __init__(self, interval: int):
        self.steps = 0                    # steps decided for this number of sequences
        self.settled = False              # first round and first trials done
        self.trial: Optional[DecodeWay] = None
        self.trial_left = 0               # further steps of the current trial
        self.best: Optional[DecodeWay] = None
        self.interval = interval          # steps between trials of other ways
        self.since_explore = 0
        self.last_trial: dict = {}        # way -> step its last trial started at (tried ways only)
