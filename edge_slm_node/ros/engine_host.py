"""The engine thread: builds the Engine on itself, steps it, and releases it.

All model compute stays on this one thread (numba's OpenMP team belongs to the thread that
first calls a parallel kernel), so the Engine is also constructed here: loading the model,
allocating the pool and prefilling the shared prompt. Lifecycle transitions hand it jobs and
wait for their results; between jobs it runs engine.step() and the housekeeping.
"""
from __future__ import annotations

import gc
import os
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Optional

from ..engine.engine import Engine, GuardZoneError
from ..engine.memory import release_free_heap, resident_bytes

TRIM_AFTER_GROWTH_BYTES = 16 * 2**20
HOUSEKEEPING_PERIOD_S = 1.0
EXIT_MEMORY_CORRUPT = 3                  # guard_zones found a kernel writing out of bounds


class EngineHost:
    def __init__(self, logger, housekeeping: Callable[[Engine], None]):
        self.logger = logger
        self.engine: Optional[Engine] = None
        self._housekeeping = housekeeping
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lowest_rss = 0
        self._last_housekeeping = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="edge_slm_engine", daemon=True)
        self.thread.start()

    def run(self, job: Callable[[], object]) -> object:
        """Run job() on the engine thread between steps; -> its result (or raise its exception)."""
        future: Future = Future()
        self._jobs.put((job, future))
        self._wake.set()
        return future.result()

    def build(self, make_engine: Callable[[], Engine]) -> Engine:
        def job():
            engine = make_engine()
            self.engine = engine
            self._lowest_rss = resident_bytes()
            return engine
        return self.run(job)

    def release(self) -> int:
        """Drop the engine (model mapping, weights, KV pool, buffers); -> resident bytes freed."""
        def job():
            before = resident_bytes()
            if self.engine is not None:
                self.engine.close()
            self.engine = None
            gc.collect()
            release_free_heap()
            return before - resident_bytes()
        return self.run(job)

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 1.0) -> None:
        self._stop.set()
        self._wake.set()
        self.thread.join(timeout=timeout)      # at most one step; SIGTERM must stop us within 2 s

    def _run_jobs(self) -> None:
        while True:
            try:
                job, future = self._jobs.get_nowait()
            except queue.Empty:
                return
            try:
                future.set_result(job())
            except BaseException as error:      # handed to the waiting transition
                future.set_exception(error)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._run_jobs()
            if self.engine is None:
                self._wake.wait(0.5)
                self._wake.clear()
            else:
                self._step()

    def _step(self) -> None:
        # a method of its own so that no local keeps a released engine alive
        engine = self.engine
        try:
            worked = engine.step()
        except GuardZoneError as error:          # memory is corrupt: nothing it computes can be trusted
            self.logger.fatal(f"{error}; ending the process (exit {EXIT_MEMORY_CORRUPT})")
            time.sleep(0.5)                      # the step's error chunks reach their clients
            os._exit(EXIT_MEMORY_CORRUPT)
        except Exception as error:               # never let one bad step kill the node
            self.logger.error(f"engine step failed: {type(error).__name__}: {error}")
            worked = False
        if not worked:
            self._wake.wait(0.05)
            self._wake.clear()
        if time.monotonic() - self._last_housekeeping > HOUSEKEEPING_PERIOD_S:
            self._last_housekeeping = time.monotonic()
            try:
                self._housekeeping(engine)
                self._release_memory_after_growth()
            except Exception as error:
                self.logger.error(f"housekeeping failed: {type(error).__name__}: {error}")

    def _release_memory_after_growth(self) -> None:
        """Trim the C heap while the resident size is 16 MiB over its lowest since start (freed
        client messages otherwise stay resident; a trim costs ~0.1 ms)."""
        rss = resident_bytes()
        if rss > self._lowest_rss + TRIM_AFTER_GROWTH_BYTES:
            release_free_heap()
            rss = resident_bytes()
        self._lowest_rss = min(self._lowest_rss, rss)

