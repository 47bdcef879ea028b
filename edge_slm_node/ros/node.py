"""The edge_slm_node ROS 2 node: thin callbacks in front of one engine thread.

Callbacks only validate, enqueue and publish; the model is loaded, the shared prompt
prefilled and every forward pass run on the engine thread, so services and status
publishing never wait for the model (at most for one step when they touch a session
that is inside the running forward pass).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import replace
from typing import Optional

import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.clock import Clock, ClockType
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from diagnostic_msgs.msg import DiagnosticArray
from edge_slm_node.msg import Command, PoolStatus, TokenChunk
from edge_slm_node.srv import CancelGeneration, CreateSession, DestroySession, ResetSession

from ..engine.config import ConfigError
from ..engine.engine import Engine, UnknownSessionError
from ..engine.memory import release_free_heap, resident_bytes
from ..engine.memory_lock import MemoryLockError
from ..engine.sampling import InvalidRequestError
from ..model.gguf_file import GGUFError, GGUFFile
from ..model.loader import resolve_model_path
from . import convert
from .executor import BoundedExecutor
from .memory_budget import MemoryBudgetError, check_memory_budget
from .guard import RateLimiter, forward_engine_log, guarded_service, guarded_subscription, guarded_timer, rate_limited
from .process_memory import configure_process_memory
from .params import PARAMETERS, NodeSettings, settings_from_values


TRIM_AFTER_GROWTH_BYTES = 16 * 2**20
# A session call on a sequence inside the running forward pass waits for it (one step) on its
# executor thread: enough threads that such waits overlap instead of queueing every other call.
EXECUTOR_THREADS = 8
STATUS_COALESCE_S = 0.1


class EdgeSlmNode(Node):
    def __init__(self):
        super().__init__("edge_slm_node")
        for name, (default, description) in PARAMETERS.items():
            self.declare_parameter(name, default)
        values = {name: self.get_parameter(name).value for name in PARAMETERS}
        self.settings: NodeSettings = settings_from_values(values)
        self.model_path = resolve_model_path(self.settings.engine.model_path)
        GGUFFile(self.model_path)                  # corrupt / missing model: fail now, before serving
        self.engine: Optional[Engine] = None
        self.state = "loading model"
        self.fatal_error = ""
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._early_commands: deque = deque(maxlen=self.settings.engine.max_queued_requests)
        self._chunk_seq: dict = {}
        self._seq_lock = threading.Lock()

        self._lowest_rss = 0                      # set when ready
        self._in_flight: set = set()              # (session_id, client request_id) not yet finished
        forward_engine_log(self.get_logger())
        self.add_on_set_parameters_callback(self._on_set_parameters)

        group = ReentrantCallbackGroup()
        qos = QoSProfile(depth=self.settings.qos_depth, reliability=ReliabilityPolicy.RELIABLE)
        # commands are never dropped silently: reliable keep-all applies back-pressure to a flooding
        # publisher, and every command is answered (queued, or a final chunk with an error)
        command_qos = QoSProfile(depth=self.settings.qos_depth, history=HistoryPolicy.KEEP_ALL,
                                 reliability=ReliabilityPolicy.RELIABLE)
        self.token_publisher = self.create_publisher(TokenChunk, "tokens", qos)
        self.status_publisher = self.create_publisher(PoolStatus, "pool_status", 10)
        self.diagnostics_publisher = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        log = self.get_logger()
        self._command_callback = guarded_subscription(log, "command", self.on_command, self._publish_error)
        self._publish_status_safely = guarded_timer(log, "status", self.publish_status)
        self.create_subscription(Command, "command", self._command_callback, command_qos, callback_group=group)
        # services keep every request (keep-all) and answer each one, an error when over the rate
        # limit: a keep-last queue would drop a burst's excess without any answer
        service_qos = QoSProfile(depth=self.settings.service_queue_depth, history=HistoryPolicy.KEEP_ALL,
                                 reliability=ReliabilityPolicy.RELIABLE)
        limiter = RateLimiter(self.settings.service_rate_limit_hz)
        for kind, name, handler in [(CreateSession, "create_session", self.on_create_session),
                                    (DestroySession, "destroy_session", self.on_destroy_session),
                                    (ResetSession, "reset_session", self.on_reset_session),
                                    (CancelGeneration, "cancel_generation", self.on_cancel_generation)]:
            self.create_service(kind, name, guarded_service(log, name, rate_limited(limiter, name, handler)),
                                qos_profile=service_qos, callback_group=group)
        # steady clock: use_sim_time and whoever publishes /clock must not stop or drive status
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(1.0 / self.settings.status_rate_hz, self._publish_status_safely, callback_group=group,
                          clock=steady)
        # session changes are published at most 10 times a second, however many calls cause them
        self._status_changed = threading.Event()
        self.create_timer(STATUS_COALESCE_S, guarded_timer(log, "status", self._publish_changed_status),
                          callback_group=group, clock=steady)
        self.engine_thread = threading.Thread(target=self._engine_loop, name="edge_slm_engine", daemon=True)
        self.engine_thread.start()

    # ---- engine thread -----------------------------------------------------------------------
    def _engine_loop(self) -> None:
        started = time.monotonic()
        try:
            engine_config = check_memory_budget(self.settings, self.model_path, self.get_logger())
            engine = Engine(replace(engine_config, model_path=self.model_path))   # a model name resolved once
        except (MemoryBudgetError, MemoryLockError, GGUFError, ConfigError, OSError, ValueError) as error:
            self.fatal_error = str(error)
            self.state = f"failed: {error}"
            self.get_logger().fatal(f"engine failed to start: {error}")
            return
        self.engine = engine
        self.state = "ready"
        stats = engine.stats()
        self.get_logger().info(
            f"ready in {time.monotonic() - started:.1f} s: {self.model_path}, KV pool {stats.total_blocks} blocks x "
            f"{stats.block_size} tokens ({stats.bytes_per_block / 1024:.0f} KiB each), shared prompt "
            f"{len(engine.prefix_ids)} tokens" + (f", {stats.locked_bytes / 2**20:.1f} MiB locked in RAM"
                                                   if stats.locked_bytes else ""))
        self._lowest_rss = resident_bytes()
        while self._early_commands:
            self._command_callback(self._early_commands.popleft())
        self._publish_status_safely()
        last_expiry_check = time.monotonic()
        while not self._stop.is_set():
            try:
                worked = engine.step()
            except Exception as error:           # never let one bad step kill the node
                self.get_logger().error(f"engine step failed: {type(error).__name__}: {error}")
                worked = False
            if not worked:
                self._wake.wait(0.05)
                self._wake.clear()
            if time.monotonic() - last_expiry_check > 1.0:
                last_expiry_check = time.monotonic()
                try:
                    self._expire_idle_sessions()
                    self._release_memory_after_growth()
                except Exception as error:
                    self.get_logger().error(f"housekeeping failed: {type(error).__name__}: {error}")

    def _expire_idle_sessions(self) -> None:
        expired = self.engine.expire_idle_sessions(self.settings.session_idle_timeout_s,
                                                   self.settings.auto_session_idle_timeout_s)
        for session_id, idle_s, freed in expired:
            self.get_logger().info(f"session {session_id!r} expired after {idle_s:.0f} s idle, {freed} blocks freed")
        if expired:
            self._status_changed.set()

    def _release_memory_after_growth(self) -> None:
        """Trim the C heap while the resident size is 16 MiB over its lowest since start (freed
        client messages otherwise stay resident; a trim costs ~0.1 ms)."""
        rss = resident_bytes()
        if rss > self._lowest_rss + TRIM_AFTER_GROWTH_BYTES:
            release_free_heap()
            rss = resident_bytes()
        self._lowest_rss = min(self._lowest_rss, rss)

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        self.engine_thread.join(timeout=1.0)      # at most one step; SIGTERM must stop us within 2 s

    # ---- commands and tokens -----------------------------------------------------------------
    def on_command(self, command: Command) -> None:
        if self.engine is None:
            if self.state.startswith("failed"):
                self._publish_error(command, f"engine unavailable: {self.state}")
            elif len(self._early_commands) == self._early_commands.maxlen:
                self._publish_error(command, "engine still loading and its start-up queue is full")
            else:
                self._early_commands.append(command)
            return
        key = (command.session_id, command.request_id)
        try:
            session_id = convert.check_session_id(command.session_id)
            params = convert.sampling_from_command(command, self.settings.defaults)
            created = session_id not in self.engine.sessions
            if created and not self.settings.auto_create_sessions:
                raise UnknownSessionError(f"unknown session {session_id!r} (auto_create_sessions is false)")
            with self._seq_lock:
                if key in self._in_flight:
                    raise InvalidRequestError(f"request_id {command.request_id} is already pending on session "
                                              f"{session_id!r}; use a new request_id per command")
                self._in_flight.add(key)
            try:
                self.engine.submit(session_id, command.text, params,
                                   on_event=lambda event, k=key: self._on_event(event, k),
                                   create_if_missing=self.settings.auto_create_sessions,
                                   owner_key=command.owner_key)
            except BaseException:
                with self._seq_lock:
                    self._in_flight.discard(key)
                raise
            self._wake.set()
        except (InvalidRequestError, UnknownSessionError) as error:
            self._publish_error(command, str(error))
            return
        if created:
            self._status_changed.set()

    def _publish_error(self, command: Command, error: str) -> None:
        self.get_logger().warning(f"command {command.request_id} for session {command.session_id[:64]!r} "
                                  f"rejected: {error}")
        self.token_publisher.publish(convert.token_chunk(command.session_id, command.request_id, 0, "",
                                                         finish_reason="error", error=error))

    def _on_event(self, event, key: tuple) -> None:
        """Runs on the engine thread: publish one chunk; a failure is logged, never raised."""
        request = event.request
        request_id = key[1]
        try:
            with self._seq_lock:
                seq = self._chunk_seq.get(request.request_id, 0)
                self._chunk_seq[request.request_id] = seq + 1
                if event.finish_reason is not None:
                    del self._chunk_seq[request.request_id]
                    self._in_flight.discard(key)
            reason = event.finish_reason.value if event.finish_reason is not None else ""
            self.token_publisher.publish(convert.token_chunk(request.session_id, request_id, seq, event.text,
                                                             request, finish_reason=reason, error=event.error))
            if event.finish_reason is not None and event.error:
                self.get_logger().warning(f"request {request_id} of {request.session_id!r} ended "
                                          f"{reason}: {event.error}")
        except Exception as error:
            self.get_logger().error(f"publishing a chunk of request {request_id} of {request.session_id!r} "
                                    f"failed: {type(error).__name__}: {error}")
        if event.finish_reason is not None:
            self._status_changed.set()

    # ---- services ----------------------------------------------------------------------------
    def _not_ready(self, response):
        response.success = False
        response.message = f"engine not ready: {self.state}"
        return response

    def on_create_session(self, request, response):
        if self.engine is None:
            return self._not_ready(response)
        try:
            if request.session_id:
                convert.check_session_id(request.session_id)
            session = self.engine.create_session(request.session_id, request.system_prompt or None,
                                                 request.keep_history, owner_key=request.owner_key)
        except InvalidRequestError as error:
            response.success, response.message = False, str(error)
            self.get_logger().warning(f"create_session refused: {error}")
            return response
        response.success, response.session_id = True, session.session_id
        response.prefix_tokens = len(session.prefix_ids)
        response.shared_blocks = len(session.prefix_ids) // self.engine.config.block_size \
            if session.uses_shared_prefix else 0
        response.message = f"session {session.session_id!r} created"
        self._status_changed.set()
        return response

    def _session_call(self, response, action, verb: str):
        if self.engine is None:
            return self._not_ready(response)
        try:
            result = action()
        except (UnknownSessionError, InvalidRequestError) as error:
            response.success, response.message = False, str(error)
            self.get_logger().warning(f"{verb} refused: {error}")
            return response
        response.success = True
        if hasattr(response, "freed_blocks"):
            response.freed_blocks = result
            response.message = f"{verb}: {result} blocks freed"
        else:
            response.message = f"{verb}: {'cancelled' if result else 'nothing was running'}"
        self._status_changed.set()
        return response

    def on_destroy_session(self, request, response):
        return self._session_call(response, lambda: self.engine.destroy_session(request.session_id, request.owner_key),
                                  "destroyed")

    def on_reset_session(self, request, response):
        return self._session_call(response, lambda: self.engine.reset_session(request.session_id, request.owner_key),
                                  "reset")

    def on_cancel_generation(self, request, response):
        return self._session_call(response, lambda: self.engine.cancel(request.session_id, request.owner_key),
                                  "cancel")

    def _on_set_parameters(self, parameters):
        """Every parameter is read once at start: a run-time change is refused with the reason
        (ros2 param get must never report a value the node is not using)."""
        ours = [p.name for p in parameters if p.name in PARAMETERS]
        if ours:
            return SetParametersResult(successful=False, reason=f"{', '.join(ours)}: read at start only; change the "
                                                                f"parameters file and restart the node")
        return SetParametersResult(successful=True)

    # ---- status ------------------------------------------------------------------------------
    def _publish_changed_status(self) -> None:
        if self._status_changed.is_set():
            self._status_changed.clear()
            self.publish_status()

    def publish_status(self) -> None:
        stamp = self.get_clock().now().to_msg()
        rss = resident_bytes()
        stats = self.engine.stats() if self.engine is not None else None
        if stats is not None:
            self.status_publisher.publish(convert.pool_status(stats, stamp, rss))
        self.diagnostics_publisher.publish(convert.diagnostics(stats, stamp, self.get_name(), self.state, rss))


def main(args=None):
    memory_settings = configure_process_memory()      # before the middleware and its threads start
    rclpy.init(args=args)
    node = None
    exit_code = 0

    def stop_on_sigterm(signum, frame):        # Humble's rclpy only handles SIGINT
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        node = EdgeSlmNode()
        if memory_settings:
            node.get_logger().info(f"process memory: {', '.join(memory_settings)}")
        executor = BoundedExecutor(EXECUTOR_THREADS, on_error=lambda error: node.get_logger().error(
            f"callback: {type(error).__name__}: {error}"))
        executor.add_node(node)
        while rclpy.ok() and not node.fatal_error:
            try:
                executor.spin_once(timeout_sec=0.1)
            except (KeyboardInterrupt, ExternalShutdownException):
                raise
            except Exception as error:         # callbacks are guarded; this is the last line of defence
                node.get_logger().error(f"executor: {type(error).__name__}: {error}")
        if node.fatal_error:
            exit_code = 1
    except (ConfigError, GGUFError, FileNotFoundError) as error:
        print(f"edge_slm_node: error: {error}", file=sys.stderr)
        exit_code = 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.shutdown()
            node.destroy_node()
        rclpy.try_shutdown()
    # Everything the OS cannot reclaim is closed; skip interpreter finalisation, which takes ~2 s
    # here (thread pools, numba, tokenizers) and would break the 2 s stop budget on SIGTERM.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    sys.exit(main())
