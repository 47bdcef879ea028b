"""An example tool executor: it takes edge_slm_node's tool calls, asks the operator, acts, and
returns each result with submit_tool_result so the conversation continues.

edge_slm_node never executes anything. Whether a model's call may move a machine is decided
here: this node asks the operator at the console for every call (`--yes` skips that, for tests
and simulations only) and runs the tool through `TOOLS`, which here only simulates the cell.

    python examples/tool_executor.py [--yes] [--ros-args -r __ns:=/cell3]
"""
from __future__ import annotations

import argparse
import json
import sys

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.utilities import remove_ros_args

from edge_slm_node.msg import ToolCall
from edge_slm_node.srv import SubmitToolResult

# A real cell: these would call the PLC / CNC interfaces. Simulated: they report what they would do.
TOOLS = {
    "set_valve": lambda a: {"valve": a["valve"], "open": a["open"], "ok": True},
    "stop_spindle": lambda a: {"spindle": a["spindle"], "stopped": True, "emergency": a["emergency"]},
    "set_feed_override": lambda a: {"percent": a["percent"], "ok": True},
    "read_alarm": lambda a: {"alarms": [{"number": a.get("alarm", 108), "text": "spindle 2 overtemperature"}]},
}
CONTINUED = 1 << 63          # the continued answer's request_id: the call's with the top bit set, +1 per chained call
MAX_CHAINED_CALLS = 3        # calls in a row without a new command from a person: then stop continuing


class ToolExecutor(Node):
    def __init__(self, confirm_each: bool):
        super().__init__("tool_executor")
        self.confirm_each = confirm_each
        reliable = QoSProfile(depth=100, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        self.create_subscription(ToolCall, "tool_calls", self.on_call, reliable)
        self.results = self.create_client(SubmitToolResult, "submit_tool_result", qos_profile=reliable)
        self.chained: dict = {}              # session -> calls made by continued answers since its last command
        self.ready_timer = self.create_timer(0.2, self.announce_ready)

    def announce_ready(self) -> None:
        """Say once that edge_slm_node's tool_calls publisher and submit_tool_result service are seen."""
        if self.count_publishers("tool_calls") and self.results.service_is_ready():
            self.get_logger().info("ready: edge_slm_node's tool_calls and submit_tool_result are up")
            self.ready_timer.cancel()

    def on_call(self, call: ToolCall) -> None:
        arguments = json.loads(call.arguments_json)
        self.get_logger().info(f"{call.session_id}: {call.name}({arguments}) [{call.call_id}]")
        chained = self.chained.get(call.session_id, 0) + 1 if call.request_id & CONTINUED else 0
        self.chained[call.session_id] = chained
        if chained > MAX_CHAINED_CALLS:      # a small model can call the same tool again and again
            self.get_logger().warning(f"{call.session_id}: {chained} calls in a row without a command; "
                                      f"{call.call_id} not executed, the conversation waits for the operator")
            return
        if call.name not in TOOLS:
            result = {"error": f"unknown tool {call.name}"}
        elif self.confirm_each and not self.operator_confirms(call, arguments):
            result = {"error": "the operator refused this action"}
        else:
            result = TOOLS[call.name](arguments)
        continued_id = call.request_id + 1 if call.request_id & CONTINUED else call.request_id | CONTINUED
        request = SubmitToolResult.Request(session_id=call.session_id, call_id=call.call_id,
                                           content=json.dumps(result), request_id=continued_id)
        if not self.results.wait_for_service(timeout_sec=10.0):
            self.get_logger().error("no submit_tool_result service: result not returned")
            return
        self.results.call_async(request).add_done_callback(self.on_submitted)

    @staticmethod
    def operator_confirms(call: ToolCall, arguments: dict) -> bool:
        answer = input(f"[{call.session_id}] execute {call.name} {arguments}? [y/N] ")
        return answer.strip().lower() in ("y", "yes")

    def on_submitted(self, future) -> None:
        response = future.result()
        log = self.get_logger().info if response.success else self.get_logger().error
        log(f"submit_tool_result: {response.message}")


def main(args=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--yes", action="store_true", help="execute without asking (tests, simulation)")
    options = parser.parse_args(remove_ros_args(sys.argv if args is None else args)[1:])
    rclpy.init(args=args)
    node = ToolExecutor(confirm_each=not options.yes)
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
