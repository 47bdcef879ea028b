"""Constrained decoding on the real SmolLM2: JSON Schema and grammar outputs always valid, in batches,
across preemption, and unconstrained neighbours untouched."""
import json
import re

import jsonschema
import pytest

from conftest import assert_pool_consistent, pool_mb_for_tokens, run_to_completion
from edge_slm_node.engine.request import FinishReason
from edge_slm_node.engine.sampling import InvalidRequestError, SamplingParams

JOB_SCHEMA = {
    "type": "object",
    "properties": {
        "machine": {"enum": ["mill-1", "mill-2", "lathe-1"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 5},
        "operations": {
            "type": "array", "minItems": 1, "maxItems": 3,
            "items": {
                "type": "object",
                "properties": {
                    "tool": {"type": "integer", "minimum": 1, "maximum": 24},
                    "kind": {"enum": ["drill", "face", "pocket", "tap"]},
                    "depth_mm": {"type": "integer", "minimum": 1, "maximum": 50},
                    "coolant": {"type": "boolean"},
                },
                "required": ["tool", "kind", "coolant"],
                "additionalProperties": False,
            },
        },
        "operator": {"type": "object", "properties": {"shift": {"enum": ["A", "B", "C"]},
                                                      "badge": {"type": "integer", "minimum": 1000, "maximum": 9999}},
                     "required": ["shift", "badge"], "additionalProperties": False},
        "note": {"type": "string", "maxLength": 24},
    },
    "required": ["machine", "priority", "operations", "operator"],
    "additionalProperties": False,
}

GCODE_LARK = r"""
start: motion axis axis? axis? feed? "\n"
motion: "G0" | "G1"
axis: " " AXIS NUM
feed: " F" FEED
AXIS: "X" | "Y" | "Z"
NUM: /-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?/
FEED: /[1-9][0-9]{0,3}/
"""
GCODE_GBNF = r"""
root ::= motion axis axis? axis? feed? "\n"
motion ::= "G0" | "G1"
axis ::= " " [XYZ] num
num ::= "-"? ("0" | [1-9] [0-9]? [0-9]? [0-9]?) ("." [0-9] [0-9]? [0-9]?)?
feed ::= " F" [1-9] [0-9]? [0-9]? [0-9]?
"""
NUM = r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?"
GCODE_LINE = re.compile(rf"G[01]( [XYZ]{NUM}){{1,3}}( F[1-9][0-9]{{0,3}})?\n")
SAMPLED = dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=256)


def submit_all(engine, prefix, texts, params_for):
    requests = []
    for index, text in enumerate(texts):
        sid = f"{prefix}{index}"
        engine.create_session(sid, keep_history=False)
        requests.append(engine.submit(sid, text, params_for(index)))
    return requests


def test_fifty_sampled_answers_all_validate_against_a_nested_schema(make_engine):
    """7 waves of 8 sessions decoding together at temperature 1.0: 56 documents."""
    engine = make_engine(kv_pool_mb=24, max_running=8)
    baseline = engine.stats().used_blocks
    schema = json.dumps(JOB_SCHEMA)
    texts = ["Plan a drilling job for the mill.", "Write the job ticket for lathe 1.",
             "Which operations does part 7 need?", "Job for shift B please."] * 2
    outputs = []
    for wave in range(7):
        requests = submit_all(engine, "job", texts,
                              lambda i: SamplingParams(**SAMPLED, seed=1000 + 8 * wave + i, json_schema=schema))
        run_to_completion(engine, requests, max_steps=20000)
        for request in requests:
            assert request.finish_reason is FinishReason.STOP, (request.finish_reason, request.error, request.text_out)
            jsonschema.validate(json.loads(request.text_out), JOB_SCHEMA)
            outputs.append(request.text_out)
        for index in range(len(texts)):
            engine.destroy_session(f"job{index}")
    assert len(outputs) == 56
    assert len(set(outputs)) > 28, "temperature 1.0 should give many different documents"
    assert any(len(json.loads(o)["operations"]) > 1 for o in outputs)
    assert engine.stats().used_blocks == baseline
    assert_pool_consistent(engine)


@pytest.mark.parametrize("grammar", [GCODE_LARK, GCODE_GBNF], ids=["lark", "gbnf"])
def test_gcode_grammar_gives_only_valid_lines(make_engine, grammar):
    engine = make_engine(max_running=8)
    texts = ["Move to X10 Y20.", "Rapid to the tool change position.", "Feed the Z axis down 2 mm.",
             "Write one G-code line."] * 2
    requests = submit_all(engine, "gcode", texts, lambda i: SamplingParams(**SAMPLED, seed=i, grammar=grammar))
    run_to_completion(engine, requests)
    for request in requests:
        assert request.finish_reason is FinishReason.STOP, (request.error, request.text_out)
        assert GCODE_LINE.fullmatch(request.text_out), repr(request.text_out)


