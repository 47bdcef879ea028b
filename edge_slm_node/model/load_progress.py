"""How far loading a model has got: each stage (map, repack, tokenizer, buffers, kernels, prefill)
reports (done, total, unit) to a LoadProgress, which logs it as a console user expects."""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional

log = logging.getLogger("edge_slm_node.loading")

LOG_EVERY_S = 1.0          # between a stage's first and last line, at most one line per second


class LoadProgress:
    """Logs each stage when it starts, at most once a second while it runs and when it ends:
    ``loading: repack 45.1 / 98.4 MB (46 %), 1.2 s``. ``current`` is the latest line, ``stage`` the
    stage running (None before the first and after finish()); both may be read from any thread."""

    def __init__(self, logger: logging.Logger = log):
        self.logger = logger
        self.stage: Optional[str] = None
        self.current = ""
        self._lock = threading.Lock()
        self._stage_started = self._last_line = self._load_started = time.monotonic()

    def __call__(self, stage: str, done: float, total: float, unit: str = "") -> None:
        now = time.monotonic()
        with self._lock:
            first = stage != self.stage
            if first:
                self.stage, self._stage_started = stage, now
            ended = done >= total
            self.current = _line(stage, done, total, unit, now - self._stage_started)
            if first or ended or now - self._last_line >= LOG_EVERY_S:
                self._last_line = now
                self.logger.info("loading: %s", self.current)

    def finish(self) -> None:
        with self._lock:
            self.stage = None
            self.current = f"loaded in {time.monotonic() - self._load_started:.1f} s"
            self.logger.info(self.current)


def no_progress(stage: str, done: float, total: float, unit: str = "") -> None:
    """A LoadProgress that says nothing (tests, benchmarks)."""


def _line(stage: str, done: float, total: float, unit: str, seconds: float) -> str:
    if not unit:
        return f"{stage} {'done' if done >= total else '...'}, {seconds:.1f} s"
    figures = f"{done:.1f} / {total:.1f} {unit}" if unit == "MB" else f"{done:.0f} / {total:.0f} {unit}"
    percent = 100.0 * done / total if total else 100.0
    return f"{stage} {figures} ({percent:.0f} %), {seconds:.1f} s"
