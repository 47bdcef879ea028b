"""Callbacks that never raise: whatever a client sends, the executor never sees an exception.

rclpy's executors re-raise a callback's exception out of spin, which ends the process and
every session with it. Each wrapper here logs the failure once, with the values involved,
and still answers: a service response with success=false, or a final error chunk.
"""
from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Callable


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def guarded_service(logger, name: str, handler: Callable) -> Callable:
    """handler(request, response) -> response; failures answer success=false and a message."""
    def callback(request, response):
        try:
            return handler(request, response)
        except Exception as error:
            session = str(getattr(request, "session_id", ""))[:64]
            logger.error(f"{name} for session {session!r} failed: {_describe(error)}\n{traceback.format_exc()}")
            response.success = False
            response.message = f"internal error in {name}: {_describe(error)}"
            return response
    return callback


def guarded_subscription(logger, name: str, handler: Callable, on_failure: Callable) -> Callable:
    """handler(message); a failure is logged and on_failure(message, text) answers the client."""
    def callback(message):
        try:
            handler(message)
        except Exception as error:
            logger.error(f"{name} callback failed: {_describe(error)}\n{traceback.format_exc()}")
            try:
                on_failure(message, f"internal error: {_describe(error)}")
            except Exception as answer_error:
                logger.error(f"{name}: could not answer the client either: {_describe(answer_error)}")
    return callback


def guarded_timer(logger, name: str, handler: Callable, context=None) -> Callable:
    """handler(); a failure is logged (once per distinct message) and the timer keeps running. With
    the node's rclpy `context`, a failure once it is shut down is expected and logged at debug only."""
    seen = set()

    def callback():
        try:
            handler()
        except Exception as error:
            text = _describe(error)
            # Ctrl-C: rclpy's signal handler shuts the context down while a callback may be publishing
            if context is not None and not context.ok():
                logger.debug(f"{name} timer stopped by shutdown: {text}")
                return
            if text not in seen and len(seen) < 100:
                seen.add(text)
                logger.error(f"{name} timer failed: {text}\n{traceback.format_exc()}")
    return callback


def guarded_call(logger, name: str, handler: Callable, on_failure: Callable) -> Callable:
    """handler(*args) -> value; a failure is logged and answered by on_failure(*args, text)
    (action callbacks: a rejected goal or cancel, an aborted goal with the reason as result)."""
    def callback(*args):
        try:
            return handler(*args)
        except Exception as error:
            logger.error(f"{name} callback failed: {_describe(error)}\n{traceback.format_exc()}")
            try:
                return on_failure(*args, f"internal error in {name}: {_describe(error)}")
            except Exception as answer_error:
                logger.error(f"{name}: could not answer the client either: {_describe(answer_error)}")
                return None
    return callback


class RateLimiter:
    """Token bucket shared by the session services: `rate_hz` calls per second on average,
    bursts of up to one second's worth. Thread-safe."""

    def __init__(self, rate_hz: float):
        self.rate_hz = rate_hz
        self._tokens = rate_hz
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def set_rate(self, rate_hz: float) -> None:
        with self._lock:
            self.rate_hz = rate_hz
            self._tokens = min(self._tokens, rate_hz)

    def allow(self) -> bool:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.rate_hz, self._tokens + (now - self._last) * self.rate_hz)
            self._last = now
            if self._tokens < 1.0:
                return False
            self._tokens -= 1.0
            return True


def rate_limited(limiter: RateLimiter, name: str, handler: Callable) -> Callable:
    """handler(request, response), answered at once with success=false while over the limit."""
    def callback(request, response):
        if limiter.allow():
            return handler(request, response)
        response.success = False
        response.message = (f"{name} refused: node overloaded (more than {limiter.rate_hz:g} session calls per "
                            f"second, service_rate_limit_hz); retry later")
        return response
    return callback


class _RosLogHandler(logging.Handler):
    def __init__(self, ros_logger):
        super().__init__()
        self.ros_logger = ros_logger

    def emit(self, record):
        try:
            text = record.getMessage()
            if record.levelno >= logging.ERROR:
                self.ros_logger.error(text)
            elif record.levelno >= logging.WARNING:
                self.ros_logger.warning(text)
            else:
                self.ros_logger.info(text)
        except Exception:                   # logging must never raise into the engine
            self.handleError(record)


def forward_engine_log(ros_logger) -> None:
    """Send the engine's Python log records (logger `edge_slm_node`) to the node's ROS logger."""
    engine_logger = logging.getLogger("edge_slm_node")
    engine_logger.setLevel(logging.INFO)
    engine_logger.propagate = False
    engine_logger.handlers = [_RosLogHandler(ros_logger)]
