"""Start edge_slm_node in its own process and talk to it with real rclpy clients."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from in_process_node import create_udp_client

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600.0         # model load + numba compile on a cold cache
REPLY_TIMEOUT_S = 30.0
LONG_ANSWER = "Count from 1 to 200, one number per line."


def counting_grammar(last: int) -> str:
    """A Lark grammar that allows one answer only, "1\\n2\\n...last\\n" (about 4 tokens a number):
    any model decodes it to its end or max_new_tokens, where tests must act while a request decodes
    (Qwen2.5-Coder answers LONG_ANSWER in 50 tokens, or with a 3-line loop)."""
    return 'start: "' + "".join(f"{n}\\n" for n in range(1, last + 1)) + '"'


def write_params(directory: Path, **overrides) -> Path:
    values = {"kv_pool_mb": 8.0, "max_context_tokens": 256, "max_new_tokens": 8, "status_rate_hz": 5.0,
              "session_idle_timeout_s": 0.0, "max_input_chars": 4000}
    if os.environ.get("EDGE_SLM_TEST_MODEL"):      # the suite against another model (see test/engine/conftest.py)
        values["model_path"] = os.environ["EDGE_SLM_TEST_MODEL"]
    values.update(overrides)
    lines = ["/**:", "  ros__parameters:"]
    for key, value in values.items():
        lines.append(f"    {key}: {value!r}" if not isinstance(value, bool) else f"    {key}: {str(value).lower()}")
    path = directory / "params.yaml"
    path.write_text("\n".join(lines).replace("'", '"') + "\n")
    return path


class NodeProcess:
    def __init__(self, params_file: Path, env: dict):
        self.env = env
        self.output = tempfile.TemporaryFile(mode="w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edge_slm_node.ros.node", "--ros-args", "--params-file", str(params_file)],
            env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=self.output, stderr=subprocess.STDOUT)

    def log(self) -> str:
        self.output.flush()
        self.output.seek(0)
        return self.output.read()

    def stop(self, sig=signal.SIGINT, timeout=10.0) -> float:
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return time.monotonic() - started


def grown_mappings(before: dict, after: dict, top: int = 8) -> str:
    """The mappings whose resident size grew most between two resident_by_mapping() readings."""
    grown = sorted(((after.get(k, 0) - before.get(k, 0), k) for k in set(before) | set(after)), reverse=True)
    return ", ".join(f"{name} {kib / 1024:+.1f} MiB" for kib, name in grown[:top] if kib)


class PersistentCall:
    """One session-service call, re-sent every retry_after_s until a copy is answered: a neighbour's
    flood of the same service can lose a request or its reply in Fast DDS (README, Services), and
    only the caller can notice. The first answer wins. A copy that is answered "already exists"
    (create) or "unknown session" (destroy) after an earlier copy went unanswered means, for a
    caller whose session ids are its own, that the earlier copy was applied."""

    REAPPLIED = {"create_session": "already exists", "destroy_session": "unknown session"}

    def __init__(self, client: "RosClient", name: str, retry_after_s: float, **fields):
        self.client, self.name, self.retry_after_s = client, name, retry_after_s
        self.request = client.types[name].Request(**fields)
        self.first_sent = time.monotonic()
        self.futures = []
        self._send()

    def _send(self) -> None:
        self.futures.append(self.client.services[self.name].call_async(self.request))
        self.last_sent = time.monotonic()

    @property
    def resent(self) -> int:
        return len(self.futures) - 1

    def answered_copy(self):
        """The index of the first copy found answered, None while none is."""
        return next((i for i, f in enumerate(self.futures) if f.done()), None)

    def answer(self):
        """That copy's answer, None while none is answered (also re-sends when due)."""
        answered = self.answered_copy()
        if answered is not None:
            return self.futures[answered].result()
        if time.monotonic() - self.last_sent >= self.retry_after_s:
            self._send()
        return None

    def applied(self, answer) -> bool:
        """Did the node do what was asked (by this copy or an earlier one)?"""
        return answer.success or (self.resent > 0 and self.REAPPLIED.get(self.name, "\0") in answer.message)


