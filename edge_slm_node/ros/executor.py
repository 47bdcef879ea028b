"""A multi-threaded executor that takes no more callbacks than its threads can start soon.

rclpy's MultiThreadedExecutor takes every ready callback from the middleware, submits it to
its thread pool and keeps a list of all of them, scanned on every spin: under a burst of
thousands of service calls the backlog moves from the middleware's queues into that list and
each spin costs O(backlog) (measured here: half the node's time in Future.done, answers a
minute late). This one waits for a free slot before taking the next callback, so a backlog
stays in the middleware's queues (keep-all for commands, keep-last service_queue_depth
for the services), where it costs nothing until it is served.
Built on the public Executor API (wait_for_ready_callbacks), as in Humble through Kilted.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from rclpy.executors import Executor, ShutdownException, TimeoutException


class BoundedExecutor(Executor):
    def __init__(self, num_threads: int, on_error: Optional[Callable[[BaseException], None]] = None, context=None):
        super().__init__(context=context)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="edge_slm_callbacks")
        self._num_slots = 2 * num_threads                            # started + next in line
        self._slots = threading.BoundedSemaphore(self._num_slots)
        self._on_error = on_error

    def spin_once(self, timeout_sec: Optional[float] = None) -> None:
        if not self._slots.acquire(timeout=-1 if timeout_sec is None else timeout_sec):
            return
        try:
            handler, _, _ = self.wait_for_ready_callbacks(timeout_sec=timeout_sec)
        except (TimeoutException, ShutdownException):
            self._slots.release()
            return
        except BaseException:
            self._slots.release()
            raise
        self._pool.submit(self._run, handler)

    def _run(self, handler) -> None:
        try:
            handler()
            error = handler.exception()
            if error is not None and self._on_error is not None:
                self._on_error(error)
        finally:
            self._slots.release()

    def wait_idle(self, timeout_sec: float) -> bool:
        """Take every slot, so no callback runs or starts until the process ends; -> all were free
        in time. Called before the node's publishers are destroyed: a timer callback still running
        would publish through a destroyed handle."""
        deadline = time.monotonic() + timeout_sec
        for _ in range(self._num_slots):
            if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
        return True

    def shutdown(self, timeout_sec: Optional[float] = None) -> bool:
        done = super().shutdown(timeout_sec)
        self._pool.shutdown(wait=False)
        return done
