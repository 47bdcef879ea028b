"""Deliberately tiny KV pools: waiting, timeouts, preemption, exhaustion. Invariants after every step."""
import time

import pytest

from edge_slm_node.engine.config import EngineConfig
from edge_slm_node.engine.engine import Engine
from edge_slm_node.engine.request import FinishReason
from edge_slm_node.engine.sampling import SamplingParams
from edge_slm_node.model.loader import load_model
from conftest import pool_mb_for_tokens
from tiny_models import write_tiny_model

BLOCK = 8
LONG = SamplingParams(max_new_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", context=1024)))


def make(tiny, num_blocks, **overrides):
    settings = dict(kv_pool_mb=pool_mb_for_tokens(tiny, num_blocks * BLOCK), block_size=BLOCK, max_context_tokens=512, system_prompt="sys",
                    max_running=4)
    settings.update(overrides)
    return Engine(EngineConfig(**settings), model=tiny)


def check(engine):
    engine.kv.check_invariants()
    s = engine.stats()
    assert s.free_blocks + s.cached_blocks + s.used_blocks == s.total_blocks
    for session in engine.sessions.values():
        if engine.kv.has_seq(session.session_id):
            assert engine.kv.num_blocks(session.session_id) <= s.total_blocks


def run(engine, requests, limit=5000):
    for _ in range(limit):
        if all(r.done for r in requests):
            return
        engine.step()
        check(engine)
    raise AssertionError("requests did not finish")


def alone(tiny, text, params, sessions=1):
    engine = make(tiny, 64)
    engine.create_session("x")
    request = engine.submit("x", text, params)
    run(engine, [request])
    return request.generated_ids


def test_waits_in_fifo_until_blocks_free(tiny):
    engine = make(tiny, 20)
    baseline = engine.stats()
    engine.create_session("a", keep_history=False)
    engine.create_session("b", keep_history=False)
    first = engine.submit("a", "home the Z axis", LONG)
    engine.step()
    second = engine.submit("b", "spindle warmup " * 6, SamplingParams(max_new_tokens=4, ignore_eos=True))
    waited = 0
    while not first.done:
        engine.step()
        check(engine)
        waited += second.state.value == "queued"
    assert waited > 0, "the second request should have waited for blocks"
    run(engine, [second])
    assert first.finish_reason is FinishReason.LENGTH
    assert second.finish_reason is FinishReason.LENGTH
    for sid in ("a", "b"):
        engine.destroy_session(sid)
    assert engine.stats().used_blocks == baseline.used_blocks


def test_queue_timeout_gives_a_clear_error(tiny):
    engine = make(tiny, 20, queue_timeout_s=0.05)
    engine.create_session("a")
    engine.create_session("b")
    hog = engine.submit("a", "home the Z axis", LONG)
    engine.step()
    starved = engine.submit("b", "spindle warmup " * 6, LONG)
    time.sleep(0.1)
    run(engine, [hog, starved])
    assert starved.finish_reason is FinishReason.ERROR and "timed out" in starved.error
    assert hog.finish_reason is FinishReason.LENGTH


def test_decode_preempts_newest_and_recomputes_identically(tiny):
    prompts = {"a": "home the Z axis", "b": "check the coolant level", "c": "open the door"}
    expected = {sid: alone(tiny, text, LONG) for sid, text in prompts.items()}
    engine = make(tiny, 16)
    baseline = engine.stats()
    for sid in prompts:
        engine.create_session(sid)
    requests = [engine.submit(sid, text, LONG) for sid, text in prompts.items()]
    run(engine, requests)
    assert engine.stats().preemptions > 0
    for request in requests:
        assert request.finish_reason is FinishReason.LENGTH
        assert request.generated_ids == expected[request.session_id]
    assert requests[0].preemptions == 0, "the oldest request is never the one preempted"
    for sid in prompts:
        engine.destroy_session(sid)
    assert engine.stats().used_blocks == baseline.used_blocks


def test_alone_and_out_of_blocks_ends_pool_exhausted(tiny):
    engine = make(tiny, 8)
    baseline = engine.stats()
    engine.create_session("a")
    request = engine.submit("a", "feed hold", SamplingParams(max_new_tokens=200, ignore_eos=True))
    run(engine, [request])
    assert request.finish_reason is FinishReason.POOL_EXHAUSTED
    assert "exhausted" in request.error
    engine.destroy_session("a")
    assert engine.stats().used_blocks == baseline.used_blocks


def test_prompt_larger_than_pool_fails_at_once(tiny):
    engine = make(tiny, 6)
    engine.create_session("a")
    request = engine.submit("a", "tool " * 80, LONG)
    run(engine, [request])
    assert request.finish_reason is FinishReason.ERROR and "KV blocks" in request.error


def test_sharing_and_caching_do_not_change_output(tiny):
    text = "why is spindle 2 alarming"
    shared = make(tiny, 64, system_prompt="You run cell 3. " * 4)
    shared.create_session("a")
    shared.create_session("b")
    outputs = []
    for sid in ("a", "b"):
        request = shared.submit(sid, text, LONG)
        run(shared, [request])
        outputs.append(request.generated_ids)
    plain = make(tiny, 64, system_prompt=None, enable_prefix_cache=False)
    plain.create_session("c", system_prompt="You run cell 3. " * 4)
    request = plain.submit("c", text, LONG)
    run(plain, [request])
    assert outputs[0] == outputs[1] == request.generated_ids
    assert shared.stats().shared_blocks > 0 and plain.stats().shared_blocks == 0


def test_cancel_during_prefill_and_decode_frees_blocks_at_once(tiny):
    engine = make(tiny, 64, max_batch_tokens=16)
    baseline = engine.stats()
    engine.create_session("a")
    request = engine.submit("a", "spindle warmup " * 4, LONG)
    engine.step()
    assert request.state.value == "prefill" and engine.stats().used_blocks > baseline.used_blocks
    assert engine.cancel("a")
    assert request.finish_reason is FinishReason.CANCELLED and request.events[-1].finish_reason is FinishReason.CANCELLED
    assert engine.kv.num_tokens("a") <= len(engine.sessions["a"].prefix_ids)
    request = engine.submit("a", "home the Z axis", LONG)
    while request.state.value != "decode":
        engine.step()
    engine.step()
    assert engine.cancel("a") and request.finish_reason is FinishReason.CANCELLED
    assert not engine.cancel("a"), "nothing left to cancel"
    check(engine)
    engine.destroy_session("a")
    assert engine.stats().used_blocks == baseline.used_blocks


def test_destroy_during_generation_and_queued_requests(tiny):
    engine = make(tiny, 64)
    baseline = engine.stats()
    engine.create_session("a")
    engine.create_session("b")
    running = engine.submit("a", "home the Z axis", LONG)
    queued = engine.submit("a", "open the door", LONG)
    other = engine.submit("b", "check the coolant level", LONG)
    for _ in range(5):
        engine.step()
    engine.destroy_session("a")
    assert running.finish_reason is FinishReason.CANCELLED and queued.finish_reason is FinishReason.CANCELLED
    run(engine, [other])
    assert other.finish_reason is FinishReason.LENGTH
    engine.destroy_session("b")
    assert engine.stats().used_blocks == baseline.used_blocks


def test_idle_session_kv_is_released_for_a_waiting_request(tiny):
    engine = make(tiny, 20)
    engine.create_session("idle")
    done = engine.submit("idle", "home the Z axis", LONG)
    run(engine, [done])
    assert engine.kv.has_seq("idle")
    engine.create_session("new")
    waiting = engine.submit("new", "spindle warmup " * 6, SamplingParams(max_new_tokens=4, ignore_eos=True))
    run(engine, [waiting])
    assert waiting.finish_reason is FinishReason.LENGTH
    assert not engine.kv.has_seq("idle") and engine.sessions["idle"].messages
    again = engine.submit("idle", "and the X axis", SamplingParams(max_new_tokens=4, ignore_eos=True))
    run(engine, [again])
    assert again.finish_reason is FinishReason.LENGTH and again.cached_prompt_tokens > 0
