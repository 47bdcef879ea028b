"""Whether a decode step runs as one batch or split over the side threads, from measured times."""
from __future__ import annotations

from typing import Optional


class SplitPolicy:
    """Per number of decoding sequences, an exponential average of seconds per step for each way;
    the faster way is used and the other retried every `explore_every` steps of that size, so the
    choice follows the machine's load (split needs both cores; with another busy process on them
    one batch on the thread pool is faster). `forced` = True / False fixes the choice (benchmarks)."""

    def __init__(self, explore_every: int = 32, weight: float = 0.2):
        self.explore_every = explore_every
        self.weight = weight
        self.forced: Optional[bool] = None
        self._seconds: dict = {}         # (sequences, split) -> average seconds per step
        self._steps: dict = {}           # sequences -> steps decided

    def choose(self, sequences: int) -> bool:
        if self.forced is not None:
            return self.forced
        step = self._steps.get(sequences, 0)
        self._steps[sequences] = step + 1
        split, batch = self._seconds.get((sequences, True)), self._seconds.get((sequences, False))
        if split is None or batch is None:            # measure each way once
            return split is None
        faster = split <= batch
        return faster != (step % self.explore_every == 0)

    def record(self, sequences: int, split: bool, seconds: float) -> None:
        key = (sequences, split)
        average = self._seconds.get(key)
        self._seconds[key] = seconds if average is None else average + self.weight * (seconds - average)

    def average(self, sequences: int, split: bool) -> Optional[float]:
        return self._seconds.get((sequences, split))
