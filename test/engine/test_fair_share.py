"""Round-robin decode slots and a full context: bounded waits, identical answers, clear finish reasons."""
import pytest

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.request import FinishReason
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.model.loader import load_model
from tiny_models import write_tiny_model

LONG = SamplingParams(max_new_tokens=60, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", context=1024)))


def make(tiny, **overrides):
    settings = dict(kv_pool_mb=4.0, block_size=8, max_context_tokens=256, system_prompt="sys", max_running=2,
                    fair_share_steps=5)
    settings.update(overrides)
    return Engine(EngineConfig(**settings), model=tiny)


def steps_until(engine, predicate, limit=2000):
    for step in range(limit):
        if predicate():
            return step
        engine.step()
        engine.kv.check_invariants()
    raise AssertionError("condition never became true")


def alone(tiny, text, params):
    engine = make(tiny)
    engine.create_session("x")
    request = engine.submit("x", text, params)
    steps_until(engine, lambda: request.done)
    return request.generated_ids


def test_a_waiting_command_gets_its_first_token_within_a_fair_share(tiny):
    texts = {"a": "home the Z axis", "b": "check the coolant level"}
    expected = {sid: alone(tiny, text, LONG) for sid, text in texts.items()}
    expected["op"] = alone(tiny, "open the door", SHORT)
    engine = make(tiny)
    baseline = engine.stats().used_blocks
    long_ones = [engine.submit(sid, text, LONG, create_if_missing=True) for sid, text in texts.items()]
    steps_until(engine, lambda: all(r.generated_ids for r in long_ones))
    operator = engine.submit("op", "open the door", SHORT, create_if_missing=True)
    waited = steps_until(engine, lambda: operator.first_token_at is not None)
    assert waited <= 2                          # a running answer yields at once, then its prompt step
    assert not any(r.done for r in long_ones)   # it did not wait for a long answer to end
    steps_until(engine, lambda: operator.done and all(r.done for r in long_ones))
    assert sum(r.suspensions for r in long_ones) >= 1
    for request in long_ones + [operator]:      # yielding a slot changes no token
        assert request.finish_reason is FinishReason.LENGTH
        assert request.generated_ids == expected[request.session_id]
    for sid in ("a", "b", "op"):
        engine.destroy_session(sid)
    assert engine.stats().used_blocks == baseline


def test_first_tokens_go_first_and_resumed_answers_still_take_turns(tiny):
    """Two slots busy with long answers, three new long commands and an operator's short one
    queued: every new command gets its first token after prompt steps only (not after a fair
    share of the long ones), then the slots rotate every fair share; every answer is unchanged."""
    texts = {"a": "home the Z axis", "b": "check the coolant level", "c": "list the active alarms",
             "d": "explain G54", "e": "why is spindle 2 alarming"}
    expected = {sid: alone(tiny, text, LONG) for sid, text in texts.items()}
    expected["op"] = alone(tiny, "open the door", SHORT)
    engine = make(tiny)
    first = [engine.submit(sid, texts[sid], LONG, create_if_missing=True) for sid in ("a", "b")]
    steps_until(engine, lambda: all(len(r.generated_ids) > 8 for r in first))
    later = [engine.submit(sid, texts[sid], LONG, create_if_missing=True) for sid in ("c", "d", "e")]
    operator = engine.submit("op", "open the door", SHORT, create_if_missing=True)
    waited = steps_until(engine, lambda: operator.first_token_at is not None)
    assert waited <= 4                          # c and d prompt step, one decode step, e and op prompt step (+1 spare)
    assert all(r.first_token_at is not None for r in later)
    resumed_tokens = {r.session_id: len(r.generated_ids) for r in first}
    steps_until(engine, lambda: all(len(r.generated_ids) > resumed_tokens[r.session_id] for r in first))
    assert not any(r.done for r in later)       # the first two were resumed before the new ones ended
    steps_until(engine, lambda: all(r.done for r in first + later + [operator]))
    for request in first + later + [operator]:
        assert request.generated_ids == expected[request.session_id]
    engine.kv.check_invariants()


def test_no_one_yields_when_nobody_waits(tiny):
    engine = make(tiny)
    requests = [engine.submit(sid, "home the Z axis", LONG, create_if_missing=True) for sid in ("a", "b")]
    steps_until(engine, lambda: all(r.done for r in requests))
    assert all(r.suspensions == 0 for r in requests)


def test_cancel_while_suspended_frees_the_turn(tiny):
    engine = make(tiny)
    long_ones = [engine.submit(sid, "home the Z axis", LONG, create_if_missing=True) for sid in ("a", "b")]
    steps_until(engine, lambda: all(r.generated_ids for r in long_ones))
    engine.submit("c", "open the door", LONG, create_if_missing=True)
    steps_until(engine, lambda: any(r.suspensions for r in long_ones) and any(not r.done and r.state.value ==
                                                                                "queued" for r in long_ones))
    suspended = next(r for r in long_ones if r.state.value == "queued")
    assert engine.cancel(suspended.session_id)
    assert suspended.finish_reason is FinishReason.CANCELLED
    assert engine.kv.num_tokens(suspended.session_id) == suspended.cached_prompt_tokens
    engine.kv.check_invariants()


def test_answer_cut_by_the_context_ends_context_full(tiny):
    engine = make(tiny, max_context_tokens=64)
    request = engine.submit("a", "home the Z axis", SamplingParams(max_new_tokens=200, ignore_eos=True),
                            create_if_missing=True)
    steps_until(engine, lambda: request.done)
    assert request.finish_reason is FinishReason.CONTEXT_FULL
    assert engine.kv.num_tokens("a") == 63


def test_drop_oldest_keeps_the_conversation_going(tiny):
    engine = make(tiny, max_context_tokens=96)
    turns = []
    for index in range(8):
        request = engine.submit("a", f"turn {index}: home the Z axis", SamplingParams(max_new_tokens=12,
                                                                                      ignore_eos=True),
                                create_if_missing=True)
        steps_until(engine, lambda: request.done)
        turns.append(request)
    assert all(r.finish_reason is FinishReason.LENGTH for r in turns)
    messages = engine.sessions["a"].messages
    assert messages[-2]["content"] == "turn 7: home the Z axis"
    assert messages[0]["content"] != "turn 0: home the Z axis"        # the oldest turns went
    assert engine.kv.num_tokens("a") <= 96
    engine.kv.check_invariants()


def test_context_overflow_error_refuses_the_turn(tiny):
    engine = make(tiny, max_context_tokens=96, context_overflow="error")
    finished = []
    for index in range(8):
        request = engine.submit("a", f"turn {index}: home the Z axis", SamplingParams(max_new_tokens=12,
                                                                                      ignore_eos=True),
                                create_if_missing=True)
        steps_until(engine, lambda: request.done)
        finished.append(request)
    reasons = [r.finish_reason for r in finished]
    assert FinishReason.ERROR in reasons
    refused = finished[reasons.index(FinishReason.ERROR)]
    assert "context limit" in refused.error and "reset the session" in refused.error
