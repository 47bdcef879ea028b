"""`ros2 param set` on the run-time parameters: validated by the same rules as at start, then
applied for the next request. Read-only ones are refused by rclpy from their descriptors.

The engine reads its queue limits and queue_timeout_s from its config on every submit and step,
so a changed value is applied by replacing that frozen config with an updated copy.
"""
from __future__ import annotations

from dataclasses import replace

from rcl_interfaces.msg import SetParametersResult

from ..engine.config import ConfigError
from .params import PARAMETERS, RuntimeSettings, runtime_from_values


class RuntimeParameters:
    def __init__(self, node):
        self.node = node

    def on_set_parameters(self, parameters) -> SetParametersResult:
        changes = {p.name: p.value for p in parameters if p.name in PARAMETERS}
        if not changes:
            return SetParametersResult(successful=True)
        values = self.node.parameter_values()
        values.update(changes)
        try:
            runtime = runtime_from_values(values)
        except (ConfigError, TypeError, ValueError) as error:      # no client value may raise out of here
            self.node.get_logger().warning(f"parameter change refused: {error}")
            return SetParametersResult(successful=False, reason=str(error))
        self.apply(runtime)
        self.node.get_logger().info("parameters changed: " + ", ".join(f"{k}={v!r}" for k, v in changes.items()))
        return SetParametersResult(successful=True)

    def apply(self, runtime: RuntimeSettings) -> None:
        node = self.node
        old, node.runtime = node.runtime, runtime
        node.limiter.set_rate(runtime.service_rate_limit_hz)
        if runtime.status_rate_hz != old.status_rate_hz:
            node.status.set_rate(runtime.status_rate_hz)
        engine = node.host.engine
        if engine is not None:
            engine.config = replace(engine.config, max_queued_requests=runtime.max_queued_requests,
                                    max_pending_per_session=runtime.max_pending_per_session,
                                    queue_timeout_s=runtime.queue_timeout_s)
        node.status_changed()
