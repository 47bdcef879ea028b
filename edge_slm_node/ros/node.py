"""The edge_slm_node managed (lifecycle) node: thin callbacks in front of one engine thread.

configure = validate parameters, check the memory budget, map the model, allocate the KV pool,
prefill the shared prompt (on the engine thread; the transition waits for it, other callbacks
keep answering); activate = serve commands, goals and session calls; deactivate = end every
running request with a final chunk; cleanup = release model and pool; shutdown from any state.
With `autostart` (default) the node configures and activates itself at start.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.executors import ExternalShutdownException
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from edge_slm_node.msg import Command, TokenChunk, ToolCall

from ..engine.config import ConfigError
from ..engine.engine import Engine
from ..engine.memory import resident_bytes
from ..model.gguf_file import GGUFError, GGUFFile
from ..model.load_progress import LoadProgress
from ..model.loader import resolve_model_path
from .commands import CommandStreams, cancel_everything
from .executor import BoundedExecutor
from .generate_action import GenerateServer
from .memory_budget import check_memory_budget
from .guard import forward_engine_log, guarded_subscription, guarded_timer
from .params import PARAMETERS, descriptor, runtime_from_values, settings_from_values
from .process_memory import configure_process_memory
from .engine_host import EngineHost
from .runtime_parameters import RuntimeParameters
from .serving_gate import ServingGate
from .services import create_session_services
from .status import StatusPublisher

# A session call on a sequence inside the running forward pass waits for it (one step) on its
# executor thread: enough threads that such waits overlap instead of queueing every other call.
# Each executing generate goal holds one more.
EXECUTOR_THREADS = 8
# at exit, how long running callbacks (a status timer, a session call) get to finish before the
# node's handles are destroyed under them
CALLBACK_DRAIN_S = 1.0
SUCCESS, FAILURE = TransitionCallbackReturn.SUCCESS, TransitionCallbackReturn.FAILURE
# exit codes when autostart fails: a parameter or model file is wrong / anything else
EXIT_BAD_CONFIG, EXIT_FAILED = 2, 1


class EdgeSlmNode(LifecycleNode):
    def __init__(self):
        super().__init__("edge_slm_node")
        for name, spec in PARAMETERS.items():
            self.declare_parameter(name, spec.default, descriptor(name, spec))
        values = self.parameter_values()
        self.autostart = bool(values["autostart"])
        self.max_goals = int(values["max_goals"])
        self.lifecycle_state = "unconfigured"
        self.failure = ""                         # why the last transition failed
        self.exit_code = None                     # set: main() ends the process with it
        self._autostarting = False
        self.model_path = ""
        self.loading = LoadProgress()             # the configure running now: its loading stage
        self.settings = None
        try:
            self.runtime = runtime_from_values(values)
        except ConfigError:                       # configure will refuse with the reason
            self.runtime = runtime_from_values({name: spec.default for name, spec in PARAMETERS.items()})
        log = self.get_logger()
        forward_engine_log(log)
        self.host = EngineHost(log, self._housekeeping)
        self.gate = ServingGate(self._refusal("unconfigured"))
        group = ReentrantCallbackGroup()
        depth = int(values["qos_depth"])
        self.token_publisher = self.create_publisher(TokenChunk, "tokens", QoSProfile(
            depth=depth, reliability=ReliabilityPolicy.RELIABLE))
        self.tool_call_publisher = self.create_publisher(ToolCall, "tool_calls", QoSProfile(
            depth=depth, reliability=ReliabilityPolicy.RELIABLE))
        self.commands = CommandStreams(self, self.gate, self.token_publisher, int(values["max_queued_requests"]),
                                       self.tool_call_publisher)
        self.command_callback = guarded_subscription(log, "command", self.commands.on_command,
                                                     self.commands.publish_error)
        # commands are never dropped silently: reliable keep-all applies back-pressure to a flooding
        # publisher, and every command is answered (queued, or a final chunk with an error)
        self.create_subscription(Command, "command", self.command_callback, QoSProfile(
            depth=depth, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE),
            callback_group=group)
        self.limiter = create_session_services(self, self.gate, group, int(values["service_queue_depth"]),
                                               self.runtime.service_rate_limit_hz)
        self.generate = GenerateServer(self, self.gate, self.commands, group, self.max_goals)
        self.status = StatusPublisher(self, self.host, group, str(values["hardware_id"]))
        self.parameters = RuntimeParameters(self)
        self.add_on_set_parameters_callback(self.parameters.on_set_parameters)
        if self.autostart:
            self.commands.hold_early = True
            self._enter("configuring", "configuring (autostart)")
            # in the default callback group, like the lifecycle services: transitions never overlap
            self._autostart_timer = self.create_timer(0.0, guarded_timer(log, "autostart", self._autostart))

    def parameter_values(self) -> dict:
        return {name: self.get_parameter(name).value for name in PARAMETERS}

    # ---- helpers for the components ------------------------------------------------------------
    def status_changed(self) -> None:
        self.status.changed()

    def wake_engine(self) -> None:
        self.host.wake()

    def _refusal(self, state: str) -> str:
        name = self.get_fully_qualified_name()
        if state == "inactive":
            return f"node is inactive (lifecycle state): activate it with `ros2 lifecycle set {name} activate`"
        if state == "unconfigured":
            why = f" (configure failed: {self.failure})" if self.failure else ""
            return f"node is unconfigured (lifecycle state){why}: configure and activate it first"
        return f"node is {state} (lifecycle state): not serving"

    def _enter(self, state: str, refusal_state: str = "") -> None:
        self.lifecycle_state = state
        self.gate.set_refusal(self._refusal(refusal_state or state))
        self.status_changed()

    def _housekeeping(self, engine: Engine) -> None:
        runtime = self.runtime
        expired = engine.expire_idle_sessions(runtime.session_idle_timeout_s, runtime.auto_session_idle_timeout_s)
        for session_id, idle_s, freed in expired:
            self.get_logger().info(f"session {session_id!r} expired after {idle_s:.0f} s idle, {freed} blocks freed")
        if expired:
            self.status_changed()

    def _measured(self, transition: str, started: float, rss_before: int, detail: str = "") -> None:
        rss = resident_bytes()
        self.get_logger().info(f"{transition}: {time.monotonic() - started:.2f} s, RSS {rss_before / 2**20:.0f} -> "
                               f"{rss / 2**20:.0f} MiB ({(rss - rss_before) / 2**20:+.0f} MiB)"
                               + (f"; {detail}" if detail else ""))

    def _cancel_all(self, why: str) -> int:
        engine = self.host.engine
        if engine is None:
            return 0
        self.commands.cancel_reason = why
        try:
            return cancel_everything(engine, self.get_logger())
        finally:
            self.commands.cancel_reason = ""

    # ---- lifecycle transitions -----------------------------------------------------------------
    def _autostart(self) -> None:
        self.destroy_timer(self._autostart_timer)
        self._autostarting = True
        try:
            configured = self.trigger_configure()
        finally:
            self._autostarting = False
        if configured != SUCCESS:
            self.commands.refuse_early(self._refusal("unconfigured"))
            self.exit_code = self.exit_code or EXIT_FAILED
            return
        if self.trigger_activate() != SUCCESS:
            self.exit_code = EXIT_FAILED

    def on_configure(self, state) -> TransitionCallbackReturn:
        started, rss_before = time.monotonic(), resident_bytes()
        self._enter("configuring")
        log = self.get_logger()
        try:
            settings = settings_from_values(self.parameter_values())
            model_path = resolve_model_path(settings.engine.model_path)
            GGUFFile(model_path)                  # a corrupt or missing file: say so before budgeting memory
            self.model_path = model_path
            self.loading = LoadProgress()
            engine = self.host.build(lambda: Engine(check_memory_budget(settings, model_path, log),
                                                    progress=self.loading))
        except Exception as error:                # every failure leaves the node unconfigured, with the reason
            self.failure = str(error) or type(error).__name__
            bad_config = isinstance(error, (ConfigError, GGUFError, FileNotFoundError))
            if self._autostarting:
                self.exit_code = EXIT_BAD_CONFIG if bad_config else EXIT_FAILED
            log.error(f"configure failed: {self.failure}")
            self._enter("unconfigured")
            return FAILURE
        self.settings, self.failure = settings, ""
        self.parameters.apply(settings.runtime)
        stats = engine.stats()
        self._measured("configure", started, rss_before,
                       f"{model_path}, KV pool {stats.total_blocks} blocks x {stats.block_size} tokens "
                       f"({stats.bytes_per_block / 1024:.0f} KiB each), shared prompt {len(engine.prefix_ids)} tokens"
                       + (f", {stats.locked_bytes / 2**20:.1f} MiB locked in RAM" if stats.locked_bytes else ""))
        self._enter("inactive")
        return SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        started, rss_before = time.monotonic(), resident_bytes()
        self.gate.open(self.host.engine)
        self._enter("active")
        self.commands.replay_early()
        self._measured("activate", started, rss_before)
        return SUCCESS

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        started, rss_before = time.monotonic(), resident_bytes()
        self.lifecycle_state = "deactivating"
        self.gate.close(self._refusal("inactive"))
        cancelled = self._cancel_all("node deactivated (lifecycle): its running and queued requests are cancelled")
        self._enter("inactive")
        self._measured("deactivate", started, rss_before, f"{cancelled} sessions' requests cancelled")
        return SUCCESS

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        started, rss_before = time.monotonic(), resident_bytes()
        self._enter("cleaningup")
        self._cancel_all("node cleaned up (lifecycle)")
        freed = self.host.release()
        self.status.publish_no_pool()
        self._enter("unconfigured")
        self._measured("cleanup", started, rss_before, f"model and KV pool released ({freed / 2**20:.0f} MiB)")
        return SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        started, rss_before = time.monotonic(), resident_bytes()
        self.gate.close(self._refusal("shuttingdown"))
        self._enter("shuttingdown")
        self._cancel_all("node shutting down (lifecycle)")
        if self.host.engine is not None:
            self.host.release()
            self.status.publish_no_pool()
        self._enter("finalized")
        self._measured("shutdown", started, rss_before)
        self.exit_code = 0 if self.exit_code is None else self.exit_code
        return SUCCESS

    def on_error(self, state) -> TransitionCallbackReturn:
        self.get_logger().error(f"a transition from {state.label} raised; releasing the engine")
        self.gate.close(self._refusal("unconfigured"))
        self._cancel_all("node error (lifecycle)")
        if self.host.engine is not None:
            self.host.release()
        self._enter("unconfigured")
        return SUCCESS

    def stop(self) -> None:
        self.host.stop()


def main(args=None):
    memory_settings = configure_process_memory()      # before the middleware and its threads start
    rclpy.init(args=args)
    node = None
    executor = None
    exit_code = 0

    def stop_on_sigterm(signum, frame):        # Humble's rclpy only handles SIGINT
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        node = EdgeSlmNode()
        if memory_settings:
            node.get_logger().info(f"process memory: {', '.join(memory_settings)}")
        executor = BoundedExecutor(EXECUTOR_THREADS + node.max_goals, on_error=lambda error: node.get_logger().error(
            f"callback: {type(error).__name__}: {error}"))
        executor.add_node(node)
        while rclpy.ok() and node.exit_code is None:
            try:
                executor.spin_once(timeout_sec=0.1)
            except (KeyboardInterrupt, ExternalShutdownException):
                raise
            except Exception as error:         # callbacks are guarded; this is the last line of defence
                node.get_logger().error(f"executor: {type(error).__name__}: {error}")
        exit_code = node.exit_code or 0
        if exit_code:
            print(f"edge_slm_node: error: {node.failure or 'start-up failed'}", file=sys.stderr)
    except (InvalidParameterValueException, InvalidParameterTypeException, ConfigError) as error:
        print(f"edge_slm_node: error: {error}", file=sys.stderr)
        exit_code = EXIT_BAD_CONFIG
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        # `ros2 launch` forwards the SIGINT that Ctrl-C already sent the whole process group: a
        # second signal must not interrupt the clean-up
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if executor is not None and not executor.wait_idle(CALLBACK_DRAIN_S):
            node.get_logger().warning(f"callbacks still running after {CALLBACK_DRAIN_S:.0f} s; destroying the node anyway")
        if node is not None:
            node.stop()
            node.destroy_node()
        rclpy.try_shutdown()
    # Everything the OS cannot reclaim is closed; skip interpreter finalisation, which takes ~2 s
    # here (thread pools, numba, tokenizers) and would break the 2 s stop budget on SIGTERM.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    sys.exit(main())
