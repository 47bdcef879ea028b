"""The node as ROS users meet it: started by `ros2 launch`, looked at and changed with `ros2 topic /
service / param / lifecycle` subprocesses, streamed and the generate action used from rclpy here."""
import math
import time

import pytest
import yaml

from launch_harness import LaunchedNode, ros2, ros2_missing_reason, timed_ros2
from node_harness import LONG_ANSWER, REPLY_TIMEOUT_S, RosClient, counting_grammar, write_params

MISSING = ros2_missing_reason()
pytestmark = pytest.mark.skipif(bool(MISSING), reason=MISSING)

NAMESPACE = "cell7"
NODE = f"/{NAMESPACE}/edge_slm_node"
LONG_GRAMMAR = counting_grammar(200)
STATUS_PERIOD_S = 20.0          # so slow that only a latched pool_status can answer a late echo at once


def echo_once(env, topic, kind):
    # without the ros2 daemon the CLI subscribes before it has discovered the publisher, so it cannot
    # match the publisher's durability itself: ask for transient_local as rqt or a user script would
    result, took = timed_ros2(env, "topic", "echo", "--once", "--no-daemon", "--qos-durability", "transient_local",
                              "--qos-reliability", "reliable", topic, kind)
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout.split("---")[0]), took


def param_set(env, name, value):
    result = ros2(env, "param", "set", "--no-daemon", NODE, name, str(value))
    return result.returncode, result.stdout + result.stderr


@pytest.fixture(scope="module")
def cell(tmp_path_factory, ros_env_module):
    directory = tmp_path_factory.mktemp("launch")
    params = write_params(directory, status_rate_hz=1.0 / STATUS_PERIOD_S, kv_pool_mb=16.0, max_context_tokens=640,
                          max_new_tokens=8)
    launched = LaunchedNode(ros_env_module, NAMESPACE, params)
    client = RosClient(launched, namespace=NAMESPACE)
    try:
        client.wait_ready()
        yield launched, client, ros_env_module
    finally:
        client.close()
        launched.stop()
    assert "Traceback" not in launched.log(), launched.log()[-3000:]


def test_late_topic_echo_sees_the_current_pool_at_once(cell):
    launched, client, env = cell
    asked = time.time()
    pool, took = echo_once(env, f"/{NAMESPACE}/pool_status", "edge_slm_node/msg/PoolStatus")
    assert pool["total_blocks"] > 0 and pool["bytes_per_block"] > 0
    assert pool["stamp"]["sec"] <= asked, "a fresh status, not the latched one"
    assert took < STATUS_PERIOD_S / 2, f"ros2 topic echo took {took:.1f} s"


def test_param_get_describe_and_read_only(cell):
    launched, client, env = cell
    got = ros2(env, "param", "get", "--no-daemon", NODE, "kv_pool_mb")
    assert got.returncode == 0 and "Double value is: 16.0" in got.stdout, got.stdout + got.stderr
    described = ros2(env, "param", "describe", "--no-daemon", NODE, "kv_pool_mb", "temperature")
    text = described.stdout
    pool_part, temperature_part = text.split("Parameter name: temperature")
    assert "Read only: true" in pool_part and "Max value: 1048576.0" in pool_part, text
    assert "Read only" not in temperature_part and "Max value: 100.0" in temperature_part, text
    code, output = param_set(env, "kv_pool_mb", 32.0)
    assert "read-only parameter: kv_pool_mb" in output, output
    assert "Double value is: 16.0" in ros2(env, "param", "get", "--no-daemon", NODE, "kv_pool_mb").stdout


def test_service_call_from_the_command_line(cell):
    launched, client, env = cell
    created = ros2(env, "service", "call", f"/{NAMESPACE}/create_session", "edge_slm_node/srv/CreateSession",
                   "{session_id: cli-1, keep_history: true}")
    assert "success=True" in created.stdout and "session_id='cli-1'" in created.stdout, created.stdout
    destroyed = ros2(env, "service", "call", f"/{NAMESPACE}/destroy_session", "edge_slm_node/srv/DestroySession",
                     "{session_id: cli-1}")
    assert "success=True" in destroyed.stdout, destroyed.stdout
    again = ros2(env, "service", "call", f"/{NAMESPACE}/destroy_session", "edge_slm_node/srv/DestroySession",
                 "{session_id: cli-1}")
    assert "success=False" in again.stdout and "unknown session" in again.stdout, again.stdout


