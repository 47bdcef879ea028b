"""Command.json_schema / Command.grammar through the node process, real rclpy clients here."""
import json
import re

import jsonschema
import pytest

from node_harness import running_node

VALVE_SCHEMA = {"type": "object",
                "properties": {"valve": {"type": "integer", "minimum": 1, "maximum": 12},
                               "open": {"type": "boolean"},
                               "reason": {"enum": ["maintenance", "leak", "operator"]}},
                "required": ["valve", "open", "reason"], "additionalProperties": False}
# at most three words, so every model's line ends within max_new_tokens (Qwen2.5-Coder at
# temperature 1 kept adding words to an unbounded line)
GCODE_LARK = r"""
start: ("G0" | "G1") word word? word? "\n"
word: " " ("X" | "Y" | "Z") NUM
NUM: /-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?/
"""


@pytest.fixture(scope="module")
def node_client(tmp_path_factory, ros_env_module):
    directory = tmp_path_factory.mktemp("constrained")
    prompt = directory / "prompt.txt"
    prompt.write_text("You are the assistant of CNC cell 3. Answer briefly.")
    with running_node(directory, ros_env_module, system_prompt_file=str(prompt), max_context_tokens=512) as client:
        yield client


def answer_of(chunks):
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.done for c in chunks].count(True) == 1 and chunks[-1].done
    return "".join(c.text for c in chunks), chunks[-1]


def test_schema_and_grammar_answers_are_valid_and_the_free_one_beside_them_too(node_client):
    c = node_client
    baseline = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an idle pool")
    for index in range(4):
        c.send(f"json-{index}", "Shut off valve three.", 500 + index, max_new_tokens=100, temperature=1.0,
               seed=index, json_schema=json.dumps(VALVE_SCHEMA))
    c.send("gcode", "Move to X10 Y20.", 510, max_new_tokens=60, temperature=1.0, seed=3, grammar=GCODE_LARK)
    c.send("free", "What is G01?", 511, max_new_tokens=12, temperature=0.0)
    for index in range(4):
        text, final = answer_of(c.wait_done(500 + index))
        assert final.finish_reason == "stop", (final.error, text)
        jsonschema.validate(json.loads(text), VALVE_SCHEMA)
    text, final = answer_of(c.wait_done(510))
    assert final.finish_reason == "stop" and re.fullmatch(r"G[01]( [XYZ]-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,2})?){1,3}\n", text)
    text, final = answer_of(c.wait_done(511))
    assert final.finish_reason in ("stop", "length") and text.strip()
    for sid in [f"json-{i}" for i in range(4)] + ["gcode", "free"]:
        assert c.call("destroy_session", session_id=sid).success
    assert c.wait_pool(lambda p: not p.sessions, "no sessions left").used_blocks == baseline.used_blocks


@pytest.mark.parametrize("fields,message", [
    ({"json_schema": "{\"type\": \"intger\"}"}, "invalid json_schema: Invalid type: intger"),
    ({"json_schema": "{not json"}, "invalid json_schema"),
    ({"grammar": "start: missing_rule"}, "missing_rule"),
    ({"json_schema": "{\"type\": \"object\"}", "grammar": GCODE_LARK}, "not both"),
    ({"json_schema": json.dumps({"enum": ["x" * 17000]})}, "at most 16384"),
])
def test_bad_schema_or_grammar_gets_one_error_chunk_and_creates_nothing(node_client, fields, message):
    c = node_client
    before = c.wait_pool(lambda p: not p.sessions and p.queue_length == 0, "an idle pool")
    request_id = 600 + len(c.chunks)
    c.send("bad-constraint", "Shut off valve three.", request_id, **fields)
    chunks = c.wait_done(request_id)
    assert len(chunks) == 1 and chunks[0].finish_reason == "error", chunks
    assert message in chunks[0].error, chunks[0].error
    assert not c.call("destroy_session", session_id="bad-constraint").success    # nothing was created
    c.send("after-bad", "Say hi.", request_id + 1, max_new_tokens=3)
    assert answer_of(c.wait_done(request_id + 1))[1].finish_reason in ("stop", "length")
    assert c.call("destroy_session", session_id="after-bad").success
    assert c.wait_pool(lambda p: not p.sessions, "no sessions left").used_blocks == before.used_blocks


def test_generate_goal_with_a_schema_succeeds_with_a_valid_document(node_client):
    from action_msgs.msg import GoalStatus
    from rclpy.action import ActionClient

    from edge_slm_node.action import Generate

    c = node_client
    actions = ActionClient(c.node, Generate, "generate")
    c.spin_until(actions.server_is_ready, 30, "the generate action server")
    results = {}
    for name, goal in [("schema", Generate.Goal(session_id="goal-json", text="Shut off valve three.",
                                                 max_new_tokens=100, temperature=1.0, seed=5,
                                                 json_schema=json.dumps(VALVE_SCHEMA))),
                       ("bad", Generate.Goal(session_id="goal-bad", text="Shut off valve three.",
                                              grammar="start: missing_rule"))]:
        sent = actions.send_goal_async(goal)
        c.spin_until(sent.done, 30, "the goal response")
        assert sent.result().accepted
        future = sent.result().get_result_async()
        c.spin_until(future.done, 300, "the goal result")
        results[name] = future.result()
    assert results["schema"].status == GoalStatus.STATUS_SUCCEEDED
    assert results["schema"].result.finish_reason == "stop"
    jsonschema.validate(json.loads(results["schema"].result.text), VALVE_SCHEMA)
    assert results["bad"].status == GoalStatus.STATUS_ABORTED and "missing_rule" in results["bad"].result.error
    assert c.call("destroy_session", session_id="goal-json").success
    actions.destroy()
