"""Whether a decode step runs as one batch or split over the side threads, from measured times."""
from __future__ import annotations

import statistics
from collections import deque
from typing import Optional


class SplitPolicy:
    """Per number of decoding sequences, the last `window` step times of each way; after measuring
    each way `warmup` times (alternating) it uses the one with the lower median and retries the
    other every `explore_every` steps, so the choice follows the machine's load (split needs both
    cores; with another busy process on them one batch on the thread pool is faster). Medians keep
    one slow outlier (a page fault, a preemption) from deciding. `forced` = True / False fixes the
    choice (benchmarks); steps are recorded either way."""

    def __init__(self, window: int = 5, warmup: int = 3, explore_every: int = 16):
        self.window = window
        self.warmup = warmup
        self.explore_every = explore_every
        self.forced: Optional[bool] = None
        self._times: dict = {}           # (sequences, split) -> deque of seconds per step
        self._steps: dict = {}           # sequences -> steps decided

    def choose(self, sequences: int) -> bool:
        if self.forced is not None:
            return self.forced
        step = self._steps.get(sequences, 0)
        self._steps[sequences] = step + 1
        split, batch = self.estimate(sequences, True), self.estimate(sequences, False)
        if step < 2 * self.warmup or split is None or batch is None:
            return step % 2 == 0
        faster = split <= batch
        return faster != (step % self.explore_every == 0)

    def record(self, sequences: int, split: bool, seconds: float) -> None:
        self._times.setdefault((sequences, split), deque(maxlen=self.window)).append(seconds)

    def estimate(self, sequences: int, split: bool) -> Optional[float]:
        """Median of the recent step times of that way (None before any)."""
        times = self._times.get((sequences, split))
        return statistics.median(times) if times else None
