"""A tool-call round trip across three processes: the node (Qwen2.5-Coder-0.5B, the milling
cell's tools), the example executor (examples/tool_executor.py --yes) and this test's client."""
import json
import signal
import subprocess
import sys

import jsonschema
import pytest
import yaml

from node_harness import REPO, REPLY_TIMEOUT_S, running_node

TOOLS_FILE = REPO / "config" / "tools_milling_cell.yaml"
SCHEMAS = {t["name"]: t["parameters"] for t in yaml.safe_load(TOOLS_FILE.read_text())["tools"]}
CONTINUED = 1 << 63


@pytest.fixture(scope="module")
def cell(tmp_path_factory, ros_env_module):
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    from edge_slm_node.msg import ToolCall
    from edge_slm_node.srv import SubmitToolResult

    directory = tmp_path_factory.mktemp("tools")
    prompt = directory / "prompt.txt"
    prompt.write_text("You control milling cell 3. Use the tools to act on the machine.")
    with running_node(directory, ros_env_module, model_path="qwen2.5-coder-0.5b-instruct-q4_k_m",
                      tools_file=str(TOOLS_FILE), system_prompt_file=str(prompt), max_context_tokens=1024,
                      kv_pool_mb=16.0, max_new_tokens=64, temperature=0.0) as client:
        reliable = QoSProfile(depth=100, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        client.tool_calls = []
        client.node.create_subscription(ToolCall, "tool_calls", client.tool_calls.append, reliable)
        client.results = client.node.create_client(SubmitToolResult, "submit_tool_result", qos_profile=reliable)
        executor_log = directory / "executor.log"
        with open(executor_log, "w") as sink:
            executor = subprocess.Popen([sys.executable, str(REPO / "examples" / "tool_executor.py"), "--yes"],
                                        env=ros_env_module, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT)
        client.other_logs["tool executor"] = executor_log.read_text
        try:
            client.spin_until(lambda: "ready:" in executor_log.read_text()
                              and client.node.count_subscribers("tool_calls") >= 2
                              and client.results.service_is_ready(),
                              REPLY_TIMEOUT_S, "the executor's ready line, its tool_calls subscription and the service")
            yield client
        finally:
            executor.send_signal(signal.SIGINT)
            try:
                executor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                executor.kill()
                executor.wait(timeout=5)
            print("executor output:\n" + executor_log.read_text())


def submit_result(client, **fields):
    from edge_slm_node.srv import SubmitToolResult
    future = client.results.call_async(SubmitToolResult.Request(**fields))
    client.spin_until(future.done, REPLY_TIMEOUT_S, "a submit_tool_result response")
    return future.result()


def well_formed(chunks):
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.done for c in chunks].count(True) == 1 and chunks[-1].done
    return chunks[-1]


def test_call_published_executed_and_answer_continued(cell):
    c = cell
    before = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an idle pool")
    c.send("cell3", "Shut off valve three.", 700)
    final = well_formed(c.wait_done(700))
    assert final.finish_reason == "tool_calls", (final.error, "".join(ch.text for ch in c.chunks_of(700)))
    c.spin_until(lambda: any(t.request_id == 700 for t in c.tool_calls), REPLY_TIMEOUT_S, "the ToolCall message")
    [call] = [t for t in c.tool_calls if t.request_id == 700]
    assert call.session_id == "cell3" and call.name == "set_valve" and call.call_id
    arguments = json.loads(call.arguments_json)
    jsonschema.validate(arguments, SCHEMAS["set_valve"])
    assert arguments == {"valve": 3, "open": False}
    continued = well_formed(c.wait_done(700 | CONTINUED))         # the executor returned the result
    assert continued.finish_reason in ("stop", "length", "tool_calls"), continued.error
    assert continued.cached_prompt_tokens >= final.prompt_tokens, "the tool turn continues the cached conversation"
    again = submit_result(c, session_id="cell3", call_id=call.call_id, content="{}", request_id=799)
    assert not again.success and "no pending tool call" in again.message       # each result is taken once
    assert c.call("destroy_session", session_id="cell3").success
    assert c.wait_pool(lambda p: not p.sessions, "no sessions left").used_blocks == before.used_blocks


def test_results_for_unknown_sessions_or_calls_are_refused(cell):
    c = cell
    unknown = submit_result(cell, session_id="nobody", call_id="call-1", content="{}", request_id=801)
    assert not unknown.success and "unknown session 'nobody'" in unknown.message
    assert c.call("create_session", session_id="quiet").success
    wrong = submit_result(cell, session_id="quiet", call_id="call-404", content="{}", request_id=802)
    assert not wrong.success and "no pending tool call 'call-404'" in wrong.message
    bad_id = submit_result(cell, session_id="bad id/", call_id="call-1", content="{}", request_id=803)
    assert not bad_id.success and "invalid" in bad_id.message
    assert c.call("destroy_session", session_id="quiet").success
