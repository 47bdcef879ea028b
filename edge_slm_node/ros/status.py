"""pool_status and /diagnostics: published at status_rate_hz and (coalesced) on every change.

pool_status is TRANSIENT_LOCAL with depth 1, so a subscriber that joins late (`ros2 topic echo`,
rqt) gets the current state at once. Timers run on the steady clock: use_sim_time and whoever
publishes /clock must not stop or drive them.
"""
from __future__ import annotations

import socket
import threading

from rclpy.clock import Clock, ClockType
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from diagnostic_msgs.msg import DiagnosticArray
from edge_slm_node.msg import PoolStatus

from ..engine.memory import resident_bytes
from . import convert
from .diagnostics import diagnostics
from .guard import guarded_timer

STATUS_COALESCE_S = 0.1
POOL_STATUS_QOS = QoSProfile(depth=1, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)


class StatusPublisher:
    def __init__(self, node, host, callback_group, hardware_id: str):
        self.node = node
        self.host = host
        self.hardware_id = hardware_id or socket.gethostname()
        self.status_publisher = node.create_publisher(PoolStatus, "pool_status", POOL_STATUS_QOS)
        self.diagnostics_publisher = node.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._group = callback_group
        self._steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._changed = threading.Event()
        self._publish_lock = threading.Lock()     # one status at a time, in order
        log = node.get_logger()
        self.publish_safely = guarded_timer(log, "status", self.publish, node.context)
        self._timer = None
        self.set_rate(node.runtime.status_rate_hz)
        # session changes are published at most 10 times a second, however many calls cause them
        node.create_timer(STATUS_COALESCE_S, guarded_timer(log, "status", self._publish_if_changed, node.context),
                          callback_group=callback_group, clock=self._steady)

    def set_rate(self, rate_hz: float) -> None:
        old, self._timer = self._timer, self.node.create_timer(1.0 / rate_hz, self.publish_safely,
                                                               callback_group=self._group, clock=self._steady)
        if old is not None:
            self.node.destroy_timer(old)

    def changed(self) -> None:
        self._changed.set()

    def _publish_if_changed(self) -> None:
        if self._changed.is_set():
            self._changed.clear()
            self.publish()

    def publish(self) -> None:
        with self._publish_lock:
            node = self.node
            stamp = node.get_clock().now().to_msg()
            rss = resident_bytes()
            engine = self.host.engine
            stats = engine.stats() if engine is not None else None
            if stats is not None:
                self.status_publisher.publish(convert.pool_status(stats, stamp, rss))
            self.diagnostics_publisher.publish(diagnostics(
                stats, stamp, node.get_name(), self.hardware_id, node.lifecycle_state,
                node.loading.current if node.loading.stage else "", node.failure,
                node.model_path, rss, node.runtime.max_queued_requests))

    def publish_no_pool(self) -> None:
        """After cleanup: the latched pool_status says there is no pool any more (total_blocks 0)."""
        with self._publish_lock:
            self.status_publisher.publish(PoolStatus(stamp=self.node.get_clock().now().to_msg(),
                                                     rss_bytes=resident_bytes()))