def test_run_time_parameters_are_validated_and_apply_to_the_next_request(cell):
    launched, client, env = cell
    code, output = param_set(env, "top_p", 0.0)
    assert "Setting parameter failed" in output and "top_p" in output and "(0, 1]" in output, output
    code, output = param_set(env, "status_rate_hz", 500.0)
    assert "Setting parameter failed" in output, output
    assert "Set parameter successful" in param_set(env, "status_rate_hz", 5.0)[1]
    count = len(client.pools)
    client.spin_until(lambda: len(client.pools) >= count + 5, 5.0, "pool_status at the new 5 Hz")

    assert "Set parameter successful" in param_set(env, "max_new_tokens", 3)[1]
    client.send("rt-1", LONG_ANSWER, 1, temperature=0.0, grammar=LONG_GRAMMAR)            # max_new_tokens 0 = the node default
    final = client.wait_done(1)[-1]
    assert (final.finish_reason, final.completion_tokens) == ("length", 3), final

    assert "Set parameter successful" in param_set(env, "max_pending_per_session", 1)[1]
    for request_id in (2, 3, 4):
        client.send("rt-1", "Say hi.", request_id)
    errors = [client.wait_done(rid)[-1].error for rid in (2, 3, 4)]
    assert any("max_pending_per_session=1" in e for e in errors), errors
    assert "Set parameter successful" in param_set(env, "max_pending_per_session", 8)[1]
    for request_id in (5, 6, 7):
        client.send("rt-1", "Say hi.", request_id)
    assert all(client.wait_done(rid)[-1].finish_reason in ("length", "stop") for rid in (5, 6, 7))
    got = ros2(env, "param", "get", "--no-daemon", NODE, "max_pending_per_session")
    assert "Integer value is: 8" in got.stdout
    assert "Set parameter successful" in param_set(env, "max_new_tokens", 8)[1]
    assert client.call("destroy_session", session_id="rt-1").success


def test_generate_action_feedback_result_cancel_and_bad_goals(cell):
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient

    from edge_slm_node.action import Generate

    launched, client, env = cell
    assert "Set parameter successful" in param_set(env, "status_rate_hz", 5.0)[1]    # the decode state shows
    actions = ActionClient(client.node, Generate, "generate")
    client.spin_until(actions.server_is_ready, REPLY_TIMEOUT_S, "the generate action server")

    def send(goal):
        feedback = []
        sent = actions.send_goal_async(goal, feedback_callback=lambda message: feedback.append(message.feedback))
        client.spin_until(sent.done, REPLY_TIMEOUT_S, "the goal response")
        handle = sent.result()
        assert handle.accepted
        return handle, feedback

    def result_of(handle):
        future = handle.get_result_async()
        client.spin_until(future.done, 300, "the goal result")
        return future.result()

    handle, feedback = send(Generate.Goal(session_id="act-1", text="Why is spindle 2 alarming?", max_new_tokens=6,
                                          temperature=0.0))
    done = result_of(handle)
    assert done.status == GoalStatus.STATUS_SUCCEEDED
    assert done.result.finish_reason in ("length", "stop") and done.result.completion_tokens >= 1
    assert done.result.text.strip()
    # feedback is a topic and the result a service reply: the last feedback may arrive after the result
    client.spin_until(lambda: "".join(f.text for f in feedback) == done.result.text, REPLY_TIMEOUT_S,
                      f"the feedback to spell the result {done.result.text!r}")
    assert [f.seq for f in feedback] == list(range(len(feedback))) and feedback

    handle, feedback = send(Generate.Goal(session_id="act-2", text=LONG_ANSWER, max_new_tokens=200, grammar=LONG_GRAMMAR))
    client.spin_until(lambda: len(feedback) >= 3, 120, "the long goal's feedback")
    during = client.wait_pool(lambda p: any(s.session_id == "act-2" and s.state == "decode" for s in p.sessions),
                              "the goal's session decoding in pool_status", 60)
    cancel = handle.cancel_goal_async()
    client.spin_until(cancel.done, REPLY_TIMEOUT_S, "the cancel response")
    assert len(cancel.result().goals_canceling) == 1
    cancelled = result_of(handle)
    assert cancelled.status == GoalStatus.STATUS_CANCELED and cancelled.result.finish_reason == "cancelled"
    assert 3 <= cancelled.result.completion_tokens < 200
    after = client.wait_pool(lambda p: all(s.state == "idle" for s in p.sessions), "idle sessions")
    session = next(s for s in after.sessions if s.session_id == "act-2")
    assert session.num_tokens == cancelled.result.cached_prompt_tokens        # the cancelled turn's KV is gone
    assert session.num_tokens < max(s.num_tokens for s in during.sessions if s.session_id == "act-2")

    for goal, message in [(Generate.Goal(session_id="act-3", text="hi", temperature=math.nan), "temperature"),
                          (Generate.Goal(session_id="", text="hi"), "session_id is empty"),
                          (Generate.Goal(session_id="act-3", text="   "), "empty prompt")]:
        handle, _ = send(goal)
        refused = result_of(handle)
        assert refused.status == GoalStatus.STATUS_ABORTED and refused.result.finish_reason == "error"
        assert message in refused.result.error, refused.result.error
    for session_id in ("act-1", "act-2"):
        assert client.call("destroy_session", session_id=session_id).success
    actions.destroy()
    assert launched.process.poll() is None
