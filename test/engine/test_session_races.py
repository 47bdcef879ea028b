"""Session calls racing a running forward pass: each call sees the session as it is after every wait."""
import threading

import pytest

from edge_slm_node.engine.engine import UnknownSessionError
from edge_slm_node.engine.sampling import InvalidRequestError, SamplingParams

from conftest import assert_pool_consistent

LONG = SamplingParams(max_new_tokens=400, ignore_eos=True)


def _step_in_background(engine, stop):
    def loop():
        while not stop.is_set():
            engine.step()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def _together(*calls):
    """Run the calls at the same moment on their own threads; -> each one's result or exception."""
    barrier = threading.Barrier(len(calls))
    results = [None] * len(calls)

    def run(index, call):
        barrier.wait()
        try:
            results[index] = call()
        except Exception as error:          # collected, asserted on by the caller
            results[index] = error
    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


@pytest.mark.parametrize("second", ["destroy_session", "reset_session", "cancel"])
def test_destroy_racing_another_call_on_a_decoding_session(make_engine, second):
    engine = make_engine(kv_pool_mb=16)
    baseline = engine.stats().used_blocks
    stop = threading.Event()
    stepper = _step_in_background(engine, stop)
    try:
        for attempt in range(5):
            request = engine.submit("victim", "Count to one hundred.", LONG, create_if_missing=True)
            while not request.generated_ids:           # decoding, so some step holds it in the forward pass
                threading.Event().wait(0.002)
            results = _together(lambda: engine.destroy_session("victim"), lambda: getattr(engine, second)("victim"))
            assert isinstance(results[0], int) or isinstance(results[1], (int, bool)), results
            for result in results:
                assert isinstance(result, (int, bool, UnknownSessionError)), repr(result)
            assert "victim" not in engine.sessions
            assert request.done
    finally:
        stop.set()
        stepper.join(10)
    assert engine.stats().used_blocks == baseline
    assert_pool_consistent(engine)


def test_recreated_session_is_not_freed_by_a_stale_call(make_engine):
    engine = make_engine(kv_pool_mb=16)
    stop = threading.Event()
    stepper = _step_in_background(engine, stop)
    try:
        first = engine.submit("reused", "Count to one hundred.", LONG, create_if_missing=True)
        while not first.generated_ids:
            threading.Event().wait(0.002)

        def destroy_and_recreate():
            try:
                engine.destroy_session("reused")
            except UnknownSessionError:              # the racing destroy came first
                pass
            return engine.submit("reused", "Count to fifty.", LONG, create_if_missing=True)
        second, racer = _together(destroy_and_recreate, lambda: engine.destroy_session("reused"))
        assert not isinstance(second, Exception), repr(second)
        assert isinstance(racer, (int, UnknownSessionError)), repr(racer)
        assert first.done
        if "reused" in engine.sessions:              # the racer destroyed the first incarnation
            assert not second.done and engine.scheduler.busy("reused")
        else:                                        # it destroyed the new one, with its request
            assert second.done and second.finish_reason.value == "cancelled"
    finally:
        stop.set()
        stepper.join(10)
    if "reused" in engine.sessions:
        engine.destroy_session("reused")
    assert_pool_consistent(engine)


@pytest.mark.parametrize("call", ["cancel", "reset_session", "destroy_session"])
def test_a_session_call_waits_for_one_forward_pass_not_for_the_answer(make_engine, call):
    """A stepper looping on a decoding session must let a waiting call in after the pass it is in:
    the lock alone is not fair, and the call could wait out all 400 tokens."""
    engine = make_engine(kv_pool_mb=16)
    stop = threading.Event()
    stepper = _step_in_background(engine, stop)
    try:
        for attempt in range(5):
            request = engine.submit("busy", "Count to one hundred.", LONG, create_if_missing=True)
            while len(request.generated_ids) < 2:
                threading.Event().wait(0.002)
            steps_before = engine.steps
            getattr(engine, call)("busy")
            assert engine.steps - steps_before <= 2, (call, engine.steps - steps_before)
            assert request.done and request.finish_reason.value == "cancelled"
            assert len(request.generated_ids) < LONG.max_new_tokens
    finally:
        stop.set()
        stepper.join(10)
    if "busy" in engine.sessions:
        engine.destroy_session("busy")
    assert_pool_consistent(engine)


def test_rejected_first_command_leaves_no_session(make_engine):
    engine = make_engine()
    with pytest.raises(InvalidRequestError):
        engine.submit("new", "hello", SamplingParams(temperature=float("nan")), create_if_missing=True)
    assert "new" not in engine.sessions
    with pytest.raises(UnknownSessionError):
        engine.submit("new", "hello", SamplingParams())
