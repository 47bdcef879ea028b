"""Tool calls on the real Qwen2.5-Coder-0.5B: tools in the shared prompt, constrained calls, a
tool result continuing the conversation."""
import json
from pathlib import Path

import jsonschema
import pytest

from conftest import assert_pool_consistent, run_to_completion
from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.request import FinishReason
from edge_slm_node.engine.sampling import InvalidRequestError, SamplingParams
from edge_slm_node.engine.tools import ToolsFileError, read_tools_file, tools_from_entries
from edge_slm_node.model.loader import load_model

TOOLS_FILE = Path(__file__).resolve().parents[2] / "config" / "tools_milling_cell.yaml"
TOOLS = read_tools_file(str(TOOLS_FILE))
SCHEMAS = {tool.name: tool.parameters for tool in TOOLS}
SYSTEM = "You control milling cell 3. Use the tools to act on the machine."
GREEDY = SamplingParams(max_new_tokens=80)


@pytest.fixture(scope="module")
def qwen():
    return load_model("qwen2.5-coder-0.5b-instruct-q4_k_m")


@pytest.fixture(scope="module")
def engine(qwen):
    return Engine(EngineConfig(kv_pool_mb=24, max_context_tokens=1024, system_prompt=SYSTEM, tools=TOOLS,
                               guard_zones=True), model=qwen)


def run(engine, request):
    run_to_completion(engine, [request])
    return request


def test_tools_are_rendered_into_the_pinned_shared_prompt(engine):
    prefix_text = engine.tokenizer.decode(engine.prefix_ids)
    assert prefix_text.startswith("<|im_start|>system\n" + SYSTEM)
    for tool in TOOLS:
        assert f'"name": "{tool.name}"' in prefix_text
    assert "<tools>" in prefix_text and prefix_text.endswith("<|im_end|>\n")
    engine.create_session("prefix")
    request = run(engine, engine.submit("prefix", "Read the active alarms.", GREEDY))
    assert request.cached_prompt_tokens >= len(engine.prefix_ids) - engine.config.block_size
    engine.destroy_session("prefix")


def test_a_call_ends_the_answer_and_its_result_continues_the_conversation(engine):
    baseline = engine.stats().used_blocks
    engine.create_session("cell")
    call_request = run(engine, engine.submit("cell", "Shut off valve three.", GREEDY))
    assert call_request.finish_reason is FinishReason.TOOL_CALLS, (call_request.error, call_request.text_out)
    [call] = call_request.tool_calls
    assert call.name == "set_valve"
    arguments = json.loads(call.arguments_json)
    jsonschema.validate(arguments, SCHEMAS["set_valve"])
    assert arguments == {"valve": 3, "open": False}
    session = engine.sessions.get("cell")
    assert session.pending_tool_calls == {call.call_id: "set_valve"}
    tokens_after_call = engine.kv.num_tokens("cell")
    with pytest.raises(InvalidRequestError, match="no pending tool call 'call-999'"):
        engine.submit_tool_result("cell", "call-999", '{"ok": true}', GREEDY)
    result = run(engine, engine.submit_tool_result("cell", call.call_id, '{"valve": 3, "open": false, "ok": true}',
                                                   SamplingParams(max_new_tokens=40)))
    assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH, FinishReason.TOOL_CALLS), result.error
    assert result.text_out.strip()
    assert set(session.pending_tool_calls) == {c.call_id for c in result.tool_calls}    # the answered one is gone
    assert [m["role"] for m in session.messages] == ["user", "assistant", "tool", "assistant"]
    assert session.messages[1]["content"] == call_request.text_out
    assert result.cached_prompt_tokens >= tokens_after_call - engine.config.block_size, \
        "the tool turn reuses the KV of the conversation so far"
    prompt_text = engine.tokenizer.decode(result.prompt_ids)
    assert "<tool_response>\n{\"valve\": 3" in prompt_text
    engine.destroy_session("cell")
    assert engine.stats().used_blocks == baseline
    assert_pool_consistent(engine)


def test_sampled_calls_are_always_valid_calls(engine):
    texts = ["Shut off valve three.", "Stop spindle 2 now!", "Set the feed override to 80 percent.",
             "What alarm is active?", "Open valve 7.", "Emergency stop on spindle one!"]
    requests = []
    for index, text in enumerate(texts * 2):
        engine.create_session(f"s{index}", keep_history=False)
        requests.append(engine.submit(f"s{index}", text, SamplingParams(temperature=1.0, top_k=0, seed=index,
                                                                        max_new_tokens=120)))
    run_to_completion(engine, requests)
    calls = 0
    for request in requests:
        assert request.finish_reason in (FinishReason.TOOL_CALLS, FinishReason.STOP), (request.error,
                                                                                        request.text_out)
        for call in request.tool_calls:
            jsonschema.validate(json.loads(call.arguments_json), SCHEMAS[call.name])
            calls += 1
    assert calls >= len(requests) // 3          # not vacuous: 5 of these 12 seeded samples end in a call
    for index in range(len(requests)):
        engine.destroy_session(f"s{index}")


def test_the_tools_constraint_refuses_invalid_calls_and_allows_free_text(engine):
    cases = [('<tool_call>\n{"name": "set_valve", "arguments": {"valve": 3, "open": false}}\n</tool_call>', True),
             ('{"name": "stop_spindle", "arguments": {"spindle": 2, "emergency": true}}', True),
             ('Sure. <tool_call>\n{"name": "read_alarm", "arguments": {}}\n</tool_call>', True),
             ('{"name": "set_valve", "arguments": {"valve": 13, "open": false}}', False),
             ('{"name": "open_door", "arguments": {}}', False),
             ('{"name": "set_feed_override", "arguments": {"percent": 80, "force": true}}', False),
             ('<tool_call>\n{"name": "stop_spindle", "arguments": {"spindle": 1}}\n</tool_call>', False)]
    for text, valid in cases:
        constraint = engine.constraints.compile(engine._tools_grammar, "tools")
        ids = engine.tokenizer.encode(text, parse_special=False)
        assert all(constraint.advance(t) for t in ids) == valid, text
        assert constraint.complete == valid, text
    free = engine.constraints.compile(engine._tools_grammar, "tools")
    assert all(free.advance(t) for t in engine.tokenizer.encode("G01 is a linear move.", parse_special=False))
    assert not free.complete and free.matcher.is_accepting()


@pytest.mark.parametrize("entries,message", [
    ([{"name": "bad name"}], "needs a name"),
    ([{"name": "a"}, {"name": "a"}], "declared twice"),
    ([{"name": "a", "parameters": {"type": "string"}}], "type object"),
])
def test_bad_tool_declarations_are_refused(entries, message):
    with pytest.raises(ToolsFileError, match=message):
        tools_from_entries(entries)