class RosClient:
    """An rclpy node in a private context with helpers that spin until something happens."""

    def __init__(self, node_process, namespace: str = ""):
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

        from edge_slm_node.msg import Command, PoolStatus, TokenChunk
        from edge_slm_node.srv import CancelGeneration, CreateSession, DestroySession, ResetSession
        from diagnostic_msgs.msg import DiagnosticArray

        self.node_process = node_process
        self.other_logs = {}          # name -> a callable giving another process's output, for failure messages
        self.context, self.node = create_udp_client(
            "edge_slm_test_client", int(node_process.env.get("ROS_DOMAIN_ID", "0")),   # ROS default: 0
            namespace or None)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        # keep-all: a checker that falls behind must not lose chunks in its own reader
        every_chunk = QoSProfile(depth=1000, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        self.chunks, self.pools, self.diagnostics = [], [], []
        self.node.create_subscription(TokenChunk, "tokens", self.chunks.append, every_chunk)
        self.node.create_subscription(PoolStatus, "pool_status", self.pools.append, 100)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diagnostics.append, 100)
        self.command_publisher = self.node.create_publisher(Command, "command", qos)
        # a service's answers reach every client of it, taken one per executor wake-up: keep-last
        # 1000, so that a neighbour's flood of them costs ours at worst a re-send (PersistentCall);
        # read keep-all, answers to calls the node handled at once were missing after a minute
        # (README, Services)
        replies = QoSProfile(depth=1000, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE)
        self.services = {name: self.node.create_client(kind, name, qos_profile=replies) for name, kind in [
            ("create_session", CreateSession), ("destroy_session", DestroySession),
            ("reset_session", ResetSession), ("cancel_generation", CancelGeneration)]}
        self.types = {"create_session": CreateSession, "destroy_session": DestroySession,
                      "reset_session": ResetSession, "cancel_generation": CancelGeneration}
        self.Command = Command

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        import rclpy
        rclpy.try_shutdown(context=self.context)

    def spin_until(self, predicate, timeout_s, what):
        deadline = time.monotonic() + timeout_s
        while not predicate():
            if self.node_process.process.poll() is not None:
                raise AssertionError(f"node exited ({self.node_process.process.returncode}) while waiting for "
                                     f"{what}:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; node log:\n{self.logs()}")
            self.executor.spin_once(timeout_sec=0.05)

    def logs(self) -> str:
        """The node's log tail, then the other processes' output tails."""
        return "\n".join([self.node_process.log()[-4000:]] + [f"{name} output:\n{log()[-2000:]}"
                                                               for name, log in self.other_logs.items()])

    def wait_ready(self):
        self.spin_until(lambda: any(p.total_blocks > 0 for p in self.pools), READY_TIMEOUT_S, "a pool_status")
        self.spin_until(lambda: self.command_publisher.get_subscription_count() > 0
                        and all(c.service_is_ready() for c in self.services.values()), REPLY_TIMEOUT_S,
                        "command subscription and services")

    def call(self, name, **fields):
        request = self.types[name].Request(**fields)
        future = self.services[name].call_async(request)
        self.spin_until(future.done, REPLY_TIMEOUT_S, f"a {name} response")
        return future.result()

    def call_persistently(self, name, retry_after_s, **fields):
        """call(), re-sent every retry_after_s until answered (PersistentCall); -> (answer, applied)."""
        call = PersistentCall(self, name, retry_after_s, **fields)
        self.spin_until(lambda: call.answer() is not None, REPLY_TIMEOUT_S * 4, f"a {name} response")
        answer = call.answer()
        return answer, call.applied(answer)

    def send(self, session_id, text, request_id, **fields):
        self.command_publisher.publish(self.Command(session_id=session_id, request_id=request_id, text=text,
                                                    **fields))

    def chunks_of(self, request_id):
        return [c for c in self.chunks if c.request_id == request_id]

    def wait_done(self, request_id, timeout_s=300.0):
        self.spin_until(lambda: any(c.done for c in self.chunks_of(request_id)), timeout_s,
                        f"the final chunk of request {request_id}")
        self.executor.spin_once(timeout_sec=0.2)           # a duplicate final chunk would show up now
        return self.chunks_of(request_id)

    def latest_pool(self):
        """The first pool_status published after this call (older ones may still be queued)."""
        asked = time.time()
        self.spin_until(lambda: self.pools and self.pools[-1].stamp.sec + self.pools[-1].stamp.nanosec * 1e-9 >= asked,
                        REPLY_TIMEOUT_S, "a pool_status published after asking")
        return self.pools[-1]

    def wait_pool(self, predicate, what, timeout_s=REPLY_TIMEOUT_S):
        self.spin_until(lambda: self.pools and predicate(self.pools[-1]), timeout_s, what)
        return self.pools[-1]


@contextlib.contextmanager
def running_node(directory: Path, env: dict, **params):
    """A ready node process started with write_params(directory, **params), and a client to it."""
    node = NodeProcess(write_params(directory, **params), env)
    client = RosClient(node)
    try:
        client.wait_ready()
        yield client
    finally:
        client.close()
        node.stop()