def test_the_gcode_matcher_refuses_invalid_lines(make_engine):
    """The masks' source of truth: token by token, an invalid line is refused where it goes wrong."""
    engine = make_engine()
    tokenizer = engine.tokenizer
    for line, valid in [("G1 X10.5 Y-3 F1200\n", True), ("G0 Z0\n", True), ("G2 X1\n", False),
                        ("G1 X10.12345\n", False), ("G1 F100\n", False), ("G1 X01\n", False),
                        ("G1 X1 Y2 Z3 X4\n", False)]:
        constraint = engine.constraints.for_params(SamplingParams(grammar=GCODE_LARK))
        accepted = all(constraint.advance(t) for t in tokenizer.encode(line, parse_special=False))
        assert accepted == valid, line
        assert constraint.complete == valid, line


@pytest.mark.parametrize("field,value,message", [
    ("json_schema", "{not json", "invalid json_schema"),
    ("json_schema", json.dumps({"type": "intger"}), "intger"),
    ("json_schema", json.dumps({"type": "array", "uniqueItems": True}), "uniqueItems"),
    ("grammar", "start: undefined_rule", "undefined_rule"),
    ("grammar", "root ::= \"a\" (", "invalid grammar"),
])
def test_bad_schema_or_grammar_is_refused_with_the_parser_message(make_engine, field, value, message):
    engine = make_engine()
    engine.create_session("ok")
    engine.create_session("bad")
    baseline = engine.stats()
    neighbour = engine.submit("ok", "What is G01?", SamplingParams(max_new_tokens=6))
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        engine.submit("bad", "Shut off valve three.", SamplingParams(**{field: value}))
    run_to_completion(engine, [neighbour])
    assert neighbour.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert engine.scheduler.queued("bad") == [] and engine.scheduler.active("bad") is None
    assert engine.stats().used_blocks >= baseline.used_blocks
    engine.destroy_session("ok")
    assert engine.stats().used_blocks == baseline.used_blocks
    assert_pool_consistent(engine)


def test_schema_and_grammar_together_are_refused(make_engine):
    engine = make_engine()
    engine.create_session("s")
    with pytest.raises(InvalidRequestError, match="not both"):
        engine.submit("s", "x", SamplingParams(json_schema='{"type": "object"}', grammar=GCODE_LARK))


def _alone(make_engine, text, params):
    engine = make_engine()
    engine.create_session("alone")
    request = engine.submit("alone", text, params)
    steps = engine.steps
    run_to_completion(engine, [request])
    return request, engine.steps - steps


def test_constrained_and_unconstrained_in_one_step_answer_as_alone(make_engine):
    free = SamplingParams(temperature=1.0, seed=7, max_new_tokens=40, ignore_eos=True)
    constrained = SamplingParams(**SAMPLED, seed=8, json_schema=json.dumps(JOB_SCHEMA))
    free_alone, free_steps = _alone(make_engine, "What is G01?", free)
    json_alone, json_steps = _alone(make_engine, "Plan a drilling job for the mill.", constrained)
    engine = make_engine()
    engine.create_session("free")
    engine.create_session("json")
    requests = [engine.submit("free", "What is G01?", free),
                engine.submit("json", "Plan a drilling job for the mill.", constrained)]
    steps = engine.steps
    run_to_completion(engine, requests)
    assert engine.steps - steps < free_steps + json_steps - 10, "they should have decoded in shared steps"
    assert requests[0].generated_ids == free_alone.generated_ids
    assert requests[1].generated_ids == json_alone.generated_ids
    assert requests[0].constraint is None
    assert requests[1].constraint.complete           # ended by the schema, one mask per token
    assert requests[1].constraint.mask_calls == len(requests[1].generated_ids)
    jsonschema.validate(json.loads(requests[1].text_out), JOB_SCHEMA)


def test_preempted_constrained_request_recomputes_identically(make_engine, smollm):
    """A small pool: the newest request is preempted (its KV freed, recomputed later) while its
    matcher keeps every token consumed; it ends with the tokens and the document it gets alone."""
    schema = json.dumps(JOB_SCHEMA)
    texts = {"a": "Plan a drilling job for the mill.", "b": "Write the job ticket for lathe 1.",
             "c": "Job for shift B please."}
    params = {sid: SamplingParams(**SAMPLED, seed=50 + i, json_schema=schema) for i, sid in enumerate(texts)}
    expected = {sid: _alone(make_engine, text, params[sid])[0].generated_ids for sid, text in texts.items()}
    engine = make_engine(kv_pool_mb=pool_mb_for_tokens(smollm, 318))   # too small for the three answers at once
    baseline = engine.stats().used_blocks
    for sid in texts:
        engine.create_session(sid, keep_history=False)
    requests = [engine.submit(sid, text, params[sid]) for sid, text in texts.items()]
    run_to_completion(engine, requests)
    assert engine.stats().preemptions > 0
    assert sum(r.preemptions for r in requests) > 0
    for request in requests:
        assert request.finish_reason is FinishReason.STOP, (request.error, request.text_out)
        assert request.generated_ids == expected[request.session_id]
        jsonschema.validate(json.loads(request.text_out), JOB_SCHEMA)
    for sid in texts:
        engine.destroy_session(sid)
    assert engine.stats().used_blocks == baseline
    assert_pool_consistent(engine)
