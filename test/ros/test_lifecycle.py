"""The managed lifecycle through `ros2 lifecycle get/set` on a node launched with autostart:=false:
what each state refuses, what each transition costs in time and resident memory."""
import json
import time

import pytest
import yaml

from launch_harness import LaunchedNode, ros2, ros2_missing_reason, timed_ros2
from node_harness import LONG_ANSWER, REPLY_TIMEOUT_S, RosClient, counting_grammar, write_params

MISSING = ros2_missing_reason()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)
LONG_GRAMMAR = counting_grammar(500)            # ~1,900 tokens


def lifecycle_get(env, node):
    result = ros2(env, "lifecycle", "get", "--no-daemon", node)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def transition(env, node, name, figures, launched):
    rss_before = launched.node_rss_mb()
    result, took = timed_ros2(env, "lifecycle", "set", "--no-daemon", node, name, timeout=600)
    ok = "Transitioning successful" in result.stdout
    if ok and name != "shutdown":
        figures.append({"transition": name, "cli_s": round(took, 2), "rss_before_mb": round(rss_before),
                        "rss_after_mb": round(launched.node_rss_mb())})
    return ok, result.stdout + result.stderr


def assert_transition(env, node, name, figures, launched):
    ok, output = transition(env, node, name, figures, launched)
    assert ok, f"{name}: {output}\n{launched.log()[-3000:]}"


def engine_statuses(client):
    return [s for d in client.diagnostics for s in d.status if s.name == "edge_slm_node: engine"]


def node_log_seconds(launched, name, occurrence):
    """The node's own timing of a transition (its log: `configure: 2.51 s, RSS ...`)."""
    lines = [line for line in launched.log().splitlines() if f"]: {name}: " in line]
    return float(lines[occurrence].split(f"]: {name}: ")[1].split(" s,")[0]) if len(lines) > occurrence else None


def test_lifecycle_transitions_and_their_cost(tmp_path, ros_env_module):
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 3))
    params = write_params(tmp_path, kv_pool_mb=64.0, max_context_tokens=2048, max_new_tokens=200, status_rate_hz=2.0)
    launched = LaunchedNode(env, "cell8", params, autostart="false")
    node = launched.name
    client = RosClient(launched, namespace="cell8")
    figures = []
    try:
        client.spin_until(lambda: client.command_publisher.get_subscription_count() > 0
                          and all(c.service_is_ready() for c in client.services.values()), 60,
                          "the unconfigured node's command subscription and services")
        assert lifecycle_get(env, node) == "unconfigured [1]"
        client.send("lc", "Say hi.", 1)
        refused = client.wait_done(1)
        assert len(refused) == 1 and refused[0].finish_reason == "error" and "unconfigured" in refused[0].error
        reply = client.call("create_session", session_id="lc")
        assert not reply.success and "unconfigured" in reply.message

        assert_transition(env, node, "configure", figures, launched)
        assert lifecycle_get(env, node) == "inactive [2]"
        # while configuring, /diagnostics said which loading stage ran, and the log had every stage
        client.spin_until(lambda: any(s.message.startswith("configuring: loading ") for s in engine_statuses(client)),
                          10, "a 'configuring: loading <stage>' engine status")
        stages = [line.split("loading: ")[1].split(" ")[0] for line in launched.log().splitlines() if "loading: " in line]
        for stage in ("map", "repack", "tokenizer", "KV", "kernels", "shared-prompt"):
            assert stage in stages, stages
        client.send("lc", "Say hi.", 2)
        assert "inactive" in client.wait_done(2)[-1].error
        assert "inactive" in client.call("destroy_session", session_id="lc").message

        assert_transition(env, node, "activate", figures, launched)
        assert lifecycle_get(env, node) == "active [3]"
        client.send("lc", "Say hi.", 3, max_new_tokens=4)
        assert client.wait_done(3)[-1].finish_reason in ("length", "stop")

        client.send("lc", LONG_ANSWER, 4, max_new_tokens=1500, grammar=LONG_GRAMMAR)      # ~20 s: still decoding when deactivated
        from action_msgs.msg import GoalStatus
        from rclpy.action import ActionClient

        from edge_slm_node.action import Generate
        actions = ActionClient(client.node, Generate, "generate")
        client.spin_until(actions.server_is_ready, REPLY_TIMEOUT_S, "the generate action server")
        sent = actions.send_goal_async(Generate.Goal(session_id="lc-goal", text=LONG_ANSWER, max_new_tokens=1500,
                                                                  grammar=LONG_GRAMMAR))
        client.spin_until(sent.done, REPLY_TIMEOUT_S, "the goal accepted")
        goal_result = sent.result().get_result_async()
        client.spin_until(lambda: len(client.chunks_of(4)) >= 3, 120, "the long answer decoding")
        assert_transition(env, node, "deactivate", figures, launched)
        ended = client.wait_done(4)
        assert ended[-1].finish_reason == "cancelled" and "deactivated" in ended[-1].error
        assert [c.seq for c in ended] == list(range(len(ended)))
        client.spin_until(goal_result.done, REPLY_TIMEOUT_S, "the goal's result")
        assert goal_result.result().status == GoalStatus.STATUS_ABORTED
        assert "deactivated" in goal_result.result().result.error, goal_result.result().result
        actions.destroy()
        client.send("lc", "Say hi.", 5)
        assert "inactive" in client.wait_done(5)[-1].error

        assert_transition(env, node, "cleanup", figures, launched)
        assert lifecycle_get(env, node) == "unconfigured [1]"
        released = figures[-1]["rss_before_mb"] - figures[-1]["rss_after_mb"]
        configured = figures[0]["rss_after_mb"] - figures[0]["rss_before_mb"]
        # the 64 MiB pool and most of the 94 MiB of weights go back to the system
        assert released > 100, figures
        pool = yaml.safe_load(ros2(env, "topic", "echo", "--once", "--no-daemon", "--qos-durability",
                                   "transient_local", "--qos-reliability", "reliable", "/cell8/pool_status",
                                   "edge_slm_node/msg/PoolStatus").stdout.split("---")[0])
        assert pool["total_blocks"] == 0                   # the latched status says: no pool any more

        assert_transition(env, node, "configure", figures, launched)
        figures[-1]["transition"] = "configure again"
        assert_transition(env, node, "activate", figures, launched)
        client.send("lc", "Say hi.", 6, max_new_tokens=4)
        assert client.wait_done(6)[-1].finish_reason in ("length", "stop")
        ok, output = transition(env, node, "shutdown", figures, launched)
        assert ok, output
        launched.process.wait(timeout=30)                  # finalized: the node exits, and launch with it
        assert "process has finished cleanly" in launched.log()
        seen = []
        for figure in figures:
            name = figure["transition"].split()[0]
            figure["node_s"] = node_log_seconds(launched, name, seen.count(name))
            seen.append(name)
        print(f"\nlifecycle figures (configure +{configured} MiB, cleanup -{released} MiB):")
        for figure in figures:
            print("  " + json.dumps(figure))
    finally:
        client.close()
        launched.stop()
    assert "Traceback" not in launched.log(), launched.log()[-3000:]


