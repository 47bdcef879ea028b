"""How a decode-only step uses the threads (split over them or on one), from measured step times."""
from __future__ import annotations

import enum
import statistics
from collections import deque
from typing import Optional


class DecodeThreading(str, enum.Enum):
    SPLIT = "split"              # sequences in parts, one per thread, each part's layers in one kernel call
    ONE_THREAD = "one thread"    # all sequences on the engine thread, layers in one kernel call
    POOL = "thread pool"         # all sequences on the engine thread, each big matmul on numba's pool
    TEAM = "team"                # one forward on the engine and side threads together: matmul rows
                                 # split between them, a spin barrier between kernels (kernels/team.py)


class DecodePolicy:
    """Per number of decoding sequences, the last `window` step times of each mode; the mode with
    the lowest median runs. Medians keep one slow outlier (a page fault, a preemption) from
    deciding. A mode is measured in trials of up to `trials` steps in a row (a majority of its
    window, so its median is current), cut short as soon as a step is more than `margin` times
    the best other mode's median: a clearly slower mode costs one step. First every mode runs once,
    then a trial of each that is not clearly slower. After that, every `explore_every` steps a
    trial re-measures another mode (the one tried longest ago); each trial that leaves the choice
    unchanged doubles that interval up to `max_explore_every`, a change of choice resets it. So the
    choice follows the machine's load (split needs every core; with another busy process one
    thread is faster) at little cost once settled. The cap is low (32 steps) because loads come
    and go: on a shared VM the team's steps slowed 1.5-2x for seconds at a time, one thread then
    won, and with a cap of 256 a 128-token answer of the 1.5B ran 64 of its 127 steps on one thread
    (median 68 ms) where the team's steps take 40-45 ms when the host is quiet. `forced` fixes the
    mode, candidate or not (benchmarks; it falls back to ONE_THREAD where it cannot run, see
    _possible); steps are recorded whatever the mode."""

    def __init__(self, window: int = 5, trials: int = 3, margin: float = 1.25, explore_every: int = 16,
                 max_explore_every: int = 32):
        self.window = window
        self.trials = trials
        self.margin = margin
        self.explore_every = explore_every
        self.max_explore_every = max_explore_every
        self.forced: Optional[DecodeThreading] = None
        self._times: dict = {}           # (sequences, mode) -> deque of seconds per step
        self._state: dict = {}           # sequences -> _Choice

    @staticmethod
    def modes(sequences: int, can_split: bool, can_pool: bool = False, can_team: bool = False) -> tuple:
        """The candidates: split for 2+ sequences when there are side threads; a team when there
        are side threads for it; the thread pool when it has 2+ threads; one thread always. Which
        wins depends on the machine and its load (README, "Scheduler"), so every candidate is measured."""
        split = (DecodeThreading.SPLIT,) if can_split and sequences >= 2 else ()
        team = (DecodeThreading.TEAM,) if can_team else ()
        pool = (DecodeThreading.POOL,) if can_pool else ()
        return split + team + pool + (DecodeThreading.ONE_THREAD,)

    def choose(self, sequences: int, can_split: bool, can_pool: bool = False, can_team: bool = False) -> DecodeThreading:
        modes = self.modes(sequences, can_split, can_pool, can_team)
        if self.forced is not None:
            possible = _possible(self.forced, sequences, can_split, can_pool, can_team)
            return self.forced if possible else DecodeThreading.ONE_THREAD
        if len(modes) == 1:
            return modes[0]
        state = self._state.setdefault(sequences, _Choice(self.explore_every))
        state.steps += 1
        unmeasured = [w for w in modes if self._count(sequences, w) == 0]
        if unmeasured:
            return unmeasured[0]
        if state.trial is not None:
            if state.trial_left > 0 and not self._clearly_slower(sequences, state.trial, modes):
                state.trial_left -= 1
                return state.trial
            state.trial = None
        if not state.settled:
            short = [w for w in modes if w not in state.last_trial and not self._clearly_slower(sequences, w, modes)]
            if short:
                return self._start_trial(state, short[0])
            state.settled = True
        best = min(modes, key=lambda w: self.estimate(sequences, w))
        if best is not state.best:
            state.best, state.interval, state.since_explore = best, self.explore_every, 0
        state.since_explore += 1
        if state.since_explore < state.interval:
            return best
        state.since_explore = 0
        state.interval = min(2 * state.interval, self.max_explore_every)
        return self._start_trial(state, min((w for w in modes if w is not best),
                                            key=lambda w: state.last_trial.get(w, 0)))

    def record(self, sequences: int, mode: DecodeThreading, seconds: float) -> None:
        self._times.setdefault((sequences, mode), deque(maxlen=self.window)).append(seconds)

    def estimate(self, sequences: int, mode: DecodeThreading) -> Optional[float]:
        """Median of the recent step times of that mode (None before any)."""
        times = self._times.get((sequences, mode))
        return statistics.median(times) if times else None

    def _start_trial(self, state: "_Choice", mode: DecodeThreading) -> DecodeThreading:
        state.trial, state.trial_left = mode, self.trials - 1
        state.last_trial[mode] = state.steps
        return mode

    def _count(self, sequences: int, mode: DecodeThreading) -> int:
        return len(self._times.get((sequences, mode), ()))

    def _clearly_slower(self, sequences: int, mode: DecodeThreading, modes: tuple) -> bool:
        """Its latest step took more than margin x the best other mode's median."""
        latest = self._times[(sequences, mode)][-1]
        return latest > self.margin * min(self.estimate(sequences, w) for w in modes if w is not mode)


def _possible(mode: DecodeThreading, sequences: int, can_split: bool, can_pool: bool, can_team: bool) -> bool:
    """Whether a forced mode can run: split needs side threads and 2+ sequences, a team side
    threads, the pool 2+ threads."""
    if mode is DecodeThreading.SPLIT:
        return can_split and sequences >= 2
    if mode is DecodeThreading.TEAM:
        return can_team
    return can_pool or mode is DecodeThreading.ONE_THREAD


class _Choice:
    def __init__(self, interval: int):
        self.steps = 0                    # steps decided for this number of sequences
        self.settled = False              # first round and first trials done
        self.trial: Optional[DecodeThreading] = None
        self.trial_left = 0               # further steps of the current trial
        self.best: Optional[DecodeThreading] = None
        self.interval = interval          # steps between trials of other modes
        self.since_explore = 0
        self.last_trial: dict = {}        # mode -> step its last trial started at (tried modes only)
