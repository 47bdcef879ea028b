"""guard.guarded_timer against a real rclpy context: a publisher failing because Ctrl-C shut the
context down mid-callback is shutdown, not an error (no traceback in the node's log), while the
same failure on a live context is still logged with its traceback."""
from std_msgs.msg import String

from edge_slm_node.ros.guard import guarded_timer
from in_process_node import create_udp_client


class RecordedLog:
    """The two levels guarded_timer writes, kept for the assertions."""

    def __init__(self):
        self.errors, self.debug_lines = [], []

    def error(self, text):
        self.errors.append(text)

    def debug(self, text):
        self.debug_lines.append(text)


def test_a_timer_failing_after_shutdown_logs_no_error(ros_env):
    context, node = create_udp_client("guard_test_client")
    try:
        publisher = node.create_publisher(String, "guard_test", 1)
        log = RecordedLog()
        callback = guarded_timer(log, "status", lambda: publisher.publish(String(data="x")), context)
        callback()                                       # live context: publishes
        assert log.errors == [] and log.debug_lines == []
        context.shutdown()                               # what rclpy's SIGINT handler does
        callback()
        assert log.errors == []
        assert len(log.debug_lines) == 1 and "stopped by shutdown" in log.debug_lines[0]
    finally:
        node.destroy_node()
        context.try_shutdown()


def test_a_timer_failing_on_a_live_context_logs_its_traceback(ros_env):
    context, node = create_udp_client("guard_test_client")
    try:
        log = RecordedLog()

        def broken():
            raise RuntimeError("engine gone")
        callback = guarded_timer(log, "status", broken, context)
        callback()
        callback()                                       # the same message is logged once
        assert len(log.errors) == 1
        assert "status timer failed: RuntimeError: engine gone" in log.errors[0]
        assert "Traceback" in log.errors[0]
    finally:
        node.destroy_node()
        context.try_shutdown()