def test_failed_configure_stays_unconfigured_and_says_why(tmp_path, ros_env_module):
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 4))
    launched = LaunchedNode(env, "cell9", write_params(tmp_path, model_path="/nonexistent/model.gguf"),
                            autostart="false")
    node = launched.name
    client = RosClient(launched, namespace="cell9")
    try:
        assert lifecycle_get(env, node) == "unconfigured [1]"
        result = ros2(env, "lifecycle", "set", "--no-daemon", node, "configure")
        assert "Transitioning failed" in result.stderr, result.stdout + result.stderr
        assert lifecycle_get(env, node) == "unconfigured [1]"

        from diagnostic_msgs.msg import DiagnosticStatus

        def engine_error():
            return [s for d in client.diagnostics for s in d.status if s.name == "edge_slm_node: engine"
                    and s.level == DiagnosticStatus.ERROR and "model file not found" in s.message]
        client.spin_until(engine_error, REPLY_TIMEOUT_S, "the reason as an ERROR engine status on /diagnostics")
        status = engine_error()[-1]
        assert status.hardware_id and {v.key for v in status.values} >= {"lifecycle_state", "last_failure"}
        names = {s.name for d in client.diagnostics for s in d.status}
        assert names >= {"edge_slm_node: KV pool", "edge_slm_node: queue", "edge_slm_node: engine"}
        client.spin_until(lambda: client.command_publisher.get_subscription_count() > 0, 30, "the command topic")
        client.send("x", "Say hi.", 1)
        assert "model file not found" in client.wait_done(1)[-1].error
        assert launched.process.poll() is None
        assert "Transitioning successful" in ros2(env, "lifecycle", "set", "--no-daemon", node, "shutdown").stdout
        launched.process.wait(timeout=30)
    finally:
        client.close()
        launched.stop()
    assert "Traceback" not in launched.log(), launched.log()[-3000:]


def test_use_respawn_restarts_a_killed_node(tmp_path, ros_env_module):
    env = dict(ros_env_module, ROS_DOMAIN_ID=str(int(ros_env_module["ROS_DOMAIN_ID"]) + 5))
    launched = LaunchedNode(env, "cell10", write_params(tmp_path), use_respawn="true")
    try:
        first = launched.node_pid()
        import os
        import signal
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                second = launched.node_pid(timeout_s=1)
            except AssertionError:
                continue
            if second != first:
                break
        else:
            raise AssertionError(f"no respawned node within 60 s:\n{launched.log()[-3000:]}")
        assert "process started" in launched.log().split("process has died")[-1]
    finally:
        launched.stop()
